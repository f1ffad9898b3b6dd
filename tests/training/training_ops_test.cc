// Gradient checks: every backward op against central finite differences of
// the forward, through TrainingNet (so the autodiff plumbing is checked too).
#include "training/training_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "absl/strings/str_split.h"
#include "engine/ops/op_registry.h"
#include "tests/training/graph_builder.h"
#include "training/conv_pool_ops.h"
#include "training/training_net.h"

namespace numaserve::training {
namespace {

using kernels::Shape;
using testing::GraphBuilder;

// loss = sum(logits * r) for a fixed random r, so d(loss)/d(logits) = r.
double Loss(TrainingNet& net, const Tensor& x, const Tensor& r) {
  absl::StatusOr<const Tensor*> y = net.Forward(x);
  EXPECT_TRUE(y.ok()) << y.status();
  double s = 0;
  for (int64_t i = 0; i < r.size(); ++i) s += static_cast<double>((*y)->data[i]) * r.data[i];
  return s;
}

// Normalized error ||numeric - analytic|| / ||analytic|| of one gradient.
double CheckOne(TrainingNet& net, const Tensor& x_in, const Tensor& r, std::vector<float>* values,
                const std::vector<float>& analytic, Tensor* x) {
  constexpr float kEps = 1e-2f;
  double err = 0, norm = 0;
  for (size_t i = 0; i < values->size(); ++i) {
    const float saved = (*values)[i];
    (*values)[i] = saved + kEps;
    const double plus = Loss(net, *x, r);
    (*values)[i] = saved - kEps;
    const double minus = Loss(net, *x, r);
    (*values)[i] = saved;
    const double numeric = (plus - minus) / (2 * kEps);
    err += (numeric - analytic[i]) * (numeric - analytic[i]);
    norm += static_cast<double>(analytic[i]) * analytic[i];
  }
  return std::sqrt(err / std::max(norm, 1e-12));
}

// Checks d(loss)/d(input) and d(loss)/d(every parameter).
// `spaced`: input values at least 0.05 apart (a shuffled ramp), so that
// finite differences never flip a max-pooling window's winner.
void GradCheck(engine::Graph graph, const Shape& input_shape, const std::string& what,
               bool spaced = false) {
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(std::move(graph), true);
  ASSERT_TRUE(net.ok()) << what << ": " << net.status();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor x(input_shape);
  for (float& v : x.data) v = u(rng);
  if (spaced) {
    for (int64_t i = 0; i < x.size(); ++i) x.data[i] = -1.0f + 0.05f * static_cast<float>(i);
    std::shuffle(x.data.begin(), x.data.end(), rng);
  }
  absl::StatusOr<const Tensor*> y = (*net)->Forward(x);
  ASSERT_TRUE(y.ok()) << what << ": " << y.status();
  Tensor r((*y)->shape);
  for (float& v : r.data) v = u(rng);
  const absl::Status backward = (*net)->Backward(r, nullptr);
  ASSERT_TRUE(backward.ok()) << what << ": " << backward;
  const std::vector<float> dx = (*net)->input_grad().data;
  std::vector<std::vector<float>> dparams;
  for (const Parameter& p : (*net)->parameters()) dparams.push_back(p.grad->data);

  Tensor x_work = x;
  EXPECT_LT(CheckOne(**net, x, r, &x_work.data, dx, &x_work), 2e-3) << what << ": input gradient";
  for (size_t i = 0; i < dparams.size(); ++i) {
    Parameter& p = (*net)->parameters()[i];
    EXPECT_LT(CheckOne(**net, x, r, &p.data->data, dparams[i], &x_work), 2e-3)
        << what << ": gradient of " << p.name;
  }
}

// The training table (training_ops.cc) names ops the engine imports: a
// model the trainer can run is one the server can load.
TEST(TrainingOpsTableTest, EveryTrainableOpIsARegisteredEngineOp) {
  const std::string list = TrainableOpsList();
  ASSERT_FALSE(list.empty());
  for (absl::string_view op : absl::StrSplit(list, ", ")) {
    EXPECT_NE(engine::FindOpSchema(op), nullptr) << "trainable op '" << op << "' is no engine op";
  }
}

TEST(GradCheckTest, GemmAllTransposesAlphaBetaAndBiasShapes) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (const Shape& bias : {Shape{5}, Shape{1, 5}, Shape{3, 5}, Shape{3, 1}}) {
        GraphBuilder b;
        b.Input("x").Output("y");
        b.Weight("w", tb ? Shape{5, 4} : Shape{4, 5}).Weight("c", bias);
        b.Node("Gemm", {"x", "w", "c"}, {"y"},
               {{"transA", int64_t{ta}}, {"transB", int64_t{tb}}, {"alpha", 0.7f}, {"beta", 1.3f}});
        GradCheck(b.Build(), ta ? Shape{4, 3} : Shape{3, 4},
                  "Gemm transA=" + std::to_string(ta) + " transB=" + std::to_string(tb) + " bias " +
                      kernels::ShapeToString(bias));
      }
    }
  }
}

