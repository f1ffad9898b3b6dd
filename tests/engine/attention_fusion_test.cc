// Scaled dot-product attention fused into one step (AttentionStep on the
// own kernel): which graphs fuse, which do not and stay correct, and the
// results against the reference executor, including batch dims broadcast,
// queries and keys of different lengths, k given already transposed, and
// a transformer layer run in slices of the batch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/compiler/compiled_steps.h"
#include "engine/model.h"
#include "tests/engine/attention_block.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

std::string Plan(const std::string& path, const CompileOptions& options = {}) {
  auto model = CompiledModel::Load(path, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->DescribePlan() : "";
}

// q [N, sq, d], k [N, d, sk] as given (k_col = sk: the kernel's strided
// transpose), v [N, sk, dv] straight from the inputs; no scale. Queries and
// keys differ in length (cross-attention), as do d and dv.
TEST(AttentionFusionTest, InputsOfDifferentLengthsAndNoScale) {
  OnnxModelBuilder b(17);
  b.Input("q", {-1, 5, 8}).Input("k", {-1, 8, 19}).Input("v", {-1, 19, 3});
  b.Output("y", {-1, 5, 3});
  b.Node("MatMul", {"q", "k"}, {"s"}, "scores");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s"}, {"p"}, "softmax"), "axis", 2);
  b.Node("MatMul", {"p", "v"}, {"y"}, "context");
  const std::string path = b.Save("attention_cross");
  testing::ExpectCompiledMatchesReference("cross", path, {1, 4}, 1e-10);
  EXPECT_THAT(Plan(path), HasSubstr("attention: scores+softmax+context\n"));
}

// No keys at all (sk = 0): the product with v sums nothing, so the output
// is zeros, as MatMul over an empty inner dimension gives.
TEST(AttentionFusionTest, NoKeysGiveZeros) {
  OnnxModelBuilder b(17);
  b.Input("q", {-1, 2, 4}).Input("k", {-1, 4, 0}).Input("v", {-1, 0, 3});
  b.Output("y", {-1, 2, 3});
  b.Node("MatMul", {"q", "k"}, {"s"}, "scores");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s"}, {"p"}, "softmax"), "axis", -1);
  b.Node("MatMul", {"p", "v"}, {"y"}, "context");
  const std::string path = b.Save("attention_no_keys");
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->DescribePlan(), HasSubstr("attention: scores+softmax+context\n"));
  constexpr int64_t kBatch = 2;
  const std::vector<float> q = RandomTensor({kBatch, 2, 4}, 1).data;
  const float empty = 0;  // k and v hold no elements; any non-null buffer
  std::vector<float> y(kBatch * 2 * 3, -7.0f);
  const absl::Status s = (*model)->Run(kBatch, {q.data(), &empty, &empty}, {y.data()});
  ASSERT_TRUE(s.ok()) << s;
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// Keys and values shared by every head: k [N, 1, d, sk] and v [N, 1, sk,
// dv] broadcast over q's 3 heads, the scale a Div.
TEST(AttentionFusionTest, KeysAndValuesBroadcastOverHeads) {
  OnnxModelBuilder b(17);
  b.Input("q", {-1, 3, 7, 16}).Input("k", {-1, 1, 16, 33}).Input("v", {-1, 1, 33, 16});
  b.Output("y", {-1, 3, 7, 16});
  b.Initializer("four", kernels::Tensor({}, {4.0f}));
  b.Node("MatMul", {"q", "k"}, {"s0"}, "scores");
  b.Node("Div", {"s0", "four"}, {"s1"}, "scale");
  OnnxModelBuilder::AttrInt(b.Node("Softmax", {"s1"}, {"p"}, "softmax"), "axis", -1);
  b.Node("MatMul", {"p", "v"}, {"y"}, "context");
  const std::string path = b.Save("attention_broadcast");
  testing::ExpectCompiledMatchesReference("broadcast", path, {1, 2}, 1e-10);
  EXPECT_THAT(Plan(path), HasSubstr("attention: scores+scale+softmax+context\n"));
}

// The same chain with one thing that the fused step cannot do: each stays
// unfused (batched matmuls and a softmax step) and matches the reference.
TEST(AttentionFusionTest, ChainsThatDoNotFuseStayCorrect) {
  struct Case {
    const char* name;
    int64_t softmax_axis = -1;   // not the last axis: 1
    bool scores_output = false;  // the scores also a graph output
    bool mask = false;           // an Add between the scale and the softmax
    bool v_late = false;         // v computed after the scores matmul
    bool v_transposed = false;   // v read through a transpose of its last axis
  };
  const Case cases[] = {{"axis", 1},
                        {"scores_output", -1, true},
                        {"mask", -1, false, true},
                        {"v_late", -1, false, false, true},
                        {"v_transposed", -1, false, false, false, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    OnnxModelBuilder b(17);
    b.Input("q", {-1, 2, 6, 4}).Input("k", {-1, 2, 4, 6});
    b.Input("v",
            c.v_transposed ? std::vector<int64_t>{-1, 2, 4, 6} : std::vector<int64_t>{-1, 2, 6, 4});
    b.Output("y", {-1, 2, 6, 4});
    if (c.scores_output) b.Output("s1", {-1, 2, 6, 6});
    b.Initializer("half", kernels::Tensor({}, {0.5f}));
    b.Initializer("mask", RandomTensor({6}, 3));
    b.Initializer("wv", RandomTensor({4, 4}, 4));
    b.Node("MatMul", {"q", "k"}, {"s0"}, "scores");
    b.Node("Mul", {"s0", "half"}, {"s1"}, "scale");
    std::string s = "s1";
    if (c.mask) {
      b.Node("Add", {"s1", "mask"}, {"s2"}, "mask");
      s = "s2";
    }
    OnnxModelBuilder::AttrInt(b.Node("Softmax", {s}, {"p"}, "softmax"), "axis", c.softmax_axis);
    std::string v = "v";
    if (c.v_late) {
      b.Node("MatMul", {"v", "wv"}, {"v1"}, "v_proj");  // after the scores, in node order
      v = "v1";
    }
    if (c.v_transposed) {
      OnnxModelBuilder::AttrInts(b.Node("Transpose", {"v"}, {"vt"}, "v_t"), "perm", {0, 1, 3, 2});
      v = "vt";
    }
    b.Node("MatMul", {"p", v}, {"y"}, "context");
    const std::string path = b.Save(std::string("attention_unfused_") + c.name);
    testing::ExpectCompiledMatchesReference(c.name, path, {1, 3}, 1e-10);
    const std::string plan = Plan(path);
    EXPECT_THAT(plan, Not(HasSubstr("attention:")));
    EXPECT_THAT(plan, HasSubstr("softmax"));
  }
}

// One BERT-style encoder layer: projections, heads split by Reshape and
// Transpose, fused attention, output projection with the residual,
// LayerNormalization. With a small cache every step is row-wise and the
// whole layer runs in slices of 4 rows; results match the reference, the
// unsplit plan and the unfused one.
std::string EncoderLayer() {
  constexpr int64_t kSeq = 32, kHidden = 32, kHeads = 2, kHead = kHidden / kHeads;
  OnnxModelBuilder b(17);
  b.Input("x", {-1, kSeq, kHidden}).Output("y", {-1, kSeq, kHidden});
  b.Initializer("wo", RandomTensor({kHidden, kHidden}, 10))
      .Initializer("bo", RandomTensor({kHidden}, 11))
      .Initializer("gamma", RandomTensor({kHidden}, 12))
      .Initializer("beta", RandomTensor({kHidden}, 13));
  testing::AddSelfAttention(b, "x", "c2", kSeq, kHeads, kHead, "Mul", 0.25f);
  b.Node("MatMul", {"c2", "wo"}, {"o0"}, "proj_o");
  b.Node("Add", {"o0", "bo"}, {"o1"}, "proj_o_bias");
  b.Node("Add", {"o1", "x"}, {"o2"}, "residual");
  b.Node("LayerNormalization", {"o2", "gamma", "beta"}, {"y"}, "ln");
  return b.Save("encoder_layer");
}

TEST(AttentionFusionTest, EncoderLayerRunsInSlicesOfTheBatch) {
  const std::string path = EncoderLayer();
  // A row's largest value is 32 x 32 floats = 4 KiB, a weight matrix 4 to
  // 8 KiB as packed: 48 KiB of cache holds slices of (24 - 8) / 4 = 4 (or
  // 5) rows, 4 dividing the batch of 16, and every output (batch 16: 64
  // KiB) outgrows it.
  CompileOptions split;
  split.batch_split_cache_bytes = 48 << 10;
  CompileOptions whole;
  whole.batch_split_cache_bytes = 0;
  CompileOptions unfused = whole;
  unfused.fuse_attention = false;
  testing::ExpectCompiledMatchesReference("split", path, {1, 14, 16}, 1e-10, split);
  testing::ExpectCompiledMatchesReference("unfused", path, {1, 5}, 1e-10, unfused);
  auto a = CompiledModel::Load(path, split);
  auto w = CompiledModel::Load(path, whole);
  auto u = CompiledModel::Load(path, unfused);
  ASSERT_TRUE(a.ok() && w.ok() && u.ok());
  constexpr int64_t kBatch = 16;
  const std::vector<float> x = RandomTensor({kBatch, 32, 32}, 7).data;
  std::vector<float> ya(x.size(), -1), yw(x.size(), -2), yu(x.size(), -3);
  (*a)->SetProfiling(true);
  ASSERT_TRUE((*a)->Run(kBatch, {x.data()}, {ya.data()}).ok());
  (*a)->SetProfiling(false);
  ASSERT_TRUE((*w)->Run(kBatch, {x.data()}, {yw.data()}).ok());
  ASSERT_TRUE((*u)->Run(kBatch, {x.data()}, {yu.data()}).ok());
  EXPECT_LT(testing::NormalizedError(yw, ya.data()), 1e-12);
  EXPECT_LT(testing::NormalizedError(yu, yw.data()), 1e-10);
  // Every step ran in slices of 4 rows: the projections, the attention,
  // the output projection with its residual, the layer norm.
  int steps = 0;
  for (const StepProfile& row : (*a)->Profile()) {
    if (row.kind == "reorder") continue;
    EXPECT_EQ(row.slice_rows, 4) << row.description;
    ++steps;
  }
  EXPECT_EQ(steps, 6);
  const std::string plan = (*a)->DescribePlan();
  EXPECT_THAT(plan,
              HasSubstr("attention: scores+heads_q+heads_k+heads_v+scale+softmax+context+merge\n"));
  // Slices hold 2 rows' activations, not the batch's.
  auto split_bytes = (*a)->ActivationBytes(kBatch);
  auto whole_bytes = (*w)->ActivationBytes(kBatch);
  ASSERT_TRUE(split_bytes.ok() && whole_bytes.ok());
  EXPECT_LT(*split_bytes, *whole_bytes);
}

// Fewer heads than threads: each head's queries are split into chunks of
// whole blocks so that every thread works.
TEST(AttentionFusionTest, QueryChunksShareFewHeadsAmongThreads) {
  EXPECT_EQ(AttentionQueryChunks(12, 128, 2), 1);   // 6 heads a thread
  EXPECT_EQ(AttentionQueryChunks(12, 128, 16), 4);  // 48 chunks, 3 a thread
  EXPECT_EQ(AttentionQueryChunks(1, 100, 3), 3);    // 5 blocks of queries
  EXPECT_EQ(AttentionQueryChunks(3, 128, 2), 2);    // 6 chunks, 3 a thread
  EXPECT_EQ(AttentionQueryChunks(1, 24, 8), 1);     // one block: nothing to split
  EXPECT_EQ(AttentionQueryChunks(4, 512, 1), 1);
}

// One and two heads of 100 queries (not a whole number of blocks) on 3
// threads run in query chunks, every step on all threads, and match the
// reference.
TEST(AttentionFusionTest, FewHeadsRunInQueryChunks) {
  for (int64_t heads : {1, 2}) {
    OnnxModelBuilder b(17);
    b.Input("x", {-1, 100, heads * 16});
    b.Output("y", {-1, 100, heads * 16});
    testing::AddSelfAttention(b, "x", "y", 100, heads, 16, "Mul", 0.25f);
    const std::string path = b.Save("attention_few_heads");
    CompileOptions options;
    options.num_threads = 3;
    options.serial_below_flops = 0;
    EXPECT_THAT(Plan(path, options), HasSubstr("attention: "));
    testing::ExpectCompiledMatchesReference("few_heads", path, {1, 2}, 1e-10, options);
  }
}

}  // namespace
}  // namespace numaserve::engine
