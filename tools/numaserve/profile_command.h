// `numaserve profile`: a model's compiled steps against the machine's
// roofline (time, FLOPs, bytes moved, arithmetic intensity, the bound for
// that intensity and the fraction of it reached), with an optional Chrome
// trace of every step call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "serving/workers/process_options.h"
#include "tools/numaserve/roofline.h"

namespace numaserve::cli {

// `process`: the process settings main read from the environment, the
// defaults of their flags (--max-isa, --gemm-cache, ...).
int ProfileCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process);

// The Chrome trace (Trace Event Format, viewable in Perfetto or
// chrome://tracing) of `events`: one complete ("ph":"X") event per step
// call, ts and dur in microseconds, the step's name as the event's, its
// kind as the category, index, kind, implementation, precision and run in
// args. `steps`: the profile the events belong to (rows by index).
std::string ChromeTraceJson(const std::vector<engine::StepEvent>& events,
                            const std::vector<engine::StepProfile>& steps,
                            const std::string& model_path, int64_t batch);

}  // namespace numaserve::cli
