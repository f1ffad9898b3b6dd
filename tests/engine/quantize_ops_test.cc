// QuantizeLinear and DequantizeLinear (QDQ models): per-tensor and per-axis,
// UINT8/INT8/INT32, rounding half to even, saturation, scale 0; a QDQ Conv
// through CompiledModel against the FP32 model on dequantized values; the
// INT8 origin constant folding records on a DequantizeLinear of an INT8
// weight (and not on other ones, nor on what is computed from it); and
// hostile nodes refused with errors, never crashes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/import/onnx_import.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using P = onnx::TensorProto;

template <typename T>
TypedTensor Make(DataType type, Shape shape, std::vector<T> values) {
  return TypedTensor::FromValues(type, std::move(shape), values);
}

template <typename T>
std::vector<T> Values(const TypedTensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.size());
}

template <typename T>
void AddRaw(OnnxModelBuilder& b, const std::string& name, int32_t type, const Shape& dims,
            const std::vector<T>& v) {
  b.RawInitializer(name, type, dims, v.data(), v.size() * sizeof(T));
}

// Runs the model on the reference executor and the compiled model; expects
// both to give the same types, shapes and bytes, and returns them.
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
  for (const TypedTensor& t : inputs) in.push_back(t.raw());
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

// x [1, n] FP32 -> QuantizeLinear(scale, zp of `zp_type`) -> y.
std::string QuantizeModel(int64_t n, float scale, int32_t zp_type, int64_t zp) {
  OnnxModelBuilder b;
  b.Input("x", {1, n}).Output("y", {1, n}, zp_type);
  b.Initializer("s", kernels::Tensor(Shape{}, {scale}));
  if (zp_type == P::UINT8) {
    AddRaw<uint8_t>(b, "zp", zp_type, {}, {static_cast<uint8_t>(zp)});
  } else {
    AddRaw<int8_t>(b, "zp", zp_type, {}, {static_cast<int8_t>(zp)});
  }
  b.Node("QuantizeLinear", {"x", "s", "zp"}, {"y"}, "q");
  return b.Save("quantize");
}

