// `numaserve serve`: discover the machine, plan workers, start them, and
// serve the model repository over gRPC with Prometheus metrics.
#pragma once

#include <string>
#include <vector>

namespace numaserve::cli {

int ServeCommand(const std::vector<std::string>& args);

}  // namespace numaserve::cli
