// ArgMax/ArgMin, CumSum, Trilu (engine/ops/index_ops.cc),
// GatherElements, ScatterElements, GatherND, ScatterND
// (engine/ops/scatter_ops.cc) against hand-computed values, on the
// reference executor and the compiled model (which must agree), FP32 and
// INT64; negative axes and indices, ties, empty dims; indices out of range
// and hostile attributes or shapes refused with the node's name; TopK,
// OneHot, Range (index_ops.cc) and Einsum (einsum_ops.cc). Also Mod
// by zero and Where's broadcasting (engine/ops/*elementwise_ops.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"
#include "engine/ops/op_registry.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using P = onnx::TensorProto;

TypedTensor F32(Shape shape, std::vector<float> v) {
  return TypedTensor::FromValues(DataType::kFloat32, std::move(shape), v);
}
TypedTensor I64(Shape shape, std::vector<int64_t> v) {
  return TypedTensor::FromValues(DataType::kInt64, std::move(shape), v);
}
template <typename T>
std::vector<T> Values(const TypedTensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.size());
}

// A constant INT64 tensor of any shape.
void Int64Const(OnnxModelBuilder& b, const std::string& name, const std::vector<int64_t>& dims,
                const std::vector<int64_t>& v) {
  b.RawInitializer(name, P::INT64, dims, v.data(), v.size() * sizeof(int64_t));
}

// Runs the model on the reference executor and the compiled model; both
// must give the same types, shapes and bytes.
std::vector<TypedTensor> RunBoth(const std::string& path, const std::vector<TypedTensor>& inputs) {
  auto graph = ImportOnnxModel(path);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  auto ref = RunReferenceTyped(*graph, inputs);
  EXPECT_TRUE(ref.ok()) << ref.status();
  if (!ref.ok()) return {};
  auto model = CompiledModel::Load(path, {});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  std::vector<const void*> in;
  for (const TypedTensor& t : inputs) in.push_back(t.bytes.data());
  std::vector<TypedTensor> out;
  const auto shapes = (*model)->OutputShapes(1);
  for (size_t j = 0; j < shapes.size(); ++j) {
    out.emplace_back((*model)->info().outputs[j].type, shapes[j]);
  }
  std::vector<void*> out_ptrs;
  for (TypedTensor& t : out) out_ptrs.push_back(t.bytes.data());
  absl::Status s = (*model)->Run(1, in, out_ptrs);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(out.size(), ref->size());
  for (size_t j = 0; j < out.size() && j < ref->size(); ++j) {
    EXPECT_EQ(out[j].type, (*ref)[j].type) << "output " << j;
    EXPECT_EQ(out[j].shape, (*ref)[j].shape) << "output " << j;
    EXPECT_EQ(out[j].bytes, (*ref)[j].bytes) << "output " << j << " differs from the reference";
  }
  return out;
}

// The load's status: expected to fail with CODE, naming the node and WHAT.
void ExpectLoadRefused(const OnnxModelBuilder& b, const std::string& stem, absl::StatusCode code,
                       const std::string& node, const std::string& what) {
  auto model = CompiledModel::Load(b.Save(stem), {});
  ASSERT_FALSE(model.ok()) << stem << " loaded";
  EXPECT_EQ(model.status().code(), code) << model.status();
  EXPECT_NE(model.status().message().find("'" + node + "'"), std::string::npos) << model.status();
  EXPECT_NE(model.status().message().find(what), std::string::npos) << model.status();
}