TEST(QuantizeLinearTest, RoundsHalfToEven) {
  const std::vector<float> x = {2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, -0.5f, 2.4f, 2.6f};
  const auto out =
      RunBoth(QuantizeModel(9, 1.0f, P::INT8, 0), {Make(DataType::kFloat32, {1, 9}, x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int8_t>(out[0]), (std::vector<int8_t>{2, 4, -2, -4, 0, 2, 0, 2, 3}));
}

TEST(QuantizeLinearTest, PerTensorUint8SaturatesWithZeroPoint) {
  // x / 0.5 + 128, clamped to [0, 255].
  const std::vector<float> x = {0.0f, 1.0f, -1.0f, 63.5f, 64.0f, -64.0f, -65.0f, 1e9f, -1e9f};
  const auto out =
      RunBoth(QuantizeModel(9, 0.5f, P::UINT8, 128), {Make(DataType::kFloat32, {1, 9}, x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, DataType::kUint8);
  EXPECT_EQ(Values<uint8_t>(out[0]), (std::vector<uint8_t>{128, 130, 126, 255, 255, 0, 0, 255, 0}));
}

TEST(QuantizeLinearTest, Int8Saturates) {
  const std::vector<float> x = {126.0f, 127.4f, 128.0f, 1000.0f, -128.0f, -129.0f, -1000.0f};
  const auto out =
      RunBoth(QuantizeModel(7, 1.0f, P::INT8, 0), {Make(DataType::kFloat32, {1, 7}, x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int8_t>(out[0]), (std::vector<int8_t>{126, 127, 127, 127, -128, -128, -128}));
}

TEST(QuantizeLinearTest, ScaleZeroSaturatesAndNanIsZero) {
  // 1/0 = inf -> max, -1/0 = -inf -> min, 0/0 = NaN -> 0.
  const std::vector<float> x = {1.0f, -1.0f, 0.0f};
  auto out = RunBoth(QuantizeModel(3, 0.0f, P::INT8, 0), {Make(DataType::kFloat32, {1, 3}, x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<int8_t>(out[0]), (std::vector<int8_t>{127, -128, 0}));
  out = RunBoth(QuantizeModel(3, 0.0f, P::UINT8, 0), {Make(DataType::kFloat32, {1, 3}, x)});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<uint8_t>(out[0]), (std::vector<uint8_t>{255, 0, 0}));
}

TEST(QuantizeLinearTest, DefaultZeroPointIsUint8) {
  OnnxModelBuilder b;
  b.Input("x", {1, 3}).Output("y", {1, 3}, P::UINT8);
  b.Initializer("s", kernels::Tensor(Shape{}, {2.0f}));
  b.Node("QuantizeLinear", {"x", "s"}, {"y"}, "q");
  const auto out =
      RunBoth(b.Save("quantize_default"),
              {Make(DataType::kFloat32, {1, 3}, std::vector<float>{3.0f, -4.0f, 9.0f})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<uint8_t>(out[0]), (std::vector<uint8_t>{2, 0, 4}));  // 1.5 -> 2, 4.5 -> 4
}

TEST(QuantizeLinearTest, PerAxis) {
  // x [2, 3, 2], axis 1: scales {1, 2, 4}, zero points {0, 10, -10}.
  OnnxModelBuilder b;
  b.Input("x", {2, 3, 2}).Output("y", {2, 3, 2}, P::INT8);
  b.Initializer("s", kernels::Tensor(Shape{3}, {1.0f, 2.0f, 4.0f}));
  AddRaw<int8_t>(b, "zp", P::INT8, {3}, {0, 10, -10});
  b.Node("QuantizeLinear", {"x", "s", "zp"}, {"y"}, "q");
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -600, 6000};
  const auto out = RunBoth(b.Save("quantize_axis"), {Make(DataType::kFloat32, {2, 3, 2}, x)});
  ASSERT_EQ(out.size(), 1u);
  // 3/2 = 1.5 -> 2, 5/4 = 1.25 -> 1, 6/4 = 1.5 -> 2, -3/2 = -1.5 -> -2, -600/4 -> -150 - 10.
  EXPECT_EQ(Values<int8_t>(out[0]),
            (std::vector<int8_t>{1, 2, 12, 12, -9, -8, -1, -2, 8, 8, -128, 127}));
}

TEST(DequantizeLinearTest, PerTensorUint8) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}, P::UINT8).Output("y", {1, 4});
  b.Initializer("s", kernels::Tensor(Shape{}, {0.5f}));
  AddRaw<uint8_t>(b, "zp", P::UINT8, {}, {128});
  b.Node("DequantizeLinear", {"x", "s", "zp"}, {"y"}, "dq");
  const auto out =
      RunBoth(b.Save("dequantize"),
              {Make(DataType::kUint8, {1, 4}, std::vector<uint8_t>{0, 128, 129, 255})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{-64.0f, 0.0f, 0.5f, 63.5f}));
}

TEST(DequantizeLinearTest, PerAxisInt8) {
  OnnxModelBuilder b;
  b.Input("x", {1, 2, 3}, P::INT8).Output("y", {1, 2, 3});
  b.Initializer("s", kernels::Tensor(Shape{3}, {1.0f, 0.5f, 0.25f}));
  AddRaw<int8_t>(b, "zp", P::INT8, {3}, {0, 1, -1});
  auto& n = b.Node("DequantizeLinear", {"x", "s", "zp"}, {"y"}, "dq");
  OnnxModelBuilder::AttrInt(n, "axis", -1);
  const auto out =
      RunBoth(b.Save("dequantize_axis"),
              {Make(DataType::kInt8, {1, 2, 3}, std::vector<int8_t>{-128, 127, 127, 3, -3, -128})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<float>(out[0]),
            (std::vector<float>{-128.0f, 63.0f, 32.0f, 3.0f, -2.0f, -31.75f}));
}

TEST(DequantizeLinearTest, Int32) {
  OnnxModelBuilder b;
  b.Input("x", {1, 3}, P::INT32).Output("y", {1, 3});
  b.Initializer("s", kernels::Tensor(Shape{}, {0.125f}));
  AddRaw<int32_t>(b, "zp", P::INT32, {}, {0});
  b.Node("DequantizeLinear", {"x", "s", "zp"}, {"y"}, "dq");
  const auto out =
      RunBoth(b.Save("dequantize_int32"),
              {Make(DataType::kInt32, {1, 3}, std::vector<int32_t>{-1000000, 8, 1 << 20})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{-125000.0f, 1.0f, 131072.0f}));
}

TEST(DequantizeLinearTest, QuantizeThenDequantizeRoundTrips) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {1, 4});
  b.Initializer("s", kernels::Tensor(Shape{}, {0.25f}));
  AddRaw<int8_t>(b, "zp", P::INT8, {}, {3});
  b.Node("QuantizeLinear", {"x", "s", "zp"}, {"q"}, "q");
  b.Node("DequantizeLinear", {"q", "s", "zp"}, {"y"}, "dq");
  const auto out =
      RunBoth(b.Save("qdq"),
              {Make(DataType::kFloat32, {1, 4}, std::vector<float>{0.3f, -1.0f, 100.0f, 0.125f})});
  ASSERT_EQ(out.size(), 1u);
  // 0.3/0.25 = 1.2 -> 1; 100 saturates at 127 - 3 = 124 steps; 0.5 -> 0.
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{0.25f, -1.0f, 31.0f, 0.0f}));
}

TEST(QdqModelTest, RowsStayIndependent) {
  // Per-axis along the features (not the rows): requests may share a run.
  OnnxModelBuilder b;
  b.Input("x", {-1, 4}).Output("y", {-1, 4});
  b.Initializer("s", kernels::Tensor(Shape{4}, {0.5f, 0.25f, 1.0f, 2.0f}));
  AddRaw<int8_t>(b, "zp", P::INT8, {4}, {0, 1, 2, 3});
  b.Node("QuantizeLinear", {"x", "s", "zp"}, {"q"}, "q");
  b.Node("DequantizeLinear", {"q", "s", "zp"}, {"y"}, "dq");
  auto graph = ImportOnnxModel(b.Save("qdq_rows"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto rows = CheckRowIndependence(*graph);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(rows->independent) << rows->reason;
}

// --- A QDQ Conv through CompiledModel ------------------------------------------

float FakeQuantizeUint8(float x, float scale, int zp) {
  const float q = std::clamp(std::nearbyint(x / scale) + zp, 0.0f, 255.0f);
  return (q - zp) * scale;
}

TEST(QdqModelTest, ConvMatchesFp32OnDequantizedValues) {
  const Shape x_shape = {1, 2, 5, 5}, w_shape = {3, 2, 3, 3};
  const float x_scale = 0.05f;
  const int x_zp = 128;
  const std::vector<float> w_scales = {0.01f, 0.02f, 0.005f};
  std::vector<int8_t> w_q(kernels::NumElements(w_shape));
  for (size_t i = 0; i < w_q.size(); ++i) w_q[i] = static_cast<int8_t>((i * 37) % 255 - 127);
  const kernels::Tensor bias(Shape{3}, {0.1f, -0.2f, 0.3f});
  kernels::Tensor x(x_shape);
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = std::sin(0.7f * i) * 4.0f;

  OnnxModelBuilder q;
  q.Input("x", x_shape).Output("y", {1, 3, 3, 3});
  q.Initializer("x_scale", kernels::Tensor(Shape{}, {x_scale}));
  AddRaw<uint8_t>(q, "x_zp", P::UINT8, {}, {static_cast<uint8_t>(x_zp)});
  AddRaw<int8_t>(q, "w_q", P::INT8, w_shape, w_q);
  q.Initializer("w_scale", kernels::Tensor(Shape{3}, w_scales));
  q.Initializer("b", bias);
  q.Node("QuantizeLinear", {"x", "x_scale", "x_zp"}, {"x_q"}, "q_x");
  q.Node("DequantizeLinear", {"x_q", "x_scale", "x_zp"}, {"x_dq"}, "dq_x");
  auto& dq_w = q.Node("DequantizeLinear", {"w_q", "w_scale"}, {"w"}, "dq_w");
  OnnxModelBuilder::AttrInt(dq_w, "axis", 0);
  q.Node("Conv", {"x_dq", "w", "b"}, {"y"}, "conv");

  // The FP32 model on the dequantized values.
  kernels::Tensor w(w_shape);
  const int64_t per_channel = kernels::NumElements(w_shape) / 3;
  for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = w_q[i] * w_scales[i / per_channel];
  kernels::Tensor x_dq = x;
  for (float& v : x_dq.data) v = FakeQuantizeUint8(v, x_scale, x_zp);
  OnnxModelBuilder f;
  f.Input("x", x_shape).Output("y", {1, 3, 3, 3});
  f.Initializer("w", w).Initializer("b", bias);
  f.Node("Conv", {"x", "w", "b"}, {"y"}, "conv");

  auto qdq = CompiledModel::Load(q.Save("qdq_conv"), {});
  ASSERT_TRUE(qdq.ok()) << qdq.status();
  auto fp32 = CompiledModel::Load(f.Save("fp32_conv"), {});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  std::vector<float> got(27), want(27);
  ASSERT_TRUE((*qdq)->Run(1, {x.data.data()}, {got.data()}).ok());
  ASSERT_TRUE((*fp32)->Run(1, {x_dq.data.data()}, {want.data()}).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << "element " << i;
  }
}

// --- The INT8 origin of folded weights ------------------------------------------------

// w_deq = DequantizeLinear(w_q [4, 3] of `type`, scale, zp) feeding a Gemm
// (transB) and, transposed, a MatMul.
std::string WeightModel(int32_t type, const std::vector<float>& scales, int64_t axis,
                        const std::vector<int64_t>* zp) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3}).Output("y", {-1, 4}).Output("z", {-1, 4});
  const std::vector<int8_t> w = {1, -2, 3, -4, 5, -6, 7, -8, 9, 127, -128, 0};
  AddRaw<int8_t>(b, "w_q", type, {4, 3}, w);
  b.Initializer("s", kernels::Tensor(scales.size() == 1 ? Shape{} : Shape{4}, scales));
  std::vector<std::string> in = {"w_q", "s"};
  if (zp != nullptr) {
    std::vector<int8_t> z(zp->begin(), zp->end());
    AddRaw<int8_t>(b, "zp", type, scales.size() == 1 ? Shape{} : Shape{4}, z);
    in.push_back("zp");
  }
  auto& n = b.Node("DequantizeLinear", in, {"w_deq"}, "dq_w");
  if (axis != 1) OnnxModelBuilder::AttrInt(n, "axis", axis);
  auto& g = b.Node("Gemm", {"x", "w_deq"}, {"y"}, "fc");
  OnnxModelBuilder::AttrInt(g, "transB", 1);
  auto& t = b.Node("Transpose", {"w_deq"}, {"w_t"}, "t");
  OnnxModelBuilder::AttrInts(t, "perm", {1, 0});
  b.Node("MatMul", {"x", "w_t"}, {"z"}, "mm");
  return b.Save("weight_origin");
}

