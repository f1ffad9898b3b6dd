#include "affinity/pinning.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "affinity/hwloc_machine.h"
#include "affinity/topology.h"
#include "base/errno_text.h"

namespace numaserve::affinity {
namespace {

absl::Status CheckNode(int numa_node) {
  const std::vector<int> nodes = internal::MachineNumaNodes();
  if (std::find(nodes.begin(), nodes.end(), numa_node) == nodes.end()) {
    return absl::InvalidArgumentError(absl::StrCat("NUMA node ", numa_node,
                                                   " does not exist on this machine (nodes ",
                                                   FormatCpuList(nodes), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BindProcess(const std::vector<int>& cpus, int numa_node) {
  if (cpus.empty()) return absl::InvalidArgumentError("cannot bind a process to an empty cpu list");
  // Cpus first: memory then lands on the node of the cpus even if the memory
  // policy below fails.
  absl::Status cpu_status = internal::SetProcessCpuBinding(cpus);
  absl::Status memory_status = absl::OkStatus();
  if (numa_node >= 0) {
    memory_status = CheckNode(numa_node);
    if (memory_status.ok()) memory_status = internal::SetMemoryBinding(numa_node);
  }
  if (!cpu_status.ok() && !memory_status.ok()) {
    return absl::Status(cpu_status.code(),
                        absl::StrCat(cpu_status.message(), "; ", memory_status.message()));
  }
  return cpu_status.ok() ? memory_status : cpu_status;
}

absl::Status BindMemoryToNode(void* addr, size_t bytes, int numa_node) {
  if (numa_node < 0 || bytes == 0) return absl::OkStatus();
  if (addr == nullptr) return absl::InvalidArgumentError("cannot bind memory at a null address");
  if (absl::Status status = CheckNode(numa_node); !status.ok()) return status;
  return internal::SetAreaMemoryBinding(addr, bytes, numa_node);
}

std::string DescribeBinding() {
  std::string text;
  absl::StatusOr<std::vector<int>> cpus = internal::GetProcessCpuBinding();
  if (cpus.ok()) {
    absl::StrAppend(&text, "cpus ", FormatCpuList(*cpus));
  } else {
    absl::StrAppend(&text, "cpus unknown (", cpus.status().message(), ")");
  }
  absl::StatusOr<internal::MemoryBinding> memory = internal::GetMemoryBinding();
  if (!memory.ok()) {
    absl::StrAppend(&text, " mem unknown (", memory.status().message(), ")");
  } else if (absl::string_view(memory->policy) == "default" ||
             absl::string_view(memory->policy) == "first-touch") {
    // The kernel's default: pages land on the node of the cpu touching them.
    absl::StrAppend(&text, " mem ", memory->policy);
  } else {
    absl::StrAppend(&text, " mem ", memory->policy,
                    memory->nodes.size() == 1 ? " node " : " nodes ", FormatCpuList(memory->nodes));
  }
  return text;
}

int NodeOfAddress(const void* addr) { return internal::NodeOfPage(addr); }

absl::Status PinCallingThread(const std::vector<int>& cpus) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &mask);
  }
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(mask), &mask);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("pthread_setaffinity_np: ", base::ErrnoText(rc)));
  return absl::OkStatus();
}

std::vector<int> CallingThreadCpus() {
  std::vector<int> cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (pthread_getaffinity_np(pthread_self(), sizeof(mask), &mask) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  return cpus;
}

void PinOpenMpTeam(const std::vector<int>& cpus) {
  const int n = static_cast<int>(cpus.size());
  if (n == 0) return;
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    if (t < n) (void)PinCallingThread({cpus[t]});
  }
}

std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus, int n) {
  n = std::max(n, 1);
  std::vector<std::vector<int>> shares(n);
  for (size_t c = 0; c < cpus.size(); ++c) shares[c * n / cpus.size()].push_back(cpus[c]);
  return shares;
}

std::vector<std::vector<int>> SplitCores(const std::vector<std::vector<int>>& cores, int n) {
  n = std::max(n, 1);
  std::vector<std::vector<int>> shares(n);
  const size_t count = cores.size();
  for (size_t c = 0; c < count; ++c) {
    std::vector<int>& share = shares[c * n / count];
    share.insert(share.end(), cores[c].begin(), cores[c].end());
  }
  return shares;
}

std::vector<std::vector<int>> CoresWithin(const std::vector<std::vector<int>>& cores,
                                          const std::vector<int>& allowed) {
  const std::unordered_set<int> keep(allowed.begin(), allowed.end());
  std::vector<std::vector<int>> within;
  for (const std::vector<int>& core : cores) {
    std::vector<int> cpus;
    for (int cpu : core) {
      if (keep.count(cpu) != 0) cpus.push_back(cpu);
    }
    if (!cpus.empty()) within.push_back(std::move(cpus));
  }
  return within;
}

std::vector<std::vector<int>> TeamShares(const Topology& topology, const std::vector<int>& cpus,
                                         int threads, int groups) {
  if (threads <= 0 || static_cast<int>(cpus.size()) < threads) return {};
  groups = std::max(groups, 1);
  std::vector<std::vector<int>> known;
  std::unordered_set<int> in_topology;
  for (const Core& core : topology.cores) {
    known.push_back(core.pus);
    in_topology.insert(core.pus.begin(), core.pus.end());
  }
  std::vector<std::vector<int>> cores = CoresWithin(known, cpus);
  for (int cpu : cpus) {
    if (in_topology.count(cpu) == 0) cores.push_back({cpu});
  }
  // The team's cpus: the first `threads`, core after core.
  std::vector<std::vector<int>> team;
  int left = threads;
  for (const std::vector<int>& core : cores) {
    if (left == 0) break;
    const int take = std::min(left, static_cast<int>(core.size()));
    team.emplace_back(core.begin(), core.begin() + take);
    left -= take;
  }
  if (static_cast<int>(team.size()) >= groups) return SplitCores(team, groups);
  std::vector<int> flat;
  for (const std::vector<int>& core : team) flat.insert(flat.end(), core.begin(), core.end());
  return SplitCpus(flat, groups);
}

}  // namespace numaserve::affinity
