// A compiled model run at every batch size from 1 to 300 (as a model served
// without batching is, one request at a time) keeps bounded state: the
// batch plans are bounded (batch_plans_test), and so are the per-shape
// primitives and broadcast plans of its steps; sizes whose state was dropped
// answer as before.
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/compiler/compiled_steps.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/reference/reference_executor.h"
#include "kernels/bounded_cache.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::NormalizedError;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

constexpr int64_t kBatches = 300;

// The process's resident bytes (/proc/self/statm), 0 if unreadable, after
// the heap's free pages are given back: what is counted is what is held.
int64_t ResidentBytes() {
  malloc_trim(0);
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// x [n,3,8,8] -> Conv 3x3 (16) -> Relu -> Conv 3x3 (16) + the Relu's output
// (a residual) -> MaxPool 2x2 -> Flatten -> MatMul [256,16] -> Mul by itself
// -> Add a row -> Softmax -> y [n,16]; z = MatMul(q, q) for q [n,4,4]
// (two runtime operands).
std::string SmallModel() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3, 8, 8}).Input("q", {-1, 4, 4});
  b.Output("y", {-1, 16}).Output("z", {-1, 4, 4});
  b.Initializer("w1", RandomTensor({16, 3, 3, 3}, 1)).Initializer("b1", RandomTensor({16}, 2));
  b.Initializer("w2", RandomTensor({16, 16, 3, 3}, 3))
      .Initializer("w3", RandomTensor({256, 16}, 4));
  b.Initializer("row", RandomTensor({16}, 5));
  auto& c1 = b.Node("Conv", {"x", "w1", "b1"}, {"c1"});
  OnnxModelBuilder::AttrInts(c1, "pads", {1, 1, 1, 1});
  b.Node("Relu", {"c1"}, {"r1"});
  auto& c2 = b.Node("Conv", {"r1", "w2"}, {"c2"});
  OnnxModelBuilder::AttrInts(c2, "pads", {1, 1, 1, 1});
  b.Node("Add", {"c2", "r1"}, {"s"});
  auto& pool = b.Node("MaxPool", {"s"}, {"p"});
  OnnxModelBuilder::AttrInts(pool, "kernel_shape", {2, 2});
  OnnxModelBuilder::AttrInts(pool, "strides", {2, 2});
  b.Node("Flatten", {"p"}, {"f"});
  b.Node("MatMul", {"f", "w3"}, {"m"});
  b.Node("Mul", {"m", "m"}, {"mm"});
  b.Node("Add", {"mm", "row"}, {"a"});
  b.Node("Softmax", {"a"}, {"y"});
  b.Node("MatMul", {"q", "q"}, {"z"});
  return b.Save("shape_cache");
}

TEST(ShapeCacheTest, ModelStaysBoundedOverManyBatchSizes) {
  const std::string path = SmallModel();
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.num_threads = 1;
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << model.status();
  CompiledModel& m = **model;
  const std::string plan = m.DescribePlan();
  for (const char* kind :
       {"conv:", "pool:", "matmul:", "binary:", "add:", "softmax:", "batched_matmul:"}) {
    EXPECT_NE(plan.find(kind), std::string::npos) << "no " << kind << " step in\n" << plan;
  }
  // Rows are independent: batch n's answers are the first n rows of the
  // largest batch's, computed once on the reference.
  const kernels::Tensor x = RandomTensor({kBatches, 3, 8, 8}, 10);
  const kernels::Tensor q = RandomTensor({kBatches, 4, 4}, 11);
  auto expected = RunReference(*graph, {x, q});
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->size(), 2u);
  auto run = [&](int64_t n) {
    std::vector<float> y(n * 16, -7.0f), z(n * 16, -7.0f);
    absl::Status s = m.Run(n, {x.data.data(), q.data.data()}, {y.data(), z.data()});
    ASSERT_TRUE(s.ok()) << "batch " << n << ": " << s;
    const std::vector<float> y_ref((*expected)[0].data.begin(),
                                   (*expected)[0].data.begin() + n * 16);
    const std::vector<float> z_ref((*expected)[1].data.begin(),
                                   (*expected)[1].data.begin() + n * 16);
    EXPECT_LT(NormalizedError(y_ref, y.data()), 1e-8) << "y at batch " << n;
    EXPECT_LT(NormalizedError(z_ref, z.data()), 1e-8) << "z at batch " << n;
  };
  // The largest batch first: the activation arena has its final size.
  run(kBatches);
  // Each step keeps at most kShapeCacheCapacity (128) shapes: up to there
  // every new size adds its primitives (~380 KB a size for this model on
  // AVX-512), past it a new size replaces the least recently run one. The
  // sizes come in a shuffled order, so the 128 kept when half are visited and
  // at the end are alike in size, and what grows between is what the caches
  // failed to drop.
  constexpr int64_t kFull = 150;
  static_assert(kFull > static_cast<int64_t>(kernels::kShapeCacheCapacity));
  std::vector<int64_t> order(kBatches);
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), std::mt19937(42));
  int64_t resident_when_full = 0;
  for (int64_t i = 0; i < kBatches; ++i) {
    run(order[i]);
    if (i + 1 == kFull) resident_when_full = ResidentBytes();
  }
  const int64_t growth = ResidentBytes() - resident_when_full;
  // Measured over the last 150 sizes: 1-2 MB (oneDNN's own primitive cache,
  // bounded at 1024, still filling); ~57 MB over the first 150, which is
  // what the last would add if the steps kept every size. Without giving
  // the heap's free pages back first, fragmentation alone read 12-16 MB.
  EXPECT_LT(growth, 16 << 20) << "resident bytes grew by " << growth << " over the last "
                              << kBatches - kFull << " sizes";
  EXPECT_LE(m.CachedBatchPlans().plans, options.batch_plans);
  // Sizes whose plans and primitives were dropped long ago.
  for (int64_t n = 1; n <= 5; ++n) run(n);
}

