// CompileOptions::conv_algorithm = "winograd": 3x3 stride-1 convs between
// blocked activations run on oneDNN's Winograd where it has one (AVX-512)
// and on numaserve's own on the AVX2 tier, others stay direct, and the results match the reference
// and the direct algorithm closely; unknown algorithms are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "affinity/cpu_features.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/onednn/onednn_common.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"
#include "tests/prerequisites.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// conv1 (3x3, plain input) -> relu -> conv2 (3x3) + r1 -> relu -> conv3
// (3x3 stride 2) -> relu -> conv4 (3x3, graph output: plain).
std::string ThreeByThreeChain() {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 16, 14, 14}).Output("y", {-1, 32, 7, 7});
  b.Initializer("w1", RandomTensor({32, 16, 3, 3}, 1)).Initializer("b1", RandomTensor({32}, 2));
  b.Initializer("w2", RandomTensor({32, 32, 3, 3}, 3)).Initializer("b2", RandomTensor({32}, 4));
  b.Initializer("w3", RandomTensor({32, 32, 3, 3}, 5));
  b.Initializer("w4", RandomTensor({32, 32, 3, 3}, 6));
  auto pads = [](onnx::NodeProto& n) { OnnxModelBuilder::AttrInts(n, "pads", {1, 1, 1, 1}); };
  pads(b.Node("Conv", {"x", "w1", "b1"}, {"c1"}, "conv1"));
  b.Node("Relu", {"c1"}, {"r1"}, "relu1");
  pads(b.Node("Conv", {"r1", "w2", "b2"}, {"c2"}, "conv2"));
  b.Node("Add", {"c2", "r1"}, {"s2"}, "add2");
  b.Node("Relu", {"s2"}, {"r2"}, "relu2");
  auto& c3 = b.Node("Conv", {"r2", "w3"}, {"c3"}, "conv3");
  pads(c3);
  OnnxModelBuilder::AttrInts(c3, "strides", {2, 2});
  b.Node("Relu", {"c3"}, {"r3"}, "relu3");
  pads(b.Node("Conv", {"r3", "w4"}, {"y"}, "conv4"));
  return b.Save("winograd_chain");
}

std::vector<float> RunOnce(CompiledModel& model, int64_t batch, const std::vector<float>& x) {
  std::vector<float> y(batch * 32 * 7 * 7, -7.0f);
  EXPECT_TRUE(model.Run(batch, {x.data()}, {y.data()}).ok());
  return y;
}

TEST(ConvWinogradTest, MatchesTheReference) {
  testing::ExpectCompiledMatchesReference("winograd_chain", ThreeByThreeChain(), {1, 3}, 1e-9,
                                          {.conv_algorithm = "winograd"});
}

TEST(ConvWinogradTest, OnlyBlockedThreeByThreeStrideOneConvsUseIt) {
  const std::string path = ThreeByThreeChain();
  auto model = CompiledModel::Load(path, {.conv_algorithm = "winograd"});
  ASSERT_TRUE(model.ok()) << model.status();
  auto direct = CompiledModel::Load(path, {.conv_algorithm = "direct"});
  ASSERT_TRUE(direct.ok()) << direct.status();
  const std::vector<float> x = RandomTensor({2, 16, 14, 14}, 9).data;
  (*model)->SetProfiling(true);
  (*direct)->SetProfiling(true);
  const std::vector<float> wino = RunOnce(**model, 2, x);
  const std::vector<float> plain = RunOnce(**direct, 2, x);
  std::vector<std::string> impl;
  for (const StepProfile& row : (*model)->Profile()) {
    if (row.kind == "conv") impl.push_back(row.implementation);
  }
  ASSERT_EQ(impl.size(), 4u);
  EXPECT_THAT(impl[0], ::testing::Not(HasSubstr("wino")));  // plain input
  EXPECT_THAT(impl[2], ::testing::Not(HasSubstr("wino")));  // stride 2
  EXPECT_THAT(impl[3], ::testing::Not(HasSubstr("wino")));  // plain output
  // Blocked in and out, residual sum, relu: numaserve's own Winograd on the
  // AVX2 tier (an AVX2 CPU, or NUMASERVE_MAX_ISA=avx2). On AVX-512 the conv
  // asks oneDNN for its Winograd, which oneDNN 3 no longer has on CPUs
  // (2.6 had it): it runs direct there, on a jit kernel (checked below).
  const kernels::IsaTier tier = kernels::GetDispatchDecision().max_tier;
  if (tier == kernels::IsaTier::kAvx2) {
    EXPECT_THAT(impl[1], HasSubstr("numaserve:winograd_f4x3 avx2"));
  }
  for (const std::string& name : impl) {
    EXPECT_FALSE(kernels::IsReferenceImplementation(name)) << name;
  }
  for (const StepProfile& row : (*direct)->Profile()) {
    EXPECT_THAT(row.implementation, ::testing::Not(HasSubstr("wino")));
  }
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(plain[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(plain[i] - wino[i])));
  }
  EXPECT_GT(max_abs, 1.0);
  EXPECT_LT(max_diff, 1e-4 * max_abs) << "max |direct - winograd| " << max_diff;
}

TEST(ConvWinogradTest, UnknownAlgorithmIsRefused) {
  auto model = CompiledModel::Load(ThreeByThreeChain(), {.conv_algorithm = "fft"});
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("'fft' is not one of direct, winograd"));
}

// The benchmark ResNet-50 (benchmarks/models/generate.py), when generated:
// the logits of both algorithms on the same input, and their difference.
TEST(ConvWinogradTest, ResNet50LogitsStayClose) {
  const std::string path = NUMASERVE_BENCHMARK_MODELS "/resnet50.onnx";
  if (!std::filesystem::exists(path)) NUMASERVE_MISSING_PREREQUISITE() << path << " not generated";
  auto wino = CompiledModel::Load(path, {.conv_algorithm = "winograd"});
  auto direct = CompiledModel::Load(path, {.conv_algorithm = "direct"});
  ASSERT_TRUE(wino.ok()) << wino.status();
  ASSERT_TRUE(direct.ok()) << direct.status();
  const std::vector<float> x = RandomTensor({2, 3, 224, 224}, 11).data;
  std::vector<float> a(2 * 1000), b(2 * 1000);
  ASSERT_TRUE((*wino)->Run(2, {x.data()}, {a.data()}).ok());
  ASSERT_TRUE((*direct)->Run(2, {x.data()}, {b.data()}).ok());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(b[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  std::printf("resnet50 logits: max |direct| %.6g, max |direct - winograd| %.3g\n", max_abs,
              max_diff);
  EXPECT_GT(max_abs, 0.0);
  EXPECT_LT(max_diff, 1e-3 * max_abs + 1e-5);
}

}  // namespace
}  // namespace numaserve::engine
