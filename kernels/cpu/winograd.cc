#include "kernels/cpu/winograd.h"

#include <omp.h>

#include <algorithm>

namespace numaserve::kernels::cpu {

int64_t WinogradF4x3Tiles(const WinogradConvShape& s) {
  return s.batch * ((s.out_h + 3) / 4) * ((s.out_w + 3) / 4);
}

WinogradF4x3Plan PlanWinogradF4x3(const WinogradF4x3Weights& w, const WinogradConvShape& s) {
  WinogradF4x3Plan plan;
  const int64_t tiles = WinogradF4x3Tiles(s);
  const int64_t floats_per_tile = 36 * (s.in_channels + w.padded_out_channels);
  plan.threads = std::max(1, omp_in_parallel() ? 1 : omp_get_max_threads());
  // A chunk's buffers take 36 x (C + Kp) floats per tile: about 512 KiB of
  // them (a Zen 1 core's L2; 5-25% faster than 1-2 MiB on ResNet-50's
  // layers there), in whole 6-row blocks of the micro-kernel, but no fewer
  // than 30 tiles, so that each transformed weight read from memory serves
  // 30 rows of its GEMM (12 measured 10-25% slower from 256 channels on).
  const int64_t chunk_tiles = std::clamp<int64_t>(
      (int64_t{1} << 19) / (floats_per_tile * static_cast<int64_t>(sizeof(float))) / 6 * 6, 30,
      120);
  plan.per_thread = tiles >= plan.threads * 16;
  if (plan.per_thread) {
    plan.chunk_tiles = std::min(chunk_tiles, (tiles + plan.threads - 1) / plan.threads);
    plan.scratch_floats = floats_per_tile * plan.chunk_tiles * plan.threads;
  } else {
    plan.chunk_tiles = std::min<int64_t>(tiles, 120);
    plan.scratch_floats = floats_per_tile * plan.chunk_tiles;
  }
  return plan;
}

WinogradF4x3Weights TransformWinogradF4x3Weights(const float* weights, int64_t out_channels,
                                                 int64_t in_channels) {
  // G for the points 0, 1, -1, 2, -2 and infinity.
  static constexpr double kG[6][3] = {
      {1.0 / 4, 0, 0},
      {-1.0 / 6, -1.0 / 6, -1.0 / 6},
      {-1.0 / 6, 1.0 / 6, -1.0 / 6},
      {1.0 / 24, 1.0 / 12, 1.0 / 6},
      {1.0 / 24, -1.0 / 12, 1.0 / 6},
      {0, 0, 1},
  };
  WinogradF4x3Weights w;
  w.in_channels = in_channels;
  w.out_channels = out_channels;
  w.padded_out_channels = (out_channels + 15) / 16 * 16;
  const int64_t blocks = w.padded_out_channels / 16;
  w.packed.assign(36 * w.padded_out_channels * in_channels, 0.0f);
  for (int64_t k = 0; k < out_channels; ++k) {
    for (int64_t c = 0; c < in_channels; ++c) {
      const float* g = weights + (k * in_channels + c) * 9;
      double gg[6][3];  // G g
      for (int i = 0; i < 6; ++i) {
        for (int j = 0; j < 3; ++j) {
          gg[i][j] = kG[i][0] * g[j] + kG[i][1] * g[3 + j] + kG[i][2] * g[6 + j];
        }
      }
      for (int i = 0; i < 6; ++i) {
        for (int j = 0; j < 6; ++j) {
          const double u = gg[i][0] * kG[j][0] + gg[i][1] * kG[j][1] + gg[i][2] * kG[j][2];
          const int64_t p = i * 6 + j;
          w.packed[((p * blocks + k / 16) * in_channels + c) * 16 + k % 16] = static_cast<float>(u);
        }
      }
    }
  }
  return w;
}

}  // namespace numaserve::kernels::cpu
