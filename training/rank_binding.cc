#include "training/rank_binding.h"

#include <omp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "affinity/placement.h"
#include "affinity/topology.h"

namespace numaserve::training {

absl::StatusOr<int> AutoRankCount() {
  absl::StatusOr<affinity::Topology> topology = affinity::DiscoverTopology({});
  if (!topology.ok()) return topology.status();
  absl::StatusOr<affinity::Plan> plan = affinity::MakePlan(*topology, {});
  if (!plan.ok()) return plan.status();
  return std::max<int>(1, static_cast<int>(plan->workers.size()));
}

absl::StatusOr<RankBinding> BindRank(int local_rank, int local_size,
                                     affinity::MemoryPolicy policy) {
  absl::StatusOr<affinity::Topology> topology = affinity::DiscoverTopology({});
  if (!topology.ok()) return topology.status();
  absl::StatusOr<affinity::Plan> plan = affinity::MakePlan(*topology, {});
  if (!plan.ok()) return plan.status();
  if (plan->workers.empty()) return absl::InternalError("the placement plan has no worker");
  const int domains = static_cast<int>(plan->workers.size());
  // Ranks per domain (the last domains may get one fewer).
  const int per_domain = (local_size + domains - 1) / domains;
  const affinity::WorkerPlacement& worker = plan->workers[(local_rank / per_domain) % domains];
  const int slot = local_rank % per_domain;
  const int sharing = std::min(per_domain, local_size - (local_rank / per_domain) * per_domain);
  std::vector<int> cpus;
  const int n = static_cast<int>(worker.cpus.size());
  for (int i = slot * n / sharing; i < (slot + 1) * n / sharing; ++i)
    cpus.push_back(worker.cpus[i]);
  if (cpus.empty()) cpus = worker.cpus;  // more ranks than cpus: share
  RankBinding binding;
  binding.num_threads = std::max(1, static_cast<int>(cpus.size()));
  omp_set_num_threads(binding.num_threads);
  binding.description =
      absl::StrCat("rank ", local_rank, "/", local_size, " on ", worker.domain, ": cpus ",
                   affinity::FormatCpuList(cpus), " threads ", binding.num_threads);
  if (topology->is_this_machine) {
    absl::Status bound = affinity::BindProcess(cpus, worker.numa_node, policy);
    if (!bound.ok()) absl::StrAppend(&binding.description, " (not bound: ", bound.message(), ")");
    absl::StrAppend(&binding.description, " mem ", affinity::DescribeMemoryPolicy());
  }
  return binding;
}

}  // namespace numaserve::training
