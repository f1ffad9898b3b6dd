// Runtime values of types other than FP32: typed references through the
// reference executor and the compiled model (which must agree), against
// hand-computed values; FP16/BF16 rounding; exact INT64 arithmetic and
// constant folding above 2^53; load-time refusal of a non-FP32 value into
// an FP32-only op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"
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

// Runs the model on the reference executor and the compiled model; checks
// that both give the same types, shapes and bytes, and returns them.
std::vector<TypedTensor> RunBoth(const std::string& path, int64_t batch,
                                 const std::vector<TypedTensor>& inputs) {
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
  const auto shapes = (*model)->OutputShapes(batch);
  for (size_t j = 0; j < shapes.size(); ++j) {
    out.emplace_back((*model)->info().outputs[j].type, shapes[j]);
  }
  std::vector<void*> out_ptrs;
  for (TypedTensor& t : out) out_ptrs.push_back(t.bytes.data());
  absl::Status s = (*model)->Run(batch, in, out_ptrs);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(out.size(), ref->size());
  for (size_t j = 0; j < out.size() && j < ref->size(); ++j) {
    EXPECT_EQ(out[j].type, (*ref)[j].type) << "output " << j;
    EXPECT_EQ(out[j].shape, (*ref)[j].shape) << "output " << j;
    EXPECT_EQ(out[j].bytes, (*ref)[j].bytes) << "output " << j << " differs from the reference";
  }
  return out;
}

TEST(TypedTensorTest, HalfRoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                          // rounds up to infinity
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);             // below half of it
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(BFloat16ToFloat(0x4049), 3.140625f);
}

TEST(TypedTensorTest, CastSemantics) {
  const TypedTensor f = Make<float>(DataType::kFloat32, {5}, {-2.7f, 0.0f, 3.9f, 1e20f, NAN});
  EXPECT_EQ(Values<int32_t>(f.CastTo(DataType::kInt32)),
            (std::vector<int32_t>{-2, 0, 3, std::numeric_limits<int32_t>::max(), 0}));
  EXPECT_EQ(Values<bool>(f.CastTo(DataType::kBool)),
            (std::vector<bool>{true, false, true, true, true}));
  const int64_t big = (int64_t{1} << 62) + 7;
  const TypedTensor i = Make<int64_t>(DataType::kInt64, {2}, {big, -1});
  EXPECT_EQ(Values<double>(i.CastTo(DataType::kFloat64)),
            (std::vector<double>{static_cast<double>(big), -1.0}));
  EXPECT_EQ(Values<uint8_t>(i.CastTo(DataType::kUint8)), (std::vector<uint8_t>{7, 255}));
}

TEST(TypedTensorTest, CastBetweenEveryPairOfTypes) {
  // Small non-negative integers are exact in every type: each pair must
  // keep them (BOOL: 0 stays false, the rest become true).
  const std::vector<DataType> types = {DataType::kBool,    DataType::kUint8,    DataType::kInt8,
                                       DataType::kInt16,   DataType::kUint16,   DataType::kInt32,
                                       DataType::kUint32,  DataType::kInt64,    DataType::kUint64,
                                       DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                                       DataType::kFloat64};
  const TypedTensor source = Make<float>(DataType::kFloat32, {5}, {0.0f, 1.0f, 2.0f, 7.0f, 100.0f});
  for (DataType from : types) {
    const TypedTensor x = source.CastTo(from);
    for (DataType to : types) {
      const TypedTensor y = x.CastTo(to);
      ASSERT_EQ(y.type, to);
      ASSERT_EQ(y.bytes.size(), 5 * DataTypeSize(to));
      for (int64_t i = 0; i < 5; ++i) {
        const double want = (from == DataType::kBool || to == DataType::kBool)
                                ? (source.GetDouble(i) != 0 ? 1.0 : 0.0)
                                : source.GetDouble(i);
        EXPECT_EQ(y.GetDouble(i), want)
            << DataTypeName(from) << " -> " << DataTypeName(to) << " element " << i;
      }
    }
  }
}

