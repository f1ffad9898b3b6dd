// Conv, MaxPool, AveragePool, BatchNormalization and LayerNormalization
// training (forward_training, backward data, backward weights and bias or
// scale and shift) on oneDNN primitives. Tensors cross this interface in
// plain NCHW (weights as ONNX stores them); inside, each primitive takes
// the layout oneDNN prefers and reorders happen only where layouts differ.
// Primitives, reorders and their scratch buffers are made once (per op
// instance and geometry for Conv and the normalizations, per geometry for
// pooling) and kept per thread. Backward ADDS into the gradients it is
// given, like every training op (training/training_ops.h).
//
// training/conv_pool_ops.cc, batch_norm_op.cc and layer_norm_op.cc call
// these, and keep their own loops as the reference these are tested against
// and as the fallback when oneDNN has no implementation.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace numaserve::kernels::training_onednn {

// A 2-D window over NCHW: input, kernel, strides, pads (top, left,
// bottom, right), dilations (1 = dense) and output extents.
struct Window2d {
  int64_t n, c, h, w;
  int64_t kh, kw;
  int64_t sh, sw;
  int64_t pt, pl, pb, pr;
  int64_t dh, dw;
  int64_t oh, ow;
};

struct ConvShape {
  Window2d win;
  int64_t m;       // output channels
  int64_t groups;  // weights are [m, c / groups, kh, kw]
  bool bias;       // a bias input [m] exists
  // Mixed precision: the primitives read x, w and dy converted to BF16 and
  // accumulate in FP32; y, dx, dw and db stay FP32 (so do the caller's
  // tensors). A primitive that oneDNN would only run on its reference BF16
  // kernel is made in FP32 instead (Bf16ConvPrimitives counts both).
  bool bf16 = false;
};

// y[n, m, oh, ow] = conv(x, w) + b (b may be null when !shape.bias).
// `node` is any address that identifies the op instance: its primitives and
// what a `training` forward keeps for backward (x in oneDNN's layout) are
// its own. A following ConvBackward of the same node and x reuses that.
absl::Status ConvForward(const void* node, const ConvShape& shape, const float* x, const float* w,
                         const float* b, float* y, bool training);

// dx += d/dx, dw += d/dw, db += d/db for output gradient dy; a null
// gradient is not computed.
absl::Status ConvBackward(const void* node, const ConvShape& shape, const float* x, const float* w,
                          const float* dy, float* dx, float* dw, float* db);

// Conv primitives made for ConvShape::bf16 so far, process-wide: in BF16,
// and in FP32 because oneDNN had only a reference BF16 kernel for them.
struct Bf16ConvPrimitives {
  int64_t bf16 = 0;
  int64_t fp32_instead = 0;
};
Bf16ConvPrimitives Bf16ConvPrimitiveCounts();

enum class PoolKind { kMax, kAverageIncludePad, kAverageExcludePad };

// y = pool(x). `training`: max pooling also keeps the arg-max workspace for
// `node` (any address that identifies the op instance), which a following
// PoolBackward of the same node, x and y reuses instead of recomputing it.
absl::Status PoolForward(const void* node, PoolKind kind, const Window2d& win, const float* x,
                         float* y, bool training);

// dx += d/dx for output gradient dy; x and y are the forward's input and output.
absl::Status PoolBackward(const void* node, PoolKind kind, const Window2d& win, const float* x,
                          const float* y, const float* dy, float* dx);

// BatchNormalization over x viewed as [n, c, spatial] (plain, channels
// second).
struct BatchNormShape {
  int64_t n, c, spatial;
  float epsilon;
};

// y = scale * (x - mean) / sqrt(variance + epsilon) + shift per channel.
// `training`: mean and variance are the batch's (biased variance), written
// to `mean` and `variance`, and kept for `node` (any address that
// identifies the op instance) so that a following BatchNormBackward of the
// same node and x reuses them. Otherwise `mean` and `variance` are read
// (the running statistics).
absl::Status BatchNormForward(const void* node, const BatchNormShape& shape, const float* x,
                              const float* scale, const float* shift, float* mean, float* variance,
                              float* y, bool training);

// dx += d/dx, dscale += d/dscale, dshift += d/dshift for output gradient dy,
// through the batch statistics of x (training mode); a null gradient is not
// computed.
absl::Status BatchNormBackward(const void* node, const BatchNormShape& shape, const float* x,
                               const float* scale, const float* shift, const float* dy, float* dx,
                               float* dscale, float* dshift);

// LayerNormalization over x viewed as [rows, inner]: each row normalized
// with its own mean and (biased) variance, then scaled and (with `shift`)
// shifted per inner element.
struct LayerNormShape {
  int64_t rows, inner;
  float epsilon;
  bool shift;  // a shift (bias) input exists
};

// y = scale * (x - mean) / sqrt(variance + epsilon) + shift. `training`
// keeps the row statistics for `node` (any address that identifies the op
// instance) for a following LayerNormBackward of the same node and x.
absl::Status LayerNormForward(const void* node, const LayerNormShape& shape, const float* x,
                              const float* scale, const float* shift, float* y, bool training);

// dx += d/dx, dscale += d/dscale, dshift += d/dshift for output gradient
// dy; a null gradient is not computed.
absl::Status LayerNormBackward(const void* node, const LayerNormShape& shape, const float* x,
                               const float* scale, const float* shift, const float* dy, float* dx,
                               float* dscale, float* dshift);

// True when `s` says oneDNN could not make a primitive for the shape
// (Unimplemented or InvalidArgument): the caller then runs its reference
// and `fallbacks` counts it. Any other error is the caller's to return,
// never followed by the reference (backward would add its gradients twice).
bool ShapeRejected(const absl::Status& s, std::atomic<int64_t>& fallbacks);

}  // namespace numaserve::kernels::training_onednn
