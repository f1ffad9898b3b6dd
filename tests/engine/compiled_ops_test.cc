// The compiled fast paths (oneDNN conv with folded BatchNormalization and
// post-ops, pooling, batched matmul, own element-wise / layer norm /
// transpose loops) against the reference executor on small CNN and
// transformer blocks, and the plan they compile to.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "tests/engine/attention_block.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::ExpectCompiledMatchesReference;
using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

kernels::Tensor Positive(const Shape& shape, uint32_t seed) {
  kernels::Tensor t = RandomTensor(shape, seed);
  for (float& v : t.data) v = 0.5f + std::abs(v);
  return t;
}

void BatchNorm(OnnxModelBuilder& b, const std::string& x, const std::string& y, int64_t c,
               uint32_t seed, const std::string& name) {
  b.Initializer(name + "_s", RandomTensor({c}, seed))
      .Initializer(name + "_b", RandomTensor({c}, seed + 1))
      .Initializer(name + "_m", RandomTensor({c}, seed + 2))
      .Initializer(name + "_v", Positive({c}, seed + 3));
  b.Node("BatchNormalization", {x, name + "_s", name + "_b", name + "_m", name + "_v"}, {y}, name);
}

TEST(CompiledOpsTest, ResidualConvBlockFusesBatchNormSumAndRelu) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 8, 10, 10}).Output("y", {-1, 5});
  b.Initializer("w1", RandomTensor({8, 8, 3, 3}, 1)).Initializer("b1", RandomTensor({8}, 2));
  b.Initializer("w2", RandomTensor({8, 8, 3, 3}, 3));
  b.Initializer("fc", RandomTensor({5, 8}, 4)).Initializer("fcb", RandomTensor({5}, 5));
  auto& c1 = b.Node("Conv", {"x", "w1", "b1"}, {"c1"}, "conv1");
  OnnxModelBuilder::AttrInts(c1, "pads", {1, 1, 1, 1});
  BatchNorm(b, "c1", "n1", 8, 10, "bn1");
  b.Node("Relu", {"n1"}, {"r1"}, "relu1");
  auto& c2 = b.Node("Conv", {"r1", "w2"}, {"c2"}, "conv2");
  OnnxModelBuilder::AttrString(c2, "auto_pad", "SAME_UPPER");
  BatchNorm(b, "c2", "n2", 8, 20, "bn2");
  b.Node("Add", {"n2", "r1"}, {"s2"}, "add2");
  b.Node("Relu", {"s2"}, {"r2"}, "relu2");
  auto& mp = b.Node("MaxPool", {"r2"}, {"p"}, "pool");
  OnnxModelBuilder::AttrInts(mp, "kernel_shape", {3, 3});
  OnnxModelBuilder::AttrInts(mp, "strides", {2, 2});
  OnnxModelBuilder::AttrInts(mp, "pads", {1, 1, 1, 1});
  b.Node("GlobalAveragePool", {"p"}, {"g"}, "gap");
  b.Node("Flatten", {"g"}, {"f"}, "flatten");
  auto& fc = b.Node("Gemm", {"f", "fc", "fcb"}, {"y"}, "fc");
  OnnxModelBuilder::AttrInt(fc, "transB", 1);
  const std::string path = b.Save("resblock");
  ExpectCompiledMatchesReference("resblock", path, {1, 3, 8}, 1e-9);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string plan = (*model)->DescribePlan();
  EXPECT_THAT(plan, HasSubstr("conv: conv1+bn1+relu1"));
  EXPECT_THAT(plan, HasSubstr("conv: conv2+bn2+add2+relu2"));
  EXPECT_THAT(plan, HasSubstr("pool: pool"));
  EXPECT_THAT(plan, HasSubstr("pool: gap"));
  EXPECT_THAT(plan, ::testing::Not(HasSubstr("reference")));
}

