// RoiAlign (engine/ops/roi_ops.cc) against hand-computed values (avg and
// max, one bilinear sample), on the reference executor and the compiled
// model; a batch index out of range, non-finite rois and rois far larger
// than X fail the run with INVALID_ARGUMENT naming the node, never a
// crash. NonZero (engine/ops/index_ops.cc) of a constant folds at load; of
// a runtime value it is refused at load, naming the node.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using P = onnx::TensorProto;

// X [1, 1, 4, 4] = 0..15 (a runtime input), rois [-1, 4] and batch
// indices [-1] at run time; one 1x1 RoiAlign in MODE,
// output_half_pixel, one sample per bin.
OnnxModelBuilder RoiModel(const std::string& mode) {
  OnnxModelBuilder b(16);
  b.Input("x", {1, 1, 4, 4});
  b.Input("rois", {-1, 4});
  b.Input("batch", {-1}, P::INT64);
  auto& n = b.Node("RoiAlign", {"x", "rois", "batch"}, {"y"}, "align");
  OnnxModelBuilder::AttrString(n, "mode", mode);
  OnnxModelBuilder::AttrString(n, "coordinate_transformation_mode", "output_half_pixel");
  OnnxModelBuilder::AttrInt(n, "sampling_ratio", 1);
  b.Output("y", {-1, 1, 1, 1});
  return b;
}

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

// Runs the model at the given rois (one per row) and batch indices.
absl::StatusOr<std::vector<float>> RunRois(const std::string& path, std::vector<float> rois,
                                           std::vector<int64_t> batch) {
  auto model = CompiledModel::Load(path, {});
  if (!model.ok()) return model.status();
  const auto r = static_cast<int64_t>(batch.size());
  const std::vector<float> x = Iota(16);
  std::vector<float> y(r);
  absl::Status s = (*model)->Run(r, {x.data(), rois.data(), batch.data()}, {y.data()});
  if (!s.ok()) return s;
  return y;
}

TEST(RoiAlignTest, OneSampleIsTheBilinearValueAndMaxItsLargestWeightedCorner) {
  auto avg = RoiModel("avg");
  const std::string avg_path = avg.Save("roi_avg");
  // One sample at (1.5, 1.5): the mean of 5, 6, 9 and 10.
  auto y = RunRois(avg_path, {0, 0, 3, 3, 1, 0, 3, 2}, {0, 0});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FLOAT_EQ((*y)[0], 7.5F);
  EXPECT_FLOAT_EQ((*y)[1], 6.0F);  // at (1, 2): x = 4 * 1 + 2
  auto max = RoiModel("max");
  y = RunRois(max.Save("roi_max"), {0, 0, 3, 3}, {0});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_FLOAT_EQ((*y)[0], 2.5F);  // 0.25 * 10
  // The reference executor agrees.
  auto graph = ImportOnnxModel(avg_path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto ref = RunReferenceTyped(
      *graph, {TypedTensor::FromValues(DataType::kFloat32, {1, 1, 4, 4}, Iota(16)),
               TypedTensor::FromValues(DataType::kFloat32, {1, 4}, std::vector<float>{0, 0, 3, 3}),
               TypedTensor::FromValues(DataType::kInt64, {1}, std::vector<int64_t>{0})});
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_FLOAT_EQ((*ref)[0].data<float>()[0], 7.5F);
}

void ExpectRunRefused(const std::string& path, std::vector<float> rois, std::vector<int64_t> batch,
                      const std::string& what) {
  auto y = RunRois(path, std::move(rois), std::move(batch));
  ASSERT_FALSE(y.ok()) << what;
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << y.status();
  EXPECT_NE(y.status().message().find("'align'"), std::string::npos) << y.status();
  EXPECT_NE(y.status().message().find(what), std::string::npos) << y.status();
}

TEST(RoiAlignTest, HostileRoisFailTheRunNamingTheNode) {
  auto b = RoiModel("avg");
  const std::string path = b.Save("roi_hostile");
  ExpectRunRefused(path, {0, 0, 3, 3}, {1}, "batch index 1 of roi 0 is out of range");
  ExpectRunRefused(path, {0, 0, 3, 3}, {-1}, "batch index -1 of roi 0 is out of range");
  const float inf = std::numeric_limits<float>::infinity();
  ExpectRunRefused(path, {0, 0, inf, 3}, {0}, "not finite");
  // Adaptive sampling over a roi of 1e7 x 1e7 pixels.
  auto adaptive = RoiModel("avg");
  auto* node = adaptive.proto().mutable_graph()->mutable_node(0);
  for (auto& a : *node->mutable_attribute()) {
    if (a.name() == "sampling_ratio") a.set_i(0);
  }
  ExpectRunRefused(adaptive.Save("roi_huge"), {0, 0, 1e7F, 1e7F}, {0}, "samples");
}

TEST(NonZeroTest, OfAConstantFoldsAtLoad) {
  OnnxModelBuilder b(13);
  b.Input("m", {3, 2});
  b.Initializer("mask", kernels::Tensor({3, 2}, {0, 1, 2, 0, 0, 3}));
  b.Node("NonZero", {"mask"}, {"nz"}, "nonzero");
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"nz"}, {"nz_t"}), "perm", {1, 0});
  b.Node("GatherND", {"m", "nz_t"}, {"picked"});
  b.Output("picked", {3});
  auto graph = ImportOnnxModel(b.Save("nonzero_constant"));
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (const Node& node : graph->nodes()) EXPECT_NE(node.op_type, "NonZero");
  auto out = RunReferenceTyped(
      *graph, {TypedTensor::FromValues(DataType::kFloat32, {3, 2},
                                       std::vector<float>{10, 11, 12, 13, 14, 15})});
  ASSERT_TRUE(out.ok()) << out.status();
  const TypedTensor& picked = (*out)[0];
  EXPECT_EQ(std::vector<float>(picked.data<float>(), picked.data<float>() + 3),
            (std::vector<float>{11, 12, 15}));
}

TEST(NonZeroTest, OfARuntimeValueIsRefusedAtLoad) {
  OnnxModelBuilder b(13);
  b.Input("x", {3, 2});
  b.Node("NonZero", {"x"}, {"nz"}, "nonzero");
  b.Output("nz", {2, testing::kUnknownDim}, P::INT64);
  auto model = CompiledModel::Load(b.Save("nonzero_runtime"), {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented) << model.status();
  EXPECT_NE(model.status().message().find("node 'nonzero' (op NonZero)"), std::string::npos)
      << model.status();
  EXPECT_NE(model.status().message().find("data-dependent shapes are not supported"),
            std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace numaserve::engine
