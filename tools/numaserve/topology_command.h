// `numaserve topology`: what hwloc found and the plan, like
// `mpirun --report-bindings`.
#pragma once

#include <string>
#include <vector>

namespace numaserve::server {

int TopologyCommand(const std::vector<std::string>& args);

}  // namespace numaserve::server