// Runs a loaded model whose run must fail: INVALID_ARGUMENT naming the node
// and "out of range".
void ExpectRunOutOfRange(const OnnxModelBuilder& b, const std::string& stem,
                         const std::vector<TypedTensor>& inputs, const std::string& node) {
  auto model = CompiledModel::Load(b.Save(stem), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<const void*> in;
  for (const TypedTensor& t : inputs) in.push_back(t.bytes.data());
  std::vector<TypedTensor> out;
  for (const Shape& s : (*model)->OutputShapes(1)) out.emplace_back(DataType::kFloat32, s);
  std::vector<void*> out_ptrs;
  for (TypedTensor& t : out) out_ptrs.push_back(t.bytes.data());
  absl::Status s = (*model)->Run(1, in, out_ptrs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'" + node + "'"), std::string::npos) << s;
}

// One node of OP named "victim", outside any model: its row's validation
// and shape inference alone, for the hostile cases ONNX's own shape
// inference refuses before the engine sees them (a model that hides its
// shapes from it reaches these checks). Input i has shape inputs[i];
// consts maps an input index to its INT64 values (shape: their count, or a
// scalar when `scalar`).
absl::Status HandBuiltNode(const std::string& op, const std::vector<Shape>& inputs,
                           const std::map<size_t, std::vector<int64_t>>& consts,
                           const std::map<std::string, AttributeValue>& attrs, size_t outputs = 1) {
  Graph graph;
  graph.set_opset(18);
  Node node;
  node.name = "victim";
  node.op_type = op;
  node.attributes = attrs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueId id = graph.GetOrAddValue("in" + std::to_string(i));
    if (auto c = consts.find(i); c != consts.end()) {
      Constant k;
      k.type = DataType::kInt64;
      k.shape = inputs[i];
      k.i64 = c->second;
      k.bytes.resize(c->second.size() * sizeof(int64_t));
      std::memcpy(k.bytes.data(), c->second.data(), k.bytes.size());
      graph.SetConstant(id, k);
    }
    node.inputs.push_back(id);
  }
  for (size_t j = 0; j < outputs; ++j) {
    node.outputs.push_back(graph.GetOrAddValue("out" + std::to_string(j)));
  }
  const OpSchema* schema = FindOpSchema(op);
  if (schema == nullptr) return absl::NotFoundError(op);
  if (absl::Status s = schema->validate(graph, node); !s.ok()) return s;
  std::vector<const Shape*> shapes;
  for (const Shape& s : inputs) shapes.push_back(&s);
  return schema->infer_shapes(graph, node, shapes).status();
}

// CODE, naming the node "victim" and WHAT.
void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& what) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find("'victim'"), std::string::npos) << s;
  EXPECT_NE(s.message().find(what), std::string::npos) << s;
}

TEST(IndexOpsTest, ArgMaxArgMinWithTiesAndNegativeAxis) {
  OnnxModelBuilder b(18);
  b.Input("x", {2, 3}).Output("max", {2, 1}, P::INT64).Output("last", {2}, P::INT64);
  b.Output("min", {3}, P::INT64);
  auto& max = b.Node("ArgMax", {"x"}, {"max"});
  OnnxModelBuilder::AttrInt(max, "axis", 1);
  auto& last = b.Node("ArgMax", {"x"}, {"last"});
  OnnxModelBuilder::AttrInt(last, "axis", -1);
  OnnxModelBuilder::AttrInt(last, "keepdims", 0);
  OnnxModelBuilder::AttrInt(last, "select_last_index", 1);
  auto& min = b.Node("ArgMin", {"x"}, {"min"});
  OnnxModelBuilder::AttrInt(min, "axis", -2);
  OnnxModelBuilder::AttrInt(min, "keepdims", 0);
  const auto out = RunBoth(b.Save("argmax"), {F32({2, 3}, {1, 5, 5, 7, 2, 7})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].shape, (Shape{2, 1}));
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{1, 0}));  // ties: the first
  EXPECT_EQ(Values<int64_t>(out[1]), (std::vector<int64_t>{2, 2}));  // ties: the last
  EXPECT_EQ(Values<int64_t>(out[2]), (std::vector<int64_t>{0, 1, 0}));
}

TEST(IndexOpsTest, ArgMaxOfInt64IsExact) {
  OnnxModelBuilder b(18);
  b.Input("x", {3}, P::INT64).Output("y", {1}, P::INT64);
  b.Node("ArgMax", {"x"}, {"y"});
  const int64_t big = int64_t{1} << 60;  // big and big + 1 are one double
  const auto out = RunBoth(b.Save("argmax_i64"), {I64({3}, {big, big + 1, -1})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{1}));
}

TEST(IndexOpsTest, ArgMaxRefusesEmptyAxesAndBadAttributes) {
  OnnxModelBuilder empty(18);
  empty.Input("x", {2, 0}).Output("y", {2, 1}, P::INT64);
  OnnxModelBuilder::AttrInt(empty.Node("ArgMax", {"x"}, {"y"}, "am"), "axis", 1);
  ExpectLoadRefused(empty, "argmax_empty", absl::StatusCode::kInvalidArgument, "am", "empty");
  OnnxModelBuilder flag(18);
  flag.Input("x", {2, 3}).Output("y", {1, 3}, P::INT64);
  OnnxModelBuilder::AttrInt(flag.Node("ArgMin", {"x"}, {"y"}, "am"), "select_last_index", 2);
  ExpectLoadRefused(flag, "argmin_flag", absl::StatusCode::kInvalidArgument, "am",
                    "select_last_index");
}

