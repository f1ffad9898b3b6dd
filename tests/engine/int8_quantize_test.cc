// INT8 post-training quantization (engine/quantize/quantize.h) and QDQ models on the
// INT8 kernels: the range and weight arithmetic; a small CNN and an MLP
// quantized on random calibration data run every conv and weight matmul
// INT8 and match the QDQ model's meaning (the reference executor running
// its QuantizeLinear/DequantizeLinear ops) and, within INT8's error, FP32;
// a QDQ pair read by an op that is not INT8 runs as a fake-quantize step,
// or as post-ops of the conv that produces its input;
// the trained Fashion-MNIST MLP quantized on training images keeps its test
// accuracy within 0.5 point; and the errors (an old opset, nothing to
// quantize, calibration that does not fit the model, NaN activations).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/quantize/quantize.h"
#include "engine/reference/reference_executor.h"
#include "kernels/dispatch.h"
#include "kernels/onednn/onednn_common.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/conv_bn_block.h"
#include "tests/engine/onnx_model_builder.h"
#include "tests/prerequisites.h"
#include "training/idx_file.h"

namespace numaserve::engine {
namespace {

using testing::ConvBnBlocks;
using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// Writes `bytes` beside the test's other temporary models.
std::string SaveBytes(const std::string& stem, const std::string& bytes) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", stem, "_", getpid(), ".onnx");
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::vector<CalibrationBatch> RandomCalibration(const std::vector<int64_t>& row_shape,
                                                int64_t batches, int64_t rows, uint32_t seed) {
  std::vector<CalibrationBatch> out;
  for (int64_t b = 0; b < batches; ++b) {
    Shape shape = {rows};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    CalibrationBatch batch;
    batch.rows = rows;
    batch.inputs.push_back(RandomTensor(shape, seed + b).data);
    out.push_back(std::move(batch));
  }
  return out;
}

// Output 0 of `model` at `batch` rows of `x`.
std::vector<float> RunOnce(CompiledModel& model, int64_t batch, const std::vector<float>& x) {
  const auto shapes = model.OutputShapes(batch);
  EXPECT_FALSE(shapes.empty());
  if (shapes.empty()) return {};
  std::vector<std::vector<float>> outputs;
  for (const auto& s : shapes) outputs.emplace_back(kernels::NumElements(s), -7.0f);
  std::vector<void*> out;
  for (auto& v : outputs) out.push_back(v.data());
  absl::Status s = model.Run(batch, {x.data()}, out);
  EXPECT_TRUE(s.ok()) << s;
  return outputs[0];
}

double RelativeMaxError(const std::vector<float>& expected, const std::vector<float>& actual) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(actual[i]) - expected[i]));
    scale = std::max(scale, std::abs(static_cast<double>(expected[i])));
  }
  return scale == 0 ? err : err / scale;
}

// A CNN of the kinds of convs the INT8 kernels take: a 3x3 stem with
// BatchNormalization and Relu, a depthwise 3x3, a 1x1, a residual Add, a
// strided 3x3 without activation, then global pooling and a Gemm (transB).
std::string SmallCnn() {
  OnnxModelBuilder b;
  uint32_t seed = 11;
  ConvBnBlocks blocks(&b, &seed, /*unit_gain=*/true);
  b.Input("x", {-1, 3, 16, 16});
  blocks.Add("x", "c1", 3, 16, 3, 1, 1, "relu");
  blocks.Add("c1", "c2", 16, 16, 3, 1, 16, "relu");
  blocks.Add("c2", "c3", 16, 16, 1, 1, 1, "");
  b.Node("Add", {"c3", "c1"}, {"res"}, "res");
  b.Node("Relu", {"res"}, {"res_relu"}, "res_relu");
  blocks.Add("res_relu", "c4", 16, 32, 3, 2, 1, "");
  b.Node("GlobalAveragePool", {"c4"}, {"gap"}, "gap");
  b.Node("Flatten", {"gap"}, {"flat"}, "flat");
  b.Initializer("fc_w", RandomTensor({10, 32}, seed++));
  b.Initializer("fc_b", RandomTensor({10}, seed++));
  auto& fc = b.Node("Gemm", {"flat", "fc_w", "fc_b"}, {"y"}, "fc");
  OnnxModelBuilder::AttrInt(fc, "transB", 1);
  b.Output("y", {-1, 10});
  return b.Save("int8_small_cnn");
}

// MatMul (3-D input, as a transformer's) + bias Add + Relu, MatMul.
std::string SmallMlp() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4, 64});
  b.Initializer("w1", RandomTensor({64, 96}, 3));
  b.Initializer("b1", RandomTensor({96}, 4));
  b.Initializer("w2", RandomTensor({96, 24}, 5));
  b.Node("MatMul", {"x", "w1"}, {"h"}, "mm1");
  b.Node("Add", {"h", "b1"}, {"hb"}, "bias1");
  b.Node("Relu", {"hb"}, {"hr"}, "relu1");
  b.Node("MatMul", {"hr", "w2"}, {"y"}, "mm2");
  b.Output("y", {-1, 4, 24});
  return b.Save("int8_small_mlp");
}

