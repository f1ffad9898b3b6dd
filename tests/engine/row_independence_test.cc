// Which models may batch requests together (ModelInfo::batched from
// CheckRowIndependence), and the real output shapes of those that may not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/shape_propagation.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;

ModelInfo Inspect(const OnnxModelBuilder& b, const std::string& stem) {
  auto info = InspectModel(b.Save(stem));
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? *std::move(info) : ModelInfo();
}

// x [n,64] -> Reshape [1,-1] -> y [1, 64n]: one row whatever the batch.
OnnxModelBuilder ReshapeToOneRow() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 64}).Output("y", {1, kUnknownDim});
  b.Int64Initializer("one_row", {1, -1});
  b.Node("Reshape", {"x", "one_row"}, {"y"}, "flatten_all");
  return b;
}

// x [n,3] -> x times its transpose -> y [n,n]: every row against every row.
OnnxModelBuilder Gram() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3}).Output("y", {-1, kUnknownDim});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"x"}, {"xt"}, "t"), "perm", {1, 0});
  b.Node("MatMul", {"x", "xt"}, {"y"}, "gram");
  return b;
}

TEST(RowIndependenceTest, EveryRegisteredOpHasARowRule) {
  for (absl::string_view op : absl::StrSplit(SupportedOpsList(), ", ")) {
    EXPECT_TRUE(HasRowRule(std::string(op)))
        << op << " has no rule in CheckRowIndependence: say how it moves rows";
  }
}

TEST(RowIndependenceTest, RowWiseModelsAreBatched) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 2, 3}).Output("y", {-1, 4}).Output("t", {-1, 3, 2});
  b.Int64Initializer("shape", {0, -1});
  b.Initializer("w", kernels::Tensor({6, 4})).Initializer("bias", kernels::Tensor({4}));
  b.Node("Reshape", {"x", "shape"}, {"flat"});
  b.Node("MatMul", {"flat", "w"}, {"mm"});
  b.Node("Add", {"mm", "bias"}, {"sum"});
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"sum"}, {"y"}), "axis", 1);
  // Rows moved to another axis and back ([n,2,3] -> [2,3,n] -> [n,3,2]), a
  // matmul of each row with itself ([n,3,2] x [n,2,3]) and a sum within
  // each row: still row by row.
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"x"}, {"xt"}), "perm", {1, 2, 0});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"xt"}, {"back"}), "perm", {2, 1, 0});
  b.Node("MatMul", {"back", "x"}, {"pairs"});
  b.Int64Initializer("inner", {1, 2});
  b.Node("ReduceSum", {"pairs", "inner"}, {"t_sum"});
  b.Node("Mul", {"back", "t_sum"}, {"t"});
  const ModelInfo info = Inspect(b, "rows_apart");
  EXPECT_TRUE(info.batched) << info.unbatched_reason;
  EXPECT_EQ(info.unbatched_reason, "");
  EXPECT_FALSE(info.output_shapes_at);
}

TEST(RowIndependenceTest, ReshapeOfTheRowsIntoOneIsNotBatched) {
  const ModelInfo info = Inspect(ReshapeToOneRow(), "reshape_one_row");
  EXPECT_FALSE(info.batched);
  EXPECT_THAT(info.unbatched_reason, HasSubstr("output 'y'"));
  EXPECT_THAT(info.unbatched_reason, HasSubstr("flatten_all"));
  EXPECT_EQ(info.outputs[0].shape, (std::vector<int64_t>{1, -1}));
  ASSERT_TRUE(info.output_shapes_at);
  auto at5 = info.output_shapes_at(5);
  ASSERT_TRUE(at5.ok()) << at5.status();
  EXPECT_EQ(*at5, (std::vector<std::vector<int64_t>>{{1, 320}}));
}

