// Sequences the engine does without (sequence_rewrite.h): a SplitToSequence
// read at constant indices runs as a Split, with the answer of the slices it
// names; a Loop carrying a sequence nothing reads, and any node no output
// needs, are dropped before the ops are checked. What cannot be rewritten
// is still refused at load, naming the node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/ir/typed_tensor.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using P = onnx::TensorProto;

TypedTensor F32(Shape shape, const std::vector<float>& v) {
  return TypedTensor::FromValues(DataType::kFloat32, std::move(shape), v);
}

std::vector<float> Floats(const TypedTensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.size());
}

void Int64Scalar(OnnxModelBuilder& b, const std::string& name, int64_t value) {
  b.RawInitializer(name, P::INT64, {}, &value, sizeof(value));
}

std::vector<TypedTensor> ImportAndRun(OnnxModelBuilder& b, const std::string& stem,
                                      const TypedTensor& x) {
  auto graph = ImportOnnxModel(b.Save(stem));
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  auto out = RunReferenceTyped(*graph, {x});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<TypedTensor>{};
}

// x [batch, 5] split along axis 1 by SPLIT (a 1-D or scalar initializer, or
// none), read at INDICES into y0, y1, ...; x's dim 1 stated as 5 (or left
// dynamic when STATED is false).
OnnxModelBuilder SplitModel(const std::vector<int64_t>& split, bool scalar,
                            const std::vector<int64_t>& indices, bool stated = true,
                            int64_t keepdims = 1) {
  OnnxModelBuilder b;
  if (stated) {
    b.Input("x", {-1, 5});
  } else {
    b.NamedInput("x", {-1, testing::kUnknownDim}, {"", "width"});
  }
  std::vector<std::string> inputs = {"x"};
  if (scalar) {
    Int64Scalar(b, "split", split[0]);
    inputs.push_back("split");
  } else if (!split.empty()) {
    b.Int64Initializer("split", split);
    inputs.push_back("split");
  }
  auto& node = b.Node("SplitToSequence", inputs, {"parts"}, "split_x");
  OnnxModelBuilder::AttrInt(node, "axis", 1);
  if (keepdims != 1) OnnxModelBuilder::AttrInt(node, "keepdims", keepdims);
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::string at = "at" + std::to_string(i);
    Int64Scalar(b, at, indices[i]);
    b.Node("SequenceAt", {"parts", at}, {"y" + std::to_string(i)}, "take" + std::to_string(i));
    if (keepdims == 0) {
      b.Output("y" + std::to_string(i), {-1});
    } else {
      b.Output("y" + std::to_string(i), {-1, testing::kUnknownDim});
    }
  }
  return b;
}

const TypedTensor kX = F32({2, 5}, {0, 1, 2, 3, 4, 10, 11, 12, 13, 14});

TEST(SequenceRewriteTest, SplitToSequenceBySizesReadAtConstantIndicesIsASplit) {
  auto b = SplitModel({2, 3}, false, {0, -1});
  auto out = ImportAndRun(b, "split_sizes", kX);
  ASSERT_EQ(out.size(), 2U);
  EXPECT_EQ(out[0].shape, (Shape{2, 2}));
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{0, 1, 10, 11}));
  EXPECT_EQ(out[1].shape, (Shape{2, 3}));
  EXPECT_EQ(Floats(out[1]), (std::vector<float>{2, 3, 4, 12, 13, 14}));
}

TEST(SequenceRewriteTest, AScalarChunkSplitsTheStatedDimWithAShortLastPart) {
  auto b = SplitModel({2}, true, {1, 2});
  auto out = ImportAndRun(b, "split_chunk", kX);
  ASSERT_EQ(out.size(), 2U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{2, 3, 12, 13}));
  EXPECT_EQ(out[1].shape, (Shape{2, 1}));
  EXPECT_EQ(Floats(out[1]), (std::vector<float>{4, 14}));
}

TEST(SequenceRewriteTest, NoSplitWithoutKeepdimsTakesOneSqueezedColumn) {
  auto b = SplitModel({}, false, {3}, true, 0);
  auto out = ImportAndRun(b, "split_columns", kX);
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(out[0].shape, (Shape{2}));
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{3, 13}));
}