// Quantizes `path` on random calibration rows; the QDQ file's path.
std::string Quantize(const std::string& path, const std::vector<int64_t>& row_shape,
                     const std::string& stem, QuantizeReport* report = nullptr) {
  auto q = QuantizeModel(path, RandomCalibration(row_shape, 4, 8, 100), QuantizeOptions());
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return "";
  if (report != nullptr) *report = q->report;
  return SaveBytes(stem, q->onnx);
}

// The conv and matmul steps of `model`'s plan at `batch` (run first).
std::vector<PlannedStep> ComputeSteps(CompiledModel& model, int64_t batch) {
  std::vector<PlannedStep> steps;
  auto plan = model.PlanAt(batch);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return steps;
  for (const PlannedStep& s : *plan) {
    if (s.kind == "conv" || s.kind == "matmul") steps.push_back(s);
  }
  return steps;
}

// Compiles the QDQ model and checks it against its reference meaning and
// against the FP32 model at several batch sizes; every conv and weight
// matmul runs INT8 on a non-reference kernel.
void CheckQuantizedModel(const std::string& fp32_path, const std::string& qdq_path,
                         const std::vector<int64_t>& row_shape, double fp32_tolerance,
                         const CompileOptions& options, bool all_int8) {
  auto graph = ImportOnnxModel(qdq_path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto qdq = CompiledModel::Load(qdq_path, options);
  auto fp32 = CompiledModel::Load(fp32_path, CompileOptions());
  ASSERT_TRUE(qdq.ok()) << qdq.status();
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  uint32_t seed = 500;
  for (int64_t batch : {1, 3, 16}) {
    SCOPED_TRACE(absl::StrCat("batch ", batch));
    Shape shape = {batch};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    const kernels::Tensor x = RandomTensor(shape, seed++);
    auto expected = RunReference(*graph, {x});
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<float> y = RunOnce(**qdq, batch, x.data);
    const std::vector<float> y32 = RunOnce(**fp32, batch, x.data);
    // INT8 products are exact: only the order of FP32 sums differs, which
    // may move a value across a rounding boundary of a later quantization.
    EXPECT_LT(testing::NormalizedError((*expected)[0].data, y.data()), 1e-4);
    EXPECT_LT(RelativeMaxError(y32, y), fp32_tolerance);
    EXPECT_GT(RelativeMaxError(y32, y), 0) << "bit-equal to FP32: INT8 did not run";
    int int8_steps = 0;
    for (const PlannedStep& s : ComputeSteps(**qdq, batch)) {
      if (all_int8) {
        EXPECT_THAT(s.implementation, HasSubstr("int8")) << s.description;
      }
      int8_steps += absl::StrContains(s.implementation, "int8");
      EXPECT_FALSE(s.reference) << s.description << " on " << s.implementation;
    }
    EXPECT_GT(int8_steps, 0);
  }
}

// INT8 kernels on every CPU (CompileOptions::int8_kernels: by default a
// CPU without VNNI runs the FP32 path), with the default threshold.
CompileOptions Int8KernelsOn() {
  CompileOptions o;
  o.int8_kernels = CompileOptions::Int8Kernels::kAlways;
  return o;
}

// Every conv and weight matmul INT8, however little it does per input.
CompileOptions AllInt8() {
  CompileOptions o = Int8KernelsOn();
  o.int8_min_flops_per_input = 0;
  return o;
}

TEST(Int8QuantizeTest, Uint8RangeIncludesZeroAndRoundsTheZeroPoint) {
  auto r = Uint8Range(0.5f, 2.0f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FLOAT_EQ(r->scale, 2.0f / 255.0f);
  EXPECT_EQ(r->zero_point, 0);
  r = Uint8Range(-1.0f, 3.0f);
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r->scale, 4.0f / 255.0f);
  EXPECT_EQ(r->zero_point, 64);  // 1 / (4/255) = 63.75
  r = Uint8Range(-2.0f, -1.0f);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->zero_point, 255);
  r = Uint8Range(0.0f, 0.0f);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->scale, 1.0f);
  EXPECT_FALSE(Uint8Range(std::numeric_limits<float>::quiet_NaN(), 1.0f).ok());
  EXPECT_FALSE(Uint8Range(0.0f, std::numeric_limits<float>::infinity()).ok());
  EXPECT_FALSE(Uint8Range(2.0f, 1.0f).ok());
}

TEST(Int8QuantizeTest, WeightsAreSymmetricPerChannelRoundedHalfToEven) {
  // Channels along axis 0: [1, -2, 0.5] (scale 2/127) and all zeros.
  Int8Weights q = QuantizeWeightsPerChannel({1.0f, -2.0f, 0.5f, 0, 0, 0}, {2, 3}, 0);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_FLOAT_EQ(q.scales[0], 2.0f / 127.0f);
  EXPECT_EQ(q.scales[1], 1.0f);
  // 1 / (2/127) = 63.5 rounds to 64 (even), 0.5 / (2/127) = 31.75 to 32.
  EXPECT_THAT(q.values, ::testing::ElementsAre(64, -127, 32, 0, 0, 0));
  // Along axis 1 of [2, 2]: columns [4, -1] and [0.5, 1].
  q = QuantizeWeightsPerChannel({4.0f, 0.5f, -1.0f, 1.0f}, {2, 2}, 1);
  EXPECT_FLOAT_EQ(q.scales[0], 4.0f / 127.0f);
  EXPECT_FLOAT_EQ(q.scales[1], 1.0f / 127.0f);
  EXPECT_THAT(q.values, ::testing::ElementsAre(127, 64, -32, 127));
}

