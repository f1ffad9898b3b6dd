// `numaserve topology`: what hwloc found and the plan, like
// `mpirun --report-bindings`.
#pragma once

#include <string>
#include <vector>

#include "serving/workers/process_options.h"

namespace numaserve::cli {

// `process`: the process settings main read from the environment, the
// defaults of their flags (--max-isa: the peaks quoted).
int TopologyCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process);

}  // namespace numaserve::cli