TEST(SequenceRewriteTest, AnIndexPastThePartsIsRefusedNamingTheNodes) {
  auto b = SplitModel({2, 3}, false, {0, 2});
  auto graph = ImportOnnxModel(b.Save("split_past"));
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(graph.status().message()),
              HasSubstr("node 'take1' (op SequenceAt): index 2 of the 2 parts node 'split_x'"));
}

TEST(SequenceRewriteTest, MorePartsThanAnExportMakesIsRefusedBeforeAnyIsMade) {
  // Chunks of 1 over a stated dim of 2^40: an error naming the node, not
  // 2^40 sizes.
  OnnxModelBuilder b;
  b.Input("x", {-1, int64_t{1} << 40});
  OnnxModelBuilder::AttrInt(b.Node("SplitToSequence", {"x"}, {"parts"}, "split_x"), "axis", 1);
  Int64Scalar(b, "at", 0);
  b.Node("SequenceAt", {"parts", "at"}, {"y"}, "take");
  b.Output("y", {-1, testing::kUnknownDim});
  auto graph = ImportOnnxModel(b.Save("split_huge"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(std::string(graph.status().message()),
              HasSubstr("node 'split_x' (op SplitToSequence): chunks of 1 over a dim of "
                        "1099511627776 are not 1 to 4096 parts"));
}

TEST(SequenceRewriteTest, AChunkOfADynamicDimStaysASequenceAndIsRefused) {
  auto b = SplitModel({2}, true, {0}, false);
  auto graph = ImportOnnxModel(b.Save("split_dynamic"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(std::string(graph.status().message()),
              HasSubstr("node 'split_x' (op SplitToSequence) is not supported"));
}

TEST(SequenceRewriteTest, ASequenceReadAnywhereElseStaysAndIsRefused) {
  auto b = SplitModel({2, 3}, false, {0});
  b.Node("SequenceLength", {"parts"}, {"n"}, "count");
  b.Output("n", {}, P::INT64);
  auto graph = ImportOnnxModel(b.Save("split_length"));
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("(op SplitToSequence)"));
}

TEST(SequenceRewriteTest, NodesNoOutputNeedsAreDroppedBeforeTheOpsAreChecked) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 5}).Output("y", {-1, 5});
  b.Node("SequenceEmpty", {}, {"unused_seq"}, "empty");
  b.Node("SequenceInsert", {"unused_seq", "x"}, {"unused_more"}, "insert");
  b.Node("Neg", {"x"}, {"y"}, "neg");
  auto out = ImportAndRun(b, "dead_sequence", kX);
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0])[1], -1.0F);
}

// acc = x; twice: acc = acc + x, and a sequence carried beside it gets x
// appended; the sequence's final value is read by nobody.
TEST(SequenceRewriteTest, ALoopsCarriedSequenceNothingReadsIsDropped) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 5});
  Int64Scalar(b, "m", 2);
  b.Node("SequenceEmpty", {}, {"seq0"}, "empty");
  OnnxModelBuilder body;
  body.Input("i", {}, P::INT64);
  body.Input("cond_in", {}, P::BOOL);
  body.Input("acc_in", {-1, 5});
  body.Input("seq_in", {-1, 5});
  // The checker wants a sequence type on seq_in: set below.
  body.Node("Add", {"acc_in", "x"}, {"acc_out"});
  body.Node("SequenceInsert", {"seq_in", "x"}, {"seq_out"});
  body.Node("Identity", {"cond_in"}, {"cond_out"});
  body.Output("cond_out", {}, P::BOOL);
  body.Output("acc_out", {-1, 5});
  body.Output("seq_out", {-1, 5});
  for (auto* v : {body.proto().mutable_graph()->mutable_input(3),
                  body.proto().mutable_graph()->mutable_output(2)}) {
    onnx::TypeProto tensor = v->type();
    *v->mutable_type()->mutable_sequence_type()->mutable_elem_type() = tensor;
  }
  auto& loop = b.Node("Loop", {"m", "", "x", "seq0"}, {"acc", "seq_final"}, "steps");
  auto* a = loop.add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = body.proto().graph();
  b.Output("acc", {-1, 5});
  auto out = ImportAndRun(b, "loop_dead_sequence", kX);
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{0, 3, 6, 9, 12, 30, 33, 36, 39, 42}));
}

}  // namespace
}  // namespace numaserve::engine
