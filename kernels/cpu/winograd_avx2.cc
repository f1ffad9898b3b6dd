// AVX2 + FMA Winograd F(4x4, 3x3) of kernels/cpu/winograd.h. Compiled with
// -mavx2 -mfma (kernels/CMakeLists.txt); call only on a CPU with both.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/winograd.h"

namespace numaserve::kernels::cpu {
namespace {

constexpr int64_t kBlock = 8;  // channels per vector (nChw8c)

// B^T applied to six vectors (one column or one row of an input tile).
inline void InputTransform6(const __m256 d[6], __m256 out[6]) {
  const __m256 four = _mm256_set1_ps(4.0f), minus_five = _mm256_set1_ps(-5.0f),
               two = _mm256_set1_ps(2.0f);
  out[0] = _mm256_fmadd_ps(four, d[0], _mm256_fmadd_ps(minus_five, d[2], d[4]));
  out[1] = _mm256_fnmadd_ps(four, _mm256_add_ps(d[1], d[2]), _mm256_add_ps(d[3], d[4]));
  out[2] = _mm256_fmadd_ps(four, _mm256_sub_ps(d[1], d[2]), _mm256_sub_ps(d[4], d[3]));
  out[3] = _mm256_fmadd_ps(two, _mm256_sub_ps(d[3], d[1]), _mm256_sub_ps(d[4], d[2]));
  out[4] = _mm256_fmadd_ps(two, _mm256_sub_ps(d[1], d[3]), _mm256_sub_ps(d[4], d[2]));
  out[5] = _mm256_fmadd_ps(four, d[1], _mm256_fmadd_ps(minus_five, d[3], d[5]));
}

// A^T applied to six vectors: four.
inline void OutputTransform6(const __m256 m[6], __m256 out[4]) {
  const __m256 a = _mm256_add_ps(m[1], m[2]), b = _mm256_sub_ps(m[1], m[2]);
  const __m256 c = _mm256_add_ps(m[3], m[4]), d = _mm256_sub_ps(m[3], m[4]);
  out[0] = _mm256_add_ps(_mm256_add_ps(m[0], a), c);
  out[1] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), d, b);
  out[2] = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), c, a);
  out[3] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.0f), d, b), m[5]);
}

#include "kernels/cpu/sgemm_6x16_avx2.inc"

struct Chunk {
  const WinogradF4x3Weights& w;
  const WinogradConvShape& s;
  const WinogradEpilogue& e;
  int64_t tiles_h, tiles_w;
  int64_t capacity;  // tiles a chunk's buffers hold
  float* v;          // [36][capacity][C]
  float* m;          // [36][capacity][Kp]
};

// The chunk's tiles [begin, end) (tile first + t at row t) transformed into
// ch.v.
void TransformInput(const Chunk& ch, const float* src, int64_t first, int64_t begin, int64_t end) {
  const WinogradConvShape& s = ch.s;
  const int64_t cblocks = s.in_channels / kBlock, C = s.in_channels;
  const int64_t per_image = ch.tiles_h * ch.tiles_w;
  const int64_t position_stride = ch.capacity * C;
  alignas(32) __m256 tmp[6][6];
  for (int64_t t = begin; t < end; ++t) {
    const int64_t tile = first + t, n = tile / per_image;
    const int64_t y0 = (tile % per_image) / ch.tiles_w * 4 - s.pad_top;
    const int64_t x0 = (tile % per_image) % ch.tiles_w * 4 - s.pad_left;
    const bool inside = y0 >= 0 && x0 >= 0 && y0 + 6 <= s.in_h && x0 + 6 <= s.in_w;
    for (int64_t cb = 0; cb < cblocks; ++cb) {
      const float* base = src + (n * cblocks + cb) * s.in_h * s.in_w * kBlock;
      for (int j = 0; j < 6; ++j) {  // columns: B^T d
        __m256 d[6];
        const int64_t x = x0 + j;
        for (int i = 0; i < 6; ++i) {
          const int64_t y = y0 + i;
          if (inside || (y >= 0 && y < s.in_h && x >= 0 && x < s.in_w)) {
            d[i] = _mm256_loadu_ps(base + (y * s.in_w + x) * kBlock);
          } else {
            d[i] = _mm256_setzero_ps();
          }
        }
        __m256 col[6];
        InputTransform6(d, col);
        for (int i = 0; i < 6; ++i) tmp[i][j] = col[i];
      }
      float* out = ch.v + t * C + cb * kBlock;
      for (int i = 0; i < 6; ++i) {  // rows: (B^T d) B
        __m256 row[6];
        InputTransform6(tmp[i], row);
        for (int j = 0; j < 6; ++j) _mm256_storeu_ps(out + (i * 6 + j) * position_stride, row[j]);
      }
    }
  }
}

// ch.m = ch.v x U at point p for output channels [16 kb, 16 kb + 16),
// `count` rows.
void MultiplyBlock(const Chunk& ch, int64_t count, int64_t p, int64_t kb) {
  const int64_t C = ch.s.in_channels, Kp = ch.w.padded_out_channels, kblocks = Kp / 16;
  const float* a = ch.v + p * ch.capacity * C;
  float* out = ch.m + p * ch.capacity * Kp + kb * 16;
  const float* b = ch.w.packed.data() + (p * kblocks + kb) * C * 16;
  for (int64_t r = 0; r < count; r += 6) {
    MicroKernelRows(static_cast<int>(std::min<int64_t>(6, count - r)), a + r * C, C, b, C,
                    out + r * Kp, Kp, MicroStore::kOverwrite, 0.0f);
  }
}

