// A conv or matmul that adds a residual which no later step reads writes
// into the residual's bytes (no copy), and gives the same values as the
// copying plan and the reference executor; a residual still read later
// keeps its copy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/model.h"
#include "tests/engine/bottleneck_block.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using testing::RandomTensor;

// stem conv -> two bottleneck blocks (1x1 -> 3x3 -> 1x1 + residual) ->
// global average pool. With `reuse_h0`, a 1x1 conv of the stem's output
// after the second block adds that block's output, so the first block's
// residual outlives its conv.
std::string BottleneckModel(bool reuse_h0) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 16, 10, 10}).Output("y", {-1, 32, 1, 1});
  b.Initializer("w0", RandomTensor({32, 16, 3, 3}, 1));
  OnnxModelBuilder::AttrInts(b.Node("Conv", {"x", "w0"}, {"c0"}, "stem"), "pads", {1, 1, 1, 1});
  b.Node("Relu", {"c0"}, {"h0"}, "stem_relu");
  std::string in = "h0";
  for (int k = 1; k <= 2; ++k) in = testing::AddBottleneckBlock(b, k, in, 32);
  if (reuse_h0) {
    b.Initializer("wl", RandomTensor({32, 32, 1, 1}, 99));
    b.Node("Conv", {"h0", "wl"}, {"lc"}, "late_conv");
    b.Node("Add", {"lc", in}, {"late"}, "late_add");
    in = "late";
  }
  b.Node("GlobalAveragePool", {in}, {"y"}, "gap");
  return b.Save(reuse_h0 ? "in_place_reuse" : "in_place");
}

int ResidualReorderRows(CompiledModel& model, int64_t batch) {
  model.SetProfiling(true);
  const auto shapes = model.OutputShapes(batch);
  std::vector<float> x(batch * 16 * 10 * 10, 0.5f), y(kernels::NumElements(shapes[0]));
  EXPECT_TRUE(model.Run(batch, {x.data()}, {y.data()}).ok());
  model.SetProfiling(false);
  int rows = 0;
  for (const StepProfile& row : model.Profile()) {
    if (row.kind == "reorder") ++rows;
  }
  return rows;
}

TEST(InPlaceResidualTest, MatchesTheCopyingPlanAndTheReference) {
  const std::string path = BottleneckModel(false);
  testing::ExpectCompiledMatchesReference("bottleneck", path, {1, 3}, 1e-9);
  CompileOptions copying;
  copying.in_place_residuals = false;
  testing::ExpectCompiledMatchesReference("bottleneck copying", path, {1, 3}, 1e-9, copying);

  auto in_place = CompiledModel::Load(path, {});
  auto copy = CompiledModel::Load(path, copying);
  ASSERT_TRUE(in_place.ok() && copy.ok());
  for (int64_t batch : {1, 4}) {
    std::vector<float> x(batch * 16 * 10 * 10);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 50 - 1;
    std::vector<float> a(batch * 32, -1), c(batch * 32, -2);
    ASSERT_TRUE((*in_place)->Run(batch, {x.data()}, {a.data()}).ok());
    ASSERT_TRUE((*copy)->Run(batch, {x.data()}, {c.data()}).ok());
    // Same kernels, same order of additions: equal, not merely close.
    EXPECT_EQ(a, c) << "batch " << batch;
    // Both blocks' residuals die at their conv_c: nothing to copy; the
    // copying plan copies twice.
    EXPECT_EQ(ResidualReorderRows(**in_place, batch), 0);
    EXPECT_EQ(ResidualReorderRows(**copy, batch), 2);
    auto bytes_in_place = (*in_place)->ActivationBytes(batch);
    auto bytes_copy = (*copy)->ActivationBytes(batch);
    ASSERT_TRUE(bytes_in_place.ok() && bytes_copy.ok());
    EXPECT_LE(*bytes_in_place, *bytes_copy);
  }
}

TEST(InPlaceResidualTest, AResidualReadLaterIsCopied) {
  const std::string path = BottleneckModel(true);
  testing::ExpectCompiledMatchesReference("bottleneck reuse", path, {1, 2}, 1e-9);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  // h0 is still read by late_conv after block 1, so block 1 copies it;
  // block 2's residual and late_conv's (block 2's output) die where added.
  EXPECT_EQ(ResidualReorderRows(**model, 2), 1);
}

// h0 = x w0; h1 = (h0 w1) w2 + b2 + h0 (the residual, dead after it); y =
// LayerNorm(h1): the third matmul writes into h0's bytes.
TEST(InPlaceResidualTest, MatMulWritesIntoItsResidual) {
  OnnxModelBuilder b(17);
  b.Input("x", {-1, 6, 16}).Output("y", {-1, 6, 16});
  b.Initializer("w0", RandomTensor({16, 16}, 1))
      .Initializer("w1", RandomTensor({16, 16}, 2))
      .Initializer("w2", RandomTensor({16, 16}, 6))
      .Initializer("b2", RandomTensor({16}, 3))
      .Initializer("gamma", RandomTensor({16}, 4))
      .Initializer("beta", RandomTensor({16}, 5));
  b.Node("MatMul", {"x", "w0"}, {"h0"}, "proj0");
  b.Node("MatMul", {"h0", "w1"}, {"m"}, "proj1");
  b.Node("MatMul", {"m", "w2"}, {"m2"}, "proj2");
  b.Node("Add", {"m2", "b2"}, {"mb"}, "bias2");
  b.Node("Add", {"mb", "h0"}, {"h1"}, "residual");
  b.Node("LayerNormalization", {"h1", "gamma", "beta"}, {"y"}, "ln");
  const std::string path = b.Save("matmul_residual");
  CompileOptions copying;
  copying.in_place_residuals = false;
  testing::ExpectCompiledMatchesReference("matmul residual", path, {1, 3}, 1e-10);
  testing::ExpectCompiledMatchesReference("matmul residual copying", path, {1, 3}, 1e-10, copying);
  auto in_place = CompiledModel::Load(path, {});
  auto copy = CompiledModel::Load(path, copying);
  ASSERT_TRUE(in_place.ok() && copy.ok());
  EXPECT_THAT((*in_place)->DescribePlan(), ::testing::HasSubstr("matmul: proj2+bias2+residual"));
  for (int64_t batch : {1, 5}) {
    std::vector<float> x(batch * 6 * 16);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 50 - 1;
    std::vector<float> a(x.size(), -1), c(x.size(), -2);
    ASSERT_TRUE((*in_place)->Run(batch, {x.data()}, {a.data()}).ok());
    ASSERT_TRUE((*copy)->Run(batch, {x.data()}, {c.data()}).ok());
    EXPECT_EQ(a, c) << "batch " << batch;
    // h1 shares h0's bytes: two buffers where the copying plan needs three.
    auto bytes_in_place = (*in_place)->ActivationBytes(batch);
    auto bytes_copy = (*copy)->ActivationBytes(batch);
    ASSERT_TRUE(bytes_in_place.ok() && bytes_copy.ok());
    EXPECT_LT(*bytes_in_place, *bytes_copy) << "batch " << batch;
  }
}

}  // namespace
}  // namespace numaserve::engine