TEST(GradCheckTest, GemmWithoutBias) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {4, 6});
  b.Node("Gemm", {"x", "w"}, {"y"});
  GradCheck(b.Build(), {2, 4}, "Gemm without C");
}

TEST(GradCheckTest, MatMulWithLeadingDims) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {4, 3});
  b.Node("MatMul", {"x", "w"}, {"y"});
  GradCheck(b.Build(), {2, 5, 4}, "MatMul [2,5,4] x [4,3]");
}

TEST(GradCheckTest, AddBroadcastsBothWays) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("row", {1, 4}).Weight("col", {3, 1});
  b.Node("Add", {"x", "row"}, {"a"});
  b.Node("Add", {"col", "a"}, {"y"});
  GradCheck(b.Build(), {3, 4}, "Add with broadcast");
}

TEST(GradCheckTest, Activations) {
  for (const char* op : {"Relu", "LeakyRelu", "Sigmoid", "Tanh"}) {
    GraphBuilder b;
    b.Input("x").Output("y").Weight("w", {4, 6});
    b.Node("MatMul", {"x", "w"}, {"h"});
    b.Node(op, {"h"}, {"y"},
           std::string(op) == "LeakyRelu"
               ? std::map<std::string, engine::AttributeValue>{{"alpha", 0.2f}}
               : std::map<std::string, engine::AttributeValue>{});
    GradCheck(b.Build(), {3, 4}, op);
  }
}

TEST(GradCheckTest, FlattenReshapeIdentity) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {12, 2}).Int64("shape", {0, 12});
  b.Node("Flatten", {"x"}, {"f"}, {{"axis", int64_t{1}}});
  b.Node("Reshape", {"f", "shape"}, {"r"});
  b.Node("Identity", {"r"}, {"i"});
  b.Node("MatMul", {"i", "w"}, {"y"});
  GradCheck(b.Build(), {2, 3, 2, 2}, "Flatten/Reshape/Identity");
}

TEST(GradCheckTest, InnerSoftmax) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {4, 5});
  b.Node("MatMul", {"x", "w"}, {"h"});
  b.Node("Softmax", {"h"}, {"s"}, {{"axis", int64_t{-1}}});
  b.Node("Identity", {"s"}, {"y"});
  GradCheck(b.Build(), {3, 4}, "Softmax (not final)");
}

// Conv, MaxPool and AveragePool are checked on both implementations.
const char* ImplementationName(conv_pool::Implementation impl) {
  return impl == conv_pool::Implementation::kOnednn ? " (oneDNN)" : " (reference)";
}

class ScopedImplementation {
 public:
  explicit ScopedImplementation(conv_pool::Implementation impl)
      : previous_(conv_pool::CurrentImplementation()) {
    conv_pool::SetImplementation(impl);
  }
  ~ScopedImplementation() { conv_pool::SetImplementation(previous_); }

 private:
  conv_pool::Implementation previous_;
};

constexpr conv_pool::Implementation kImplementations[] = {conv_pool::Implementation::kOnednn,
                                                          conv_pool::Implementation::kReference};