// Conv outputs kept in the blocked layout, read by each kind of consumer.
TEST(CompiledOpsTest, BlockedLayoutConsumers) {
  for (const std::string variant : {"pool", "gap", "sum", "chain", "plain_reader"}) {
    OnnxModelBuilder b(13);
    b.Input("x", {-1, 8, 10, 10});
    b.Initializer("w1", RandomTensor({8, 8, 3, 3}, 1))
        .Initializer("w2", RandomTensor({8, 8, 3, 3}, 2));
    OnnxModelBuilder::AttrInts(b.Node("Conv", {"x", "w1"}, {"c1"}), "pads", {1, 1, 1, 1});
    b.Node("Relu", {"c1"}, {"r1"});
    if (variant == "pool") {
      auto& p = b.Node("MaxPool", {"r1"}, {"y"});
      OnnxModelBuilder::AttrInts(p, "kernel_shape", {3, 3});
      OnnxModelBuilder::AttrInts(p, "strides", {2, 2});
      OnnxModelBuilder::AttrInts(p, "pads", {1, 1, 1, 1});
      b.Output("y", {-1, 8, 5, 5});
    } else if (variant == "gap") {
      b.Node("GlobalAveragePool", {"r1"}, {"y"});
      b.Output("y", {-1, 8, 1, 1});
    } else if (variant == "sum") {
      OnnxModelBuilder::AttrInts(b.Node("Conv", {"r1", "w2"}, {"c2"}), "pads", {1, 1, 1, 1});
      b.Node("Add", {"c2", "r1"}, {"y"});
      b.Output("y", {-1, 8, 10, 10});
    } else if (variant == "chain") {
      OnnxModelBuilder::AttrInts(b.Node("Conv", {"r1", "w2"}, {"y"}), "pads", {1, 1, 1, 1});
      b.Output("y", {-1, 8, 10, 10});
    } else {
      OnnxModelBuilder::AttrInts(b.Node("Conv", {"r1", "w2"}, {"c2"}), "pads", {1, 1, 1, 1});
      b.Node("Sigmoid", {"c2"}, {"s"});
      b.Node("Mul", {"s", "r1"}, {"y"});
      b.Output("y", {-1, 8, 10, 10});
    }
    ExpectCompiledMatchesReference(variant, b.Save("layout"), {1, 2}, 1e-9);
  }
}

TEST(CompiledOpsTest, MemoryPlanReusesActivationBuffers) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 1000}).Output("y", {-1, 1000});
  std::string prev = "x";
  for (int i = 0; i < 8; ++i) {
    const std::string next = i == 7 ? "y" : absl::StrCat("s", i);
    b.Node(i % 2 == 0 ? "Sigmoid" : "Tanh", {prev}, {next});
    prev = next;
  }
  const std::string path = b.Save("chain");
  ExpectCompiledMatchesReference("chain", path, {1, 4, 2}, 1e-10);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok());
  auto bytes = (*model)->ActivationBytes(4);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // Seven intermediates, two alive at a time: two buffers of 4 x 1000 floats.
  EXPECT_EQ(*bytes, 2 * 4 * 1000 * 4);
}

TEST(CompiledOpsTest, ConvTransposeOnOnednn) {
  struct Case {
    std::string name;
    int64_t group, stride, pad, out_pad, dilation;
  };
  for (const Case& c : {Case{"plain", 1, 1, 0, 0, 1}, Case{"stride2_pad1", 1, 2, 1, 1, 1},
                        Case{"group2", 2, 2, 0, 0, 1}, Case{"dilated", 1, 1, 1, 0, 2}}) {
    OnnxModelBuilder b(13);
    b.Input("x", {-1, 4, 5, 6}).Output("y", {-1, 6, -2, -2});
    b.Initializer("w", RandomTensor({4, 6 / c.group, 3, 3}, 1))
        .Initializer("b", RandomTensor({6}, 2));
    auto& n = b.Node("ConvTranspose", {"x", "w", "b"}, {"y"}, "deconv");
    OnnxModelBuilder::AttrInt(n, "group", c.group);
    OnnxModelBuilder::AttrInts(n, "strides", {c.stride, c.stride});
    OnnxModelBuilder::AttrInts(n, "pads", {c.pad, c.pad, c.pad, c.pad});
    OnnxModelBuilder::AttrInts(n, "output_padding", {c.out_pad, c.out_pad});
    OnnxModelBuilder::AttrInts(n, "dilations", {c.dilation, c.dilation});
    const std::string path = b.Save("deconv");
    ExpectCompiledMatchesReference(c.name, path, {1, 3}, 1e-9);
    auto model = CompiledModel::Load(path, {});
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_THAT((*model)->DescribePlan(), HasSubstr("conv: deconv")) << c.name;
  }
}

