#include "engine/import/onnx_import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "engine/ops/shape_propagation.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;

kernels::Tensor Ones(const kernels::Shape& shape) {
  return kernels::Tensor(shape, std::vector<float>(kernels::NumElements(shape), 1.0f));
}

OnnxModelBuilder SmallGemm() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4})
      .Output("y", {-1, 3})
      .Initializer("w", Ones({4, 3}))
      .Initializer("c", Ones({3}));
  b.Node("Gemm", {"x", "w", "c"}, {"y"}, "fc");
  return b;
}

TEST(OnnxImportTest, BuildsGraph) {
  auto graph = ImportOnnxModel(SmallGemm().Save("small_gemm"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->opset(), 13);
  ASSERT_EQ(graph->inputs().size(), 1u);
  EXPECT_EQ(graph->value(graph->inputs()[0]).shape, (Shape{-1, 4}));
  ASSERT_EQ(graph->nodes().size(), 1u);
  EXPECT_EQ(graph->nodes()[0].op_type, "Gemm");
  EXPECT_EQ(graph->nodes()[0].name, "fc");
  EXPECT_EQ(graph->constants().size(), 2u);
  const Constant* w = graph->FindConstant(*graph->FindValue("w"));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->f32.data, std::vector<float>(12, 1.0f));
}

TEST(OnnxImportTest, InitializerListedAsInputIsNotARuntimeInput) {
  OnnxModelBuilder b = SmallGemm();
  b.Input("w", {4, 3});
  auto graph = ImportOnnxModel(b.Save("init_as_input"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->inputs().size(), 1u);
}

// Constant's scalar and list forms (as torch.onnx.export(dynamo=True) writes
// them) are the 0-D and 1-D tensors they mean; other forms are refused by name.
TEST(OnnxImportTest, ConstantsValueIntsAndValueFloatFormsAreRead) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4}).Output("y", {-1, 2, 2});
  OnnxModelBuilder::AttrInts(b.Node("Constant", {}, {"target"}, "target"), "value_ints",
                             {-1, 2, 2});
  OnnxModelBuilder::AttrFloat(b.Node("Constant", {}, {"two"}, "two"), "value_float", 2.0f);
  b.Node("Reshape", {"x", "target"}, {"r"}, "reshape");
  b.Node("Mul", {"r", "two"}, {"y"}, "mul");
  auto graph = ImportOnnxModel(b.Save("constant_forms"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Constant* target = graph->FindConstant(*graph->FindValue("target"));
  ASSERT_NE(target, nullptr);
  EXPECT_EQ(target->shape, (Shape{3}));
  EXPECT_EQ(target->i64, (std::vector<int64_t>{-1, 2, 2}));
  const Constant* two = graph->FindConstant(*graph->FindValue("two"));
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->shape, (Shape{}));
  EXPECT_EQ(two->f32.data, std::vector<float>{2.0f});

  OnnxModelBuilder words;
  words.Input("x", {-1, 4}).Output("y", {-1, 4}).Output("w", {}, onnx::TensorProto::STRING);
  OnnxModelBuilder::AttrString(words.Node("Constant", {}, {"w"}, "words"), "value_string", "a");
  words.Node("Identity", {"x"}, {"y"});
  auto refused = ImportOnnxModel(words.Save("constant_string"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("node 'words' (op Constant): attribute 'value_string' is not supported"));
}

TEST(OnnxImportTest, MissingFileNamesThePath) {
  auto graph = ImportOnnxModel("/nonexistent/model.onnx");
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("/nonexistent/model.onnx"));
}

TEST(OnnxImportTest, RandomBytesGiveAnErrorNotACrash) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    const std::string path = ::testing::TempDir() + "/numaserve_random.onnx";
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      const int n = 1 + static_cast<int>(rng() % 4096);
      for (int i = 0; i < n; ++i) out.put(static_cast<char>(rng()));
    }
    auto graph = ImportOnnxModel(path);
    ASSERT_FALSE(graph.ok()) << "trial " << trial;
    EXPECT_THAT(std::string(graph.status().message()), HasSubstr(path));
  }
}

