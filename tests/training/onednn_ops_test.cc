// The oneDNN training primitives (kernels/onednn/training_onednn.h: Conv,
// MaxPool, AveragePool, BatchNormalization, LayerNormalization) against
// the training ops' reference loops: forward, dX, dW and dB over many
// geometries (for BatchNormalization also the running statistics),
// gradients added to what the buffers already hold, and whole nets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/dispatch.h"
#include "kernels/onednn/training_onednn.h"
#include "tests/training/graph_builder.h"
#include "training/batch_norm_op.h"
#include "training/conv_pool_ops.h"
#include "training/layer_norm_op.h"
#include "training/training_net.h"
#include "training/training_ops.h"

namespace numaserve::training {
namespace {

using Attrs = std::map<std::string, engine::AttributeValue>;
using conv_pool::Implementation;
using kernels::Shape;
using testing::GraphBuilder;

class ScopedImplementation {
 public:
  explicit ScopedImplementation(Implementation impl)
      : previous_(conv_pool::CurrentImplementation()) {
    conv_pool::SetImplementation(impl);
  }
  ~ScopedImplementation() { conv_pool::SetImplementation(previous_); }

 private:
  Implementation previous_;
};

Tensor Random(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t(shape);
  for (float& v : t.data) v = u(rng);
  return t;
}

// Distinct values (a shuffled ramp), so that no max-pooling window has a tie.
Tensor Distinct(const Shape& shape, uint32_t seed) {
  Tensor t(shape);
  for (int64_t i = 0; i < t.size(); ++i) t.data[i] = 1e-3f * static_cast<float>(i);
  std::shuffle(t.data.begin(), t.data.end(), std::mt19937(seed));
  return t;
}

// max |a - b| / max(1, max |b|).
double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return diff / scale;
}

// One op's forward output and input gradients. The gradient buffers start
// from `seed`-derived values: backward must add to them.
struct OpResult {
  Tensor y;
  std::vector<Tensor> grads;
};

OpResult RunOp(const engine::Graph& graph, const std::vector<Tensor>& inputs, const Tensor& dy,
               Implementation impl, bool training = true, bool bf16 = false) {
  ScopedImplementation scoped(impl);
  ScopedTrainingContext context({.training = training, .bf16 = bf16});
  const engine::Node& node = graph.nodes()[0];
  const TrainingOp* op = FindTrainingOp(node.op_type);
  OpResult r;
  std::vector<const Tensor*> in;
  for (const Tensor& t : inputs) in.push_back(&t);
  std::vector<Tensor*> out = {&r.y};
  absl::Status s = op->forward(graph, node, in, out);
  EXPECT_TRUE(s.ok()) << s;
  if (dy.data.empty()) return r;  // forward only
  for (size_t i = 0; i < inputs.size(); ++i) r.grads.push_back(Random(inputs[i].shape, 100 + i));
  std::vector<const Tensor*> outs = {&r.y}, gouts = {&dy};
  std::vector<Tensor*> gins;
  for (Tensor& g : r.grads) gins.push_back(&g);
  s = op->backward(graph, node, in, outs, gouts, gins);
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

void ExpectSame(const OpResult& onednn, const OpResult& reference, const std::string& what,
                const std::vector<std::string>& names) {
  EXPECT_EQ(onednn.y.shape, reference.y.shape) << what;
  EXPECT_LT(RelativeDifference(onednn.y.data, reference.y.data), 1e-5) << what << ": forward";
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_LT(RelativeDifference(onednn.grads[i].data, reference.grads[i].data), 1e-5)
        << what << ": " << names[i];
  }
}

struct ConvCase {
  const char* what;
  Shape x, w;
  Attrs attrs;
  bool bias = true;
};

// One Conv case's graph, random inputs and output gradient, and what the
// reference computes from them.
struct ConvRun {
  engine::Graph graph;
  std::vector<Tensor> inputs;
  Tensor dy;
  OpResult ref;

