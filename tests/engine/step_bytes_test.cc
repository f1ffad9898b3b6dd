// The step profile's FLOPs and compulsory bytes moved (StepProfile::flops,
// ::bytes), against figures computed by hand from the shapes: a Gemm, a
// Conv and a small MLP; and the step events a timeline is drawn from.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/model.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using testing::RandomTensor;

constexpr double kFloat = sizeof(float);

// Profiles `runs` runs of `batch` rows (input and output sizes given) on
// one thread and returns the rows.
std::vector<StepProfile> ProfileOf(const std::string& path, int64_t batch, size_t input_floats,
                                   size_t output_floats, int runs) {
  auto model = CompiledModel::Load(path, {.num_threads = 1});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  std::vector<float> x(input_floats, 0.5f), y(output_floats);
  EXPECT_TRUE((*model)->Run(batch, {x.data()}, {y.data()}).ok());  // warm-up, not counted
  (*model)->SetProfiling(true);
  for (int i = 0; i < runs; ++i) EXPECT_TRUE((*model)->Run(batch, {x.data()}, {y.data()}).ok());
  (*model)->SetProfiling(false);
  return (*model)->Profile();
}

TEST(StepBytesTest, GemmWithBias) {
  constexpr int64_t M = 5, K = 24, N = 16;
  OnnxModelBuilder b(13);
  b.Input("x", {-1, K}).Output("y", {-1, N});
  b.Initializer("w", RandomTensor({N, K}, 1)).Initializer("bias", RandomTensor({N}, 2));
  OnnxModelBuilder::AttrInt(b.Node("Gemm", {"x", "w", "bias"}, {"y"}, "fc"), "transB", 1);
  const std::vector<StepProfile> rows = ProfileOf(b.Save("bytes_gemm"), M, M * K, M * N, 3);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "matmul");
  EXPECT_EQ(rows[0].calls, 3);
  EXPECT_EQ(rows[0].precision, "fp32");
  // Per call: 2MKN FLOPs; x, the weights and the bias read, y written.
  EXPECT_DOUBLE_EQ(rows[0].flops, 3 * 2.0 * M * K * N);
  EXPECT_DOUBLE_EQ(rows[0].bytes, 3 * kFloat * (M * K + K * N + N + M * N));
}

TEST(StepBytesTest, ConvWithBiasCountsWeightsOncePerCall) {
  // [2,3,9,9] * [4,3,3,3] stride 2, no padding -> [2,4,4,4].
  constexpr int64_t batch = 2, C = 3, H = 9, M = 4, k = 3, OH = 4;
  OnnxModelBuilder b(13);
  b.Input("x", {-1, C, H, H}).Output("y", {-1, M, OH, OH});
  b.Initializer("w", RandomTensor({M, C, k, k}, 3)).Initializer("bias", RandomTensor({M}, 4));
  auto& conv = b.Node("Conv", {"x", "w", "bias"}, {"y"}, "conv");
  OnnxModelBuilder::AttrInts(conv, "strides", {2, 2});
  OnnxModelBuilder::AttrInts(conv, "kernel_shape", {k, k});
  const std::vector<StepProfile> rows =
      ProfileOf(b.Save("bytes_conv"), batch, batch * C * H * H, batch * M * OH * OH, 2);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "conv");
  // Each output element: C x k x k multiply-adds.
  EXPECT_DOUBLE_EQ(rows[0].flops, 2 * 2.0 * batch * M * OH * OH * C * k * k);
  const double per_call = kFloat * (batch * C * H * H      // x
                                    + M * C * k * k + M    // weights, bias
                                    + batch * M * OH * OH  // y
                                   );
  EXPECT_DOUBLE_EQ(rows[0].bytes, 2 * per_call);
}

TEST(StepBytesTest, MlpSumsItsSteps) {
  // x[B,20] -> Gemm 20x32 + b1 -> Relu -> Gemm 32x10 + b2 -> Softmax -> y.
  constexpr int64_t B = 7, D0 = 20, D1 = 32, D2 = 10;
  OnnxModelBuilder b(13);
  b.Input("x", {-1, D0}).Output("y", {-1, D2});
  b.Initializer("w1", RandomTensor({D1, D0}, 5)).Initializer("b1", RandomTensor({D1}, 6));
  b.Initializer("w2", RandomTensor({D2, D1}, 7)).Initializer("b2", RandomTensor({D2}, 8));
  OnnxModelBuilder::AttrInt(b.Node("Gemm", {"x", "w1", "b1"}, {"h"}, "fc1"), "transB", 1);
  b.Node("Relu", {"h"}, {"r"}, "relu1");
  OnnxModelBuilder::AttrInt(b.Node("Gemm", {"r", "w2", "b2"}, {"z"}, "fc2"), "transB", 1);
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"z"}, {"y"}, "softmax"), "axis", 1);
  const std::vector<StepProfile> rows = ProfileOf(b.Save("bytes_mlp"), B, B * D0, B * D2, 1);
  ASSERT_EQ(rows.size(), 3u);  // matmul fc1+relu1, matmul fc2, softmax
  double flops = 0, bytes = 0;
  for (const StepProfile& row : rows) {
    EXPECT_EQ(row.calls, 1) << row.description;
    EXPECT_GT(row.bytes, 0) << row.description;
    flops += row.flops;
    bytes += row.bytes;
  }
  EXPECT_EQ(rows[2].kind, "softmax");
  EXPECT_DOUBLE_EQ(rows[2].flops, 0);
  EXPECT_DOUBLE_EQ(rows[2].bytes, kFloat * 2 * B * D2);  // z read, y written
  EXPECT_DOUBLE_EQ(flops, 2.0 * B * (D0 * D1 + D1 * D2));
  EXPECT_DOUBLE_EQ(bytes, kFloat * ((B * D0 + D0 * D1 + D1 + B * D1) +  // fc1 (+relu)
                                    (B * D1 + D1 * D2 + D2 + B * D2) +  // fc2
                                    2 * B * D2));                       // softmax
}

TEST(StepBytesTest, EventsOneCallPerStepPerRunUpToTheLimit) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 8}).Output("y", {-1, 8});
  b.Initializer("w", RandomTensor({8, 8}, 9));
  b.Node("MatMul", {"x", "w"}, {"h"}, "mm");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"h"}, {"y"}, "softmax"), "axis", 1);
  auto model = CompiledModel::Load(b.Save("bytes_events"), {.num_threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> x(2 * 8, 0.5f), y(2 * 8);
  // No limit set: no events.
  (*model)->SetProfiling(true);
  ASSERT_TRUE((*model)->Run(2, {x.data()}, {y.data()}).ok());
  EXPECT_TRUE((*model)->StepEvents().empty());

  (*model)->SetStepEventLimit(5);  // room for 2 runs of 2 steps, not 3
  (*model)->SetProfiling(true);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*model)->Run(2, {x.data()}, {y.data()}).ok());
  const std::vector<StepEvent> events = (*model)->StepEvents();
  ASSERT_EQ(events.size(), 4u);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].index, static_cast<int>(i % 2));
    EXPECT_EQ(events[i].run, static_cast<int64_t>(i / 2));
    EXPECT_GE(events[i].seconds, 0);
    if (i > 0) {
      EXPECT_GE(events[i].start_seconds, events[i - 1].start_seconds + events[i - 1].seconds);
    }
  }
  EXPECT_EQ((*model)->Profile()[0].calls, 4) << "every run is still timed";
}

}  // namespace
}  // namespace numaserve::engine
