#include "kernels/ref/softmax_ref.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

TEST(SoftmaxRefTest, KnownValues) {
  auto y = SoftmaxRef(Tensor({1, 2}, {0.0f, std::log(3.0f)}), 1, false);
  ASSERT_TRUE(y.ok());
  EXPECT_NEAR(y->data[0], 0.25f, 1e-6);
  EXPECT_NEAR(y->data[1], 0.75f, 1e-6);
  // Large inputs must not overflow (max subtraction).
  y = SoftmaxRef(Tensor({3}, {1000, 1000, 1000}), 0, false);
  ASSERT_TRUE(y.ok());
  for (float v : y->data) EXPECT_NEAR(v, 1.0f / 3, 1e-6);
}

TEST(SoftmaxRefTest, RowsSumToOne) {
  const Tensor x = testing::RandomTensor({5, 7}, 1);
  auto y = SoftmaxRef(x, -1, false);
  ASSERT_TRUE(y.ok());
  for (int r = 0; r < 5; ++r) {
    double sum = 0;
    for (int c = 0; c < 7; ++c) sum += y->data[r * 7 + c];
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << r;
  }
}

TEST(SoftmaxRefTest, MiddleAxisVersusFlatten) {
  const Tensor x = testing::RandomTensor({2, 3, 4}, 2);
  // Opset 13: along dim 1 only -> for each (i, k), sum over j is 1.
  auto y = SoftmaxRef(x, 1, false);
  ASSERT_TRUE(y.ok());
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 4; ++k) {
      double sum = 0;
      for (int j = 0; j < 3; ++j) sum += y->data[i * 12 + j * 4 + k];
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
  // Opset < 13: flattened to [2, 12] -> each block of 12 sums to 1.
  auto f = SoftmaxRef(x, 1, true);
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 2; ++i) {
    double sum = 0;
    for (int j = 0; j < 12; ++j) sum += f->data[i * 12 + j];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  EXPECT_NE(y->data, f->data);
}

TEST(SoftmaxRefTest, BadAxis) { EXPECT_FALSE(SoftmaxRef(Tensor({2, 2}), 2, false).ok()); }

}  // namespace
}  // namespace numaserve::kernels
