// The fused attention kernel (kernels/cpu/attention.h) per ISA tier against
// double-precision math, over shapes around the tiles (query blocks of 24,
// score tiles of 12 or 4 rows, vector widths of 16 and 8, scalar column
// tails) and the strides of a [S, H, D] tensor read head by head. Tiers
// the CPU lacks are skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/dispatch.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::vector<float> v = testing::RandomValues(n, seed);
  for (float& x : v) x *= scale;
  return v;
}

// sq, sk, d, dv
using Dims = std::tuple<int64_t, int64_t, int64_t, int64_t>;
using Param = std::tuple<IsaTier, Dims>;

class AttentionKernelTest : public ::testing::TestWithParam<Param> {
 protected:
  const KernelTable* Table() const { return KernelTableFor(std::get<0>(GetParam())); }
  std::string Name() const {
    const auto [sq, sk, d, dv] = std::get<1>(GetParam());
    return std::string(IsaTierName(std::get<0>(GetParam()))) + " sq=" + std::to_string(sq) +
           " sk=" + std::to_string(sk) + " d=" + std::to_string(d) + " dv=" + std::to_string(dv);
  }
};

// Head 1 of 3 in [S, 3, D] tensors (rows strided by 3 heads), k read
// transposed through its strides when `k_transposed` ([3, D, S] stored).
void CheckHead(const KernelTable& t, int64_t sq, int64_t sk, int64_t d, int64_t dv,
               bool k_transposed, const std::string& name) {
  constexpr int64_t kHeads = 3, kHead = 1;
  const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
  const std::vector<float> q = Random(sq * kHeads * d, 1, 2.0f);
  const std::vector<float> k = Random(sk * kHeads * d, 2, 2.0f);
  const std::vector<float> v = Random(sk * kHeads * dv, 3, 1.0f);
  std::vector<float> out(sq * kHeads * dv, -7.0f);
  cpu::AttentionHead h;
  h.q = q.data() + kHead * d;
  h.q_row = kHeads * d;
  h.k = k.data() + kHead * (k_transposed ? d * sk : d);
  h.k_row = k_transposed ? 1 : kHeads * d;
  h.k_col = k_transposed ? sk : 1;
  h.v = v.data() + kHead * dv;
  h.v_row = kHeads * dv;
  h.out = out.data() + kHead * dv;
  h.out_row = kHeads * dv;
  h.sq = sq;
  h.sk = sk;
  h.d = d;
  h.dv = dv;
  h.alpha = alpha;
  std::vector<float> scratch(cpu::AttentionScratchFloats(sk, d), NAN);
  t.attention_head(h, scratch.data());

  double worst = 0;
  std::vector<double> p(sk);
  for (int64_t i = 0; i < sq; ++i) {
    double max_s = -INFINITY;
    for (int64_t j = 0; j < sk; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        dot += static_cast<double>(h.q[i * h.q_row + c]) * h.k[j * h.k_row + c * h.k_col];
      }
      p[j] = alpha * dot;
      max_s = std::max(max_s, p[j]);
    }
    double sum = 0;
    for (double& x : p) sum += (x = std::exp(x - max_s));
    for (int64_t c = 0; c < dv; ++c) {
      double want = 0;
      for (int64_t j = 0; j < sk; ++j) want += p[j] / sum * h.v[j * h.v_row + c];
      worst = std::max(worst, std::abs(want - h.out[i * h.out_row + c]));
    }
  }
  EXPECT_LT(worst, 2e-5) << name << (k_transposed ? " (k transposed)" : "");
  // The other heads' columns are untouched.
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t hd = 0; hd < kHeads; ++hd) {
      if (hd == kHead) continue;
      for (int64_t c = 0; c < dv; ++c) {
        ASSERT_EQ(out[(i * kHeads + hd) * dv + c], -7.0f) << name << " wrote head " << hd;
      }
    }
  }
}

TEST_P(AttentionKernelTest, MatchesDoublePrecision) {
  const KernelTable* t = Table();
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(std::get<0>(GetParam()));
  const auto [sq, sk, d, dv] = std::get<1>(GetParam());
  CheckHead(*t, sq, sk, d, dv, false, Name());
  CheckHead(*t, sq, sk, d, dv, true, Name());
}

// Rows of equal scores (q = 0) average v; one dominant key picks its row.
TEST_P(AttentionKernelTest, UniformAndPeakedWeights) {
  const KernelTable* t = Table();
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(std::get<0>(GetParam()));
  const auto [sq, sk, d, dv] = std::get<1>(GetParam());
  std::vector<float> q(sq * d, 0.0f), k = Random(sk * d, 5, 1.0f), v = Random(sk * dv, 6, 1.0f);
  std::vector<float> out(sq * dv), scratch(cpu::AttentionScratchFloats(sk, d));
  cpu::AttentionHead h{q.data(),   d,  1,  k.data(), d, 1,  v.data(), dv,
                       out.data(), dv, sq, sk,       d, dv, 1.0f};
  t->attention_head(h, scratch.data());
  for (int64_t c = 0; c < dv; ++c) {
    double mean = 0;
    for (int64_t j = 0; j < sk; ++j) mean += v[j * dv + c];
    mean /= static_cast<double>(sk);
    for (int64_t i = 0; i < sq; ++i) ASSERT_NEAR(out[i * dv + c], mean, 1e-5) << Name();
  }
  // k(j) = e_0 * (j == last ? 1 : 0), q(i) = 200 e_0: key `last` dominates.
  std::fill(k.begin(), k.end(), 0.0f);
  k[(sk - 1) * d] = 1.0f;
  for (int64_t i = 0; i < sq; ++i) q[i * d] = 200.0f;
  t->attention_head(h, scratch.data());
  if (sk > 1) {
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t c = 0; c < dv; ++c) {
        ASSERT_NEAR(out[i * dv + c], v[(sk - 1) * dv + c], 1e-5) << Name();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionKernelTest,
    ::testing::Combine(::testing::Values(IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512),
                       ::testing::Values(Dims{1, 1, 1, 1}, Dims{1, 7, 5, 3}, Dims{5, 17, 8, 16},
                                         Dims{13, 33, 16, 9}, Dims{24, 32, 64, 64},
                                         Dims{25, 48, 64, 64}, Dims{50, 100, 40, 72},
                                         Dims{128, 128, 64, 64}, Dims{7, 300, 32, 80})),
    [](const auto& info) {
      const Dims& d = std::get<1>(info.param);
      return std::string(IsaTierName(std::get<0>(info.param))) + "_" +
             std::to_string(std::get<0>(d)) + "x" + std::to_string(std::get<1>(d)) + "x" +
             std::to_string(std::get<2>(d)) + "x" + std::to_string(std::get<3>(d));
    });

}  // namespace
}  // namespace numaserve::kernels
