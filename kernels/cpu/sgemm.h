// numaserve's own single-precision GEMM for the AVX2 tier, on weights packed
// once: C[M,N] = A[M,K] x B[K,N] (+ beta C). The GEMM backend "numaserve"
// (kernels/gemm/gemm_backend.h) runs it; the BLAS epilogue (bias,
// activations) is applied by the backend after it.
//
// BLIS's loop structure without packing A (its rows are read in place, six
// at a time): B in panels of 16 columns [K][16]; for each block of up to
// 240 rows of A and each group of 4 panels (64 columns of C), blocks of 256
// of K: the A block (240 x 256 floats) stays in L2 across the group's
// panels, each panel block (256 x 16) in L1 across the A block's rows; the
// 6 x 16 FMA micro-kernel (kernels/cpu/sgemm_6x16_avx2.inc) is bound by
// the FMA units. Work items (row block, panel group) are split over the
// caller's OpenMP threads. One row of A (a matrix-vector product, batch 1
// of a dense layer) runs each panel over the whole K with 8 FMA chains
// instead, bound by reading the weights.
#pragma once

#include <cstdint>
#include <vector>

namespace numaserve::kernels::cpu {

// Floats of B packed for K x N: ceil(N / 16) panels of K x 16.
int64_t SgemmPackedFloats(int64_t k, int64_t n);

// scale * W packed into `out` (SgemmPackedFloats(k, n) floats, columns past
// N zero): W is [K, N] row-major, or [N, K] when `transposed`.
void PackSgemmWeights(const float* w, int64_t k, int64_t n, bool transposed, float scale,
                      float* out);

// C (row stride ldc) = A (row stride lda) x B + beta C, C not read when
// beta is 0. Call only on a CPU with AVX2 and FMA.
void sgemm_packed_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       const float* packed_b, float beta, float* c, int64_t ldc);

// The 6 x 16 micro-kernel alone: C[6][16] (row stride ldc) = A[6][kc] (row
// stride lda) x B[kc][16] (one packed panel). For kernels_bench, which
// times it on data in L1: the ceiling of sgemm_packed_avx2 and of the
// Winograd conv's products. Call only on a CPU with AVX2 and FMA.
void sgemm_micro_kernel_6x16_avx2(const float* a, int64_t lda, const float* b, int64_t kc, float* c,
                                  int64_t ldc);

}  // namespace numaserve::kernels::cpu
