// Precision "bf16" (CompileOptions::precision): whole models compiled in
// BF16 against the same models in FP32 — the trained Fashion-MNIST MLP, a
// small CNN (BatchNormalization, depthwise, a 1x1 + depthwise pair, residual,
// a grouped conv, ConvTranspose, Gemm) and a transformer encoder layer —
// within BF16's tolerance, every conv and weight matmul on a BF16 kernel;
// the test accuracy of the trained MLP on part of the Fashion-MNIST test set
// within 0.5 point of FP32's; the benchmark models' largest logit error; and
// the refusal, with the reason, where the CPU has no native BF16 (ctest's
// AVX2-tier run of this binary, NUMASERVE_MAX_ISA=avx2, checks it on an
// AVX-512 BF16 machine).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/onednn/onednn_common.h"
#include "tests/engine/attention_block.h"
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

#define SKIP_WITHOUT_NATIVE_BF16()                                                      \
  if (!kernels::GetBf16Support().native) {                                              \
    GTEST_SKIP() << "no native BF16 here: " << kernels::GetBf16Support().reason << " (" \
                 << kernels::IsaDescription() << ")";                                   \
  }

CompileOptions WithPrecision(Precision precision) {
  CompileOptions o;
  o.gemm_backend = "onednn";
  o.precision = precision;
  return o;
}

// BF16 for every conv and weight matmul, however little work it does per
// input element (CompileOptions::bf16_min_flops_per_input = 0).
CompileOptions AllBf16() {
  CompileOptions o = WithPrecision(Precision::kBf16);
  o.bf16_min_flops_per_input = 0;
  return o;
}

// The largest |bf16 - fp32| over the largest |fp32| (the error relative to
// the output's scale: elementwise ratios blow up near zero).
double RelativeMaxError(const std::vector<float>& fp32, const std::vector<float>& bf16) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(bf16[i]) - fp32[i]));
    scale = std::max(scale, std::abs(static_cast<double>(fp32[i])));
  }
  return scale == 0 ? err : err / scale;
}

// Runs `model` on `inputs` (one per model input, FP32) at `batch` rows;
// output 0.
std::vector<float> RunOnce(CompiledModel& model, int64_t batch,
                           const std::vector<std::vector<float>>& inputs) {
  const auto shapes = model.OutputShapes(batch);
  EXPECT_FALSE(shapes.empty());
  std::vector<std::vector<float>> outputs;
  for (const auto& s : shapes) outputs.emplace_back(kernels::NumElements(s), -7.0f);
  std::vector<const void*> in;
  for (const auto& v : inputs) in.push_back(v.data());
  std::vector<void*> out;
  for (auto& v : outputs) out.push_back(v.data());
  absl::Status s = model.Run(batch, in, out);
  EXPECT_TRUE(s.ok()) << s;
  return outputs.empty() ? std::vector<float>() : outputs[0];
}

// Random inputs in [-1, 1) for `batch` rows of `info`'s FP32 inputs.
std::vector<std::vector<float>> RandomInputs(const ModelInfo& info, int64_t batch, uint32_t seed) {
  std::vector<std::vector<float>> inputs;
  for (const TensorInfo& t : info.inputs) {
    Shape shape = t.shape;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < 0) shape[d] = d == 0 ? batch : 1;
    }
    inputs.push_back(RandomTensor(shape, seed++).data);
  }
  return inputs;
}

struct Comparison {
  double relative_max_error = 0;
  double normalized_error = 0;  // mse(fp32, bf16) / mse(fp32, 0)
  // Conv and weight matmul steps of the BF16 plan (at the last batch) on a
  // BF16 kernel, and the descriptions of those left in FP32.
  int bf16_steps = 0;
  std::vector<std::string> fp32_steps;
};