TEST(GradCheckTest, ConvStridesPadsDilationsGroupsBias) {
  using Attrs = std::map<std::string, engine::AttributeValue>;
  struct Case {
    const char* what;
    Shape x, w;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {"3x3 pad 1", {2, 2, 5, 5}, {3, 2, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"stride 2, asymmetric pads",
       {1, 2, 6, 5},
       {2, 2, 3, 2},
       {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{0, 1, 1, 0}}}},
      {"dilation 2", {1, 1, 7, 7}, {2, 1, 3, 3}, {{"dilations", std::vector<int64_t>{2, 2}}}},
      {"groups 2", {2, 4, 4, 4}, {6, 2, 2, 2}, {{"group", int64_t{2}}}},
      {"depthwise",
       {1, 3, 4, 4},
       {3, 1, 3, 3},
       {{"group", int64_t{3}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
  };
  for (conv_pool::Implementation impl : kImplementations) {
    ScopedImplementation scoped(impl);
    for (const Case& c : cases) {
      GraphBuilder b;
      b.Input("x").Output("y").Weight("w", c.w).Weight("bias", {c.w[0]});
      b.Node("Conv", {"x", "w", "bias"}, {"y"}, c.attrs);
      GradCheck(b.Build(), c.x, std::string("Conv ") + c.what + ImplementationName(impl));
    }
  }
}

TEST(GradCheckTest, Pooling) {
  using Attrs = std::map<std::string, engine::AttributeValue>;
  const Attrs k2s2 = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                      {"strides", std::vector<int64_t>{2, 2}}};
  const Attrs k3s2p1 = {{"kernel_shape", std::vector<int64_t>{3, 3}},
                        {"strides", std::vector<int64_t>{2, 2}},
                        {"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  for (conv_pool::Implementation impl : kImplementations) {
    ScopedImplementation scoped(impl);
    for (const Attrs& attrs : {k2s2, k3s2p1}) {
      GraphBuilder b;
      b.Input("x").Output("y");
      b.Node("MaxPool", {"x"}, {"y"}, attrs);
      GradCheck(b.Build(), {2, 2, 6, 6}, std::string("MaxPool") + ImplementationName(impl),
                /*spaced=*/true);
      for (int64_t count_pad : {0, 1}) {
        Attrs avg = attrs;
        avg["count_include_pad"] = count_pad;
        GraphBuilder a;
        a.Input("x").Output("y");
        a.Node("AveragePool", {"x"}, {"y"}, avg);
        GradCheck(a.Build(), {2, 2, 6, 6},
                  "AveragePool count_include_pad=" + std::to_string(count_pad) +
                      ImplementationName(impl));
      }
    }
  }
  GraphBuilder g;
  g.Input("x").Output("y");
  g.Node("GlobalAveragePool", {"x"}, {"y"});
  GradCheck(g.Build(), {2, 3, 4, 5}, "GlobalAveragePool");
}

TEST(GradCheckTest, BatchNormalizationTrainingMode) {
  for (conv_pool::Implementation impl : kImplementations) {
    ScopedImplementation scoped(impl);
    for (const Shape& x :
         {Shape{4, 3, 2, 2}, Shape{5, 3}, Shape{3, 3, 1, 1}, Shape{2, 3, 2, 1, 2}}) {
      GraphBuilder b;
      b.Input("x")
          .Output("y")
          .Weight("scale", {3})
          .Weight("bias", {3})
          .Weight("mean", {3})
          .Weight("var", {3});
      b.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"},
             {{"epsilon", 1e-3f}});
      GradCheck(b.Build(), x,
                "BatchNormalization " + kernels::ShapeToString(x) + ImplementationName(impl));
    }
  }
}

TEST(GradCheckTest, LayerNormalization) {
  for (conv_pool::Implementation impl : kImplementations) {
    ScopedImplementation scoped(impl);
    for (int64_t axis : {-1, 1}) {
      for (bool bias : {true, false}) {
        GraphBuilder b;
        const Shape normalized = axis == -1 ? Shape{4} : Shape{3, 4};
        b.Input("x").Output("y").Weight("scale", normalized);
        if (bias) b.Weight("bias", normalized);
        b.Node("LayerNormalization",
               bias ? std::vector<std::string>{"x", "scale", "bias"}
                    : std::vector<std::string>{"x", "scale"},
               {"y"}, {{"axis", axis}, {"epsilon", 1e-3f}});
        GradCheck(b.Build(), {2, 3, 4},
                  "LayerNormalization axis " + std::to_string(axis) +
                      (bias ? "" : " without bias") + ImplementationName(impl));
      }
    }
  }
}

TEST(GradCheckTest, DropoutTrainingMode) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {4, 5}).Weight("ratio", {}, {0.3f});
  b.Node("MatMul", {"x", "w"}, {"h"});
  b.Node("Dropout", {"h", "ratio"}, {"y"});
  GradCheck(b.Build(), {3, 4}, "Dropout");
}

TEST(DropoutTest, MaskRateModesStepsAndRankSlices) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("ratio", {}, {0.25f});
  b.Node("Dropout", {"x", "ratio"}, {"y"});
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(b.Build());
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_TRUE((*net)->parameters().empty());  // the ratio is not trained
  const Tensor ones({4, 1000}, std::vector<float>(4000, 1.0f));
  (*net)->SetDropoutContext(7, 3, 0);
  const std::vector<float> full = (**(*net)->Forward(ones)).data;
  int kept = 0;
  for (float v : full) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f) << v;
    kept += v != 0.0f;
  }
  EXPECT_NEAR(kept / 4000.0, 0.75, 0.03);
  // Rank 1 of 2 (rows 2 and 3 of the global batch) draws the same mask.
  (*net)->SetDropoutContext(7, 3, 2);
  const std::vector<float> half =
      (**(*net)->Forward(Tensor({2, 1000}, std::vector<float>(2000, 1.0f)))).data;
  EXPECT_TRUE(std::equal(half.begin(), half.end(), full.begin() + 2000));
  // Another step, another mask; inference mode is the identity.
  (*net)->SetDropoutContext(7, 4, 0);
  EXPECT_NE((**(*net)->Forward(ones)).data, full);
  EXPECT_EQ((**(*net)->Forward(ones, /*training=*/false)).data, ones.data);
}

