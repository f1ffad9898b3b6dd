// SiLU as exporters write it (x * Sigmoid(x)), HardSwish (the opset 14 op,
// and x * HardSigmoid(x)) and a squeeze-excitation block's per-channel Mul:
// folded into the conv before them as one oneDNN post-op where the conv's
// output feeds only the pair, one eltwise step where it has another reader,
// the Mul by a [N, C, 1, 1] gate one step in the convs' layout; each
// against the reference executor, in the tier's blocked layout and in
// channels-last.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

constexpr int64_t kChannels = 24;  // not a whole number of 16-channel blocks

// How the activation after the stem conv is written.
enum class Gate {
  kSigmoidMul,          // Mul(x, Sigmoid(x))
  kHardSigmoidMul,      // Mul(HardSigmoid(x), x), torch's alpha 1/6
  kHardSigmoidDefault,  // Mul(x, HardSigmoid(x)), ONNX's default alpha 0.2, beta 0.5
  kHardSwish,           // HardSwish(x)
};

// Writes `gate` of `in` into `out` (nodes named "gate" and "mul").
void AddGate(OnnxModelBuilder& b, Gate gate, const std::string& in, const std::string& out,
             const std::string& prefix) {
  switch (gate) {
    case Gate::kSigmoidMul:
      b.Node("Sigmoid", {in}, {prefix + "g"}, prefix + "gate");
      b.Node("Mul", {in, prefix + "g"}, {out}, prefix + "mul");
      break;
    case Gate::kHardSigmoidMul: {
      auto& h = b.Node("HardSigmoid", {in}, {prefix + "g"}, prefix + "gate");
      OnnxModelBuilder::AttrFloat(h, "alpha", 1.0f / 6.0f);
      b.Node("Mul", {prefix + "g", in}, {out}, prefix + "mul");
      break;
    }
    case Gate::kHardSigmoidDefault:
      b.Node("HardSigmoid", {in}, {prefix + "g"}, prefix + "gate");
      b.Node("Mul", {in, prefix + "g"}, {out}, prefix + "mul");
      break;
    case Gate::kHardSwish:
      b.Node("HardSwish", {in}, {out}, prefix + "gate");
      break;
  }
}

// stem 3x3 conv (8 -> 24) -> bn -> gate -> [squeeze-excitation: global
// average pool -> 1x1 (24 -> 8) -> gate -> 1x1 (8 -> 24) -> Sigmoid -> Mul
// over the map] -> project 1x1 (24 -> 16) = y. With `second_reader` the
// bn's output is read by a Relu too, added to the project's input.
std::string GatedModel(Gate gate, bool second_reader, bool se) {
  const int64_t h = 10, c = kChannels;
  OnnxModelBuilder b(17);
  b.Input("x", {-1, 8, h, h}).Output("y", {-1, 16, h, h});
  b.Initializer("w0", RandomTensor({c, 8, 3, 3}, 1)).Initializer("b0", RandomTensor({c}, 2));
  b.Initializer("bn_s", RandomTensor({c}, 3)).Initializer("bn_b", RandomTensor({c}, 4));
  b.Initializer("bn_m", RandomTensor({c}, 5));
  kernels::Tensor var = RandomTensor({c}, 6);
  for (float& v : var.data) v = v * v + 0.5f;
  b.Initializer("bn_v", var);
  b.Initializer("w1", RandomTensor({16, c, 1, 1}, 7));
  OnnxModelBuilder::AttrInts(b.Node("Conv", {"x", "w0", "b0"}, {"c0"}, "stem"), "pads",
                             {1, 1, 1, 1});
  b.Node("BatchNormalization", {"c0", "bn_s", "bn_b", "bn_m", "bn_v"}, {"n0"}, "bn");
  AddGate(b, gate, "n0", "a", "");
  std::string x = "a";
  if (se) {
    b.Initializer("se_w1", RandomTensor({8, c, 1, 1}, 8))
        .Initializer("se_b1", RandomTensor({8}, 9));
    b.Initializer("se_w2", RandomTensor({c, 8, 1, 1}, 10))
        .Initializer("se_b2", RandomTensor({c}, 11));
    b.Node("GlobalAveragePool", {"a"}, {"p"}, "se_pool");
    b.Node("Conv", {"p", "se_w1", "se_b1"}, {"s1"}, "se_fc1");
    AddGate(b, gate, "s1", "s2", "se_");
    b.Node("Conv", {"s2", "se_w2", "se_b2"}, {"s3"}, "se_fc2");
    b.Node("Sigmoid", {"s3"}, {"s"}, "se_sigmoid");
    b.Node("Mul", {"s", "a"}, {"m"}, "se_scale");
    x = "m";
  }
  if (second_reader) {
    b.Node("Relu", {"n0"}, {"r"}, "other_reader");
    b.Node("Add", {x, "r"}, {"sum"}, "add");
    x = "sum";
  }
  b.Node("Conv", {x, "w1"}, {"y"}, "project");
  return b.Save(absl::StrCat("gated_", static_cast<int>(gate), second_reader ? "_second" : "",
                             se ? "_se" : ""));
}

// Every profiled step's "description | layouts" after one run at `batch`.
std::vector<std::string> Steps(CompiledModel& model, int64_t batch) {
  model.SetProfiling(true);
  const std::vector<float> x = RandomTensor({batch, 8, 10, 10}, 7).data;
  std::vector<float> y(kernels::NumElements({batch, 16, 10, 10}));
  EXPECT_TRUE(model.Run(batch, {x.data()}, {y.data()}).ok());
  std::vector<std::string> steps;
  for (const StepProfile& row : model.Profile()) {
    steps.push_back(row.description + " | " + row.layouts);
  }
  return steps;
}

