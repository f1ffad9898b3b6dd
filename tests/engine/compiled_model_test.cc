// CompiledModel (oneDNN) against the reference executor on models built in
// C++, over several batch sizes; plus Load/Run error handling.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/ops/shape_propagation.h"
#include "engine/reference/reference_executor.h"
#include "kernels/onednn/conv_onednn.h"
#include "tests/engine/default_model.h"
#include "tests/engine/onnx_model_builder.h"
#include "tests/prerequisites.h"

namespace numaserve::engine {
namespace {

using kernels::Tensor;
using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;

const std::vector<int64_t> kBatches = {1, 3, 32, 100};

Tensor Random(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor t(shape);
  for (float& v : t.data) v = dist(rng);
  return t;
}

double NormalizedError(const std::vector<float>& expected, const float* actual) {
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    num += (static_cast<double>(expected[i]) - actual[i]) * (expected[i] - actual[i]);
    den += static_cast<double>(expected[i]) * expected[i];
  }
  return den == 0 ? num : num / den;
}

// Loads `path` both ways and compares every output for each batch size.
void ExpectMatchesReference(const std::string& name, const std::string& path,
                            const std::vector<int64_t>& batches,
                            const CompileOptions& options = {}) {
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << name << ": " << graph.status();
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << name << ": " << model.status();
  // Revisit the first batch size at the end: cached state must stay valid.
  std::vector<int64_t> order = batches;
  order.push_back(batches.front());
  uint32_t seed = 1;
  for (int64_t batch : order) {
    SCOPED_TRACE(absl::StrCat("model ", name, ", batch ", batch));
    std::vector<Tensor> inputs;
    for (const Shape& s : InputShapesForBatch(*graph, batch)) inputs.push_back(Random(s, seed++));
    auto expected = RunReference(*graph, inputs);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const auto shapes = (*model)->OutputShapes(batch);
    ASSERT_EQ(shapes.size(), expected->size());
    std::vector<std::vector<float>> outputs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i], (*expected)[i].shape) << "output " << i;
      outputs.emplace_back(kernels::NumElements(shapes[i]), -7.0f);
    }
    std::vector<const void*> in_ptrs;
    for (const Tensor& t : inputs) in_ptrs.push_back(t.data.data());
    std::vector<void*> out_ptrs;
    for (auto& o : outputs) out_ptrs.push_back(o.data());
    for (int rep = 0; rep < 2; ++rep) {
      ASSERT_TRUE((*model)->Run(batch, in_ptrs, out_ptrs).ok());
      for (size_t i = 0; i < outputs.size(); ++i) {
        EXPECT_LT(NormalizedError((*expected)[i].data, outputs[i].data()), 1e-6)
            << "output " << i << " of model " << name << " at batch " << batch;
      }
    }
  }
}

// --- Gemm: every attribute combination --------------------------------------

struct GemmCase {
  bool trans_a, trans_b;
  float alpha, beta;
  // "none", "scalar", "n", "1n" (row vectors: batched); "mn", "m1", "input"
  std::string c;

  bool Batched() const {
    return !trans_a && (c == "none" || c == "scalar" || c == "n" || c == "1n" || c == "input");
  }
  std::string Name() const {
    return absl::StrCat(trans_a ? "tA_" : "", trans_b ? "tB_" : "", "alpha",
                        static_cast<int>(alpha * 10), "_beta", static_cast<int>(beta * 10), "_C_",
                        c);
  }
};

void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.Name(); }

std::string BuildGemm(const GemmCase& g) {
  constexpr int64_t kM = 5, kK = 19, kN = 23;
  OnnxModelBuilder b;
  const int64_t m = g.Batched() ? -1 : kM;
  b.Input("a", g.trans_a ? Shape{kK, m} : Shape{m, kK}).Output("y", {m, kN});
  b.Initializer("b", Random(g.trans_b ? Shape{kN, kK} : Shape{kK, kN}, 11));
  std::vector<std::string> inputs = {"a", "b"};
  if (g.c == "input") {
    b.Input("c", {m, kN});
    inputs.push_back("c");
  } else if (g.c != "none") {
    const Shape c_shape = g.c == "scalar" ? Shape{}
                          : g.c == "n"    ? Shape{kN}
                          : g.c == "1n"   ? Shape{1, kN}
                          : g.c == "mn"   ? Shape{kM, kN}
                                          : Shape{kM, 1};
    b.Initializer("c", Random(c_shape, 12));
    inputs.push_back("c");
  }
  auto& node = b.Node("Gemm", inputs, {"y"}, "gemm");
  OnnxModelBuilder::AttrFloat(node, "alpha", g.alpha);
  OnnxModelBuilder::AttrFloat(node, "beta", g.beta);
  OnnxModelBuilder::AttrInt(node, "transA", g.trans_a);
  OnnxModelBuilder::AttrInt(node, "transB", g.trans_b);
  return b.Save("gemm_" + g.Name());
}

class CompiledGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CompiledGemmTest, MatchesReference) {
  const GemmCase g = GetParam();
  ExpectMatchesReference("gemm_" + g.Name(), BuildGemm(g),
                         g.Batched() ? kBatches : std::vector<int64_t>{1});
}

std::vector<GemmCase> GemmCases() {
  std::vector<GemmCase> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float alpha : {1.0f, 0.5f}) {
        for (float beta : {1.0f, 2.5f}) {
          for (const char* c : {"none", "scalar", "n", "1n", "mn", "m1", "input"}) {
            if (c == std::string("none") && beta != 1.0f) continue;
            cases.push_back({ta, tb, alpha, beta, c});
          }
        }
      }
    }
  }
  cases.push_back({false, false, 1.0f, 0.0f, "n"});
  cases.push_back({false, false, 1.0f, 0.0f, "input"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Attributes, CompiledGemmTest, ::testing::ValuesIn(GemmCases()),
                         [](const auto& info) { return info.param.Name(); });

// --- Other models -------------------------------------------------------------

struct ModelCase {
  std::string name;
  std::function<OnnxModelBuilder()> build;
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

class CompiledModelCaseTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CompiledModelCaseTest, MatchesReference) {
  const ModelCase& c = GetParam();
  ExpectMatchesReference(c.name, c.build().Save(c.name), kBatches);
}

OnnxModelBuilder MatMulNdBiasRelu() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3, 16}).Output("y", {-1, 3, 8});
  b.Initializer("w", Random({16, 8}, 1)).Initializer("bias", Random({1, 8}, 2));
  b.Node("MatMul", {"x", "w"}, {"mm"});
  b.Node("Add", {"bias", "mm"}, {"biased"});  // bias first: order must not matter
  b.Node("Relu", {"biased"}, {"y"});
  return b;
}

OnnxModelBuilder MlpWithSharedActivation() {
  // mm's output feeds two nodes, so it cannot be fused with its Add.
  OnnxModelBuilder b;
  b.Input("x", {-1, 12}).Output("y", {-1, 6}).Output("z", {-1, 6});
  b.Initializer("w", Random({12, 6}, 3)).Initializer("bias", Random({6}, 4));
  b.Node("MatMul", {"x", "w"}, {"mm"});
  b.Node("Add", {"mm", "bias"}, {"y"});
  b.Node("Relu", {"mm"}, {"z"});
  return b;
}

OnnxModelBuilder AddBroadcasts() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 4, 5}).Input("row", {-1, 1, 5}).Input("col", {-1, 4, 1});
  for (const char* y : {"y1", "y2", "y3", "y4", "y5"}) b.Output(y, {-1, 4, 5});
  b.Initializer("c41", Random({4, 1}, 5)).Initializer("c5", Random({5}, 6));
  b.Initializer("c15", Random({1, 5}, 7));
  b.Node("Add", {"x", "c41"}, {"y1"});    // constant broadcast on the right
  b.Node("Add", {"c5", "x"}, {"y2"});     // on the left: swapped for oneDNN
  b.Node("Add", {"row", "x"}, {"y3"});    // two activations
  b.Node("Add", {"col", "c15"}, {"y4"});  // both broadcast: plain loop
  b.Node("Add", {"x", "x"}, {"y5"});
  return b;
}

OnnxModelBuilder Softmaxes(int64_t opset) {
  OnnxModelBuilder b(opset);
  b.Input("x", {-1, 4, 5})
      .Output("s1", {-1, 4, 5})
      .Output("s2", {-1, 4, 5})
      .Output("s3", {-1, 4, 5});
  auto& s1 = b.Node("Softmax", {"x"}, {"s1"});
  OnnxModelBuilder::AttrInt(s1, "axis", 1);
  auto& s2 = b.Node("Softmax", {"x"}, {"s2"});
  OnnxModelBuilder::AttrInt(s2, "axis", -1);
  b.Node("Softmax", {"x"}, {"s3"});  // default axis: 1 before opset 13, -1 from it
  return b;
}