TEST(LayerNormTest, HandComputed) {
  for (conv_pool::Implementation impl : kImplementations) {
    SCOPED_TRACE(ImplementationName(impl));
    ScopedImplementation scoped(impl);
    GraphBuilder b;
    b.Input("x").Output("y").Weight("scale", {2}).Weight("bias", {2});
    b.Node("LayerNormalization", {"x", "scale", "bias"}, {"y"}, {{"epsilon", 0.0f}});
    absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(b.Build());
    ASSERT_TRUE(net.ok());
    (*net)->parameters()[0].data->data = {2, 3};
    (*net)->parameters()[1].data->data = {10, 20};
    absl::StatusOr<const Tensor*> y = (*net)->Forward(Tensor({1, 2}, {1, 3}));  // mean 2, std 1
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_NEAR((*y)->data[0], -2 + 10, 1e-5);
    EXPECT_NEAR((*y)->data[1], 3 + 20, 1e-5);
  }
}

TEST(BatchNormTest, RunningStatisticsAndInferenceMode) {
  for (conv_pool::Implementation impl : kImplementations) {
    SCOPED_TRACE(ImplementationName(impl));
    ScopedImplementation scoped(impl);
    GraphBuilder b;
    b.Input("x")
        .Output("y")
        .Weight("scale", {1})
        .Weight("bias", {1})
        .Weight("mean", {1})
        .Weight("var", {1});
    b.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"},
           {{"epsilon", 0.0f}, {"momentum", 0.5f}});
    absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(b.Build());
    ASSERT_TRUE(net.ok()) << net.status();
    std::vector<Parameter>& p = (*net)->parameters();
    ASSERT_EQ(p.size(), 4u);
    EXPECT_TRUE(p[0].trainable);
    EXPECT_FALSE(p[2].trainable);  // running mean
    EXPECT_FALSE(p[3].trainable);  // running variance
    p[0].data->data = {2};
    p[1].data->data = {1};
    p[2].data->data = {0};
    p[3].data->data = {1};
    const Tensor x({4, 1}, {1, 3, 5, 7});  // mean 4, variance 5
    absl::StatusOr<const Tensor*> y = (*net)->Forward(x);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_NEAR((*y)->data[0], 2 * (1 - 4) / std::sqrt(5.0f) + 1, 1e-5);
    EXPECT_FLOAT_EQ(p[2].data->data[0], 0.5f * 0 + 0.5f * 4);
    EXPECT_FLOAT_EQ(p[3].data->data[0], 0.5f * 1 + 0.5f * 5);
    y = (*net)->Forward(x, /*training=*/false);  // running mean 2, variance 3
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_NEAR((*y)->data[3], 2 * (7 - 2) / std::sqrt(3.0f) + 1, 1e-5);
    EXPECT_FLOAT_EQ(p[2].data->data[0], 2.0f);  // unchanged in inference mode
  }
}