TEST(IndexOpsTest, CumSumExclusiveAndReverse) {
  OnnxModelBuilder b(18);
  b.Input("x", {2, 3}).Output("a", {2, 3}).Output("e", {2, 3}).Output("r", {2, 3});
  b.Output("er", {2, 3});
  Int64Const(b, "axis", {}, {-1});
  b.Node("CumSum", {"x", "axis"}, {"a"});
  OnnxModelBuilder::AttrInt(b.Node("CumSum", {"x", "axis"}, {"e"}), "exclusive", 1);
  OnnxModelBuilder::AttrInt(b.Node("CumSum", {"x", "axis"}, {"r"}), "reverse", 1);
  auto& er = b.Node("CumSum", {"x", "axis"}, {"er"});
  OnnxModelBuilder::AttrInt(er, "exclusive", 1);
  OnnxModelBuilder::AttrInt(er, "reverse", 1);
  const auto out = RunBoth(b.Save("cumsum"), {F32({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{0, 1, 3, 0, 4, 9}));
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{6, 5, 3, 15, 11, 6}));
  EXPECT_EQ(Values<float>(out[3]), (std::vector<float>{5, 3, 0, 11, 6, 0}));
}

TEST(IndexOpsTest, CumSumOfInt64OnAxisZeroIsExact) {
  OnnxModelBuilder b(18);
  b.Input("x", {3, 1}, P::INT64).Output("y", {3, 1}, P::INT64);
  Int64Const(b, "axis", {1}, {0});
  b.Node("CumSum", {"x", "axis"}, {"y"});
  const int64_t big = int64_t{1} << 60;
  const auto out = RunBoth(b.Save("cumsum_i64"), {I64({3, 1}, {big, 1, -2})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{big, big + 1, big - 1}));
}

TEST(IndexOpsTest, CumSumRefusesARuntimeOrBadAxis) {
  OnnxModelBuilder runtime(18);
  runtime.Input("x", {3}).Input("axis", {}, P::INT64).Output("y", {3});
  runtime.Node("CumSum", {"x", "axis"}, {"y"}, "cs");
  ExpectLoadRefused(runtime, "cumsum_runtime_axis", absl::StatusCode::kUnimplemented, "cs",
                    "constant");
  OnnxModelBuilder range(18);
  range.Input("x", {3}).Output("y", {3});
  Int64Const(range, "axis", {}, {1});
  range.Node("CumSum", {"x", "axis"}, {"y"}, "cs");
  ExpectLoadRefused(range, "cumsum_axis_range", absl::StatusCode::kInvalidArgument, "cs", "axis");
}

TEST(IndexOpsTest, TriluUpperLowerAndK) {
  OnnxModelBuilder b(18);
  b.Input("x", {3, 3}).Output("u", {3, 3}).Output("l", {3, 3}).Output("u1", {3, 3});
  b.Output("none", {3, 3});
  Int64Const(b, "km1", {}, {-1});
  Int64Const(b, "k1", {}, {1});
  Int64Const(b, "huge", {}, {int64_t{1} << 62});
  b.Node("Trilu", {"x"}, {"u"});
  OnnxModelBuilder::AttrInt(b.Node("Trilu", {"x", "km1"}, {"l"}), "upper", 0);
  b.Node("Trilu", {"x", "k1"}, {"u1"});
  b.Node("Trilu", {"x", "huge"}, {"none"});
  const auto out = RunBoth(b.Save("trilu"), {F32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 2, 3, 0, 5, 6, 0, 0, 9}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{0, 0, 0, 4, 0, 0, 7, 8, 0}));
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{0, 2, 3, 0, 0, 6, 0, 0, 0}));
  EXPECT_EQ(Values<float>(out[3]), std::vector<float>(9, 0.0f));
}