TEST(RowIndependenceTest, RowsTimesTheirTransposeAreNotBatched) {
  // [n,n] keeps the batch dim first, but every row reads every other row.
  const ModelInfo info = Inspect(Gram(), "gram");
  EXPECT_FALSE(info.batched);
  EXPECT_THAT(info.unbatched_reason, HasSubstr("'gram' (op MatMul) pairs rows with rows"));
  ASSERT_TRUE(info.output_shapes_at);
  auto at4 = info.output_shapes_at(4);
  ASSERT_TRUE(at4.ok()) << at4.status();
  EXPECT_EQ(*at4, (std::vector<std::vector<int64_t>>{{4, 4}}));
}

// The same shape out as in, but one row's answer depends on the others.
struct MixingCase {
  const char* name;
  void (*build)(OnnxModelBuilder& b);
  const char* why;
};

TEST(RowIndependenceTest, OpsCombiningRowsMakeAModelUnbatched) {
  const MixingCase cases[] = {
      {"softmax_over_rows",
       [](OnnxModelBuilder& b) {
         OnnxModelBuilder::AttrInt(b.Node("Softmax", {"x"}, {"y"}, "sm"), "axis", 0);
       },
       "normalizes over the rows"},
      {"minus_batch_mean",
       [](OnnxModelBuilder& b) {
         auto& mean = b.Node("ReduceMean", {"x"}, {"mean"}, "mean");
         OnnxModelBuilder::AttrInts(mean, "axes", {0});
         b.Node("Sub", {"x", "mean"}, {"y"});
       },
       "'mean' (op ReduceMean) combines the rows"},
      {"reversed_rows",
       [](OnnxModelBuilder& b) {
         b.Int64Initializer("starts", {-1}).Int64Initializer("ends", {-1000000});
         b.Int64Initializer("axes", {0}).Int64Initializer("steps", {-1});
         b.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"}, "rev");
       },
       "reorders the rows"},
      {"layer_norm_over_everything",
       [](OnnxModelBuilder& b) {
         b.Initializer("scale", kernels::Tensor({4}, {1, 1, 1, 1}));
         auto& ln = b.Node("LayerNormalization", {"x", "scale"}, {"y"}, "ln");
         OnnxModelBuilder::AttrInt(ln, "axis", 0);
       },
       "normalizes over the rows"},
      {"rows_reshaped_across",
       [](OnnxModelBuilder& b) {
         b.Int64Initializer("shape", {2, -1, 2});
         b.Int64Initializer("back", {-1, 4});
         b.Node("Reshape", {"x", "shape"}, {"r"}, "split_cols");
         OnnxModelBuilder::AttrInts(b.Node("Transpose", {"r"}, {"t"}), "perm", {1, 0, 2});
         b.Node("Reshape", {"t", "back"}, {"y"}, "join");
       },
       "across rows"},
  };
  for (const MixingCase& c : cases) {
    SCOPED_TRACE(c.name);
    OnnxModelBuilder b(/*opset=*/17);  // LayerNormalization
    b.Input("x", {-1, 4}).Output("y", {-1, 4});
    c.build(b);
    const ModelInfo info = Inspect(b, c.name);
    EXPECT_FALSE(info.batched);
    EXPECT_THAT(info.unbatched_reason, HasSubstr(c.why));
    // Its output [-1,4] is sized by the model's own shape function.
    ASSERT_TRUE(info.output_shapes_at);
    auto at5 = info.output_shapes_at(5);
    ASSERT_TRUE(at5.ok()) << at5.status();
    EXPECT_EQ(*at5, (std::vector<std::vector<int64_t>>{{5, 4}}));
  }
}

