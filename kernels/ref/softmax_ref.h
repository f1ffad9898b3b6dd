// Scalar reference for ONNX Softmax.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

// Opset >= 13: softmax along the single dimension `axis`.
// Opset < 13 (flatten_to_2d): the input is viewed as
// [prod(dims[:axis]), prod(dims[axis:])] and softmax runs over each row.
absl::StatusOr<Tensor> SoftmaxRef(const Tensor& x, int64_t axis, bool flatten_to_2d);
// log(softmax(x)) along `axis` (flatten_to_2d as in SoftmaxRef).
absl::StatusOr<Tensor> LogSoftmaxRef(const Tensor& x, int64_t axis, bool flatten_to_2d);

}  // namespace numaserve::kernels
