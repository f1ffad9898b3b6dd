#include "kernels/onednn/matmul_onednn.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/ref/add_ref.h"
#include "kernels/ref/gemm_ref.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

using testing::NormalizedError;
using testing::RandomTensor;

struct MatMulCase {
  int64_t m, k, n;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  bool bias = false;
  bool relu = false;
  float beta_accumulate = 0.0f;  // != 0: Y += beta * C (full [M,N] C)

  std::string Name() const {
    // Test names allow only [A-Za-z0-9_]: scales are written x100.
    return absl::StrCat("M", m, "_K", k, "_N", n, trans_a ? "_tA" : "", trans_b ? "_tB" : "",
                        "_alpha", static_cast<int>(alpha * 100), bias ? "_bias" : "",
                        relu ? "_relu" : "", "_beta",
                        static_cast<int>(beta_accumulate * 100) + 1000);
  }
};

void PrintTo(const MatMulCase& c, std::ostream* os) { *os << c.Name(); }

class MatMulOnednnTest : public ::testing::TestWithParam<MatMulCase> {
 protected:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

TEST_P(MatMulOnednnTest, MatchesReference) {
  const MatMulCase c = GetParam();
  const Tensor a = RandomTensor(c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, 1);
  const Tensor b = RandomTensor(c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, 2);
  const Tensor bias = RandomTensor({c.n}, 3);
  const Tensor acc = RandomTensor({c.m, c.n}, 4);

  // Expected: alpha*op(A)op(B) + bias + beta*acc, then relu.
  auto expected =
      GemmRef(a, b, c.bias ? &bias : nullptr,
              {.alpha = c.alpha, .beta = 1.0f, .trans_a = c.trans_a, .trans_b = c.trans_b});
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (int64_t i = 0; i < c.m * c.n; ++i) expected->data[i] += c.beta_accumulate * acc.data[i];
  if (c.relu) *expected = ReluRef(*expected);

  MatMulOnednnOptions options{.k = c.k,
                              .n = c.n,
                              .weights = b.data.data(),
                              .weights_transposed = c.trans_b,
                              .weights_scale = c.alpha,
                              .bias = c.bias ? bias.data : std::vector<float>{},
                              .src_transposed = c.trans_a,
                              .accumulate = c.beta_accumulate != 0.0f,
                              .sum_scale = c.beta_accumulate,
                              .relu = c.relu};
  auto mm = MatMulOnednn::Create(engine_, options);
  ASSERT_TRUE(mm.ok()) << mm.status();
  std::vector<float> y = c.beta_accumulate != 0.0f ? acc.data : std::vector<float>(c.m * c.n);
  ASSERT_TRUE((*mm)->Execute(stream_, c.m, a.data.data(), y.data()).ok());
  stream_.wait();
  EXPECT_LT(NormalizedError(expected->data.data(), y.data(), c.m * c.n), 1e-6) << c.Name();
}

std::vector<MatMulCase> Cases() {
  std::vector<MatMulCase> cases;
  for (int64_t m : {1, 3, 8, 32, 100}) {
    cases.push_back({.m = m, .k = 784, .n = 256, .trans_b = true, .bias = true, .relu = true});
    cases.push_back({.m = m, .k = 128, .n = 10, .bias = true});
    cases.push_back({.m = m, .k = 17, .n = 33});
  }
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      cases.push_back({.m = 5, .k = 7, .n = 9, .trans_a = ta, .trans_b = tb, .alpha = 0.5f});
      cases.push_back({.m = 6,
                       .k = 64,
                       .n = 70,
                       .trans_a = ta,
                       .trans_b = tb,
                       .bias = true,
                       .beta_accumulate = -2.0f});
    }
  }
  cases.push_back({.m = 4, .k = 16, .n = 16, .relu = true, .beta_accumulate = 1.0f});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatMulOnednnTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.Name(); });

// The finding the kernel is built on: one packed weights layout serves
// every M, so no M needs its own copy of the weights.
TEST(MatMulOnednnPackingTest, OnePackedLayoutServesEveryM) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const Tensor w = RandomTensor({784, 1024}, 5);
  MatMulOnednnOptions options;
  options.k = 784;
  options.n = 1024;
  options.weights = w.data.data();
  auto mm = MatMulOnednn::Create(engine, options);
  ASSERT_TRUE(mm.ok());
  EXPECT_GE((*mm)->packed_weight_bytes(), 784 * 1024 * 4);
  for (int64_t m : {1, 8, 32, 256}) {
    ASSERT_TRUE((*mm)->Prepare(m).ok());
    EXPECT_FALSE((*mm)->UsesFallbackWeights(m)) << "M=" << m << " " << (*mm)->ImplementationName(m);
    EXPECT_FALSE((*mm)->ImplementationName(m).empty());
  }
}

TEST(MatMulOnednnPackingTest, RejectsBadOptions) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  std::vector<float> w(6);
  MatMulOnednnOptions options;
  options.k = 2;
  options.n = 3;
  EXPECT_FALSE(MatMulOnednn::Create(engine, options).ok());  // no weights
  options.weights = w.data();
  options.bias = {1, 2};
  EXPECT_FALSE(MatMulOnednn::Create(engine, options).ok());  // bias of 2 for N = 3
}

}  // namespace
}  // namespace numaserve::kernels