const Constant* ConstantNamed(const Graph& graph, const std::string& name) {
  auto id = graph.FindValue(name);
  return id.has_value() ? graph.FindConstant(*id) : nullptr;
}

TEST(Int8OriginTest, SetForInt8PerAxisWithZeroZeroPoints) {
  const std::vector<float> scales = {0.5f, 0.25f, 2.0f, 0.125f};
  const std::vector<int64_t> zeros = {0, 0, 0, 0};
  auto graph = ImportOnnxModel(WeightModel(P::INT8, scales, 0, &zeros));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Constant* w = ConstantNamed(*graph, "w_deq");
  ASSERT_NE(w, nullptr) << "the DequantizeLinear did not fold";
  EXPECT_EQ(w->type, DataType::kFloat32);
  ASSERT_TRUE(w->int8_origin.has_value());
  const Constant::Int8Origin& origin = *w->int8_origin;
  EXPECT_EQ(origin.axis, 0);
  EXPECT_EQ(origin.scales, scales);
  const std::vector<int8_t> values = {1, -2, 3, -4, 5, -6, 7, -8, 9, 127, -128, 0};
  EXPECT_EQ(origin.values, values);
  ASSERT_EQ(w->f32.data.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(w->f32.data[i], values[i] * scales[i / 3]) << "element " << i;
  }
  // The transposed copy folded from it is a new constant without the origin.
  const Constant* w_t = ConstantNamed(*graph, "w_t");
  ASSERT_NE(w_t, nullptr);
  EXPECT_FALSE(w_t->int8_origin.has_value());
  // And the model still computes x * w^T both ways.
  auto out = RunReference(*graph, {kernels::Tensor(Shape{1, 3}, {1.0f, 2.0f, 3.0f})});
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> y = {0.5f * (1 - 4 + 9), 0.25f * (-4 + 10 - 18), 2.0f * (7 - 16 + 27),
                                0.125f * (127 - 256)};
  EXPECT_EQ((*out)[0].data, y);
  EXPECT_EQ((*out)[1].data, y);
}

