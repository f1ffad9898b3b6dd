// The per-batch-size state of a compiled model stays bounded: at most
// CompileOptions::batch_plans plans, none idle for more than
// batch_plan_idle_runs runs, one shared activation arena the size of the
// largest (mapped again smaller once idle plans are dropped), no plan
// needing more than max_activation_bytes, and a dropped size planned again
// gives the same answers.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  // Plans dropped for new sizes leave the arena as it is (sizes coming and
  // going would map it again at every new plan); idle ones shrink it
  // (AnIdlePlanIsDroppedAndItsArenaReturned).
  for (int64_t n = 120; n >= 1; --n) RunAt(m, n);
  EXPECT_EQ(m.CachedBatchPlans().plans, 8);
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, largest) << "smaller batches reuse the arena";
  // Sizes planned again answer as the first time.
  EXPECT_EQ(RunAt(m, 3), at3);
  EXPECT_EQ(RunAt(m, 40), at40);
}

// One request of many rows to a model served one request per run, then
// small ones only: its plan is dropped once idle, and its arena returned.
// Before, the arena kept the size of the largest plan ever run.
TEST(BatchPlansTest, AnIdlePlanIsDroppedAndItsArenaReturned) {
  CompileOptions options;
  options.batch_plan_idle_runs = 10;
  options.num_threads = 1;
  auto model = CompiledModel::Load(TwoLayers(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  const std::vector<float> at1 = RunAt(m, 1);
  const int64_t small = m.CachedBatchPlans().arena_bytes;
  RunAt(m, 4000);
  const int64_t big = m.CachedBatchPlans().arena_bytes;
  EXPECT_GT(big, 100 * small);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(RunAt(m, 1), at1);
  EXPECT_EQ(m.CachedBatchPlans().plans, 2) << "batch 4000 ran 10 runs ago";
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, big);
  EXPECT_EQ(RunAt(m, 1), at1);
  EXPECT_EQ(m.CachedBatchPlans().plans, 1) << "batch 4000's plan is kept after 11 idle runs";
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, small) << "its arena was not returned";
  // Planned again when it comes back.
  RunAt(m, 4000);
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, big);
}

// A batch whose plan needs more activation bytes than max_activation_bytes
// is refused, naming both figures, before its arena or steps exist; the
// model keeps running the batches that fit.
TEST(BatchPlansTest, ABatchNeedingMoreThanTheLimitIsRefusedBeforeItAllocates) {
  CompileOptions options;
  options.num_threads = 1;
  auto probe = CompiledModel::Load(TwoLayers(), options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto need4 = (*probe)->ActivationBytes(4);
  auto need5 = (*probe)->ActivationBytes(5);
  ASSERT_TRUE(need4.ok() && need5.ok());
  ASSERT_LT(*need4, *need5);
  options.max_activation_bytes = *need4;
  auto model = CompiledModel::Load(TwoLayers(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  const std::vector<float> at4 = RunAt(m, 4);
  const CompiledModel::BatchPlanCache before = m.CachedBatchPlans();
  const std::vector<float> x = Rows(5);
  std::vector<float> y(5 * 4, -7.0f);
  absl::Status s = m.Run(5, {x.data()}, {y.data()});
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(absl::StrCat("a batch of 5 rows needs ", *need5, " activation bytes")),
            absl::string_view::npos)
      << s;
  EXPECT_NE(s.message().find(absl::StrCat("above the limit of ", *need4)), absl::string_view::npos)
      << s;
  EXPECT_NE(s.message().find("max_activation_bytes"), absl::string_view::npos) << s;
  EXPECT_EQ(y, std::vector<float>(5 * 4, -7.0f)) << "nothing was written";
  EXPECT_EQ(m.CachedBatchPlans().plans, before.plans);
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, before.arena_bytes);
  EXPECT_EQ(m.ActivationBytes(5).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RunAt(m, 4), at4);
  // A limit below zero is refused at load.
  options.max_activation_bytes = -1;
  EXPECT_EQ(CompiledModel::Load(TwoLayers(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
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
