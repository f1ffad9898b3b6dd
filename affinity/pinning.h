// Applying a placement to the running process, and NUMA-local memory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace numaserve::affinity {

struct Topology;

// Binds every thread of the calling process to `cpus` and its future memory
// allocations to NUMA node `numa_node` (skipped when < 0). Call first thing
// in a worker, before any OpenMP or oneDNN code runs. A failure is returned
// for the caller to log as a warning: the worker keeps running unpinned.
// (Linux memory policy is per thread: it is set for the calling thread and
// inherited by the threads it creates afterwards.)
absl::Status BindProcess(const std::vector<int>& cpus, int numa_node);

// Binds the pages of [addr, addr+bytes) to `numa_node` (moving those already
// touched). Warnings, not errors, on failure; no-op for numa_node < 0.
absl::Status BindMemoryToNode(void* addr, size_t bytes, int numa_node);

// The calling process's current cpu binding and memory policy, for the
// worker's start-up line: "cpus 0-7 mem bind node 0".
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
