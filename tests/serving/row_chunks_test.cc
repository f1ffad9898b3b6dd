// A batch of a batched model whose rows together need more activation
// bytes than its limit runs in chunks of rows that fit (RunRowsInChunks),
// with the answers of one run; the count that fits is found once per model;
// a batch of which one row does not fit, or of a model whose rows are not
// independent, is refused as before.
#include "serving/workers/row_chunks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::serving {
namespace {

using engine::testing::OnnxModelBuilder;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// x [n,16] -> MatMul w [16,32] -> Relu -> MatMul v [32,4] -> y [n,4]:
// rows independent, activations growing with the rows.
std::string TwoLayers() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 16}).Output("y", {-1, 4});
  kernels::Tensor w({16, 32}), v({32, 4});
  for (size_t i = 0; i < w.data.size(); ++i) w.data[i] = static_cast<float>(i % 7) * 0.125f - 0.3f;
  for (size_t i = 0; i < v.data.size(); ++i) v.data[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  b.Initializer("w", w).Initializer("v", v);
  b.Node("MatMul", {"x", "w"}, {"h"});
  b.Node("Relu", {"h"}, {"r"});
  b.Node("MatMul", {"r", "v"}, {"y"});
  return b.Save("row_chunks");
}

// x [n,16] -> x * x^T [n,n] -> ReduceMean over axis 1 -> y [n,1]: every
// row depends on every other, so its rows may not be split.
std::string Gram() {
  OnnxModelBuilder b;
  b.Input("x", {-1, 16}).Output("y", {-1, 1});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"x"}, {"xt"}), "perm", {1, 0});
  b.Node("MatMul", {"x", "xt"}, {"g"});
  auto& mean = b.Node("ReduceMean", {"g"}, {"y"});
  OnnxModelBuilder::AttrInts(mean, "axes", {1});
  OnnxModelBuilder::AttrInt(mean, "keepdims", 1);
  return b.Save("row_chunks_gram");
}

std::vector<float> Rows(int64_t n) {
  std::vector<float> x(n * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 11) * 0.1f - 0.4f;
  return x;
}

std::unique_ptr<engine::CompiledModel> Load(const std::string& path, int64_t limit) {
  engine::CompileOptions options;
  options.num_threads = 1;
  options.max_activation_bytes = limit;
  auto model = engine::CompiledModel::Load(path, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// The activation bytes `rows` rows of the model at `path` need, unlimited.
int64_t Needs(const std::string& path, int64_t rows) {
  auto model = Load(path, 0);
  if (model == nullptr) return -1;
  auto bytes = model->ActivationBytes(rows);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : -1;
}

// Runs `n` rows of `model` through RunRowsInChunks; y holds `cols` per row.
absl::Status RunRows(engine::CompiledModel& model, int64_t n, int64_t cols, std::vector<float>* y,
                     RowsThatFit* fit) {
  const std::vector<float> x = Rows(n);
  y->assign(n * cols, -7.0f);
  return RunRowsInChunks(model, n, {x.data()}, {y->data()}, {x.size() * sizeof(float)},
                         {y->size() * sizeof(float)}, fit);
}

TEST(RowChunksTest, ABatchOverTheLimitRunsInChunksThatFitWithTheAnswersOfOneRun) {
  const std::string path = TwoLayers();
  const int64_t need4 = Needs(path, 4), need5 = Needs(path, 5);
  ASSERT_LT(need4, need5);
  auto unlimited = Load(path, 0);
  auto model = Load(path, need4);
  ASSERT_TRUE(unlimited != nullptr && model != nullptr);
  std::vector<float> want, got;
  ASSERT_TRUE(RunRows(*unlimited, 11, 4, &want, nullptr).ok());
  // Alone, the 11 rows are refused.
  const std::vector<float> x = Rows(11);
  std::vector<float> y(11 * 4);
  ASSERT_EQ(model->Run(11, {x.data()}, {y.data()}).code(), absl::StatusCode::kResourceExhausted);
  RowsThatFit fit;
  absl::Status s = RunRows(*model, 11, 4, &got, &fit);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(fit.known);
  EXPECT_EQ(fit.rows, 4);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "element " << i;
  // Within the limit, batches run whole; the plans stay bounded.
  EXPECT_TRUE(RunRows(*model, 3, 4, &got, &fit).ok());
  EXPECT_LE(model->CachedBatchPlans().arena_bytes, need4 + 64);
}

TEST(RowChunksTest, ABatchOfWhichOneRowDoesNotFitIsRefusedWithTheEnginesError) {
  const std::string path = TwoLayers();
  const int64_t need1 = Needs(path, 1);
  ASSERT_GT(need1, 1);
  auto model = Load(path, need1 - 1);
  ASSERT_NE(model, nullptr);
  RowsThatFit fit;
  std::vector<float> y;
  absl::Status s = RunRows(*model, 6, 4, &y, &fit);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("a batch of 6 rows needs"));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("above the limit of ", need1 - 1)));
  EXPECT_TRUE(fit.known);
  EXPECT_EQ(fit.rows, 0);
  EXPECT_EQ(y, std::vector<float>(6 * 4, -7.0f)) << "nothing was written";
  s = RunRows(*model, 1, 4, &y, &fit);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(RowChunksTest, AModelWhoseRowsAreNotIndependentIsRefusedNotSplit) {
  const std::string path = Gram();
  const int64_t need4 = Needs(path, 4);
  auto model = Load(path, need4);
  ASSERT_NE(model, nullptr);
  ASSERT_FALSE(model->info().batched);
  RowsThatFit fit;
  std::vector<float> y;
  EXPECT_TRUE(RunRows(*model, 4, 1, &y, &fit).ok());
  absl::Status s = RunRows(*model, 9, 1, &y, &fit);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("a batch of 9 rows needs"));
  EXPECT_FALSE(fit.known) << "no search for a model that cannot be split";
  EXPECT_EQ(y, std::vector<float>(9, -7.0f));
}

