// numaserve's own row kernels, one implementation per ISA tier: softmax and
// layer normalisation over contiguous rows, and element-wise add/mul of a
// tensor with a row vector broadcast over its leading dims (bias chains).
// The *_scalar versions are the references; *_avx2 (AVX2+FMA) and
// *_avx512 (AVX-512F) live in files compiled with those flags only, and
// may be called only when the CPU has the ISA (kernels/dispatch.h decides).
// Names say what, then how: softmax_rows_avx512 (one underscore: C++
// reserves names that contain two).
#pragma once

#include <cstdint>

namespace numaserve::kernels::cpu {

// y[r, :] = softmax(x[r, :]) for `rows` rows of `len` floats.
void softmax_rows_scalar(const float* x, float* y, int64_t rows, int64_t len);
void softmax_rows_avx2(const float* x, float* y, int64_t rows, int64_t len);
void softmax_rows_avx512(const float* x, float* y, int64_t rows, int64_t len);

// y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * scale + bias.
void layer_norm_rows_scalar(const float* x, const float* scale, const float* bias, float eps,
                            float* y, int64_t rows, int64_t len);
void layer_norm_rows_avx2(const float* x, const float* scale, const float* bias, float eps,
                          float* y, int64_t rows, int64_t len);
void layer_norm_rows_avx512(const float* x, const float* scale, const float* bias, float eps,
                            float* y, int64_t rows, int64_t len);

// y[r, :] = x[r, :] (op) v[:] (op = add or mul), `len` floats per row.
void add_row_broadcast_scalar(const float* x, const float* v, float* y, int64_t rows, int64_t len);
void add_row_broadcast_avx2(const float* x, const float* v, float* y, int64_t rows, int64_t len);
void add_row_broadcast_avx512(const float* x, const float* v, float* y, int64_t rows, int64_t len);
void mul_row_broadcast_scalar(const float* x, const float* v, float* y, int64_t rows, int64_t len);
void mul_row_broadcast_avx2(const float* x, const float* v, float* y, int64_t rows, int64_t len);
void mul_row_broadcast_avx512(const float* x, const float* v, float* y, int64_t rows, int64_t len);

// The epilogue of a GEMM, in place: y[r, :] = act(y[r, :] + bias[:]), `len`
// floats per row; `bias` may be null (none). kGeluErf is GELU in its erf
// form, 0.5 x (1 + erf(x / sqrt(2))); the vector versions compute erfc with
// Abramowitz and Stegun's 7.1.26 (absolute error below 1.5e-7) and match
// the scalar one (std::erf) to within 2e-7 x max(1, |x|). NaN stays NaN.
enum class RowActivation { kNone, kRelu, kGeluErf };
void bias_activation_rows_scalar(float* y, const float* bias, int64_t rows, int64_t len,
                                 RowActivation act);
void bias_activation_rows_avx2(float* y, const float* bias, int64_t rows, int64_t len,
                               RowActivation act);
void bias_activation_rows_avx512(float* y, const float* bias, int64_t rows, int64_t len,
                                 RowActivation act);

// out[r] = sum / max / min of x[r, :] for `rows` rows of `len` >= 1 floats
// (mean = sum / len is left to the caller). Max and min are exact; sums
// are accumulated in a different order per ISA (vector lanes, then lanes
// added together), so they match the scalar one to rounding only.
enum class ReduceOp { kSum, kMax, kMin };
void reduce_rows_scalar(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op);
void reduce_rows_avx2(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op);
void reduce_rows_avx512(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op);

// y[b, c, r] = x[b, r, c]: `batch` row-major [rows, cols] matrices back to
// back, each transposed into [cols, rows]. x and y must not overlap.
void transpose_2d_scalar(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols);
void transpose_2d_avx2(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols);
void transpose_2d_avx512(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols);

}  // namespace numaserve::kernels::cpu