// Compiles `path` in FP32 and with `bf16` (a precision kBf16 option set),
// checks the BF16 plan (no reference kernel, some step in BF16) and
// compares output 0 at each batch size.
Comparison CompareWithFp32(const std::string& path, const std::vector<int64_t>& batches,
                           const CompileOptions& bf16_options) {
  Comparison worst;
  auto fp32 = CompiledModel::Load(path, WithPrecision(Precision::kFp32));
  auto bf16 = CompiledModel::Load(path, bf16_options);
  EXPECT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_TRUE(bf16.ok()) << bf16.status();
  if (!fp32.ok() || !bf16.ok()) return worst;
  uint32_t seed = 1;
  for (int64_t batch : batches) {
    SCOPED_TRACE(absl::StrCat(path, " at batch ", batch));
    const auto inputs = RandomInputs((*fp32)->info(), batch, seed);
    seed += 10;
    const std::vector<float> a = RunOnce(**fp32, batch, inputs);
    const std::vector<float> b = RunOnce(**bf16, batch, inputs);
    EXPECT_EQ(a.size(), b.size());
    worst.relative_max_error = std::max(worst.relative_max_error, RelativeMaxError(a, b));
    worst.normalized_error =
        std::max(worst.normalized_error, testing::NormalizedError(a, b.data()));
    auto plan = (*bf16)->PlanAt(batch);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) continue;
    worst.bf16_steps = 0;
    worst.fp32_steps.clear();
    for (const PlannedStep& step : *plan) {
      if (step.kind != "conv" && step.kind != "matmul") continue;
      EXPECT_FALSE(step.reference) << step.description << " on " << step.implementation;
      if (absl::StrContains(step.implementation, "bf16")) {
        ++worst.bf16_steps;
      } else {
        worst.fp32_steps.push_back(step.description);
      }
    }
    EXPECT_GT(worst.bf16_steps, 0) << "no step ran BF16";
  }
  // BF16 ran (FP32 would match to rounding), and within its tolerance.
  EXPECT_GT(worst.normalized_error, 1e-12) << path << ": bit-equal to FP32";
  return worst;
}

TEST(PrecisionTest, NamesParse) {
  EXPECT_EQ(*PrecisionFromName("fp32"), Precision::kFp32);
  EXPECT_EQ(*PrecisionFromName("bf16"), Precision::kBf16);
  EXPECT_STREQ(PrecisionName(Precision::kBf16), "bf16");
  EXPECT_THAT(PrecisionChoices(), ::testing::ElementsAre("fp32", "bf16"));
  for (const char* bad : {"fp16", "BF16", "", "int8", "bf16 "}) {
    auto p = PrecisionFromName(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("is not one of fp32, bf16"));
  }
}

std::string TrainedMlp() { return NUMASERVE_TRAINED_MLP; }

TEST(PrecisionTest, Bf16IsRefusedWithTheReasonWhereItIsNotNative) {
  const kernels::Bf16Support& support = kernels::GetBf16Support();
  auto model = CompiledModel::Load(TrainedMlp(), WithPrecision(Precision::kBf16));
  const std::string& cap = kernels::GetDispatchDecision().cap;  // test_main.cc's
  std::cout << "BF16 here: " << (support.native ? "native, " + support.path : support.reason)
            << " (" << kernels::IsaDescription() << ")\n";
  if (support.native) {
    ASSERT_TRUE(model.ok()) << model.status();
    return;
  }
  ASSERT_FALSE(model.ok()) << "BF16 loaded without a native path";
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(model.status().message());
  EXPECT_THAT(message, HasSubstr(TrainedMlp()));
  EXPECT_THAT(message, HasSubstr("precision bf16 is not available on this CPU"));
  EXPECT_THAT(message, HasSubstr(support.reason));
  if (cap == "avx2") {
    EXPECT_THAT(message, HasSubstr("--max-isa=avx2"));
  }
  // FP32 still loads.
  EXPECT_TRUE(CompiledModel::Load(TrainedMlp(), WithPrecision(Precision::kFp32)).ok());
}

TEST(PrecisionTest, Bf16NeedsOnednnMatmuls) {
  for (const char* backend : {"blis", "openblas"}) {
    CompileOptions o = WithPrecision(Precision::kBf16);
    o.gemm_backend = backend;
    auto model = CompiledModel::Load(TrainedMlp(), o);
    ASSERT_FALSE(model.ok()) << backend;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(model.status().message()), HasSubstr("has no BF16 path"));
  }
}

TEST(PrecisionTest, TrainedMlpMatchesFp32) {
  SKIP_WITHOUT_NATIVE_BF16();
  const Comparison c = CompareWithFp32(TrainedMlp(), {1, 7, 64}, AllBf16());
  std::cout << "trained MLP: BF16 vs FP32 largest error " << c.relative_max_error
            << " of the largest output, normalized error " << c.normalized_error << "\n";
  EXPECT_LT(c.relative_max_error, 2e-2);
  EXPECT_THAT(c.fp32_steps, ::testing::IsEmpty());
  // By default the classifier (128 -> 10: 20 FLOPs per input element)
  // stays FP32, the two hidden layers run BF16.
  const Comparison d = CompareWithFp32(TrainedMlp(), {1, 7}, WithPrecision(Precision::kBf16));
  EXPECT_EQ(d.bf16_steps, 2);
  ASSERT_EQ(d.fp32_steps.size(), 1u);
  EXPECT_THAT(d.fp32_steps[0], HasSubstr("fc3"));
}

