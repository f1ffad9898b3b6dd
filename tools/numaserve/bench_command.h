// `numaserve bench`: runs a model in process at several batch sizes and
// prints throughput, latency percentiles, achieved GFLOP/s and the fraction
// of the machine's FP32 peak (affinity's FMA probe x threads).
#pragma once

#include <string>
#include <vector>

#include "serving/workers/process_options.h"

namespace numaserve::cli {

// `process`: the process settings main read from the environment, the
// defaults of their flags (--max-isa, --gemm-cache, ...).
int BenchCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process);

}  // namespace numaserve::cli
