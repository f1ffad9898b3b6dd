#include "kernels/shape_ops.h"

#include <gtest/gtest.h>

namespace numaserve::kernels {
namespace {

TEST(BroadcastShapesTest, NumpyRules) {
  EXPECT_EQ(*BroadcastShapes({2, 3}, {3}), (Shape{2, 3}));
  EXPECT_EQ(*BroadcastShapes({4, 1}, {1, 5}), (Shape{4, 5}));
  EXPECT_EQ(*BroadcastShapes({}, {2, 2}), (Shape{2, 2}));
  EXPECT_EQ(*BroadcastShapes({7, 1, 3}, {6, 1}), (Shape{7, 6, 3}));
  EXPECT_FALSE(BroadcastShapes({2, 3}, {4}).ok());
}

TEST(FlattenShapeTest, Axes) {
  EXPECT_EQ(*FlattenShape({2, 3, 4}, 1), (Shape{2, 12}));
  EXPECT_EQ(*FlattenShape({2, 3, 4}, 0), (Shape{1, 24}));
  EXPECT_EQ(*FlattenShape({2, 3, 4}, 3), (Shape{24, 1}));
  EXPECT_EQ(*FlattenShape({2, 3, 4}, -1), (Shape{6, 4}));
  EXPECT_FALSE(FlattenShape({2, 3}, 3).ok());
}

TEST(ReshapeShapeTest, ZeroCopiesAndMinusOneInfers) {
  EXPECT_EQ(*ReshapeShape({2, 3, 4}, {0, -1}, false), (Shape{2, 12}));
  EXPECT_EQ(*ReshapeShape({2, 3, 4}, {-1, 4}, false), (Shape{6, 4}));
  EXPECT_EQ(*ReshapeShape({2, 3, 4}, {0, 0, 2, 2}, false), (Shape{2, 3, 2, 2}));
  EXPECT_EQ(*ReshapeShape({2, 3, 4}, {24}, false), (Shape{24}));
}

TEST(ReshapeShapeTest, AllowZeroKeepsZero) {
  EXPECT_EQ(*ReshapeShape({0, 4}, {0, 4}, true), (Shape{0, 4}));
  EXPECT_FALSE(ReshapeShape({2, 4}, {0, 4}, true).ok());  // 0 elements != 8
}

TEST(ReshapeShapeTest, Errors) {
  EXPECT_FALSE(ReshapeShape({2, 3}, {-1, -1}, false).ok());
  EXPECT_FALSE(ReshapeShape({2, 3}, {4, -1}, false).ok());
  EXPECT_FALSE(ReshapeShape({2, 3}, {5}, false).ok());
  EXPECT_FALSE(ReshapeShape({2, 3}, {0, 0, 0}, false).ok());
}

}  // namespace
}  // namespace numaserve::kernels
