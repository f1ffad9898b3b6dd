// Resize's opset-18 forms: antialias, the axes attribute and
// keep_aspect_ratio_policy, each against values worked out by hand from
// the ONNX spec on models that go through import (libonnx's checker and
// shape inference included), and each with the malformed values that the
// op's own checks refuse, on a node built outside any model so that
// libonnx's checks do not answer first.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/ir/graph.h"
#include "engine/ops/op_registry.h"
#include "engine/reference/reference_executor.h"
#include "kernels/ref/layout_ref.h"
#include "kernels/tensor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using kernels::Tensor;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::FloatEq;
using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;
using ::testing::Pointwise;

using SetAttrs = std::function<void(onnx::NodeProto&)>;

// The constant inputs of a Resize node; an empty one is omitted.
struct ResizeInputs {
  std::vector<float> roi;
  std::vector<float> scales;
  std::vector<int64_t> sizes;
};

// Resize(x) in an opset-18 model, imported and run on the reference.
absl::StatusOr<Tensor> RunResize(const Tensor& x, const ResizeInputs& in, const SetAttrs& attrs) {
  OnnxModelBuilder b(/*opset=*/18);
  b.Input("x", x.shape).Output("y", std::vector<int64_t>(x.shape.size(), kUnknownDim));
  std::vector<std::string> inputs = {"x", "", "", ""};
  if (!in.roi.empty()) {
    b.Initializer("roi", Tensor({static_cast<int64_t>(in.roi.size())}, in.roi));
    inputs[1] = "roi";
  }
  if (!in.scales.empty()) {
    b.Initializer("scales", Tensor({static_cast<int64_t>(in.scales.size())}, in.scales));
    inputs[2] = "scales";
  }
  if (!in.sizes.empty()) {
    b.Int64Initializer("sizes", in.sizes);
    inputs[3] = "sizes";
  }
  while (inputs.back().empty()) inputs.pop_back();
  attrs(b.Node("Resize", inputs, {"y"}, "resize"));
  auto graph = ImportOnnxModel(b.Save("resize"));
  if (!graph.ok()) return graph.status();
  auto out = RunReference(*graph, {x});
  if (!out.ok()) return out.status();
  return (*out)[0];
}

SetAttrs Attrs(const std::string& mode, int64_t antialias) {
  return [=](onnx::NodeProto& n) {
    OnnxModelBuilder::AttrString(n, "mode", mode);
    OnnxModelBuilder::AttrInt(n, "antialias", antialias);
  };
}

// A Resize node named "victim" with these constant inputs, outside any
// model: its op row alone.
struct HandBuiltResize {
  HandBuiltResize(const ResizeInputs& in,
                  const std::vector<std::pair<std::string, AttributeValue>>& attrs) {
    graph.set_opset(18);
    node.name = "victim";
    node.op_type = "Resize";
    node.inputs = {graph.GetOrAddValue("x"), kNoValue, kNoValue, kNoValue};
    node.outputs = {graph.GetOrAddValue("y")};
    auto floats = [&](const std::string& name, const std::vector<float>& v) {
      Constant c;
      c.type = DataType::kFloat32;
      c.shape = {static_cast<int64_t>(v.size())};
      c.f32 = Tensor(c.shape, v);
      const ValueId id = graph.GetOrAddValue(name);
      graph.SetConstant(id, c);
      return id;
    };
    if (!in.roi.empty()) node.inputs[1] = floats("roi", in.roi);
    if (!in.scales.empty()) node.inputs[2] = floats("scales", in.scales);
    if (!in.sizes.empty()) {
      Constant c;
      c.type = DataType::kInt64;
      c.shape = {static_cast<int64_t>(in.sizes.size())};
      c.i64 = in.sizes;
      const ValueId id = graph.GetOrAddValue("sizes");
      graph.SetConstant(id, c);
      node.inputs[3] = id;
    }
    for (const auto& [name, value] : attrs) node.attributes[name] = value;
  }

  // The output shape for an input of shape x, or the node's error.
  absl::StatusOr<Shape> OutShape(const Shape& x) const {
    const OpSchema* op = FindOpSchema("Resize");
    if (absl::Status s = op->validate(graph, node); !s.ok()) return s;
    auto shapes = op->infer_shapes(graph, node, {&x, nullptr, nullptr, nullptr});
    if (!shapes.ok()) return shapes.status();
    return (*shapes)[0];
  }

  absl::StatusOr<Tensor> Run(const Tensor& x) const {
    auto out = FindOpSchema("Resize")->reference(graph, node, {&x, nullptr, nullptr, nullptr});
    if (!out.ok()) return out.status();
    return (*out)[0];
  }

