// AVX2 + FMA versions of kernels/cpu/row_kernels.h. Compiled with
// -mavx2 -mfma (kernels/CMakeLists.txt); call only on a CPU with both.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels::cpu {
namespace {

struct Avx2 {
  using Reg = __m256;
  static constexpr int64_t kWidth = 8;
  // Rows of the attention tiles: scores (x 2 vectors), output (x 4 vectors).
  static constexpr int kScoreRows = 6;
  static constexpr int kOutRows = 3;
  static Reg Set(float v) { return _mm256_set1_ps(v); }
  static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg Sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg Mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg Max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg Min(Reg a, Reg b) { return _mm256_min_ps(a, b); }
  static Reg Div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg Abs(Reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  // Lanes where x >= 0 (ordered: NaN is not) from a, the others from b.
  static Reg SelectNonNegative(Reg x, Reg a, Reg b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
  }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg Round(Reg a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Reg Pow2(Reg n) {
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(e);
  }
  static float ReduceAdd(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float ReduceMax(Reg v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float ReduceMin(Reg v) {
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    s = _mm_min_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

#include "kernels/cpu/row_kernels_simd.inc"
// After row_kernels_simd.inc: uses its ExpNonPositive.
#include "kernels/cpu/attention_simd.inc"

}  // namespace

void softmax_rows_avx2(const float* x, float* y, int64_t rows, int64_t len) {
  SoftmaxRows<Avx2>(x, y, rows, len);
}
void layer_norm_rows_avx2(const float* x, const float* scale, const float* bias, float eps,
                          float* y, int64_t rows, int64_t len) {
  LayerNormRows<Avx2>(x, scale, bias, eps, y, rows, len);
}
void add_row_broadcast_avx2(const float* x, const float* v, float* y, int64_t rows, int64_t len) {
  RowBroadcast<Avx2, false>(x, v, y, rows, len);
}
void mul_row_broadcast_avx2(const float* x, const float* v, float* y, int64_t rows, int64_t len) {
  RowBroadcast<Avx2, true>(x, v, y, rows, len);
}

void bias_activation_rows_avx2(float* y, const float* bias, int64_t rows, int64_t len,
                               RowActivation act) {
  BiasActivationRows<Avx2>(y, bias, rows, len, act);
}

void reduce_rows_avx2(const float* x, float* out, int64_t rows, int64_t len, ReduceOp op) {
  ReduceRows<Avx2>(x, out, rows, len, op);
}
void transpose_2d_avx2(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  Transpose2dTiled8(x, y, batch, rows, cols);
}

void attention_head_avx2(const AttentionHead& h, float* scratch) {
  AttentionHeadSimd<Avx2>(h, scratch);
}

}  // namespace numaserve::kernels::cpu