TEST(Int8QuantizeTest, SmallCnnRunsInt8AndMeansWhatItsQdqFileSays) {
  const std::string fp32 = SmallCnn();
  QuantizeReport report;
  const std::string qdq = Quantize(fp32, {3, 16, 16}, "int8_small_cnn_qdq", &report);
  ASSERT_FALSE(qdq.empty());
  EXPECT_EQ(report.quantized.size(), 5u) << absl::StrJoin(report.quantized, ", ");
  EXPECT_EQ(report.calibration_rows, 32);
  for (const ActivationRange& r : report.activations) {
    EXPECT_GT(r.scale, 0) << r.tensor;
    EXPECT_GE(r.zero_point, 0) << r.tensor;
    EXPECT_LE(r.zero_point, 255) << r.tensor;
  }
  CheckQuantizedModel(fp32, qdq, {3, 16, 16}, 0.05, AllInt8(), /*all_int8=*/true);
}

// By default a conv doing little per input element (the depthwise 3x3: 18
// FLOPs) runs FP32 on the fake-quantized input, with the same meaning:
// the pair runs in the stem's post-ops (the residual Add reads it too, as
// the full-QDQ file says), not as a step of its own.
TEST(Int8QuantizeTest, LightConvsRunFp32OnTheFakeQuantizedInputByDefault) {
  const std::string fp32 = SmallCnn();
  const std::string qdq = Quantize(fp32, {3, 16, 16}, "int8_small_cnn_default");
  ASSERT_FALSE(qdq.empty());
  CheckQuantizedModel(fp32, qdq, {3, 16, 16}, 0.05, Int8KernelsOn(), /*all_int8=*/false);
  auto model = CompiledModel::Load(qdq, Int8KernelsOn());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("c1_relu+c1_QuantizeLinear+c1_DequantizeLinear"));
  EXPECT_THAT((*model)->DescribePlan(), ::testing::Not(HasSubstr("fake-quantize: c1_")));
}

// The QDQ file `qdq` compiled with `options`: the pair after `value` runs
// inside the conv before it (`conv: ...+value_QuantizeLinear+
// value_DequantizeLinear`, no fake-quantize step of its own), on no
// reference kernel, and the model matches the file's reference meaning
// within `tolerance` (normalized error) at batch 1 and `batch` of random
// rows of `row_shape`. The model, run at both batches; null on a failure.
std::unique_ptr<CompiledModel> ExpectPairFolded(const std::string& qdq,
                                                const CompileOptions& options,
                                                const std::string& value,
                                                const std::vector<int64_t>& row_shape,
                                                int64_t batch, double tolerance, uint32_t seed) {
  auto graph = ImportOnnxModel(qdq);
  EXPECT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(qdq, options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!graph.ok() || !model.ok()) return nullptr;
  const std::string plan = (*model)->DescribePlan();
  EXPECT_THAT(plan,
              HasSubstr(absl::StrCat("+", value, "_QuantizeLinear+", value, "_DequantizeLinear")))
      << plan;
  EXPECT_THAT(plan, ::testing::Not(HasSubstr(absl::StrCat("fake-quantize: ", value, "_")))) << plan;
  for (int64_t rows : {int64_t{1}, batch}) {
    Shape shape = {rows};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    const kernels::Tensor x = RandomTensor(shape, seed + static_cast<uint32_t>(rows));
    auto expected = RunReference(*graph, {x});
    EXPECT_TRUE(expected.ok()) << expected.status();
    if (!expected.ok()) return nullptr;
    const std::vector<float> y = RunOnce(**model, rows, x.data);
    EXPECT_LT(testing::NormalizedError((*expected)[0].data, y.data()), tolerance)
        << "batch " << rows << "\n"
        << plan;
    for (const PlannedStep& s : ComputeSteps(**model, rows)) {
      EXPECT_FALSE(s.reference) << s.description << " on " << s.implementation;
    }
  }
  return *std::move(model);
}

