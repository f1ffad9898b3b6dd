// Internal to affinity/: the binding primitives on this machine's hwloc
// topology, declared without <hwloc.h> so that topology.cc stays its only
// includer. pinning.cc builds the public API (validation, messages) on them.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace numaserve::affinity::internal {

// Every thread of the process to exactly `cpus` (OS numbers).
absl::Status SetProcessCpuBinding(const std::vector<int>& cpus);
// The calling thread's memory policy (inherited by threads created later):
// bind to `numa_node`.
absl::Status SetMemoryBinding(int numa_node);
// Bind [addr, addr+bytes) to `numa_node`, migrating pages already touched.
absl::Status SetAreaMemoryBinding(void* addr, size_t bytes, int numa_node);

// The union of the cpus the process's threads may run on.
absl::StatusOr<std::vector<int>> GetProcessCpuBinding();

struct MemoryBinding {
  const char* policy = "default";  // "default", "first-touch", "bind", "interleave", ...
  std::vector<int> nodes;          // OS node numbers
};
absl::StatusOr<MemoryBinding> GetMemoryBinding();

// OS index of the node holding the (touched) page at addr, -1 if unknown.
int NodeOfPage(const void* addr);

// OS indexes of this machine's NUMA nodes (all, not only the allowed ones).
std::vector<int> MachineNumaNodes();

}  // namespace numaserve::affinity::internal
