// The per-batch-size state of a compiled model stays bounded: at most
// CompileOptions::batch_plans plans, one shared activation arena the size of
// the largest, and a dropped size planned again gives the same answers.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;

// x [n,16] -> MatMul w [16,32] -> Relu -> MatMul v [32,4] -> y [n,4].
std::string TwoLayers() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 16}).Output("y", {-1, 4});
  kernels::Tensor w({16, 32}), v({32, 4});
  for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = static_cast<float>(i % 7) * 0.125f - 0.3f;
  for (size_t i = 0; i < v.data.size(); ++i) v.data[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  b.Initializer("w", w).Initializer("v", v);
  b.Node("MatMul", {"x", "w"}, {"h"});
  b.Node("Relu", {"h"}, {"r"});
  b.Node("MatMul", {"r", "v"}, {"y"});
  return b.Save("batch_plans");
}

std::vector<float> Rows(int64_t n) {
  std::vector<float> x(n * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) * 0.1f - 0.4f;
  return x;
}

std::vector<float> RunAt(CompiledModel& model, int64_t n) {
  const std::vector<float> x = Rows(n);
  std::vector<float> y(n * 4, -7.0f);
  absl::Status s = model.Run(n, {x.data()}, {y.data()});
  EXPECT_TRUE(s.ok()) << "batch " << n << ": " << s;
  return y;
}

TEST(BatchPlansTest, StateStaysBoundedOverManyBatchSizes) {
  CompileOptions options;
  options.batch_plans = 8;
  options.num_threads = 1;
  auto model = CompiledModel::Load(TwoLayers(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  // The first answers at a few sizes, to compare with after they were dropped.
  const std::vector<float> at3 = RunAt(m, 3), at40 = RunAt(m, 40);
  for (int64_t n = 1; n <= 120; ++n) {
    RunAt(m, n);
    EXPECT_LE(m.CachedBatchPlans().plans, 8) << "after batch " << n;
  }
  const int64_t largest = m.CachedBatchPlans().arena_bytes;
  auto bytes120 = m.ActivationBytes(120);
  ASSERT_TRUE(bytes120.ok());
  EXPECT_GE(largest, *bytes120);
  EXPECT_LT(largest, *bytes120 + 64) << "one arena, the largest plan's";
  for (int64_t n = 120; n >= 1; --n) RunAt(m, n);
  EXPECT_EQ(m.CachedBatchPlans().plans, 8);
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, largest) << "smaller batches reuse the arena";
  // Sizes planned again answer as the first time.
  EXPECT_EQ(RunAt(m, 3), at3);
  EXPECT_EQ(RunAt(m, 40), at40);
}

TEST(BatchPlansTest, ProfilingSurvivesDroppedPlans) {
  CompileOptions options;
  options.batch_plans = 2;
  auto model = CompiledModel::Load(TwoLayers(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  m.SetProfiling(true);
  RunAt(m, 5);
  m.SetProfiling(false);
  // The profiled run's plan is dropped by two others.
  RunAt(m, 6);
  RunAt(m, 7);
  EXPECT_EQ(m.CachedBatchPlans().plans, 2);
  const std::vector<StepProfile> profile = m.Profile();
  ASSERT_FALSE(profile.empty());
  EXPECT_EQ(profile[0].calls, 1);
  EXPECT_FALSE(m.PlanAt(5).ok()) << "a dropped plan is not described";
  EXPECT_TRUE(m.PlanAt(7).ok());
}

}  // namespace
}  // namespace numaserve::engine
