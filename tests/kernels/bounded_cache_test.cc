// BoundedCache keeps the most recently used entries, and the oneDNN kernels
// that hold their per-shape primitives in one stay bounded over many row
// counts (a model served without batching sees every count a client sends)
// and still answer correctly, a dropped shape prepared again included.
#include "kernels/bounded_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/elementwise_onednn.h"
#include "kernels/onednn/matmul_onednn.h"
#include "kernels/onednn/pool_onednn.h"
#include "kernels/onednn/softmax_onednn.h"
#include "kernels/ref/add_ref.h"
#include "kernels/ref/conv_ref.h"
#include "kernels/ref/gemm_ref.h"
#include "kernels/ref/softmax_ref.h"
#include "tests/kernels/test_util.h"

namespace numaserve::kernels {
namespace {

using testing::NormalizedError;
using testing::RandomTensor;

// Row counts the kernel tests run: more than the cache keeps.
constexpr int64_t kRowCounts = 200;
static_assert(kRowCounts > static_cast<int64_t>(kShapeCacheCapacity));

TEST(BoundedCacheTest, DropsTheLeastRecentlyUsed) {
  BoundedCache<int, std::string> cache(3);
  EXPECT_EQ(cache.capacity(), 3u);
  cache.Emplace(1, "one");
  cache.Emplace(2, "two");
  cache.Emplace(3, "three");
  ASSERT_NE(cache.Find(1), nullptr);  // 1 is now the most recent; 2 the least
  EXPECT_EQ(cache.Emplace(4, "four"), "four");
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Find(2), nullptr);
  EXPECT_EQ(*cache.Find(1), "one");
  EXPECT_EQ(*cache.Find(3), "three");
  EXPECT_EQ(*cache.Find(4), "four");
  // Peek does not mark: 1 stays the least recent after the Finds above.
  ASSERT_NE(cache.Peek(1), nullptr);
  cache.Emplace(5, "five");
  EXPECT_FALSE(cache.contains(1));
  EXPECT_TRUE(cache.contains(3));
}

TEST(BoundedCacheTest, EmplaceReplacesAndMarks) {
  BoundedCache<int, int> cache(2);
  cache.Emplace(1, 10);
  cache.Emplace(2, 20);
  EXPECT_EQ(cache.Emplace(1, 11), 11);  // 2 is now the least recent
  cache.Emplace(3, 30);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Peek(2), nullptr);
  EXPECT_EQ(*cache.Peek(1), 11);
}

TEST(BoundedCacheTest, ZeroCapacityKeepsTheLatest) {
  BoundedCache<int, int> cache(0);
  EXPECT_EQ(cache.Emplace(1, 10), 10);
  EXPECT_EQ(cache.Emplace(2, 20), 20);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(*cache.Find(2), 20);
}

TEST(BoundedCacheTest, LooksUpThroughAViewOfTheKey) {
  BoundedCache<std::tuple<Shape, Shape>, int> cache;
  EXPECT_EQ(cache.capacity(), (BoundedCache<int, int>::kDefaultCapacity));
  const Shape a{2, 3}, b{3};
  cache.Emplace(std::make_tuple(a, b), 7);
  ASSERT_NE(cache.Find(std::tie(a, b)), nullptr);
  EXPECT_EQ(*cache.Find(std::tie(a, b)), 7);
  EXPECT_EQ(cache.Find(std::tie(b, a)), nullptr);
}

TEST(BoundedCacheTest, MovesWithItsEntries) {
  BoundedCache<int, int> cache(2);
  cache.Emplace(1, 10);
  cache.Emplace(2, 20);
  BoundedCache<int, int> moved(std::move(cache));
  ASSERT_NE(moved.Find(1), nullptr);  // 2 is now the least recent
  moved.Emplace(3, 30);
  EXPECT_EQ(moved.size(), 2u);
  EXPECT_FALSE(moved.contains(2));
  EXPECT_TRUE(moved.contains(1));
}