OnnxModelBuilder ViewsAndCopies() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 2, 3, 4}).Output("y", {-1, 10}).Output("flat_in", {kUnknownDim, 12});
  b.Output("y_again", {-1, 10}).Output("r", {-1, 24});
  b.Int64Initializer("shape", {0, -1});
  b.Initializer("w", Random({24, 10}, 8));
  b.Node("Reshape", {"x", "shape"}, {"x2"});
  b.Node("MatMul", {"x2", "w"}, {"mm"});
  b.Node("Identity", {"mm"}, {"y"});
  auto& f = b.Node("Flatten", {"x"}, {"flat_in"});  // an output that is a view of an input
  OnnxModelBuilder::AttrInt(f, "axis", 2);
  b.Node("Identity", {"y"}, {"y_again"});  // two outputs sharing storage
  b.Node("Relu", {"x2"}, {"r"});           // a standalone Relu
  return b;
}

INSTANTIATE_TEST_SUITE_P(
    Models, CompiledModelCaseTest,
    ::testing::Values(ModelCase{"matmul_nd_bias_relu", MatMulNdBiasRelu},
                      ModelCase{"mlp_shared_activation", MlpWithSharedActivation},
                      ModelCase{"add_broadcasts", AddBroadcasts},
                      ModelCase{"softmax_opset13", [] { return Softmaxes(13); }},
                      ModelCase{"softmax_opset11", [] { return Softmaxes(11); }},
                      ModelCase{"views_and_copies", ViewsAndCopies}),
    [](const auto& info) { return info.param.name; });

TEST(CompiledModelTest, DefaultModelMatchesReference) {
  const std::string path = testing::GenerateDefaultModel();
  if (path.empty())
    NUMASERVE_MISSING_PREREQUISITE() << "no " << NUMASERVE_PYTHON << " with onnx to generate it";
  ExpectMatchesReference("fashion_classifier", path, kBatches);
  ExpectMatchesReference("fashion_classifier (1 thread)", path, {1, 7},
                         CompileOptions{.num_threads = 1});
}

// CompileOptions::weights_numa_node: the compile runs under that node's
// policy (the first node here: one node is all most machines have), the
// model runs as without it, and the calling thread's policy is its own
// again after the load; a node the machine lacks fails the load, naming it.
TEST(CompiledModelTest, WeightsNodeLoadsTheSameModelAndRestoresThePolicy) {
  const std::string path = testing::GenerateDefaultModel();
  if (path.empty())
    NUMASERVE_MISSING_PREREQUISITE() << "no " << NUMASERVE_PYTHON << " with onnx to generate it";
  const std::string before = affinity::DescribeMemoryPolicy();
  ExpectMatchesReference("fashion_classifier (weights on node 0, strict)", path, {1, 7},
                         CompileOptions{.weights_numa_node = 0, .weights_numa_strict = true});
  EXPECT_EQ(affinity::DescribeMemoryPolicy(), before);
  auto missing = CompiledModel::Load(path, CompileOptions{.weights_numa_node = 4000});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              ::testing::HasSubstr("cannot place the weights on NUMA node 4000: NUMA node 4000 "
                                   "does not exist on this machine"));
  EXPECT_EQ(affinity::DescribeMemoryPolicy(), before);
}

TEST(CompiledModelTest, DefaultModelIsFusedIntoFourSteps) {
  const std::string path = testing::GenerateDefaultModel();
  if (path.empty())
    NUMASERVE_MISSING_PREREQUISITE() << "no " << NUMASERVE_PYTHON << " with onnx to generate it";
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  // Flatten is a view; each Gemm/MatMul absorbs its bias Add and Relu.
  EXPECT_EQ((*model)->DescribePlan(),
            "matmul: fc1+relu1\n"
            "matmul: fc2+fc2_bias+relu2\n"
            "matmul: fc3\n"
            "softmax: softmax\n");
}