TEST(CompiledOpsTest, DepthwiseConvWithClipAndStrides) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 6, 9, 9}).Output("y", {-1, 12, 5, 5});
  b.Initializer("dw", RandomTensor({6, 1, 3, 3}, 1))
      .Initializer("pw", RandomTensor({12, 6, 1, 1}, 2));
  b.Initializer("lo", kernels::Tensor({}, {0.0f})).Initializer("hi", kernels::Tensor({}, {0.5f}));
  auto& dw = b.Node("Conv", {"x", "dw"}, {"d"}, "dwconv");
  OnnxModelBuilder::AttrInt(dw, "group", 6);
  OnnxModelBuilder::AttrInts(dw, "strides", {2, 2});
  OnnxModelBuilder::AttrInts(dw, "pads", {1, 1, 1, 1});
  b.Node("Clip", {"d", "lo", "hi"}, {"dc"}, "relu6");
  b.Node("Conv", {"dc", "pw"}, {"y"}, "pwconv");
  const std::string path = b.Save("depthwise");
  ExpectCompiledMatchesReference("depthwise", path, {1, 4}, 1e-9);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok());
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("conv: dwconv+relu6"));
}

TEST(CompiledOpsTest, AveragePoolVariants) {
  for (int include_pad = 0; include_pad <= 1; ++include_pad) {
    for (int ceil_mode = 0; ceil_mode <= 1; ++ceil_mode) {
      OnnxModelBuilder b(13);
      b.Input("x", {-1, 3, 7, 8}).Output("y", {-1, 3, -2, -2});
      auto& p = b.Node("AveragePool", {"x"}, {"y"}, "avg");
      OnnxModelBuilder::AttrInts(p, "kernel_shape", {3, 2});
      OnnxModelBuilder::AttrInts(p, "strides", {2, 2});
      OnnxModelBuilder::AttrInts(p, "pads", {1, 0, 1, 1});
      OnnxModelBuilder::AttrInt(p, "count_include_pad", include_pad);
      OnnxModelBuilder::AttrInt(p, "ceil_mode", ceil_mode);
      ExpectCompiledMatchesReference(absl::StrCat("avgpool_pad", include_pad, "_ceil", ceil_mode),
                                     b.Save("avgpool"), {1, 2}, 1e-10);
    }
  }
}

TEST(CompiledOpsTest, AttentionBlockWithGeluAndLayerNorm) {
  constexpr int64_t kSeq = 4, kHidden = 8, kHeads = 2, kHead = kHidden / kHeads;
  OnnxModelBuilder b(17);
  b.Input("x", {-1, kSeq, kHidden}).Output("y", {-1, kSeq, kHidden});
  b.Initializer("wq", RandomTensor({kHidden, kHidden}, 1))
      .Initializer("wk", RandomTensor({kHidden, kHidden}, 2))
      .Initializer("bq", RandomTensor({kHidden}, 3))
      .Initializer("scale", kernels::Tensor({}, {0.5f}))
      .Initializer("sqrt2", kernels::Tensor({}, {1.41421356f}))
      .Initializer("one", kernels::Tensor({}, {1.0f}))
      .Initializer("half", kernels::Tensor({}, {0.5f}))
      .Initializer("gamma", RandomTensor({kHidden}, 4))
      .Initializer("beta", RandomTensor({kHidden}, 5))
      .Int64Initializer("heads_shape", {0, kSeq, kHeads, kHead})
      .Int64Initializer("merged_shape", {0, kSeq, kHidden});
  b.Node("MatMul", {"x", "wq"}, {"q0"});
  b.Node("Add", {"q0", "bq"}, {"q1"});
  b.Node("MatMul", {"x", "wk"}, {"k0"});
  b.Node("Reshape", {"q1", "heads_shape"}, {"q2"});
  b.Node("Reshape", {"k0", "heads_shape"}, {"k2"});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"q2"}, {"q3"}), "perm", {0, 2, 1, 3});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"k2"}, {"k3"}), "perm", {0, 2, 3, 1});
  b.Node("MatMul", {"q3", "k3"}, {"s0"}, "scores");
  b.Node("Mul", {"s0", "scale"}, {"s1"});
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s1"}, {"p"}), "axis", -1);
  b.Node("MatMul", {"p", "q3"}, {"c0"}, "context");
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"c0"}, {"c1"}), "perm", {0, 2, 1, 3});
  b.Node("Reshape", {"c1", "merged_shape"}, {"c2"});
  b.Node("Div", {"c2", "sqrt2"}, {"g0"});
  b.Node("Erf", {"g0"}, {"g1"});
  b.Node("Add", {"g1", "one"}, {"g2"});
  b.Node("Mul", {"c2", "g2"}, {"g3"});
  b.Node("Mul", {"g3", "half"}, {"g4"});
  b.Node("LayerNormalization", {"g4", "gamma", "beta"}, {"y"}, "ln");
  const std::string path = b.Save("attention");
  ExpectCompiledMatchesReference("attention", path, {1, 3}, 1e-9);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string plan = (*model)->DescribePlan();
  // v is q's heads: the transpose is a step of its own, read by both.
  EXPECT_THAT(plan, HasSubstr("attention: scores"));
  EXPECT_THAT(plan, HasSubstr("layer_norm: ln"));
  EXPECT_THAT(plan, ::testing::Not(HasSubstr("reference")));
}

