// Shapes computed in the graph, as exporters write them: Shape -> Gather ->
// Unsqueeze / Concat / arithmetic -> a Reshape's target, a Slice's ends, an
// Expand's shape, a Range's limit, a Resize's sizes. Such values are known
// once the input shapes are: each model here loads, runs at several
// signatures (one after the other on one CompiledModel, and back) against
// the reference executor, and a value computed from an input's elements is
// still refused at load, naming the node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/ops/shape_propagation.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using testing::RandomTensor;
using testing::RunAgainstReference;

// An INT64 scalar initializer.
void Int64Scalar(OnnxModelBuilder& b, const std::string& name, int64_t v) {
  b.RawInitializer(name, onnx::TensorProto::INT64, {}, &v, sizeof(v));
}

// dim `d` of `x` as a 1-element INT64 vector named `out`: Shape, Gather
// (a scalar), Unsqueeze, as torch.onnx.export writes x.size(d).
void DimOf(OnnxModelBuilder& b, const std::string& x, int64_t d, const std::string& out) {
  const std::string index = absl::StrCat(out, "_index");
  Int64Scalar(b, index, d);
  b.Node("Shape", {x}, {out + "_shape"}, out + "_shape");
  b.Node("Gather", {out + "_shape", index}, {out + "_scalar"}, out + "_gather");
  b.Int64Initializer(out + "_axes", {0});
  b.Node("Unsqueeze", {out + "_scalar", out + "_axes"}, {out}, out + "_unsqueeze");
}

// Loads PATH and runs it at each signature in turn (each signature of
// SIGNATURES, then the first again, so that a plan made for one is reused
// after another's), against the reference.
void ExpectMatchesAtSignatures(const std::string& path,
                               const std::vector<CompiledModel::InputShapes>& signatures) {
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<CompiledModel::InputShapes> order = signatures;
  order.push_back(signatures.front());
  order.push_back(signatures.back());
  uint32_t seed = 1;
  for (const auto& shapes : order) {
    EXPECT_LE(RunAgainstReference(**model, *graph, shapes, seed += 10), 1e-5)
        << (*model)->DescribePlan();
  }
}

// x [batch, seq, 8] and its dims `batch` and `seq` (DimOf), viewed as
// [batch, seq, 2, 4] (the target Concat(batch, seq, 2, 4) named
// `target_name`), heads moved before seq and back (two Transposes) into
// `back` [batch, seq, 2, 4].
OnnxModelBuilder SplitHeadsAndBack(const std::string& target_name) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  DimOf(b, "x", 0, "batch");
  DimOf(b, "x", 1, "seq");
  b.Int64Initializer("heads", {2, 4});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"batch", "seq", "heads"}, {target_name}, target_name),
                            "axis", 0);
  b.Node("Reshape", {"x", target_name}, {"split"}, "split_heads");
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"split"}, {"moved"}, "move_heads"), "perm",
                             {0, 2, 1, 3});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"moved"}, {"back"}, "move_back"), "perm",
                             {0, 2, 1, 3});
  return b;
}

// SplitHeadsAndBack, then back to [batch, seq * 8 / 8 * 2 / 2, 8]: the
// second target is Concat(batch, -1, seq * 0 + 8), with Mul and Add on the
// dims.
std::string ReshapeModel() {
  OnnxModelBuilder b = SplitHeadsAndBack("target1");
  b.Int64Initializer("zero", {0});
  b.Int64Initializer("eight", {8});
  b.Int64Initializer("minus_one", {-1});
  b.Node("Mul", {"seq", "zero"}, {"seq_zero"}, "seq_times_zero");
  b.Node("Add", {"seq_zero", "eight"}, {"hidden"}, "hidden");
  auto& concat2 = b.Node("Concat", {"batch", "minus_one", "hidden"}, {"target2"}, "concat2");
  OnnxModelBuilder::AttrInt(concat2, "axis", 0);
  b.Node("Reshape", {"back", "target2"}, {"merged"}, "merge_heads");
  b.Node("Relu", {"merged"}, {"y"}, "relu");
  return b.Save("shape_values_reshape");
}

