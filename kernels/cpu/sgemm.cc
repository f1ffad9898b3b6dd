#include "kernels/cpu/sgemm.h"

#include <algorithm>

namespace numaserve::kernels::cpu {

int64_t SgemmPackedFloats(int64_t k, int64_t n) { return (n + 15) / 16 * k * 16; }

void PackSgemmWeights(const float* w, int64_t k, int64_t n, bool transposed, float scale,
                      float* out) {
  const int64_t panels = (n + 15) / 16;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = out + p * k * 16;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t col = p * 16 + j;
        float v = 0.0f;
        if (col < n) v = scale * (transposed ? w[col * k + i] : w[i * n + col]);
        panel[i * 16 + j] = v;
      }
    }
  }
}

}  // namespace numaserve::kernels::cpu
