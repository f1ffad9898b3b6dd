// Hostile inputs to the importer and the shape arithmetic: dims that are
// negative, huge or whose product overflows int64, initializers claiming
// more elements than they hold, and node attributes (pads, repeats, target
// shapes, scales, strides) chosen to overflow. Every one is an error naming
// the initializer, input or node; none is an allocation, a wrapped shape
// or a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/import/constant_folding.h"
#include "engine/import/onnx_import.h"
#include "engine/ir/graph.h"
#include "engine/ops/shape_propagation.h"
#include "kernels/shape_ops.h"
#include "kernels/tensor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;

constexpr int64_t kMax = kernels::kMaxTensorElements;
constexpr int64_t k2To40 = int64_t{1} << 40;
constexpr int64_t k2To32 = int64_t{1} << 32;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// --- Checked arithmetic --------------------------------------------------------------

TEST(CheckedArithmeticTest, MulAndAddReportOverflow) {
  EXPECT_EQ(*kernels::CheckedMul(3, 4), 12);
  EXPECT_EQ(*kernels::CheckedMul(-3, 4), -12);
  EXPECT_EQ(kernels::CheckedMul(kInt64Max, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(kernels::CheckedMul(k2To32, k2To32).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(kernels::CheckedMul(kInt64Min, -1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*kernels::CheckedAdd(kInt64Max - 1, 1), kInt64Max);
  EXPECT_EQ(kernels::CheckedAdd(kInt64Max, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(kernels::CheckedAdd(kInt64Min, -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(CheckedArithmeticTest, NumElementsCheckedRefusesWhatNumElementsWraps) {
  EXPECT_EQ(*kernels::NumElementsChecked({}), 1);
  EXPECT_EQ(*kernels::NumElementsChecked({2, 3, 4}), 24);
  EXPECT_EQ(*kernels::NumElementsChecked({0, 7}), 0);
  EXPECT_EQ(*kernels::NumElementsChecked({kMax}), kMax);
  // Their product wraps to 0 in 64 bits (a "valid" empty tensor)...
  ASSERT_EQ(static_cast<uint64_t>(k2To32) * static_cast<uint64_t>(k2To32) * 4u, 0u);
  auto wrapped = kernels::NumElementsChecked({k2To32, k2To32, 4});
  ASSERT_FALSE(wrapped.ok());
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(Message(wrapped.status()), HasSubstr("[4294967296,4294967296,4]"));
  EXPECT_THAT(Message(wrapped.status()), HasSubstr("2147483648 elements per tensor"));
  EXPECT_FALSE(kernels::NumElementsChecked({k2To40}).ok());
  EXPECT_FALSE(kernels::NumElementsChecked({kMax, 2}).ok());
  EXPECT_FALSE(kernels::NumElementsChecked({kInt64Max, kInt64Max}).ok());
  // A zero-size tensor may not carry dims whose product overflows either.
  EXPECT_FALSE(kernels::NumElementsChecked({0, k2To40}).ok());
  EXPECT_FALSE(kernels::NumElementsChecked({0, int64_t{1} << 20, int64_t{1} << 20}).ok());
  auto negative = kernels::NumElementsChecked({2, -3});
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(negative.status()), HasSubstr("negative dim (-3)"));
  // A smaller cap.
  EXPECT_FALSE(kernels::NumElementsChecked({5, 5}, 24).ok());
  EXPECT_EQ(*kernels::NumElementsChecked({4, 6}, 24), 24);
  EXPECT_EQ(*kernels::ByteSizeChecked({4, 6}, 8), 192);
  EXPECT_FALSE(kernels::ByteSizeChecked({k2To40}, 4).ok());
}

TEST(CheckedArithmeticTest, ReshapeTargetWhoseProductWrapsToTheInputsCountIsRefused) {
  // 4 * (2^62 + 1) = 2^64 + 4, which wraps to 4: the unchecked product made
  // [2^62+1, 4] a valid reshape of 4 elements.
  const int64_t wraps_to_one = (int64_t{1} << 62) + 1;
  auto s = kernels::ReshapeShape({1, 4}, {wraps_to_one, 4}, false);
  ASSERT_FALSE(s.ok()) << kernels::ShapeToString(*s);
  EXPECT_THAT(Message(s.status()), HasSubstr("exceeds the limit"));
  EXPECT_FALSE(kernels::ReshapeShape({1, 4}, {k2To40, -1}, false).ok());
  EXPECT_FALSE(kernels::ReshapeShape({1, 4}, {kInt64Max, kInt64Max}, false).ok());
  EXPECT_FALSE(kernels::ReshapeShape({1, 4}, {0, k2To40}, true).ok());
  EXPECT_FALSE(kernels::ReshapeShape({k2To32, k2To32}, {-1}, false).ok());
  EXPECT_EQ(*kernels::ReshapeShape({2, 6}, {3, -1}, false), (Shape{3, 4}));
  EXPECT_EQ(*kernels::ReshapeShape({2, 6}, {0, 3, 2}, false), (Shape{2, 3, 2}));
}

TEST(CheckedArithmeticTest, FlattenOfAnOverflowingShapeIsRefused) {
  EXPECT_EQ(*kernels::FlattenShape({2, 3, 4}, 1), (Shape{2, 12}));
  EXPECT_FALSE(kernels::FlattenShape({0, k2To40, k2To40}, 1).ok());
  EXPECT_FALSE(kernels::FlattenShape({2, -3}, 1).ok());
}

// --- Initializers ---------------------------------------------------------------

OnnxModelBuilder IdentityModel() {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {1, 4});
  b.Node("Identity", {"x"}, {"y"}, "id");
  return b;
}

// An initializer the graph does not read, with these dims and raw bytes.
onnx::TensorProto& AddRaw(OnnxModelBuilder& b, const std::string& name, int32_t type,
                          const std::vector<int64_t>& dims, const std::string& raw) {
  onnx::TensorProto* t = b.proto().mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (int64_t d : dims) t->add_dims(d);
  if (!raw.empty()) t->set_raw_data(raw);
  return *t;
}

TEST(HostileInitializerTest, TwoToTheFortyElementsInSixteenBytesIsAnErrorNotAnAllocation) {
  OnnxModelBuilder b = IdentityModel();
  AddRaw(b, "unused", onnx::TensorProto::FLOAT, {k2To40}, std::string(16, '\0'));
  auto graph = ImportOnnxModel(b.Save("huge_initializer"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'unused'"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("[1099511627776]"));
}

TEST(HostileInitializerTest, TypedValuesFewerThanTheDimsClaimAreAnError) {
  OnnxModelBuilder b = IdentityModel();
  onnx::TensorProto& t = AddRaw(b, "ints", onnx::TensorProto::INT64, {k2To40}, "");
  t.add_int64_data(1);
  t.add_int64_data(2);
  auto graph = ImportOnnxModel(b.Save("huge_int64"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'ints'"));

  // Within the cap: the declared count is checked against the values held.
  OnnxModelBuilder c = IdentityModel();
  onnx::TensorProto& u = AddRaw(c, "few", onnx::TensorProto::INT64, {1000}, "");
  u.add_int64_data(1);
  graph = ImportOnnxModel(c.Save("few_int64"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()),
              HasSubstr("declares dims [1000] (1000 elements) but holds 1 values"));

  OnnxModelBuilder d = IdentityModel();
  AddRaw(d, "short", onnx::TensorProto::FLOAT, {8}, std::string(16, '\0'));
  graph = ImportOnnxModel(d.Save("short_raw"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'short' declares dims [8]"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("holds 16 raw bytes"));
}

TEST(HostileInitializerTest, DimsWhoseProductWrapsToZeroAreAnError) {
  // 2^32 * 2^32 * 4 wraps to 0: before, an "empty" initializer.
  OnnxModelBuilder b = IdentityModel();
  AddRaw(b, "wrap", onnx::TensorProto::FLOAT, {k2To32, k2To32, 4}, "");
  auto graph = ImportOnnxModel(b.Save("wrap_initializer"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("initializer 'wrap'"));
  EXPECT_THAT(Message(graph.status()), HasSubstr("exceeds the limit"));
}

TEST(HostileInitializerTest, ExternalDataIsRefused) {
  OnnxModelBuilder b = IdentityModel();
  onnx::TensorProto& t = AddRaw(b, "ext", onnx::TensorProto::FLOAT, {4}, "");
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = t.add_external_data();
  entry->set_key("location");
  entry->set_value("/etc/passwd");
  auto graph = ImportOnnxModel(b.Save("external"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("'ext' uses external data"));
}

TEST(HostileInitializerTest, AnInputWhoseRowExceedsTheLimitIsRefusedByName) {
  OnnxModelBuilder b;
  b.Input("x", {-1, k2To40}).Output("y", {-1, k2To40});
  b.Node("Identity", {"x"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("huge_input"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(Message(graph.status()), HasSubstr("input 'x'"));
}

// --- Shape functions of nodes ---------------------------------------------------------

// x [1, 4] -> `op`(x, <the INT64 values of `values`, as a folded Concat of
// two constants, so libonnx's own shape inference never sees them>) -> y.
OnnxModelBuilder WithFoldedInts(const std::string& op, const std::vector<int64_t>& values,
                                size_t rank_out = 2) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", std::vector<int64_t>(rank_out, kUnknownDim));
  const std::vector<int64_t> first(values.begin(), values.begin() + 1);
  const std::vector<int64_t> rest(values.begin() + 1, values.end());
  b.Int64Initializer("a", first).Int64Initializer("b", rest);
  auto& concat = b.Node("Concat", {"a", "b"}, {"values"}, "make_values");
  OnnxModelBuilder::AttrInt(concat, "axis", 0);
  b.Node(op, {"x", "values"}, {"y"}, "victim");
  return b;
}

void ExpectNodeError(const OnnxModelBuilder& b, const std::string& stem,
                     const std::string& node_and_op, const std::string& detail) {
  auto graph = ImportOnnxModel(b.Save(stem));
  ASSERT_FALSE(graph.ok()) << stem << " imported";
  EXPECT_THAT(Message(graph.status()), HasSubstr(node_and_op)) << stem;
  EXPECT_THAT(Message(graph.status()), HasSubstr(detail)) << stem;
}

TEST(HostileShapeTest, ReshapeToAProductThatWrapsIsAnError) {
  ExpectNodeError(WithFoldedInts("Reshape", {(int64_t{1} << 62) + 1, 4}), "reshape_wrap",
                  "node 'victim' (op Reshape)", "exceeds the limit");
  ExpectNodeError(WithFoldedInts("Reshape", {k2To32, k2To32, 4}, 3), "reshape_huge",
                  "node 'victim' (op Reshape)", "Reshape");
}

TEST(HostileShapeTest, PadWithHugeOrNegativePadsIsAnError) {
  ExpectNodeError(WithFoldedInts("Pad", {0, int64_t{1} << 62, 0, int64_t{1} << 62}), "pad_huge",
                  "node 'victim' (op Pad)", "negative or overflowing extent");
  ExpectNodeError(WithFoldedInts("Pad", {0, -10, 0, 0}), "pad_negative", "node 'victim' (op Pad)",
                  "negative or overflowing extent");
  ExpectNodeError(WithFoldedInts("Pad", {0, k2To40, 0, 0}), "pad_big", "node 'victim' (op Pad)",
                  "exceeds the limit");
}

TEST(HostileShapeTest, TileWithHugeOrNegativeRepeatsIsAnError) {
  ExpectNodeError(WithFoldedInts("Tile", {kMax, kMax}), "tile_huge", "node 'victim' (op Tile)",
                  "exceeds the limit");
  ExpectNodeError(WithFoldedInts("Tile", {k2To40, kInt64Max}), "tile_overflow",
                  "node 'victim' (op Tile)", "overflows int64");
  ExpectNodeError(WithFoldedInts("Tile", {1, -2}), "tile_negative", "node 'victim' (op Tile)",
                  "negative");
}

TEST(HostileShapeTest, ExpandToAHugeShapeIsAnError) {
  ExpectNodeError(WithFoldedInts("Expand", {k2To40, 4}), "expand_huge", "node 'victim' (op Expand)",
                  "exceeds the limit");
  ExpectNodeError(WithFoldedInts("Expand", {-5, 4}), "expand_negative", "node 'victim' (op Expand)",
                  "negative dim");
}

TEST(HostileShapeTest, ConstantOfShapeWithHugeOrNegativeDimsIsAnError) {
  for (const auto& [stem, dims] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"cos_huge", {int64_t{1} << 20, int64_t{1} << 20}}, {"cos_negative", {-5}}}) {
    OnnxModelBuilder b = IdentityModel();
    b.Int64Initializer("dims", dims);
    b.Node("ConstantOfShape", {"dims"}, {"unused"}, "victim");
    ExpectNodeError(b, stem, "node 'victim' (op ConstantOfShape)", "the shape input");
  }
}

TEST(HostileShapeTest, ConstantFoldingDoesNotAllocateBeyondItsCap) {
  // 2^25 elements from two values: within the per-tensor limit, so the
  // model loads, but the node is left to run at run time, not folded into
  // 128 MiB of constant at load.
  OnnxModelBuilder big = IdentityModel();
  big.Int64Initializer("dims", {int64_t{1} << 13, int64_t{1} << 12});
  big.Node("ConstantOfShape", {"dims"}, {"unused"}, "big");
  auto graph = ImportOnnxModel(big.Save("cos_unfolded"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  bool kept = false;
  for (const Node& node : graph->nodes()) kept |= node.name == "big";
  EXPECT_TRUE(kept);
  // A small one folds as before.
  OnnxModelBuilder small = IdentityModel();
  small.Int64Initializer("dims", {16, 16});
  small.Node("ConstantOfShape", {"dims"}, {"unused"}, "small");
  graph = ImportOnnxModel(small.Save("cos_folded"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (const Node& node : graph->nodes()) EXPECT_NE(node.name, "small");
}

TEST(HostileShapeTest, ResizeWithHugeNegativeOrNanScalesIsAnError) {
  for (float scale : {1e30f, -2.0f, std::nanf("")}) {
    OnnxModelBuilder b;
    b.Input("x", {1, 1, 2, 2}).Output("y", {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
    b.Initializer("scales", kernels::Tensor({4}, {1.0f, 1.0f, scale, scale}));
    auto& n = b.Node("Resize", {"x", "", "scales"}, {"y"}, "victim");
    OnnxModelBuilder::AttrString(n, "mode", "nearest");
    auto graph = ImportOnnxModel(b.Save("resize"));
    ASSERT_FALSE(graph.ok()) << scale;
    EXPECT_THAT(Message(graph.status()), HasSubstr("node 'victim' (op Resize)")) << scale;
  }
}

TEST(HostileShapeTest, ConcatPastTheLimitIsAnError) {
  // Two values of 2^30 + 1 elements each (within the limit, left unfolded)
  // concatenated: 2^31 + 2.
  OnnxModelBuilder b = IdentityModel();
  b.Initializer("one", kernels::Tensor({1}, {1.0f}));
  b.Int64Initializer("n", {(int64_t{1} << 30) + 1});
  b.Node("Expand", {"one", "n"}, {"big"}, "expand");
  auto& c = b.Node("Concat", {"big", "big"}, {"unused"}, "victim");
  OnnxModelBuilder::AttrInt(c, "axis", 0);
  ExpectNodeError(b, "concat_huge", "node 'victim' (op Concat)", "exceeds the limit");
}

TEST(HostileShapeTest, SplitWithNegativeSizesIsAnError) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {kUnknownDim, kUnknownDim});
  b.Int64Initializer("a", {-1}).Int64Initializer("b", {5});
  auto& concat = b.Node("Concat", {"a", "b"}, {"sizes"}, "make_sizes");
  OnnxModelBuilder::AttrInt(concat, "axis", 0);
  auto& split = b.Node("Split", {"x", "sizes"}, {"y", "z"}, "victim");
  OnnxModelBuilder::AttrInt(split, "axis", 1);
  ExpectNodeError(b, "split_negative", "node 'victim' (op Split)", "split sizes");
}

TEST(HostileShapeTest, SliceWithTheMostNegativeStepDoesNotOverflow) {
  OnnxModelBuilder b;
  b.Input("x", {1, 4}).Output("y", {kUnknownDim, kUnknownDim});
  b.Int64Initializer("starts", {3}).Int64Initializer("ends", {-5});
  b.Int64Initializer("axes", {1}).Int64Initializer("steps", {kInt64Min});
  b.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"}, "slice");
  auto graph = ImportOnnxModel(b.Save("slice_min_step"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto shapes = PropagateShapes(*graph, InputShapesForBatch(*graph, 1));
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[*graph->FindValue("y")], (Shape{1, 1}));  // element 3 alone
}

TEST(HostileShapeTest, ZeroStridesAreRefusedBeforeLibonnxDividesByThem) {
  // libonnx 1.12's convPoolShapeInference divides by the stride: a SIGFPE
  // (no exception) in the server process before this check.
  for (const std::string op : {"Conv", "MaxPool"}) {
    OnnxModelBuilder b;
    b.Input("x", {1, 1, 8, 8}).Output("y", {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
    std::vector<std::string> inputs = {"x"};
    if (op == "Conv") {
      b.Initializer("w", kernels::Tensor({1, 1, 3, 3}, std::vector<float>(9, 1.0f)));
      inputs.push_back("w");
    }
    auto& n = b.Node(op, inputs, {"y"}, "victim");
    OnnxModelBuilder::AttrInts(n, "strides", {0, 0});
    OnnxModelBuilder::AttrInts(n, "kernel_shape", {3, 3});
    OnnxModelBuilder::AttrString(n, "auto_pad", "SAME_UPPER");
    ExpectNodeError(b, "zero_strides", "node 'victim' (op " + op + ")", "'strides' has 0");
  }
}

TEST(HostileShapeTest, HugeConvPadsAreAnError) {
  OnnxModelBuilder b;
  b.Input("x", {1, 1, 8, 8}).Output("y", {kUnknownDim, kUnknownDim, kUnknownDim, kUnknownDim});
  b.Initializer("w", kernels::Tensor({1, 1, 3, 3}, std::vector<float>(9, 1.0f)));
  auto& n = b.Node("Conv", {"x", "w"}, {"y"}, "victim");
  OnnxModelBuilder::AttrInts(n, "pads", {0, 0, int64_t{1} << 62, int64_t{1} << 62});
  ExpectNodeError(b, "conv_pads", "node 'victim' (op Conv)", "pads must be within");
}

TEST(HostileShapeTest, PropagationRefusesAHugeRuntimeBatchByName) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 1024}).Output("y", {-1, 1024});
  b.Node("Relu", {"x"}, {"y"});
  auto graph = ImportOnnxModel(b.Save("batch"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(PropagateShapes(*graph, InputShapesForBatch(*graph, 1 << 20)).ok());
  auto huge = PropagateShapes(*graph, InputShapesForBatch(*graph, int64_t{1} << 40));
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(Message(huge.status()), HasSubstr("input 'x'"));
}

}  // namespace
}  // namespace numaserve::engine