TEST(Int8OriginTest, PerTensorWithoutZeroPoint) {
  auto graph = ImportOnnxModel(WeightModel(P::INT8, {0.5f}, 1, nullptr));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Constant* w = ConstantNamed(*graph, "w_deq");
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->int8_origin.has_value());
  EXPECT_EQ(w->int8_origin->axis, -1);
  EXPECT_EQ(w->int8_origin->scales, std::vector<float>{0.5f});
  EXPECT_EQ(w->int8_origin->values.size(), 12u);
}

TEST(Int8OriginTest, NotSetForUint8OrNonZeroZeroPoints) {
  const std::vector<float> scales = {0.5f, 0.25f, 2.0f, 0.125f};
  const std::vector<int64_t> zeros = {0, 0, 0, 0};
  auto graph = ImportOnnxModel(WeightModel(P::UINT8, scales, 0, &zeros));
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Constant* w = ConstantNamed(*graph, "w_deq");
  ASSERT_NE(w, nullptr);
  EXPECT_FALSE(w->int8_origin.has_value());

  const std::vector<int64_t> nonzero = {0, 1, 0, 0};
  graph = ImportOnnxModel(WeightModel(P::INT8, scales, 0, &nonzero));
  ASSERT_TRUE(graph.ok()) << graph.status();
  w = ConstantNamed(*graph, "w_deq");
  ASSERT_NE(w, nullptr);
  EXPECT_FALSE(w->int8_origin.has_value());
  EXPECT_EQ(w->f32.data[3], (-4 - 1) * 0.25f);  // (x - zp) * scale
}