// A conv whose output only a QDQ pair reads, and that pair only a light
// (FP32) conv: the pair runs as post-ops of the producing conv, INT8 or
// FP32, with no fake-quantize step, and the model keeps its meaning.
TEST(Int8QuantizeTest, APairAfterAConvFoldsIntoItsPostOps) {
  OnnxModelBuilder b;
  uint32_t seed = 21;
  ConvBnBlocks blocks(&b, &seed, /*unit_gain=*/true);
  b.Input("x", {-1, 3, 16, 16});
  blocks.Add("x", "c1", 3, 16, 3, 1, 1, "relu");     // INT8 (288 FLOPs per input)
  blocks.Add("c1", "c2", 16, 16, 3, 1, 16, "relu");  // depthwise: FP32
  blocks.Add("c2", "y", 16, 8, 1, 1, 1, "");
  b.Output("y", {-1, 8, 16, 16});
  const std::string fp32 = b.Save("int8_fold_cnn");
  const std::string qdq = Quantize(fp32, {3, 16, 16}, "int8_fold_cnn_qdq");
  ASSERT_FALSE(qdq.empty());
  CheckQuantizedModel(fp32, qdq, {3, 16, 16}, 0.05, Int8KernelsOn(), /*all_int8=*/false);
  CompileOptions all_fp32;  // every conv FP32: the pairs fold into FP32 convs
  all_fp32.int8_kernels = CompileOptions::Int8Kernels::kNever;
  for (const CompileOptions& options : {Int8KernelsOn(), all_fp32}) {
    // Tighter than CheckQuantizedModel's 1e-4: leaving the pairs out, or
    // dequantizing with a scale 0.1% off, gives 1e-6 or more.
    EXPECT_NE(ExpectPairFolded(qdq, options, "c1", {3, 16, 16}, 5, 1e-7, 40), nullptr);
  }
}

// A QDQ pair after a 3x3 conv that runs on the own AVX2 Winograd (channels
// in multiples of 8) folds into the Winograd's epilogue rather than moving
// the conv to oneDNN's direct kernel: ResNet-50's 3x3 convs in a QDQ file
// on a CPU without VNNI. The Winograd's rounding (about 1e-5 of the
// output's scale) moves a value across a rounding boundary of the pair
// now and then, one step of its scale: far below the error of a wrong
// scale, a missing pair or a wrong tap.
TEST(Int8QuantizeTest, APairAfterAWinogradConvFoldsIntoItsEpilogue) {
  OnnxModelBuilder b;
  uint32_t seed = 41;
  ConvBnBlocks blocks(&b, &seed, /*unit_gain=*/true);
  b.Input("x", {-1, 16, 20, 20});
  blocks.Add("x", "c1", 16, 32, 3, 1, 1, "relu");
  blocks.Add("c1", "y", 32, 8, 1, 1, 1, "");
  b.Output("y", {-1, 8, 20, 20});
  const std::string fp32 = b.Save("int8_fold_winograd");
  const std::string qdq = Quantize(fp32, {16, 20, 20}, "int8_fold_winograd_qdq");
  ASSERT_FALSE(qdq.empty());
  CompileOptions options;
  options.int8_kernels = CompileOptions::Int8Kernels::kNever;
  // Measured 1.5e-14 on Zen 1. One value one step off is about 1e-7; the
  // pair left out (its rounding error) or its scale 1% off, 1e-5 or more.
  const std::unique_ptr<CompiledModel> model =
      ExpectPairFolded(qdq, options, "c1", {16, 20, 20}, 4, 1e-6, 90);
  ASSERT_NE(model, nullptr);
  if (kernels::GetDispatchDecision().max_tier != kernels::IsaTier::kAvx2 ||
      model->ActivationLayoutName() != std::string("nChw8c")) {
    GTEST_SKIP() << "not the AVX2 tier: no own Winograd";
  }
  for (const PlannedStep& s : ComputeSteps(*model, 4)) {
    if (absl::StrContains(s.description, "+c1_QuantizeLinear")) {
      EXPECT_THAT(s.implementation, HasSubstr("numaserve:winograd_f4x3")) << s.description;
    }
  }
}

// A QDQ pair after a depthwise conv that runs fused into the 1x1 conv
// before it (oneDNN's depthwise post-op) folds into the depthwise's own
// post-ops, with a scale other than the 1x1's pair's (ReLU6 before one,
// ReLU before the other): no fake-quantize step, and the model means what
// its file says. On the AVX2 tier the two shapes take oneDNN's two ways of
// running the pair: ref_fused_convolution chaining two jit primitives
// (stride 1), and the jit 1x1 kernel's own depthwise kernel (stride 2 on
// 112x112).
TEST(Int8QuantizeTest, APairAfterAFusedDepthwiseFoldsIntoItsPostOps) {
  for (const auto& [stride, side] : {std::pair<int64_t, int64_t>{1, 28}, {2, 112}}) {
    SCOPED_TRACE(absl::StrCat("stride ", stride, ", ", side, "x", side));
    OnnxModelBuilder b;
    uint32_t seed = 31;
    ConvBnBlocks blocks(&b, &seed, /*unit_gain=*/true);
    b.Input("x", {-1, 16, side, side});
    blocks.Add("x", "c1", 16, 96, 1, 1, 1, "relu6");
    blocks.Add("c1", "c2", 96, 96, 3, stride, 96, "relu");
    blocks.Add("c2", "y", 96, 24, 1, 1, 1, "");
    b.Output("y", {-1, 24, side / stride, side / stride});
    const std::string fp32 = b.Save(absl::StrCat("int8_fold_dw_", stride));
    const std::string qdq =
        Quantize(fp32, {16, side, side}, absl::StrCat("int8_fold_dw_qdq_", stride));
    ASSERT_FALSE(qdq.empty());
    CompileOptions options;
    options.int8_kernels = CompileOptions::Int8Kernels::kNever;
    // The depthwise pair's scale 0.1% off fails this, and so would the
    // 1x1 pair's scale run for both chains.
    const std::unique_ptr<CompiledModel> model =
        ExpectPairFolded(qdq, options, "c2", {16, side, side}, 5, 1e-7, 80);
    ASSERT_NE(model, nullptr);
    EXPECT_THAT(model->DescribePlan(), HasSubstr("+c1_QuantizeLinear+c1_DequantizeLinear+c2_"));
  }
}

