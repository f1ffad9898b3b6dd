// Helpers shared by kernel tests: seeded random tensors and the normalized
// error mse(a, b) / mse(a, 0) that whole-op comparisons use.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "kernels/tensor.h"

namespace numaserve::kernels::testing {

inline std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline Tensor RandomTensor(const Shape& shape, uint32_t seed) {
  return Tensor(shape, RandomValues(NumElements(shape), seed));
}

// "4x5" ("scalar" for {}): a shape as a valid test-name fragment.
inline std::string ShapeName(const Shape& shape) {
  return shape.empty() ? "scalar" : absl::StrJoin(shape, "x");
}

inline double NormalizedError(const float* expected, const float* actual, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(expected[i]) - actual[i];
    num += d * d;
    den += static_cast<double>(expected[i]) * expected[i];
  }
  if (den == 0.0) return num;
  return num / den;
}

}  // namespace numaserve::kernels::testing
