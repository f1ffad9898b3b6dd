// Batch splitting: the leading row-wise steps whose activations outgrow
// CompileOptions::batch_split_cache_bytes run the batch in slices of rows,
// their own intermediate values sized for one slice. The results match the
// reference executor and the unsplit plan at batches that divide into
// slices and at ones that leave a shorter last slice; the split stops at
// the first step that is not row-wise, before the steps whose activations
// fit the cache, and before steps whose weights, read again by every slice,
// cost more memory traffic than the split saves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "tests/engine/bottleneck_block.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"
#include "tests/prerequisites.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using testing::RandomTensor;

// x [N,8,20,20] -> 3x3 stem to 32 ch -> 3x3 max pool (stride 1) -> two
// bottleneck blocks with residual Adds at 20x20 -> a stride-2 3x3 conv to
// 64 ch (10x10) -> one bottleneck block at 10x10 -> global average pool ->
// Flatten -> Gemm to 10. At 20x20 a row's 32-ch activation is 51200 bytes,
// at 10x10 25600. With `softmax_after_stem`, a Softmax over the channels
// (a step that does not declare itself row-wise) follows the stem's Relu.
// With `big_tail`, a 3x3 conv to 256 ch (590 KB of weights, 102400 bytes a
// row) + Relu follows the last block.
std::string Model(bool softmax_after_stem, bool big_tail = false) {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 8, 20, 20}).Output("y", {-1, 10});
  b.Initializer("w0", RandomTensor({32, 8, 3, 3}, 1));
  b.Initializer("b0", RandomTensor({32}, 2));
  OnnxModelBuilder::AttrInts(b.Node("Conv", {"x", "w0", "b0"}, {"c0"}, "stem"), "pads",
                             {1, 1, 1, 1});
  b.Node("Relu", {"c0"}, {"r0"}, "stem_relu");
  std::string in = "r0";
  if (softmax_after_stem) {
    OnnxModelBuilder::AttrInt(b.Node("Softmax", {in}, {"sm"}, "softmax"), "axis", 1);
    in = "sm";
  }
  auto& pool = b.Node("MaxPool", {in}, {"p0"}, "pool");
  OnnxModelBuilder::AttrInts(pool, "kernel_shape", {3, 3});
  OnnxModelBuilder::AttrInts(pool, "pads", {1, 1, 1, 1});
  in = "p0";
  in = testing::AddBottleneckBlock(b, 1, in, 32);
  in = testing::AddBottleneckBlock(b, 2, in, 32);
  b.Initializer("wd", RandomTensor({64, 32, 3, 3}, 50));
  auto& down = b.Node("Conv", {in, "wd"}, {"d"}, "down");
  OnnxModelBuilder::AttrInts(down, "pads", {1, 1, 1, 1});
  OnnxModelBuilder::AttrInts(down, "strides", {2, 2});
  b.Node("Relu", {"d"}, {"rd"}, "down_relu");
  in = "rd";
  in = testing::AddBottleneckBlock(b, 3, in, 64);
  int64_t channels = 64;
  if (big_tail) {
    channels = 256;
    b.Initializer("wt", RandomTensor({channels, 64, 3, 3}, 70));
    OnnxModelBuilder::AttrInts(b.Node("Conv", {in, "wt"}, {"t"}, "tail"), "pads", {1, 1, 1, 1});
    b.Node("Relu", {"t"}, {"rt"}, "tail_relu");
    in = "rt";
  }
  b.Node("GlobalAveragePool", {in}, {"g"}, "gap");
  b.Node("Flatten", {"g"}, {"f"}, "flatten");
  b.Initializer("wf", RandomTensor({10, channels}, 60));
  b.Initializer("bf", RandomTensor({10}, 61));
  OnnxModelBuilder::AttrInt(b.Node("Gemm", {"f", "wf", "bf"}, {"y"}, "fc"), "transB", 1);
  return b.Save(softmax_after_stem ? "batch_split_softmax"
                : big_tail         ? "batch_split_big_tail"
                                   : "batch_split");
}

// 256 KiB: at batch 8 the 20x20 activations (410 KB) outgrow it, the 10x10
// ones (205 KB) do not; a slice holds 128 KiB / 51200 B = 2 rows.
CompileOptions Split() {
  CompileOptions o;
  o.batch_split_cache_bytes = 256 << 10;
  return o;
}

CompileOptions NoSplit() {
  CompileOptions o;
  o.batch_split_cache_bytes = 0;
  return o;
}