TEST(ShapeValuesTest, ReshapeTargetFromShapeGatherConcat) {
  ExpectMatchesAtSignatures(ReshapeModel(), {{{2, 5, 8}}, {{1, 13, 8}}, {{3, 1, 8}}});
}

// positions = Slice(table [128, 8], starts 0, ends seq, axes 0): the first
// seq rows of a position table, added to x [batch, seq, 8].
std::string SliceModel() {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  b.Initializer("table", RandomTensor({128, 8}, 7));
  DimOf(b, "x", 1, "seq");
  b.Int64Initializer("starts", {0});
  b.Int64Initializer("axes", {0});
  b.Node("Slice", {"table", "starts", "seq", "axes"}, {"positions"}, "positions");
  b.Node("Add", {"x", "positions"}, {"y"}, "add_positions");
  return b.Save("shape_values_slice");
}

TEST(ShapeValuesTest, SliceEndsFromShape) {
  ExpectMatchesAtSignatures(SliceModel(), {{{2, 5, 8}}, {{1, 100, 8}}, {{3, 1, 8}}});
}

// A [1, 1, 8] bias expanded to x's shape (Expand's shape Shape(x)), and a
// [1, 8] row expanded to Concat(seq, 8), added to x [batch, seq, 8].
std::string ExpandModel() {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  b.Initializer("bias", RandomTensor({1, 1, 8}, 3));
  b.Initializer("row", RandomTensor({1, 8}, 4));
  b.Node("Shape", {"x"}, {"x_shape"}, "x_shape");
  b.Node("Expand", {"bias", "x_shape"}, {"bias_full"}, "expand_bias");
  DimOf(b, "x", 1, "seq");
  b.Int64Initializer("eight", {8});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"seq", "eight"}, {"rows_shape"}, "rows_shape"),
                            "axis", 0);
  b.Node("Expand", {"row", "rows_shape"}, {"rows"}, "expand_rows");
  b.Node("Add", {"x", "bias_full"}, {"a"}, "add_bias");
  b.Node("Add", {"a", "rows"}, {"y"}, "add_rows");
  return b.Save("shape_values_expand");
}

TEST(ShapeValuesTest, ExpandShapeFromShape) {
  ExpectMatchesAtSignatures(ExpandModel(), {{{2, 5, 8}}, {{1, 9, 8}}, {{4, 2, 8}}});
}

// Position ids as exporters write them: Range(0, seq, 1) on INT64
// scalars, cast to FP32, as [1, seq, 1], added to x [batch, seq, 8].
std::string RangeModel() {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  b.Node("Shape", {"x"}, {"x_shape"}, "x_shape");
  Int64Scalar(b, "one_index", 1);
  b.Node("Gather", {"x_shape", "one_index"}, {"seq"}, "seq");
  Int64Scalar(b, "start", 0);
  Int64Scalar(b, "delta", 1);
  b.Node("Range", {"start", "seq", "delta"}, {"ids"}, "position_ids");
  OnnxModelBuilder::AttrInt(b.Node("Cast", {"ids"}, {"ids_f"}, "cast_ids"), "to",
                            onnx::TensorProto::FLOAT);
  b.Int64Initializer("axes", {0, 2});
  b.Node("Unsqueeze", {"ids_f", "axes"}, {"ids_3d"}, "ids_3d");
  b.Node("Add", {"x", "ids_3d"}, {"y"}, "add_ids");
  return b.Save("shape_values_range");
}

TEST(ShapeValuesTest, RangeLimitFromDim) {
  ExpectMatchesAtSignatures(RangeModel(), {{{2, 5, 8}}, {{1, 13, 8}}, {{3, 1, 8}}});
}