TEST(IndexOpsTest, TriluOfInt64BatchAndRankOneRefused) {
  OnnxModelBuilder b(18);
  b.Input("x", {2, 2, 3}, P::INT64).Output("y", {2, 2, 3}, P::INT64);
  OnnxModelBuilder::AttrInt(b.Node("Trilu", {"x"}, {"y"}), "upper", 0);
  const int64_t big = (int64_t{1} << 60) + 1;
  const auto out = RunBoth(b.Save("trilu_i64"), {I64({2, 2, 3}, {big, 2, 3, 4, 5, 6,  //
                                                                 7, 8, 9, 10, 11, 12})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int64_t>(out[0]),
            (std::vector<int64_t>{big, 0, 0, 4, 5, 0, 7, 0, 0, 10, 11, 0}));
  ExpectRefused(HandBuiltNode("Trilu", {{3}}, {}, {}), absl::StatusCode::kInvalidArgument,
                "rank 2");
  ExpectRefused(HandBuiltNode("Trilu", {{3, 3}, {2}}, {{1, {1, 2}}}, {}),
                absl::StatusCode::kInvalidArgument, "one value");
  ExpectRefused(HandBuiltNode("Trilu", {{3, 3}}, {}, {{"upper", int64_t{2}}}),
                absl::StatusCode::kInvalidArgument, "upper");
}

TEST(IndexOpsTest, GatherElementsRuntimeAndConstantIndices) {
  OnnxModelBuilder b(18);
  b.Input("x", {2, 2}).Input("i", {2, 2}, P::INT64).Output("y", {2, 2}).Output("c", {1, 2});
  Int64Const(b, "ci", {1, 2}, {-1, 0});
  OnnxModelBuilder::AttrInt(b.Node("GatherElements", {"x", "i"}, {"y"}), "axis", 1);
  b.Node("GatherElements", {"x", "ci"}, {"c"});  // axis 0
  const auto out =
      RunBoth(b.Save("gather_elements"), {F32({2, 2}, {1, 2, 3, 4}), I64({2, 2}, {0, 0, -1, 0})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 1, 4, 3}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{3, 2}));
  ExpectRunOutOfRange(b, "gather_elements_range",
                      {F32({2, 2}, {1, 2, 3, 4}), I64({2, 2}, {0, 2, 0, 0})}, "GatherElements_1");
}

TEST(IndexOpsTest, ScatterElementsWithEachReduction) {
  OnnxModelBuilder b(18);
  b.Input("x", {1, 5}).Input("i", {1, 2}, P::INT64).Input("u", {1, 2});
  const std::vector<std::string> reductions = {"none", "add", "mul", "max", "min"};
  for (const std::string& r : reductions) {
    b.Output(r, {1, 5});
    auto& n = b.Node("ScatterElements", {"x", "i", "u"}, {r});
    OnnxModelBuilder::AttrInt(n, "axis", -1);
    OnnxModelBuilder::AttrString(n, "reduction", r);
  }
  // Index 1 twice (-4 is 1): updates apply in order.
  const auto out = RunBoth(b.Save("scatter_elements"), {F32({1, 5}, {1, 2, 3, 4, 5}),
                                                        I64({1, 2}, {1, -4}), F32({1, 2}, {3, 5})});
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 5, 3, 4, 5}));   // the last wins
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{1, 10, 3, 4, 5}));  // 2 + 3 + 5
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{1, 30, 3, 4, 5}));  // 2 * 3 * 5
  EXPECT_EQ(Values<float>(out[3]), (std::vector<float>{1, 5, 3, 4, 5}));
  EXPECT_EQ(Values<float>(out[4]), (std::vector<float>{1, 2, 3, 4, 5}));
  ExpectRunOutOfRange(b, "scatter_elements_range",
                      {F32({1, 5}, {1, 2, 3, 4, 5}), I64({1, 2}, {-6, 0}), F32({1, 2}, {3, 5})},
                      "ScatterElements_1");
}

TEST(IndexOpsTest, ScatterElementsOfInt64AndHostileShapes) {
  OnnxModelBuilder b(18);
  b.Input("x", {3}, P::INT64).Input("i", {2}, P::INT32).Input("u", {2}, P::INT64);
  b.Output("y", {3}, P::INT64);
  OnnxModelBuilder::AttrString(b.Node("ScatterElements", {"x", "i", "u"}, {"y"}), "reduction",
                               "add");
  const int64_t big = int64_t{1} << 60;
  const TypedTensor idx =
      TypedTensor::FromValues(DataType::kInt32, {2}, std::vector<int32_t>{2, 0});
  const auto out = RunBoth(b.Save("scatter_i64"), {I64({3}, {big, 0, big}), idx, I64({2}, {1, 1})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{big + 1, 0, big + 1}));

  OnnxModelBuilder shape(18);
  shape.Input("x", {3}).Input("i", {2}, P::INT64).Input("u", {3}).Output("y", {3});
  shape.Node("ScatterElements", {"x", "i", "u"}, {"y"}, "se");
  ExpectLoadRefused(shape, "scatter_updates_shape", absl::StatusCode::kInvalidArgument, "se",
                    "updates");
  OnnxModelBuilder red(18);
  red.Input("x", {3}).Input("i", {2}, P::INT64).Input("u", {2}).Output("y", {3});
  OnnxModelBuilder::AttrString(red.Node("ScatterElements", {"x", "i", "u"}, {"y"}, "se"),
                               "reduction", "mean");
  ExpectLoadRefused(red, "scatter_reduction", absl::StatusCode::kInvalidArgument, "se", "mean");
}