// --- Hostile nodes -------------------------------------------------------------------

// A graph holding one QuantizeLinear / DequantizeLinear: x a runtime input
// of x.type, the scale and zero point constants.
struct OneNode {
  Graph graph;
  Node& node() { return graph.nodes()[0]; }
};

OneNode MakeNode(const std::string& op, DataType x_type, const Shape& x_shape,
                 const TypedTensor& scale, const TypedTensor* zp, DataType out_type) {
  OneNode g;
  const ValueId x = g.graph.GetOrAddValue("x");
  g.graph.value(x).type = x_type;
  g.graph.value(x).shape = x_shape;
  g.graph.value(x).has_shape = true;
  g.graph.inputs().push_back(x);
  const ValueId s = g.graph.GetOrAddValue("scale");
  g.graph.value(s).type = scale.type;
  g.graph.SetConstant(s, ConstantFromTyped(scale));
  Node node;
  node.name = "n";
  node.op_type = op;
  node.inputs = {x, s};
  if (zp != nullptr) {
    const ValueId z = g.graph.GetOrAddValue("zp");
    g.graph.value(z).type = zp->type;
    g.graph.SetConstant(z, ConstantFromTyped(*zp));
    node.inputs.push_back(z);
  }
  const ValueId y = g.graph.GetOrAddValue("y");
  g.graph.value(y).type = out_type;
  node.outputs = {y};
  g.graph.nodes().push_back(node);
  g.graph.outputs().push_back(y);
  return g;
}

// Validation, shape inference and the typed reference (on zero-filled x) in
// turn: the first error, or OK when all pass.
absl::Status Check(OneNode& g) {
  const Node& node = g.node();
  const OpSchema* schema = FindOpSchema(node.op_type);
  if (schema == nullptr) return absl::NotFoundError(node.op_type);
  if (absl::Status s = schema->validate(g.graph, node); !s.ok()) return s;
  std::vector<const Shape*> shapes;
  std::vector<TypedTensor> held;
  held.reserve(node.inputs.size());
  std::vector<const TypedTensor*> in;
  for (ValueId v : node.inputs) {
    if (const Constant* c = g.graph.FindConstant(v); c != nullptr) {
      shapes.push_back(&c->shape);
      auto t = ConstantAsTyped(*c);
      if (!t.ok()) return t.status();
      held.push_back(*t);
    } else {
      shapes.push_back(&g.graph.value(v).shape);
      held.emplace_back(g.graph.value(v).type, g.graph.value(v).shape);
    }
    in.push_back(&held.back());
  }
  if (auto s = schema->infer_shapes(g.graph, node, shapes); !s.ok()) return s.status();
  return RunTypedNode(g.graph, node, in).status();
}