// oneDNN 2.6's INT8 convs read and write only channels-last with a jit
// kernel: a model with INT8 convs keeps its activations nhwc, so no conv
// reorders its input or output; forced into the channel-blocked layout,
// each does, and the model means the same.
TEST(Int8QuantizeTest, Int8ConvsKeepTheActivationsChannelsLast) {
  const std::string fp32 = SmallCnn();
  const std::string qdq = Quantize(fp32, {3, 16, 16}, "int8_small_cnn_nhwc");
  ASSERT_FALSE(qdq.empty());
  using Layout = CompileOptions::ActivationLayout;
  for (Layout layout : {Layout::kAuto, Layout::kChannelBlocked}) {
    CompileOptions options = AllInt8();
    options.activation_layout = layout;
    SCOPED_TRACE(layout == Layout::kAuto ? "auto" : "channel-blocked");
    CheckQuantizedModel(fp32, qdq, {3, 16, 16}, 0.05, options, /*all_int8=*/true);
    auto model = CompiledModel::Load(qdq, options);
    ASSERT_TRUE(model.ok()) << model.status();
    const bool nhwc = layout == Layout::kAuto;
    EXPECT_EQ((*model)->ActivationLayoutName(),
              nhwc ? "nhwc" : kernels::BlockedLayoutName(kernels::BlockedLayout::kChannelBlocked));
    RunOnce(**model, 4, RandomTensor({4, 3, 16, 16}, 9).data);
    // Between activations (the stem reads the plain graph input, which it
    // reorders): no reorder in nhwc, both in the channel-blocked layout.
    int between = 0, reordered = 0;
    for (const PlannedStep& s : ComputeSteps(**model, 4)) {
      if (s.kind != "conv" || absl::StartsWith(s.layouts, "plain")) continue;
      ++between;
      reordered += absl::StrContains(s.implementation, "reordered");
      if (nhwc) {
        EXPECT_EQ(s.layouts, "nhwc->nhwc") << s.description;
      }
    }
    EXPECT_EQ(between, 3);
    EXPECT_EQ(reordered, nhwc ? 0 : 3);
  }
  // An FP32 model keeps the tier's channel-blocked layout.
  auto plain = CompiledModel::Load(fp32, CompileOptions());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->ActivationLayoutName(), kernels::BlockedLayoutName());
}

TEST(Int8QuantizeTest, MatMulsOn3dInputsRunInt8) {
  const std::string fp32 = SmallMlp();
  const std::string qdq = Quantize(fp32, {4, 64}, "int8_small_mlp_qdq");
  ASSERT_FALSE(qdq.empty());
  CheckQuantizedModel(fp32, qdq, {4, 64}, 0.05, AllInt8(), /*all_int8=*/true);
}

// int8_kernels: by default INT8 kernels only where their products are
// exact in one pass (VNNI, AMX); without VNNI (and always with kNever)
// every QDQ conv and matmul runs FP32 on its dequantized weights, with the
// fake-quantize folded into the conv before it where it can be: no INT8
// step, the tier's channel-blocked layout, the note saying why, and the
// same meaning as the file and as the INT8 kernels. The `.avx2` run of
// this test (the AVX2 cap, no VNNI) takes the FP32 path on every CI CPU.
TEST(Int8QuantizeTest, WithoutVnniQdqStepsRunFp32OnTheDequantizedWeights) {
  const std::string fp32 = SmallCnn();
  const std::string qdq = Quantize(fp32, {3, 16, 16}, "int8_small_cnn_auto");
  ASSERT_FALSE(qdq.empty());
  auto graph = ImportOnnxModel(qdq);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto on = CompiledModel::Load(qdq, Int8KernelsOn());
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ((*on)->DescribeInt8Kernels(), "");
  int on_int8 = 0;  // the stem: the one conv above the default threshold
  RunOnce(**on, 1, RandomTensor({1, 3, 16, 16}, 59).data);
  for (const PlannedStep& s : ComputeSteps(**on, 1)) {
    on_int8 += absl::StrContains(s.implementation, "int8");
  }
  EXPECT_EQ(on_int8, 1);
  using Int8Kernels = CompileOptions::Int8Kernels;
  for (Int8Kernels kind : {Int8Kernels::kAuto, Int8Kernels::kNever}) {
    SCOPED_TRACE(kind == Int8Kernels::kAuto ? "auto" : "never");
    CompileOptions options;
    options.int8_kernels = kind;
    auto model = CompiledModel::Load(qdq, options);
    ASSERT_TRUE(model.ok()) << model.status();
    const bool int8 = kind == Int8Kernels::kAuto && kernels::OnednnInt8ProductsExact();
    const std::string note = (*model)->DescribeInt8Kernels();
    if (int8) {
      EXPECT_EQ(note, "");
    } else {
      EXPECT_THAT(note, HasSubstr("INT8 kernels off ("));
      EXPECT_THAT(note,
                  HasSubstr(absl::StrCat(": ", on_int8, " QDQ conv/matmul step(s) run FP32")));
      EXPECT_EQ((*model)->ActivationLayoutName(), kernels::BlockedLayoutName());
    }
    for (int64_t batch : {1, 6}) {
      const kernels::Tensor x = RandomTensor({batch, 3, 16, 16}, 60 + batch);
      auto expected = RunReference(*graph, {x});
      ASSERT_TRUE(expected.ok()) << expected.status();
      const std::vector<float> y = RunOnce(**model, batch, x.data);
      const std::vector<float> y_on = RunOnce(**on, batch, x.data);
      EXPECT_LT(testing::NormalizedError((*expected)[0].data, y.data()), 1e-4);
      EXPECT_LT(testing::NormalizedError(y_on, y.data()), 1e-4);
      int int8_steps = 0;
      for (const PlannedStep& s : ComputeSteps(**model, batch)) {
        int8_steps += absl::StrContains(s.implementation, "int8");
        EXPECT_FALSE(s.reference) << s.description << " on " << s.implementation;
      }
      EXPECT_EQ(int8_steps > 0, int8);
    }
  }
}