// 32x32x3 -> conv 3x3 + BN + Relu (16) -> inverted residual (1x1 expand
// + BN + Clip, depthwise 3x3 + BN + Clip, 1x1 project + BN, + input) ->
// a depthwise conv on its own -> grouped 3x3 conv (group 2) -> ConvTranspose
// 2x2 stride 2 -> MaxPool -> GlobalAveragePool -> Flatten -> Gemm (10).
std::string SmallCnn() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3, 32, 32});
  b.Output("logits", {-1, 10});
  uint32_t seed = 100;
  ConvBnBlocks blocks(&b, &seed, /*unit_gain=*/true);
  blocks.Add("x", "stem", 3, 16, 3, 1, 1, "relu");
  blocks.Add("stem", "expand", 16, 48, 1, 1, 1, "relu6");
  blocks.Add("expand", "dw", 48, 48, 3, 1, 48, "relu6");
  blocks.Add("dw", "project", 48, 16, 1, 1, 1, "");
  b.Node("Add", {"project", "stem"}, {"res"}, "residual");
  blocks.Add("res", "dw2", 16, 16, 3, 2, 16, "relu6");  // depthwise on its own: FP32
  blocks.Add("dw2", "grouped", 16, 32, 3, 1, 2, "relu");
  kernels::Tensor up = RandomTensor({32, 16, 2, 2}, seed++);
  for (float& v : up.data) v *= 0.3f;
  b.Initializer("up_w", up);
  auto& deconv = b.Node("ConvTranspose", {"grouped", "up_w"}, {"up"}, "upsample");
  OnnxModelBuilder::AttrInts(deconv, "strides", {2, 2});
  auto& pool = b.Node("MaxPool", {"up"}, {"pool"}, "maxpool");
  OnnxModelBuilder::AttrInts(pool, "kernel_shape", {2, 2});
  OnnxModelBuilder::AttrInts(pool, "strides", {2, 2});
  b.Node("GlobalAveragePool", {"pool"}, {"gap"}, "gap");
  auto& flat = b.Node("Flatten", {"gap"}, {"flat"}, "flatten");
  OnnxModelBuilder::AttrInt(flat, "axis", 1);
  b.Initializer("fc_w", RandomTensor({10, 16}, seed++));
  b.Initializer("fc_b", RandomTensor({10}, seed++));
  auto& fc = b.Node("Gemm", {"flat", "fc_w", "fc_b"}, {"logits"}, "fc");
  OnnxModelBuilder::AttrInt(fc, "transB", 1);
  return b.Save("bf16_small_cnn");
}

TEST(PrecisionTest, SmallCnnMatchesFp32) {
  SKIP_WITHOUT_NATIVE_BF16();
  // Every conv (the 1x1 + depthwise pair, the depthwise conv on its own,
  // the grouped conv, ConvTranspose) and the Gemm in BF16.
  const Comparison c = CompareWithFp32(SmallCnn(), {1, 3, 16}, AllBf16());
  std::cout << "small CNN: BF16 vs FP32 largest error " << c.relative_max_error
            << " of the largest output, normalized error " << c.normalized_error << "\n";
  EXPECT_LT(c.relative_max_error, 2e-2);
  EXPECT_THAT(c.fp32_steps, ::testing::IsEmpty());
}

// By default only the steps doing at least 256 FLOPs per input element run
// BF16: the stem (3x3, 16 outputs: 288) and the grouped conv (3x3, 16
// outputs a group: 288); the expand + depthwise pair (96 + 54), the 1x1
// projection (32), the depthwise conv (18 / 4 strides), ConvTranspose
// (2x2, 16 outputs: 128) and the classifier (20) stay FP32.
TEST(PrecisionTest, SmallCnnRunsBf16WhereItEarnsItsConversion) {
  SKIP_WITHOUT_NATIVE_BF16();
  const Comparison c = CompareWithFp32(SmallCnn(), {1, 4}, WithPrecision(Precision::kBf16));
  EXPECT_LT(c.relative_max_error, 2e-2);
  EXPECT_EQ(c.bf16_steps, 2);
  std::string fp32;
  for (const std::string& d : c.fp32_steps) fp32 += d + "\n";
  for (const char* step : {"expand_conv", "project_conv", "dw2_conv", "upsample", "fc"}) {
    EXPECT_THAT(fp32, HasSubstr(step)) << step << " should stay FP32";
  }
  for (const char* step : {"stem_conv", "grouped_conv"}) {
    EXPECT_THAT(fp32, ::testing::Not(HasSubstr(step))) << step << " should run BF16";
  }
}