// BERT's self-attention as PyTorch exports it: Q, K, V split into heads
// by Reshape + Transpose, scores scaled by 1/sqrt(d), the context
// transposed back. Fused (the default), the whole chain is one attention
// step reading the heads through strides and writing the context in
// [B,S,H,D] order; the scores are never stored. Unfused, the matmuls
// still read the heads through strides and apply the scale: no transpose
// or binary step is left either way.
TEST(CompiledOpsTest, AttentionHeadTransposesAndScaleFoldIntoBatchedMatMuls) {
  constexpr int64_t kSeq = 6, kHidden = 12, kHeads = 3, kHead = kHidden / kHeads;
  for (const char* scale_op : {"Mul", "Div"}) {
    SCOPED_TRACE(scale_op);
    OnnxModelBuilder b(17);
    b.Input("x", {-1, kSeq, kHidden}).Output("y", {-1, kSeq, kHidden});
    testing::AddSelfAttention(b, "x", "y", kSeq, kHeads, kHead, scale_op,
                              std::string(scale_op) == "Mul" ? 0.5f : 2.0f);
    const std::string path = b.Save("attention_strided");
    for (const bool fuse : {true, false}) {
      SCOPED_TRACE(fuse ? "fused" : "unfused");
      CompileOptions options;
      options.fuse_attention = fuse;
      ExpectCompiledMatchesReference("attention_strided", path, {1, 3}, 1e-10, options);
      auto model = CompiledModel::Load(path, options);
      ASSERT_TRUE(model.ok()) << model.status();
      const std::string plan = (*model)->DescribePlan();
      if (fuse) {
        EXPECT_THAT(plan, HasSubstr("attention: scores+heads_q+heads_k+heads_v+scale+softmax+"
                                    "context+merge\n"));
        EXPECT_THAT(plan, ::testing::Not(HasSubstr("batched_matmul:")));
        EXPECT_THAT(plan, ::testing::Not(HasSubstr("softmax:")));
      } else {
        EXPECT_THAT(plan, HasSubstr("batched_matmul: scores+heads_q+heads_k+scale\n"));
        EXPECT_THAT(plan, HasSubstr("batched_matmul: context+heads_v+merge\n"));
      }
      EXPECT_THAT(plan, ::testing::Not(HasSubstr("transpose:")));
      EXPECT_THAT(plan, ::testing::Not(HasSubstr("binary:")));
      // The heads and the scores before the scale are never stored: only
      // the projections, and unfused the scores and the probabilities.
      auto bytes = (*model)->ActivationBytes(1);
      ASSERT_TRUE(bytes.ok());
      const int64_t scores = fuse ? 0 : 2 * kHeads * kSeq * kSeq;
      EXPECT_LE(*bytes,
                static_cast<int64_t>(sizeof(float)) * (3 * kSeq * kHidden + scores + 64 * 8));
    }
  }
}

