// Test helper: the Conv -> BatchNormalization -> activation blocks of the
// small CNNs that tests build with OnnxModelBuilder.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine::testing {

// Adds the scalars "zero" and "six" (Clip's bounds) once, then one block
// per Add(): Conv "<out>_conv" (pads k/2, stride, group) with random
// weights, BatchNormalization "<out>_bn" with random statistics (scale near
// 1, variance at least 1), then Relu ("relu"), Clip to [0, 6] ("relu6") or
// nothing (""), written to `out`. Random values come from seeds *seed,
// *seed + 1, ... (the caller's counter advances). With unit_gain, weights
// are scaled by 1.5 / sqrt(fan-in) so activations keep their size through
// deep stacks.
class ConvBnBlocks {
 public:
  ConvBnBlocks(OnnxModelBuilder* b, uint32_t* seed, bool unit_gain = false)
      : b_(b), seed_(seed), unit_gain_(unit_gain) {
    b_->Initializer("zero", kernels::Tensor(Shape{}, {0.0f}));
    b_->Initializer("six", kernels::Tensor(Shape{}, {6.0f}));
  }

  void Add(const std::string& in, const std::string& out, int64_t cin, int64_t cout, int64_t k,
           int64_t stride, int64_t group, const std::string& act) {
    const std::string p = out + "_";
    kernels::Tensor w = RandomTensor({cout, cin / group, k, k}, (*seed_)++);
    if (unit_gain_) {
      for (float& v : w.data) v *= 1.5f / std::sqrt(static_cast<float>(cin / group * k * k));
    }
    b_->Initializer(p + "w", w);
    auto& conv = b_->Node("Conv", {in, p + "w"}, {p + "conv"}, p + "conv");
    OnnxModelBuilder::AttrInts(conv, "pads", {k / 2, k / 2, k / 2, k / 2});
    OnnxModelBuilder::AttrInts(conv, "strides", {stride, stride});
    OnnxModelBuilder::AttrInt(conv, "group", group);
    kernels::Tensor scale = RandomTensor({cout}, (*seed_)++);
    kernels::Tensor var = RandomTensor({cout}, (*seed_)++);
    for (float& v : scale.data) v = 1.0f + 0.2f * v;
    for (float& v : var.data) v = 1.0f + 0.5f * std::abs(v);
    b_->Initializer(p + "scale", scale);
    b_->Initializer(p + "bias", RandomTensor({cout}, (*seed_)++));
    b_->Initializer(p + "mean", RandomTensor({cout}, (*seed_)++));
    b_->Initializer(p + "var", var);
    const std::string bn = act.empty() ? out : p + "bn";
    b_->Node("BatchNormalization", {p + "conv", p + "scale", p + "bias", p + "mean", p + "var"},
             {bn}, p + "bn");
    if (act == "relu") b_->Node("Relu", {bn}, {out}, p + "relu");
    if (act == "relu6") b_->Node("Clip", {bn, "zero", "six"}, {out}, p + "clip");
  }

 private:
  OnnxModelBuilder* const b_;
  uint32_t* const seed_;
  const bool unit_gain_;
};

}  // namespace numaserve::engine::testing