TEST(IndexOpsTest, GatherNDTuplesSlicesAndBatchDims) {
  OnnxModelBuilder b(18);
  b.Input("x", {2, 2}).Input("t", {2, 2}, P::INT64).Input("s", {2, 1}, P::INT64);
  b.Input("bx", {2, 2, 2}).Input("bi", {2, 1}, P::INT64);
  b.Output("yt", {2}).Output("ys", {2, 2}).Output("yb", {2, 2});
  b.Node("GatherND", {"x", "t"}, {"yt"});
  b.Node("GatherND", {"x", "s"}, {"ys"});
  OnnxModelBuilder::AttrInt(b.Node("GatherND", {"bx", "bi"}, {"yb"}), "batch_dims", 1);
  const auto out =
      RunBoth(b.Save("gather_nd"),
              {F32({2, 2}, {0, 1, 2, 3}), I64({2, 2}, {0, 0, -1, -1}), I64({2, 1}, {1, 0}),
               F32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}), I64({2, 1}, {1, 0})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{0, 3}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{2, 3, 0, 1}));
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{2, 3, 4, 5}));

  OnnxModelBuilder small(18);
  small.Input("x", {2, 2}).Input("t", {1, 2}, P::INT64).Output("y", {1});
  small.Node("GatherND", {"x", "t"}, {"y"}, "gnd");
  ExpectRunOutOfRange(small, "gather_nd_range", {F32({2, 2}, {0, 1, 2, 3}), I64({1, 2}, {0, -3})},
                      "gnd");
  ExpectRefused(HandBuiltNode("GatherND", {{2, 2}, {2, 1}}, {}, {{"batch_dims", int64_t{2}}}),
                absl::StatusCode::kInvalidArgument, "batch_dims");
  ExpectRefused(HandBuiltNode("GatherND", {{2, 2}, {2, 3}}, {}, {}),
                absl::StatusCode::kInvalidArgument, "last dim of indices");
  ExpectRefused(HandBuiltNode("GatherND", {{2, 2, 2}, {3, 1}}, {}, {{"batch_dims", int64_t{1}}}),
                absl::StatusCode::kInvalidArgument, "batch dim 0 differs");
  ExpectRefused(HandBuiltNode("GatherElements", {{2, 2}, {2, 3}}, {}, {}),
                absl::StatusCode::kInvalidArgument, "no dim larger");
  ExpectRefused(HandBuiltNode("GatherElements", {{2, 2}, {2}}, {}, {}),
                absl::StatusCode::kInvalidArgument, "rank of data");
}

TEST(IndexOpsTest, ScatterNDSlicesAndReduction) {
  OnnxModelBuilder b(18);
  b.Input("x", {8}).Input("i", {4, 1}, P::INT64).Input("u", {4}).Output("y", {8});
  b.Output("add", {8});
  b.Node("ScatterND", {"x", "i", "u"}, {"y"});
  OnnxModelBuilder::AttrString(b.Node("ScatterND", {"x", "i", "u"}, {"add"}), "reduction", "add");
  const auto out = RunBoth(
      b.Save("scatter_nd"),
      {F32({8}, {1, 2, 3, 4, 5, 6, 7, 8}), I64({4, 1}, {4, 3, 1, -1}), F32({4}, {9, 10, 11, 12})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 11, 3, 10, 9, 6, 7, 12}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{1, 13, 3, 14, 14, 6, 7, 20}));

  OnnxModelBuilder rows(18);
  rows.Input("x", {2, 3}).Input("i", {1, 1}, P::INT64).Input("u", {1, 3}).Output("y", {2, 3});
  rows.Node("ScatterND", {"x", "i", "u"}, {"y"}, "snd");
  const auto row =
      RunBoth(rows.Save("scatter_nd_rows"),
              {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({1, 1}, {1}), F32({1, 3}, {7, 8, 9})});
  ASSERT_EQ(row.size(), 1u);
  EXPECT_EQ(Values<float>(row[0]), (std::vector<float>{1, 2, 3, 7, 8, 9}));
  ExpectRunOutOfRange(rows, "scatter_nd_range",
                      {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({1, 1}, {2}), F32({1, 3}, {7, 8, 9})},
                      "snd");
  OnnxModelBuilder bad(18);
  bad.Input("x", {2, 3}).Input("i", {1, 1}, P::INT64).Input("u", {1, 2}).Output("y", {2, 3});
  bad.Node("ScatterND", {"x", "i", "u"}, {"y"}, "snd");
  ExpectLoadRefused(bad, "scatter_nd_updates", absl::StatusCode::kInvalidArgument, "snd",
                    "updates");
}