// ch.m = ch.v x U for each of the 36 points, `count` rows.
void Multiply(const Chunk& ch, int64_t count) {
  const int64_t kblocks = ch.w.padded_out_channels / 16;
  for (int64_t p = 0; p < 36; ++p) {
    for (int64_t kb = 0; kb < kblocks; ++kb) MultiplyBlock(ch, count, p, kb);
  }
}

// The products of the chunk's tiles [begin, end) transformed back into
// dst, with the epilogue.
void TransformOutput(const Chunk& ch, float* dst, int64_t first, int64_t begin, int64_t end) {
  const WinogradConvShape& s = ch.s;
  const int64_t kblocks = s.out_channels / kBlock, Kp = ch.w.padded_out_channels;
  const int64_t per_image = ch.tiles_h * ch.tiles_w;
  const int64_t position_stride = ch.capacity * Kp;
  const __m256 zero = _mm256_setzero_ps();
  alignas(32) __m256 tmp[4][6];
  for (int64_t t = begin; t < end; ++t) {
    const int64_t tile = first + t, n = tile / per_image;
    const int64_t oy0 = (tile % per_image) / ch.tiles_w * 4;
    const int64_t ox0 = (tile % per_image) % ch.tiles_w * 4;
    const int rows = static_cast<int>(std::min<int64_t>(4, s.out_h - oy0));
    const int cols = static_cast<int>(std::min<int64_t>(4, s.out_w - ox0));
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      const float* in = ch.m + t * Kp + kb * kBlock;
      for (int j = 0; j < 6; ++j) {  // columns: A^T m
        __m256 m[6], col[4];
        for (int i = 0; i < 6; ++i) m[i] = _mm256_loadu_ps(in + (i * 6 + j) * position_stride);
        OutputTransform6(m, col);
        for (int r = 0; r < 4; ++r) tmp[r][j] = col[r];
      }
      const __m256 bias = ch.e.bias != nullptr ? _mm256_loadu_ps(ch.e.bias + kb * kBlock) : zero;
      const WinogradFakeQuantize* fq = ch.e.fake_quantize;
      float* base = dst + (n * kblocks + kb) * s.out_h * s.out_w * kBlock;
      for (int r = 0; r < rows; ++r) {  // rows: (A^T m) A
        __m256 y[4];
        OutputTransform6(tmp[r], y);
        float* out = base + ((oy0 + r) * s.out_w + ox0) * kBlock;
        for (int c = 0; c < cols; ++c) {
          __m256 v = _mm256_add_ps(y[c], bias);
          if (ch.e.sum) v = _mm256_add_ps(v, _mm256_loadu_ps(out + c * kBlock));
          if (ch.e.relu) v = _mm256_max_ps(v, zero);
          if (fq != nullptr) {
            v = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(fq->inverse_scale)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(fq->lo)), _mm256_set1_ps(fq->hi));
            v = _mm256_mul_ps(v, _mm256_set1_ps(fq->scale));
          }
          _mm256_storeu_ps(out + c * kBlock, v);
        }
      }
    }
  }
}

}  // namespace

void winograd_f4x3_conv_avx2(const WinogradF4x3Weights& w, const WinogradConvShape& s,
                             const WinogradF4x3Plan& plan, const WinogradEpilogue& epilogue,
                             const float* src, float* dst, float* scratch) {
  const int64_t tiles = WinogradF4x3Tiles(s);
  if (tiles == 0) return;
  const int64_t C = s.in_channels, Kp = w.padded_out_channels, capacity = plan.chunk_tiles;
  const int64_t tiles_h = (s.out_h + 3) / 4, tiles_w = (s.out_w + 3) / 4;
  const int64_t chunks = (tiles + capacity - 1) / capacity;
  const int threads = static_cast<int>(plan.threads);
  if (plan.per_thread) {
    // Each thread transforms, multiplies and transforms back its own
    // chunks, in its own part of the scratch.
    const int64_t floats = 36 * capacity * (C + Kp);
#pragma omp parallel num_threads(threads)
    {
      float* buffer = scratch + floats * omp_get_thread_num();
      const Chunk ch{w,       s,        epilogue, tiles_h,
                     tiles_w, capacity, buffer,   buffer + 36 * capacity * C};
#pragma omp for schedule(dynamic, 1)
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t first = chunk * capacity;
        const int64_t count = std::min(capacity, tiles - first);
        TransformInput(ch, src, first, 0, count);
        Multiply(ch, count);
        TransformOutput(ch, dst, first, 0, count);
      }
    }
    return;
  }
  // Few tiles (a small image, or many threads): the team shares each chunk,
  // the GEMMs split by point and block of 16 output channels, so that each
  // transformed weight is read by one thread only (with a thread per chunk
  // every thread would read all of them: 4 x the direct weights, which at
  // 512 channels is what bounds the conv).
  const Chunk ch{w, s, epilogue, tiles_h, tiles_w, capacity, scratch, scratch + 36 * capacity * C};
  const int64_t kblocks = Kp / 16, blocks = 36 * kblocks;
#pragma omp parallel num_threads(threads)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t first = chunk * capacity;
    const int64_t count = std::min(capacity, tiles - first);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < count; ++t) TransformInput(ch, src, first, t, t + 1);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) MultiplyBlock(ch, count, b / kblocks, b % kblocks);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < count; ++t) TransformOutput(ch, dst, first, t, t + 1);
  }
}

}  // namespace numaserve::kernels::cpu