// An image upsampled to twice its height and width: Resize's sizes are
// Concat(Shape(image)[0:2], Shape(image)[2:4] * 2) (nearest).
std::string ResizeModel() {
  OnnxModelBuilder b(13);
  b.NamedInput("image", {-1, 3, -1, -1}, {"batch", "", "height", "width"});
  b.NamedOutput("y", {-1, 3, -1, -1}, {"batch", "", "height2", "width2"});
  b.Node("Shape", {"image"}, {"s"}, "image_shape");
  b.Int64Initializer("zero", {0});
  b.Int64Initializer("two", {2});
  b.Int64Initializer("four", {4});
  b.Node("Slice", {"s", "zero", "two"}, {"nc"}, "nc");
  b.Node("Slice", {"s", "two", "four"}, {"hw"}, "hw");
  b.Int64Initializer("twice", {2, 2});
  b.Node("Mul", {"hw", "twice"}, {"hw2"}, "hw2");
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"nc", "hw2"}, {"sizes"}, "sizes"), "axis", 0);
  auto& resize = b.Node("Resize", {"image", "", "", "sizes"}, {"y"}, "upsample");
  OnnxModelBuilder::AttrString(resize, "mode", "nearest");
  return b.Save("shape_values_resize");
}

TEST(ShapeValuesTest, ResizeSizesFromShapeTimesTwo) {
  ExpectMatchesAtSignatures(ResizeModel(), {{{2, 3, 4, 6}}, {{1, 3, 7, 5}}, {{3, 3, 1, 2}}});
}

// Only the batch dynamic: Reshape's target Concat(batch, -1) from the
// shape; run at batch sizes (one plan per batch size).
TEST(ShapeValuesTest, BatchOnlyModelRunsAtEveryBatchSize) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, 4, 6}, {"batch", "", ""});
  b.NamedOutput("y", {-1, 24}, {"batch", ""});
  DimOf(b, "x", 0, "batch");
  b.Int64Initializer("rest", {-1});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"batch", "rest"}, {"target"}, "target"), "axis", 0);
  b.Node("Reshape", {"x", "target"}, {"flat"}, "flatten");
  b.Node("Relu", {"flat"}, {"y"}, "relu");
  ExpectMatchesAtSignatures(b.Save("shape_values_batch"), {{{1, 4, 6}}, {{3, 4, 6}}, {{2, 4, 6}}});
}

// seq - batch agrees (0) wherever every dynamic dim has one size, as at
// the sizes load-time folding looks at first: a target computed from it
// (Concat(batch, (seq - batch) + batch, 8) = [batch, seq, 8]) must not be
// folded there and reused at other signatures.
TEST(ShapeValuesTest, ValueAgreeingAtEqualDimsIsNotFoldedForOtherSignatures) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  DimOf(b, "x", 0, "batch");
  DimOf(b, "x", 1, "seq");
  b.Node("Sub", {"seq", "batch"}, {"diff"}, "diff");
  b.Node("Add", {"diff", "batch"}, {"seq_again"}, "seq_again");
  b.Int64Initializer("eight", {8});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"batch", "seq_again", "eight"}, {"target"}, "target"),
                            "axis", 0);
  b.Node("Reshape", {"x", "target"}, {"r"}, "reshape");
  b.Node("Relu", {"r"}, {"y"}, "relu");
  ExpectMatchesAtSignatures(b.Save("shape_values_agreeing"),
                            {{{2, 5, 8}}, {{3, 3, 8}}, {{1, 9, 8}}});
}

// A comparison of the batch with a threshold (batch > 5) is false at
// every small batch: it must not be folded there, so that batch 8 takes
// the other branch.
TEST(ShapeValuesTest, BatchAgainstAThresholdIsNotFoldedToItsSmallBatchAnswer) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, 8}, {"batch", ""});
  b.NamedOutput("y", {-1, 8}, {"batch", ""});
  DimOf(b, "x", 0, "batch");
  b.Int64Initializer("five", {5});
  b.Node("Greater", {"batch", "five"}, {"many"}, "many");
  b.Node("Neg", {"x"}, {"neg"}, "neg");
  b.Node("Where", {"many", "neg", "x"}, {"y"}, "pick");
  const std::string path = b.Save("shape_values_threshold");
  ExpectMatchesAtSignatures(path, {{{2, 8}}, {{8, 8}}, {{5, 8}}, {{6, 8}}});
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  for (int64_t rows : {5, 6}) {
    std::vector<float> x(static_cast<size_t>(rows) * 8, 1.5f), y(x.size());
    ASSERT_TRUE((*model)->Run(rows, {x.data()}, {y.data()}).ok());
    EXPECT_EQ(y[0], rows > 5 ? -1.5f : 1.5f) << rows << " rows";
  }
  // Nor may requests of different batches be computed together.
  EXPECT_FALSE((*model)->info().batched);
}

