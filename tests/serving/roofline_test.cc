// A step profile held against the machine's limits (MakeRoofline), and the
// Chrome trace `numaserve profile --trace` writes.
#include "tools/numaserve/roofline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tools/numaserve/profile_command.h"

namespace numaserve::cli {
namespace {

using ::testing::HasSubstr;

engine::StepProfile Row(int index, const char* kind, double seconds, double flops, double bytes,
                        int threads = 1, const char* precision = "fp32") {
  engine::StepProfile row;
  row.index = index;
  row.kind = kind;
  row.description = std::string(kind) + ": node" + std::to_string(index);
  row.calls = 2;
  row.seconds = seconds;
  row.flops = flops;
  row.bytes = bytes;
  row.threads = threads;
  row.precision = precision;
  return row;
}

// 100 GFLOP/s per core, 10 GB/s: the ridge at 10 FLOP per byte on one core.
const MachineLimits kLimits{{100, 200, 400}, 10};

TEST(RooflineTest, ComputeAndMemoryBoundSteps) {
  // Two runs. #0: 2 GFLOP over 0.02 GB per run (100 FLOP/B), 40 ms: compute
  // bound on 2 threads (200 GFLOP/s), reached 50 of 200. #1: 0.1 GFLOP
  // over 0.1 GB per run (1 FLOP/B), 40 ms: memory bound at 10 GFLOP/s,
  // reached 2.5. #2: no FLOPs, 0.2 GB per run in 40 ms: 5 of 10 GB/s.
  const Roofline r = MakeRoofline({Row(0, "conv", 0.08, 4e9, 4e7, 2),
                                   Row(1, "matmul", 0.08, 2e8, 2e8), Row(2, "pool", 0.08, 0, 4e8)},
                                  2, kLimits);
  ASSERT_EQ(r.rows.size(), 3u);
  const RooflineRow& conv = r.rows[0];
  EXPECT_DOUBLE_EQ(conv.ms, 40);
  EXPECT_DOUBLE_EQ(conv.flops, 2e9);
  EXPECT_DOUBLE_EQ(conv.bytes, 2e7);
  EXPECT_DOUBLE_EQ(conv.intensity, 100);
  EXPECT_DOUBLE_EQ(conv.gflops, 50);
  EXPECT_DOUBLE_EQ(conv.gb_per_second, 0.5);
  EXPECT_DOUBLE_EQ(conv.peak_gflops, 200);
  EXPECT_DOUBLE_EQ(conv.bound_gflops, 200);
  EXPECT_FALSE(conv.memory_bound);
  EXPECT_DOUBLE_EQ(conv.fraction, 0.25);

  const RooflineRow& matmul = r.rows[1];
  EXPECT_TRUE(matmul.memory_bound);
  EXPECT_DOUBLE_EQ(matmul.bound_gflops, 10);
  EXPECT_DOUBLE_EQ(matmul.gflops, 2.5);
  EXPECT_DOUBLE_EQ(matmul.fraction, 0.25);

  const RooflineRow& pool = r.rows[2];
  EXPECT_TRUE(pool.memory_bound);
  EXPECT_DOUBLE_EQ(pool.gb_per_second, 5);
  EXPECT_DOUBLE_EQ(pool.fraction, 0.5);

  EXPECT_DOUBLE_EQ(r.totals.ms, 120);
  EXPECT_DOUBLE_EQ(r.totals.flops, 2.1e9);
  EXPECT_DOUBLE_EQ(r.totals.bytes, 3.2e8);
  // Least times: 10 ms + 10 ms + 20 ms of 120.
  EXPECT_NEAR(r.totals.bound_ms, 40, 1e-9);
  EXPECT_NEAR(r.totals.fraction, 40.0 / 120, 1e-12);
  EXPECT_DOUBLE_EQ(r.totals.compute_bound_ms, 40);
}

TEST(RooflineTest, SortsByTimeAndUsesThePrecisionsPeak) {
  const Roofline r = MakeRoofline(
      {Row(0, "matmul", 0.01, 1e9, 1e6, 1, "bf16"), Row(1, "conv", 0.03, 1e9, 1e6, 1, "int8"),
       Row(2, "conv", 0.02, 1e9, 1e6, 1, "fp32")},
      1, kLimits);
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.rows[0].step.index, 1);
  EXPECT_DOUBLE_EQ(r.rows[0].peak_gflops, 400);
  EXPECT_EQ(r.rows[1].step.index, 2);
  EXPECT_DOUBLE_EQ(r.rows[1].peak_gflops, 100);
  EXPECT_EQ(r.rows[2].step.index, 0);
  EXPECT_DOUBLE_EQ(r.rows[2].peak_gflops, 200);
  // Without native BF16 / INT8, those steps count against FP32's peak.
  EXPECT_DOUBLE_EQ(PeakGflopsPerCore({100, 0, 0}, "bf16"), 100);
  EXPECT_DOUBLE_EQ(PeakGflopsPerCore({100, 0, 0}, "int8"), 100);
}

TEST(RooflineTest, ChromeTraceHasOneCompleteEventPerCall) {
  std::vector<engine::StepProfile> steps = {Row(0, "conv", 1, 1, 1), Row(1, "pool", 1, 0, 1)};
  steps[0].implementation = "brg:\"avx512\"";  // escaped
  const std::vector<engine::StepEvent> events = {
      {0, 0, 0.0, 1e-3}, {1, 0, 1e-3, 5e-4}, {0, 1, 2e-3, 1e-3}, {1, 1, 3e-3, 5e-4}};
  const std::string json = ChromeTraceJson(events, steps, "m.onnx", 4);
  EXPECT_THAT(json, HasSubstr("\"traceEvents\": ["));
  size_t x = 0;
  for (size_t at = json.find("\"ph\": \"X\""); at != std::string::npos;
       at = json.find("\"ph\": \"X\"", at + 1)) {
    ++x;
  }
  EXPECT_EQ(x, 4u);
  EXPECT_THAT(json, HasSubstr("\"name\": \"pool: node1\""));
  EXPECT_THAT(json, HasSubstr("\"ts\": 2000.000, \"dur\": 1000.000"));
  EXPECT_THAT(json, HasSubstr("\"implementation\": \"brg:\\\"avx512\\\"\""));
  EXPECT_THAT(json, HasSubstr("\"run\": 1"));
}

TEST(AdviseBatchingTest, StopsAtTheComputeBoundBatchWithinTheTarget) {
  // Rows per second: 1000, 1800, 3000, 3200 (+7%: saturated at 4), 3300.
  const std::vector<BatchPoint> points = {{1, 1.0, 1.2, 0.0},
                                          {2, 2.0 / 1.8, 1.4, 0.1},
                                          {4, 4.0 / 3.0, 1.6, 0.3},
                                          {8, 2.5, 3.0, 0.4},
                                          {16, 16.0 / 3.3, 6.0, 0.45}};
  const BatchAdvice a = AdviseBatching(points, 20);
  EXPECT_EQ(a.compute_bound_batch, 4);
  EXPECT_TRUE(a.target_met);
  EXPECT_EQ(a.max_batch_size, 4);
  // 20 - 2 x 1.6 ms leaves 16.8 ms; at most one mean run (1.333 ms) of it.
  EXPECT_EQ(a.max_queue_delay_microseconds, 1333);
  ASSERT_GE(a.reasons.size(), 3u);
  EXPECT_THAT(a.reasons[0], HasSubstr("saturated at batch 4"));
}

TEST(AdviseBatchingTest, ComputeBoundShareAndTightTargets) {
  const std::vector<BatchPoint> points = {
      {1, 1.0, 1.0, 0.2}, {2, 1.2, 1.3, 0.6}, {4, 2.0, 2.2, 0.9}, {8, 3.6, 4.0, 0.95}};
  // Batch 2 has most of its time compute-bound.
  BatchAdvice a = AdviseBatching(points, 100);
  EXPECT_EQ(a.compute_bound_batch, 2);
  EXPECT_EQ(a.max_batch_size, 2);
  EXPECT_EQ(a.max_queue_delay_microseconds, 1200);
  // A target only batch 1 fits: 2 x 1.0 <= 2.5 < 2 x 1.3; what is left, 0.5 ms.
  a = AdviseBatching(points, 2.5);
  EXPECT_EQ(a.max_batch_size, 1);
  EXPECT_EQ(a.max_queue_delay_microseconds, 500);
  // Not even batch 1.
  a = AdviseBatching(points, 1.5);
  EXPECT_FALSE(a.target_met);
  EXPECT_EQ(a.max_batch_size, 1);
  EXPECT_EQ(a.max_queue_delay_microseconds, 0);
  EXPECT_THAT(a.reasons.back(), HasSubstr("cannot be met"));
}

}  // namespace
}  // namespace numaserve::cli
