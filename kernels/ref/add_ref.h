// Scalar references for elementwise ops: broadcasting Add and Relu.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

// out = a + b with numpy broadcasting; out_shape must be the broadcast of
// a_shape and b_shape. Pointer form so fast paths can use it as a fallback.
void AddBroadcast(const float* a, const Shape& a_shape, const float* b, const Shape& b_shape,
                  float* out, const Shape& out_shape);

// Copies `src` (shape `src_shape`, broadcastable to `dst_shape`) into dst.
void BroadcastTo(const float* src, const Shape& src_shape, float* dst, const Shape& dst_shape);

absl::StatusOr<Tensor> AddRef(const Tensor& a, const Tensor& b);

Tensor ReluRef(const Tensor& x);

}  // namespace numaserve::kernels
