// The machine as hwloc sees it, as plain data. This header does not include
// <hwloc.h>; topology.cc is the only file that does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace numaserve::affinity {

// One physical core: its hardware threads and where it sits.
struct Core {
  int index = 0;         // logical index among the allowed cores, 0..n-1
  std::vector<int> pus;  // OS cpu numbers of its hardware threads; pus[0] is the primary
  int package = 0;       // logical index of its package (socket)
  int numa_node = -1;    // OS index of its nearest NUMA node, -1 if none
  int l3 = -1;           // logical index of its L3 cache domain, -1 if none
};

struct NumaNode {
  int os_index = 0;           // the node number the kernel uses (mbind, numactl)
  int package = 0;            // logical index of the package that holds it
  uint64_t memory_bytes = 0;  // local memory, 0 if unknown
  std::vector<int> cpus;      // allowed OS cpus local to this node
};

struct Topology {
  std::string source;           // "this machine", a synthetic description or an XML path
  bool is_this_machine = true;  // false for synthetic / XML: bindings are advisory only
  int num_packages = 0;
  int num_l3 = 0;
  std::vector<NumaNode> numa_nodes;  // allowed nodes with allowed cpus only, by OS index
  // Nodes with memory and no cpu at all on the machine (CXL-attached memory,
  // HBM as a memory-side node): listed so that reports count every node, but
  // no worker lives there. Their package is -1 and their cpus empty. A node
  // whose cpus a cpuset (taskset, --cpuset) leaves out is not one of these:
  // it is not listed at all.
  std::vector<NumaNode> memory_only_nodes;
  std::vector<Core> cores;  // allowed cores only, in hwloc's logical order
  int num_pus() const;
};

struct TopologyOptions {
  // Empty: this machine, restricted to the cpus and nodes this process may
  // use (cgroup cpuset, taskset). Otherwise an hwloc synthetic description
  // ("package:2 numa:1 core:8 pu:2") or the path of an hwloc XML export.
  // Synthetic levels are hwloc's ("l3" or "l3cache", "package" or "socket");
  // a description that stops above the PU level gets "pu:1" appended.
  std::string description;
  // Optional extra restriction, an OS cpu list such as "0-3,8". Applied on
  // top of the process's own restriction; useful with synthetic topologies.
  std::string cpuset;
};

// Loads the topology. Errors name what was wrong ("cannot parse synthetic
// topology 'x'", "cpuset '9-12' selects no cpu of this topology").
absl::StatusOr<Topology> DiscoverTopology(const TopologyOptions& options);

// The size in bytes of the outermost data (or unified) cache above OS cpu
// `cpu` on this machine (the L3 a core shares, on most x86 servers), as
// hwloc reports it; 0 if unknown.
uint64_t OuterCacheBytes(int cpu);

// Parses "0-3,8,10-11" into cpu numbers; error on malformed lists.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& list);
// Formats cpu numbers compactly: {0,1,2,3,8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

// Cpus grouped by physical core, the cores in a given order (a worker's,
// as the plan lists them): {{0,4},{1,5},{2,3}} <-> "0,4;1,5;2-3". Each
// core's cpus are a cpu list, ascending. Parsing keeps the cores' order;
// an error names a malformed or empty core, or a cpu in two cores.
absl::StatusOr<std::vector<std::vector<int>>> ParseCoreList(const std::string& list);
std::string FormatCoreList(const std::vector<std::vector<int>>& cores);

}  // namespace numaserve::affinity
