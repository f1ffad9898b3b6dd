// `numaserve topology`: what hwloc found and the plan, like
// `mpirun --report-bindings`.
#pragma once

#include <string>
#include <vector>

namespace numaserve::cli {

int TopologyCommand(const std::vector<std::string>& args);

}  // namespace numaserve::cli