TypedTensor FloatScale(Shape shape, std::vector<float> v) {
  return Make(DataType::kFloat32, std::move(shape), std::move(v));
}

void ExpectError(absl::Status s, absl::StatusCode code, const std::string& words) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "node 'n'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), words)) << s;
}

TEST(QdqHostileTest, WellFormedNodesPass) {
  const TypedTensor zp = Make(DataType::kInt8, {3}, std::vector<int8_t>{0, 1, 2});
  OneNode q = MakeNode("QuantizeLinear", DataType::kFloat32, {2, 3}, FloatScale({3}, {1, 2, 3}),
                       &zp, DataType::kInt8);
  EXPECT_TRUE(Check(q).ok()) << Check(q);
  OneNode dq = MakeNode("DequantizeLinear", DataType::kInt8, {2, 3}, FloatScale({3}, {1, 2, 3}),
                        &zp, DataType::kFloat32);
  EXPECT_TRUE(Check(dq).ok()) << Check(dq);
}

TEST(QdqHostileTest, ScaleLengthDiffersFromAxisDim) {
  OneNode g = MakeNode("QuantizeLinear", DataType::kFloat32, {2, 4}, FloatScale({3}, {1, 2, 3}),
                       nullptr, DataType::kUint8);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "has 4 along axis 1");
  g = MakeNode("DequantizeLinear", DataType::kInt8, {2, 4}, FloatScale({2}, {1, 2}), nullptr,
               DataType::kFloat32);
  g.node().attributes["axis"] = int64_t{1};
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "the scale has 2 values");
}

TEST(QdqHostileTest, AxisOutOfRange) {
  OneNode g = MakeNode("DequantizeLinear", DataType::kUint8, {2, 3}, FloatScale({3}, {1, 2, 3}),
                       nullptr, DataType::kFloat32);
  g.node().attributes["axis"] = int64_t{2};
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "axis 2 is out of range");
  g.node().attributes["axis"] = int64_t{-3};
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "axis -3 is out of range");
}

TEST(QdqHostileTest, ZeroPointShapeOrTypeMismatch) {
  const TypedTensor zp2 = Make(DataType::kInt8, {2}, std::vector<int8_t>{0, 0});
  OneNode g = MakeNode("DequantizeLinear", DataType::kInt8, {2, 3}, FloatScale({3}, {1, 2, 3}),
                       &zp2, DataType::kFloat32);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "must have the same shape");
  const TypedTensor zp_u8 = Make(DataType::kUint8, {}, std::vector<uint8_t>{0});
  g = MakeNode("DequantizeLinear", DataType::kInt8, {2, 3}, FloatScale({}, {1}), &zp_u8,
               DataType::kFloat32);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "same type");
  // INT32 x: the zero point must be 0.
  const TypedTensor zp_i32 = Make(DataType::kInt32, {}, std::vector<int32_t>{5});
  g = MakeNode("DequantizeLinear", DataType::kInt32, {2, 3}, FloatScale({}, {1}), &zp_i32,
               DataType::kFloat32);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "zero point of 0");
  // A QuantizeLinear's zero point of a type it cannot produce.
  const TypedTensor zp_i64 = Make(DataType::kInt64, {}, std::vector<int64_t>{0});
  g = MakeNode("QuantizeLinear", DataType::kFloat32, {2, 3}, FloatScale({}, {1}), &zp_i64,
               DataType::kInt64);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "UINT8, INT8");
}