// A target computed from an input's elements is no shape value: refused at
// load, naming the node and its input.
TEST(ShapeValuesTest, TargetFromInputDataIsRefusedAtLoad) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedInput("n", {1}, {""}, onnx::TensorProto::INT64);
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  DimOf(b, "x", 0, "batch");
  b.Int64Initializer("eight", {8});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"batch", "n", "eight"}, {"target"}, "target"), "axis",
                            0);
  b.Node("Reshape", {"x", "target"}, {"y"}, "data_reshape");
  const std::string path = b.Save("shape_values_data");
  auto graph = ImportOnnxModel(path);
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("node 'data_reshape' (op Reshape)"));
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("target shape must be a constant"));
  auto model = CompiledModel::Load(path, {});
  EXPECT_FALSE(model.ok());

  // A Slice whose ends are a sum of a dim and an input's value: refused too.
  OnnxModelBuilder s(17);
  s.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  s.NamedInput("k", {1}, {""}, onnx::TensorProto::INT64);
  s.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  DimOf(s, "x", 1, "seq");
  s.Node("Add", {"seq", "k"}, {"ends"}, "ends");
  s.Int64Initializer("starts", {0});
  s.Int64Initializer("axes", {1});
  s.Node("Slice", {"x", "starts", "ends", "axes"}, {"y"}, "data_slice");
  auto sliced = ImportOnnxModel(s.Save("shape_values_data_slice"));
  ASSERT_FALSE(sliced.ok());
  EXPECT_THAT(std::string(sliced.status().message()), HasSubstr("node 'data_slice' (op Slice)"));
  EXPECT_THAT(std::string(sliced.status().message()), HasSubstr("input 2"));
}