// oneDNN 2.6 has AMX BF16 convs (brgconv) for channels-last tensors only:
// on AMX a BF16 model with convs keeps its activations nhwc and its convs
// run there; on AVX512_BF16 alone it keeps the tier's channel-blocked
// layout, where the AVX512_BF16 direct kernels are. Either layout, forced,
// gives the same answer.
TEST(PrecisionTest, Bf16ConvsKeepTheLayoutTheirKernelsRead) {
  SKIP_WITHOUT_NATIVE_BF16();
  const bool amx = kernels::GetBf16Support().path == "amx_bf16";
  auto model = CompiledModel::Load(SmallCnn(), AllBf16());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->ActivationLayoutName(),
            amx ? "nhwc" : kernels::BlockedLayoutName(kernels::BlockedLayout::kChannelBlocked));
  RunOnce(**model, 4, RandomInputs((*model)->info(), 4, 1));  // implementations known after one
  auto plan = (*model)->PlanAt(4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int amx_convs = 0;
  std::string convs;
  for (const PlannedStep& step : *plan) {
    if (step.kind != "conv") continue;
    convs += step.description + " on " + step.implementation + "\n";
    if (absl::StrContains(step.implementation, "amx")) ++amx_convs;
  }
  if (amx) {
    EXPECT_GT(amx_convs, 0) << convs;
  } else {
    EXPECT_EQ(amx_convs, 0) << convs;
  }
  using Layout = CompileOptions::ActivationLayout;
  for (Layout layout : {Layout::kChannelBlocked, Layout::kChannelsLast}) {
    SCOPED_TRACE(layout == Layout::kChannelsLast ? "nhwc" : "channel-blocked");
    CompileOptions forced = AllBf16();
    forced.activation_layout = layout;
    EXPECT_LT(CompareWithFp32(SmallCnn(), {1, 4}, forced).relative_max_error, 2e-2);
  }
}

// A transformer encoder layer: self-attention (Q/K/V projections in BF16,
// the fused attention in FP32), output projection + residual, LayerNorm,
// GELU feed-forward.
std::string EncoderLayer() {
  constexpr int64_t kSeq = 24, kHeads = 4, kHead = 16, kHidden = kHeads * kHead, kFfn = 128;
  OnnxModelBuilder b(17);
  b.Input("x", {-1, kSeq, kHidden}).Output("y", {-1, kSeq, kHidden});
  auto scaled = [](kernels::Tensor t, float s) {
    for (float& v : t.data) v *= s;
    return t;
  };
  b.Initializer("wo", scaled(RandomTensor({kHidden, kHidden}, 10), 0.125f))
      .Initializer("bo", RandomTensor({kHidden}, 11))
      .Initializer("gamma", RandomTensor({kHidden}, 12))
      .Initializer("beta", RandomTensor({kHidden}, 13))
      .Initializer("w1", scaled(RandomTensor({kHidden, kFfn}, 14), 0.125f))
      .Initializer("b1", RandomTensor({kFfn}, 15))
      .Initializer("w2", scaled(RandomTensor({kFfn, kHidden}, 16), 0.09f))
      .Initializer("b2", RandomTensor({kHidden}, 17))
      .Initializer("sqrt2", kernels::Tensor({}, {std::sqrt(2.0f)}))
      .Initializer("one", kernels::Tensor({}, {1.0f}))
      .Initializer("half", kernels::Tensor({}, {0.5f}));
  testing::AddSelfAttention(b, "x", "c2", kSeq, kHeads, kHead, "Mul", 0.25f);
  b.Node("MatMul", {"c2", "wo"}, {"o0"}, "proj_o");
  b.Node("Add", {"o0", "bo"}, {"o1"}, "proj_o_bias");
  b.Node("Add", {"o1", "x"}, {"o2"}, "residual");
  b.Node("LayerNormalization", {"o2", "gamma", "beta"}, {"ln"}, "ln");
  b.Node("MatMul", {"ln", "w1"}, {"f0"}, "ffn1");
  b.Node("Add", {"f0", "b1"}, {"f1"}, "ffn1_bias");
  b.Node("Div", {"f1", "sqrt2"}, {"g0"}, "gelu_div");
  b.Node("Erf", {"g0"}, {"g1"}, "gelu_erf");
  b.Node("Add", {"g1", "one"}, {"g2"}, "gelu_add");
  b.Node("Mul", {"f1", "g2"}, {"g3"}, "gelu_mul");
  b.Node("Mul", {"g3", "half"}, {"g4"}, "gelu_half");
  b.Node("MatMul", {"g4", "w2"}, {"f2"}, "ffn2");
  b.Node("Add", {"f2", "b2"}, {"f3"}, "ffn2_bias");
  b.Node("Add", {"f3", "ln"}, {"y"}, "ffn_residual");
  return b.Save("bf16_encoder_layer");
}

