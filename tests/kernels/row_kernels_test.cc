// numaserve's own row kernels per ISA tier against their scalar reference
// (kernels/cpu/row_kernels_scalar.cc) and against double-precision math,
// over many shapes (lengths around the vector widths, tails, one row to
// many). Tiers the CPU lacks are skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/dispatch.h"

namespace numaserve::kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

using Param = std::tuple<IsaTier, int64_t /*rows*/, int64_t /*len*/>;

class RowKernelsTest : public ::testing::TestWithParam<Param> {
 protected:
  const KernelTable* Table() const { return KernelTableFor(std::get<0>(GetParam())); }
  int64_t rows() const { return std::get<1>(GetParam()); }
  int64_t len() const { return std::get<2>(GetParam()); }
  std::string Shape() const {
    return std::string(IsaTierName(std::get<0>(GetParam()))) + " rows=" + std::to_string(rows()) +
           " len=" + std::to_string(len());
  }
};

TEST_P(RowKernelsTest, SoftmaxMatchesReference) {
  const KernelTable* t = Table();
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(std::get<0>(GetParam()));
  const std::vector<float> x = Random(rows() * len(), 1, 20.0f);
  std::vector<float> y(x.size()), want(x.size());
  t->softmax_rows(x.data(), y.data(), rows(), len());
  for (int64_t r = 0; r < rows(); ++r) {
    double max_v = -INFINITY, sum = 0;
    for (int64_t i = 0; i < len(); ++i) max_v = std::max<double>(max_v, x[r * len() + i]);
    for (int64_t i = 0; i < len(); ++i) sum += std::exp(x[r * len() + i] - max_v);
    for (int64_t i = 0; i < len(); ++i) {
      const double w = std::exp(x[r * len() + i] - max_v) / sum;
      ASSERT_NEAR(y[r * len() + i], w, 1e-6 + 1e-5 * w) << Shape() << " at " << r << "," << i;
    }
  }
}

TEST_P(RowKernelsTest, LayerNormMatchesScalar) {
  const KernelTable* t = Table();
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(std::get<0>(GetParam()));
  const std::vector<float> x = Random(rows() * len(), 2, 3.0f);
  const std::vector<float> scale = Random(len(), 3, 1.0f), bias = Random(len(), 4, 1.0f);
  std::vector<float> y(x.size()), want(x.size());
  t->layer_norm_rows(x.data(), scale.data(), bias.data(), 1e-5f, y.data(), rows(), len());
  KernelTableFor(IsaTier::kScalar)
      ->layer_norm_rows(x.data(), scale.data(), bias.data(), 1e-5f, want.data(), rows(), len());
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_NEAR(y[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << Shape() << " at " << i;
  }
}

TEST_P(RowKernelsTest, RowBroadcastAddAndMulAreExact) {
  const KernelTable* t = Table();
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(std::get<0>(GetParam()));
  const std::vector<float> x = Random(rows() * len(), 5, 4.0f), v = Random(len(), 6, 4.0f);
  std::vector<float> y(x.size()), want(x.size());
  t->add_row_broadcast(x.data(), v.data(), y.data(), rows(), len());
  KernelTableFor(IsaTier::kScalar)
      ->add_row_broadcast(x.data(), v.data(), want.data(), rows(), len());
  EXPECT_EQ(y, want) << Shape();
  t->mul_row_broadcast(x.data(), v.data(), y.data(), rows(), len());
  KernelTableFor(IsaTier::kScalar)
      ->mul_row_broadcast(x.data(), v.data(), want.data(), rows(), len());
  EXPECT_EQ(y, want) << Shape();
}

TEST_P(RowKernelsTest, BiasActivationMatchesDoubleMath) {
  const KernelTable* t = Table();
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(std::get<0>(GetParam()));
  // Values over the whole range GELU bends in, and far out on both sides.
  const std::vector<float> x = Random(rows() * len(), 5, 12.0f);
  const std::vector<float> bias = Random(len(), 6, 1.0f);
  for (const auto act :
       {cpu::RowActivation::kNone, cpu::RowActivation::kRelu, cpu::RowActivation::kGeluErf}) {
    for (const bool with_bias : {false, true}) {
      std::vector<float> y = x;
      t->bias_activation_rows(y.data(), with_bias ? bias.data() : nullptr, rows(), len(), act);
      for (int64_t r = 0; r < rows(); ++r) {
        for (int64_t i = 0; i < len(); ++i) {
          const float in = x[r * len() + i] + (with_bias ? bias[i] : 0.0f);
          const double v = in;
          const double want = act == cpu::RowActivation::kRelu ? std::max(v, 0.0)
                              : act == cpu::RowActivation::kGeluErf
                                  ? 0.5 * v * std::erfc(-v / std::sqrt(2.0))
                                  : v;
          ASSERT_NEAR(y[r * len() + i], want, 2e-7 * std::max(1.0, std::fabs(v)))
              << Shape() << " act " << static_cast<int>(act) << " bias " << with_bias << " at " << r
              << "," << i << " x " << in;
        }
      }
    }
  }
}

TEST(BiasActivationRowsTest, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512}) {
    const KernelTable* t = KernelTableFor(tier);
    if (t == nullptr) continue;
    std::vector<float> y = {nan, inf, -inf, 0.0f, -0.0f, 1e-30f, -100.0f, 100.0f, nan};
    std::vector<float> r = y;
    t->bias_activation_rows(y.data(), nullptr, 1, static_cast<int64_t>(y.size()),
                            cpu::RowActivation::kGeluErf);
    EXPECT_TRUE(std::isnan(y[0])) << IsaTierName(tier);
    EXPECT_EQ(y[1], inf) << IsaTierName(tier);
    EXPECT_TRUE(std::isnan(y[2])) << IsaTierName(tier);  // -inf * 0, as 0.5 x (1 + erf x) gives
    EXPECT_EQ(y[3], 0.0f) << IsaTierName(tier);
    EXPECT_EQ(y[4], 0.0f) << IsaTierName(tier);
    EXPECT_NEAR(y[5], 0.5e-30f, 1e-37f) << IsaTierName(tier);
    EXPECT_NEAR(y[6], 0.0f, 1e-30f) << IsaTierName(tier);  // underflows to ~0
    EXPECT_EQ(y[7], 100.0f) << IsaTierName(tier);
    EXPECT_TRUE(std::isnan(y[8])) << IsaTierName(tier);
    t->bias_activation_rows(r.data(), nullptr, 1, static_cast<int64_t>(r.size()),
                            cpu::RowActivation::kRelu);
    EXPECT_TRUE(std::isnan(r[0])) << IsaTierName(tier) << ": relu keeps NaN";
    EXPECT_EQ(r[2], 0.0f) << IsaTierName(tier);
    EXPECT_EQ(r[7], 100.0f) << IsaTierName(tier);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RowKernelsTest,
    ::testing::Combine(::testing::Values(IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512),
                       ::testing::Values(1, 3, 17),
                       ::testing::Values(1, 7, 8, 15, 16, 17, 31, 33, 64, 100, 768, 1000)),
    [](const auto& info) {
      return std::string(IsaTierName(std::get<0>(info.param))) + "_" +
             std::to_string(std::get<1>(info.param)) + "x" +
             std::to_string(std::get<2>(info.param));
    });

}  // namespace
}  // namespace numaserve::kernels
