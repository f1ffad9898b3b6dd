// Batch groups' cpu shares (TeamShares, engine/compiler/batch_groups.cc)
// over synthetic topologies numbered as Linux numbers SMT siblings.
#include <map>
#include <string>
#include <vector>

#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

using Shares = std::vector<std::vector<int>>;

Topology Synthetic(const std::string& description) {
  TopologyOptions options;
  options.description = description;
  absl::StatusOr<Topology> topology = DiscoverTopology(options);
  EXPECT_TRUE(topology.ok()) << description << ": " << topology.status();
  return topology.ok() ? *topology : Topology{};
}

// Linux numbers a core's SMT siblings apart: cpus i and i+4 are one core's.
constexpr char kLinuxSmt[] = "pack:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)";

// The core (its index) each cpu of `topology` belongs to.
std::map<int, int> CoreOfCpu(const Topology& topology) {
  std::map<int, int> core_of;
  for (const Core& core : topology.cores) {
    for (int pu : core.pus) core_of[pu] = core.index;
  }
  return core_of;
}

// No core serves two shares.
void ExpectDistinctCores(const Topology& topology, const Shares& shares) {
  const std::map<int, int> core_of = CoreOfCpu(topology);
  std::map<int, size_t> share_of_core;
  for (size_t s = 0; s < shares.size(); ++s) {
    for (int cpu : shares[s]) {
      const auto [it, inserted] = share_of_core.emplace(core_of.at(cpu), s);
      EXPECT_EQ(it->second, s) << "core " << it->first << " (cpu " << cpu << ") in share " << s
                               << " and share " << it->second;
    }
  }
}

TEST(TeamSharesTest, BatchGroupsTakeDistinctCoresOnLinuxNumberedSmt) {
  const Topology topology = Synthetic(kLinuxSmt);
  // A worker's team of 8 threads on its 4 cores; the calling thread's cpus
  // come back ascending from the kernel.
  const std::vector<int> ascending = {0, 1, 2, 3, 4, 5, 6, 7};
  const Shares two = TeamShares(topology, ascending, 8, 2);
  EXPECT_EQ(two, (Shares{{0, 4, 1, 5}, {2, 6, 3, 7}}));
  ExpectDistinctCores(topology, two);
  ExpectDistinctCores(topology, TeamShares(topology, ascending, 8, 4));
  ExpectDistinctCores(topology, TeamShares(topology, ascending, 8, 3));
  // What the groups got before: the ascending cpus split in order, each
  // core's first thread in one group and its sibling in the other.
  const Shares before = SplitCpus(ascending, 2);
  EXPECT_EQ(before, (Shares{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // An instance of two cores (cpus 0,4,1,5 in the plan; 0,1,4,5 read back)
  // in two groups: a core each.
  EXPECT_EQ(TeamShares(topology, {0, 1, 4, 5}, 4, 2), (Shares{{0, 4}, {1, 5}}));
}

TEST(TeamSharesTest, ATeamSmallerThanItsCpusTakesTheFirstCores) {
  const Topology topology = Synthetic(kLinuxSmt);
  // 4 threads of 8 cpus: the first two cores, whole.
  EXPECT_EQ(TeamShares(topology, {0, 1, 2, 3, 4, 5, 6, 7}, 4, 2), (Shares{{0, 4}, {1, 5}}));
  // Fewer cpus than threads: the groups float.
  EXPECT_TRUE(TeamShares(topology, {0, 4}, 4, 2).empty());
  // Fewer cores than groups: the cpus themselves are split.
  EXPECT_EQ(TeamShares(topology, {0, 4}, 2, 2), (Shares{{0}, {4}}));
  // Cpus the topology lacks count as cores of their own.
  EXPECT_EQ(TeamShares(Topology{}, {3, 1}, 2, 2), (Shares{{3}, {1}}));
  // Without SMT the order is the cpus'.
  const Topology plain = Synthetic("package:1 core:4 pu:1");
  EXPECT_EQ(TeamShares(plain, {0, 1, 2, 3}, 4, 2), (Shares{{0, 1}, {2, 3}}));
}

}  // namespace
}  // namespace numaserve::affinity