TEST(PrecisionTest, EncoderLayerMatchesFp32) {
  SKIP_WITHOUT_NATIVE_BF16();
  // Every projection in BF16 (at 64 hidden units the default would keep
  // most of them FP32: 2 x 64 FLOPs per input element).
  const Comparison c = CompareWithFp32(EncoderLayer(), {1, 5}, AllBf16());
  std::cout << "encoder layer: BF16 vs FP32 largest error " << c.relative_max_error
            << " of the largest output, normalized error " << c.normalized_error << "\n";
  EXPECT_LT(c.relative_max_error, 2e-2);
  EXPECT_THAT(c.fp32_steps, ::testing::IsEmpty());
}

// The trained MLP's accuracy on the first kImages of the Fashion-MNIST test
// set (Debian's dataset-fashion-mnist), pixels scaled to [0, 1] as in
// training: BF16 within 0.5 point of FP32.
TEST(PrecisionTest, FashionMnistAccuracyWithinHalfAPointOfFp32) {
  SKIP_WITHOUT_NATIVE_BF16();
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  const std::string images_path = dir + "/t10k-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/t10k-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(images_path) || !std::filesystem::exists(labels_path)) {
    NUMASERVE_MISSING_PREREQUISITE()
        << images_path << " is missing (Debian package dataset-fashion-mnist)";
  }
  auto images = training::ReadIdxFile(images_path);
  auto labels = training::ReadIdxFile(labels_path);
  ASSERT_TRUE(images.ok()) << images.status();
  ASSERT_TRUE(labels.ok()) << labels.status();
  constexpr int64_t kImages = 5000, kBatch = 250, kPixels = 28 * 28;
  ASSERT_GE(static_cast<int64_t>(labels->data.size()), kImages);
  double accuracy[2] = {0, 0};
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    auto model = CompiledModel::Load(TrainedMlp(), WithPrecision(p));
    ASSERT_TRUE(model.ok()) << model.status();
    int64_t correct = 0;
    for (int64_t first = 0; first < kImages; first += kBatch) {
      std::vector<float> x(kBatch * kPixels);
      for (int64_t i = 0; i < kBatch * kPixels; ++i) {
        x[i] = images->data[first * kPixels + i] * (1.0f / 255.0f);
      }
      const std::vector<float> y = RunOnce(**model, kBatch, {x});
      ASSERT_EQ(static_cast<int64_t>(y.size()), kBatch * 10);
      for (int64_t r = 0; r < kBatch; ++r) {
        const auto row = y.begin() + r * 10;
        correct += std::max_element(row, row + 10) - row == labels->data[first + r];
      }
    }
    accuracy[p == Precision::kBf16] = 100.0 * correct / kImages;
  }
  std::cout << "Fashion-MNIST, first " << kImages << " test images, trained MLP: FP32 "
            << accuracy[0] << "%, BF16 " << accuracy[1] << "%\n";
  EXPECT_GT(accuracy[0], 85.0) << "the trained model or the data is not what it should be";
  EXPECT_LE(std::abs(accuracy[1] - accuracy[0]), 0.5);
}

// The benchmark models (benchmarks/models/generate.py): the largest error
// of BF16's outputs (logits; BERT-base's hidden states) relative to the
// largest FP32 output, on random inputs, at batch 2.
class Bf16BenchmarkModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16BenchmarkModelTest, OutputsMatchFp32) {
  SKIP_WITHOUT_NATIVE_BF16();
  const std::string path = absl::StrCat(NUMASERVE_BENCHMARK_MODELS, "/", GetParam(), ".onnx");
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing: the benchmark_models fixture generates it";
  const Comparison c = CompareWithFp32(path, {2}, WithPrecision(Precision::kBf16));
  std::cout << GetParam() << ": BF16 vs FP32 largest error " << c.relative_max_error
            << " of the largest output, normalized error " << c.normalized_error << "; "
            << c.bf16_steps << " conv/matmul steps in BF16, " << c.fp32_steps.size()
            << " in FP32\n";
  EXPECT_LT(c.relative_max_error, 5e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16BenchmarkModelTest,
                         ::testing::Values("mlp", "resnet50", "mobilenetv2", "bert_base"));

}  // namespace
}  // namespace numaserve::engine
