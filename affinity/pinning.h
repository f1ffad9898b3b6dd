// Applying a placement to the running process, and NUMA-local memory.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace numaserve::affinity {

struct Topology;

// How a process's memory is bound to its node (serve --membind,
// docs/configuration.md):
//   kPrefer: the node first, other nodes once it is full (the kernel's
//     MPOL_PREFERRED_MANY, MPOL_PREFERRED before Linux 5.15): nothing
//     fails for want of memory on the node, and what spills runs at the
//     remote node's bandwidth;
//   kStrict: the node only (MPOL_BIND): an allocation the node cannot
//     hold reclaims and then fails there (the OOM killer, within the node),
//     never spilling.
enum class MemoryPolicy { kPrefer, kStrict };

// "prefer" | "strict"; an error names what is accepted.
absl::StatusOr<MemoryPolicy> ParseMemoryPolicy(std::string_view name);
const char* MemoryPolicyName(MemoryPolicy policy);

// Binds every thread of the calling process to `cpus`. Call first thing in
// a worker, before any OpenMP or oneDNN code runs.
absl::Status BindProcessCpus(const std::vector<int>& cpus);

// Binds the calling thread's future memory allocations (and those of the
// threads it creates afterwards: Linux memory policy is per thread) to NUMA
// node `numa_node` under `policy`, moving the pages already touched there
// where the kernel can. OK and nothing done for numa_node < 0. A node the
// machine lacks is INVALID_ARGUMENT; a refusal of the kernel's call (EPERM:
// a container's seccomp filter without CAP_SYS_NICE)
// PERMISSION_DENIED, for the caller to fall back on first touch
// (PrefaultPages from its pinned threads).
absl::Status BindProcessMemory(int numa_node, MemoryPolicy policy);

// Both of the above, cpus first: memory then lands on the node of the cpus
// even if the memory policy fails. A failure (of either; both named) is
// returned for the caller to log as a warning.
absl::Status BindProcess(const std::vector<int>& cpus, int numa_node,
                         MemoryPolicy policy = MemoryPolicy::kPrefer);

// Binds the pages of [addr, addr+bytes) to `numa_node` under `policy`
// (moving those already touched where the kernel can; codes as
// BindProcessMemory). No-op for numa_node < 0.
absl::Status BindMemoryToNode(void* addr, size_t bytes, int numa_node,
                              MemoryPolicy policy = MemoryPolicy::kPrefer);

// Allocates every page of [addr, addr+bytes) now, from the calling thread,
// keeping their contents: with madvise(MADV_POPULATE_WRITE) (Linux 5.14)
// where the kernel has it and `use_populate`, else by writing the first
// byte of each page with its own value (an atomic or with 0). Under the
// default policy a page lands on the node of the cpu that first touches
// it: called from a thread pinned to a node's cpus, the pages are that
// node's. Returns how: "MADV_POPULATE_WRITE" or "a write per page".
absl::StatusOr<std::string> PrefaultPages(void* addr, size_t bytes, bool use_populate = true);

// The calling thread's memory policy as the kernel has it, and its nodes:
// "strict node 0", "prefer node 1", "prefer nodes 0-1", "default" (the
// node of the touching cpu), "local"; "unknown (...)" where get_mempolicy
// fails (a seccomp filter refuses it too).
std::string DescribeMemoryPolicy();

// The calling process's current cpu binding and memory policy, for the
// worker's start-up line: "cpus 0-7 mem strict node 0".
std::string DescribeBinding();

// The NUMA node holding the page at `addr`, -1 if unknown.
int NodeOfAddress(const void* addr);

// Binds the calling thread alone to `cpus` (an instance's or a batch
// group's share of the process's cpus).
absl::Status PinCallingThread(const std::vector<int>& cpus);

// The cpus the calling thread may run on, ascending; empty if unknown.
std::vector<int> CallingThreadCpus();

// Starts an OpenMP team of cpus.size() threads from the calling thread and
// pins each to its own cpu of `cpus`, the calling thread (the team's thread
// 0) included. With OMP_PROC_BIND set, libgomp binds a thread that starts
// its first team to the first OpenMP place of the process (cpu 0 for every
// copy of a model, which left the second copy of a 2-core worker sharing
// the first one's core); pinned inside that first region, the binding holds
// for every later region the thread starts (libgomp keeps a thread pool per
// thread that starts parallel regions).
void PinOpenMpTeam(const std::vector<int>& cpus);

// `cpus` split into n disjoint shares, in order (sizes differ by at most
// one cpu; n >= 1).
std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus, int n);

// A worker's cores (each core's cpus, in the plan's order) split into n
// shares of whole cores, in order: the shares' sizes differ by at most one
// core, and no core is in two shares, so copies of a model on two shares
// never run on the two hardware threads of one core. A share's cpus are
// its cores', core after core (a team pinned to them in order puts threads
// 2i and 2i+1 on one core's siblings). n >= 1; with more shares than
// cores, the last ones are empty.
std::vector<std::vector<int>> SplitCores(const std::vector<std::vector<int>>& cores, int n);

// `cores` with only the cpus in `allowed`, in the same order; a core left
// without a cpu is dropped.
std::vector<std::vector<int>> CoresWithin(const std::vector<std::vector<int>>& cores,
                                          const std::vector<int>& allowed);

// The cpus of a team of `threads` threads on `cpus` (the calling thread's,
// in any order) split into `groups` shares of whole cores, for batch groups:
// `cpus` grouped by `topology`'s cores in its order (the plan's, so a
// share's cpus go core after core), the first `threads` of them kept, and
// the cores dealt out as SplitCores does, so that no core serves two
// groups. With fewer cores than groups the cpus themselves are split (the
// groups then share cores: there are not enough). Empty when `cpus` has
// fewer than `threads` cpus (the groups then float, like the team).
// Cpus that `topology` does not know count as cores of their own.
std::vector<std::vector<int>> TeamShares(const Topology& topology, const std::vector<int>& cpus,
                                         int threads, int groups);

}  // namespace numaserve::affinity
