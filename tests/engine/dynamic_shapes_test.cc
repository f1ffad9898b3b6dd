// Shape-polymorphic models: inputs with dynamic dims besides the batch (a
// sequence length, an image's height and width) import with their dims'
// names, run at input shapes given per run (signatures) against the
// reference executor, keep a bounded cache of plans by signature, and
// refuse signatures that contradict the model, naming the input and dim.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/model_info.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using testing::RandomTensor;
using testing::RunAgainstReference;

constexpr int64_t kHidden = 16;

kernels::Tensor Weights(const Shape& shape, uint32_t seed, float scale = 0.3f) {
  kernels::Tensor t = RandomTensor(shape, seed);
  for (float& v : t.data) v *= scale;
  return t;
}

// A hidden encoder layer: x [batch, seq, 16] plus a position table pos
// [seq, 16] (the same 'seq'), single-head self-attention (MatMul, scale,
// Softmax, MatMul), a residual Add and LayerNormalization, then a Relu
// feed-forward with its own residual and LayerNormalization.
std::string EncoderLayer() {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, kHidden}, {"batch", "seq", ""});
  b.NamedInput("pos", {-1, kHidden}, {"seq", ""});
  b.NamedOutput("y", {-1, -1, kHidden}, {"batch", "seq", ""});
  uint32_t seed = 100;
  for (const char* w : {"wq", "wk", "wv", "wo"})
    b.Initializer(w, Weights({kHidden, kHidden}, seed++));
  b.Initializer("w1", Weights({kHidden, 2 * kHidden}, seed++));
  b.Initializer("w2", Weights({2 * kHidden, kHidden}, seed++));
  for (const char* v : {"bq", "b2"}) b.Initializer(v, Weights({kHidden}, seed++));
  b.Initializer("b1", Weights({2 * kHidden}, seed++));
  kernels::Tensor gamma({kHidden}), beta({kHidden});
  for (int64_t i = 0; i < kHidden; ++i) {
    gamma.data[i] = 1.0f + 0.01f * static_cast<float>(i);
    beta.data[i] = 0.02f * static_cast<float>(i) - 0.1f;
  }
  b.Initializer("gamma", gamma).Initializer("beta", beta);
  kernels::Tensor scale(Shape{});
  scale.data = {0.25f};
  b.Initializer("scale", scale);
  b.Node("Add", {"x", "pos"}, {"h0"}, "add_pos");
  b.Node("MatMul", {"h0", "wq"}, {"q0"}, "q");
  b.Node("Add", {"q0", "bq"}, {"q1"}, "q_bias");
  b.Node("MatMul", {"h0", "wk"}, {"k0"}, "k");
  b.Node("MatMul", {"h0", "wv"}, {"v0"}, "v");
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"k0"}, {"kt"}, "k_t"), "perm", {0, 2, 1});
  b.Node("MatMul", {"q1", "kt"}, {"s0"}, "scores");
  b.Node("Mul", {"s0", "scale"}, {"s1"}, "scaled");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s1"}, {"p"}, "softmax"), "axis", -1);
  b.Node("MatMul", {"p", "v0"}, {"ctx"}, "context");
  b.Node("MatMul", {"ctx", "wo"}, {"o"}, "out_proj");
  b.Node("Add", {"h0", "o"}, {"r1"}, "residual1");
  OnnxModelBuilder::AttrInt(b.Node("LayerNormalization", {"r1", "gamma", "beta"}, {"ln1"}, "ln1"),
                            "axis", -1);
  b.Node("MatMul", {"ln1", "w1"}, {"f0"}, "ff1");
  b.Node("Add", {"f0", "b1"}, {"f1"}, "ff1_bias");
  b.Node("Relu", {"f1"}, {"f2"}, "ff1_relu");
  b.Node("MatMul", {"f2", "w2"}, {"f3"}, "ff2");
  b.Node("Add", {"f3", "b2"}, {"f4"}, "ff2_bias");
  b.Node("Add", {"ln1", "f4"}, {"r2"}, "residual2");
  OnnxModelBuilder::AttrInt(b.Node("LayerNormalization", {"r2", "gamma", "beta"}, {"y"}, "ln2"),
                            "axis", -1);
  return b.Save("dynamic_encoder");
}

