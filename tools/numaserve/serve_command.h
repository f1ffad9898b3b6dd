// `numaserve serve`: discover the machine, plan workers, start them, and
// serve the model repository over gRPC with Prometheus metrics.
#pragma once

#include <string>
#include <vector>

#include "serving/workers/process_options.h"

namespace numaserve::cli {

// `process`: the process settings main read from the environment, the
// defaults of their flags.
int ServeCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process);

}  // namespace numaserve::cli
