#include "affinity/memory_policy.h"

#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "affinity/hwloc_machine.h"
#include "affinity/topology.h"
#include "base/errno_text.h"

namespace numaserve::affinity {
namespace {

// The kernel's MPOL_* numbers (linux/mempolicy.h).
constexpr int kMpolDefault = 0;
constexpr int kMpolPreferred = 1;
constexpr int kMpolBind = 2;
constexpr int kMpolPreferredMany = 5;  // Linux 5.15
// Room for 4096 nodes, as internal::GetMemoryBinding (CONFIG_NODES_SHIFT
// is at most 10).
constexpr unsigned long kMaxNodes = 4096;
constexpr int kBits = 8 * sizeof(unsigned long);
constexpr size_t kMaskWords = kMaxNodes / kBits;
// The most threads a team may have here (far above any machine's cpus).
constexpr int kMaxTeamThreads = 1 << 16;

absl::Status PolicyError(int err, const std::string& what) {
  const std::string text = absl::StrCat(what, ": ", base::ErrnoText(err));
  return err == EPERM ? absl::PermissionDeniedError(text) : absl::InternalError(text);
}

// The calling thread's policy to `node` alone.
absl::Status SetThreadPolicy(int node, bool strict) {
  const std::string what = absl::StrCat("cannot set the memory policy to NUMA node ", node,
                                        strict ? " (strict)" : " (prefer)");
  if (internal::MembindRefusedForTests()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": ", base::ErrnoText(EPERM), " (NUMASERVE_TEST_REFUSE_MEMBIND=1)"));
  }
  std::vector<unsigned long> mask(kMaskWords, 0);
  mask[static_cast<size_t>(node) / kBits] |= 1UL << (node % kBits);
  const int mode = strict ? kMpolBind : kMpolPreferredMany;
  if (syscall(SYS_set_mempolicy, mode, mask.data(), kMaxNodes + 1) == 0) return absl::OkStatus();
  // MPOL_PREFERRED_MANY is unknown before Linux 5.15: one node preferred.
  if (!strict && errno == EINVAL &&
      syscall(SYS_set_mempolicy, kMpolPreferred, mask.data(), kMaxNodes + 1) == 0) {
    return absl::OkStatus();
  }
  return PolicyError(errno, what);
}

absl::Status CheckMachineNode(int node) {
  const std::vector<int> nodes = internal::MachineNumaNodes();
  if (node < 0 || std::find(nodes.begin(), nodes.end(), node) == nodes.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NUMA node ", node, " does not exist on this machine (nodes ", FormatCpuList(nodes), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

ScopedTeamMemoryPolicy::ScopedTeamMemoryPolicy(int numa_node, MemoryPolicy policy, int team_threads)
    : team_threads_(std::clamp(team_threads, 1, kMaxTeamThreads)) {
  if (team_threads < 1 || team_threads > kMaxTeamThreads) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("a team of ", team_threads, " threads (1 to ", kMaxTeamThreads, ")"));
    return;
  }
  if (status_ = CheckMachineNode(numa_node); !status_.ok()) return;
  saved_.mask.assign(kMaskWords, 0);
  if (syscall(SYS_get_mempolicy, &saved_.mode, saved_.mask.data(), kMaxNodes, nullptr, 0UL) != 0) {
    status_ = PolicyError(errno, "cannot read the memory policy (get_mempolicy)");
    return;
  }
  saved_ok_ = true;
  const bool strict = policy == MemoryPolicy::kStrict;
  // The team's threads first: one this region starts inherits the calling
  // thread's policy, the saved one, before it sets its own.
  std::vector<absl::Status> set(static_cast<size_t>(team_threads_));
#pragma omp parallel num_threads(team_threads_)
  {
    const int t = omp_get_thread_num();
    if (t < team_threads_) set[static_cast<size_t>(t)] = SetThreadPolicy(numa_node, strict);
  }
  for (const absl::Status& s : set) {
    if (!s.ok()) {
      status_ = s;
      break;
    }
  }
}

ScopedTeamMemoryPolicy::~ScopedTeamMemoryPolicy() {
  if (!saved_ok_) return;
  // Without its mode flags (MPOL_F_STATIC_NODES, ...) get_mempolicy's mode
  // is what set_mempolicy takes with them; a default policy takes no mask.
  const int base_mode = saved_.mode & 0xff;
  const unsigned long* mask = base_mode == kMpolDefault ? nullptr : saved_.mask.data();
  const unsigned long max_node = base_mode == kMpolDefault ? 0 : kMaxNodes + 1;
#pragma omp parallel num_threads(team_threads_)
  {
    // Nothing to do about a failure: the policy was set on this thread,
    // so the call is allowed, and the mode and mask are the kernel's own.
    (void)syscall(SYS_set_mempolicy, saved_.mode, mask, max_node);
  }
}

absl::StatusOr<std::vector<int>> MemsAllowedFromStatus(std::string_view proc_status) {
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(proc_status.data(), proc_status.size()), '\n')) {
    if (!absl::ConsumePrefix(&line, "Mems_allowed_list:")) continue;
    absl::StatusOr<std::vector<int>> nodes = ParseCpuList(std::string(line.substr(0, 1 << 16)));
    if (!nodes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed Mems_allowed_list: ", nodes.status().message()));
    }
    return nodes;
  }
  return absl::InvalidArgumentError("no Mems_allowed_list line in the process status");
}

absl::StatusOr<std::vector<int>> MemsAllowed() {
  std::ifstream in("/proc/self/status");
  if (!in) return absl::NotFoundError("cannot read /proc/self/status");
  std::stringstream text;
  text << in.rdbuf();
  return MemsAllowedFromStatus(text.str());
}

absl::Status CheckWeightsNode(const Topology& topology, int numa_node,
                              const std::vector<int>* mems_allowed, std::string_view flag) {
  std::vector<int> nodes;
  for (const NumaNode& n : topology.numa_nodes) nodes.push_back(n.os_index);
  for (const NumaNode& n : topology.memory_only_nodes) nodes.push_back(n.os_index);
  std::sort(nodes.begin(), nodes.end());
  if (mems_allowed != nullptr) {
    std::vector<int> allowed;
    std::set_intersection(nodes.begin(), nodes.end(), mems_allowed->begin(), mems_allowed->end(),
                          std::back_inserter(allowed));
    nodes = std::move(allowed);
  }
  if (std::find(nodes.begin(), nodes.end(), numa_node) != nodes.end()) return absl::OkStatus();
  const bool on_machine =
      std::any_of(topology.memory_only_nodes.begin(), topology.memory_only_nodes.end(),
                  [&](const NumaNode& n) { return n.os_index == numa_node; });
  const bool with_cpus = std::any_of(topology.numa_nodes.begin(), topology.numa_nodes.end(),
                                     [&](const NumaNode& n) { return n.os_index == numa_node; });
  const char* why = (on_machine || with_cpus) ? " is not one this process may allocate on"
                                              : " is not a node of this machine";
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(flag), " ", numa_node, ": NUMA node ", numa_node, why, " (it may be ",
      nodes.empty() ? std::string("none") : FormatCpuList(nodes), ")"));
}

}  // namespace numaserve::affinity