  Graph graph;
  Node node;
};

// The error names the node and says what is wrong.
void ExpectNodeError(const absl::Status& s, const std::string& what) {
  ASSERT_FALSE(s.ok()) << what;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 'victim' (op Resize)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
}

const Tensor kRamp({1, 4}, {1, 2, 3, 4});

// --- antialias ----------------------------------------------------------------------------

TEST(ResizeAntialiasTest, LinearDownsampleStretchesTheTentByOneOverScale) {
  // Scale 0.5: output 0 maps to 0.5 (half_pixel) and the tent reaches 2
  // input points either side: indices -1..2 (-1 is the edge) weigh
  // 1 - 0.5 * |i - 0.5| = .25, .75, .75, .25, over their sum of 2.
  auto y = RunResize(kRamp, {.scales = {1, 0.5f}}, Attrs("linear", 1));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 2}));
  EXPECT_THAT(y->data, Pointwise(FloatEq(), std::vector<float>{1.625f, 3.375f}));
  // Without it, the two nearest points only.
  auto plain = RunResize(kRamp, {.scales = {1, 0.5f}}, Attrs("linear", 0));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->data, Pointwise(FloatEq(), std::vector<float>{1.5f, 3.5f}));
}

TEST(ResizeAntialiasTest, CubicDownsampleStretchesTheKernelByOneOverScale) {
  // Output 0 maps to 0.5; the cubic kernel (a = -0.75) at 0.5 * (i - 0.5)
  // for i in -3..4 weighs -.03515625, -.10546875, .26171875, .87890625 and
  // back, summing to 2. Indices below 0 read 1, index 4 reads 4:
  // (1 * 1 + 2 * .87890625 + 3 * .26171875 - 4 * .140625) / 2.
  auto y = RunResize(kRamp, {.sizes = {1, 2}}, Attrs("cubic", 1));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 2}));
  EXPECT_THAT(y->data, Pointwise(FloatEq(), std::vector<float>{1.490234375f, 3.509765625f}));
  auto plain = RunResize(kRamp, {.sizes = {1, 2}}, Attrs("cubic", 0));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->data, Pointwise(FloatEq(), std::vector<float>{1.40625f, 3.59375f}));
}

TEST(ResizeAntialiasTest, UpsamplingAndNearestAreAsWithout) {
  for (const auto& [mode, scale] : std::vector<std::pair<std::string, float>>{
           {"linear", 2.0f}, {"cubic", 1.5f}, {"nearest", 0.5f}}) {
    auto with = RunResize(kRamp, {.scales = {1, scale}}, Attrs(mode, 1));
    auto without = RunResize(kRamp, {.scales = {1, scale}}, Attrs(mode, 0));
    ASSERT_TRUE(with.ok()) << with.status();
    ASSERT_TRUE(without.ok()) << without.status();
    EXPECT_EQ(with->shape, without->shape) << mode;
    EXPECT_EQ(with->data, without->data) << mode;
  }
}

TEST(ResizeAntialiasTest, MalformedAntialiasIsAnErrorNamingTheNode) {
  for (int64_t antialias : {int64_t{2}, int64_t{-1}}) {
    HandBuiltResize r({.scales = {1, 0.5f}},
                      {{"mode", std::string("linear")}, {"antialias", antialias}});
    ExpectNodeError(r.OutShape({1, 4}).status(), "antialias must be 0 or 1");
  }
  // A scale so small that the dim is empty: an empty output, not a window
  // of 2e30 taps.
  HandBuiltResize tiny({.scales = {1, 1e-30f}},
                       {{"mode", std::string("cubic")}, {"antialias", int64_t{1}}});
  auto shape = tiny.OutShape({1, 4});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, (Shape{1, 0}));
  auto y = tiny.Run(kRamp);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(y->data.empty());
  // The kernel itself refuses such a scale with a non-empty output.
  kernels::ResizeParams p{.mode = "linear", .scales = {1.0f, 1e-30f}, .antialias = true};
  auto refused = kernels::ResizeRef(kRamp, p, {1, 1});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("too small"));
}

TEST(ResizeAntialiasTest, ShrinkingEveryDimOfARank8InputIsAFewPasses) {
  // 4^8 ones to one point with cubic at scale 0.25: 16 taps per dim. Taken
  // as the product of every dim's taps that is 16^8 (4e9) terms for the
  // one output; one dim at a time it is a few thousand.
  HandBuiltResize r({.scales = std::vector<float>(8, 0.25f)},
                    {{"mode", std::string("cubic")}, {"antialias", int64_t{1}}});
  const Shape x_shape(8, 4);
  auto shape = r.OutShape(x_shape);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, Shape(8, 1));
  auto y = r.Run(Tensor(x_shape, std::vector<float>(1 << 16, 1.0f)));
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_EQ(y->data.size(), 1u);
  EXPECT_NEAR(y->data[0], 1.0f, 1e-5f);  // the weights sum to 1
}