// BinaryStep and BatchedMatMulStep keep their per-shape state (broadcast
// plans, primitives) in bounded caches, and Run rebuilds a dropped entry
// without a new Prepare (the batch plan that prepared it may still be kept).
class StepShapeCacheTest : public ::testing::Test {
 protected:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

TEST_F(StepShapeCacheTest, BinaryStepOverManyRowCounts) {
  constexpr int64_t n = 8;
  const kernels::Tensor a = RandomTensor({kBatches, n}, 20);
  const kernels::Tensor b = RandomTensor({kBatches, 1}, 21);
  BinaryStep step(kernels::BinaryKind::kSub, 0, 1, 2, "sub");
  auto run = [&](int64_t rows, bool prepare) {
    const std::vector<Shape> shapes{{rows, n}, {rows, 1}, {rows, n}};
    std::vector<float> y(rows * n, -7.0f);
    const std::vector<float*> data{const_cast<float*>(a.data.data()),
                                   const_cast<float*>(b.data.data()), y.data()};
    if (prepare) {
      ASSERT_TRUE(step.Prepare(shapes).ok());
    }
    absl::Status s = step.Run(StepContext{stream_, shapes, data});
    ASSERT_TRUE(s.ok()) << "rows " << rows << ": " << s;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        ASSERT_EQ(y[r * n + c], a.data[r * n + c] - b.data[r]) << "rows " << rows;
      }
    }
    EXPECT_LE(step.CachedShapes(), kernels::kShapeCacheCapacity) << "after rows " << rows;
  };
  for (int64_t rows = 1; rows <= kBatches; ++rows) run(rows, true);
  EXPECT_EQ(step.CachedShapes(), kernels::kShapeCacheCapacity);
  for (int64_t rows = 1; rows <= 5; ++rows) run(rows, false);
}

TEST_F(StepShapeCacheTest, BatchedMatMulStepOverManyBatches) {
  const kernels::Tensor a = RandomTensor({kBatches, 3, 5}, 30);
  const kernels::Tensor b = RandomTensor({5, 4}, 31);
  BatchedMatMulStep step(engine_, 0, 1, 2, "bmm");
  auto run = [&](int64_t batch) {
    const std::vector<Shape> shapes{{batch, 3, 5}, {5, 4}, {batch, 3, 4}};
    std::vector<float> y(batch * 12, -7.0f);
    const std::vector<float*> data{const_cast<float*>(a.data.data()),
                                   const_cast<float*>(b.data.data()), y.data()};
    absl::Status s = step.Run(StepContext{stream_, shapes, data});
    ASSERT_TRUE(s.ok()) << "batch " << batch << ": " << s;
    stream_.wait();
    std::vector<float> expected(batch * 12, 0.0f);
    for (int64_t i = 0; i < batch * 3; ++i) {
      for (int64_t j = 0; j < 4; ++j) {
        for (int64_t k = 0; k < 5; ++k)
          expected[i * 4 + j] += a.data[i * 5 + k] * b.data[k * 4 + j];
      }
    }
    EXPECT_LT(NormalizedError(expected, y.data()), 1e-10) << "batch " << batch;
    EXPECT_LE(step.CachedShapes(), kernels::kShapeCacheCapacity) << "after batch " << batch;
  };
  for (int64_t batch = 1; batch <= kBatches; ++batch) run(batch);
  EXPECT_EQ(step.CachedShapes(), kernels::kShapeCacheCapacity);
  EXPECT_EQ(step.Implementation({{1, 3, 5}, {5, 4}, {1, 3, 4}}), "") << "batch 1 was dropped";
  for (int64_t batch = 1; batch <= 5; ++batch) run(batch);
  EXPECT_NE(step.Implementation({{1, 3, 5}, {5, 4}, {1, 3, 4}}), "");
}

}  // namespace
}  // namespace numaserve::engine
