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

}  // namespace

void sgemm_packed__avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                        const float* packed_b, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta C
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
    }
    return;
  }
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

void sgemm_micro_kernel_6x16__avx2(const float* a, int64_t lda, const float* b, int64_t kc,
                                   float* c, int64_t ldc) {
  MicroKernel6x16<6>(a, lda, b, kc, c, ldc, MicroStore::kOverwrite, 0.0f);
}

}  // namespace numaserve::kernels::cpu
