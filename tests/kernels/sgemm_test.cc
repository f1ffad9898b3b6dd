// The own AVX2 SGEMM (kernels/cpu/sgemm.h) against a double-precision
// reference, called directly, on 1, 2, 3 and 16 threads (more threads than
// cores still tests the split): several row blocks and K blocks, a partial
// last panel, rows that are not a multiple of the micro-kernel's 6, one and
// two rows (the few-row path), and beta 0 (C not read), 1 and 0.5. The GEMM backend tests cover it
// through the backend with its epilogues at the default threads.
#include "kernels/cpu/sgemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dispatch.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels::cpu {
namespace {

struct Case {
  int64_t m, k, n;
  bool transposed_w;
  float beta;
  int64_t lda_pad;  // A's row stride is k + lda_pad
};

class SgemmTest : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(SgemmTest, MatchesTheReference) {
  if (GetDispatchDecision().max_tier == IsaTier::kScalar) GTEST_SKIP() << "no AVX2 + FMA";
  const auto [t, threads] = GetParam();
  const int64_t lda = t.k + t.lda_pad, ldc = t.n + 3;
  const std::vector<float> a = testing::RandomValues(t.m * lda, 1),
                           w = testing::RandomValues(t.k * t.n, 2);
  const std::vector<float> c0 = testing::RandomValues(t.m * ldc, 3);
  const float scale = 0.75f;

  std::vector<float> packed(SgemmPackedFloats(t.k, t.n), NAN);
  PackSgemmWeights(w.data(), t.k, t.n, t.transposed_w, scale, packed.data());
  // Without beta, C starts as NaN: every element must be written.
  std::vector<float> c = t.beta == 0 ? std::vector<float>(c0.size(), NAN) : c0;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  sgemm_packed_avx2(t.m, t.n, t.k, a.data(), lda, packed.data(), t.beta, c.data(), ldc);
  omp_set_num_threads(saved);

  double max_err = 0;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) {
      double want = t.beta == 0 ? 0.0 : static_cast<double>(t.beta) * c0[i * ldc + j];
      for (int64_t p = 0; p < t.k; ++p) {
        const float wv = t.transposed_w ? w[j * t.k + p] : w[p * t.n + j];
        want += static_cast<double>(a[i * lda + p]) * scale * wv;
      }
      const double err = std::fabs(c[i * ldc + j] - want);
      max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
    }
    // The padding between rows of C is never written.
    for (int64_t j = t.n; j < ldc && i + 1 < t.m; ++j) {
      ASSERT_EQ(std::memcmp(&c[i * ldc + j], &(t.beta == 0 ? c : c0)[i * ldc + j], 4), 0)
          << "row " << i << " col " << j;
    }
  }
  // FP32 sums of K products of magnitude <= 0.75: a few ulps of sqrt(K),
  // far below one product left out or counted twice (~0.1-0.5).
  EXPECT_LT(max_err, 2e-5 * std::sqrt(static_cast<double>(t.k)) + 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SgemmTest,
    ::testing::Combine(::testing::Values(
                           // m, k, n, transposed_w, beta, lda_pad
                           Case{1, 5, 3, false, 0.0f, 0}, Case{7, 300, 40, true, 0.0f, 2},
                           Case{13, 513, 64, false, 1.0f, 0}, Case{250, 96, 70, false, 0.5f, 1},
                           Case{500, 260, 130, true, 0.0f, 0}, Case{128, 768, 200, false, 1.0f, 0},
                           // One and two rows (the few-row path): K not a
                           // multiple of its 4 or 2 interleaved sums, partial
                           // last panels, every beta.
                           Case{1, 1023, 40, false, 0.0f, 0}, Case{1, 3, 16, true, 1.0f, 1},
                           Case{1, 784, 1030, true, 0.5f, 0}, Case{2, 7, 17, true, 0.5f, 2},
                           Case{2, 514, 64, false, 0.0f, 0}, Case{2, 1, 5, false, 1.0f, 0}),
                       ::testing::Values(1, 2, 3, 16)),
    [](const auto& info) {
      const Case& c = std::get<0>(info.param);
      return absl::StrCat("M", c.m, "_K", c.k, "_N", c.n, c.transposed_w ? "_tW" : "", "_beta",
                          static_cast<int>(c.beta * 10), "_", std::get<1>(info.param), "_threads");
    });

}  // namespace
}  // namespace numaserve::kernels::cpu
