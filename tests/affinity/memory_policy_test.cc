// A memory policy for one phase (affinity/memory_policy.h): set on the
// calling thread and its OpenMP team, restored after; and the checks of
// serve --weights-node on a synthetic topology.
#include "affinity/memory_policy.h"

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

using ::testing::HasSubstr;

// Runs `body` in a forked child (this process's policy stays as it is) and
// returns its exit code; body returns 0 on success.
template <typename Body>
int InChild(Body body) {
  fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// The policy of every thread of a team of `threads` (DescribeMemoryPolicy),
// the calling thread's first.
std::vector<std::string> TeamPolicies(int threads) {
  std::vector<std::string> policies(static_cast<size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    if (t < threads) policies[static_cast<size_t>(t)] = DescribeMemoryPolicy();
  }
  return policies;
}

// 2 cpu nodes and a memory-only one, as plain data.
Topology TwoNodesAndMemoryOnly() {
  Topology t;
  t.is_this_machine = false;
  t.numa_nodes = {{.os_index = 0, .cpus = {0, 1}}, {.os_index = 1, .cpus = {2, 3}}};
  t.memory_only_nodes = {{.os_index = 2, .package = -1}};
  return t;
}

TEST(MemoryPolicyTest, TheTeamTakesTheNodeInTheScopeAndItsOwnPolicyAfter) {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  ASSERT_TRUE(topology.ok()) << topology.status();
  const int node = topology->numa_nodes.front().os_index;
  const int code = InChild([&] {
    constexpr int kThreads = 3;
    const std::vector<std::string> before = TeamPolicies(kThreads);
    if (before != std::vector<std::string>(kThreads, "default")) return 2;
    const std::string strict = "strict node " + std::to_string(node);
    {
      ScopedTeamMemoryPolicy scope(node, MemoryPolicy::kStrict, kThreads);
      if (!scope.status().ok()) {
        fprintf(stderr, "scope: %s\n", scope.status().ToString().c_str());
        return 3;
      }
      const std::vector<std::string> inside = TeamPolicies(kThreads);
      for (const std::string& p : inside) {
        if (p != strict) {
          fprintf(stderr, "in the scope: '%s', expected '%s'\n", p.c_str(), strict.c_str());
          return 4;
        }
      }
    }
    const std::vector<std::string> after = TeamPolicies(kThreads);
    for (const std::string& p : after) {
      if (p != "default") {
        fprintf(stderr, "after the scope: '%s'\n", p.c_str());
        return 5;
      }
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: policy before, 3: scope failed, 4: policy inside, 5: not restored";
}

TEST(MemoryPolicyTest, APreferredPolicyIsRestoredToo) {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  ASSERT_TRUE(topology.ok()) << topology.status();
  const int node = topology->numa_nodes.front().os_index;
  const int code = InChild([&] {
    if (!BindProcessMemory(node, MemoryPolicy::kPrefer).ok()) return 2;
    const std::string prefer = "prefer node " + std::to_string(node);
    if (DescribeMemoryPolicy() != prefer) return 3;
    {
      ScopedTeamMemoryPolicy scope(node, MemoryPolicy::kStrict, 2);
      if (!scope.status().ok() || DescribeMemoryPolicy() != "strict node " + std::to_string(node))
        return 4;
    }
    for (const std::string& p : TeamPolicies(2)) {
      if (p != prefer) {
        fprintf(stderr, "after the scope: '%s', expected '%s'\n", p.c_str(), prefer.c_str());
        return 5;
      }
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: bind, 3: policy before, 4: policy inside, 5: not restored";
}

TEST(MemoryPolicyTest, ANodeTheMachineLacksOrARefusalIsAnErrorAndChangesNothing) {
  const int code = InChild([] {
    {
      ScopedTeamMemoryPolicy scope(4000, MemoryPolicy::kPrefer, 2);
      if (scope.status().code() != absl::StatusCode::kInvalidArgument) return 2;
      if (scope.status().message().find("NUMA node 4000 does not exist") == std::string::npos) {
        return 3;
      }
    }
    {
      ScopedTeamMemoryPolicy scope(0, MemoryPolicy::kPrefer, 0);
      if (scope.status().code() != absl::StatusCode::kInvalidArgument) return 4;
    }
    setenv("NUMASERVE_TEST_REFUSE_MEMBIND", "1", 1);
    {
      ScopedTeamMemoryPolicy scope(0, MemoryPolicy::kStrict, 2);
      if (scope.status().code() != absl::StatusCode::kPermissionDenied) return 5;
    }
    for (const std::string& p : TeamPolicies(2)) {
      if (p != "default") return 6;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2-3: missing node, 4: team of 0, 5: refusal, 6: policy changed";
}

TEST(MemoryPolicyTest, MemsAllowedIsReadFromTheProcessStatus) {
  absl::StatusOr<std::vector<int>> mems =
      MemsAllowedFromStatus("Name:\tnumaserve\nMems_allowed:\t00000007\nMems_allowed_list:\t0-2\n");
  ASSERT_TRUE(mems.ok()) << mems.status();
  EXPECT_EQ(*mems, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(MemsAllowedFromStatus("Name:\tx\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MemsAllowedFromStatus("Mems_allowed_list:\t0-x\n").status().message(),
              HasSubstr("malformed Mems_allowed_list"));
  absl::StatusOr<std::vector<int>> own = MemsAllowed();
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_FALSE(own->empty());
}

TEST(MemoryPolicyTest, WeightsNodeMayBeAMemoryOnlyNodeOrANodeWithCpus) {
  const Topology t = TwoNodesAndMemoryOnly();
  for (int node : {0, 1, 2}) {
    EXPECT_TRUE(CheckWeightsNode(t, node, nullptr, "--weights-node").ok()) << node;
  }
  const std::vector<int> all = {0, 1, 2};
  EXPECT_TRUE(CheckWeightsNode(t, 2, &all, "--weights-node").ok());
}

TEST(MemoryPolicyTest, WeightsNodeTheMachineLacksOrMayNotUseIsRefusedNamingTheFlag) {
  const Topology t = TwoNodesAndMemoryOnly();
  absl::Status s = CheckWeightsNode(t, 3, nullptr, "--weights-node");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--weights-node 3: NUMA node 3 is not a node of this "
                                     "machine (it may be 0-2)"));
  // A cpuset whose mems leave out the memory-only node.
  const std::vector<int> mems = {0, 1};
  s = CheckWeightsNode(t, 2, &mems, "--weights-node");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--weights-node 2: NUMA node 2 is not one this process may "
                                     "allocate on (it may be 0-1)"));
  EXPECT_TRUE(CheckWeightsNode(t, 1, &mems, "--weights-node").ok());
  // A synthetic topology's nodes, as hwloc builds them.
  absl::StatusOr<Topology> synthetic = DiscoverTopology({"package:2 numa:1 core:2"});
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  EXPECT_TRUE(CheckWeightsNode(*synthetic, 1, nullptr, "--weights-node").ok());
  EXPECT_THAT(CheckWeightsNode(*synthetic, 2, nullptr, "--weights-node").message(),
              HasSubstr("is not a node of this machine (it may be 0-1)"));
}

}  // namespace
}  // namespace numaserve::affinity
