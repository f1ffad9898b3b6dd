#include "kernels/ref/gemm_ref.h"

#include <gtest/gtest.h>

namespace numaserve::kernels {
namespace {

// A = [[1,2,3],[4,5,6]] (2x3), B = [[1,0],[0,1],[1,1]] (3x2):
// A*B = [[4,5],[10,11]].
const Tensor kA({2, 3}, {1, 2, 3, 4, 5, 6});
const Tensor kAt({3, 2}, {1, 4, 2, 5, 3, 6});
const Tensor kB({3, 2}, {1, 0, 0, 1, 1, 1});
const Tensor kBt({2, 3}, {1, 0, 1, 0, 1, 1});

struct Case {
  bool trans_a, trans_b;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.trans_a ? "transA " : "") << (c.trans_b ? "transB" : "");
}

class GemmRefTransposeTest : public ::testing::TestWithParam<Case> {};

TEST_P(GemmRefTransposeTest, AllTransposeCombosGiveTheSameProduct) {
  const Case c = GetParam();
  auto y = GemmRef(c.trans_a ? kAt : kA, c.trans_b ? kBt : kB, nullptr,
                   {.trans_a = c.trans_a, .trans_b = c.trans_b});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape, (Shape{2, 2}));
  EXPECT_EQ(y->data, (std::vector<float>{4, 5, 10, 11}));
}

INSTANTIATE_TEST_SUITE_P(Combos, GemmRefTransposeTest,
                         ::testing::Values(Case{false, false}, Case{false, true}, Case{true, false},
                                           Case{true, true}),
                         [](const auto& info) {
                           return std::string(info.param.trans_a ? "tA" : "A") +
                                  (info.param.trans_b ? "_tB" : "_B");
                         });

TEST(GemmRefTest, AlphaBetaAndBroadcastC) {
  const Tensor row({2}, {1, -1});
  auto y = GemmRef(kA, kB, &row, {.alpha = 2.0f, .beta = 3.0f});
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{8 + 3, 10 - 3, 20 + 3, 22 - 3}));

  const Tensor scalar({}, {0.5f});
  y = GemmRef(kA, kB, &scalar, {.alpha = 1.0f, .beta = 2.0f});
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{5, 6, 11, 12}));

  const Tensor col({2, 1}, {1, 2});
  y = GemmRef(kA, kB, &col, {});
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{5, 6, 12, 13}));

  const Tensor full({2, 2}, {1, 2, 3, 4});
  y = GemmRef(kA, kB, &full, {.alpha = 0.5f, .beta = -1.0f});
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{2 - 1, 2.5f - 2, 5 - 3, 5.5f - 4}));
}

TEST(GemmRefTest, RejectsBadShapes) {
  EXPECT_FALSE(GemmRef(kA, kA, nullptr, {}).ok());
  const Tensor bad_c({3}, {1, 2, 3});
  EXPECT_FALSE(GemmRef(kA, kB, &bad_c, {}).ok());
}

TEST(MatMulRefTest, TwoDAndBatched) {
  auto y = MatMulRef(kA, kB);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->data, (std::vector<float>{4, 5, 10, 11}));

  const Tensor a3({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  y = MatMulRef(a3, kB);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->shape, (Shape{2, 1, 2}));
  EXPECT_EQ(y->data, (std::vector<float>{4, 5, 10, 11}));
  EXPECT_FALSE(MatMulRef(kB, kB).ok());
}

}  // namespace
}  // namespace numaserve::kernels
