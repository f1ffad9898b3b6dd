// numaserve's own row reductions (sum / max / min) and batched 2-D
// transposes per ISA tier against their scalar references
// (kernels/cpu/row_kernels_scalar.cc) over many shapes: lengths and sides
// around and between the vector widths and the 8x8 tile, one matrix to a
// few back to back. Tiers the CPU lacks are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/dispatch.h"

namespace numaserve::kernels {
namespace {

using cpu::ReduceOp;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

const std::vector<IsaTier> kTiers = {IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512};

class ReduceRowsTest : public ::testing::TestWithParam<IsaTier> {};

TEST_P(ReduceRowsTest, MatchesScalarOverManyShapes) {
  const KernelTable* t = KernelTableFor(GetParam());
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(GetParam());
  const KernelTable* ref = KernelTableFor(IsaTier::kScalar);
  for (int64_t rows : {1, 2, 5, 33}) {
    for (int64_t len = 1; len <= 70; ++len) {
      const std::vector<float> x = Random(rows * len, static_cast<uint32_t>(rows * 100 + len));
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> got(rows, -1.0f), want(rows, -2.0f);
        t->reduce_rows(x.data(), got.data(), rows, len, op);
        ref->reduce_rows(x.data(), want.data(), rows, len, op);
        for (int64_t r = 0; r < rows; ++r) {
          const std::string where = std::string(IsaTierName(GetParam())) +
                                    " op=" + std::to_string(static_cast<int>(op)) +
                                    " rows=" + std::to_string(rows) +
                                    " len=" + std::to_string(len) + " row=" + std::to_string(r);
          if (op == ReduceOp::kSum) {
            // Different summation order: compare to rounding, scaled by the
            // sum of magnitudes (cancellation can make the sum itself tiny).
            double abs_sum = 0;
            for (int64_t i = 0; i < len; ++i) abs_sum += std::fabs(x[r * len + i]);
            ASSERT_NEAR(got[r], want[r], 1e-5 * (abs_sum + 1)) << where;
          } else {
            ASSERT_EQ(got[r], want[r]) << where;
          }
        }
      }
    }
  }
}

TEST(ReduceRowsScalarTest, ReferenceIsRight) {
  const float x[6] = {3.0f, -1.0f, 2.5f, -4.0f, 10.0f, 0.5f};
  float out[2];
  KernelTableFor(IsaTier::kScalar)->reduce_rows(x, out, 2, 3, ReduceOp::kSum);
  EXPECT_FLOAT_EQ(out[0], 4.5f);
  EXPECT_FLOAT_EQ(out[1], 6.5f);
  KernelTableFor(IsaTier::kScalar)->reduce_rows(x, out, 2, 3, ReduceOp::kMax);
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], 10.0f);
  KernelTableFor(IsaTier::kScalar)->reduce_rows(x, out, 2, 3, ReduceOp::kMin);
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], -4.0f);
}

class Transpose2dTest : public ::testing::TestWithParam<IsaTier> {};

TEST_P(Transpose2dTest, MatchesDefinitionOverManyShapes) {
  const KernelTable* t = KernelTableFor(GetParam());
  if (t == nullptr) GTEST_SKIP() << "CPU lacks " << IsaTierName(GetParam());
  for (int64_t batch = 1; batch <= 3; ++batch) {
    for (int64_t rows = 1; rows <= 33; ++rows) {
      for (int64_t cols : {1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 33, 64, 70, 137}) {
        const std::vector<float> x =
            Random(batch * rows * cols, static_cast<uint32_t>(batch * 10000 + rows * 100 + cols));
        std::vector<float> y(x.size(), NAN);
        t->transpose_2d(x.data(), y.data(), batch, rows, cols);
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < cols; ++c) {
              ASSERT_EQ(y[b * rows * cols + c * rows + r], x[b * rows * cols + r * cols + c])
                  << IsaTierName(GetParam()) << " batch=" << batch << " rows=" << rows
                  << " cols=" << cols << " at " << b << "," << r << "," << c;
            }
          }
        }
      }
    }
  }
}

const auto kTierName = [](const auto& info) { return std::string(IsaTierName(info.param)); };
INSTANTIATE_TEST_SUITE_P(Tiers, ReduceRowsTest, ::testing::ValuesIn(kTiers), kTierName);
INSTANTIATE_TEST_SUITE_P(Tiers, Transpose2dTest, ::testing::ValuesIn(kTiers), kTierName);

}  // namespace
}  // namespace numaserve::kernels