// oneDNN's jit convs run a second eltwise post-op of one algorithm with the
// first's parameters (kernels::CanAppendEltwise): two Clips with different
// bounds after a conv (the input spans about [-4, 4]) must not both become
// its post-ops.
TEST(CompiledModelTest, TwoClipsWithDifferentBoundsAfterAConvStayCorrect) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 16, 8, 8}).Output("y", {-1, 16, 8, 8});
  b.Initializer("w", Random({16, 16, 1, 1}, 5));
  b.Initializer("lo1", Tensor(Shape{}, {-2.0f}));
  b.Initializer("hi1", Tensor(Shape{}, {2.0f}));
  b.Initializer("lo2", Tensor(Shape{}, {-1.0f}));
  b.Initializer("hi2", Tensor(Shape{}, {0.5f}));
  b.Node("Conv", {"x", "w"}, {"c"}, "conv");
  b.Node("Clip", {"c", "lo1", "hi1"}, {"c1"}, "clip1");
  b.Node("Clip", {"c1", "lo2", "hi2"}, {"y"}, "clip2");
  const std::string path = b.Save("two_clips");
  ExpectMatchesReference("two clips", path, {1, 3});
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("conv: conv+clip1\n"));
}

TEST(CompiledModelTest, EltwisePostOpsRepeatAnAlgorithmOnlyWithItsParameters) {
  using kernels::EltwisePostOp;
  const std::vector<EltwisePostOp> chain = {{dnnl::algorithm::eltwise_clip_v2, 0.0f, 6.0f},
                                            {dnnl::algorithm::eltwise_linear, 2.0f, 0.0f}};
  EXPECT_TRUE(kernels::CanAppendEltwise(chain, {dnnl::algorithm::eltwise_relu, 0.0f, 0.0f}));
  EXPECT_TRUE(kernels::CanAppendEltwise(chain, {dnnl::algorithm::eltwise_clip_v2, 0.0f, 6.0f}));
  EXPECT_FALSE(kernels::CanAppendEltwise(chain, {dnnl::algorithm::eltwise_clip_v2, 0.0f, 5.0f}));
  EXPECT_FALSE(kernels::CanAppendEltwise(chain, {dnnl::algorithm::eltwise_linear, 0.5f, 0.0f}));
  EXPECT_TRUE(kernels::CanAppendEltwise({}, {dnnl::algorithm::eltwise_linear, 0.5f, 0.0f}));
}

// --- Errors -----------------------------------------------------------------

TEST(CompiledModelTest, LoadErrorsNameTheFile) {
  auto model = CompiledModel::Load("/nonexistent/m.onnx", {});
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("/nonexistent/m.onnx"));

  OnnxModelBuilder b;
  b.Input("x", {-1, 8}).Output("y", {-1, 8});
  b.Node("Hardmax", {"x"}, {"y"}, "hm1");
  model = CompiledModel::Load(b.Save("hardmax_load"), {});
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("(op Hardmax)"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("hm1"));

  EXPECT_FALSE(CompiledModel::Load(b.Save("bad_threads"), {.num_threads = -1}).ok());
}

TEST(CompiledModelTest, RuntimeWeightsRunOnABatchedMatMul) {
  OnnxModelBuilder b;
  b.Input("a", {2, 3}).Input("b", {3, 2}).Output("y", {2, 2});
  b.Node("MatMul", {"a", "b"}, {"y"}, "mm");
  auto model = CompiledModel::Load(b.Save("dyn_weights"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("batched_matmul: mm"));
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, w = {1, 0, 0, 1, 1, 1};
  std::vector<float> y(4, 0.0f);
  ASSERT_TRUE((*model)->Run(1, {a.data(), w.data()}, {y.data()}).ok());
  EXPECT_EQ(y, (std::vector<float>{4, 5, 10, 11}));
}

TEST(CompiledModelTest, RunValidatesItsArguments) {
  OnnxModelBuilder b;
  b.Input("x", {2, 3}).Output("y", {2, 3});
  b.Node("Relu", {"x"}, {"y"});
  auto model = CompiledModel::Load(b.Save("static_relu"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE((*model)->info().batched);
  std::vector<float> x(6, -1.0f), y(6, 5.0f);
  EXPECT_FALSE((*model)->Run(2, {x.data()}, {y.data()}).ok());  // not batched
  EXPECT_FALSE((*model)->Run(1, {}, {y.data()}).ok());
  EXPECT_FALSE((*model)->Run(1, {nullptr}, {y.data()}).ok());
  ASSERT_TRUE((*model)->Run(1, {x.data()}, {y.data()}).ok());
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
  EXPECT_EQ((*model)->OutputShapes(1), (std::vector<std::vector<int64_t>>{{2, 3}}));
}

}  // namespace
}  // namespace numaserve::engine