// The index ops: along an axis other than the rows' they keep rows apart;
// along the rows' axis, or by index tuples, they combine them.
TEST(RowIndependenceTest, IndexOpsKeepRowsApartOnlyOffTheRowsAxis) {
  struct Case {
    const char* name;
    int64_t axis;
    bool batched;
  };
  for (const Case& c : {Case{"cumsum_within_rows", 1, true}, Case{"cumsum_over_rows", 0, false}}) {
    SCOPED_TRACE(c.name);
    OnnxModelBuilder b(/*opset=*/17);
    b.Input("x", {-1, 4}).Output("y", {-1, 4});
    b.RawInitializer("axis", onnx::TensorProto::INT64, {}, &c.axis, sizeof(c.axis));
    b.Node("CumSum", {"x", "axis"}, {"y"}, "cs");
    const ModelInfo info = Inspect(b, c.name);
    EXPECT_EQ(info.batched, c.batched) << info.unbatched_reason;
    if (!c.batched) {
      EXPECT_THAT(info.unbatched_reason, HasSubstr("works along the rows' axis"));
    }
  }
  for (const Case& c : {Case{"argmax_within_rows", 1, true}, Case{"argmax_over_rows", 0, false}}) {
    SCOPED_TRACE(c.name);
    OnnxModelBuilder b(/*opset=*/17);
    b.Input("x", {-1, 4})
        .Output("y", c.axis == 1 ? std::vector<int64_t>{-1, 1} : std::vector<int64_t>{1, 4},
                onnx::TensorProto::INT64);
    OnnxModelBuilder::AttrInt(b.Node("ArgMax", {"x"}, {"y"}, "am"), "axis", c.axis);
    const ModelInfo info = Inspect(b, c.name);
    EXPECT_EQ(info.batched, c.batched) << info.unbatched_reason;
  }
  OnnxModelBuilder b(/*opset=*/17);
  b.Input("x", {-1, 4}).Output("y", {-1, 4});
  b.Node("Trilu", {"x"}, {"y"}, "lower");
  const ModelInfo info = Inspect(b, "trilu_over_rows");
  EXPECT_FALSE(info.batched);
  EXPECT_THAT(info.unbatched_reason, HasSubstr("last two axes"));
}

// x [n,8] and what exporters compute from its shape: `rows` (dim 0 as a
// [1] tensor), `width` (dim 1, a scalar), `zeros` (ConstantOfShape of its
// shape).
OnnxModelBuilder FromTheShape() {
  OnnxModelBuilder b(/*opset=*/17);
  b.Input("x", {-1, 8});
  b.Node("Shape", {"x"}, {"shape"}, "shape");
  b.Int64Initializer("first", {0});
  b.Node("Gather", {"shape", "first"}, {"rows"}, "rows");
  const int64_t one = 1, zero = 0;
  b.RawInitializer("second", onnx::TensorProto::INT64, {}, &one, sizeof(one));
  b.RawInitializer("zero", onnx::TensorProto::INT64, {}, &zero, sizeof(zero));
  b.RawInitializer("step", onnx::TensorProto::INT64, {}, &one, sizeof(one));
  b.Node("Gather", {"shape", "second"}, {"width"}, "width");
  b.Node("ConstantOfShape", {"shape"}, {"zeros"}, "zeros");
  return b;
}

