// Einsums that are one matrix product run on the MatMul steps
// (engine/compiler/einsum_rewrite.cc): each equation against the
// reference executor's Einsum, and the plan holding no reference step for
// it; equations that are not one product keep the reference and stay
// right.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::OnnxModelBuilder;

std::string Plan(const std::string& path) {
  auto model = CompiledModel::Load(path, {});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->DescribePlan() : "";
}

struct Case {
  const char* name;
  const char* equation;
  std::vector<int64_t> a, b, y;  // -1: the batch
  bool b_constant = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.equation; }

std::string Save(const Case& c) {
  OnnxModelBuilder b(18);
  b.Input("a", c.a);
  if (c.b_constant) {
    b.Initializer("b", testing::RandomTensor(c.b, 99));
  } else {
    b.Input("b", c.b);
  }
  b.Output("y", c.y);
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"a", "b"}, {"y"}, "einsum"), "equation",
                               c.equation);
  return b.Save(c.name);
}

class EinsumAsMatMulTest : public ::testing::TestWithParam<Case> {};

TEST_P(EinsumAsMatMulTest, MatchesTheReferenceOnMatMulSteps) {
  const Case& c = GetParam();
  const std::string path = Save(c);
  testing::ExpectCompiledMatchesReference(c.name, path, {1, 3}, 1e-10);
  const std::string plan = Plan(path);
  EXPECT_THAT(plan, Not(HasSubstr("reference: einsum"))) << plan;
  EXPECT_THAT(plan, HasSubstr("matmul: einsum")) << plan;
}

INSTANTIATE_TEST_SUITE_P(
    Equations, EinsumAsMatMulTest,
    ::testing::Values(
        // Attention scores: the keys' last two dims swapped.
        Case{"scores", "bhid,bhjd->bhij", {-1, 2, 5, 4}, {-1, 2, 6, 4}, {-1, 2, 5, 6}},
        // Attention context: already [batch, m, k] x [batch, k, n].
        Case{"context", "bhij,bhjd->bhid", {-1, 2, 5, 6}, {-1, 2, 6, 3}, {-1, 2, 5, 3}},
        // A linear layer: two m labels, the weights broadcast.
        Case{"linear", "bnd,dh->bnh", {-1, 5, 4}, {4, 3}, {-1, 5, 3}, true},
        // Weights stored [out, in]: permuted once at load.
        Case{"linear_t", "bnd,hd->bnh", {-1, 5, 4}, {3, 4}, {-1, 5, 3}, true},
        // The product transposed into the output's order.
        Case{"to_output", "bik,bkj->bji", {-1, 5, 4}, {-1, 4, 3}, {-1, 3, 5}},
        // Labels in another order in each input.
        Case{"reordered", "bihd,bhjd->bhij", {-1, 5, 2, 4}, {-1, 2, 6, 4}, {-1, 2, 5, 6}},
        // Ellipses as batch labels.
        Case{"ellipsis", "...ij,...jk->...ik", {-1, 2, 5, 4}, {-1, 2, 4, 3}, {-1, 2, 5, 3}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Not one product: two contracted labels, a label summed within one input,
// a diagonal, an outer product. They keep the reference and its answer.
class EinsumOnTheReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(EinsumOnTheReferenceTest, KeepsTheReference) {
  const Case& c = GetParam();
  const std::string path = Save(c);
  testing::ExpectCompiledMatchesReference(c.name, path, {1, 3}, 1e-10);
  EXPECT_THAT(Plan(path), HasSubstr("reference: einsum"));
}

INSTANTIATE_TEST_SUITE_P(
    Equations, EinsumOnTheReferenceTest,
    ::testing::Values(Case{"two_contracted", "bij,bij->b", {-1, 3, 4}, {-1, 3, 4}, {-1}},
                      Case{"summed_alone", "bij,bjk->bk", {-1, 3, 4}, {-1, 4, 2}, {-1, 2}},
                      Case{"diagonal", "bii,bij->bij", {-1, 3, 3}, {-1, 3, 2}, {-1, 3, 2}},
                      Case{"outer", "bi,bj->bij", {-1, 3}, {-1, 2}, {-1, 3, 2}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Attention written as Einsums, with a dynamic sequence length: the
// rewritten MatMuls run at every signature.
TEST(EinsumAsMatMulTest, AttentionAtSeveralSequenceLengths) {
  OnnxModelBuilder b(18);
  b.NamedInput("q", {-1, 2, -1, 8}, {"batch", "", "seq", ""});
  b.NamedInput("k", {-1, 2, -1, 8}, {"batch", "", "seq", ""});
  b.NamedInput("v", {-1, 2, -1, 8}, {"batch", "", "seq", ""});
  b.NamedOutput("y", {-1, 2, -1, 8}, {"batch", "", "seq", ""});
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"q", "k"}, {"s"}, "scores"), "equation",
                               "bhqd,bhkd->bhqk");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s"}, {"p"}, "softmax"), "axis", -1);
  OnnxModelBuilder::AttrString(b.Node("Einsum", {"p", "v"}, {"y"}, "context"), "equation",
                               "bhqk,bhkd->bhqd");
  const std::string path = b.Save("einsum_attention");
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), Not(HasSubstr("reference:")));
  uint32_t seed = 1;
  for (int64_t seq : {1, 7, 33}) {
    SCOPED_TRACE(seq);
    const Shape shape{2, 2, seq, 8};
    std::vector<kernels::Tensor> inputs;
    for (int i = 0; i < 3; ++i) inputs.push_back(testing::RandomTensor(shape, seed++));
    auto expected = RunReference(*graph, inputs);
    ASSERT_TRUE(expected.ok()) << expected.status();
    std::vector<float> y(kernels::NumElements(shape), -7.0f);
    const CompiledModel::InputShapes shapes{shape, shape, shape};
    ASSERT_TRUE((*model)
                    ->Run(shapes,
                          {inputs[0].data.data(), inputs[1].data.data(), inputs[2].data.data()},
                          {y.data()})
                    .ok());
    EXPECT_LT(testing::NormalizedError((*expected)[0].data, y.data()), 1e-10);
  }
}

}  // namespace
}  // namespace numaserve::engine