// A file chaining shape values past kMaxShapeValuesTotal elements (300
// Adds on a 4096-element Expand of seq) leaves the rest to run time: the
// values of one signature hold at most that many elements (what is past
// it runs as data; a small Reshape target after it still fits).
TEST(ShapeValuesTest, ValuesPastTheTotalBoundAreNotComputed) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("y", {-1, -1, 8}, {"batch", "seq", ""});
  DimOf(b, "x", 0, "batch");
  DimOf(b, "x", 1, "seq");
  b.Int64Initializer("wide", {kMaxShapeValueElements});
  b.Node("Expand", {"seq", "wide"}, {"chain_0"}, "expand_seq");
  b.Int64Initializer("one", {1});
  constexpr int kChain = 300;
  static_assert(int64_t{kChain} * kMaxShapeValueElements > kMaxShapeValuesTotal);
  for (int i = 0; i < kChain; ++i) {
    b.Node("Add", {absl::StrCat("chain_", i), "one"}, {absl::StrCat("chain_", i + 1)},
           absl::StrCat("chain_add_", i));
  }
  // An output: a chain no output needs is dropped at import.
  b.Output(absl::StrCat("chain_", kChain), {kMaxShapeValueElements}, onnx::TensorProto::INT64);
  b.Int64Initializer("eight", {8});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"batch", "seq", "eight"}, {"target"}, "target"),
                            "axis", 0);
  b.Node("Reshape", {"x", "target"}, {"y"}, "late_reshape");
  auto graph = ImportOnnxModel(b.Save("shape_values_total"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  ShapeValues values;
  auto shapes = PropagateShapesAndValues(*graph, {{2, 5, 8}}, values);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  int64_t total = 0;
  for (const auto& [id, value] : values) total += kernels::NumElements(value.shape);
  EXPECT_LE(total, kMaxShapeValuesTotal);
  EXPECT_LT(values.size(), static_cast<size_t>(kChain));
  const ValueId last = graph->FindValue(absl::StrCat("chain_", kChain)).value_or(kNoValue);
  ASSERT_NE(last, kNoValue);
  EXPECT_FALSE(values.contains(last));
  const ValueId target = graph->FindValue("target").value_or(kNoValue);
  ASSERT_NE(target, kNoValue);
  ASSERT_TRUE(values.contains(target));
  EXPECT_EQ(values.at(target).i64, (std::vector<int64_t>{2, 5, 8}));
}

// Shape values are computed when a signature's plan is made, not per run:
// the plan for a signature already run is reused as it is.
TEST(ShapeValuesTest, ValuesAreComputedOncePerSignature) {
  const std::string path = ReshapeModel();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const CompiledModel::InputShapes a = {{2, 5, 8}}, c = {{3, 7, 8}};
  std::vector<float> in(3 * 7 * 8, 0.5f), out(3 * 7 * 8);
  for (const auto& shapes : {a, c, a, c}) {
    const absl::Status run = (*model)->Run(shapes, {in.data()}, {out.data()});
    ASSERT_TRUE(run.ok()) << run;
  }
  EXPECT_EQ((*model)->CachedBatchPlans().plans, 2);
}

// The steps of PLAN (a signature's, PlanAt) by the node names they
// describe ("typed_reference: seq_gather" -> "seq_gather").
std::vector<std::string> StepNodes(const std::vector<PlannedStep>& plan) {
  std::vector<std::string> nodes;
  for (const PlannedStep& step : plan) {
    nodes.push_back(step.description.substr(step.description.find(": ") + 2));
  }
  return nodes;
}

// Every kind of reader at once, on x [batch, seq, 8]: a Reshape's target
// Concat(batch, seq, 2, 4), a Slice's ends (seq), an Expand's shape
// Concat(seq, 8), and position ids Range(0, seq) cast to FP32 and added to
// the data. The nodes computing the dims and the targets run when the plan
// is made, not per request; the Cast whose output the Add reads as data
// (and the Slice and Expand, whose outputs it reads) keep their steps.
std::string AllReadersModel() {
  OnnxModelBuilder b = SplitHeadsAndBack("target");
  b.Int64Initializer("minus_one", {-1});
  b.Int64Initializer("eight", {8});
  OnnxModelBuilder::AttrInt(
      b.Node("Concat", {"batch", "minus_one", "eight"}, {"target2"}, "target2"), "axis", 0);
  b.Node("Reshape", {"back", "target2"}, {"merged"}, "merge_heads");
  b.Initializer("table", RandomTensor({700, 8}, 7));
  b.Int64Initializer("starts", {0});
  b.Int64Initializer("axes", {0});
  b.Node("Slice", {"table", "starts", "seq", "axes"}, {"positions"}, "positions");
  b.Initializer("row", RandomTensor({1, 8}, 4));
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"seq", "eight"}, {"rows_shape"}, "rows_shape"),
                            "axis", 0);
  b.Node("Expand", {"row", "rows_shape"}, {"rows"}, "expand_rows");
  Int64Scalar(b, "start", 0);
  Int64Scalar(b, "delta", 1);
  b.Node("Range", {"start", "seq_scalar", "delta"}, {"ids"}, "position_ids");
  OnnxModelBuilder::AttrInt(b.Node("Cast", {"ids"}, {"ids_f"}, "cast_ids"), "to",
                            onnx::TensorProto::FLOAT);
  b.Int64Initializer("ids_axes", {0, 2});
  b.Node("Unsqueeze", {"ids_f", "ids_axes"}, {"ids_3d"}, "ids_3d");
  b.Node("Add", {"merged", "positions"}, {"a"}, "add_positions");
  b.Node("Add", {"a", "rows"}, {"c"}, "add_rows");
  b.Node("Add", {"c", "ids_3d"}, {"y"}, "add_ids");
  return b.Save("shape_values_all_readers");
}