TEST(RowIndependenceTest, ShapesReadFromTheRowsKeepThemApart) {
  // As transformers' exports do: a Reshape to [rows, 2, 4] whose target is
  // built from the input's shape, positions 0..width-1 (Range up to dim 1,
  // the same at every row count) added to each row, and zeros shaped like
  // the input. Every row is still computed from itself alone.
  OnnxModelBuilder b = FromTheShape();
  b.Output("y", {-1, 2, 4});
  b.Int64Initializer("rest", {2, 4});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"rows", "rest"}, {"target"}, "target"), "axis", 0);
  b.Node("Range", {"zero", "width", "step"}, {"positions"}, "positions");
  OnnxModelBuilder::AttrInt(b.Node("Cast", {"positions"}, {"pf"}), "to", onnx::TensorProto::FLOAT);
  b.Node("Add", {"x", "pf"}, {"placed"});
  OnnxModelBuilder::AttrInt(b.Node("Cast", {"zeros"}, {"zf"}), "to", onnx::TensorProto::FLOAT);
  b.Node("Add", {"placed", "zf"}, {"sum"});
  b.Node("Reshape", {"sum", "target"}, {"y"}, "split_rows");
  const ModelInfo info = Inspect(b, "from_the_shape");
  EXPECT_TRUE(info.batched) << info.unbatched_reason;

  // Computed together, two requests get what each gets alone.
  auto model = CompiledModel::Load(b.Save("run_from_the_shape"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> x(3 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
  std::vector<float> together(x.size()), alone(x.size());
  ASSERT_TRUE((*model)->Run(3, {x.data()}, {together.data()}).ok());
  ASSERT_TRUE((*model)->Run(1, {x.data()}, {alone.data()}).ok());
  ASSERT_TRUE((*model)->Run(2, {x.data() + 8}, {alone.data() + 8}).ok());
  EXPECT_EQ(together, alone);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(together[i], x[i] + static_cast<float>(i % 8));
}

TEST(RowIndependenceTest, ValuesOfTheRowCountMakeAModelUnbatched) {
  // Each row's place in the batch (Range up to the row count) added to it:
  // a row's answer would depend on the requests beside it. (A branch on the
  // row count: ShapeValuesTest.BatchAgainstAThreshold...)
  {
    OnnxModelBuilder b = FromTheShape();
    b.Output("y", {-1, 8});
    const int64_t first = 0;
    b.RawInitializer("first_scalar", onnx::TensorProto::INT64, {}, &first, sizeof(first));
    b.Node("Gather", {"shape", "first_scalar"}, {"count"}, "count");
    b.Node("Range", {"zero", "count", "step"}, {"places"}, "places");
    OnnxModelBuilder::AttrInt(b.Node("Cast", {"places"}, {"pf"}), "to", onnx::TensorProto::FLOAT);
    b.Int64Initializer("column", {1});
    b.Node("Unsqueeze", {"pf", "column"}, {"pcol"});
    b.Node("Add", {"x", "pcol"}, {"y"}, "add_place");
    const ModelInfo info = Inspect(b, "place_in_batch");
    EXPECT_FALSE(info.batched);
    EXPECT_THAT(info.unbatched_reason,
                HasSubstr("'add_place' (op Add) combines the number of rows"));
  }
  // A constant row padded with zeros to the row count: only the batch's
  // first row would get it.
  {
    OnnxModelBuilder b = FromTheShape();
    b.Output("y", {-1, 8});
    b.Initializer("first_row", kernels::Tensor({1, 8}, std::vector<float>(8, 2.0f)));
    b.Int64Initializer("one", {1}).Int64Initializer("zeros2", {0, 0});
    b.Node("Sub", {"rows", "one"}, {"more"}, "more");
    OnnxModelBuilder::AttrInt(b.Node("Concat", {"zeros2", "more"}, {"pads_head"}), "axis", 0);
    b.Int64Initializer("zero1", {0});
    OnnxModelBuilder::AttrInt(b.Node("Concat", {"pads_head", "zero1"}, {"pads"}), "axis", 0);
    b.Node("Pad", {"first_row", "pads"}, {"padded"}, "pad_to_rows");
    b.Node("Add", {"x", "padded"}, {"y"}, "add_padded");
    const ModelInfo info = Inspect(b, "padded_to_rows");
    EXPECT_FALSE(info.batched);
    EXPECT_THAT(info.unbatched_reason, HasSubstr("'add_padded' (op Add) combines the number"));
  }
}

// transformers' padding mask as torch.onnx exports it: the mask [n,8]
// flattened to [n*8, 1] and gathered at row * `stride` + position (row:
// Range up to the row count), then applied to x.
OnnxModelBuilder MaskByFlatIndex(int64_t stride) {
  OnnxModelBuilder b = FromTheShape();
  b.Input("mask", {-1, 8}).Output("y", {-1, 8});
  OnnxModelBuilder::AttrInt(b.Node("Flatten", {"mask"}, {"flat"}, "flatten_mask"), "axis", 2);
  const int64_t first = 0;
  b.RawInitializer("first_scalar", onnx::TensorProto::INT64, {}, &first, sizeof(first));
  b.Node("Gather", {"shape", "first_scalar"}, {"count"}, "count");
  b.Node("Range", {"zero", "count", "step"}, {"row"}, "row");
  b.Int64Initializer("column", {1});
  b.Node("Unsqueeze", {"row", "column"}, {"row_col"}, "row_col");
  b.Int64Initializer("stride", {stride});
  b.Node("Mul", {"row_col", "stride"}, {"row_start"}, "row_start");
  b.Node("Range", {"zero", "width", "step"}, {"position"}, "position");
  b.Int64Initializer("row_axis", {0});
  b.Node("Unsqueeze", {"position", "row_axis"}, {"position_row"}, "position_row");
  b.Node("Add", {"row_start", "position_row"}, {"index"}, "index");
  OnnxModelBuilder::AttrInt(b.Node("Gather", {"flat", "index"}, {"picked"}, "lookup"), "axis", 0);
  b.Int64Initializer("rows_by_8", {-1, 8});
  b.Node("Reshape", {"picked", "rows_by_8"}, {"m"}, "m");
  b.Node("Mul", {"x", "m"}, {"y"}, "apply");
  return b;
}

TEST(RowIndependenceTest, AMaskLookedUpByFlatIndexKeepsRowsApart) {
  const OnnxModelBuilder b = MaskByFlatIndex(8);
  const ModelInfo info = Inspect(b, "mask_by_flat_index");
  EXPECT_TRUE(info.batched) << info.unbatched_reason;
  auto model = CompiledModel::Load(b.Save("run_mask_by_flat_index"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> x(3 * 8), mask(3 * 8);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(i) + 1;
    mask[i] = static_cast<float>((i * 7) % 3 == 0);
  }
  std::vector<float> together(x.size()), alone(x.size());
  ASSERT_TRUE((*model)->Run(3, {x.data(), mask.data()}, {together.data()}).ok());
  ASSERT_TRUE((*model)->Run(1, {x.data(), mask.data()}, {alone.data()}).ok());
  ASSERT_TRUE((*model)->Run(2, {x.data() + 8, mask.data() + 8}, {alone.data() + 8}).ok());
  EXPECT_EQ(together, alone);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(together[i], x[i] * mask[i]);

  // A stride other than the row's 8 elements reads the other rows' mask.
  const ModelInfo across = Inspect(MaskByFlatIndex(4), "mask_by_wrong_stride");
  EXPECT_FALSE(across.batched);
  EXPECT_THAT(across.unbatched_reason, HasSubstr("'lookup' (op Gather)"));
}

// As nn.MultiheadAttention lays out a batch: x [n,4,6] moved to [4,n,6],
// viewed as [4n, 6] (the rows interleaved, 4 times over) for a MatMul,
// then `back` to [n,4,6] through [4,n,6], or `across` straight to [n,24].
OnnxModelBuilder Interleaved(bool back) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4, 6})
      .Output("y", back ? std::vector<int64_t>{-1, 4, 6} : std::vector<int64_t>{-1, 24});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"x"}, {"seq_first"}), "perm", {1, 0, 2});
  b.Int64Initializer("flat", {-1, 6}).Int64Initializer("unflat", {4, -1, 6});
  b.Int64Initializer("rows_by_24", {-1, 24});
  kernels::Tensor w({6, 6});
  for (int64_t i = 0; i < w.size(); ++i) w.data[static_cast<size_t>(i)] = 0.1f * (i % 7);
  b.Initializer("w", w);
  b.Node("Reshape", {"seq_first", "flat"}, {"rows_flat"}, "interleave");
  b.Node("MatMul", {"rows_flat", "w"}, {"projected"});
  if (back) {
    b.Node("Reshape", {"projected", "unflat"}, {"seq_again"}, "unflatten");
    OnnxModelBuilder::AttrInts(b.Node("Transpose", {"seq_again"}, {"y"}), "perm", {1, 0, 2});
  } else {
    b.Node("Reshape", {"projected", "rows_by_24"}, {"y"}, "across");
  }
  return b;
}

