// Element-wise steps that read and write either activation layout, so that
// a chain of convs keeps its blocked tensors through them: one oneDNN
// eltwise algorithm (SiLU, HardSwish, ...) and a per-channel scale (a
// squeeze-excitation block's Mul).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/compiler/compiled_steps.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/elementwise_onednn.h"

namespace numaserve::engine {

// One oneDNN eltwise algorithm as a step: SiLU as exporters write it
// (x * Sigmoid(x): eltwise_swish), HardSwish and x * HardSigmoid(x)
// (eltwise_hardswish), Sigmoid, HardSigmoid. Where the function maps 0 to 0
// (`zero_preserving`) it reads and writes either layout, since a blocked
// tensor's channel padding then stays zero; where src's layout and dst's
// differ, src is reordered into dst first and the function runs in place.
// Otherwise it runs on plain tensors only.
class EltwiseStep final : public Step {
 public:
  EltwiseStep(const dnnl::engine& engine, kernels::BlockedLayout layout, kernels::EltwisePostOp op,
              bool zero_preserving, ValueId src, ValueId dst, std::string name)
      : Step(zero_preserving ? BlockedRowWiseTraits(src, dst) : PlainTraits(src, dst)),
        kernel_(engine, op.algorithm, op.alpha, op.beta),
        reorder_(engine, layout),
        layout_(layout),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "eltwise: " + name_; }
  void SetLayouts(const std::vector<bool>& blocked) override {
    src_blocked_ = blocked[src_];
    dst_blocked_ = blocked[dst_];
  }
  std::string Layouts() const override {
    return std::string(LayoutName(src_blocked_, layout_)) + "->" +
           LayoutName(dst_blocked_, layout_);
  }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return kernel_.ImplementationName(Count(shapes[dst_]));
  }
  size_t CachedShapes() const override {
    return kernel_.cached_shapes() + reorder_.cached_shapes();
  }

 private:
  static StepTraits PlainTraits(ValueId src, ValueId dst) {
    StepTraits t = StepTraits::ReadsWrites({src}, {dst});
    t.row_wise = {src, dst};
    return t;
  }
  // The floats the function runs over: dst's elements, with the channel
  // padding where dst is blocked.
  int64_t Count(const Shape& shape) const;

  kernels::EltwiseOnednn kernel_;
  kernels::ActivationReorder reorder_;
  kernels::BlockedLayout layout_;
  ValueId src_, dst_;
  bool src_blocked_ = false, dst_blocked_ = false;
  std::string name_;
};

// dst = x * scale, where scale holds one value per row and channel: a
// squeeze-excitation block's [N, C, 1, 1] gate (or a [1, C, 1, 1] one)
// broadcast over its [N, C, H, W] feature map (rank 3 to 5). x, dst and
// scale in either layout (x reordered into dst's first where they differ;
// a blocked scale is its rows of channels padded to the block).
// OpenMP-parallel over rows and channel blocks.
class ChannelScaleStep final : public Step {
 public:
  ChannelScaleStep(const dnnl::engine& engine, kernels::BlockedLayout layout, ValueId x,
                   ValueId scale, ValueId dst, std::string name)
      : Step(Traits(x, scale, dst)),
        reorder_(engine, layout),
        layout_(layout),
        x_(x),
        scale_(scale),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "channel-scale: " + name_; }
  void SetLayouts(const std::vector<bool>& blocked) override {
    x_blocked_ = blocked[x_];
    scale_blocked_ = blocked[scale_];
    dst_blocked_ = blocked[dst_];
  }
  std::string Layouts() const override {
    return std::string(LayoutName(x_blocked_, layout_)) + "->" + LayoutName(dst_blocked_, layout_);
  }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return "numaserve:loop";
  }
  size_t CachedShapes() const override { return reorder_.cached_shapes(); }

  // Whether `scale`'s shape is one value per row (or one row for all) and
  // channel of `x`'s, of rank 3 to 5.
  static bool Fits(const Shape& x, const Shape& scale);

 private:
  static StepTraits Traits(ValueId x, ValueId scale, ValueId dst) {
    StepTraits t = StepTraits::ReadsWrites({x, scale}, {dst});
    t.blocked_reads = {x, scale};
    t.blocked_write = dst;
    return t;
  }

  kernels::ActivationReorder reorder_;
  kernels::BlockedLayout layout_;
  ValueId x_, scale_, dst_;
  bool x_blocked_ = false, scale_blocked_ = false, dst_blocked_ = false;
  std::string name_;
};

}  // namespace numaserve::engine
