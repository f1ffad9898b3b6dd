#include "engine/reference/reference_executor.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/import/onnx_import.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using kernels::Tensor;
using testing::OnnxModelBuilder;

TEST(ReferenceExecutorTest, HandComputedMlp) {
  // y = softmax(relu(x W + b)) with W = [[1,-1],[1,1]], b = [0, -3].
  OnnxModelBuilder builder;
  builder.Input("x", {-1, 2}).Output("y", {-1, 2});
  builder.Initializer("w", Tensor({2, 2}, {1, -1, 1, 1})).Initializer("b", Tensor({2}, {0, -3}));
  builder.Node("Gemm", {"x", "w", "b"}, {"h"});
  builder.Node("Relu", {"h"}, {"r"});
  builder.Node("Softmax", {"r"}, {"y"});
  auto graph = ImportOnnxModel(builder.Save("ref_mlp"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  // Row 0: x=[1,2] -> h=[3,-2] -> r=[3,0]. Row 1: x=[0,0] -> h=[0,-3] -> r=[0,0].
  auto out = RunReference(*graph, {Tensor({2, 2}, {1, 2, 0, 0})});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  const Tensor& y = (*out)[0];
  EXPECT_EQ(y.shape, (Shape{2, 2}));
  const float e3 = std::exp(3.0f);
  EXPECT_NEAR(y.data[0], e3 / (e3 + 1), 1e-6);
  EXPECT_NEAR(y.data[1], 1 / (e3 + 1), 1e-6);
  EXPECT_NEAR(y.data[2], 0.5f, 1e-6);
  EXPECT_NEAR(y.data[3], 0.5f, 1e-6);
}

TEST(ReferenceExecutorTest, ViewsAndMultipleOutputs) {
  OnnxModelBuilder builder;
  builder.Input("x", {-1, 2, 2}).Output("flat", {-1, 4}).Output("back", {-1, 2, 2});
  builder.Int64Initializer("shape", {-1, 2, 2});
  auto& f = builder.Node("Flatten", {"x"}, {"flat"});
  OnnxModelBuilder::AttrInt(f, "axis", 1);
  builder.Node("Reshape", {"flat", "shape"}, {"back"});
  auto graph = ImportOnnxModel(builder.Save("ref_views"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Tensor x({1, 2, 2}, {1, 2, 3, 4});
  auto out = RunReference(*graph, {x});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].shape, (Shape{1, 4}));
  EXPECT_EQ((*out)[0].data, x.data);
  EXPECT_EQ((*out)[1].shape, (Shape{1, 2, 2}));
}

TEST(ReferenceExecutorTest, WrongInputCount) {
  OnnxModelBuilder builder;
  builder.Input("x", {-1, 2}).Output("y", {-1, 2});
  builder.Node("Relu", {"x"}, {"y"});
  auto graph = ImportOnnxModel(builder.Save("ref_count"));
  ASSERT_TRUE(graph.ok());
  EXPECT_FALSE(RunReference(*graph, {}).ok());
}

}  // namespace
}  // namespace numaserve::engine