TEST(IndexOpsTest, TopKLargestSmallestAndTies) {
  OnnxModelBuilder b(18);
  b.Input("x", {2, 4}).Output("v", {2, 2}).Output("i", {2, 2}, P::INT64);
  b.Output("sv", {1, 4}).Output("si", {1, 4}, P::INT64);
  Int64Const(b, "k2", {1}, {2});
  Int64Const(b, "k1", {1}, {1});
  b.Node("TopK", {"x", "k2"}, {"v", "i"});
  auto& small = b.Node("TopK", {"x", "k1"}, {"sv", "si"});
  OnnxModelBuilder::AttrInt(small, "axis", 0);
  OnnxModelBuilder::AttrInt(small, "largest", 0);
  const auto out = RunBoth(b.Save("topk"), {F32({2, 4}, {1, 3, 3, 2, 5, 5, 5, -1})});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{3, 3, 5, 5}));
  EXPECT_EQ(Values<int64_t>(out[1]), (std::vector<int64_t>{1, 2, 0, 1}));  // ties: lower first
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{1, 3, 3, -1}));
  EXPECT_EQ(Values<int64_t>(out[3]), (std::vector<int64_t>{0, 0, 0, 1}));

  ExpectRefused(HandBuiltNode("TopK", {{3}, {1}}, {{1, {4}}}, {}, 2),
                absl::StatusCode::kInvalidArgument, "K 4");
  ExpectRefused(HandBuiltNode("TopK", {{3}, {1}}, {{1, {-1}}}, {}, 2),
                absl::StatusCode::kInvalidArgument, "negative");
  ExpectRefused(HandBuiltNode("TopK", {{3}, {1}}, {}, {}, 2), absl::StatusCode::kUnimplemented,
                "constant");
}

TEST(IndexOpsTest, OneHotNegativeAndOutOfRangeIndices) {
  OnnxModelBuilder b(18);
  b.Input("i", {4}, P::INT64).Output("y", {3, 4});
  Int64Const(b, "depth", {}, {3});
  b.Initializer("values", kernels::Tensor({2}, {-1, 7}));
  OnnxModelBuilder::AttrInt(b.Node("OneHot", {"i", "depth", "values"}, {"y"}), "axis", 0);
  const auto out = RunBoth(b.Save("onehot"), {I64({4}, {0, -1, 3, -4})});
  ASSERT_EQ(out.size(), 1u);
  // Columns: index 0, index -1 (= 2), then 3 and -4 (out of range: all off).
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{7, -1, -1, -1,   //
                                                       -1, -1, -1, -1,  //
                                                       -1, 7, -1, -1}));
  ExpectRefused(HandBuiltNode("OneHot", {{4}, {}, {2}}, {{1, {0}}}, {}),
                absl::StatusCode::kInvalidArgument, "depth");
  ExpectRefused(HandBuiltNode("OneHot", {{4}, {}, {3}}, {{1, {2}}}, {}),
                absl::StatusCode::kInvalidArgument, "two elements");
  ExpectRefused(HandBuiltNode("OneHot", {{4}, {}, {2}}, {{1, {2}}}, {{"axis", int64_t{2}}}),
                absl::StatusCode::kInvalidArgument, "axis");
}

