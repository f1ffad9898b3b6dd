// The memory-bandwidth probe: STREAM's byte accounting (pure), the default
// size's bounds, and a real (small, short) triad on this machine.
#include "affinity/memory_bandwidth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace numaserve::affinity {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(MemoryBandwidthTest, CountsBytesAsStreamDoes) {
  // Two arrays read, one written, 8 bytes an element (4 for floats).
  EXPECT_EQ(TriadBytes(1000), 24000);
  EXPECT_EQ(TriadBytes(1000, 4), 12000);
  EXPECT_EQ(TriadBytes(0), 0);
}

TEST(MemoryBandwidthTest, SplitsArraysIntoWholeCacheLinesPerThread) {
  // 240 MiB over 3 arrays of doubles: 10 Mi elements each.
  EXPECT_EQ(TriadElements(240 * kMiB, 1), 10 * kMiB);
  const int64_t n = TriadElements(240 * kMiB, 3);
  EXPECT_EQ(n % (8 * 3), 0);
  EXPECT_LE(TriadBytes(n), 240 * kMiB);
  EXPECT_GT(TriadBytes(n), 240 * kMiB - 3 * 8 * 8 * 3);
  // Never less than one cache line per thread.
  EXPECT_EQ(TriadElements(1, 4), 32);
}

TEST(MemoryBandwidthTest, DefaultSizeIsFarPastTheCacheAndBounded) {
  EXPECT_EQ(DefaultProbeBytes(32 * kMiB, 0), 256 * kMiB);           // at least 256 MiB
  EXPECT_EQ(DefaultProbeBytes(100 * kMiB, 0), 400 * kMiB);          // 4x the cache
  EXPECT_EQ(DefaultProbeBytes(508 * kMiB, 0), 512 * kMiB);          // capped at 512 MiB
  EXPECT_EQ(DefaultProbeBytes(32 * kMiB, 512 * kMiB), 128 * kMiB);  // a quarter of what is free
  EXPECT_EQ(DefaultProbeBytes(32 * kMiB, 16 * kMiB), 64 * kMiB);    // never below 64 MiB
}

TEST(MemoryBandwidthTest, MeasuresAPositiveFiniteFigure) {
  BandwidthOptions options;
  options.total_bytes = 96 * kMiB;  // past this machine's cache, quick to touch
  options.repetitions = 3;
  auto r = MeasureMemoryBandwidth(options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(std::isfinite(r->gb_per_second));
  EXPECT_GT(r->gb_per_second, 0.1);
  EXPECT_LT(r->gb_per_second, 10000.0) << "over 10 TB/s";
  EXPECT_GE(r->passes, 2);
  EXPECT_LE(r->passes, 3);
  EXPECT_EQ(r->bytes_per_pass, TriadBytes(r->elements));
  EXPECT_EQ(static_cast<int>(r->cpus.size()), r->threads);
}

TEST(MemoryBandwidthTest, OneThreadOnTheFirstAllowedCpu) {
  BandwidthOptions options;
  options.threads = 1;
  options.total_bytes = 64 * kMiB;
  options.repetitions = 2;
  auto r = MeasureMemoryBandwidth(options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->threads, 1);
  EXPECT_GT(r->gb_per_second, 0.1);
}

TEST(MemoryBandwidthTest, RejectsBadOptions) {
  BandwidthOptions options;
  options.repetitions = 0;
  EXPECT_FALSE(MeasureMemoryBandwidth(options).ok());
  // No such cpu: the error names it.
  auto r = MeasureMemoryBandwidth(BandwidthOptions{.cpus = {1 << 20}, .total_bytes = kMiB});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cpu 1048576"), std::string::npos) << r.status();
}

// A fake /proc, /sys and cgroup tree in a temporary directory.
class FakeMemoryTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/memory_roots_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    roots_.proc = dir_ + "/proc";
    roots_.sys = dir_ + "/sys";
    roots_.cgroup = dir_ + "/cgroup";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(dir_ + path).parent_path());
    std::ofstream(dir_ + path) << text;
  }

  // Node N's meminfo as the kernel writes it (values in kB).
  void WriteNode(int node, uint64_t free_kb, uint64_t inactive_file_kb, uint64_t reclaimable_kb,
                 const std::string& cpulist) {
    const std::string prefix = "Node " + std::to_string(node) + " ";
    const std::string dir = "/sys/devices/system/node/node" + std::to_string(node);
    Write(dir + "/meminfo", prefix + "MemTotal:       99999999 kB\n" + prefix +
                                "MemFree:        " + std::to_string(free_kb) + " kB\n" + prefix +
                                "Active(file):   777777 kB\n" + prefix +
                                "Inactive(file): " + std::to_string(inactive_file_kb) + " kB\n" +
                                prefix + "SReclaimable:   " + std::to_string(reclaimable_kb) +
                                " kB\n" + prefix + "HugePages_Total:     0\n");
    Write(dir + "/cpulist", cpulist + "\n");
  }

  std::string dir_;
  MemoryRoots roots_;
};

constexpr uint64_t kKiB = 1024;