// A signature's plan leaves out the steps computing shape values that no
// step reads as data: the dims (Shape, Gather), the targets (Concat) and
// the Range the Cast reads; their readers read the values computed when
// the plan was made. At every signature, against the reference.
TEST(ShapeValuesTest, StepsComputingShapeValuesAreDroppedFromEachPlan) {
  const std::string path = AllReadersModel();
  // x [2, 5, 8], [1, 13, 8] and [3, 1, 8]; at [1, 600, 8] the Expand's
  // output (4,800 elements) is past kMaxShapeValueElements: data, as
  // before, and its shape Concat(seq, 8) still a shape value.
  const std::vector<CompiledModel::InputShapes> signatures = {
      {{2, 5, 8}}, {{1, 13, 8}}, {{3, 1, 8}}, {{1, 600, 8}}};
  ExpectMatchesAtSignatures(path, signatures);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::string> computed = {"batch_shape", "batch_gather", "seq_shape",
                                             "seq_gather",  "target",       "target2",
                                             "rows_shape",  "position_ids"};
  const std::vector<std::string> kept = {"move_heads", "move_back",     "positions", "expand_rows",
                                         "cast_ids",   "add_positions", "add_rows",  "add_ids"};
  std::vector<float> in(1 * 600 * 8, 0.25f), out(1 * 600 * 8);
  for (const auto& shapes : signatures) {
    SCOPED_TRACE(kernels::ShapeToString(shapes[0]));
    ASSERT_TRUE((*model)->Run(shapes, {in.data()}, {out.data()}).ok());
    auto plan = (*model)->PlanAt(shapes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<std::string> nodes = StepNodes(*plan);
    for (const std::string& name : computed) {
      EXPECT_THAT(nodes, ::testing::Not(::testing::Contains(name))) << (*model)->DescribePlan();
    }
    for (const std::string& name : kept) EXPECT_THAT(nodes, ::testing::Contains(name));
    // Each of the compiled steps either runs or computes a shape value.
    EXPECT_EQ(plan->size(), kept.size());
    const std::string compiled = (*model)->DescribePlan();
    EXPECT_EQ(plan->size() + computed.size(),
              static_cast<size_t>(std::count(compiled.begin(), compiled.end(), '\n')));
  }
}

// A shape value that is also a graph output (Shape(x) as INT64) is still
// written by its step at every signature; the Gather and Concat computing
// a Reshape target from it are dropped.
TEST(ShapeValuesTest, ShapeValueThatIsAnOutputIsStillProduced) {
  OnnxModelBuilder b(17);
  b.NamedInput("x", {-1, -1, 8}, {"batch", "seq", ""});
  b.NamedOutput("dims", {3}, {""}, onnx::TensorProto::INT64);
  b.NamedOutput("y", {-1, -1}, {"batch", ""});
  b.Node("Shape", {"x"}, {"dims"}, "dims");
  Int64Scalar(b, "zero", 0);
  b.Node("Gather", {"dims", "zero"}, {"batch_scalar"}, "batch");
  b.Int64Initializer("axes", {0});
  b.Node("Unsqueeze", {"batch_scalar", "axes"}, {"batch"}, "batch_1d");
  b.Int64Initializer("minus_one", {-1});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"batch", "minus_one"}, {"target"}, "target"), "axis",
                            0);
  b.Node("Reshape", {"x", "target"}, {"flat"}, "flatten");
  b.Node("Relu", {"flat"}, {"y"}, "relu");
  auto model = CompiledModel::Load(b.Save("shape_values_output"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  for (const CompiledModel::InputShapes& shapes :
       std::vector<CompiledModel::InputShapes>{{{2, 5, 8}}, {{1, 9, 8}}, {{2, 5, 8}}}) {
    const Shape& s = shapes[0];
    std::vector<float> x(kernels::NumElements(s));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
    std::vector<int64_t> dims(3, -1);
    std::vector<float> y(x.size(), -7.0f);
    ASSERT_TRUE((*model)->Run(shapes, {x.data()}, {dims.data(), y.data()}).ok());
    EXPECT_EQ(dims, (std::vector<int64_t>{s[0], s[1], s[2]}));
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], std::max(x[i], 0.0f)) << i;
    auto plan = (*model)->PlanAt(shapes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_THAT(StepNodes(*plan), ::testing::ElementsAre("dims", "relu"));
  }
}

}  // namespace
}  // namespace numaserve::engine
