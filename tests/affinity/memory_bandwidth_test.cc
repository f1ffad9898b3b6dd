// The memory-bandwidth probe: STREAM's byte accounting (pure), the default
// size's bounds, and a real (small, short) triad on this machine.
#include "affinity/memory_bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace numaserve::affinity