TEST(OnnxImportTest, TruncatedModelGivesAnError) {
  const std::string path = SmallGemm().Save("truncated");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  EXPECT_FALSE(ImportOnnxModel(path).ok());
}

TEST(OnnxImportTest, UnsupportedOpNamesOpAndNode) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 8}).Output("y", {-1, 8});
  b.Node("Hardmax", {"x"}, {"y"}, "hm1");
  auto graph = ImportOnnxModel(b.Save("hardmax"));
  ASSERT_FALSE(graph.ok());
  const std::string message(graph.status().message());
  EXPECT_THAT(message, HasSubstr("node 'hm1' (op Hardmax) is not supported"));
  EXPECT_THAT(message, HasSubstr(".onnx"));
}

TEST(OnnxImportTest, StringInputIsRejectedByName) {
  // Numeric and BOOL inputs run (typed references); STRING has no DataType.
  OnnxModelBuilder b;
  b.Input("ids", {-1, 4}, onnx::TensorProto::STRING).Output("y", {-1, 4});
  b.Node("Identity", {"ids"}, {"y"});
  b.proto()
      .mutable_graph()
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->set_elem_type(onnx::TensorProto::STRING);
  auto graph = ImportOnnxModel(b.Save("string_input"));
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("'ids'"));
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("element type STRING"));
}

TEST(OnnxImportTest, Int64InputIsAccepted) {
  OnnxModelBuilder b;
  b.Input("ids", {-1, 4}, onnx::TensorProto::INT64).Output("y", {-1, 4}, onnx::TensorProto::INT64);
  b.Node("Identity", {"ids"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("int_input"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->value(graph->inputs()[0]).type, DataType::kInt64);
}

TEST(OnnxImportTest, DynamicNonBatchDimsAreImportedWithTheirNames) {
  OnnxModelBuilder b;
  b.NamedInput("x", {-1, -1, kUnknownDim}, {"batch", "seq", ""}).Output("y", {-1, -1, kUnknownDim});
  b.Node("Relu", {"x"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("dyn_dim1"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Value& x = graph->value(graph->inputs()[0]);
  EXPECT_EQ(x.shape, (Shape{-1, -1, -1}));
  EXPECT_EQ(x.dim_names, (std::vector<std::string>{"batch", "seq", ""}));
  EXPECT_TRUE(HasDynamicNonBatchDims(*graph));
}

TEST(OnnxImportTest, CheckerFailureBecomesAStatus) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4}).Output("y", {-1, 4});
  b.Node("Relu", {"undefined_value"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("checker"));
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OnnxImportTest, ShapeMismatchIsReported) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 5}).Output("y", {-1, 3}).Initializer("w", Ones({4, 3}));
  b.Node("MatMul", {"x", "w"}, {"y"});
  EXPECT_FALSE(ImportOnnxModel(b.Save("mismatch")).ok());
}

TEST(OnnxImportTest, ReshapeNeedsAConstantShape) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4}).Input("s", {2}).Output("y", {kUnknownDim, kUnknownDim});
  b.Node("Reshape", {"x", "s"}, {"y"}, "reshape");
  // "s" is FP32 and a runtime input: rejected (by type check or by us).
  EXPECT_FALSE(ImportOnnxModel(b.Save("reshape_dyn")).ok());
}

TEST(OnnxImportTest, ConstantNodeBecomesAConstant) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 2, 3}).Output("y", {-1, 6});
  auto& c = b.Node("Constant", {}, {"shape"}, "shape_const");
  auto* attr = c.add_attribute();
  attr->set_name("value");
  attr->set_type(onnx::AttributeProto::TENSOR);
  attr->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  attr->mutable_t()->add_dims(2);
  attr->mutable_t()->add_int64_data(0);
  attr->mutable_t()->add_int64_data(-1);
  b.Node("Reshape", {"x", "shape"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("constant_node"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->nodes().size(), 1u);
  EXPECT_TRUE(graph->IsConstant(*graph->FindValue("shape")));
}

}  // namespace
}  // namespace numaserve::engine
