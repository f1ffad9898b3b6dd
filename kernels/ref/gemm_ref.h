// Scalar references for ONNX Gemm and MatMul: the oracle for fast paths.
#pragma once

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

struct GemmAttrs {
  float alpha = 1.0f;
  float beta = 1.0f;
  bool trans_a = false;
  bool trans_b = false;
};

// Y = alpha * op(A) * op(B) + beta * C, A and B 2-D; C (may be null) must
// broadcast to [M, N] (scalar, [N], [1,N], [M,1], [M,N]).
absl::StatusOr<Tensor> GemmRef(const Tensor& a, const Tensor& b, const Tensor* c,
                               const GemmAttrs& attrs);

// ONNX MatMul for A of rank >= 2 (leading dims are batch) and a 2-D B.
absl::StatusOr<Tensor> MatMulRef(const Tensor& a, const Tensor& b);

}  // namespace numaserve::kernels
