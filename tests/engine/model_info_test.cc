#include <gtest/gtest.h>

#include "engine/model.h"
#include "tests/engine/default_model.h"
#include "tests/engine/onnx_model_builder.h"
#include "tests/prerequisites.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;

TEST(DataTypeTest, NamesRoundTrip) {
  for (DataType t :
       {DataType::kBool, DataType::kUint8, DataType::kInt8, DataType::kInt32, DataType::kInt64,
        DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
    EXPECT_EQ(DataTypeFromName(DataTypeName(t)), t) << DataTypeName(t);
    EXPECT_GT(DataTypeSize(t), 0u);
  }
  EXPECT_STREQ(DataTypeName(DataType::kFloat32), "FP32");
  EXPECT_EQ(DataTypeFromName("nope"), DataType::kUnknown);
  EXPECT_STREQ(DataTypeName(DataType::kUnknown), "UNKNOWN");
  EXPECT_EQ(DataTypeSize(DataType::kUnknown), 0u);
}

TEST(InspectModelTest, BatchedMlp) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 2, 3}).Output("y", {-1, 4});
  b.Int64Initializer("shape", {0, -1});
  b.Initializer("w", kernels::Tensor({6, 4})).Initializer("bias", kernels::Tensor({4}));
  b.Node("Reshape", {"x", "shape"}, {"flat"});
  b.Node("MatMul", {"flat", "w"}, {"mm"});
  b.Node("Add", {"mm", "bias"}, {"y"});
  auto info = InspectModel(b.Save("mlp_info"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->batched);
  EXPECT_EQ(info->opset, 13);
  ASSERT_EQ(info->inputs.size(), 1u);
  EXPECT_EQ(info->inputs[0].name, "x");
  EXPECT_EQ(info->inputs[0].type, DataType::kFloat32);
  EXPECT_EQ(info->inputs[0].shape, (std::vector<int64_t>{-1, 2, 3}));
  ASSERT_EQ(info->outputs.size(), 1u);
  EXPECT_EQ(info->outputs[0].shape, (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(info->parameter_bytes, 2 * 8 + (24 + 4) * 4);
  EXPECT_DOUBLE_EQ(info->flops_per_row, 2.0 * 6 * 4);
}

TEST(InspectModelTest, StaticModelIsNotBatched) {
  OnnxModelBuilder b;
  b.Input("x", {2, 3}).Output("y", {2, 3});
  b.Node("Relu", {"x"}, {"y"});
  auto info = InspectModel(b.Save("static_info"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->batched);
  EXPECT_EQ(info->outputs[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(info->flops_per_row, 0.0);
}

TEST(InspectModelTest, DefaultModel) {
  const std::string path = testing::GenerateDefaultModel();
  if (path.empty())
    NUMASERVE_MISSING_PREREQUISITE() << "no " << NUMASERVE_PYTHON << " with onnx to generate it";
  auto info = InspectModel(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->path, path);
  EXPECT_TRUE(info->batched);
  EXPECT_EQ(info->opset, 13);
  ASSERT_EQ(info->inputs.size(), 1u);
  EXPECT_EQ(info->inputs[0].name, "image");
  EXPECT_EQ(info->inputs[0].shape, (std::vector<int64_t>{-1, 1, 28, 28}));
  ASSERT_EQ(info->outputs.size(), 1u);
  EXPECT_EQ(info->outputs[0].name, "probabilities");
  EXPECT_EQ(info->outputs[0].type, DataType::kFloat32);
  EXPECT_EQ(info->outputs[0].shape, (std::vector<int64_t>{-1, 10}));
  EXPECT_DOUBLE_EQ(info->flops_per_row, 2.0 * (784 * 256 + 256 * 128 + 128 * 10));
  EXPECT_EQ(info->parameter_bytes, 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10));
}

}  // namespace
}  // namespace numaserve::engine
