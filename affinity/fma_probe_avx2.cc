// Built with -mavx2 -mfma (affinity/CMakeLists.txt); nothing else may be.
#include <immintrin.h>

#include "affinity/fma_probe.h"
#include "affinity/fma_probe_loops.h"

namespace numaserve::affinity::internal {
namespace {

struct Ymm {
  static constexpr int kAccumulators = 12;
  static constexpr int kLanes = 8;
  static __m256 Broadcast(float value) { return _mm256_set1_ps(value); }
  static __m256 Fma(__m256 x, __m256 a, __m256 b) { return _mm256_fmadd_ps(x, a, b); }
  static __m256 Add(__m256 x, __m256 y) { return _mm256_add_ps(x, y); }
  static float First(__m256 x) { return _mm256_cvtss_f32(x); }
};

}  // namespace

double F32FmaGflopsAvx2Fma(int64_t iterations) {
  return FmaThroughputGflops<__m256, Ymm>(iterations);
}

double ClockGhzUnderFmaAvx2Fma(int64_t iterations) {
  return ClockGhzUnderFma<__m256, Ymm>(iterations);
}

}  // namespace numaserve::affinity::internal