// --- axes ---------------------------------------------------------------------------------

const Tensor k2x2({1, 1, 2, 2}, {1, 2, 3, 4});

SetAttrs Axes(const std::vector<int64_t>& axes, const std::string& mode = "nearest") {
  return [=](onnx::NodeProto& n) {
    OnnxModelBuilder::AttrString(n, "mode", mode);
    OnnxModelBuilder::AttrInts(n, "axes", axes);
  };
}

TEST(ResizeAxesTest, ScalesAndSizesGivenForTheListedAxesOnly) {
  // Nearest, half_pixel, round_prefer_floor, 2x: outputs 0..3 read 0,0,1,1.
  const std::vector<float> want = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  for (const auto& axes : std::vector<std::vector<int64_t>>{{2, 3}, {-2, -1}, {3, 2}}) {
    auto y = RunResize(k2x2, {.scales = {2, 2}}, Axes(axes));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->shape, (Shape{1, 1, 4, 4}));
    EXPECT_THAT(y->data, ElementsAreArray(want));
  }
  // The last dim alone, by size; the others keep theirs.
  auto y = RunResize(k2x2, {.sizes = {4}}, Axes({-1}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 1, 2, 4}));
  EXPECT_THAT(y->data, ElementsAre(1, 1, 2, 2, 3, 3, 4, 4));
  // Scale 3 on dim 2 and 1 on dim 3, in that order.
  y = RunResize(k2x2, {.scales = {3, 1}}, Axes({2, 3}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 1, 6, 2}));
}

TEST(ResizeAxesTest, RoiGivenForTheListedAxesOnly) {
  // tf_crop_and_resize of dim 3 from 0.5 to 1 into 3 points: input
  // coordinates 1.5, 2.25, 3 of the ramp 0..3 (linear).
  const Tensor x({1, 1, 1, 4}, {0, 1, 2, 3});
  auto y = RunResize(x, {.roi = {0.5f, 1.0f}, .sizes = {3}}, [](onnx::NodeProto& n) {
    Axes({3}, "linear")(n);
    OnnxModelBuilder::AttrString(n, "coordinate_transformation_mode", "tf_crop_and_resize");
  });
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 1, 1, 3}));
  EXPECT_THAT(y->data, Pointwise(FloatEq(), std::vector<float>{1.5f, 2.25f, 3.0f}));
}

TEST(ResizeAxesTest, MalformedAxesAreErrorsNamingTheNode) {
  const std::pair<std::string, AttributeValue> nearest = {"mode", std::string("nearest")};
  auto axes = [](std::vector<int64_t> v) {
    return std::make_pair(std::string("axes"), AttributeValue(v));
  };
  struct Case {
    ResizeInputs in;
    std::vector<int64_t> axes;
    std::string what;
  };
  const std::vector<Case> cases = {
      {{.scales = {2}}, {4}, "axis 4 is out of range for rank 4"},
      {{.scales = {2}}, {-5}, "axis -5 is out of range"},
      {{.scales = {2, 2}}, {2, -2}, "axes lists dim 2 twice"},
      {{.scales = {2, 2, 2}}, {2, 3}, "scales has 3 values for the 2 axes"},
      {{.sizes = {4}}, {2, 3}, "sizes has 1 values for the 2 axes"},
      {{.scales = {0, 2}}, {2, 3}, "is not positive"},
      {{.scales = {-1, 2}}, {2, 3}, "is not positive"},
      {{.scales = {1e30f, 2}}, {2, 3}, "gives more than"},
      {{.sizes = {int64_t{1} << 40, 2}}, {2, 3}, "exceeds the limit"},
      {{.sizes = {-3, 2}}, {2, 3}, "negative dim"},
  };
  for (const Case& c : cases) {
    HandBuiltResize r(c.in, {nearest, axes(c.axes)});
    ExpectNodeError(r.OutShape({1, 1, 2, 2}).status(), c.what);
  }
  // tf_crop_and_resize's roi: a start and an end per listed axis, finite.
  for (const auto& [roi, what] : std::vector<std::pair<std::vector<float>, std::string>>{
           {{0, 0, 1, 1}, "needs a constant roi of 2 values, got 4"},
           {{std::nanf(""), 1}, "roi holds nan"},
           {{0, std::numeric_limits<float>::infinity()}, "roi holds inf"}}) {
    HandBuiltResize r({.roi = roi, .scales = {2}},
                      {nearest,
                       axes({3}),
                       {"coordinate_transformation_mode", std::string("tf_crop_and_resize")}});
    ExpectNodeError(r.OutShape({1, 1, 2, 2}).status(), what);
  }
}