// A small CNN over images of any height and width: Conv 3x3 (pad 1) +
// Relu, MaxPool 2x2 stride 2, Conv 3x3 stride 2 with auto_pad SAME_UPPER
// (pads that follow the size) + Relu, a residual-free 1x1 conv, then
// GlobalAveragePool and Flatten to [batch, 8]. The sizes tested give the
// strided conv even and odd inputs (pads 0/1 and 1/1).
std::string SmallCnn() {
  OnnxModelBuilder b(13);
  b.NamedInput("image", {-1, 3, -1, -1}, {"batch", "", "height", "width"});
  b.NamedOutput("y", {-1, 8}, {"batch", ""});
  b.Initializer("w1", Weights({8, 3, 3, 3}, 1)).Initializer("c1", Weights({8}, 2));
  b.Initializer("w2", Weights({8, 8, 3, 3}, 3)).Initializer("c2", Weights({8}, 4));
  b.Initializer("w3", Weights({8, 8, 1, 1}, 5));
  auto& conv1 = b.Node("Conv", {"image", "w1", "c1"}, {"a1"}, "conv1");
  OnnxModelBuilder::AttrInts(conv1, "pads", {1, 1, 1, 1});
  b.Node("Relu", {"a1"}, {"a2"}, "relu1");
  auto& pool = b.Node("MaxPool", {"a2"}, {"a3"}, "pool");
  OnnxModelBuilder::AttrInts(pool, "kernel_shape", {2, 2});
  OnnxModelBuilder::AttrInts(pool, "strides", {2, 2});
  auto& conv2 = b.Node("Conv", {"a3", "w2", "c2"}, {"a4"}, "conv2");
  OnnxModelBuilder::AttrInts(conv2, "strides", {2, 2});
  OnnxModelBuilder::AttrString(conv2, "auto_pad", "SAME_UPPER");
  b.Node("Relu", {"a4"}, {"a5"}, "relu2");
  b.Node("Conv", {"a5", "w3"}, {"a6"}, "conv3");
  b.Node("GlobalAveragePool", {"a6"}, {"a7"}, "gap");
  b.Node("Flatten", {"a7"}, {"y"}, "flatten");
  return b.Save("dynamic_cnn");
}

CompiledModel::InputShapes EncoderShapes(int64_t batch, int64_t seq) {
  return {{batch, seq, kHidden}, {seq, kHidden}};
}

TEST(DynamicShapesTest, ModelInfoKeepsDynamicDimsAndTheirNames) {
  auto info = InspectModel(EncoderLayer());
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->inputs.size(), 2u);
  EXPECT_EQ(info->inputs[0].shape, (std::vector<int64_t>{-1, -1, kHidden}));
  EXPECT_EQ(info->inputs[0].dim_names, (std::vector<std::string>{"batch", "seq", ""}));
  EXPECT_EQ(info->inputs[1].shape, (std::vector<int64_t>{-1, kHidden}));
  EXPECT_EQ(info->inputs[1].dim_names, (std::vector<std::string>{"seq", ""}));
  ASSERT_EQ(info->outputs.size(), 1u);
  EXPECT_EQ(info->outputs[0].shape, (std::vector<int64_t>{-1, -1, kHidden}));
  EXPECT_EQ(info->outputs[0].dim_names, (std::vector<std::string>{"batch", "seq", ""}));
  // pos [seq, hidden] has no rows to stack.
  EXPECT_FALSE(info->batched);
  EXPECT_THAT(info->unbatched_reason,
              HasSubstr("input 'pos' has no batch dim (its dim 0 is 'seq'"));

  auto cnn = InspectModel(SmallCnn());
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->inputs[0].shape, (std::vector<int64_t>{-1, 3, -1, -1}));
  EXPECT_EQ(cnn->inputs[0].dim_names, (std::vector<std::string>{"batch", "", "height", "width"}));
  EXPECT_EQ(cnn->outputs[0].shape, (std::vector<int64_t>{-1, 8}));
  // Its rows stay apart at both probes' image sizes: requests of one size
  // may be stacked.
  EXPECT_TRUE(cnn->batched) << cnn->unbatched_reason;
}

TEST(DynamicShapesTest, EncoderMatchesReferenceAtThreeSequenceLengths) {
  const std::string path = EncoderLayer();
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  // The attention chain fits the fused kernel at every sequence length.
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("attention: scores+"));
  uint32_t seed = 1;
  for (const auto& [batch, seq] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {2, 17}, {3, 64}}) {
    EXPECT_LE(RunAgainstReference(**model, *graph, EncoderShapes(batch, seq), seed += 10), 1e-4)
        << "batch " << batch << ", seq " << seq << "\n"
        << (*model)->DescribePlan();
  }
  // Each signature ran on its own plan; the first again reuses its own.
  EXPECT_EQ((*model)->CachedBatchPlans().plans, 3);
  EXPECT_LE(RunAgainstReference(**model, *graph, EncoderShapes(1, 5), 99), 1e-4);
  EXPECT_EQ((*model)->CachedBatchPlans().plans, 3);
}

TEST(DynamicShapesTest, CnnMatchesReferenceAtThreeImageSizes) {
  const std::string path = SmallCnn();
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  // The strided SAME_UPPER conv pads by the size: the reference runs it;
  // the others are compiled.
  const std::string plan = (*model)->DescribePlan();
  EXPECT_THAT(plan, HasSubstr("reference: conv2"));
  EXPECT_THAT(plan, HasSubstr("conv: conv1"));
  uint32_t seed = 7;
  const std::vector<CompiledModel::InputShapes> signatures = {
      {{1, 3, 16, 16}}, {{2, 3, 22, 12}}, {{3, 3, 33, 10}}};
  for (const CompiledModel::InputShapes& s : signatures) {
    EXPECT_LE(RunAgainstReference(**model, *graph, s, seed += 10), 1e-4)
        << (*model)->DescribePlan();
  }
}

