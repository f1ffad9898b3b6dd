// What a GEMM with constant weights computes, for every backend:
//   Y[M,N] = op(A)[M,K] x (weights_scale * W)[K,N] (+ bias[N])
//            (+ sum_scale * Y on entry) (relu) (erf-GELU)
// in that order (oneDNN's post-op order), with M (the batch) given per call.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/onednn/int8_params.h"

namespace numaserve::kernels {

struct GemmOptions {
  int64_t k = 0;
  int64_t n = 0;
  // Row-major [K, N], or [N, K] when weights_transposed (Gemm transB).
  // Read only while the kernel is created. Unused (may be null) with int8.
  const float* weights = nullptr;
  bool weights_transposed = false;
  // Multiplies the weights once at creation (Gemm's alpha).
  float weights_scale = 1.0f;
  // Empty, or N values added to every row.
  std::vector<float> bias;
  // A arrives as [K, M] row-major (Gemm transA) and is read through strides.
  bool src_transposed = false;
  // When set, Y on entry holds a tensor to add, scaled by sum_scale
  // (Gemm's beta * C where C is not a row vector, or a residual Add).
  bool accumulate = false;
  float sum_scale = 1.0f;
  bool relu = false;
  // GELU in its erf form (x * 0.5 * (1 + erf(x / sqrt(2)))), after any relu.
  bool gelu_erf = false;
  // BF16 compute with FP32 accumulation (a model's precision "bf16"): the
  // weights are converted to BF16 once, at creation, and A to BF16 at each
  // call; Y, the bias and the post-ops stay FP32. oneDNN only (the BLAS
  // backends refuse it), where kernels::GetBf16Support() says it is native.
  bool bf16 = false;
  // INT8 compute (kernels/onednn/int8_params.h): A quantized to u8 at each
  // call, int8->weights (s8, laid out as `weights`, weight_scales per column
  // n or one) packed once, int32 accumulation, then scaled by src_scale *
  // weight_scale[n] * weights_scale; Y, the bias and the post-ops FP32.
  // oneDNN only (the BLAS backends refuse it); not with bf16. The kernel
  // drops int8->weights once packed (empty in its options()).
  std::optional<Int8Params> int8 = std::nullopt;
};

}  // namespace numaserve::kernels