TEST_F(FakeMemoryTree, TheHostsMemAvailable) {
  EXPECT_EQ(HostAvailableMemoryBytes(roots_), 0u) << "no meminfo: unknown";
  Write("/proc/meminfo",
        "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:    8000000 kB\nBuffers:  12 kB\n");
  EXPECT_EQ(HostAvailableMemoryBytes(roots_), 8000000 * kKiB);
}

TEST_F(FakeMemoryTree, ANodesFreeMemoryCountsWhatItReclaimsFirst) {
  WriteNode(1, 1000, 200, 50, "4-7");
  // MemFree + Inactive(file) + SReclaimable; active file pages not counted.
  EXPECT_EQ(NodeAvailableMemoryBytes(1, roots_), 1250 * kKiB);
  EXPECT_EQ(NodeAvailableMemoryBytes(0, roots_), 0u) << "no such node: unknown";
  EXPECT_EQ(NodeAvailableMemoryBytes(-1, roots_), 0u);
  // Garbage and values that would not fit in bytes are left out.
  Write("/sys/devices/system/node/node2/meminfo",
        "Node 2 MemFree: 184467440737095516 kB\nNode 2 Inactive(file): x kB\nnonsense\n"
        "Node 2 SReclaimable: 8 kB\n");
  EXPECT_EQ(NodeAvailableMemoryBytes(2, roots_), 0u) << "no readable MemFree: unknown";
}

TEST_F(FakeMemoryTree, TheCgroupsHeadroomIsTheSmallestOnTheWayUp) {
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), std::nullopt) << "no /proc/self/cgroup";
  Write("/proc/self/cgroup", "0::/a/b\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), std::nullopt) << "no memory.max anywhere";
  Write("/cgroup/a/b/memory.max", "max\n");
  Write("/cgroup/a/b/memory.current", "1000\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), std::nullopt) << "max: no limit";
  // The parent's limit holds for the child: 1 GiB, 900 MiB used of which
  // 50 MiB inactive page cache.
  Write("/cgroup/a/memory.max", "1073741824\n");
  Write("/cgroup/a/memory.current", "943718400\n");
  Write("/cgroup/a/memory.stat", "anon 1000\ninactive_file 52428800\nactive_file 7\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), uint64_t{124 + 50} << 20);
  // A tighter limit below wins; over its limit, only its page cache is left.
  Write("/cgroup/a/b/memory.max", "4096\n");
  Write("/cgroup/a/b/memory.current", "8192\n");
  Write("/cgroup/a/b/memory.stat", "inactive_file 100\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), 100u);
  // A cgroup namespace: the process's cgroup is the hierarchy's root.
  Write("/proc/self/cgroup", "0::/\n");
  Write("/cgroup/memory.max", "2000000\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), 2000000u);
}

TEST_F(FakeMemoryTree, NoUnifiedCgroupOrAHostilePathMeansNoLimit) {
  Write("/cgroup/memory.max", "4096\n");
  Write("/proc/self/cgroup", "12:memory:/docker/abc\n4:cpu:/docker/abc\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), std::nullopt) << "cgroup v1 only";
  Write("/proc/self/cgroup", "0::/../../etc\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), std::nullopt);
  Write("/proc/self/cgroup", "0::relative\n");
  EXPECT_EQ(CgroupMemoryHeadroomBytes(roots_), std::nullopt);
}

TEST_F(FakeMemoryTree, AvailableMemoryIsTheNodesOrTheCgroupsWhicheverIsLess) {
  Write("/proc/meminfo", "MemAvailable: 64000000 kB\n");
  WriteNode(0, 3000000, 0, 0, "0-3");
  WriteNode(1, 1000000, 200000, 50000, "4-7");
  AvailableMemory memory = AvailableMemoryOn({1}, roots_);
  EXPECT_EQ(memory.bytes, 1250000 * kKiB) << "node 1's, not the host's MemAvailable";
  EXPECT_EQ(memory.source, "node 1");
  memory = AvailableMemoryOn({0, 1}, roots_);
  EXPECT_EQ(memory.bytes, 4250000 * kKiB);
  EXPECT_EQ(memory.source, "nodes 0-1");
  memory = AvailableMemoryOn({}, roots_);
  EXPECT_EQ(memory.bytes, 64000000 * kKiB) << "no node known: the host's";
  EXPECT_EQ(memory.source, "MemAvailable");
  Write("/proc/self/cgroup", "0::/job\n");
  Write("/cgroup/job/memory.max", "536870912\n");
  Write("/cgroup/job/memory.current", "0\n");
  memory = AvailableMemoryOn({1}, roots_);
  EXPECT_EQ(memory.bytes, uint64_t{512} << 20) << "the cgroup's limit is smaller";
  EXPECT_EQ(memory.source, "cgroup memory.max");
}

TEST_F(FakeMemoryTree, ThreadsNodesAreThoseOfItsCpusWithoutAPolicy) {
  // This test process has no memory policy: its cpus' nodes. Node 0 holds
  // every cpu there may be; node 1 is memory-only (an empty cpulist).
  WriteNode(0, 1, 0, 0, "0-4095");
  WriteNode(1, 1, 0, 0, "");
  EXPECT_EQ(CallingThreadMemoryNodes(roots_), std::vector<int>({0}));
}

}  // namespace
}  // namespace numaserve::affinity
