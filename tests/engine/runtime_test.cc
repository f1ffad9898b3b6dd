// The runtime on its own (engine/runtime/): an ExecutionPlan built here by
// hand, with steps of the test's own, run by an Executor; no compiler. The
// graph's nodes are there for shape propagation only: the plan's steps are
// what runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/batch_plan.h"
#include "engine/runtime/executor.h"
#include "engine/runtime/plan.h"
#include "kernels/tensor.h"

namespace numaserve::engine::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kWidth = 8;

// dst = src * scale + shift, element by element, at whatever rows the
// shapes it is given hold; it records the rows of every call.
class AffineStep : public Step {
 public:
  AffineStep(ValueId src, ValueId dst, float scale, float shift, std::vector<int64_t>* rows)
      : Step(Traits(src, dst)), src_(src), dst_(dst), scale_(scale), shift_(shift), rows_(rows) {}

  absl::Status Run(const StepContext& ctx) override {
    if (fail_) return absl::InternalError("told to fail");
    rows_->push_back(ctx.shapes[dst_][0]);
    const int64_t n = kernels::NumElements(ctx.shapes[dst_]);
    for (int64_t i = 0; i < n; ++i) ctx.data[dst_][i] = ctx.data[src_][i] * scale_ + shift_;
    return absl::OkStatus();
  }
  std::string Describe() const override { return absl::StrCat("affine: v", dst_); }
  double Flops(const std::vector<Shape>& shapes) const override {
    return 2.0 * static_cast<double>(kernels::NumElements(shapes[dst_]));
  }
  void set_fail(bool fail) { fail_ = fail; }

 private:
  static StepTraits Traits(ValueId src, ValueId dst) {
    StepTraits t = StepTraits::ReadsWrites({src}, {dst});
    t.row_wise = {src, dst};
    return t;
  }
  ValueId src_, dst_;
  float scale_, shift_;
  std::vector<int64_t>* rows_;
  bool fail_ = false;
};

// x -> a -> b -> c -> y, four steps: a = x + 1, b = 2a, c = b - 3, y = c / 2
// (x, y: the graph's input and output; a, b, c in the arena).
class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* names[] = {"x", "a", "b", "c", "y"};
    for (const char* name : names) {
      const ValueId v = graph_.GetOrAddValue(name);
      graph_.value(v).type = DataType::kFloat32;
    }
    graph_.value(0).shape = {-1, kWidth};
    graph_.value(0).has_shape = true;
    graph_.inputs() = {0};
    graph_.outputs() = {4};
    for (ValueId v = 0; v < 4; ++v) {
      Node node;
      node.name = absl::StrCat("n", v);
      node.op_type = "Relu";  // for the shapes alone
      node.inputs = {v};
      node.outputs = {v + 1};
      graph_.nodes().push_back(node);
    }
    plan_.graph = &graph_;
    plan_.name = "chain.onnx";
    const float scale[] = {1, 2, 1, 0.5f}, shift[] = {1, 0, -3, 0};
    for (ValueId v = 0; v < 4; ++v) {
      auto step = std::make_unique<AffineStep>(v, v + 1, scale[v], shift[v], &rows_[v]);
      steps_.push_back(step.get());
      plan_.steps.push_back(std::move(step));
    }
    plan_.root = {0, 1, 2, 3, 4};
    plan_.storage = {Storage::kInput, Storage::kArena, Storage::kArena, Storage::kArena,
                     Storage::kOutput};
    plan_.output_slot = {-1, -1, -1, -1, 0};
    plan_.blocked.assign(5, false);
    plan_.first_step = {-1, 0, 1, 2, -1};
    plan_.last_step = {-1, 1, 2, 3, -1};
    plan_.internal.assign(5, false);
    plan_.in_place_of.assign(5, kNoValue);
    plan_.shapes1 = {{1, kWidth}, {1, kWidth}, {1, kWidth}, {1, kWidth}, {1, kWidth}};
    plan_.threads = 1;
    plan_.batch_plans = 2;
  }

  // Runs `batch` rows of x = 0, 1, 2, ... and returns y.
  std::vector<float> RunChain(Executor& executor, int64_t batch) {
    std::vector<float> x(batch * kWidth), y(batch * kWidth, -1);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    status_ = executor.Run(batch, {x.data()}, {y.data()});
    return y;
  }

  static float Expected(int64_t i) { return ((static_cast<float>(i) + 1) * 2 - 3) * 0.5f; }

  Graph graph_;
  ExecutionPlan plan_;
  std::vector<AffineStep*> steps_;
  std::vector<int64_t> rows_[4];
  absl::Status status_;
};

