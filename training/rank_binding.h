// Where a training rank runs: like an inference worker, one rank per
// domain of the placement plan (NUMA by default), bound to its cpus and
// node, with an OpenMP team of its cores. When more ranks than domains
// share a machine (tests on a 1-node machine), each domain's cpus are split
// evenly between its ranks.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "affinity/pinning.h"

namespace numaserve::training {

struct RankBinding {
  std::string description;  // "rank 1/2 on numa 0: cpus 1 threads 1 mem prefer node 0"
  int num_threads = 0;
};

// Binds this process as local rank `local_rank` of `local_size` on this
// machine and sets the OpenMP team size, its memory bound to its node under
// `policy` (train --membind). A failed bind is reported in the
// description, not an error (like an inference worker).
absl::StatusOr<RankBinding> BindRank(
    int local_rank, int local_size,
    affinity::MemoryPolicy policy = affinity::MemoryPolicy::kPrefer);

// Ranks for `--ranks auto`: one per NUMA domain of this machine.
absl::StatusOr<int> AutoRankCount();

}  // namespace numaserve::training
