// No reference kernel on any ISA tier: the benchmark models' graphs and a
// small CNN (BatchNormalization, depthwise, residual, a grouped conv whose
// groups are not whole channel blocks, 32x32 inputs) are compiled and run
// on the tier this process has, and every conv, pool, matmul and attention
// step must run on an optimized implementation. ctest runs this binary
// natively and again under NUMASERVE_MAX_ISA=avx2 (which test_main.cc sets
// as the cap of the own kernels and oneDNN), so an AVX-512 machine checks
// the AVX2 tier too;
// on an AVX2-only machine the native run is the AVX2 one.
// The small CNN is also checked against the reference executor, so a
// reordered fallback that computes the wrong thing fails here.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/onednn/onednn_common.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/conv_bn_block.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::ConvBnBlocks;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// Step kinds that do the model's heavy work: none of them may run on a
// reference implementation.
bool HeavyKind(const std::string& kind) {
  return kind == "conv" || kind == "pool" || kind == "matmul" || kind == "batched_matmul" ||
         kind == "attention";
}

// Ops that must never fall to the engine's own scalar reference step.
bool HeavyOp(const std::string& implementation) {
  for (const char* op : {"Conv", "ConvTranspose", "MatMul", "Gemm", "MaxPool", "AveragePool",
                         "GlobalAveragePool", "GlobalMaxPool", "Softmax", "LayerNormalization"}) {
    if (implementation == absl::StrCat("numaserve:reference ", op)) return true;
  }
  return false;
}

std::string Tier() {
  return absl::StrCat(kernels::IsaDescription(), ", layouts ", kernels::BlockedLayoutName());
}

using Layout = CompileOptions::ActivationLayout;

// Compiles `path` with its activations between convs and pools in
// `layout`, runs `batch` rows of zeros once and checks the plan.
void ExpectNoReferenceKernels(const std::string& path, int64_t batch,
                              Layout layout = Layout::kAuto) {
  SCOPED_TRACE(absl::StrCat(path, " at batch ", batch, " (", Tier(), ")"));
  CompileOptions options;
  options.gemm_backend = "onednn";
  options.activation_layout = layout;
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelInfo& info = (*model)->info();
  std::vector<std::vector<char>> inputs, outputs;
  for (const TensorInfo& t : info.inputs) {
    int64_t n = DataTypeSize(t.type);
    for (size_t d = 0; d < t.shape.size(); ++d)
      n *= (d == 0 && t.shape[d] < 0) ? batch : t.shape[d];
    inputs.emplace_back(n, 0);
  }
  const auto shapes = (*model)->OutputShapes(batch);
  for (size_t i = 0; i < shapes.size(); ++i) {
    outputs.emplace_back(kernels::NumElements(shapes[i]) * DataTypeSize(info.outputs[i].type), 0);
  }
  std::vector<const void*> in_ptrs;
  for (auto& v : inputs) in_ptrs.push_back(v.data());
  std::vector<void*> out_ptrs;
  for (auto& v : outputs) out_ptrs.push_back(v.data());
  absl::Status run = (*model)->Run(batch, in_ptrs, out_ptrs);
  ASSERT_TRUE(run.ok()) << run;
  auto plan = (*model)->PlanAt(batch);
  ASSERT_TRUE(plan.ok()) << plan.status();
  if (layout == Layout::kChannelsLast) {
    EXPECT_EQ((*model)->ActivationLayoutName(), "nhwc");
    for (const PlannedStep& step : *plan) {
      EXPECT_FALSE(absl::StrContains(step.layouts, "nCh"))
          << step.description << ": " << step.layouts;
    }
  }
  int heavy = 0;
  for (const PlannedStep& step : *plan) {
    if (HeavyKind(step.kind)) {
      ++heavy;
      EXPECT_FALSE(step.implementation.empty()) << step.description << " names no implementation";
      EXPECT_FALSE(step.reference) << step.description << " runs on " << step.implementation;
    }
    EXPECT_FALSE(HeavyOp(step.implementation))
        << step.description << " runs on " << step.implementation;
  }
  EXPECT_GT(heavy, 0) << "no conv, pool, matmul or attention step: the check checked nothing";
  std::cout << path << " at batch " << batch << ": " << plan->size() << " steps, " << heavy
            << " conv/pool/matmul/attention, none on a reference kernel (" << Tier() << ")\n";
}

