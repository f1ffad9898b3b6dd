// AVX2 + FMA sgemm_packed of kernels/cpu/sgemm.h. Compiled with -mavx2
// -mfma (kernels/CMakeLists.txt); call only on a CPU with both.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/sgemm.h"

namespace numaserve::kernels::cpu {
namespace {

#include "kernels/cpu/sgemm_6x16_avx2.inc"

constexpr int64_t kKc = 256;       // K per block
constexpr int64_t kMaxRows = 240;  // rows of A per block (20 micro-kernel rows)
constexpr int64_t kGroup = 4;      // panels of 16 columns per work item

// Rows [r0, r0 + rows) of C, columns of panel p, K block [k0, k0 + kc).
void Block(int64_t rows, int64_t n, const float* a, int64_t lda, const float* panel, int64_t p,
           int64_t k0, int64_t kc, float beta, float* c, int64_t ldc) {
  const MicroStore mode = k0 > 0      ? MicroStore::kAdd
                          : beta == 0 ? MicroStore::kOverwrite
                          : beta == 1 ? MicroStore::kAdd
                                      : MicroStore::kAddScaled;
  const int64_t col = p * 16, width = std::min<int64_t>(16, n - col);
  const float* b = panel + k0 * 16;
  for (int64_t r = 0; r < rows; r += 6) {
    const int count = static_cast<int>(std::min<int64_t>(6, rows - r));
    const float* ar = a + r * lda + k0;
    float* cr = c + r * ldc + col;
    if (width == 16) {
      MicroKernelRows(count, ar, lda, b, kc, cr, ldc, mode, beta);
      continue;
    }
    // The last, partial panel: through a 6 x 16 tile.
    alignas(32) float tile[6 * 16] = {};
    if (mode != MicroStore::kOverwrite) {
      for (int i = 0; i < count; ++i) std::memcpy(tile + i * 16, cr + i * ldc, width * 4);
    }
    MicroKernelRows(count, ar, lda, b, kc, tile, 16, mode, beta);
    for (int i = 0; i < count; ++i) std::memcpy(cr + i * ldc, tile + i * 16, width * 4);
  }
}

// Stores a row of 16 columns (l: 0-7, h: 8-15) into `out` by `mode` (as
// is, added, or added to beta x out), only its first `width` columns.
inline void StoreRow(__m256 l, __m256 h, float* out, int64_t width, MicroStore mode, float beta) {
  alignas(32) float tile[16] = {};
  float* dst = width == 16 ? out : tile;
  if (mode != MicroStore::kOverwrite) {
    if (width < 16) std::memcpy(tile, out, width * 4);
    const __m256 c0 = _mm256_loadu_ps(dst), c1 = _mm256_loadu_ps(dst + 8);
    if (mode == MicroStore::kAdd) {
      l = _mm256_add_ps(l, c0);
      h = _mm256_add_ps(h, c1);
    } else {
      l = _mm256_fmadd_ps(_mm256_set1_ps(beta), c0, l);
      h = _mm256_fmadd_ps(_mm256_set1_ps(beta), c1, h);
    }
  }
  _mm256_storeu_ps(dst, l);
  _mm256_storeu_ps(dst + 8, h);
  if (width < 16) std::memcpy(out, tile, width * 4);
}

// c[0..width) = a[0..K) x one packed panel [K][16], stored by `mode`, over
// the whole K with 8 accumulators: the products of k in 4 interleaved sums,
// added at the end. The 6 x 16 micro-kernel keeps 2 FMA chains per row, too
// few to hide the FMA latency when there is one row (BM_Gemm/numaserve
// with M = 1: 1.5x with 8 chains; with two rows 4 chains already were as
// fast as 8). Named accumulators, as in MicroKernel6x16.
void OneRowPanel(const float* a, const float* panel, int64_t k, float* c, int64_t width,
                 MicroStore mode, float beta) {
  __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    const float* b = panel + i * 16;
    __m256 x = _mm256_broadcast_ss(a + i);
    l0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b), l0);
    h0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 8), h0);
    x = _mm256_broadcast_ss(a + i + 1);
    l1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 16), l1);
    h1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 24), h1);
    x = _mm256_broadcast_ss(a + i + 2);
    l2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 32), l2);
    h2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 40), h2);
    x = _mm256_broadcast_ss(a + i + 3);
    l3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 48), l3);
    h3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(b + 56), h3);
  }
  for (; i < k; ++i) {
    const __m256 x = _mm256_broadcast_ss(a + i);
    l0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(panel + i * 16), l0);
    h0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(panel + i * 16 + 8), h0);
  }
  StoreRow(_mm256_add_ps(_mm256_add_ps(l0, l1), _mm256_add_ps(l2, l3)),
           _mm256_add_ps(_mm256_add_ps(h0, h1), _mm256_add_ps(h2, h3)), c, width, mode, beta);
}

// c = a x B + beta c for one row of A: each panel over the whole K at once
// (the row stays in L1; B streams through once), the panels split over the
// threads in contiguous ranges.
void OneRow(int64_t n, int64_t k, const float* a, const float* packed_b, float beta, float* c) {
  const MicroStore mode = beta == 0   ? MicroStore::kOverwrite
                          : beta == 1 ? MicroStore::kAdd
                                      : MicroStore::kAddScaled;
  const int64_t panels = (n + 15) / 16;
  const int threads =
      omp_in_parallel() ? 1 : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), panels));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t p = 0; p < panels; ++p) {
    OneRowPanel(a, packed_b + p * k * 16, k, c + p * 16, std::min<int64_t>(16, n - p * 16), mode,
                beta);
  }
}

}  // namespace

void sgemm_packed_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                       const float* packed_b, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta C
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
  if (m == 1) return OneRow(n, k, a, packed_b, beta, c);
  const int64_t panels = (n + 15) / 16, groups = (panels + kGroup - 1) / kGroup;
  // Row blocks of equal size (a multiple of 6) up to kMaxRows.
  const int64_t row_blocks = (m + kMaxRows - 1) / kMaxRows;
  const int64_t block_rows = ((m + row_blocks - 1) / row_blocks + 5) / 6 * 6;
  const int64_t items = row_blocks * groups;
  const int threads =
      omp_in_parallel() ? 1 : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), items));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t r0 = item / groups * block_rows, g = item % groups;
    const int64_t rows = std::min(block_rows, m - r0);
    if (rows <= 0) continue;
    for (int64_t k0 = 0; k0 < k; k0 += kKc) {
      const int64_t kc = std::min(kKc, k - k0);
      for (int64_t p = g * kGroup; p < std::min(panels, (g + 1) * kGroup); ++p) {
        Block(rows, n, a + r0 * lda, lda, packed_b + p * k * 16, p, k0, kc, beta, c + r0 * ldc,
              ldc);
      }
    }
  }
}

void sgemm_micro_kernel_6x16_avx2(const float* a, int64_t lda, const float* b, int64_t kc, float* c,
                                  int64_t ldc) {
  MicroKernel6x16<6>(a, lda, b, kc, c, ldc, MicroStore::kOverwrite, 0.0f);
}

}  // namespace numaserve::kernels::cpu
