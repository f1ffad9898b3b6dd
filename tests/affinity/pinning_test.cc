#include "affinity/pinning.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
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
        "cpus " + std::to_string(cpu) + " mem prefer node " + std::to_string(node);
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

// The first cpu and its node, of this machine.
std::pair<int, int> FirstCpuAndNode() {
  absl::StatusOr<Topology> topology = DiscoverTopology({});
  if (!topology.ok() || topology->cores.empty()) return {-1, -1};
  return {topology->cores.front().pus.front(), topology->cores.front().numa_node};
}

// The policy field of /proc/self/numa_maps' line for the mapping at `addr`
// ("bind:0", "prefer (many):0", "default"); "" if not found.
std::string NumaMapsPolicy(const void* addr) {
  std::ifstream in("/proc/self/numa_maps");
  const std::string start = absl::StrFormat("%x ", reinterpret_cast<uintptr_t>(addr));
  for (std::string line; std::getline(in, line);) {
    if (!absl::StartsWith(line, start)) continue;
    std::string policy = line.substr(start.size());
    // "prefer (many):0 anon=..." : up to the first space after the colon.
    const size_t colon = policy.find(':');
    const size_t end = policy.find(' ', colon == std::string::npos ? 0 : colon);
    return policy.substr(0, end);
  }
  return "";
}

TEST(PinningTest, ParsesTheMemoryPolicies) {
  EXPECT_EQ(*ParseMemoryPolicy("strict"), MemoryPolicy::kStrict);
  EXPECT_EQ(*ParseMemoryPolicy("prefer"), MemoryPolicy::kPrefer);
  EXPECT_STREQ(MemoryPolicyName(MemoryPolicy::kStrict), "strict");
  EXPECT_STREQ(MemoryPolicyName(MemoryPolicy::kPrefer), "prefer");
  absl::StatusOr<MemoryPolicy> bad = ParseMemoryPolicy("bind");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "expected strict or prefer"))
      << bad.status();
}

// Strict is the kernel's MPOL_BIND (hwloc's BIND without its STRICT flag is
// MPOL_PREFERRED_MANY), prefer MPOL_PREFERRED(_MANY): the kernel's own
// answer (get_mempolicy) says which.
TEST(PinningTest, StrictBindsAndPreferPrefers) {
  const auto [cpu, node] = FirstCpuAndNode();
  if (node < 0) GTEST_SKIP() << "no NUMA node on this machine";
  const int code = InChild([cpu, node] {
    if (!BindProcess({cpu}, node, MemoryPolicy::kStrict).ok()) return 2;
    const std::string strict = DescribeMemoryPolicy();
    if (strict != "strict node " + std::to_string(node)) {
      fprintf(stderr, "strict: '%s'\n", strict.c_str());
      return 3;
    }
    if (!BindProcessMemory(node, MemoryPolicy::kPrefer).ok()) return 4;
    const std::string prefer = DescribeMemoryPolicy();
    if (prefer != "prefer node " + std::to_string(node)) {
      fprintf(stderr, "prefer: '%s'\n", prefer.c_str());
      return 5;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: bind, 3: strict's policy, 4: prefer, 5: prefer's policy";
}

TEST(PinningTest, AStrictAreaIsBoundEvenWithPagesTouchedBefore) {
  const auto [cpu, node] = FirstCpuAndNode();
  if (node < 0) GTEST_SKIP() << "no NUMA node on this machine";
  constexpr size_t kBytes = 1 << 20;
  // Shared: the pages of a worker's arena, which the server maps too.
  void* memory = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  std::memset(memory, 1, kBytes / 2);
  absl::Status bound = BindMemoryToNode(memory, kBytes, node, MemoryPolicy::kStrict);
  EXPECT_TRUE(bound.ok()) << bound;
  EXPECT_EQ(NumaMapsPolicy(memory), "bind:" + std::to_string(node));
  EXPECT_TRUE(BindMemoryToNode(memory, kBytes, node, MemoryPolicy::kPrefer).ok());
  EXPECT_TRUE(absl::StartsWith(NumaMapsPolicy(memory), "prefer"))
      << "'" << NumaMapsPolicy(memory) << "'";
  munmap(memory, kBytes);
}

// NUMASERVE_TEST_REFUSE_MEMBIND=1 makes the policy calls fail as a seccomp
// filter does (EPERM), and leaves the kernel's policy alone.
TEST(PinningTest, ARefusedPolicyIsPermissionDeniedAndLeavesTheDefault) {
  const auto [cpu, node] = FirstCpuAndNode();
  if (node < 0) GTEST_SKIP() << "no NUMA node on this machine";
  const int code = InChild([node] {
    setenv("NUMASERVE_TEST_REFUSE_MEMBIND", "1", 1);
    absl::Status status = BindProcessMemory(node, MemoryPolicy::kStrict);
    if (status.code() != absl::StatusCode::kPermissionDenied) return 2;
    if (!absl::StrContains(status.message(), "NUMASERVE_TEST_REFUSE_MEMBIND")) return 3;
    if (DescribeMemoryPolicy() != "default") return 4;
    char page[4096];
    if (BindMemoryToNode(page, sizeof(page), node).code() != absl::StatusCode::kPermissionDenied) {
      return 5;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "2: code, 3: message, 4: policy changed, 5: area not refused";
}

// Both ways of pre-faulting make every page resident and keep what the
// pages held.
TEST(PinningTest, PrefaultMakesEveryPageResidentKeepingItsBytes) {
  const long page = sysconf(_SC_PAGESIZE);
  ASSERT_GT(page, 0);
  constexpr int kPages = 64;
  for (bool populate : {true, false}) {
    char* memory = static_cast<char*>(
        mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(memory, MAP_FAILED);
    memory[3 * page] = 42;
    memory[3 * page + 1] = 43;
    // From inside the first page to inside the last: every page it spans.
    absl::StatusOr<std::string> how =
        PrefaultPages(memory + 100, kPages * page - 200, /*use_populate=*/populate);
    ASSERT_TRUE(how.ok()) << how.status();
    if (!populate) {
      EXPECT_EQ(*how, "a write per page");
    }
    std::vector<unsigned char> resident(kPages);
    ASSERT_EQ(mincore(memory, kPages * page, resident.data()), 0);
    int count = 0;
    for (unsigned char r : resident) count += r & 1;
    EXPECT_EQ(count, kPages) << *how;
    EXPECT_EQ(memory[3 * page], 42);
    EXPECT_EQ(memory[3 * page + 1], 43);
    munmap(memory, kPages * page);
  }
  EXPECT_FALSE(PrefaultPages(nullptr, 4096).ok());
}

}  // namespace
}  // namespace numaserve::affinity
