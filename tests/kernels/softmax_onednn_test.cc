#include "kernels/onednn/softmax_onednn.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/ref/softmax_ref.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

struct SoftmaxCase {
  Shape shape;
  int64_t axis;
  bool flatten;
};

void PrintTo(const SoftmaxCase& c, std::ostream* os) {
  *os << testing::ShapeName(c.shape) << " axis " << c.axis << (c.flatten ? " flattened" : "");
}

class SoftmaxOnednnTest : public ::testing::TestWithParam<SoftmaxCase> {};

TEST_P(SoftmaxOnednnTest, MatchesReference) {
  const SoftmaxCase c = GetParam();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tensor x = testing::RandomTensor(c.shape, 7);
  auto expected = SoftmaxRef(x, c.axis, c.flatten);
  ASSERT_TRUE(expected.ok());
  SoftmaxOnednn softmax(engine, c.axis, c.flatten);
  std::vector<float> out(x.size());
  ASSERT_TRUE(softmax.Execute(stream, x.shape, x.data.data(), out.data()).ok());
  stream.wait();
  EXPECT_LT(testing::NormalizedError(expected->data.data(), out.data(), x.size()), 1e-10)
      << ShapeToString(c.shape) << " axis " << c.axis << (c.flatten ? " flattened" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Axes, SoftmaxOnednnTest,
    ::testing::Values(SoftmaxCase{{32, 10}, 1, false}, SoftmaxCase{{32, 10}, -1, false},
                      SoftmaxCase{{4, 3, 5}, 1, false}, SoftmaxCase{{4, 3, 5}, 0, false},
                      SoftmaxCase{{4, 3, 5}, 1, true}, SoftmaxCase{{4, 3, 5}, 0, true},
                      SoftmaxCase{{1, 1000}, 1, false}),
    [](const auto& info) {
      const SoftmaxCase& c = info.param;
      return absl::StrCat(testing::ShapeName(c.shape), "_axis", c.axis < 0 ? "m" : "",
                          c.axis < 0 ? -c.axis : c.axis, c.flatten ? "_flat" : "");
    });

TEST(SoftmaxOnednnErrorTest, BadAxis) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  SoftmaxOnednn softmax(engine, 3, false);
  std::vector<float> x(4), y(4);
  EXPECT_FALSE(softmax.Execute(stream, {2, 2}, x.data(), y.data()).ok());
}

}  // namespace
}  // namespace numaserve::kernels
