#include "kernels/ref/add_ref.h"

#include <gtest/gtest.h>

namespace numaserve::kernels {
namespace {

TEST(AddRefTest, SameShape) {
  auto y = AddRef(Tensor({2}, {1, 2}), Tensor({2}, {10, 20}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{11, 22}));
}

TEST(AddRefTest, RowAndColumnBroadcast) {
  const Tensor m({2, 3}, {0, 1, 2, 3, 4, 5});
  auto y = AddRef(m, Tensor({3}, {10, 20, 30}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{10, 21, 32, 13, 24, 35}));
  y = AddRef(Tensor({2, 1}, {100, 200}), m);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{100, 101, 102, 203, 204, 205}));
}

TEST(AddRefTest, BothSidesBroadcast) {
  auto y = AddRef(Tensor({2, 1}, {1, 2}), Tensor({1, 3}, {10, 20, 30}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->shape, (Shape{2, 3}));
  EXPECT_EQ(y->data, (std::vector<float>{11, 21, 31, 12, 22, 32}));
}

TEST(AddRefTest, ScalarAndRank3) {
  auto y = AddRef(Tensor({2, 1, 2}, {1, 2, 3, 4}), Tensor({}, {0.5f}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f}));
  y = AddRef(Tensor({2, 1, 2}, {1, 2, 3, 4}), Tensor({3, 1}, {10, 20, 30}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->shape, (Shape{2, 3, 2}));
  EXPECT_EQ(y->data, (std::vector<float>{11, 12, 21, 22, 31, 32, 13, 14, 23, 24, 33, 34}));
}

TEST(AddRefTest, IncompatibleShapes) { EXPECT_FALSE(AddRef(Tensor({2, 3}), Tensor({2})).ok()); }

TEST(ReluRefTest, ClampsNegatives) {
  EXPECT_EQ(ReluRef(Tensor({4}, {-1, 0, 2, -0.5f})).data, (std::vector<float>{0, 0, 2, 0}));
}

}  // namespace
}  // namespace numaserve::kernels