TEST(RowIndependenceTest, RowsInterleavedWithTheSequenceKeepApart) {
  const OnnxModelBuilder b = Interleaved(/*back=*/true);
  const ModelInfo info = Inspect(b, "interleaved_back");
  EXPECT_TRUE(info.batched) << info.unbatched_reason;
  auto model = CompiledModel::Load(b.Save("run_interleaved_back"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> x(3 * 24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 11) - 5.0f;
  std::vector<float> together(x.size()), alone(x.size());
  ASSERT_TRUE((*model)->Run(3, {x.data()}, {together.data()}).ok());
  ASSERT_TRUE((*model)->Run(1, {x.data()}, {alone.data()}).ok());
  ASSERT_TRUE((*model)->Run(2, {x.data() + 24}, {alone.data() + 24}).ok());
  // Within rounding: the matmul's kernels differ with its row count.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(together[i], alone[i], 1e-5f) << i;

  // Viewed straight as [n, 24], each row would take elements of others.
  const ModelInfo across = Inspect(Interleaved(/*back=*/false), "interleaved_across");
  EXPECT_FALSE(across.batched);
  EXPECT_THAT(across.unbatched_reason, HasSubstr("'across' (op Reshape) reshapes"));
}

// A decoder's step as exporters write it: x [batch, sequence, 4] new
// tokens, past [batch, past_sequence, 4], mask [batch, total_sequence];
// present = Concat(past, x) [batch, total_sequence, 4] (the output names
// the mask's dim), y = the second half of present * mask's last axis, half
// computed from its shape as LLaMA's rotate_half is. The probes give
// total_sequence the size the graph computes for present's (past +
// sequence), so the model loads, and its rows keep apart where the slice's
// start is a value of the shape (not folded at load: at the fold sizes the
// mask's dim has a size of its own, and the Mul fails), so its requests
// batch.
TEST(RowIndependenceTest, ADimAnOutputNamesAsAnInputsTakesTheComputedSize) {
  OnnxModelBuilder b;
  b.NamedInput("x", {-1, kUnknownDim, 4}, {"batch", "sequence", ""});
  b.NamedInput("past", {-1, kUnknownDim, 4}, {"batch", "past_sequence", ""});
  b.NamedInput("mask", {-1, kUnknownDim}, {"batch", "total_sequence"});
  b.NamedOutput("present", {-1, kUnknownDim, 4}, {"batch", "total_sequence", ""});
  b.NamedOutput("y", {-1, kUnknownDim, 2}, {"batch", "total_sequence", ""});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"past", "x"}, {"present"}, "append"), "axis", 1);
  b.Int64Initializer("last", {-1});
  b.Node("Unsqueeze", {"mask", "last"}, {"mask3"}, "mask3");
  b.Node("Mul", {"present", "mask3"}, {"masked"}, "masked");
  b.Node("Shape", {"masked"}, {"shape"}, "shape");
  b.Int64Initializer("two", {2});
  OnnxModelBuilder::AttrInt(b.Node("Gather", {"shape", "two"}, {"width"}, "width"), "axis", 0);
  b.Node("Div", {"width", "two"}, {"half"}, "half");
  b.Int64Initializer("end", {int64_t{1} << 62});
  b.Node("Slice", {"masked", "half", "end", "two"}, {"y"}, "second_half");
  const std::string path = b.Save("decoder_past");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int which : {0, 1}) {
    const std::vector<Shape> probe = ProbeInputShapes(*graph, which);
    EXPECT_EQ(probe[2][1], probe[0][1] + probe[1][1]) << which;
  }
  const ModelInfo info = Inspect(b, "decoder_past_info");
  EXPECT_TRUE(info.batched) << info.unbatched_reason;
}

