// Batch groups (engine/compiler/batch_groups.h): a batch of enough rows runs as row
// ranges at once, each on its own copy of the model with its share of the
// threads. The results match one team's and the reference executor's at
// batches that split evenly, unevenly, and not at all; a model whose rows
// are not independent is never grouped; groups are off by default.
#include "engine/compiler/batch_groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/model.h"
#include "tests/engine/bottleneck_block.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::kUnknownDim;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// x [N,8,12,12] -> 3x3 conv to 32 ch -> a bottleneck block with its
// residual Add -> global average pool -> Flatten -> Gemm to 10; and a
// second output, the pooled features [N,32].
std::string CnnModel() {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 8, 12, 12}).Output("y", {-1, 10}).Output("f", {-1, 32});
  b.Initializer("w0", RandomTensor({32, 8, 3, 3}, 1));
  b.Initializer("b0", RandomTensor({32}, 2));
  OnnxModelBuilder::AttrInts(b.Node("Conv", {"x", "w0", "b0"}, {"c0"}, "stem"), "pads",
                             {1, 1, 1, 1});
  b.Node("Relu", {"c0"}, {"r0"}, "stem_relu");
  const std::string block = testing::AddBottleneckBlock(b, 1, "r0", 32);
  b.Node("GlobalAveragePool", {block}, {"g"}, "gap");
  b.Node("Flatten", {"g"}, {"f"}, "flatten");
  b.Initializer("wf", RandomTensor({10, 32}, 60));
  b.Initializer("bf", RandomTensor({10}, 61));
  OnnxModelBuilder::AttrInt(b.Node("Gemm", {"f", "wf", "bf"}, {"y"}, "fc"), "transB", 1);
  return b.Save("batch_groups_cnn");
}

CompileOptions Grouped(int groups) {
  CompileOptions o;
  o.num_threads = 2;
  o.batch_groups = groups;
  o.batch_group_min_rows = 2;
  return o;
}

std::vector<float> Input(int64_t batch) {
  return RandomTensor({batch, 8, 12, 12}, 7 + static_cast<uint32_t>(batch)).data;
}

TEST(BatchGroupsTest, GroupedRunsMatchOneTeamAndTheReference) {
  const std::string path = CnnModel();
  // Batches 1-3 run on the whole team (fewer than 2 x 2 rows); 4 and 8 in
  // two equal groups, 5 and 7 in unequal ones.
  testing::ExpectCompiledMatchesReference("grouped", path, {1, 3, 4, 5, 7, 8}, 1e-9, Grouped(2));
  auto grouped = CompiledModel::Load(path, Grouped(2));
  auto one = CompiledModel::Load(path, Grouped(1));
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT((*grouped)->DescribeBatchGroups(), HasSubstr("2 x 1 threads"));
  EXPECT_EQ((*one)->DescribeBatchGroups(), "");
  for (int64_t batch : {3, 4, 7, 8, 4}) {
    const std::vector<float> x = Input(batch);
    std::vector<float> ya(batch * 10, -1), fa(batch * 32, -1), yb(batch * 10, -2),
        fb(batch * 32, -2);
    ASSERT_TRUE((*grouped)->Run(batch, {x.data()}, {ya.data(), fa.data()}).ok());
    ASSERT_TRUE((*one)->Run(batch, {x.data()}, {yb.data(), fb.data()}).ok());
    EXPECT_LT(testing::NormalizedError(yb, ya.data()), 1e-10) << "batch " << batch;
    EXPECT_LT(testing::NormalizedError(fb, fa.data()), 1e-10) << "batch " << batch;
  }
  // The groups' activations together, as one team's at the same batch.
  auto bytes = (*grouped)->ActivationBytes(8);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, 0);
}

