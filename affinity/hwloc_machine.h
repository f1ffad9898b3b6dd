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
// `numa_node` alone (strict: MPOL_BIND) or first (MPOL_PREFERRED_MANY, else
// MPOL_PREFERRED), the pages already touched moved there where they can be.
absl::Status SetMemoryBinding(int numa_node, bool strict);
// The same for [addr, addr+bytes): its pages already touched move to the
// node where they can (a page another process maps too stays, also under
// strict: its binding still holds for new pages).
absl::Status SetAreaMemoryBinding(void* addr, size_t bytes, int numa_node, bool strict);

// The union of the cpus the process's threads may run on.
absl::StatusOr<std::vector<int>> GetProcessCpuBinding();

struct MemoryBinding {
  // The kernel's policy of the calling thread, by what it does: "default"
  // (the node of the touching cpu), "local" (the same, asked for), "strict"
  // (MPOL_BIND: only `nodes`), "prefer" (MPOL_PREFERRED(_MANY): `nodes`
  // first, others when they are full), "interleave", "weighted-interleave".
  const char* policy = "default";
  std::vector<int> nodes;  // OS node numbers; empty for default and local
};
// Read with get_mempolicy(2) itself: hwloc reports MPOL_BIND and
// MPOL_PREFERRED alike, as HWLOC_MEMBIND_BIND.
absl::StatusOr<MemoryBinding> GetMemoryBinding();

// Whether NUMASERVE_TEST_REFUSE_MEMBIND is set to 1: the memory-policy calls
// then fail as a container's seccomp filter makes them (EPERM) without
// asking the kernel, so that tests reach the first-touch fallback on any
// machine. For tests only; it changes nothing else.
bool MembindRefusedForTests();

// OS index of the node holding the (touched) page at addr, -1 if unknown.
int NodeOfPage(const void* addr);

// OS indexes of this machine's NUMA nodes (all, not only the allowed ones).
std::vector<int> MachineNumaNodes();

}  // namespace numaserve::affinity::internal