TEST(CompiledOpsTest, FeedForwardFusesErfGeluAndResidualIntoMatMuls) {
  OnnxModelBuilder b(17);
  b.Input("x", {-1, 4, 8}).Output("y", {-1, 4, 8});
  b.Initializer("w1", RandomTensor({8, 16}, 1)).Initializer("b1", RandomTensor({16}, 2));
  b.Initializer("w2", RandomTensor({16, 8}, 3)).Initializer("b2", RandomTensor({8}, 4));
  b.Initializer("sqrt2", kernels::Tensor({}, {1.41421356f}))
      .Initializer("one", kernels::Tensor({}, {1.0f}))
      .Initializer("half", kernels::Tensor({}, {0.5f}));
  b.Node("MatMul", {"x", "w1"}, {"h0"}, "ffn1");
  b.Node("Add", {"h0", "b1"}, {"h"}, "ffn1_bias");
  b.Node("Div", {"h", "sqrt2"}, {"g0"}, "gelu_div");
  b.Node("Erf", {"g0"}, {"g1"});
  b.Node("Add", {"g1", "one"}, {"g2"});
  b.Node("Mul", {"h", "g2"}, {"g3"});
  b.Node("Mul", {"g3", "half"}, {"g4"}, "gelu_half");
  b.Node("MatMul", {"g4", "w2"}, {"o0"}, "ffn2");
  b.Node("Add", {"o0", "b2"}, {"o1"}, "ffn2_bias");
  b.Node("Add", {"o1", "x"}, {"y"}, "residual");
  const std::string path = b.Save("ffn");
  ExpectCompiledMatchesReference("ffn", path, {1, 3}, 1e-9);
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string plan = (*model)->DescribePlan();
  EXPECT_THAT(plan, HasSubstr("matmul: ffn1+ffn1_bias+gelu(gelu_div..gelu_half)"));
  EXPECT_THAT(plan, HasSubstr("matmul: ffn2+ffn2_bias+residual"));
  EXPECT_EQ(std::count(plan.begin(), plan.end(), '\n'), 2) << plan;
}

TEST(CompiledOpsTest, BroadcastBinaryOps) {
  for (const char* op : {"Sub", "Mul", "Div", "Max", "Pow"}) {
    OnnxModelBuilder b(13);
    b.Input("a", {-1, 3, 1, 5}).Input("c", {-1, 3, 4, 1}).Output("y", {-1, 3, 4, 5});
    b.Initializer("k", Positive({4, 5}, 3));
    b.Node("Abs", {"a"}, {"aa"});
    b.Node(op, {"aa", "k"}, {"t"});
    b.Node(op, {"t", "c"}, {"y"});
    ExpectCompiledMatchesReference(op, b.Save("binary"), {1, 2}, 1e-10);
  }
}

// A scalar times a whole tensor (GPT-2's keys scaled before the scores) is
// one run of the binary loop: split across the threads, and the same answer.
TEST(CompiledOpsTest, AScalarTimesATensorMatchesTheReference) {
  for (const char* op : {"Mul", "Sub", "Div"}) {
    OnnxModelBuilder b(13);
    b.Input("a", {-1, 3, 4, 5}).Output("y", {-1, 3, 4, 5});
    b.Initializer("s", kernels::Tensor({}, {0.125F}));
    b.Node("Abs", {"a"}, {"aa"});
    b.Node(op, {"aa", "s"}, {"t"});
    b.Node(op, {"s", "t"}, {"y"});
    CompileOptions threaded;  // every step on every thread, however small
    threaded.serial_below_flops = 0;
    threaded.serial_below_elements = 0;
    ExpectCompiledMatchesReference(op, b.Save("scalar_binary"), {1, 7}, 1e-10, threaded);
  }
}

// FP32 Concat runs as copies (a decoder's past keys and the new ones), on
// the last axis and an inner one; at batch 1 an axis-1 concat has fewer
// outer indices than threads, so each block is split between them.
TEST(CompiledOpsTest, ConcatRunsAsCopiesMatchingTheReference) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 3, 4}).Input("p", {-1, 2, 4}).Input("q", {-1, 3, 2});
  b.Output("along_inner", {-1, 5, 4}).Output("along_last", {-1, 3, 6});
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"p", "x"}, {"along_inner"}, "inner"), "axis", 1);
  OnnxModelBuilder::AttrInt(b.Node("Concat", {"x", "q"}, {"along_last"}, "last"), "axis", -1);
  const std::string path = b.Save("concat_copies");
  CompileOptions threaded;  // every step on every thread, however small
  threaded.serial_below_flops = 0;
  threaded.serial_below_elements = 0;
  ExpectCompiledMatchesReference("concat", path, {1, 2, 5}, 1e-12, threaded);  // copies: exact
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string plan = (*model)->DescribePlan();
  EXPECT_THAT(plan, HasSubstr("concat: inner"));
  EXPECT_THAT(plan, HasSubstr("concat: last"));
  EXPECT_THAT(plan, ::testing::Not(HasSubstr("reference")));
}

}  // namespace
}  // namespace numaserve::engine