TEST(IndexOpsTest, RangeFoldsConstantsAndRefusesRuntimeInputs) {
  OnnxModelBuilder b(18);
  b.Input("x", {4}).Output("y", {4});
  b.Initializer("start", kernels::Tensor({}, {1}));
  b.Initializer("limit", kernels::Tensor({}, {-1}));
  b.Initializer("delta", kernels::Tensor({}, {-0.5f}));
  b.Node("Range", {"start", "limit", "delta"}, {"r"});
  b.Node("Add", {"x", "r"}, {"y"});
  const auto out = RunBoth(b.Save("range"), {F32({4}, {10, 20, 30, 40})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{11, 20.5f, 30, 39.5f}));

  OnnxModelBuilder runtime(18);
  runtime.Input("n", {}, P::INT64).Output("y", {testing::kUnknownDim}, P::INT64);
  Int64Const(runtime, "zero", {}, {0});
  Int64Const(runtime, "one", {}, {1});
  runtime.Node("Range", {"zero", "n", "one"}, {"y"}, "range");
  ExpectLoadRefused(runtime, "range_runtime", absl::StatusCode::kUnimplemented, "range",
                    "data-dependent");
  OnnxModelBuilder step(18);
  step.Output("y", {testing::kUnknownDim}, P::INT64);
  Int64Const(step, "zero", {}, {0});
  Int64Const(step, "one", {}, {1});
  step.Node("Range", {"zero", "one", "zero"}, {"y"}, "range");
  ExpectLoadRefused(step, "range_zero_delta", absl::StatusCode::kInvalidArgument, "range", "delta");
}

TEST(IndexOpsTest, EinsumEquationsExportersEmit) {
  OnnxModelBuilder b(18);
  b.Input("a", {1, 2, 3}).Input("c", {1, 3, 2}).Input("v", {3});
  b.Output("bmm", {1, 2, 2}).Output("t", {1, 3, 2}).Output("dot", {}).Output("rows", {1, 2});
  b.Output("diag", {2}).Output("implicit", {2, 2});
  b.Input("sq", {2, 2});
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a", "c"}, {"bmm"}), "equation", "bij,bjk->bik");
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a"}, {"t"}), "equation", "bij -> bji");
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"v", "v"}, {"dot"}), "equation", "i,i->");
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a"}, {"rows"}), "equation", "bij->bi");
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"sq"}, {"diag"}), "equation", "ii->i");
  // Implicit: the labels that appear once (b appears twice: summed).
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a", "c"}, {"implicit"}), "equation", "bij,bjk");
  const auto out = RunBoth(b.Save("einsum"),
                           {F32({1, 2, 3}, {1, 2, 3, 4, 5, 6}), F32({1, 3, 2}, {1, 0, 0, 1, 1, 1}),
                            F32({3}, {1, 2, 3}), F32({2, 2}, {7, 8, 9, 10})});
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{4, 5, 10, 11}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{14}));
  EXPECT_EQ(Values<float>(out[3]), (std::vector<float>{6, 15}));
  EXPECT_EQ(Values<float>(out[4]), (std::vector<float>{7, 10}));
  EXPECT_EQ(Values<float>(out[5]), (std::vector<float>{4, 5, 10, 11}));
}

TEST(IndexOpsTest, EinsumOfInt64AttentionScores) {
  OnnxModelBuilder b(18);
  b.Input("q", {1, 1, 2, 2}, P::INT64).Input("k", {1, 1, 2, 2}, P::INT64);
  b.Output("s", {1, 1, 2, 2}, P::INT64);
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"q", "k"}, {"s"}), "equation", "bhqd,bhkd->bhqk");
  const int64_t big = int64_t{1} << 40;
  const auto out = RunBoth(b.Save("einsum_i64"),
                           {I64({1, 1, 2, 2}, {big, 1, 2, 3}), I64({1, 1, 2, 2}, {3, 1, 0, 2})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{3 * big + 1, 2, 9, 6}));
}

TEST(IndexOpsTest, EinsumEllipsisBroadcasts) {
  OnnxModelBuilder b(18);
  b.Input("a", {2, 1, 1, 1}).Input("c", {1, 3, 1, 1}).Output("y", {2, 3, 1, 1});
  b.Output("sum", {1, 1}).Output("implicit", {2, 1, 1, 1});
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a", "c"}, {"y"}), "equation",
                               "...ij,...jk->...ik");
  // No ellipsis in the output: its dims are summed.
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a", "c"}, {"sum"}), "equation",
                               "...ij,...jk->ik");
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a"}, {"implicit"}), "equation", "...ij");
  const auto out =
      RunBoth(b.Save("einsum_ellipsis"), {F32({2, 1, 1, 1}, {1, 2}), F32({3, 1, 1}, {1, 10, 100})});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].shape, (Shape{2, 3, 1, 1}));
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 10, 100, 2, 20, 200}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{333}));
  EXPECT_EQ(Values<float>(out[2]), (std::vector<float>{1, 2}));
}

