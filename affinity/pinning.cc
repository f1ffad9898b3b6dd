#include "affinity/pinning.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
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

absl::StatusOr<MemoryPolicy> ParseMemoryPolicy(std::string_view name) {
  if (name == "prefer") return MemoryPolicy::kPrefer;
  if (name == "strict") return MemoryPolicy::kStrict;
  return absl::InvalidArgumentError(absl::StrCat("memory policy '", std::string(name.substr(0, 64)),
                                                 "': expected strict or prefer"));
}

const char* MemoryPolicyName(MemoryPolicy policy) {
  return policy == MemoryPolicy::kStrict ? "strict" : "prefer";
}

absl::Status BindProcessCpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("cannot bind a process to an empty cpu list");
  return internal::SetProcessCpuBinding(cpus);
}

absl::Status BindProcessMemory(int numa_node, MemoryPolicy policy) {
  if (numa_node < 0) return absl::OkStatus();
  if (absl::Status status = CheckNode(numa_node); !status.ok()) return status;
  return internal::SetMemoryBinding(numa_node, policy == MemoryPolicy::kStrict);
}

absl::Status BindProcess(const std::vector<int>& cpus, int numa_node, MemoryPolicy policy) {
  absl::Status cpu_status = BindProcessCpus(cpus);
  if (cpus.empty()) return cpu_status;
  absl::Status memory_status = BindProcessMemory(numa_node, policy);
  if (!cpu_status.ok() && !memory_status.ok()) {
    return absl::Status(cpu_status.code(),
                        absl::StrCat(cpu_status.message(), "; ", memory_status.message()));
  }
  return cpu_status.ok() ? memory_status : cpu_status;
}

absl::Status BindMemoryToNode(void* addr, size_t bytes, int numa_node, MemoryPolicy policy) {
  if (numa_node < 0 || bytes == 0) return absl::OkStatus();
  if (addr == nullptr) return absl::InvalidArgumentError("cannot bind memory at a null address");
  if (absl::Status status = CheckNode(numa_node); !status.ok()) return status;
  return internal::SetAreaMemoryBinding(addr, bytes, numa_node, policy == MemoryPolicy::kStrict);
}

absl::StatusOr<std::string> PrefaultPages(void* addr, size_t bytes, bool use_populate) {
  if (bytes == 0) return std::string("nothing to touch");
  if (addr == nullptr) return absl::InvalidArgumentError("cannot pre-fault a null address");
  const long page_size = sysconf(_SC_PAGESIZE);
  const uintptr_t page = page_size > 0 ? static_cast<uintptr_t>(page_size) : 4096;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + bytes;
#ifdef MADV_POPULATE_WRITE
  // Faults every page in writable, as a write would, without writing: the
  // contents stay. EINVAL before Linux 5.14: the loop below does it.
  if (use_populate &&
      madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) {
    return std::string("MADV_POPULATE_WRITE");
  }
#else
  (void)use_populate;
#endif
  // One write a page: its first byte or'ed with 0, atomically, so a byte
  // another process writes meanwhile (a shared arena) keeps its value.
  for (uintptr_t p = std::max(begin, reinterpret_cast<uintptr_t>(addr)); p < end;
       p = (p / page + 1) * page) {
    __atomic_fetch_or(reinterpret_cast<unsigned char*>(p), 0, __ATOMIC_RELAXED);
  }
  return std::string("a write per page");
}

std::string DescribeMemoryPolicy() {
  absl::StatusOr<internal::MemoryBinding> memory = internal::GetMemoryBinding();
  if (!memory.ok()) return absl::StrCat("unknown (", memory.status().message(), ")");
  if (memory->nodes.empty()) return memory->policy;
  return absl::StrCat(memory->policy, memory->nodes.size() == 1 ? " node " : " nodes ",
                      FormatCpuList(memory->nodes));
}

std::string DescribeBinding() {
  std::string text;
  absl::StatusOr<std::vector<int>> cpus = internal::GetProcessCpuBinding();
  if (cpus.ok()) {
    absl::StrAppend(&text, "cpus ", FormatCpuList(*cpus));
  } else {
    absl::StrAppend(&text, "cpus unknown (", cpus.status().message(), ")");
  }
  absl::StrAppend(&text, " mem ", DescribeMemoryPolicy());
  return text;
}

namespace internal {

absl::StatusOr<MemoryBinding> GetMemoryBinding() {
  // Room for 4096 nodes: get_mempolicy wants at least the kernel's
  // node count (CONFIG_NODES_SHIFT is at most 10: 1024).
  constexpr unsigned long kMaxNodes = 4096;
  constexpr int kBits = 8 * sizeof(unsigned long);
  unsigned long mask[kMaxNodes / kBits] = {};
  int mode = 0;
  if (syscall(SYS_get_mempolicy, &mode, mask, kMaxNodes, nullptr, 0UL) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot read the memory policy (get_mempolicy): ", base::ErrnoText(errno)));
  }
  MemoryBinding binding;
  for (unsigned long n = 0; n < kMaxNodes; ++n) {
    if ((mask[n / kBits] >> (n % kBits)) & 1UL) binding.nodes.push_back(static_cast<int>(n));
  }
  // The kernel's MPOL_* numbers (linux/mempolicy.h); the optional mode
  // flags (MPOL_F_STATIC_NODES, ...) are in the high bits.
  switch (mode & 0xff) {
    case 0:  // MPOL_DEFAULT
      binding.policy = "default";
      break;
    case 1:  // MPOL_PREFERRED; without a node: local
    case 5:  // MPOL_PREFERRED_MANY
      binding.policy = binding.nodes.empty() ? "local" : "prefer";
      break;
    case 2:  // MPOL_BIND
      binding.policy = "strict";
      break;
    case 3:  // MPOL_INTERLEAVE
      binding.policy = "interleave";
      break;
    case 4:  // MPOL_LOCAL
      binding.policy = "local";
      break;
    case 6:  // MPOL_WEIGHTED_INTERLEAVE (Linux 6.9)
      binding.policy = "weighted-interleave";
      break;
    default:
      binding.policy = "unknown";
  }
  if (binding.policy == std::string_view("default") ||
      binding.policy == std::string_view("local")) {
    binding.nodes.clear();
  }
  return binding;
}

}  // namespace internal

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