TEST(RowIndependenceTest, StaticModelHasNoReasonToLog) {
  OnnxModelBuilder b;
  b.Input("x", {2, 3}).Output("y", {2, 3});
  b.Node("Relu", {"x"}, {"y"});
  const ModelInfo info = Inspect(b, "static_rows");
  EXPECT_FALSE(info.batched);
  EXPECT_EQ(info.unbatched_reason, "");
  EXPECT_FALSE(info.output_shapes_at);
}

TEST(RowIndependenceTest, ShapeFunctionKeepsNoWeights) {
  // A weight of 64x2048 floats: the shape function still computes the
  // matmul's shape from the weight's shape alone.
  OnnxModelBuilder b;
  b.Input("x", {-1, 64}).Output("y", {1, kUnknownDim});
  b.Initializer("w", kernels::Tensor({64, 2048}));
  b.Int64Initializer("one_row", {1, -1});
  b.Node("MatMul", {"x", "w"}, {"h"});
  b.Node("Reshape", {"h", "one_row"}, {"y"});
  const ModelInfo info = Inspect(b, "big_weight_one_row");
  EXPECT_FALSE(info.batched);
  ASSERT_TRUE(info.output_shapes_at);
  auto at3 = info.output_shapes_at(3);
  ASSERT_TRUE(at3.ok()) << at3.status();
  EXPECT_EQ(*at3, (std::vector<std::vector<int64_t>>{{1, 3 * 2048}}));
}