TEST(DynamicShapesTest, PlanCacheEvictsTheLeastRecentSignature) {
  CompileOptions options;
  options.batch_plans = 2;
  options.num_threads = 1;
  const std::string path = EncoderLayer();
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  const auto a = EncoderShapes(1, 4), b = EncoderShapes(1, 8), c = EncoderShapes(2, 4);
  EXPECT_LE(RunAgainstReference(m, *graph, a, 1), 1e-4);
  EXPECT_LE(RunAgainstReference(m, *graph, b, 2), 1e-4);
  EXPECT_EQ(m.CachedBatchPlans().plans, 2);
  EXPECT_LE(RunAgainstReference(m, *graph, a, 3), 1e-4);  // a is now the most recent
  EXPECT_LE(RunAgainstReference(m, *graph, c, 4), 1e-4);  // over the bound: b goes
  EXPECT_EQ(m.CachedBatchPlans().plans, 2);
  EXPECT_TRUE(m.PlanAt(a).ok());
  EXPECT_TRUE(m.PlanAt(c).ok());
  EXPECT_EQ(m.PlanAt(b).status().code(), absl::StatusCode::kFailedPrecondition);
  // b planned again answers as before.
  EXPECT_LE(RunAgainstReference(m, *graph, b, 2), 1e-4);
  EXPECT_EQ(m.CachedBatchPlans().plans, 2);
  EXPECT_EQ(m.PlanAt(a).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DynamicShapesTest, BadSignaturesAreRefusedNamingTheInputAndDim) {
  CompileOptions options;
  options.max_activation_bytes = int64_t{2} << 20;
  auto model = CompiledModel::Load(EncoderLayer(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  auto refused = [&](const CompiledModel::InputShapes& shapes) {
    auto bytes = m.ActivationBytes(shapes);
    EXPECT_FALSE(bytes.ok());
    // Run and OutputShapes refuse it the same way.
    std::vector<float> x(16), pos(16), y(16);
    EXPECT_EQ(m.Run(shapes, {x.data(), pos.data()}, {y.data()}).code(), bytes.status().code());
    return bytes.status();
  };
  absl::Status s = refused({{2, 5, kHidden}, {6, kHidden}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("input 'pos' dim 0 ('seq') is 6 but input 'x' dim 1 ('seq') is 5"));
  s = refused({{2, 5, kHidden - 1}, {5, kHidden}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'x' dim 2 is fixed at 16, got 15"));
  s = refused({{2, 5}, {5, kHidden}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'x' has rank 3"));
  s = refused({{2, 0, kHidden}, {0, kHidden}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'x' dim 1 ('seq') is dynamic"));
  s = refused({{2, int64_t{1} << 28, kHidden}, {int64_t{1} << 28, kHidden}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'x' [2,268435456,16] (dim 1 ('seq')"));
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, 0) << "nothing allocated for a refused signature";
  // Within the per-tensor limits but over max_activation_bytes (the
  // feed-forward's [16384,32] alone is 2 MiB).
  s = refused({{1, 16384, kHidden}, {16384, kHidden}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("input shapes 'x' [1,16384,16], 'pos' [16384,16] needs"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_activation_bytes"));
  EXPECT_EQ(m.CachedBatchPlans().arena_bytes, 0);
  EXPECT_EQ(m.CachedBatchPlans().plans, 0);
  // A batch size alone does not say the sequence length.
  std::vector<float> x(2 * 5 * kHidden), pos(5 * kHidden), y(2 * 5 * kHidden);
  s = m.Run(2, {x.data(), pos.data()}, {y.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("input 'x' has dynamic dim 1 ('seq')"));
  EXPECT_TRUE(m.OutputShapes(2).empty());
  EXPECT_FALSE(m.ActivationBytes(2).ok());
}

// A model whose only dynamic dims are dims 0: a signature is its batch,
// and both calls share one plan.
TEST(DynamicShapesTest, BatchOnlyModelSharesItsPlanBetweenBatchAndSignature) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 8}).Output("y", {-1, 4});
  b.Initializer("w", Weights({8, 4}, 3));
  b.Node("MatMul", {"x", "w"}, {"y"});
  const std::string path = b.Save("dynamic_batch_only");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> x(3 * 8, 0.5f), y(3 * 4);
  ASSERT_TRUE((*model)->Run(3, {x.data()}, {y.data()}).ok());
  EXPECT_EQ((*model)->CachedBatchPlans().plans, 1);
  EXPECT_LE(RunAgainstReference(**model, *graph, {{3, 8}}, 5), 1e-4);
  EXPECT_EQ((*model)->CachedBatchPlans().plans, 1);
  auto wrong = (*model)->OutputShapes(CompiledModel::InputShapes{{3, 9}});
  EXPECT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("input 'x' dim 1 is fixed at 8"));
}

}  // namespace
}  // namespace numaserve::engine