// The most threads any step ran on in one profiled run of `batch` rows.
int MostThreads(CompiledModel& model, int64_t batch) {
  const std::vector<float> x = Input(batch);
  std::vector<float> y(batch * 10), f(batch * 32);
  model.SetProfiling(true);
  EXPECT_TRUE(model.Run(batch, {x.data()}, {y.data(), f.data()}).ok());
  model.SetProfiling(false);
  int most = 0;
  for (const StepProfile& row : model.Profile()) most = std::max(most, row.threads);
  return most;
}

TEST(BatchGroupsTest, EveryGroupOrNone) {
  CompileOptions o = Grouped(2);
  o.serial_below_flops = 0;  // every step on its whole team
  o.serial_below_elements = 0;
  auto model = CompiledModel::Load(CnnModel(), o);
  ASSERT_TRUE(model.ok()) << model.status();
  // 3 rows cannot give both groups 2: the whole team of 2 threads runs it.
  EXPECT_EQ(MostThreads(**model, 3), 2);
  // 4 rows: both groups, one thread each (group 0's profile).
  EXPECT_EQ(MostThreads(**model, 4), 1);
}

TEST(BatchGroupsTest, ABadCallIsRefusedAsOneTeamWouldRefuseIt) {
  auto grouped = CompiledModel::Load(CnnModel(), Grouped(2));
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  const std::vector<float> x = Input(8);
  std::vector<float> y(8 * 10), f(8 * 32);
  // One output buffer missing: the run is refused as one team's would be.
  absl::Status s = (*grouped)->Run(8, {x.data()}, {y.data()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = (*grouped)->Run(8, {x.data()}, {y.data(), nullptr});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // And the model still runs afterwards.
  EXPECT_TRUE((*grouped)->Run(8, {x.data()}, {y.data(), f.data()}).ok());
}

TEST(BatchGroupsTest, AModelWhoseRowsMeetIsNeverGrouped) {
  // x [n,3] times its transpose: every row against every row.
  OnnxModelBuilder b;
  b.Input("x", {-1, 3}).Output("y", {-1, kUnknownDim});
  OnnxModelBuilder::AttrInts(b.Node("Transpose", {"x"}, {"xt"}, "t"), "perm", {1, 0});
  b.Node("MatMul", {"x", "xt"}, {"y"}, "gram");
  auto model = CompiledModel::Load(b.Save("batch_groups_gram"), Grouped(2));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->DescribeBatchGroups(), "");
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> y(16);
  ASSERT_TRUE((*model)->Run(4, {x.data()}, {y.data()}).ok());
  EXPECT_FLOAT_EQ(y[1], 1 * 4 + 2 * 5 + 3 * 6);  // row 0 against row 1
  EXPECT_FLOAT_EQ(y[12], 10 * 1 + 11 * 2 + 12 * 3);
}

TEST(BatchGroupsTest, GroupCountsAndRowFloors) {
  CompileOptions o;
  EXPECT_EQ(BatchGroupsFor(o, 16), 1);  // off by default
  o.batch_groups = 1;
  EXPECT_EQ(BatchGroupsFor(o, 16), 1);
  o.batch_groups = 4;
  EXPECT_EQ(BatchGroupsFor(o, 16), 4);
  EXPECT_EQ(BatchGroupsFor(o, 2), 2);  // never more groups than threads
  o.batch_groups = 8;
  EXPECT_EQ(BatchGroupsFor(o, 3), 3);
  // At least 4 rows and 1 GFLOP a group; never for a model without FLOPs.
  EXPECT_EQ(MinRowsPerGroup(8.18e9), 4);  // ResNet-50
  EXPECT_EQ(MinRowsPerGroup(6.0e8), 4);   // MobileNetV2
  EXPECT_EQ(MinRowsPerGroup(3.7e6), 271);
  EXPECT_EQ(MinRowsPerGroup(0), 0);
  // A count below 1 is refused at load.
  CompileOptions bad;
  bad.batch_groups = 0;
  EXPECT_EQ(CompiledModel::Load(CnnModel(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace numaserve::engine