std::vector<float> Input(int64_t batch) {
  std::vector<float> x(batch * 8 * 20 * 20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 50 - 1;
  return x;
}

// Steps run in slices (their rows' slice size), in plan order.
std::vector<int64_t> SliceRows(CompiledModel& model, int64_t batch) {
  model.SetProfiling(true);
  const std::vector<float> x = Input(batch);
  std::vector<float> y(batch * 10);
  EXPECT_TRUE(model.Run(batch, {x.data()}, {y.data()}).ok());
  model.SetProfiling(false);
  std::vector<int64_t> rows;
  for (const StepProfile& row : model.Profile()) {
    if (row.kind != "reorder") rows.push_back(row.slice_rows);
  }
  return rows;
}

TEST(BatchSplitTest, MatchesTheReferenceAndTheUnsplitPlan) {
  const std::string path = Model(false);
  // 8 = 4 slices of 2 rows; 5 and 7 end with a 1-row slice; 1 and 3 (not
  // two whole slices) run whole.
  testing::ExpectCompiledMatchesReference("split", path, {1, 3, 5, 7, 8}, 1e-9, Split());
  auto split = CompiledModel::Load(path, Split());
  auto whole = CompiledModel::Load(path, NoSplit());
  ASSERT_TRUE(split.ok() && whole.ok());
  for (int64_t batch : {7, 8}) {
    const std::vector<float> x = Input(batch);
    std::vector<float> a(batch * 10, -1), c(batch * 10, -2);
    ASSERT_TRUE((*split)->Run(batch, {x.data()}, {a.data()}).ok());
    ASSERT_TRUE((*whole)->Run(batch, {x.data()}, {c.data()}).ok());
    EXPECT_LT(testing::NormalizedError(c, a.data()), 1e-10) << "batch " << batch;
    // Twice, so a slice reusing its buffers after a whole run is covered.
    ASSERT_TRUE((*split)->Run(batch, {x.data()}, {a.data()}).ok());
    EXPECT_LT(testing::NormalizedError(c, a.data()), 1e-10) << "batch " << batch;
  }
}

TEST(BatchSplitTest, SplitsTheLeadingStepsWhoseActivationsOutgrowTheCache) {
  auto model = CompiledModel::Load(Model(false), Split());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> rows = SliceRows(**model, 8);
  // stem, pool, then blocks 1 and 2 (conv_a, conv_b, conv_c + residual
  // each) at 20x20 in slices of 2 rows; the stride-2 conv writes 10x10
  // (205 KB at batch 8) and is the first step whole, with everything after.
  const std::vector<int64_t> expected = {2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(rows, expected);
  // Batch 1 and batch 2 (one slice) run whole.
  for (int64_t batch : {1, 2}) {
    for (int64_t r : SliceRows(**model, batch)) EXPECT_EQ(r, 0) << "batch " << batch;
  }
  // One slice's intermediates instead of the batch's.
  auto whole = CompiledModel::Load(Model(false), NoSplit());
  ASSERT_TRUE(whole.ok());
  auto split_bytes = (*model)->ActivationBytes(8);
  auto whole_bytes = (*whole)->ActivationBytes(8);
  ASSERT_TRUE(split_bytes.ok() && whole_bytes.ok());
  EXPECT_LT(*split_bytes, *whole_bytes);
  for (int64_t r : SliceRows(**whole, 8)) EXPECT_EQ(r, 0);
}

// The tail conv writes 819 KB at batch 8, more than the cache, but every
// slice would read its 590 KB of weights again (and, with them, a slice
// could hold only one row: 8 slices): 7 x 590 KB read again against 1.6 MB
// of activations kept in the cache. The split ends where it did without it.
TEST(BatchSplitTest, StopsBeforeStepsWhoseWeightsCostMoreThanTheSplitSaves) {
  const std::string path = Model(false, /*big_tail=*/true);
  testing::ExpectCompiledMatchesReference("split big tail", path, {5, 8}, 1e-9, Split());
  auto model = CompiledModel::Load(path, Split());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> rows = SliceRows(**model, 8);
  const std::vector<int64_t> expected = {2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(rows, expected);
}

TEST(BatchSplitTest, StopsAtTheFirstStepThatIsNotRowWise) {
  const std::string path = Model(true);
  testing::ExpectCompiledMatchesReference("split softmax", path, {5, 8}, 1e-9, Split());
  auto model = CompiledModel::Load(path, Split());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> rows = SliceRows(**model, 8);
  // The stem alone: the Softmax step after it is not row-wise.
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], 2);
  for (size_t k = 1; k < rows.size(); ++k) EXPECT_EQ(rows[k], 0) << "step " << k;
}

// The generated ResNet-50 at batch 12 with a 32 MiB cache: the stem, the
// max pool and the first stage (outputs of 38.5 MB) run in 3 slices of 4
// rows (16 MiB / 3.2 MB per row of the stem's output is 5, and 4 divides
// the batch); the logits match the unsplit plan's.
TEST(BatchSplitTest, ResNet50LogitsMatchTheUnsplitPlan) {
  const std::string path = NUMASERVE_BENCHMARK_MODELS "/resnet50.onnx";
  if (!std::filesystem::exists(path)) NUMASERVE_MISSING_PREREQUISITE() << path << " not generated";
  CompileOptions split;
  split.batch_split_cache_bytes = 32 << 20;
  auto a = CompiledModel::Load(path, split);
  auto b = CompiledModel::Load(path, NoSplit());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  constexpr int64_t kBatch = 12;
  const std::vector<float> x = RandomTensor({kBatch, 3, 224, 224}, 12).data;
  std::vector<float> ya(kBatch * 1000), yb(kBatch * 1000);
  (*a)->SetProfiling(true);
  ASSERT_TRUE((*a)->Run(kBatch, {x.data()}, {ya.data()}).ok());
  (*a)->SetProfiling(false);
  ASSERT_TRUE((*b)->Run(kBatch, {x.data()}, {yb.data()}).ok());
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < ya.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(yb[i])));
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(ya[i] - yb[i])));
  }
  EXPECT_GT(max_abs, 0.0);
  EXPECT_LT(max_diff, 1e-4 * max_abs);
  int sliced = 0;
  for (const StepProfile& row : (*a)->Profile()) {
    if (row.slice_rows > 0) {
      EXPECT_EQ(row.slice_rows, 4) << row.description;
      ++sliced;
    }
  }
  EXPECT_EQ(sliced, 12);  // the stem, the pool and the first stage's 10 convs
}

}  // namespace
}  // namespace numaserve::engine
