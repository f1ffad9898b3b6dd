// Built with -mavx512f (affinity/CMakeLists.txt); nothing else may be.
#include <immintrin.h>

#include "affinity/fma_probe.h"
#include "affinity/fma_probe_loops.h"

namespace numaserve::affinity::internal {
namespace {

struct Zmm {
  static constexpr int kAccumulators = 16;
  static constexpr int kLanes = 16;
  static __m512 Broadcast(float value) { return _mm512_set1_ps(value); }
  static __m512 Fma(__m512 x, __m512 a, __m512 b) { return _mm512_fmadd_ps(x, a, b); }
  static __m512 Add(__m512 x, __m512 y) { return _mm512_add_ps(x, y); }
  static float First(__m512 x) { return _mm512_cvtss_f32(x); }
};

}  // namespace

double F32FmaGflopsAvx512f(int64_t iterations) {
  return FmaThroughputGflops<__m512, Zmm>(iterations);
}

double ClockGhzUnderFmaAvx512f(int64_t iterations) {
  return ClockGhzUnderFma<__m512, Zmm>(iterations);
}

}  // namespace numaserve::affinity::internal
