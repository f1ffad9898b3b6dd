// Test helper: loads a model both through CompiledModel and the reference
// executor and compares every output over several batch sizes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/ops/shape_propagation.h"
#include "engine/reference/reference_executor.h"

namespace numaserve::engine::testing {

inline kernels::Tensor RandomTensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  kernels::Tensor t(shape);
  for (float& v : t.data) v = dist(rng);
  return t;
}

// mse(expected, actual) / mse(expected, 0).
inline double NormalizedError(const std::vector<float>& expected, const float* actual) {
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    num += (static_cast<double>(expected[i]) - actual[i]) * (expected[i] - actual[i]);
    den += static_cast<double>(expected[i]) * expected[i];
  }
  return den == 0 ? num : num / den;
}

// Runs `model` at `shapes` (FP32 inputs) and the reference executor on the
// same inputs; the largest normalized error over the outputs.
inline double RunAgainstReference(CompiledModel& model, const Graph& graph,
                                  const CompiledModel::InputShapes& shapes, uint32_t seed) {
  SCOPED_TRACE(absl::StrCat("input shapes ", DescribeSignature(graph, shapes)));
  std::vector<kernels::Tensor> inputs;
  std::vector<const void*> in_ptrs;
  std::vector<size_t> in_bytes;
  for (const Shape& s : shapes) inputs.push_back(RandomTensor(s, seed++));
  for (const kernels::Tensor& t : inputs) {
    in_ptrs.push_back(t.data.data());
    in_bytes.push_back(t.data.size() * sizeof(float));
  }
  auto expected = RunReference(graph, inputs);
  EXPECT_TRUE(expected.ok()) << expected.status();
  auto out_shapes = model.OutputShapes(shapes);
  EXPECT_TRUE(out_shapes.ok()) << out_shapes.status();
  if (!expected.ok() || !out_shapes.ok()) return 1e9;
  std::vector<std::vector<float>> outputs;
  std::vector<void*> out_ptrs;
  std::vector<size_t> out_bytes;
  for (size_t j = 0; j < out_shapes->size(); ++j) {
    EXPECT_EQ((*out_shapes)[j], (*expected)[j].shape) << "output " << j;
    outputs.emplace_back(kernels::NumElements((*out_shapes)[j]), -7.0f);
  }
  for (auto& o : outputs) {
    out_ptrs.push_back(o.data());
    out_bytes.push_back(o.size() * sizeof(float));
  }
  EXPECT_TRUE(model.CheckBufferSizes(shapes, in_bytes, out_bytes).ok());
  const absl::Status run = model.Run(shapes, in_ptrs, out_ptrs);
  EXPECT_TRUE(run.ok()) << run;
  if (!run.ok()) return 1e9;
  double worst = 0;
  for (size_t j = 0; j < outputs.size(); ++j) {
    if ((*expected)[j].data.size() != outputs[j].size()) return 1e9;
    worst = std::max(worst, NormalizedError((*expected)[j].data, outputs[j].data()));
  }
  return worst;
}

inline void ExpectCompiledMatchesReference(const std::string& name, const std::string& path,
                                           const std::vector<int64_t>& batches,
                                           double tolerance = 1e-6,
                                           const CompileOptions& options = {}) {
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << name << ": " << graph.status();
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << name << ": " << model.status();
  uint32_t seed = 1;
  for (int64_t batch : batches) {
    SCOPED_TRACE(absl::StrCat("model ", name, ", batch ", batch));
    std::vector<kernels::Tensor> inputs;
    for (const Shape& s : InputShapesForBatch(*graph, batch)) {
      inputs.push_back(RandomTensor(s, seed++));
    }
    auto expected = RunReference(*graph, inputs);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const auto shapes = (*model)->OutputShapes(batch);
    ASSERT_EQ(shapes.size(), expected->size());
    std::vector<std::vector<float>> outputs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i], (*expected)[i].shape) << "output " << i;
      outputs.emplace_back(kernels::NumElements(shapes[i]), -7.0f);
    }
    std::vector<const void*> in_ptrs;
    for (const kernels::Tensor& t : inputs) in_ptrs.push_back(t.data.data());
    std::vector<void*> out_ptrs;
    for (auto& o : outputs) out_ptrs.push_back(o.data());
    const absl::Status run = (*model)->Run(batch, in_ptrs, out_ptrs);
    ASSERT_TRUE(run.ok()) << run;
    for (size_t i = 0; i < outputs.size(); ++i) {
      EXPECT_LT(NormalizedError((*expected)[i].data, outputs[i].data()), tolerance)
          << "output " << i;
    }
  }
}

}  // namespace numaserve::engine::testing
