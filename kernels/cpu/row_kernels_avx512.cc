// AVX-512F versions of kernels/cpu/row_kernels.h. Compiled with
// -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma (kernels/CMakeLists.txt);
// call only on a CPU (and OS) with AVX-512F.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels::cpu {
namespace {

struct Avx512 {
  using Reg = __m512;
  static constexpr int64_t kWidth = 16;
  // Rows of the attention tiles: scores (x 2 vectors), output (x 4 vectors).
  static constexpr int kScoreRows = 12;
  static constexpr int kOutRows = 6;
  static Reg Set(float v) { return _mm512_set1_ps(v); }
  static Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg Sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg Mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg Max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg Min(Reg a, Reg b) { return _mm512_min_ps(a, b); }
  static Reg Div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg Abs(Reg a) { return _mm512_abs_ps(a); }
  // Lanes where x >= 0 (ordered: NaN is not) from a, the others from b.
  static Reg SelectNonNegative(Reg x, Reg a, Reg b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), b, a);
  }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg Round(Reg a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Reg Pow2(Reg n) { return _mm512_scalef_ps(_mm512_set1_ps(1.0f), n); }
  static float ReduceAdd(Reg v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(Reg v) { return _mm512_reduce_max_ps(v); }
  static float ReduceMin(Reg v) { return _mm512_reduce_min_ps(v); }
};

#include "kernels/cpu/row_kernels_simd.inc"
// After row_kernels_simd.inc: uses its ExpNonPositive.
#include "kernels/cpu/attention_simd.inc"

}  // namespace

void softmax_rows_avx512(const float* x, float* y, int64_t rows, int64_t len) {
  SoftmaxRows<Avx512>(x, y, rows, len);
}
void layer_norm_rows_avx512(const float* x, const float* scale, const float* bias, float eps,
                            float* y, int64_t rows, int64_t len) {
  LayerNormRows<Avx512>(x, scale, bias, eps, y, rows, len);
}
void add_row_broadcast_avx512(const float* x, const float* v, float* y, int64_t rows, int64_t len) {
  RowBroadcast<Avx512, false>(x, v, y, rows, len);
}
void mul_row_broadcast_avx512(const float* x, const float* v, float* y, int64_t rows, int64_t len) {
  RowBroadcast<Avx512, true>(x, v, y, rows, len);
}

void bias_activation_rows_avx512(float* y, const float* bias, int64_t rows, int64_t len,
                                 RowActivation act) {
  BiasActivationRows<Avx512>(y, bias, rows, len, act);
}

void reduce_rows_avx512(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op) {
  ReduceRows<Avx512>(x, out, rows, len, op);
}
void transpose_2d_avx512(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  Transpose2dTiled8(x, y, batch, rows, cols);
}

void attention_head_avx512(const AttentionHead& h, float* scratch) {
  AttentionHeadSimd<Avx512>(h, scratch);
}

}  // namespace numaserve::kernels::cpu
