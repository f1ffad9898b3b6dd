#include "affinity/pinning.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "affinity/topology.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

// Runs `body` in a forked child (so this process stays unpinned) and
// returns its exit code; body returns 0 on success.
template <typename Body>
int InChild(Body body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(PinningTest, BindProcessToFirstCpu) {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  ASSERT_TRUE(topology.ok()) << topology.status();
  const int cpu = topology->cores.front().pus.front();
  const int node = topology->cores.front().numa_node;
  const int code = InChild([&] {
    absl::Status status = BindProcess({cpu}, node);
    if (!status.ok()) return 2;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 3;
    if (CPU_COUNT(&set) != 1 || !CPU_ISSET(cpu, &set)) return 4;
    const std::string description = DescribeBinding();
    const std::string expected =
        "cpus " + std::to_string(cpu) + " mem bind node " + std::to_string(node);
    if (description != expected) {
      fprintf(stderr, "DescribeBinding: '%s', expected '%s'\n", description.c_str(),
              expected.c_str());
      return 5;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: bind, 3: getaffinity, 4: mask, 5: description";
}

TEST(PinningTest, DescribeUnboundProcess) {
  const std::string description = DescribeBinding();
  EXPECT_TRUE(absl::StartsWith(description, "cpus ")) << description;
  EXPECT_TRUE(absl::StrContains(description, " mem ")) << description;
}

TEST(PinningTest, Errors) {
  EXPECT_FALSE(BindProcess({}, -1).ok());
  const int code = InChild([] { return BindProcess({0}, 4096).ok() ? 1 : 0; });
  EXPECT_EQ(code, 0) << "binding to a node that does not exist must fail";
}

TEST(PinningTest, BindMemoryToNodeAndLocate) {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  ASSERT_TRUE(topology.ok()) << topology.status();
  const int node = topology->numa_nodes.front().os_index;
  constexpr size_t kBytes = 4 << 20;
  void* memory = nullptr;
  ASSERT_EQ(posix_memalign(&memory, 4096, kBytes), 0);
  std::memset(memory, 1, kBytes / 2);  // half touched before binding: those pages migrate
  EXPECT_TRUE(BindMemoryToNode(memory, kBytes, node).ok());
  std::memset(memory, 2, kBytes);
  EXPECT_EQ(NodeOfAddress(memory), node);
  EXPECT_EQ(NodeOfAddress(static_cast<char*>(memory) + kBytes - 1), node);
  EXPECT_TRUE(BindMemoryToNode(memory, kBytes, -1).ok()) << "no-op for node < 0";
  EXPECT_FALSE(BindMemoryToNode(memory, kBytes, 4096).ok());
  free(memory);
  EXPECT_EQ(NodeOfAddress(nullptr), -1);
}

}  // namespace
}  // namespace numaserve::affinity