// A pair whose scale is subnormal (1 / s overflows to inf) does not fold
// into the conv before it: there x * (1 / s) would make 0 a NaN, clamped to
// the bottom of the range, where ONNX's 0 / s quantizes to the zero point.
// As a step of its own (x / s) the conv's exact zeros stay 0.
TEST(Int8QuantizeTest, APairWithASubnormalScaleRunsAsAStep) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 8, 6, 6});
  kernels::Tensor w = RandomTensor({8, 8, 1, 1}, 12);
  std::fill(w.data.begin(), w.data.begin() + 8, 0.0f);  // channel 0: exact zeros
  b.Initializer("w", w);
  b.Initializer("s", kernels::Tensor(Shape{}, {1e-39f}));
  const uint8_t zero_point = 128;
  b.RawInitializer("zp", 2 /* UINT8 */, {}, &zero_point, 1);
  b.Node("Conv", {"x", "w"}, {"c"}, "conv");
  b.Node("QuantizeLinear", {"c", "s", "zp"}, {"cq"}, "q");
  b.Node("DequantizeLinear", {"cq", "s", "zp"}, {"y"}, "dq");
  b.Output("y", {-1, 8, 6, 6});
  const std::string path = b.Save("int8_subnormal_scale");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.int8_kernels = CompileOptions::Int8Kernels::kNever;
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("fake-quantize: q+dq"));
  const kernels::Tensor x = RandomTensor({2, 8, 6, 6}, 13);
  auto expected = RunReference(*graph, {x});
  ASSERT_TRUE(expected.ok()) << expected.status();
  const std::vector<float> y = RunOnce(**model, 2, x.data);
  ASSERT_EQ(y.size(), (*expected)[0].data.size());
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(y[i], (*expected)[0].data[i]) << "at " << i;
  }
  EXPECT_EQ(y[0], 0.0f);  // image 0, channel 0: the conv's exact zero
}

// A QDQ pair whose output an op other than an INT8 conv or matmul also
// reads (here the residual Add) runs as one FP32 fake-quantize step, which
// both readers see.
TEST(Int8QuantizeTest, APairReadByOtherOpsRunsAsAFakeQuantizeStep) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 8});
  b.Initializer("s", kernels::Tensor(Shape{}, {0.05f}));
  const uint8_t zero_point = 128;
  b.RawInitializer("zp", 2 /* UINT8 */, {}, &zero_point, 1);
  b.Initializer("w", RandomTensor({8, 8}, 9));
  b.Node("QuantizeLinear", {"x", "s", "zp"}, {"xq"}, "q");
  b.Node("DequantizeLinear", {"xq", "s", "zp"}, {"xd"}, "dq");
  b.Node("MatMul", {"xd", "w"}, {"h"}, "mm");
  b.Node("Add", {"h", "xd"}, {"y"}, "add");
  b.Output("y", {-1, 8});
  const std::string path = b.Save("int8_fake_quantize");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, CompileOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("fake-quantize: q+dq"));
  const kernels::Tensor x = RandomTensor({5, 8}, 77);
  auto expected = RunReference(*graph, {x});
  ASSERT_TRUE(expected.ok()) << expected.status();
  const std::vector<float> y = RunOnce(**model, 5, x.data);
  EXPECT_LT(testing::NormalizedError((*expected)[0].data, y.data()), 1e-10);
}

