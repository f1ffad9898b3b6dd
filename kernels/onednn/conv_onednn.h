// ONNX Conv on oneDNN's convolution_forward with the constant weights
// reordered once into the layout the primitive prefers, an optional bias,
// and post-ops: a sum (a residual Add: dst holds the addend on entry) and
// element-wise activations (Relu, Clip, LeakyRelu, Sigmoid, Tanh, ...).
// Activations are plain NC[D]HW or channel-blocked nC[D]HW16c (BlockedDesc),
// chosen by the caller per tensor; weights are "any".
// Primitives are created per input shape (batch) and cached; the packed
// weights are shared by every shape that prefers the same layout.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels {

// oneDNN's channel-blocked f32 layout for an [N, C, spatial...] tensor
// (C padded to 16); plain row-major when `blocked` is false.
dnnl::memory::desc ActivationDesc(const Shape& shape, bool blocked);

// Bytes of an activation in that layout.
int64_t ActivationBytes(const Shape& shape, bool blocked);

// Copies an activation between layouts (plain <-> blocked, or a plain copy
// when both are the same), one reorder primitive per shape.
class ActivationReorder {
 public:
  explicit ActivationReorder(const dnnl::engine& engine) : engine_(engine) {}
  absl::Status Execute(dnnl::stream& stream, const Shape& shape, const float* src, bool src_blocked,
                       float* dst, bool dst_blocked);

 private:
  dnnl::engine engine_;
  std::map<std::tuple<Shape, bool, bool>, BoundPrimitive> per_shape_;
};

struct EltwisePostOp {
  dnnl::algorithm algorithm = dnnl::algorithm::eltwise_relu;
  float alpha = 0.0f;
  float beta = 0.0f;
};

// A depthwise 3x3 conv (pad 1) fused after a 1x1 conv as oneDNN's
// depthwise post-op: the 1x1 output stays in cache and only the depthwise
// output is written.
struct DepthwisePostOp {
  std::vector<float> weights;          // [C, 1, 3, 3] row-major
  std::vector<float> bias;             // C values
  int64_t stride = 1;                  // 1 or 2 (both spatial dims)
  std::vector<EltwisePostOp> eltwise;  // after the depthwise conv, in order
};

struct ConvOnednnOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t group = 1;
  std::vector<int64_t> kernel;      // spatial extents (1 to 3 dims)
  std::vector<int64_t> strides;     // per spatial dim
  std::vector<int64_t> dilations;   // ONNX convention (1 = dense)
  std::vector<int64_t> pads_begin;  // per spatial dim
  std::vector<int64_t> pads_end;    // per spatial dim
  // [M, C/group, k...] row-major ([C, M/group, k...] when transposed); read
  // only during Create.
  const float* weights = nullptr;
  // ConvTranspose on oneDNN's deconvolution: pads_begin/pads_end are the
  // crops of the output (the caller derives pads_end from the output shape).
  bool transposed = false;
  std::vector<float> bias;  // empty or M values
  bool sum = false;         // dst += conv (dst holds the addend on entry)
  // Winograd F(4x4, 3x3) (oneDNN's convolution_winograd) where oneDNN has
  // it for the shape and layouts (3x3, stride 1, no dilation, no groups,
  // blocked activations); direct convolution otherwise. ~2.25x fewer FLOPs
  // for those layers, slightly different rounding.
  bool winograd = false;
  std::vector<EltwisePostOp> eltwise;  // applied after the sum, in order
  // With a 1x1, stride 1, unpadded 2D conv only: the depthwise conv that
  // follows (Prepare/Execute then take the depthwise output's shape).
  std::optional<DepthwisePostOp> dw;
};

class ConvOnednn {
 public:
  static absl::StatusOr<std::unique_ptr<ConvOnednn>> Create(const dnnl::engine& engine,
                                                            ConvOnednnOptions options);

  // Creates (once per input shape) the primitive; dst_shape is the ONNX
  // output shape. *_blocked selects nC[D]HW16c instead of plain NC[D]HW.
  absl::Status Prepare(const Shape& src_shape, const Shape& dst_shape, bool src_blocked = false,
                       bool dst_blocked = false);
  absl::Status Execute(dnnl::stream& stream, const Shape& src_shape, const Shape& dst_shape,
                       const float* src, float* dst);

  std::string ImplementationName(const Shape& src_shape) const;
  // The options (weights no longer readable: null after Create).
  const ConvOnednnOptions& options() const { return options_; }

 private:
  struct PerShape {
    BoundPrimitive call;
    std::string impl;
  };
  ConvOnednn(const dnnl::engine& engine, ConvOnednnOptions options)
      : engine_(engine), options_(std::move(options)) {}

  dnnl::memory::desc UserWeightsDesc() const;
  dnnl::primitive_attr Attr() const;
  bool WinogradCandidate() const;
  // The weights in layout `md`, reordered once from the user copy.
  absl::StatusOr<dnnl::memory> WeightsFor(const dnnl::memory::desc& md);

  dnnl::engine engine_;
  ConvOnednnOptions options_;
  std::vector<float> user_weights_;   // kept until every shape is prepared
  std::vector<dnnl::memory> packed_;  // one per distinct preferred layout
  dnnl::memory bias_;
  dnnl::memory dw_bias_;
  std::map<Shape, PerShape> per_shape_;
};

}  // namespace numaserve::kernels