// --- keep_aspect_ratio_policy -------------------------------------------------------------

SetAttrs Policy(const std::string& policy) {
  return [=](onnx::NodeProto& n) {
    OnnxModelBuilder::AttrString(n, "mode", "nearest");
    OnnxModelBuilder::AttrInts(n, "axes", {2, 3});
    OnnxModelBuilder::AttrString(n, "keep_aspect_ratio_policy", policy);
  };
}

TEST(ResizeKeepAspectRatioTest, NotLargerAndNotSmallerShareOneScale) {
  // 2x4 asked to fit 3x3: the ratios are 1.5 and 0.75.
  const Tensor x({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  // not_larger: scale 0.75, dims round(1.5) = 2 (halves up) and 3. Dim 3
  // reads 0.17, 1.5, 2.83: 0, 1, 3; dim 2 (scale 0.75 too) 0.17, 1.5: 0, 1.
  auto y = RunResize(x, {.sizes = {3, 3}}, Policy("not_larger"));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 1, 2, 3}));
  EXPECT_THAT(y->data, ElementsAre(1, 2, 4, 5, 6, 8));
  // not_smaller: scale 1.5, dims 3 and 6. Dim 2 reads -0.17, 0.5, 1.17:
  // 0, 0, 1; dim 3 0, 0, 1, 2, 2, 3.
  y = RunResize(x, {.sizes = {3, 3}}, Policy("not_smaller"));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 1, 3, 6}));
  EXPECT_THAT(y->data, ElementsAre(1, 1, 2, 3, 3, 4, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8));
  // stretch: 3x3 as asked.
  y = RunResize(x, {.sizes = {3, 3}}, Policy("stretch"));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{1, 1, 3, 3}));
}

TEST(ResizeKeepAspectRatioTest, MalformedPoliciesAndSizesAreErrorsNamingTheNode) {
  auto make = [](const ResizeInputs& in, const std::string& policy) {
    return HandBuiltResize(in, {{"mode", std::string("nearest")},
                                {"axes", std::vector<int64_t>{2, 3}},
                                {"keep_aspect_ratio_policy", policy}});
  };
  ExpectNodeError(make({.sizes = {3, 3}}, "fit").OutShape({1, 1, 2, 4}).status(),
                  "keep_aspect_ratio_policy 'fit' is not stretch, not_larger or not_smaller");
  ExpectNodeError(make({.scales = {2, 2}}, "not_larger").OutShape({1, 1, 2, 4}).status(),
                  "needs sizes, not scales");
  // 2^30 times both dims of 2x2: each dim fits, the output does not.
  ExpectNodeError(
      make({.sizes = {1, int64_t{1} << 31}}, "not_smaller").OutShape({1, 1, 2, 2}).status(),
      "exceeds the limit");
  // One dim past the limit on its own.
  ExpectNodeError(
      make({.sizes = {1, int64_t{1} << 31}}, "not_smaller").OutShape({1, 1, 2, 1}).status(),
      "gives more than");
  ExpectNodeError(make({.sizes = {3, 3}}, "not_larger").OutShape({1, 1, 0, 4}).status(),
                  "needs a non-empty input");
  ExpectNodeError(make({.sizes = {3}}, "not_larger").OutShape({1, 1, 2, 4}).status(),
                  "sizes has 1 values for the 2 axes");
}

// --- both forms -----------------------------------------------------------------------------

TEST(ResizeTest, SizesForAnEmptyDimAreAnError) {
  // A non-empty output from an empty input would read elements that are
  // not there.
  HandBuiltResize r({.sizes = {1, 3}}, {{"mode", std::string("nearest")}});
  ExpectNodeError(r.OutShape({1, 0}).status(), "which is empty");
  kernels::ResizeParams p{.scales = {1.0f, 1.0f}};
  auto refused = kernels::ResizeRef(Tensor(Shape{1, 0}), p, {1, 3});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("empty"));
  // Empty to empty is fine.
  auto shape =
      HandBuiltResize({.sizes = {1, 0}}, {{"mode", std::string("nearest")}}).OutShape({1, 0});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, (Shape{1, 0}));
}

}  // namespace
}  // namespace numaserve::engine