TEST(TypedOpsTest, Int64ArithmeticIsExactAboveTwoTo53) {
  // y = ((a + b) * c - a) / d, elementwise, INT64 all the way.
  OnnxModelBuilder builder;
  builder.Input("a", {3}, P::INT64).Input("b", {3}, P::INT64).Input("c", {3}, P::INT64);
  builder.Input("d", {3}, P::INT64).Output("y", {3}, P::INT64);
  builder.Node("Add", {"a", "b"}, {"s"});
  builder.Node("Mul", {"s", "c"}, {"m"});
  builder.Node("Sub", {"m", "a"}, {"t"});
  builder.Node("Div", {"t", "d"}, {"y"});
  const int64_t big = (int64_t{1} << 60) + 3;  // a float or double detour loses the +3
  const auto out = RunBoth(builder.Save("typed_int64"), 1,
                           {Make<int64_t>(DataType::kInt64, {3}, {big, -7, 5}),
                            Make<int64_t>(DataType::kInt64, {3}, {1, 0, 0}),
                            Make<int64_t>(DataType::kInt64, {3}, {2, 2, 3}),
                            Make<int64_t>(DataType::kInt64, {3}, {1, 2, -4})});
  ASSERT_EQ(out.size(), 1u);
  // (big+1)*2 - big = big + 2; (-7*2 + 7)/2 = -7/2 truncates to -3;
  // (15-5)/-4 = -2.5 truncates to -2.
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{big + 2, -3, -2}));
}