TEST(ConvForwardTest, HandComputed) {
  // 1x1x3x3 input, 2x2 all-ones kernel, bias 10: window sums + 10.
  for (conv_pool::Implementation impl : kImplementations) {
    ScopedImplementation scoped(impl);
    GraphBuilder b;
    b.Input("x").Output("y");
    engine::Graph graph = b.Weight("w", {1, 1, 2, 2})
                              .Weight("bias", {1})
                              .Node("Conv", {"x", "w", "bias"}, {"y"})
                              .Build();
    absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(std::move(graph));
    ASSERT_TRUE(net.ok()) << net.status();
    (*net)->parameters()[0].data->data = {1, 1, 1, 1};
    (*net)->parameters()[1].data->data = {10};
    absl::StatusOr<const Tensor*> y =
        (*net)->Forward(Tensor({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ((*y)->shape, (Shape{1, 1, 2, 2})) << ImplementationName(impl);
    EXPECT_EQ((*y)->data, (std::vector<float>{22, 26, 34, 38})) << ImplementationName(impl);
  }
}

TEST(TrainingNetTest, FinalSoftmaxIsFusedWithTheLoss) {
  GraphBuilder b;
  b.Input("x").Output("p").Weight("w", {4, 3}).Weight("bias", {3});
  b.Node("Gemm", {"x", "w", "bias"}, {"logits"});
  b.Node("Softmax", {"logits"}, {"p"}, {{"axis", int64_t{1}}});
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(b.Build());
  ASSERT_TRUE(net.ok()) << net.status();
  Tensor x({2, 4}, {1, 2, 3, 4, -1, 0, 1, 0});
  absl::StatusOr<const Tensor*> y = (*net)->Forward(x);
  ASSERT_TRUE(y.ok());
  // Logits, not probabilities: rows need not sum to 1.
  EXPECT_EQ((*y)->shape, (Shape{2, 3}));
  EXPECT_GT(std::abs((*y)->data[0] + (*y)->data[1] + (*y)->data[2] - 1.0f), 1e-3f);
  ASSERT_EQ((*net)->parameters().size(), 2u);
  EXPECT_EQ((*net)->parameters()[0].name, "w");
  EXPECT_EQ((*net)->parameters()[1].name, "bias");
}

TEST(GradCheckTest, BroadcastingSubMulDiv) {
  for (const char* op : {"Sub", "Mul", "Div"}) {
    GraphBuilder b;
    // Divisors in [2, 3] keep Div's finite differences well-conditioned.
    b.Input("x").Output("y").Weight("row", {1, 4}).Weight("col", {3, 1}, {2.0f, 2.5f, 3.0f});
    b.Node(op, {"x", "row"}, {"a"});
    b.Node(op, {"a", "col"}, {"y"});
    GradCheck(b.Build(), {3, 4}, op);
  }
}

TEST(GradCheckTest, GeluFromErf) {
  // GELU as ONNX exporters write it: 0.5 * x * (1 + Erf(x / sqrt(2))).
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {4, 4});
  b.Weight("half", {1}, {0.5f}).Weight("one", {1}, {1.0f}).Weight("sqrt2", {1}, {1.41421356f});
  engine::Graph graph = b.Node("MatMul", {"x", "w"}, {"h"})
                            .Node("Div", {"h", "sqrt2"}, {"h1"})
                            .Node("Erf", {"h1"}, {"e"})
                            .Node("Add", {"e", "one"}, {"e1"})
                            .Node("Mul", {"h", "e1"}, {"m"})
                            .Node("Mul", {"m", "half"}, {"y"})
                            .Build();
  GradCheck(std::move(graph), {3, 4}, "GELU (Div, Erf, Add, Mul)");
}

TEST(TrainingNetTest, UnsupportedOpIsNamed) {
  GraphBuilder b;
  b.Input("x").Output("y");
  b.Node("Erfc", {"x"}, {"y"});
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(b.Build());
  ASSERT_FALSE(net.ok());
  EXPECT_NE(net.status().message().find("node 'y' (op Erfc)"), std::string::npos) << net.status();
}

TEST(TrainingNetTest, ReadyCallbackFiresOncePerParameter) {
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w1", {4, 4}).Weight("w2", {4, 2});
  b.Node("MatMul", {"x", "w1"}, {"h"});
  b.Node("MatMul", {"h", "w1"}, {"h2"});  // w1 used twice: ready after its first use's backward
  b.Node("MatMul", {"h2", "w2"}, {"y"});
  absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(b.Build());
  ASSERT_TRUE(net.ok());
  ASSERT_TRUE((*net)->Forward(Tensor({1, 4}, {1, 2, 3, 4})).ok());
  std::vector<int> order;
  ASSERT_TRUE((*net)->Backward(Tensor({1, 2}, {1, 1}), [&](int p) { order.push_back(p); }).ok());
  EXPECT_EQ(order, (std::vector<int>{1, 0}));  // w2 first, then w1 once
}

TEST(SoftmaxCrossEntropyTest, LossGradientAndAccuracy) {
  Tensor logits({2, 3}, {1, 2, 3, 0, 0, 0});
  const uint8_t labels[2] = {2, 1};
  Tensor grad;
  LossResult r = SoftmaxCrossEntropy(logits, labels, 0.5f, &grad);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(r.loss_sum, (std::log(z) - 3.0) + std::log(3.0), 1e-5);
  EXPECT_EQ(r.correct, 1);  // row 1 is a tie; arg-max picks class 0
  EXPECT_NEAR(grad.data[2], 0.5 * (std::exp(3.0) / z - 1), 1e-6);
  EXPECT_NEAR(grad.data[3], 0.5 / 3, 1e-6);
  EXPECT_NEAR(grad.data[4], 0.5 * (1.0 / 3 - 1), 1e-6);
}

}  // namespace
}  // namespace numaserve::training
