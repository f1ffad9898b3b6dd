// The real machine, as this process is allowed to see it.
#include "affinity/topology.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "affinity/placement.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

int AllowedCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return CPU_COUNT(&set);
}

TEST(MachineTopologyTest, IsConsistent) {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_TRUE(topology->is_this_machine);
  EXPECT_EQ(topology->source, "this machine");
  EXPECT_GE(topology->num_packages, 1);
  ASSERT_GE(topology->cores.size(), 1u);
  ASSERT_GE(topology->numa_nodes.size(), 1u);
  std::set<int> pus;
  for (const Core& core : topology->cores) {
    EXPECT_GE(core.pus.size(), 1u) << "core " << core.index;
    EXPECT_GE(core.numa_node, 0) << "core " << core.index;
    for (int pu : core.pus) EXPECT_TRUE(pus.insert(pu).second) << "pu " << pu << " twice";
  }
  for (const NumaNode& node : topology->numa_nodes) {
    EXPECT_GT(node.memory_bytes, 0u) << "node " << node.os_index;
    EXPECT_FALSE(node.cpus.empty()) << "node " << node.os_index;
  }
  // Restricted to this process's affinity mask.
  EXPECT_EQ(topology->num_pus(), AllowedCpuCount());
  absl::StatusOr<Plan> plan = MakePlan(*topology, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workers.size(), topology->numa_nodes.size());
}

// As under `taskset -c <first cpu>`: the topology shows one core. Run in a
// child so this process keeps its mask.
TEST(MachineTopologyTest, OuterCacheOfACore) {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  ASSERT_TRUE(topology.ok()) << topology.status();
  ASSERT_FALSE(topology->cores.empty());
  const Core& core = topology->cores.front();
  const uint64_t bytes = OuterCacheBytes(core.pus.front());
  // A core under an L3 has at least that cache above it (the L3 or a larger
  // one); a machine reporting no L3 may still report an L2 (or nothing).
  if (core.l3 >= 0) {
    EXPECT_GE(bytes, uint64_t{1} << 20);
  }
  // Every hardware thread of a core shares its caches.
  for (int pu : core.pus) EXPECT_EQ(OuterCacheBytes(pu), bytes) << "cpu " << pu;
  EXPECT_EQ(OuterCacheBytes(-1), 0u);
  EXPECT_EQ(OuterCacheBytes(1 << 20), 0u);  // no such cpu
}

TEST(MachineTopologyTest, FollowsAffinityMask) {
  absl::StatusOr<Topology> full = DiscoverTopology({});
  ASSERT_TRUE(full.ok()) << full.status();
  const int first_cpu = full->cores.front().pus.front();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(first_cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) _exit(2);
    absl::StatusOr<Topology> restricted = DiscoverTopology({});
    if (!restricted.ok()) _exit(3);
    if (restricted->cores.size() != 1 || restricted->num_pus() != 1) _exit(4);
    if (restricted->cores[0].pus != std::vector<int>{first_cpu}) _exit(5);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: setaffinity, 3: discover, 4: counts, 5: cpu";
}

TEST(MachineTopologyTest, CpusetOption) {
  absl::StatusOr<Topology> full = DiscoverTopology({});
  ASSERT_TRUE(full.ok()) << full.status();
  TopologyOptions options;
  options.cpuset = std::to_string(full->cores.back().pus.front());
  absl::StatusOr<Topology> one = DiscoverTopology(options);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->num_pus(), 1);
  options.cpuset = "100000";
  EXPECT_FALSE(DiscoverTopology(options).ok());
}

}  // namespace
}  // namespace numaserve::affinity