TEST(TypedOpsTest, IntegerDivisionByZeroIsAnError) {
  OnnxModelBuilder builder;
  builder.Input("a", {2}, P::INT32).Input("b", {2}, P::INT32).Output("y", {2}, P::INT32);
  builder.Node("Div", {"a", "b"}, {"y"}, "div");
  auto model = CompiledModel::Load(builder.Save("typed_div0"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> a = {4, 5}, b = {2, 0};
  std::vector<int32_t> y(2);
  absl::Status s = (*model)->Run(1, {a.data(), b.data()}, {y.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("division by zero"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'div'"), std::string::npos) << s;
}

TEST(TypedOpsTest, IntegerModTakesTheDivisorsSignOrTruncates) {
  OnnxModelBuilder builder;
  builder.Input("a", {4}, P::INT32).Input("b", {4}, P::INT32);
  builder.Output("mod", {4}, P::INT32).Output("fmod", {4}, P::INT32);
  builder.Node("Mod", {"a", "b"}, {"mod"});
  auto& fmod = builder.Node("Mod", {"a", "b"}, {"fmod"});
  OnnxModelBuilder::AttrInt(fmod, "fmod", 1);
  const auto out = RunBoth(builder.Save("typed_mod"), 1,
                           {Make<int32_t>(DataType::kInt32, {4}, {-7, 7, -7, 6}),
                            Make<int32_t>(DataType::kInt32, {4}, {3, -3, -3, 4})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<int32_t>(out[0]), (std::vector<int32_t>{2, -2, -1, 2}));
  EXPECT_EQ(Values<int32_t>(out[1]), (std::vector<int32_t>{-1, 1, -1, 2}));
}

TEST(TypedOpsTest, ConstantFoldingKeepsInt64Exact) {
  // y = x + (c1 + c2): the constant sum is folded at import, and so is
  // n = Shape(x), a constant graph output.
  OnnxModelBuilder builder;
  builder.Input("x", {2}, P::INT64).Output("y", {2}, P::INT64).Output("n", {1}, P::INT64);
  const std::vector<int64_t> c1 = {(int64_t{1} << 55) + 1, -3}, c2 = {2, (int64_t{1} << 58) + 5};
  builder.RawInitializer("c1", P::INT64, {2}, c1.data(), 16);
  builder.RawInitializer("c2", P::INT64, {2}, c2.data(), 16);
  builder.Node("Add", {"c1", "c2"}, {"c"});
  builder.Node("Add", {"x", "c"}, {"y"});
  builder.Node("Shape", {"x"}, {"n"});
  const std::string path = builder.Save("typed_fold");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->nodes().size(), 1u);  // the constant Add was folded
  const auto out = RunBoth(path, 1, {Make<int64_t>(DataType::kInt64, {2}, {1, 1})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<int64_t>(out[0]),
            (std::vector<int64_t>{(int64_t{1} << 55) + 4, (int64_t{1} << 58) + 3}));
  EXPECT_EQ(Values<int64_t>(out[1]), (std::vector<int64_t>{2}));
}

TEST(TypedOpsTest, EmbeddingFromInt64IdsAndMaskCastToFloat) {
  // BERT's input stage: rows of the embedding table picked by int64 ids
  // (negative ids count from the end), times the int64 attention mask cast
  // to FP32.
  OnnxModelBuilder builder;
  builder.Input("input_ids", {-1, 3}, P::INT64).Input("attention_mask", {-1, 3}, P::INT64);
  builder.Output("y", {-1, 3, 2});
  kernels::Tensor table({5, 2}, {0, 1, 10, 11, 20, 21, 30, 31, 40, 41});
  builder.Initializer("table", table);
  builder.Int64Initializer("axes", {2});
  builder.Node("Gather", {"table", "input_ids"}, {"emb"});
  auto& cast = builder.Node("Cast", {"attention_mask"}, {"maskf"});
  OnnxModelBuilder::AttrInt(cast, "to", P::FLOAT);
  builder.Node("Unsqueeze", {"maskf", "axes"}, {"mask3"});
  builder.Node("Mul", {"emb", "mask3"}, {"y"});
  const auto out = RunBoth(builder.Save("typed_embedding"), 2,
                           {Make<int64_t>(DataType::kInt64, {2, 3}, {0, 4, -1, 2, 3, 1}),
                            Make<int64_t>(DataType::kInt64, {2, 3}, {1, 1, 0, 1, 0, 1})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].type, DataType::kFloat32);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{0, 1, 40, 41, 0, 0, 20, 21, 0, 0, 10, 11}));
}

TEST(TypedOpsTest, ExportedBertInputStageFoldsItsShapeArithmetic) {
  // The input stage of a BERT exported from PyTorch: position ids sliced to
  // the sequence length read from Shape(input_ids) (batch-independent, so
  // folded at import though the batch is dynamic), word + position
  // embeddings, and the extended attention mask (1 - mask) * -10000 from
  // the int64 mask.
  OnnxModelBuilder builder;
  builder.Input("input_ids", {-1, 3}, P::INT64).Input("attention_mask", {-1, 3}, P::INT64);
  builder.Output("emb", {-1, 3, 2}).Output("ext", {-1, 1, 1, 3});
  builder.Initializer("word", kernels::Tensor({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31}));
  builder.Initializer("pos_table",
                      kernels::Tensor({5, 2}, {100, 200, 300, 400, 500, 600, 700, 800, 900, 1000}));
  const std::vector<int64_t> positions = {0, 1, 2, 3, 4};
  builder.RawInitializer("position_ids", P::INT64, {1, 5}, positions.data(), 40);
  const int64_t one = 1;
  builder.RawInitializer("one", P::INT64, {}, &one, 8);
  builder.Int64Initializer("zero1", {0}).Int64Initializer("one1", {1});
  builder.Int64Initializer("axes0", {0}).Int64Initializer("axes12", {1, 2});
  builder.Initializer("onef", kernels::Tensor({}, {1.0f}));
  builder.Initializer("big", kernels::Tensor({}, {-10000.0f}));
  builder.Node("Shape", {"input_ids"}, {"shape"});
  builder.Node("Gather", {"shape", "one"}, {"seq"});
  builder.Node("Unsqueeze", {"seq", "axes0"}, {"seq1"});
  builder.Node("Slice", {"position_ids", "zero1", "seq1", "one1"}, {"pos"});
  builder.Node("Gather", {"word", "input_ids"}, {"w"});
  builder.Node("Gather", {"pos_table", "pos"}, {"p"});
  builder.Node("Add", {"w", "p"}, {"emb"});
  builder.Node("Unsqueeze", {"attention_mask", "axes12"}, {"m4"});
  auto& cast = builder.Node("Cast", {"m4"}, {"mf"});
  OnnxModelBuilder::AttrInt(cast, "to", P::FLOAT);
  builder.Node("Sub", {"onef", "mf"}, {"inv"});
  builder.Node("Mul", {"inv", "big"}, {"ext"});
  const std::string path = builder.Save("typed_bert_inputs");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (const Node& node : graph->nodes()) {
    EXPECT_NE(node.op_type, "Shape") << "the sequence length should fold";
    EXPECT_NE(node.op_type, "Slice") << "the position ids should fold";
  }
  const auto out = RunBoth(path, 2,
                           {Make<int64_t>(DataType::kInt64, {2, 3}, {3, 0, 2, 1, 1, 0}),
                            Make<int64_t>(DataType::kInt64, {2, 3}, {1, 1, 0, 1, 0, 0})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<float>(out[0]), (std::vector<float>{130, 231, 300, 401, 520, 621,  //
                                                       110, 211, 310, 411, 500, 601}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{0, 0, -10000, 0, -10000, -10000}));
}

TEST(TypedOpsTest, GatherIndexOutOfRangeIsAnError) {
  OnnxModelBuilder builder;
  builder.Input("ids", {2}, P::INT64).Output("y", {2, 2});
  builder.Initializer("table", kernels::Tensor({3, 2}, {0, 1, 2, 3, 4, 5}));
  builder.Node("Gather", {"table", "ids"}, {"y"}, "gather");
  auto model = CompiledModel::Load(builder.Save("typed_gather_range"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> ids = {1, 3};
  std::vector<float> y(4);
  absl::Status s = (*model)->Run(1, {ids.data()}, {y.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s;
}

TEST(TypedOpsTest, BoolOutputFromComparison) {
  OnnxModelBuilder builder;
  builder.Input("x", {-1, 3}).Output("pos", {-1, 3}, P::BOOL).Output("z", {-1, 3});
  builder.Initializer("zero", kernels::Tensor({1}, {0.0f}));
  builder.Node("Greater", {"x", "zero"}, {"pos"});
  builder.Node("Where", {"pos", "x", "zero"}, {"z"});
  const auto out = RunBoth(builder.Save("typed_bool"), 2,
                           {Make<float>(DataType::kFloat32, {2, 3}, {-1, 2, 0, 3.5f, -0.5f, 7})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].type, DataType::kBool);
  EXPECT_EQ(out[0].bytes, (std::vector<uint8_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(Values<float>(out[1]), (std::vector<float>{0, 2, 0, 3.5f, 0, 7}));
}

TEST(TypedOpsTest, MaxMinPowClipOfSeveralTypes) {
  OnnxModelBuilder builder;
  builder.Input("a", {2, 2}, P::UINT8).Input("b", {2}, P::UINT8).Input("c", {1}, P::UINT8);
  builder.Input("base", {3}, P::INT64).Input("exp", {3}, P::INT64);
  builder.Input("h", {3}, P::FLOAT16).Input("i8", {4}, P::INT8);
  builder.Output("max", {2, 2}, P::UINT8).Output("min", {2, 2}, P::UINT8);
  builder.Output("pow", {3}, P::INT64).Output("hmax", {3}, P::FLOAT16);
  builder.Output("clip", {4}, P::INT8);
  const int8_t lo = -2, hi = 5;
  builder.RawInitializer("lo", P::INT8, {}, &lo, 1).RawInitializer("hi", P::INT8, {}, &hi, 1);
  builder.Node("Max", {"a", "b", "c"}, {"max"});
  builder.Node("Min", {"a", "b"}, {"min"});
  builder.Node("Pow", {"base", "exp"}, {"pow"});
  builder.Node("Max", {"h", "h"}, {"hmax"});
  builder.Node("Clip", {"i8", "lo", "hi"}, {"clip"});
  const TypedTensor h = Make<uint16_t>(DataType::kFloat16, {3},
                                       {FloatToHalf(1.5f), FloatToHalf(-2.0f), FloatToHalf(0.1f)});
  const auto out = RunBoth(
      builder.Save("typed_mixed"), 1,
      {Make<uint8_t>(DataType::kUint8, {2, 2}, {200, 3, 7, 255}),
       Make<uint8_t>(DataType::kUint8, {2}, {100, 9}), Make<uint8_t>(DataType::kUint8, {1}, {8}),
       Make<int64_t>(DataType::kInt64, {3}, {3, -2, 7}),
       Make<int64_t>(DataType::kInt64, {3}, {39, 3, 0}), h,
       Make<int8_t>(DataType::kInt8, {4}, {-128, -1, 4, 127})});
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(Values<uint8_t>(out[0]), (std::vector<uint8_t>{200, 9, 100, 255}));
  EXPECT_EQ(Values<uint8_t>(out[1]), (std::vector<uint8_t>{100, 3, 7, 9}));
  // 3^39 = 4052555153018976267 needs all 62 bits.
  EXPECT_EQ(Values<int64_t>(out[2]), (std::vector<int64_t>{4052555153018976267LL, -8, 1}));
  EXPECT_EQ(out[3].bytes, h.bytes);
  EXPECT_EQ(Values<int8_t>(out[4]), (std::vector<int8_t>{-2, -1, 4, 5}));
}

TEST(TypedOpsTest, DataMovementOfInt64KeepsEveryBit) {
  // Transpose, Concat and Pad move int64 elements whose
  // values a float detour would round.
  OnnxModelBuilder builder;
  builder.Input("x", {2, 3}, P::INT64).Output("y", {3, 4}, P::INT64);
  builder.Output("p", {2, 5}, P::INT64);
  builder.Int64Initializer("pads", {0, 1, 0, 1});
  const int64_t fill = (int64_t{1} << 59) + 1;
  builder.RawInitializer("fill", P::INT64, {}, &fill, 8);
  auto& t = builder.Node("Transpose", {"x"}, {"xt"});
  OnnxModelBuilder::AttrInts(t, "perm", {1, 0});
  auto& c = builder.Node("Concat", {"xt", "xt"}, {"y"});
  OnnxModelBuilder::AttrInt(c, "axis", 1);
  builder.Node("Pad", {"x", "pads", "fill"}, {"p"});
  const int64_t b = int64_t{1} << 61;
  const auto out = RunBoth(
      builder.Save("typed_move"), 1,
      {Make<int64_t>(DataType::kInt64, {2, 3}, {b + 1, b + 2, b + 3, -b - 1, -b - 2, -b - 3})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<int64_t>(out[0]),
            (std::vector<int64_t>{b + 1, -b - 1, b + 1, -b - 1, b + 2, -b - 2, b + 2, -b - 2, b + 3,
                                  -b - 3, b + 3, -b - 3}));
  EXPECT_EQ(Values<int64_t>(out[1]), (std::vector<int64_t>{fill, b + 1, b + 2, b + 3, fill, fill,
                                                           -b - 1, -b - 2, -b - 3, fill}));
}

TEST(TypedOpsTest, MaxPoolUint8WithIndices) {
  OnnxModelBuilder builder;
  builder.Input("x", {1, 1, 3, 3}, P::UINT8);
  builder.Output("y", {1, 1, 2, 2}, P::UINT8).Output("i", {1, 1, 2, 2}, P::INT64);
  auto& pool = builder.Node("MaxPool", {"x"}, {"y", "i"});
  OnnxModelBuilder::AttrInts(pool, "kernel_shape", {2, 2});
  OnnxModelBuilder::AttrInt(pool, "storage_order", 1);
  // 1 9 3
  // 4 5 6
  // 7 8 250
  const auto out =
      RunBoth(builder.Save("typed_maxpool"), 1,
              {Make<uint8_t>(DataType::kUint8, {1, 1, 3, 3}, {1, 9, 3, 4, 5, 6, 7, 8, 250})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Values<uint8_t>(out[0]), (std::vector<uint8_t>{9, 9, 8, 250}));
  // Column-major positions (h + w * H): 9 at (0,1) -> 3, 8 at (2,1) -> 5,
  // 250 at (2,2) -> 8.
  EXPECT_EQ(Values<int64_t>(out[1]), (std::vector<int64_t>{3, 3, 5, 8}));
}

TEST(TypedOpsTest, ReductionsSplitExpandAndLogicOfIntegers) {
  OnnxModelBuilder builder;
  builder.Input("x", {2, 3}, P::INT64).Input("b", {3}, P::BOOL).Input("i", {3}, P::INT32);
  builder.Output("sum", {2}, P::INT64).Output("max", {1, 3}, P::INT64);
  builder.Output("lo", {2, 1}, P::INT64).Output("hi", {2, 2}, P::INT64);
  builder.Output("wide", {2, 3}, P::INT32).Output("nb", {3}, P::BOOL);
  builder.Output("neg", {3}, P::INT32).Output("abs", {3}, P::INT32);
  builder.Int64Initializer("axis1", {1});
  builder.Int64Initializer("parts", {1, 2}).Int64Initializer("shape", {2, 3});
  auto& sum = builder.Node("ReduceSum", {"x", "axis1"}, {"sum"});
  OnnxModelBuilder::AttrInt(sum, "keepdims", 0);
  auto& max = builder.Node("ReduceMax", {"x"}, {"max"});  // axes: an attribute before opset 18
  OnnxModelBuilder::AttrInts(max, "axes", {0});
  auto& split = builder.Node("Split", {"x", "parts"}, {"lo", "hi"});
  OnnxModelBuilder::AttrInt(split, "axis", 1);
  builder.Node("Expand", {"i", "shape"}, {"wide"});
  builder.Node("Not", {"b"}, {"nb"});
  builder.Node("Neg", {"i"}, {"neg"});
  builder.Node("Abs", {"i"}, {"abs"});
  const int64_t b = (int64_t{1} << 60) + 1;
  const auto out =
      RunBoth(builder.Save("typed_reduce"), 1,
              {Make<int64_t>(DataType::kInt64, {2, 3}, {b, b, 5, -b, 2, -3}),
               Make<uint8_t>(DataType::kBool, {3}, {1, 0, 1}),
               Make<int32_t>(DataType::kInt32, {3}, {-5, 0, std::numeric_limits<int32_t>::max()})});
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(Values<int64_t>(out[0]), (std::vector<int64_t>{2 * b + 5, -b - 1}));
  EXPECT_EQ(Values<int64_t>(out[1]), (std::vector<int64_t>{b, b, 5}));
  EXPECT_EQ(Values<int64_t>(out[2]), (std::vector<int64_t>{b, -b}));
  EXPECT_EQ(Values<int64_t>(out[3]), (std::vector<int64_t>{b, 5, 2, -3}));
  const int32_t m = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(Values<int32_t>(out[4]), (std::vector<int32_t>{-5, 0, m, -5, 0, m}));
  EXPECT_EQ(Values<bool>(out[5]), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(Values<int32_t>(out[6]), (std::vector<int32_t>{5, 0, -m}));
  EXPECT_EQ(Values<int32_t>(out[7]), (std::vector<int32_t>{5, 0, m}));
}

TEST(TypedOpsTest, MovingMoreThanTwoTo24ElementsStaysExact) {
  // Element positions above 2^24 are not exact in FP32: Concat's typed
  // reference moves them in two passes. Every element is checked.
  const int64_t n0 = (int64_t{1} << 23) + 3, n1 = (int64_t{1} << 23) + 5;
  OnnxModelBuilder builder;
  builder.Input("a", {n0}, P::UINT8).Input("b", {n1}, P::UINT8);
  builder.Output("y", {n0 + n1}, P::UINT8);
  auto& concat = builder.Node("Concat", {"b", "a"}, {"y"});
  OnnxModelBuilder::AttrInt(concat, "axis", 0);
  auto graph = ImportOnnxModel(builder.Save("typed_big_concat"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<uint8_t> a(n0), b(n1);
  for (int64_t i = 0; i < n0; ++i) a[i] = static_cast<uint8_t>((i * 7) % 251);
  for (int64_t i = 0; i < n1; ++i) b[i] = static_cast<uint8_t>((i * 13 + 1) % 241);
  auto out = RunReferenceTyped(
      *graph, {Make<uint8_t>(DataType::kUint8, {n0}, a), Make<uint8_t>(DataType::kUint8, {n1}, b)});
  ASSERT_TRUE(out.ok()) << out.status();
  const uint8_t* y = (*out)[0].data<uint8_t>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n1; ++i) wrong += y[i] != b[i];
  for (int64_t i = 0; i < n0; ++i) wrong += y[n1 + i] != a[i];
  EXPECT_EQ(wrong, 0);
}

TEST(TypedOpsTest, NonFp32ValueIntoFp32OnlyOpIsRefusedAtLoad) {
  OnnxModelBuilder builder;
  builder.Input("a", {2, 2}, P::INT32).Input("b", {2, 2}, P::INT32);
  builder.Output("y", {2, 2}, P::INT32);
  builder.Node("MatMul", {"a", "b"}, {"y"}, "mm1");
  auto model = CompiledModel::Load(builder.Save("typed_refused"), {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("node 'mm1' (op MatMul): input 'a' is INT32; MatMul "
                                          "runs on FP32 only"),
            std::string::npos)
      << model.status();
}

TEST(TypedOpsTest, ModelInfoCarriesTheTypes) {
  OnnxModelBuilder builder;
  builder.Input("ids", {-1, 4}, P::INT64).Output("y", {-1, 4}, P::FLOAT16);
  auto& cast = builder.Node("Cast", {"ids"}, {"y"});
  OnnxModelBuilder::AttrInt(cast, "to", P::FLOAT16);
  auto info = InspectModel(builder.Save("typed_info"));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->inputs[0].type, DataType::kInt64);
  EXPECT_EQ(info->outputs[0].type, DataType::kFloat16);
  EXPECT_TRUE(info->batched);
  EXPECT_STREQ(DataTypeName(DataType::kUint16), "UINT16");
  EXPECT_EQ(DataTypeFromName("UINT64"), DataType::kUint64);
  EXPECT_EQ(DataTypeSize(DataType::kUint32), 4u);
}

}  // namespace
}  // namespace numaserve::engine
