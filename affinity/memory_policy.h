// Memory on a node other than the worker's own, for one phase of its work:
// a model's weights on a memory-only node (CXL-attached memory, HBM as a
// memory-side node) while its activations, arena and everything else stay
// on the worker's node (serve --weights-node, docs/scheduling.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "affinity/pinning.h"

namespace numaserve::affinity {

struct Topology;

// Sets the memory policy of the calling thread and of the `team_threads`
// threads of its OpenMP team (an `omp parallel` region of that size, the
// calling thread its thread 0) to `numa_node` under `policy` (kStrict:
// MPOL_BIND; kPrefer: MPOL_PREFERRED_MANY, MPOL_PREFERRED before Linux 5.15)
// for the life of the scope, and restores the calling thread's previous
// policy on all of them when it ends. Linux places a page at its first touch
// by the policy of the faulting thread, and a thread inherits its creator's
// policy: what the calling thread and its team allocate and first write in
// the scope lands on the node, threads started in it included (start none
// that outlives the scope: they keep the node's policy). Pages touched
// before stay where they are; nothing is migrated.
//
// Assumes the team's threads share the calling thread's policy (a worker's
// threads all have the process's, set before any of them started): each is
// restored to the calling thread's. status() says whether the policy was
// set on every thread: INVALID_ARGUMENT for a node the machine lacks or a
// bad team size, PERMISSION_DENIED where the kernel refuses the call (a
// container's seccomp filter; NUMASERVE_TEST_REFUSE_MEMBIND=1 too), the
// errno otherwise; the previous policy is restored even then.
class ScopedTeamMemoryPolicy {
 public:
  ScopedTeamMemoryPolicy(int numa_node, MemoryPolicy policy, int team_threads);
  ~ScopedTeamMemoryPolicy();
  ScopedTeamMemoryPolicy(const ScopedTeamMemoryPolicy&) = delete;
  ScopedTeamMemoryPolicy& operator=(const ScopedTeamMemoryPolicy&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  struct Saved {
    int mode = 0;  // as get_mempolicy gives it, mode flags included
    std::vector<unsigned long> mask;
  };
  absl::Status status_;
  bool saved_ok_ = false;
  Saved saved_;
  int team_threads_ = 1;
};

// The NUMA nodes the calling process may allocate on, from the
// "Mems_allowed_list" line of `proc_status` (the text of /proc/self/status:
// its cgroup cpuset's mems, numactl --membind does not change it).
// INVALID_ARGUMENT where the line is missing or malformed.
absl::StatusOr<std::vector<int>> MemsAllowedFromStatus(std::string_view proc_status);
// The same read from /proc/self/status.
absl::StatusOr<std::vector<int>> MemsAllowed();

// Whether `numa_node` may hold weights (serve --weights-node): a node of
// `topology`, with cpus or memory only, and, when `mems_allowed` is given
// (this machine), one the process may allocate on. An error names `flag`,
// the node and the nodes it may be.
absl::Status CheckWeightsNode(const Topology& topology, int numa_node,
                              const std::vector<int>* mems_allowed, std::string_view flag);

}  // namespace numaserve::affinity
