#include "kernels/onednn/elementwise_onednn.h"

#include <gtest/gtest.h>

#include "kernels/ref/add_ref.h"
#include "kernels/shape_ops.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

using testing::NormalizedError;
using testing::RandomTensor;

struct AddCase {
  Shape a, b;
};

void PrintTo(const AddCase& c, std::ostream* os) {
  *os << testing::ShapeName(c.a) << " + " << testing::ShapeName(c.b);
}

class AddOnednnTest : public ::testing::TestWithParam<AddCase> {};

TEST_P(AddOnednnTest, MatchesReference) {
  const AddCase c = GetParam();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tensor a = RandomTensor(c.a, 1), b = RandomTensor(c.b, 2);
  auto expected = AddRef(a, b);
  ASSERT_TRUE(expected.ok());
  AddOnednn add(engine);
  std::vector<float> out(expected->size());
  for (int rep = 0; rep < 2; ++rep) {  // second call reuses the cached primitive
    ASSERT_TRUE(add.Execute(stream, a.shape, a.data.data(), b.shape, b.data.data(), expected->shape,
                            out.data())
                    .ok());
    stream.wait();
    EXPECT_LT(NormalizedError(expected->data.data(), out.data(), expected->size()), 1e-12)
        << ShapeToString(c.a) << " + " << ShapeToString(c.b);
  }
}

INSTANTIATE_TEST_SUITE_P(Broadcasts, AddOnednnTest,
                         ::testing::Values(AddCase{{4, 5}, {4, 5}}, AddCase{{4, 5}, {5}},
                                           AddCase{{5}, {4, 5}}, AddCase{{3, 4, 5}, {4, 1}},
                                           AddCase{{3, 1, 5}, {3, 4, 5}}, AddCase{{4, 1}, {1, 5}},
                                           AddCase{{2, 3}, {}}, AddCase{{}, {}}),
                         [](const auto& info) {
                           return testing::ShapeName(info.param.a) + "_plus_" +
                                  testing::ShapeName(info.param.b);
                         });

TEST(ReluOnednnTest, MatchesReference) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const Tensor x = RandomTensor({3, 77}, 3);
  ReluOnednn relu(engine);
  std::vector<float> out(x.size());
  ASSERT_TRUE(relu.Execute(stream, x.size(), x.data.data(), out.data()).ok());
  stream.wait();
  EXPECT_EQ(out, ReluRef(x).data);
}

}  // namespace
}  // namespace numaserve::kernels