TEST_F(RuntimeTest, RunsThePlansStepsInOrder) {
  Executor executor(&plan_, dnnl::engine(dnnl::engine::kind::cpu, 0));
  const std::vector<float> y = RunChain(executor, 3);
  ASSERT_TRUE(status_.ok()) << status_;
  for (int64_t i = 0; i < 3 * kWidth; ++i) EXPECT_EQ(y[i], Expected(i)) << i;
  EXPECT_THAT(executor.OutputShapes(3), ElementsAre(ElementsAre(3, kWidth)));
  EXPECT_THAT(rows_[0], ElementsAre(3));
}

TEST_F(RuntimeTest, ArenaReusesTheBytesOfADeadValue) {
  // a (steps 0-1) and c (steps 2-3) never live at once: two blocks, not three.
  Executor executor(&plan_, dnnl::engine(dnnl::engine::kind::cpu, 0));
  auto bytes = executor.ActivationBytes(4);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 2 * 4 * kWidth * static_cast<int64_t>(sizeof(float)));
  BatchState state;
  state.batch = 4;
  state.shapes.assign(5, Shape{4, kWidth});
  PlanBatchSplit(plan_, state);
  PlanArena(plan_, state);
  EXPECT_EQ(state.arena_offset[1], state.arena_offset[3]);
  EXPECT_NE(state.arena_offset[1], state.arena_offset[2]);
  // Run through the reused bytes: still the right answer.
  const std::vector<float> y = RunChain(executor, 4);
  ASSERT_TRUE(status_.ok()) << status_;
  for (int64_t i = 0; i < 4 * kWidth; ++i) EXPECT_EQ(y[i], Expected(i)) << i;
}

TEST_F(RuntimeTest, SplitsABatchIntoSlicesThatFitTheCache) {
  // Rows of 32 bytes against a 128-byte cache: slices of 2 rows.
  plan_.batch_split_cache_bytes = 128;
  Executor executor(&plan_, dnnl::engine(dnnl::engine::kind::cpu, 0));
  const std::vector<float> y = RunChain(executor, 8);
  ASSERT_TRUE(status_.ok()) << status_;
  for (int64_t i = 0; i < 8 * kWidth; ++i) EXPECT_EQ(y[i], Expected(i)) << i;
  for (const auto& rows : rows_) EXPECT_THAT(rows, ElementsAre(2, 2, 2, 2));
  auto plan = executor.PlanAt(8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  EXPECT_EQ((*plan)[0].slice_rows, 2);
  EXPECT_EQ((*plan)[0].kind, "affine");
}

TEST_F(RuntimeTest, KeepsAtMostBatchPlansStates) {
  Executor executor(&plan_, dnnl::engine(dnnl::engine::kind::cpu, 0));
  for (int64_t batch : {1, 2, 3}) {
    RunChain(executor, batch);
    ASSERT_TRUE(status_.ok()) << status_;
  }
  EXPECT_EQ(executor.cached_plans(), 2);
  EXPECT_EQ(executor.PlanAt(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(executor.PlanAt(3).ok());
}

TEST_F(RuntimeTest, ProfilesEveryStepOfEveryRun) {
  Executor executor(&plan_, dnnl::engine(dnnl::engine::kind::cpu, 0));
  executor.SetProfiling(true);
  executor.SetStepEventLimit(100);
  for (int run = 0; run < 2; ++run) {
    RunChain(executor, 2);
    ASSERT_TRUE(status_.ok()) << status_;
  }
  const std::vector<StepProfile> rows = executor.Profile();
  ASSERT_EQ(rows.size(), 4u);
  for (const StepProfile& row : rows) {
    EXPECT_EQ(row.calls, 2);
    EXPECT_EQ(row.flops, 2 * 2.0 * 2 * kWidth);  // two runs of 2 x 8 elements
    EXPECT_EQ(row.threads, 1);
  }
  EXPECT_EQ(executor.StepEvents().size(), 8u);
}

TEST_F(RuntimeTest, ErrorsNameTheStepOrTheTensor) {
  Executor executor(&plan_, dnnl::engine(dnnl::engine::kind::cpu, 0));
  steps_[2]->set_fail(true);
  RunChain(executor, 1);
  EXPECT_EQ(status_.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status_.message(), HasSubstr("affine: v3: told to fail"));

  const size_t row = kWidth * sizeof(float);
  EXPECT_TRUE(executor.CheckBufferSizes(2, {2 * row}, {2 * row}).ok());
  const absl::Status wrong = executor.CheckBufferSizes(2, {row}, {2 * row});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("input 'x' at 2 rows"));
  const absl::Status zero = executor.Run(0, {nullptr}, {nullptr});
  EXPECT_THAT(zero.message(), HasSubstr("chain.onnx: batch 0 must be >= 1"));
}

}  // namespace
}  // namespace numaserve::engine::runtime