TEST(Int8QuantizeTest, FashionMnistAccuracyWithinHalfAPointOfFp32) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  const std::string train_path = dir + "/train-images-idx3-ubyte.gz";
  const std::string images_path = dir + "/t10k-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/t10k-labels-idx1-ubyte.gz";
  for (const std::string& p : {train_path, images_path, labels_path}) {
    if (!std::filesystem::exists(p)) {
      NUMASERVE_MISSING_PREREQUISITE() << p << " is missing (Debian package dataset-fashion-mnist)";
    }
  }
  auto train = training::ReadIdxFile(train_path);
  auto images = training::ReadIdxFile(images_path);
  auto labels = training::ReadIdxFile(labels_path);
  ASSERT_TRUE(train.ok() && images.ok() && labels.ok());
  constexpr int64_t kPixels = 28 * 28, kCalibration = 512, kImages = 5000, kBatch = 250;
  std::vector<CalibrationBatch> calibration;
  for (int64_t first = 0; first < kCalibration; first += 64) {
    CalibrationBatch batch;
    batch.rows = 64;
    std::vector<float> x(64 * kPixels);
    for (int64_t i = 0; i < 64 * kPixels; ++i) {
      x[i] = train->data[first * kPixels + i] * (1.0f / 255.0f);
    }
    batch.inputs.push_back(std::move(x));
    calibration.push_back(std::move(batch));
  }
  // FP32, then INT8 calibrated by min-max and by entropy.
  std::string paths[3] = {NUMASERVE_TRAINED_MLP, "", ""};
  for (int k = 1; k < 3; ++k) {
    QuantizeOptions options;
    options.method = k == 1 ? CalibrationMethod::kMinMax : CalibrationMethod::kEntropy;
    auto q = QuantizeModel(NUMASERVE_TRAINED_MLP, calibration, options);
    ASSERT_TRUE(q.ok()) << q.status();
    paths[k] = SaveBytes(k == 1 ? "int8_trained_mlp" : "int8_entropy_trained_mlp", q->onnx);
  }
  // The INT8 models on INT8 kernels (split without VNNI), then as served
  // by default (FP32 on the dequantized weights where the CPU has no VNNI).
  const bool vnni = kernels::OnednnInt8ProductsExact();
  double accuracy[3][2] = {};
  for (int k = 0; k < 3; ++k) {
    for (int on = 0; on < 2; ++on) {
      if (k == 0 && on == 1) continue;
      SCOPED_TRACE(absl::StrCat("model ", k, on == 0 ? ", int8 kernels" : ", default"));
      auto model = CompiledModel::Load(paths[k], on == 0 ? Int8KernelsOn() : CompileOptions());
      ASSERT_TRUE(model.ok()) << model.status();
      int64_t correct = 0;
      for (int64_t first = 0; first < kImages; first += kBatch) {
        std::vector<float> x(kBatch * kPixels);
        for (int64_t i = 0; i < kBatch * kPixels; ++i) {
          x[i] = images->data[first * kPixels + i] * (1.0f / 255.0f);
        }
        const std::vector<float> y = RunOnce(**model, kBatch, x);
        ASSERT_EQ(static_cast<int64_t>(y.size()), kBatch * 10);
        for (int64_t r = 0; r < kBatch; ++r) {
          const auto row = y.begin() + r * 10;
          correct += std::max_element(row, row + 10) - row == labels->data[first + r];
        }
      }
      accuracy[k][on] = 100.0 * correct / kImages;
      if (k > 0) {
        // fc1 and fc2 INT8 (by default only with VNNI); the 10-output
        // classifier (20 FLOPs per input element) FP32 on its
        // fake-quantized input.
        int int8_steps = 0;
        for (const PlannedStep& s : ComputeSteps(**model, kBatch)) {
          int8_steps += absl::StrContains(s.implementation, "int8");
        }
        EXPECT_EQ(int8_steps, on == 0 || vnni ? 2 : 0);
      }
    }
  }
  std::cout << "Fashion-MNIST, first " << kImages << " test images, trained MLP: FP32 "
            << accuracy[0][0] << "%, INT8 " << accuracy[1][0] << "% (min-max), " << accuracy[2][0]
            << "% (entropy); as served by default "
            << (vnni ? "(INT8 kernels): " : "(no VNNI: FP32 on dequantized weights): ")
            << accuracy[1][1] << "%, " << accuracy[2][1] << "%\n";
  EXPECT_GT(accuracy[0][0], 85.0) << "the trained model or the data is not what it should be";
  for (int k = 1; k < 3; ++k) {
    for (int on = 0; on < 2; ++on) EXPECT_LE(std::abs(accuracy[k][on] - accuracy[0][0]), 0.5);
  }
}

// A histogram of `values` over their own [min, max], as calibration builds it.
std::vector<int64_t> HistogramOf(const std::vector<float>& values, float* min, float* max,
                                 int bins = 4096) {
  *min = *std::min_element(values.begin(), values.end());
  *max = *std::max_element(values.begin(), values.end());
  std::vector<int64_t> h(static_cast<size_t>(bins), 0);
  for (float v : values) {
    const double at = (v - static_cast<double>(*min)) / (static_cast<double>(*max) - *min) * bins;
    ++h[static_cast<size_t>(std::clamp<int64_t>(static_cast<int64_t>(at), 0, bins - 1))];
  }
  return h;
}