// 32x32x3 -> conv 3x3 + BN + Relu (16) -> inverted residual (1x1 expand +
// BN + Clip, depthwise 3x3 + BN + Clip, 1x1 project + BN, + input) ->
// strided depthwise block -> grouped 3x3 conv (group 2, 12 channels a
// group: not whole blocks of 8 or 16) -> MaxPool -> GlobalAveragePool ->
// Flatten -> Gemm (10).
std::string SmallCnn() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3, 32, 32});
  b.Output("logits", {-1, 10});
  uint32_t seed = 100;
  ConvBnBlocks blocks(&b, &seed);
  blocks.Add("x", "stem", 3, 16, 3, 1, 1, "relu");
  blocks.Add("stem", "expand", 16, 48, 1, 1, 1, "relu6");
  blocks.Add("expand", "dw", 48, 48, 3, 1, 48, "relu6");
  blocks.Add("dw", "project", 48, 16, 1, 1, 1, "");
  b.Node("Add", {"project", "stem"}, {"res"}, "residual");
  blocks.Add("res", "expand2", 16, 48, 1, 1, 1, "relu6");
  blocks.Add("expand2", "dw2", 48, 48, 3, 2, 48, "relu6");
  blocks.Add("dw2", "project2", 48, 24, 1, 1, 1, "");
  blocks.Add("project2", "grouped", 24, 24, 3, 1, 2, "relu");
  auto& pool = b.Node("MaxPool", {"grouped"}, {"pool"}, "maxpool");
  OnnxModelBuilder::AttrInts(pool, "kernel_shape", {2, 2});
  OnnxModelBuilder::AttrInts(pool, "strides", {2, 2});
  b.Node("GlobalAveragePool", {"pool"}, {"gap"}, "gap");
  auto& flat = b.Node("Flatten", {"gap"}, {"flat"}, "flatten");
  OnnxModelBuilder::AttrInt(flat, "axis", 1);
  b.Initializer("fc_w", RandomTensor({10, 24}, seed++));
  b.Initializer("fc_b", RandomTensor({10}, seed++));
  auto& fc = b.Node("Gemm", {"flat", "fc_w", "fc_b"}, {"logits"}, "fc");
  OnnxModelBuilder::AttrInt(fc, "transB", 1);
  return b.Save("isa_tier_small_cnn");
}

TEST(IsaTierTest, SmallCnnRunsNoReferenceKernelAndMatchesTheReference) {
  std::cout << "tier: " << Tier() << "\n";
  const std::string path = SmallCnn();
  for (int64_t batch : {1, 8, 32}) ExpectNoReferenceKernels(path, batch);
  testing::ExpectCompiledMatchesReference("small_cnn", path, {1, 3, 32}, 1e-6);
}

// The same CNN with its activations channels-last (what a model with INT8
// convs gets): the FP32 convs, the depthwise and grouped ones, the pools
// and the residual run on jit kernels in nhwc and mean the same.
TEST(IsaTierTest, SmallCnnChannelsLastRunsNoReferenceKernelAndMatchesTheReference) {
  const std::string path = SmallCnn();
  for (int64_t batch : {1, 8, 32}) ExpectNoReferenceKernels(path, batch, Layout::kChannelsLast);
  CompileOptions options;
  options.activation_layout = Layout::kChannelsLast;
  testing::ExpectCompiledMatchesReference("small_cnn_nhwc", path, {1, 3, 32}, 1e-6, options);
}

class BenchmarkModelTierTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BenchmarkModelTierTest, RunsNoReferenceKernel) {
  const std::string path = absl::StrCat(NUMASERVE_BENCHMARK_MODELS, "/", GetParam(), ".onnx");
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing: the benchmark_models fixture generates it "
      << "(benchmarks/models/generate.py)";
  for (int64_t batch : {1, 4}) ExpectNoReferenceKernels(path, batch);
}

INSTANTIATE_TEST_SUITE_P(Models, BenchmarkModelTierTest,
                         ::testing::Values("mlp", "resnet50", "mobilenetv2", "bert_base"));

}  // namespace
}  // namespace numaserve::engine