TEST(QdqHostileTest, NonFloatScaleOrBadXType) {
  OneNode g =
      MakeNode("QuantizeLinear", DataType::kFloat32, {2, 3},
               Make(DataType::kInt64, {}, std::vector<int64_t>{2}), nullptr, DataType::kUint8);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "the scale is INT64");
  g = MakeNode("DequantizeLinear", DataType::kFloat32, {2, 3}, FloatScale({}, {1}), nullptr,
               DataType::kFloat32);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "x is FP32");
  g = MakeNode("QuantizeLinear", DataType::kInt64, {2, 3}, FloatScale({}, {1}), nullptr,
               DataType::kUint8);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "x is INT64");
}

TEST(QdqHostileTest, ScaleOfRankTwo) {
  OneNode g = MakeNode("QuantizeLinear", DataType::kFloat32, {2, 3},
                       FloatScale({2, 3}, {1, 1, 1, 1, 1, 1}), nullptr, DataType::kUint8);
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "scalar (per tensor) or 1-D");
}

TEST(QdqHostileTest, Float8AndInt4AndBlockedAreUnsupported) {
  OneNode g = MakeNode("QuantizeLinear", DataType::kFloat32, {2, 3}, FloatScale({}, {1}), nullptr,
                       DataType::kUnknown);
  g.node().attributes["output_dtype"] = int64_t{17};  // FLOAT8E4M3FN
  ExpectError(Check(g), absl::StatusCode::kUnimplemented, "FLOAT8");
  g.node().attributes["output_dtype"] = int64_t{22};  // INT4
  ExpectError(Check(g), absl::StatusCode::kUnimplemented, "INT4");
  g.node().attributes["output_dtype"] = int64_t{99};
  ExpectError(Check(g), absl::StatusCode::kInvalidArgument, "not a quantized type");
  g.node().attributes["output_dtype"] = int64_t{3};
  g.node().attributes["saturate"] = int64_t{1};  // accepted (it only concerns FLOAT8)
  EXPECT_TRUE(Check(g).ok()) << Check(g);
  g.node().attributes["block_size"] = int64_t{2};
  ExpectError(Check(g), absl::StatusCode::kUnimplemented, "blocked quantization");

  // A FLOAT8 zero point reads as a constant of no known type.
  g = MakeNode("DequantizeLinear", DataType::kInt8, {2, 3}, FloatScale({}, {1}), nullptr,
               DataType::kFloat32);
  const ValueId z = g.graph.GetOrAddValue("zp8");
  Constant fp8;
  fp8.shape = {};
  g.graph.SetConstant(z, fp8);
  g.node().inputs.push_back(z);
  EXPECT_EQ(FindOpSchema("DequantizeLinear")->validate(g.graph, g.node()).code(),
            absl::StatusCode::kUnimplemented);
}

TEST(QdqHostileTest, TypedReferenceRefusesMissingOrMismatchedInputs) {
  OneNode g = MakeNode("DequantizeLinear", DataType::kInt8, {2, 3}, FloatScale({3}, {1, 2, 3}),
                       nullptr, DataType::kFloat32);
  const TypedTensor x(DataType::kInt8, {2, 3});
  const TypedTensor bad_scale = FloatScale({4}, {1, 2, 3, 4});
  EXPECT_FALSE(RunTypedNode(g.graph, g.node(), {&x, nullptr}).ok());
  EXPECT_FALSE(RunTypedNode(g.graph, g.node(), {&x}).ok());
  EXPECT_FALSE(RunTypedNode(g.graph, g.node(), {&x, &bad_scale}).ok());
  const TypedTensor x_f32(DataType::kFloat32, {2, 3});
  const TypedTensor scale = FloatScale({3}, {1, 2, 3});
  EXPECT_FALSE(RunTypedNode(g.graph, g.node(), {&x_f32, &scale}).ok());
}

TEST(QdqHostileTest, ImportRefusesMismatchedScaleLength) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {1, 4}, P::UINT8);
  b.Initializer("s", kernels::Tensor(Shape{3}, {1, 2, 3}));
  b.Node("QuantizeLinear", {"x", "s"}, {"y"}, "q");
  auto graph = ImportOnnxModel(b.Save("hostile_scale"));
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument) << graph.status();
  EXPECT_TRUE(absl::StrContains(graph.status().message(), "node 'q'")) << graph.status();
  auto model = CompiledModel::Load(b.Save("hostile_scale"), {});
  EXPECT_FALSE(model.ok());
}

}  // namespace
}  // namespace numaserve::engine