class KernelShapeCacheTest : public ::testing::Test {
 protected:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

// Rows 1..200 through one matmul, then the first counts again (dropped by
// then): every answer matches the reference, and at most
// kShapeCacheCapacity primitives are kept.
TEST_F(KernelShapeCacheTest, MatMulOverManyRowCounts) {
  constexpr int64_t k = 24, n = 40;
  const Tensor x = RandomTensor({kRowCounts, k}, 1);
  const Tensor w = RandomTensor({k, n}, 2);
  const Tensor bias = RandomTensor({n}, 3);
  auto expected = GemmRef(x, w, &bias, {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  *expected = ReluRef(*expected);
  auto mm = MatMulOnednn::Create(
      engine_, {.k = k, .n = n, .weights = w.data.data(), .bias = bias.data, .relu = true});
  ASSERT_TRUE(mm.ok()) << mm.status();
  auto run = [&](int64_t m) {
    std::vector<float> y(m * n, -5.0f);
    absl::Status s = (*mm)->Execute(stream_, m, x.data.data(), y.data());
    ASSERT_TRUE(s.ok()) << "M=" << m << ": " << s;
    stream_.wait();
    // Rows are independent: m rows are the reference's first m.
    EXPECT_LT(NormalizedError(expected->data.data(), y.data(), m * n), 1e-10) << "M=" << m;
    EXPECT_LE((*mm)->cached_shapes(), kShapeCacheCapacity) << "after M=" << m;
  };
  for (int64_t m = 1; m <= kRowCounts; ++m) run(m);
  EXPECT_EQ((*mm)->cached_shapes(), kShapeCacheCapacity);
  EXPECT_EQ((*mm)->ImplementationName(1), "") << "M=1 was dropped";
  EXPECT_NE((*mm)->ImplementationName(kRowCounts), "");
  for (int64_t m = 1; m <= 5; ++m) run(m);
  EXPECT_NE((*mm)->ImplementationName(1), "") << "M=1 prepared again";
  EXPECT_EQ((*mm)->cached_shapes(), kShapeCacheCapacity);
}

// A conv between blocked activations at batches 1..200: a batch dropped
// and met again by Execute is prepared in the blocked layouts of the
// Prepare calls, not plain. The activation reorders stay bounded too.
TEST_F(KernelShapeCacheTest, ConvOverManyBatches) {
  constexpr int64_t c = 16, m = 16, hw = 6;
  const Tensor x = RandomTensor({kRowCounts, c, hw, hw}, 4);
  const Tensor w = RandomTensor({m, c, 3, 3}, 5);
  const Tensor b = RandomTensor({m}, 6);
  const WindowParams p{{3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}};
  auto expected = ConvRef(x, w, &b, p, 1, {kRowCounts, m, hw, hw});
  ASSERT_TRUE(expected.ok()) << expected.status();
  ConvOnednnOptions o;
  o.in_channels = c;
  o.out_channels = m;
  o.kernel = {3, 3};
  o.strides = {1, 1};
  o.dilations = {1, 1};
  o.pads_begin = {1, 1};
  o.pads_end = {1, 1};
  o.weights = w.data.data();
  o.bias = b.data;
  o.log_reference = false;
  auto conv = ConvOnednn::Create(engine_, std::move(o));
  ASSERT_TRUE(conv.ok()) << conv.status();
  ActivationReorder reorder(engine_);
  // Prepared (blocked) only for the first batch: later ones, and dropped
  // ones met again, are prepared by Execute.
  ASSERT_TRUE((*conv)->Prepare({1, c, hw, hw}, {1, m, hw, hw}, true, true).ok());
  auto run = [&](int64_t batch) {
    const Shape src{batch, c, hw, hw}, dst{batch, m, hw, hw};
    std::vector<float> xb(ActivationBytes(src, true) / sizeof(float));
    std::vector<float> yb(ActivationBytes(dst, true) / sizeof(float), -3.0f);
    std::vector<float> y(NumElements(dst));
    ASSERT_TRUE(reorder.Execute(stream_, src, x.data.data(), false, xb.data(), true).ok());
    absl::Status s = (*conv)->Execute(stream_, src, dst, xb.data(), yb.data());
    ASSERT_TRUE(s.ok()) << "batch " << batch << ": " << s;
    ASSERT_TRUE(reorder.Execute(stream_, dst, yb.data(), true, y.data(), false).ok());
    stream_.wait();
    EXPECT_LT(NormalizedError(expected->data.data(), y.data(), NumElements(dst)), 1e-10)
        << "batch " << batch << " on " << (*conv)->ImplementationName(src);
    EXPECT_LE((*conv)->cached_shapes(), kShapeCacheCapacity) << "after batch " << batch;
    EXPECT_LE(reorder.cached_shapes(), kShapeCacheCapacity) << "after batch " << batch;
  };
  for (int64_t batch = 1; batch <= kRowCounts; ++batch) run(batch);
  EXPECT_EQ((*conv)->cached_shapes(), kShapeCacheCapacity);
  EXPECT_EQ((*conv)->ImplementationName({1, c, hw, hw}), "") << "batch 1 was dropped";
  for (int64_t batch = 1; batch <= 5; ++batch) run(batch);
  EXPECT_NE((*conv)->ImplementationName({1, c, hw, hw}), "");
}

TEST_F(KernelShapeCacheTest, PoolOverManyBatches) {
  constexpr int64_t c = 8, hw = 6;
  const Tensor x = RandomTensor({kRowCounts, c, hw, hw}, 7);
  const WindowParams p{{2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0}};
  auto expected = PoolRef(PoolKind::kMax, x, p, false, {kRowCounts, c, hw / 2, hw / 2});
  ASSERT_TRUE(expected.ok()) << expected.status();
  PoolOnednn pool(engine_, dnnl::algorithm::pooling_max, p, false);
  auto run = [&](int64_t batch) {
    const Shape src{batch, c, hw, hw}, dst{batch, c, hw / 2, hw / 2};
    std::vector<float> y(NumElements(dst), -3.0f);
    absl::Status s = pool.Execute(stream_, src, dst, x.data.data(), y.data());
    ASSERT_TRUE(s.ok()) << "batch " << batch << ": " << s;
    stream_.wait();
    EXPECT_LT(NormalizedError(expected->data.data(), y.data(), NumElements(dst)), 1e-12)
        << "batch " << batch;
    EXPECT_LE(pool.cached_shapes(), kShapeCacheCapacity) << "after batch " << batch;
  };
  for (int64_t batch = 1; batch <= kRowCounts; ++batch) run(batch);
  for (int64_t batch = 1; batch <= 5; ++batch) run(batch);
  EXPECT_EQ(pool.cached_shapes(), kShapeCacheCapacity);
}

TEST_F(KernelShapeCacheTest, ElementwiseAndSoftmaxOverManyRowCounts) {
  constexpr int64_t n = 12;
  const Tensor a = RandomTensor({kRowCounts, n}, 8);
  const Tensor row = RandomTensor({n}, 9);
  const Tensor b = RandomTensor({kRowCounts, n}, 10);
  auto softmax_expected = SoftmaxRef(a, -1, false);
  ASSERT_TRUE(softmax_expected.ok()) << softmax_expected.status();
  AddOnednn add(engine_);
  ReluOnednn relu(engine_);
  SoftmaxOnednn softmax(engine_, -1, false);
  auto run = [&](int64_t rows) {
    const Shape shape{rows, n};
    const int64_t count = rows * n;
    std::vector<float> expected(count), y(count, -3.0f);
    // a + a row (b broadcast), then b + a (a broadcast: the operands swap).
    AddBroadcast(a.data.data(), shape, row.data.data(), {n}, expected.data(), shape);
    ASSERT_TRUE(
        add.Execute(stream_, shape, a.data.data(), {n}, row.data.data(), shape, y.data()).ok());
    stream_.wait();
    EXPECT_LT(NormalizedError(expected.data(), y.data(), count), 1e-12) << "add, rows " << rows;
    AddBroadcast(row.data.data(), {n}, b.data.data(), shape, expected.data(), shape);
    ASSERT_TRUE(
        add.Execute(stream_, {n}, row.data.data(), shape, b.data.data(), shape, y.data()).ok());
    stream_.wait();
    EXPECT_LT(NormalizedError(expected.data(), y.data(), count), 1e-12) << "add, rows " << rows;
    ASSERT_TRUE(relu.Execute(stream_, count, a.data.data(), y.data()).ok());
    stream_.wait();
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(y[i], std::max(a.data[i], 0.0f)) << "relu, rows " << rows << ", element " << i;
    }
    ASSERT_TRUE(softmax.Execute(stream_, shape, a.data.data(), y.data()).ok());
    stream_.wait();
    EXPECT_LT(NormalizedError(softmax_expected->data.data(), y.data(), count), 1e-10)
        << "softmax, rows " << rows;
    EXPECT_LE(add.cached_shapes(), kShapeCacheCapacity) << "after rows " << rows;
    EXPECT_LE(relu.cached_shapes(), kShapeCacheCapacity) << "after rows " << rows;
    EXPECT_LE(softmax.cached_shapes(), kShapeCacheCapacity) << "after rows " << rows;
  };
  for (int64_t rows = 1; rows <= kRowCounts; ++rows) run(rows);
  for (int64_t rows = 1; rows <= 5; ++rows) run(rows);
  EXPECT_EQ(add.cached_shapes(), kShapeCacheCapacity);
  EXPECT_EQ(relu.cached_shapes(), kShapeCacheCapacity);
  EXPECT_EQ(softmax.cached_shapes(), kShapeCacheCapacity);
}

}  // namespace
}  // namespace numaserve::kernels
