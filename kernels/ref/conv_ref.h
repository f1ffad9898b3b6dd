// Scalar references for windowed ONNX ops over [N, C, spatial...] tensors
// with 1 to 3 spatial dims: Conv, ConvTranspose, MaxPool, AveragePool.
// Padding is explicit here (auto_pad is resolved by the caller).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

struct WindowParams {
  std::vector<int64_t> kernel;      // spatial kernel extent per dim
  std::vector<int64_t> strides;     // per spatial dim
  std::vector<int64_t> dilations;   // per spatial dim
  std::vector<int64_t> pads_begin;  // per spatial dim
  std::vector<int64_t> pads_end;    // per spatial dim
};

// Conv: x [N, C, s...], w [M, C/group, k...], bias [M] or null; out_shape is
// [N, M, o...].
absl::StatusOr<Tensor> ConvRef(const Tensor& x, const Tensor& w, const Tensor* bias,
                               const WindowParams& p, int64_t group, const Shape& out_shape);

// ConvTranspose: x [N, C, s...], w [C, M/group, k...]; out_shape [N, M, o...]
// (pads_begin gives the crop at the start of each output dim).
absl::StatusOr<Tensor> ConvTransposeRef(const Tensor& x, const Tensor& w, const Tensor* bias,
                                        const WindowParams& p, int64_t group,
                                        const Shape& out_shape);

enum class PoolKind { kMax, kAverage };

// Max/average pooling; count_include_pad counts padded cells (average only).
absl::StatusOr<Tensor> PoolRef(PoolKind kind, const Tensor& x, const WindowParams& p,
                               bool count_include_pad, const Shape& out_shape);

}  // namespace numaserve::kernels