const Gate kGates[] = {Gate::kSigmoidMul, Gate::kHardSigmoidMul, Gate::kHardSigmoidDefault,
                       Gate::kHardSwish};

// The gate's nodes as a step names them ("gate+mul", "se_gate+se_mul").
std::string GateName(Gate gate, const std::string& prefix = "") {
  return gate == Gate::kHardSwish ? prefix + "gate" : prefix + "gate+" + prefix + "mul";
}

CompileOptions ChannelsLast() {
  CompileOptions options;
  options.activation_layout = CompileOptions::ActivationLayout::kChannelsLast;
  return options;
}

TEST(GatedActivationTest, FoldsIntoTheConvAndMatchesTheReference) {
  for (Gate gate : kGates) {
    SCOPED_TRACE(absl::StrCat("gate ", static_cast<int>(gate)));
    const std::string path = GatedModel(gate, false, false);
    testing::ExpectCompiledMatchesReference("gated", path, {1, 3}, 1e-9);
    testing::ExpectCompiledMatchesReference("gated_nhwc", path, {1, 3}, 1e-9, ChannelsLast());
    auto model = CompiledModel::Load(path, {});
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<std::string> steps = Steps(**model, 2);
    ASSERT_EQ(steps.size(), 2u) << ::testing::PrintToString(steps);
    EXPECT_THAT(steps[0], HasSubstr("conv: stem+bn+" + GateName(gate)));
    // The gated output stays blocked between the two convs.
    EXPECT_THAT(steps[0], HasSubstr("->n")) << "written plain";
  }
}

TEST(GatedActivationTest, ASecondReaderKeepsItAStepOfItsOwn) {
  for (Gate gate : kGates) {
    SCOPED_TRACE(absl::StrCat("gate ", static_cast<int>(gate)));
    const std::string path = GatedModel(gate, true, false);
    testing::ExpectCompiledMatchesReference("gated_second", path, {1, 3}, 1e-9);
    testing::ExpectCompiledMatchesReference("gated_second_nhwc", path, {1, 3}, 1e-9,
                                            ChannelsLast());
    auto model = CompiledModel::Load(path, {});
    ASSERT_TRUE(model.ok()) << model.status();
    const std::string plan = ::testing::PrintToString(Steps(**model, 1));
    EXPECT_THAT(plan, HasSubstr("\"conv: stem+bn |"));
    EXPECT_THAT(plan, HasSubstr("eltwise: " + GateName(gate) + " |"));
    EXPECT_THAT(plan, Not(HasSubstr("unary:")));
    EXPECT_THAT(plan, Not(HasSubstr("binary:")));
  }
}

TEST(GatedActivationTest, SqueezeExcitationScalesInTheConvsLayout) {
  for (Gate gate : kGates) {
    SCOPED_TRACE(absl::StrCat("gate ", static_cast<int>(gate)));
    const std::string path = GatedModel(gate, false, true);
    testing::ExpectCompiledMatchesReference("gated_se", path, {1, 3}, 1e-9);
    testing::ExpectCompiledMatchesReference("gated_se_nhwc", path, {1, 3}, 1e-9, ChannelsLast());
    for (const CompileOptions& options : {CompileOptions{}, ChannelsLast()}) {
      auto model = CompiledModel::Load(path, options);
      ASSERT_TRUE(model.ok()) << model.status();
      const std::vector<std::string> steps = Steps(**model, 3);
      const std::string plan = ::testing::PrintToString(steps);
      EXPECT_THAT(plan, HasSubstr("conv: stem+bn+" + GateName(gate)));
      EXPECT_THAT(plan, HasSubstr("conv: se_fc1+" + GateName(gate, "se_")));
      EXPECT_THAT(plan, HasSubstr("conv: se_fc2+se_sigmoid"));
      EXPECT_THAT(plan, Not(HasSubstr("binary:")));
      EXPECT_THAT(plan, Not(HasSubstr("unary:")));
      // The scaled map is read and written in the blocked layout, no
      // reorder to plain and back around it, and the gate is written
      // blocked too.
      int found = 0;
      for (const std::string& s : steps) {
        if (s.rfind("channel-scale: se_scale", 0) != 0 && s.rfind("conv: se_fc2", 0) != 0) {
          continue;
        }
        ++found;
        EXPECT_THAT(s, Not(HasSubstr("plain")));
      }
      EXPECT_EQ(found, 2) << plan;
    }
  }
}

// Mul(x, s) with s of one value per channel: a constant [1, C, 1, 1] s
// over every row is a channel-scale step; an x of one row (fixed batch 1)
// broadcast over s's rows is not (the output is not x's shape at batch 2),
// and stays the broadcasting binary step.
TEST(GatedActivationTest, ChannelScaleTakesOnlyAScaleBroadcastOverX) {
  for (bool x_fixed : {false, true}) {
    SCOPED_TRACE(x_fixed ? "x of one row" : "constant scale");
    OnnxModelBuilder b(17);
    b.Input("x", {x_fixed ? 1 : -1, kChannels, 6, 6});
    if (x_fixed) {
      b.Input("s", {-1, kChannels, 1, 1});
    } else {
      b.Initializer("s", RandomTensor({1, kChannels, 1, 1}, 3));
    }
    b.Output("y", {-1, kChannels, 6, 6});
    b.Node("Mul", {"x", "s"}, {"y"}, "scale");
    const std::string path = b.Save(x_fixed ? "scale_x_fixed" : "scale_constant");
    testing::ExpectCompiledMatchesReference("scale", path, {1, 3}, 1e-12);
    auto model = CompiledModel::Load(path, {});
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_THAT((*model)->DescribePlan(),
                HasSubstr(x_fixed ? "binary: scale" : "channel-scale: scale"));
  }
}

}  // namespace
}  // namespace numaserve::engine