TEST(CompiledRowsTest, UnbatchedModelRunsAtTheRequestsRows) {
  auto model = CompiledModel::Load(ReshapeToOneRow().Save("run_one_row"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE((*model)->info().batched);
  std::vector<float> x(5 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  EXPECT_EQ((*model)->OutputShapes(5), (std::vector<std::vector<int64_t>>{{1, 320}}));
  std::vector<float> y(320, -1.0f);
  ASSERT_TRUE((*model)->Run(5, {x.data()}, {y.data()}).ok());
  EXPECT_EQ(y, x);
}

TEST(CompiledRowsTest, GramRunsAtTheRequestsRows) {
  auto model = CompiledModel::Load(Gram().Save("run_gram"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> x = {1, 0, 0, 0, 2, 0, 1, 1, 1, 3, 0, 1};  // 4 rows of 3
  std::vector<float> y(16, -1.0f);
  ASSERT_TRUE((*model)->Run(4, {x.data()}, {y.data()}).ok());
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      float dot = 0;
      for (int k = 0; k < 3; ++k) dot += x[i * 3 + k] * x[j * 3 + k];
      EXPECT_FLOAT_EQ(y[i * 4 + j], dot) << i << "," << j;
    }
  }
}

TEST(CompiledRowsTest, CheckBufferSizesNamesTheTensorThatDiffers) {
  auto model = CompiledModel::Load(Gram().Save("check_gram"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const CompiledModel& m = **model;
  EXPECT_TRUE(m.CheckBufferSizes(4, {4 * 3 * 4}, {4 * 4 * 4}).ok());
  // Sized as [batch, static...] would be: [4,1].
  absl::Status s = m.CheckBufferSizes(4, {4 * 3 * 4}, {4 * 1 * 4});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("output 'y' at 4 rows is [4,4] of FP32 (64 bytes)"));
  EXPECT_THAT(s.message(), HasSubstr("holds 16 bytes"));
  s = m.CheckBufferSizes(4, {3 * 3 * 4}, {4 * 4 * 4});
  EXPECT_THAT(s.message(), HasSubstr("input 'x' at 4 rows is [4,3]"));
  EXPECT_FALSE(m.CheckBufferSizes(0, {0}, {0}).ok());
  EXPECT_FALSE(m.CheckBufferSizes(4, {}, {64}).ok());
}

}  // namespace
}  // namespace numaserve::engine