TEST(IndexOpsTest, EinsumRefusesBadEquations) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"..ij,jk->ik", "not a letter"},     // two dots
      {"...i...,jk->ik", "two ellipses"},  // two in one term
      {"ij,jk->ik,", "not a letter"},      // a comma in the output
      {"ij,jk->iz", "output label"},       // z is not an input label
      {"ij,jk->ii", "output label"},       // repeated in the output
      {"ij,jk,kl->il", "3 terms"},         // two inputs
      {"i1,1k->ik", "not a letter"},
  };
  for (const auto& [equation, what] : cases) {
    const absl::Status s = HandBuiltNode("Einsum", {{2, 2}, {2, 2}}, {}, {{"equation", equation}});
    ExpectRefused(s, absl::StatusCode::kUnimplemented, what);
    EXPECT_NE(s.message().find(equation), std::string::npos) << s;
  }
  ExpectRefused(
      HandBuiltNode("Einsum", {{2, 3}, {2, 3}}, {}, {{"equation", std::string("ij,jk->ik")}}),
      absl::StatusCode::kInvalidArgument, "extents");
  ExpectRefused(HandBuiltNode("Einsum", {{2, 3}}, {}, {{"equation", std::string("ijk->i")}}),
                absl::StatusCode::kInvalidArgument, "3 labels");
  ExpectRefused(HandBuiltNode("Einsum", {{2}}, {}, {{"equation", std::string("...ij->i")}}),
                absl::StatusCode::kInvalidArgument, "an ellipsis");
  // More multiply-adds than the reference takes on (1e15 here).
  ExpectRefused(HandBuiltNode("Einsum", {{100000, 100000}, {100000, 100000}}, {},
                              {{"equation", std::string("ij,jk->ik")}}),
                absl::StatusCode::kUnimplemented, "multiply-adds");
  // An ellipsis's dims broadcast only from extent 1.
  ExpectRefused(HandBuiltNode("Einsum", {{2, 1, 1}, {3, 1, 1}}, {},
                              {{"equation", std::string("...ij,...jk->...ik")}}),
                absl::StatusCode::kInvalidArgument, "extents");
}

TEST(IndexOpsTest, IntegerModByZeroIsAnErrorAndFloatFmodFollowsC) {
  OnnxModelBuilder b(18);
  b.Input("a", {2}, P::INT64).Input("b", {2}, P::INT64).Output("y", {2}, P::INT64);
  b.Node("Mod", {"a", "b"}, {"y"}, "mod");
  auto model = CompiledModel::Load(b.Save("mod0"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> a = {4, 5}, d = {3, 0};
  std::vector<int64_t> y(2);
  absl::Status s = (*model)->Run(1, {a.data(), d.data()}, {y.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("modulo by zero"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'mod'"), std::string::npos) << s;

  OnnxModelBuilder f(18);
  f.Input("a", {3}).Input("b", {3}).Output("y", {3});
  OnnxModelBuilder::AttrInt(f.Node("Mod", {"a", "b"}, {"y"}), "fmod", 1);
  const auto out = RunBoth(f.Save("fmod"), {F32({3}, {-7.5f, 7.5f, 1}), F32({3}, {2, -2, 0})});
  ASSERT_EQ(out.size(), 1u);
  const std::vector<float> got = Values<float>(out[0]);
  EXPECT_EQ(got[0], -1.5f);  // the dividend's sign
  EXPECT_EQ(got[1], 1.5f);
  EXPECT_TRUE(std::isnan(got[2]));
}

TEST(IndexOpsTest, WhereBroadcastsAllThreeInputs) {
  OnnxModelBuilder b(18);
  b.Input("c", {2, 1}, P::BOOL).Input("x", {1, 3}).Input("y", {}).Output("z", {2, 3});
  b.Node("Where", {"c", "x", "y"}, {"z"});
  const TypedTensor c =
      TypedTensor::FromValues(DataType::kBool, {2, 1}, std::vector<uint8_t>{1, 0});
  const auto out = RunBoth(b.Save("where"), {c, F32({1, 3}, {1, 2, 3}), F32({}, {-1})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{1, 2, 3, -1, -1, -1}));
}

}  // namespace
}  // namespace numaserve::engine