TEST(Int8QuantizeTest, EntropyRangeClipsRareOutliersAndKeepsAFullRange) {
  std::mt19937 rng(7);
  // Post-ReLU-like: |N(0, 1)| and five values at 40: the range is clipped
  // far below 40 and well above the bulk (P(|x| > 3) is 0.3%).
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> relu;
  for (int i = 0; i < 200000; ++i) relu.push_back(std::fabs(normal(rng)));
  for (int i = 0; i < 5; ++i) relu.push_back(40.0f);
  float min = 0, max = 0;
  std::vector<int64_t> h = HistogramOf(relu, &min, &max);  // sets min and max first
  auto [lo, hi] = EntropyRange(h, min, max);
  EXPECT_EQ(lo, min);
  EXPECT_GT(hi, 3.0f);
  EXPECT_LT(hi, 20.0f);
  // Two-sided with outliers on both sides: both ends come in, 0 stays inside.
  std::vector<float> both;
  for (int i = 0; i < 200000; ++i) both.push_back(normal(rng));
  both.push_back(-40.0f);
  both.push_back(40.0f);
  h = HistogramOf(both, &min, &max);
  std::tie(lo, hi) = EntropyRange(h, min, max);
  EXPECT_GT(lo, -20.0f);
  EXPECT_LT(lo, -3.0f);
  EXPECT_GT(hi, 3.0f);
  EXPECT_LT(hi, 20.0f);
  // Uniform values have nothing to clip: (nearly) the whole range stays.
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> flat;
  for (int i = 0; i < 200000; ++i) flat.push_back(uniform(rng));
  h = HistogramOf(flat, &min, &max);
  std::tie(lo, hi) = EntropyRange(h, min, max);
  EXPECT_EQ(lo, min);
  EXPECT_GT(hi, 0.9f * max);
  // Nothing to choose from: min and max themselves.
  EXPECT_EQ(EntropyRange({}, -1.0f, 2.0f), std::make_pair(-1.0f, 2.0f));
  EXPECT_EQ(EntropyRange(std::vector<int64_t>(4096, 0), -1.0f, 2.0f), std::make_pair(-1.0f, 2.0f));
  EXPECT_EQ(EntropyRange(std::vector<int64_t>(100, 1), -1.0f, 2.0f), std::make_pair(-1.0f, 2.0f));
  EXPECT_EQ(CalibrationMethodFromName("entropy").value(), CalibrationMethod::kEntropy);
}

TEST(Int8QuantizeTest, PercentileCalibrationNarrowsTheRange) {
  const std::string fp32 = SmallMlp();
  QuantizeOptions options;
  auto minmax = QuantizeModel(fp32, RandomCalibration({4, 64}, 4, 8, 100), options);
  options.method = CalibrationMethod::kPercentile;
  options.percentile = 99.0;
  auto pct = QuantizeModel(fp32, RandomCalibration({4, 64}, 4, 8, 100), options);
  ASSERT_TRUE(minmax.ok() && pct.ok());
  ASSERT_EQ(minmax->report.activations.size(), pct->report.activations.size());
  for (size_t i = 0; i < pct->report.activations.size(); ++i) {
    EXPECT_LT(pct->report.activations[i].scale, minmax->report.activations[i].scale)
        << pct->report.activations[i].tensor;
  }
  options.percentile = 40;
  EXPECT_THAT(QuantizeModel(fp32, RandomCalibration({4, 64}, 1, 8, 1), options).status().message(),
              HasSubstr("percentile"));
}

TEST(Int8QuantizeTest, ErrorsNameTheProblem) {
  // Opset 11: no per-channel DequantizeLinear.
  {
    OnnxModelBuilder b(11);
    b.Input("x", {-1, 4});
    b.Initializer("w", RandomTensor({4, 2}, 1));
    b.Node("MatMul", {"x", "w"}, {"y"}, "mm");
    b.Output("y", {-1, 2});
    auto q = QuantizeModel(b.Save("int8_opset11"), RandomCalibration({4}, 1, 2, 1), {});
    EXPECT_THAT(q.status().message(), HasSubstr("opset 11"));
  }
  // Nothing to quantize.
  {
    OnnxModelBuilder b;
    b.Input("x", {-1, 4});
    b.Node("Relu", {"x"}, {"y"}, "relu");
    b.Output("y", {-1, 4});
    auto q = QuantizeModel(b.Save("int8_nothing"), RandomCalibration({4}, 1, 2, 1), {});
    EXPECT_THAT(q.status().message(), HasSubstr("no Conv, MatMul or Gemm"));
  }
  const std::string mlp = SmallMlp();
  // Calibration rows of the wrong size, and none at all.
  EXPECT_THAT(QuantizeModel(mlp, RandomCalibration({4, 63}, 1, 2, 1), {}).status().message(),
              HasSubstr("rows of 256 expected"));
  EXPECT_THAT(QuantizeModel(mlp, {}, {}).status().message(), HasSubstr("no calibration data"));
  // A NaN activation.
  std::vector<CalibrationBatch> nan = RandomCalibration({4, 64}, 1, 2, 1);
  nan[0].inputs[0][5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(QuantizeModel(mlp, nan, {}).status().message(), HasSubstr("NaN or infinite"));
  // A file that is not a model.
  EXPECT_FALSE(QuantizeModel("/nonexistent/model.onnx", RandomCalibration({4}, 1, 2, 1), {}).ok());
}

}  // namespace
}  // namespace numaserve::engine