// Rows of 2 floats in, 1 out: y = x0 + 10 x1; a run of more than 4 rows,
// or an ActivationBytes above 4, is refused as the engine's limit would.
class CountingModel : public engine::CompiledModel {
 public:
  CountingModel() {
    info_.path = "counting.onnx";
    info_.batched = true;
    info_.inputs = {{"x", engine::DataType::kFloat32, {-1, 2}}};
    info_.outputs = {{"y", engine::DataType::kFloat32, {-1, 1}}};
  }
  const engine::ModelInfo& info() const override { return info_; }
  std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const override {
    return {{batch, 1}};
  }
  absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs) override {
    runs.push_back(batch);
    if (batch > kFits) return absl::ResourceExhaustedError(absl::StrCat("a batch of ", batch));
    const float* x = static_cast<const float*>(inputs[0]);
    float* y = static_cast<float*>(outputs[0]);
    for (int64_t i = 0; i < batch; ++i) y[i] = x[2 * i] + 10 * x[2 * i + 1];
    return absl::OkStatus();
  }
  absl::Status CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const override {
    const auto rows = static_cast<size_t>(batch);
    if (input_bytes != std::vector<size_t>{rows * 8} ||
        output_bytes != std::vector<size_t>{rows * 4}) {
      return absl::InvalidArgumentError("wrong sizes");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> ActivationBytes(int64_t batch) override {
    ++probes;
    if (batch > kFits) return absl::ResourceExhaustedError("over");
    return batch * 100;
  }

  static constexpr int64_t kFits = 4;
  std::vector<int64_t> runs;
  int probes = 0;

 private:
  engine::ModelInfo info_;
};

TEST(RowChunksTest, TheCountThatFitsIsFoundOnceAndChunksAreConsecutiveRowSlices) {
  CountingModel model;
  RowsThatFit fit;
  auto run = [&](int64_t n) {
    std::vector<float> x(2 * n), y(n, -1.0f);
    for (int64_t i = 0; i < n; ++i) x[2 * i] = static_cast<float>(i), x[2 * i + 1] = 1.0f;
    absl::Status s =
        RunRowsInChunks(model, n, {x.data()}, {y.data()}, {x.size() * 4}, {y.size() * 4}, &fit);
    EXPECT_TRUE(s.ok()) << s;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], static_cast<float>(i) + 10) << "row " << i;
  };
  run(11);
  EXPECT_THAT(model.runs, ElementsAre(11, 4, 4, 3));
  EXPECT_EQ(fit.rows, 4);
  const int probes = model.probes;
  EXPECT_GT(probes, 0);
  EXPECT_LE(probes, 4) << "a binary search below 11";
  // Known now: a batch over it goes to chunks at once, with no search.
  model.runs.clear();
  run(9);
  EXPECT_THAT(model.runs, ElementsAre(4, 4, 1));
  EXPECT_EQ(model.probes, probes);
  model.runs.clear();
  run(4);
  EXPECT_THAT(model.runs, ElementsAre(4));
}

TEST(RowChunksTest, LargestRowsThatFitIsTheCountBelowTheFirstThatDoesNot) {
  CountingModel model;
  EXPECT_EQ(LargestRowsThatFit(model, 5), 4);
  EXPECT_EQ(LargestRowsThatFit(model, 1000), 4);
  EXPECT_EQ(LargestRowsThatFit(model, 1), 0);
}

// At a signature (the worker's path for a shape-polymorphic batch): the
// batch and its chunks run at the signature with dim 0 at their rows, and a
// count found at other non-batch dims is found again.
TEST(RowChunksTest, ABatchAtASignatureRunsInChunksAtThatSignature) {
  const std::string path = TwoLayers();
  const int64_t need4 = Needs(path, 4);
  auto unlimited = Load(path, 0);
  auto model = Load(path, need4);
  ASSERT_TRUE(unlimited != nullptr && model != nullptr);
  std::vector<float> want;
  ASSERT_TRUE(RunRows(*unlimited, 11, 4, &want, nullptr).ok());
  const std::vector<float> x = Rows(11);
  std::vector<float> y(11 * 4, -7.0f);
  RowsThatFit fit;
  fit.known = true;  // found at other non-batch dims: not this signature's
  fit.rows = 1;
  fit.signature = {2, 99};
  absl::Status s = RunRowsInChunks(*model, 11, {x.data()}, {y.data()}, {x.size() * sizeof(float)},
                                   {y.size() * sizeof(float)}, &fit, {{11, 16}});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(fit.rows, 4);
  EXPECT_EQ(fit.signature, (std::vector<int64_t>{2, 16}));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-5) << "element " << i;
}

}  // namespace
}  // namespace numaserve::serving
