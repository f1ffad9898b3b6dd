// Applying a placement to the running process, and NUMA-local memory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace numaserve::affinity {

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

}  // namespace numaserve::affinity
