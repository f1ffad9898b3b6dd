#include "kernels/cpu/winograd.h"

namespace numaserve::kernels::cpu {

int64_t WinogradF4x3Tiles(const WinogradConvShape& s) {
  return s.batch * ((s.out_h + 3) / 4) * ((s.out_w + 3) / 4);
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