  explicit ConvRun(const ConvCase& c) {
    GraphBuilder b;
    b.Input("x").Output("y").Weight("w", c.w);
    if (c.bias) b.Weight("bias", {c.w[0]});
    b.Node("Conv",
           c.bias ? std::vector<std::string>{"x", "w", "bias"} : std::vector<std::string>{"x", "w"},
           {"y"}, c.attrs);
    graph = b.Build();
    inputs = {Random(c.x, 1), Random(c.w, 2)};
    if (c.bias) inputs.push_back(Random({c.w[0]}, 3));
    const OpResult shape_only = RunOp(graph, inputs, Tensor(), Implementation::kReference);
    dy = Random(shape_only.y.shape, 4);
    ref = RunOp(graph, inputs, dy, Implementation::kReference);
  }
};

TEST(OnednnTrainingOpsTest, ConvMatchesReference) {
  const int64_t fallbacks = conv_pool::ReferenceFallbacks();
  const std::vector<ConvCase> cases = {
      {"3x3 pad 1", {4, 3, 8, 8}, {8, 3, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"first layer of the CNN (1 channel)",
       {8, 1, 28, 28},
       {32, 1, 3, 3},
       {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"second layer of the CNN (32 -> 64)",
       {4, 32, 14, 14},
       {64, 32, 3, 3},
       {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"stride 2, asymmetric pads, no bias",
       {3, 5, 9, 8},
       {7, 5, 3, 2},
       {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{0, 1, 1, 0}}},
       false},
      {"stride 2, 16 channels",
       {2, 16, 12, 12},
       {32, 16, 3, 3},
       {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"dilation 2", {2, 4, 11, 11}, {6, 4, 3, 3}, {{"dilations", std::vector<int64_t>{2, 2}}}},
      {"groups 2", {2, 8, 6, 6}, {12, 4, 3, 3}, {{"group", int64_t{2}}}},
      {"groups 4, stride 2, pad 1",
       {2, 32, 10, 10},
       {32, 8, 3, 3},
       {{"group", int64_t{4}},
        {"strides", std::vector<int64_t>{2, 2}},
        {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"depthwise, pad 1",
       {3, 16, 9, 9},
       {16, 1, 3, 3},
       {{"group", int64_t{16}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"depthwise, stride 2",
       {2, 3, 8, 8},
       {3, 1, 3, 3},
       {{"group", int64_t{3}},
        {"strides", std::vector<int64_t>{2, 2}},
        {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"depthwise multiplier 2", {2, 4, 7, 7}, {8, 1, 3, 3}, {{"group", int64_t{4}}}},
      {"1x1", {2, 24, 5, 5}, {16, 24, 1, 1}, {}},
      {"5x5 pad 2", {1, 6, 10, 10}, {10, 6, 5, 5}, {{"pads", std::vector<int64_t>{2, 2, 2, 2}}}},
  };
  for (const ConvCase& c : cases) {
    const ConvRun run(c);
    const engine::Graph& graph = run.graph;
    const std::vector<Tensor>& inputs = run.inputs;
    const Tensor& dy = run.dy;
    const OpResult& ref = run.ref;
    const OpResult dnn = RunOp(graph, inputs, dy, Implementation::kOnednn);
    ExpectSame(
        dnn, ref, std::string("Conv ") + c.what,
        c.bias ? std::vector<std::string>{"dX", "dW", "dB"} : std::vector<std::string>{"dX", "dW"});
    // The same primitives again (cached) give the same results, also when
    // backward cannot reuse what a training forward keeps.
    const OpResult again = RunOp(graph, inputs, dy, Implementation::kOnednn);
    EXPECT_EQ(again.y.data, dnn.y.data) << c.what;
    EXPECT_EQ(again.grads[1].data, dnn.grads[1].data) << c.what;
    const OpResult infer = RunOp(graph, inputs, dy, Implementation::kOnednn, /*training=*/false);
    EXPECT_EQ(infer.y.data, dnn.y.data) << c.what;
    for (size_t i = 0; i < dnn.grads.size(); ++i)
      EXPECT_EQ(infer.grads[i].data, dnn.grads[i].data) << c.what << " after inference mode";
  }
  EXPECT_EQ(conv_pool::ReferenceFallbacks(), fallbacks) << "oneDNN rejected a geometry";
}

// Mixed precision: the convolutions read BF16 copies of x, w and dy and
// accumulate in FP32, so results stay within BF16's rounding (8 bits of
// mantissa) of the FP32 reference, yet differ from FP32's.
TEST(OnednnTrainingOpsTest, Bf16ConvWithinBf16RoundingOfReference) {
  if (!kernels::GetBf16Support().native) {
    GTEST_SKIP() << "no native BF16 path: " << kernels::GetBf16Support().reason;
  }
  const std::vector<ConvCase> cases = {
      {"second layer of the CNN (32 -> 64)",
       {8, 32, 14, 14},
       {64, 32, 3, 3},
       {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"first layer of the CNN (1 channel)",
       {8, 1, 28, 28},
       {32, 1, 3, 3},
       {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {"stride 2, 16 channels, no bias",
       {2, 16, 12, 12},
       {32, 16, 3, 3},
       {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}},
       false},
      {"1x1", {2, 64, 5, 5}, {32, 64, 1, 1}, {}},
  };
  for (const ConvCase& c : cases) {
    const ConvRun run(c);
    const engine::Graph& graph = run.graph;
    const std::vector<Tensor>& inputs = run.inputs;
    const Tensor& dy = run.dy;
    const OpResult& ref = run.ref;
    const kernels::training_onednn::Bf16ConvPrimitives before =
        kernels::training_onednn::Bf16ConvPrimitiveCounts();
    const OpResult bf16 = RunOp(graph, inputs, dy, Implementation::kOnednn, true, /*bf16=*/true);
    const kernels::training_onednn::Bf16ConvPrimitives after =
        kernels::training_onednn::Bf16ConvPrimitiveCounts();
    // Forward, backward data and backward weights: three primitives, each
    // in BF16 or (where oneDNN has only a reference BF16 kernel) FP32.
    EXPECT_EQ((after.bf16 - before.bf16) + (after.fp32_instead - before.fp32_instead), 3) << c.what;
    const std::vector<std::string> names =
        c.bias ? std::vector<std::string>{"dX", "dW", "dB"} : std::vector<std::string>{"dX", "dW"};
    EXPECT_LT(RelativeDifference(bf16.y.data, ref.y.data), 2e-2) << c.what << ": forward";
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_LT(RelativeDifference(bf16.grads[i].data, ref.grads[i].data), 2e-2)
          << c.what << ": " << names[i];
    }
    if (after.fp32_instead == before.fp32_instead) {
      // All three in BF16: the rounding shows (an FP32 run would agree to 1e-5).
      EXPECT_GT(RelativeDifference(bf16.y.data, ref.y.data), 1e-5) << c.what << ": forward";
      EXPECT_GT(RelativeDifference(bf16.grads[0].data, ref.grads[0].data), 1e-5)
          << c.what << ": dX";
      EXPECT_GT(RelativeDifference(bf16.grads[1].data, ref.grads[1].data), 1e-5)
          << c.what << ": dW";
    }
    // The FP32 primitives of the same node are not the BF16 ones.
    const OpResult fp32 = RunOp(graph, inputs, dy, Implementation::kOnednn);
    EXPECT_LT(RelativeDifference(fp32.y.data, ref.y.data), 1e-5) << c.what;
  }
  // The CNN's main layer (32 -> 64, 3x3) has oneDNN BF16 kernels on every
  // CPU with a native BF16 path.
  const kernels::training_onednn::Bf16ConvPrimitives counts =
      kernels::training_onednn::Bf16ConvPrimitiveCounts();
  EXPECT_GE(counts.bf16, 3);
}

TEST(OnednnTrainingOpsTest, ConvWithoutSomeGradients) {
  // Only dW (the first layer of a net, whose input needs no gradient), and
  // only dX and dB: the others stay untouched.
  GraphBuilder b;
  b.Input("x").Output("y").Weight("w", {8, 4, 3, 3}).Weight("bias", {8});
  b.Node("Conv", {"x", "w", "bias"}, {"y"}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const engine::Graph graph = b.Build();
  const engine::Node& node = graph.nodes()[0];
  const std::vector<Tensor> inputs = {Random({2, 4, 6, 6}, 1), Random({8, 4, 3, 3}, 2),
                                      Random({8}, 3)};
  const Tensor dy = Random({2, 8, 6, 6}, 4);
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<Tensor> results[2];
    for (Implementation impl : {Implementation::kReference, Implementation::kOnednn}) {
      ScopedImplementation scoped(impl);
      Tensor y;
      std::vector<const Tensor*> in = {&inputs[0], &inputs[1], &inputs[2]};
      std::vector<Tensor*> out = {&y};
      ASSERT_TRUE(FindTrainingOp("Conv")->forward(graph, node, in, out).ok());
      std::vector<Tensor> grads = {Random({2, 4, 6, 6}, 5), Random({8, 4, 3, 3}, 6),
                                   Random({8}, 7)};
      std::vector<Tensor*> gins;
      for (int i = 0; i < 3; ++i) gins.push_back((mask >> i) & 1 ? &grads[i] : nullptr);
      std::vector<const Tensor*> outs = {&y}, gouts = {&dy};
      ASSERT_TRUE(FindTrainingOp("Conv")->backward(graph, node, in, outs, gouts, gins).ok());
      results[impl == Implementation::kOnednn] = grads;
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(RelativeDifference(results[1][i].data, results[0][i].data), 1e-5)
          << "mask " << mask << " gradient " << i;
      if (((mask >> i) & 1) == 0) {
        EXPECT_EQ(results[1][i].data, Random(results[1][i].shape, 5 + i).data)
            << "mask " << mask << " gradient " << i << " changed";
      }
    }
  }
}

struct PoolCase {
  const char* what;
  const char* op;
  Shape x;
  Attrs attrs;
};

TEST(OnednnTrainingOpsTest, PoolingMatchesReference) {
  const int64_t fallbacks = conv_pool::ReferenceFallbacks();
  const auto ints = [](std::vector<int64_t> v) { return engine::AttributeValue(v); };
  const std::vector<PoolCase> cases = {
      {"2x2 stride 2 (the CNN's)",
       "MaxPool",
       {4, 32, 28, 28},
       {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}}},
      {"2x2 stride 2, odd input",
       "MaxPool",
       {2, 3, 7, 9},
       {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}}},
      {"3x3 stride 2 pad 1",
       "MaxPool",
       {2, 5, 9, 9},
       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}}},
      {"3x3 stride 1 asymmetric pads",
       "MaxPool",
       {1, 17, 6, 7},
       {{"kernel_shape", ints({3, 3})}, {"pads", ints({0, 1, 2, 1})}}},
      {"2x2 dilation 2",
       "MaxPool",
       {2, 4, 8, 8},
       {{"kernel_shape", ints({2, 2})}, {"dilations", ints({2, 2})}}},
      {"2x2 stride 2",
       "AveragePool",
       {4, 32, 28, 28},
       {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}}},
      {"3x3 stride 2 pad 1, pads excluded",
       "AveragePool",
       {2, 5, 9, 9},
       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}}},
      {"3x3 stride 2 pad 1, pads counted",
       "AveragePool",
       {2, 5, 9, 9},
       {{"kernel_shape", ints({3, 3})},
        {"strides", ints({2, 2})},
        {"pads", ints({1, 1, 1, 1})},
        {"count_include_pad", int64_t{1}}}},
      {"3x2 asymmetric pads counted",
       "AveragePool",
       {1, 16, 7, 6},
       {{"kernel_shape", ints({3, 2})},
        {"pads", ints({1, 0, 2, 1})},
        {"count_include_pad", int64_t{1}}}},
  };
  for (const PoolCase& c : cases) {
    GraphBuilder b;
    b.Input("x").Output("y");
    b.Node(c.op, {"x"}, {"y"}, c.attrs);
    const engine::Graph graph = b.Build();
    const std::vector<Tensor> inputs = {Distinct(c.x, 1)};
    const OpResult shape_only = RunOp(graph, inputs, Tensor(), Implementation::kReference);
    const Tensor dy = Random(shape_only.y.shape, 4);
    const std::string what = std::string(c.op) + " " + c.what;
    const OpResult ref = RunOp(graph, inputs, dy, Implementation::kReference);
    const OpResult dnn = RunOp(graph, inputs, dy, Implementation::kOnednn);
    ExpectSame(dnn, ref, what, {"dX"});
    // Backward after an inference-mode forward recomputes what it needs.
    const OpResult infer = RunOp(graph, inputs, dy, Implementation::kOnednn, /*training=*/false);
    ExpectSame(infer, ref, what + " after inference mode", {"dX"});
  }
  EXPECT_EQ(conv_pool::ReferenceFallbacks(), fallbacks) << "oneDNN rejected a geometry";
}

// Forward and backward of whole nets (every parameter's gradient and the
// input's), oneDNN against the reference.
void ExpectNetsAgree(const engine::Graph& graph, const Shape& input, const std::string& what) {
  std::vector<std::vector<float>> grads[2];
  std::vector<float> logits[2];
  for (Implementation impl : {Implementation::kReference, Implementation::kOnednn}) {
    ScopedImplementation scoped(impl);
    absl::StatusOr<std::unique_ptr<TrainingNet>> net = TrainingNet::Create(graph, true);
    ASSERT_TRUE(net.ok()) << net.status();
    const int k = impl == Implementation::kOnednn;
    // Two steps: the second runs on cached primitives and kept workspaces.
    for (int step = 0; step < 2; ++step) {
      absl::StatusOr<const Tensor*> y = (*net)->Forward(Random(input, 10 + step));
      ASSERT_TRUE(y.ok()) << y.status();
      logits[k] = (*y)->data;
      ASSERT_TRUE((*net)->Backward(Random((*y)->shape, 20 + step), nullptr).ok());
    }
    grads[k].clear();
    grads[k].push_back((*net)->input_grad().data);
    for (const Parameter& p : (*net)->parameters()) grads[k].push_back(p.grad->data);
  }
  EXPECT_LT(RelativeDifference(logits[1], logits[0]), 1e-4) << what << ": logits";
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_LT(RelativeDifference(grads[1][i], grads[0][i]), 1e-4) << what << ": gradient " << i;
}

TEST(OnednnTrainingOpsTest, FashionCnnShapedNetAgrees) {
  const Attrs pad1 = {{"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  const Attrs pool = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                      {"strides", std::vector<int64_t>{2, 2}}};
  GraphBuilder b;
  b.Input("x").Output("y");
  b.Weight("w1", {8, 1, 3, 3}).Weight("b1", {8}).Weight("w2", {16, 8, 3, 3}).Weight("b2", {16});
  b.Weight("w3", {10, 16 * 7 * 7});
  b.Node("Conv", {"x", "w1", "b1"}, {"c1"}, pad1)
      .Node("Relu", {"c1"}, {"r1"})
      .Node("MaxPool", {"r1"}, {"p1"}, pool)
      .Node("Conv", {"p1", "w2", "b2"}, {"c2"}, pad1)
      .Node("Relu", {"c2"}, {"r2"})
      .Node("MaxPool", {"r2"}, {"p2"}, pool)
      .Node("Flatten", {"p2"}, {"f"}, {{"axis", int64_t{1}}})
      .Node("Gemm", {"f", "w3"}, {"y"}, {{"transB", int64_t{1}}});
  ExpectNetsAgree(b.Build(), {4, 1, 28, 28}, "CNN");
}

TEST(OnednnTrainingOpsTest, SameGeometryTwiceInOneNetAgrees) {
  // Two max pools of one geometry share primitives but not workspaces; the
  // input feeds two convolutions, so its gradient is the sum of both.
  const Attrs pool = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                      {"strides", std::vector<int64_t>{2, 2}}};
  GraphBuilder b;
  b.Input("x").Output("y").Weight("wa", {4, 3, 3, 3}).Weight("wb", {4, 3, 3, 3});
  b.Node("Conv", {"x", "wa"}, {"a"})
      .Node("Conv", {"x", "wb"}, {"b"})
      .Node("MaxPool", {"a"}, {"pa"}, pool)
      .Node("MaxPool", {"b"}, {"pb"}, pool)
      .Node("Add", {"pa", "pb"}, {"y"});
  ExpectNetsAgree(b.Build(), {2, 3, 10, 10}, "shared geometry");
}

// BatchNormalization inputs: x, scale, bias, running mean, running
// variance (positive). x is offset per seed so that the means are not ~0.
std::vector<Tensor> BatchNormInputs(const Shape& x, uint32_t seed) {
  const int64_t c = x[1];
  Tensor data = Random(x, seed);
  for (float& v : data.data) v = 2.0f * v + 0.5f;
  Tensor var = Random({c}, seed + 4);
  for (float& v : var.data) v = 1.0f + 0.5f * v;
  return {data, Random({c}, seed + 1), Random({c}, seed + 2), Random({c}, seed + 3), var};
}

engine::Graph BatchNormGraph(int64_t c, float epsilon, float momentum) {
  GraphBuilder b;
  b.Input("x")
      .Output("y")
      .Weight("scale", {c})
      .Weight("bias", {c})
      .Weight("mean", {c})
      .Weight("var", {c});
  b.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"},
         {{"epsilon", epsilon}, {"momentum", momentum}});
  return b.Build();
}

TEST(OnednnTrainingOpsTest, BatchNormMatchesReference) {
  const int64_t fallbacks = batch_norm::ReferenceFallbacks();
  const std::vector<Shape> shapes = {{4, 3, 5, 5},   {8, 16, 1, 1},   {6, 1, 4, 4},
                                     {2, 256, 3, 3}, {1, 8, 7, 7},    {32, 64},
                                     {7, 1},         {2, 4, 3, 2, 2}, {16, 32, 14, 14},
                                     {4, 24, 5, 5},  {3, 17, 2, 3},   {2, 40, 1, 1}};
  for (const Shape& x : shapes) {
    for (bool training : {true, false}) {
      const std::string what = "BatchNormalization " + kernels::ShapeToString(x) +
                               (training ? " training" : " inference");
      const engine::Graph graph = BatchNormGraph(x[1], 1e-3f, 0.8f);
      const Tensor dy = training ? Random(x, 9) : Tensor();
      std::vector<Tensor> inputs[2];
      OpResult results[2];
      for (Implementation impl : {Implementation::kReference, Implementation::kOnednn}) {
        const int k = impl == Implementation::kOnednn;
        inputs[k] = BatchNormInputs(x, 1);
        results[k] = RunOp(graph, inputs[k], dy, impl, training);
      }
      ExpectSame(results[1], results[0], what,
                 training ? std::vector<std::string>{"dX", "dScale", "dBias"}
                          : std::vector<std::string>{});
      // The running statistics (updated in place in training mode only).
      for (int i : {3, 4}) {
        EXPECT_LT(RelativeDifference(inputs[1][i].data, inputs[0][i].data), 1e-5)
            << what << ": running " << (i == 3 ? "mean" : "variance");
      }
      if (training) {
        EXPECT_NE(inputs[1][3].data, BatchNormInputs(x, 1)[3].data) << what;
      } else {
        EXPECT_EQ(inputs[1][4].data, BatchNormInputs(x, 1)[4].data) << what;
      }
    }
  }
  EXPECT_EQ(batch_norm::ReferenceFallbacks(), fallbacks) << "oneDNN rejected a shape";
}

TEST(OnednnTrainingOpsTest, BatchNormBackwardWithoutItsForwardAndSomeGradients) {
  // Backward of an x other than the last forward's recomputes the batch
  // statistics; gradients not asked for stay untouched. 6 channels run on
  // plain NCHW, 32 on channel blocks.
  for (int64_t c : {6, 32}) {
    const Shape shape = {4, c, 3, 3};
    const engine::Graph graph = BatchNormGraph(c, 1e-5f, 0.9f);
    const engine::Node& node = graph.nodes()[0];
    const std::vector<Tensor> other = BatchNormInputs(shape, 30);
    const Tensor dy = Random(shape, 8);
    for (int mask = 1; mask < 8; ++mask) {
      std::vector<Tensor> results[2];
      for (Implementation impl : {Implementation::kReference, Implementation::kOnednn}) {
        ScopedImplementation scoped(impl);
        ScopedTrainingContext context({.training = true});
        std::vector<Tensor> inputs = BatchNormInputs(shape, 1);
        Tensor y;
        std::vector<Tensor*> out = {&y};
        std::vector<const Tensor*> other_in = {&other[0], &inputs[1], &inputs[2], &inputs[3],
                                               &inputs[4]};
        ASSERT_TRUE(FindTrainingOp("BatchNormalization")->forward(graph, node, other_in, out).ok());
        std::vector<const Tensor*> in = {&inputs[0], &inputs[1], &inputs[2], &inputs[3],
                                         &inputs[4]};
        std::vector<Tensor> grads = {Random(shape, 5), Random({c}, 6), Random({c}, 7)};
        std::vector<Tensor*> gins;
        for (int i = 0; i < 3; ++i) gins.push_back((mask >> i) & 1 ? &grads[i] : nullptr);
        gins.push_back(nullptr);
        gins.push_back(nullptr);
        std::vector<const Tensor*> outs = {&y}, gouts = {&dy};
        absl::Status s =
            FindTrainingOp("BatchNormalization")->backward(graph, node, in, outs, gouts, gins);
        ASSERT_TRUE(s.ok()) << s;
        results[impl == Implementation::kOnednn] = grads;
      }
      for (int i = 0; i < 3; ++i) {
        EXPECT_LT(RelativeDifference(results[1][i].data, results[0][i].data), 1e-5)
            << c << " channels, mask " << mask << " gradient " << i;
        if (((mask >> i) & 1) == 0) {
          EXPECT_EQ(results[1][i].data, Random(results[1][i].shape, 5 + i).data)
              << c << " channels, mask " << mask << " gradient " << i << " changed";
        }
      }
    }
  }
}

TEST(OnednnTrainingOpsTest, ConvBatchNormNetAgrees) {
  const Attrs pad1 = {{"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  GraphBuilder b;
  b.Input("x").Output("y");
  b.Weight("w1", {16, 3, 3, 3}).Weight("s1", {16}).Weight("b1", {16}).Weight("m1", {16});
  b.Weight("v1", {16}).Weight("w2", {10, 16 * 6 * 6});
  b.Node("Conv", {"x", "w1"}, {"c1"}, pad1)
      .Node("BatchNormalization", {"c1", "s1", "b1", "m1", "v1"}, {"n1"})
      .Node("Relu", {"n1"}, {"r1"})
      .Node("Flatten", {"r1"}, {"f"}, {{"axis", int64_t{1}}})
      .Node("Gemm", {"f", "w2"}, {"y"}, {{"transB", int64_t{1}}});
  ExpectNetsAgree(b.Build(), {4, 3, 6, 6}, "Conv + BatchNormalization");
}

TEST(OnednnTrainingOpsTest, LayerNormMatchesReference) {
  const int64_t fallbacks = layer_norm::ReferenceFallbacks();
  struct Case {
    Shape x;
    int64_t axis;
    bool bias;
  };
  const std::vector<Case> cases = {{{4, 16}, -1, true},      {{2, 3, 8}, -1, true},
                                   {{2, 3, 8}, 1, true},     {{8, 32, 256}, -1, true},
                                   {{5, 1}, -1, true},       {{3, 7}, -1, false},
                                   {{2, 2, 3, 5}, 2, false}, {{6, 768}, -1, true}};
  for (const Case& c : cases) {
    const std::string what = "LayerNormalization " + kernels::ShapeToString(c.x) + " axis " +
                             std::to_string(c.axis) + (c.bias ? "" : " without bias");
    const int64_t first = c.axis < 0 ? static_cast<int64_t>(c.x.size()) + c.axis : c.axis;
    const Shape normalized(c.x.begin() + first, c.x.end());
    GraphBuilder b;
    b.Input("x").Output("y").Weight("scale", normalized);
    if (c.bias) b.Weight("bias", normalized);
    b.Node("LayerNormalization",
           c.bias ? std::vector<std::string>{"x", "scale", "bias"}
                  : std::vector<std::string>{"x", "scale"},
           {"y"}, {{"axis", c.axis}, {"epsilon", 1e-5f}});
    const engine::Graph graph = b.Build();
    Tensor x = Random(c.x, 1);
    for (float& v : x.data) v = 3.0f * v + 1.0f;
    std::vector<Tensor> inputs = {x, Random(normalized, 2)};
    if (c.bias) inputs.push_back(Random(normalized, 3));
    const Tensor dy = Random(c.x, 4);
    std::vector<std::string> names = {"dX", "dScale"};
    if (c.bias) names.push_back("dBias");
    ExpectSame(RunOp(graph, inputs, dy, Implementation::kOnednn),
               RunOp(graph, inputs, dy, Implementation::kReference), what, names);
  }
  EXPECT_EQ(layer_norm::ReferenceFallbacks(), fallbacks) << "oneDNN rejected a shape";
}

TEST(OnednnTrainingOpsTest, LayerNormGemmNetAgrees) {
  GraphBuilder b;
  b.Input("x").Output("y");
  b.Weight("w1", {32, 16}).Weight("s", {32}).Weight("b", {32}).Weight("w2", {10, 32});
  b.Node("Gemm", {"x", "w1"}, {"h"}, {{"transB", int64_t{1}}})
      .Node("LayerNormalization", {"h", "s", "b"}, {"n"})
      .Node("Relu", {"n"}, {"r"})
      .Node("Gemm", {"r", "w2"}, {"y"}, {{"transB", int64_t{1}}});
  ExpectNetsAgree(b.Build(), {8, 16}, "Gemm + LayerNormalization");
}

}  // namespace
}  // namespace numaserve::training
