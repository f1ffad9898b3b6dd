// CompiledModel's step profile (SetProfiling / Profile) and its text and
// JSON forms, as `numaserve bench --profile` prints them: one row per
// compiled step plus one per residual reorder, counted per Run, with
// shares that add up to the whole.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// conv1 -> relu -> conv2 (+ residual r1) -> relu -> maxpool -> gap ->
// flatten -> gemm: conv steps, a residual copy, pools, a matmul.
std::string ResidualModel() {
  OnnxModelBuilder b(13);
  b.Input("x", {-1, 8, 12, 12}).Output("y", {-1, 4});
  b.Initializer("w1", RandomTensor({8, 8, 3, 3}, 1)).Initializer("b1", RandomTensor({8}, 2));
  b.Initializer("w2", RandomTensor({8, 8, 3, 3}, 3));
  b.Initializer("fc", RandomTensor({4, 8}, 4)).Initializer("fcb", RandomTensor({4}, 5));
  OnnxModelBuilder::AttrInts(b.Node("Conv", {"x", "w1", "b1"}, {"c1"}, "conv1"), "pads",
                             {1, 1, 1, 1});
  b.Node("Relu", {"c1"}, {"r1"}, "relu1");
  OnnxModelBuilder::AttrInts(b.Node("Conv", {"r1", "w2"}, {"c2"}, "conv2"), "pads", {1, 1, 1, 1});
  b.Node("Add", {"c2", "r1"}, {"s2"}, "add2");
  b.Node("Relu", {"s2"}, {"r2"}, "relu2");
  auto& mp = b.Node("MaxPool", {"r2"}, {"p"}, "pool");
  OnnxModelBuilder::AttrInts(mp, "kernel_shape", {2, 2});
  OnnxModelBuilder::AttrInts(mp, "strides", {2, 2});
  b.Node("GlobalAveragePool", {"p"}, {"g"}, "gap");
  b.Node("Flatten", {"g"}, {"f"}, "flatten");
  OnnxModelBuilder::AttrInt(b.Node("Gemm", {"f", "fc", "fcb"}, {"y"}, "fc"), "transB", 1);
  return b.Save("profile_resblock");
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The share column ("12.5%") of the rows between a header line starting
// with `header` and the next line that does not start with `row_prefix`.
double ShareSum(const std::vector<std::string>& lines, const std::string& header,
                const std::string& row_prefix, int* rows) {
  double sum = 0;
  *rows = 0;
  size_t i = 0;
  while (i < lines.size() && lines[i].find(header) != 2) ++i;
  for (++i; i < lines.size() && lines[i].rfind(row_prefix, 0) == 0; ++i) {
    const size_t pct = lines[i].find('%');
    if (pct == std::string::npos) break;
    size_t begin = lines[i].rfind(' ', pct);
    sum += std::strtod(lines[i].c_str() + begin + 1, nullptr);
    ++*rows;
  }
  return sum;
}

TEST(StepProfileTest, ListsEveryStepAndItsResidualReorderPerRun) {
  auto model = CompiledModel::Load(ResidualModel(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::string> plan = Lines((*model)->DescribePlan());
  ASSERT_EQ(plan.size(), 5u) << (*model)->DescribePlan();  // conv, conv, pool, pool, matmul
  EXPECT_TRUE((*model)->Profile().empty()) << "no profile before SetProfiling";

  std::vector<float> x(3 * 8 * 12 * 12, 0.25f), y(3 * 4);
  (*model)->SetProfiling(true);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*model)->Run(3, {x.data()}, {y.data()}).ok());
  (*model)->SetProfiling(false);
  ASSERT_TRUE((*model)->Run(3, {x.data()}, {y.data()}).ok());  // not counted

  const std::vector<StepProfile> rows = (*model)->Profile();
  ASSERT_EQ(rows.size(), plan.size() + 1);  // + conv2's residual copy
  size_t step = 0;
  for (const StepProfile& row : rows) {
    EXPECT_EQ(row.calls, 4) << row.description;
    EXPECT_GE(row.seconds, 0.0) << row.description;
    if (row.kind == "reorder") {
      EXPECT_EQ(row.description, "reorder: residual into " + plan[step - 1]);
      EXPECT_EQ(row.index, static_cast<int>(step - 1));
      continue;
    }
    EXPECT_EQ(row.description, plan[step]);
    EXPECT_EQ(row.index, static_cast<int>(step));
    ++step;
  }
  EXPECT_EQ(rows[0].kind, "conv");
  EXPECT_GT(rows[0].seconds, 0.0);
  EXPECT_THAT(rows[0].layouts, HasSubstr("->"));
  EXPECT_FALSE(rows[0].implementation.empty());
  // conv1: 3 rows x 8 out channels x 12x12 outputs x 8 in channels x 3x3, x2, per call.
  EXPECT_DOUBLE_EQ(rows[0].flops, 4 * 2.0 * 3 * 8 * 12 * 12 * 8 * 9);
  EXPECT_EQ(rows[2].kind, "reorder");
  EXPECT_EQ(rows.back().kind, "matmul");
  EXPECT_DOUBLE_EQ(rows.back().flops, 4 * 2.0 * 3 * 4 * 8);

  // Restarting clears the sums.
  (*model)->SetProfiling(true);
  ASSERT_TRUE((*model)->Run(1, {x.data()}, {y.data()}).ok());
  for (const StepProfile& row : (*model)->Profile()) EXPECT_EQ(row.calls, 1) << row.description;
}

TEST(StepProfileTest, TextSharesAddUpToTheTimeInSteps) {
  auto model = CompiledModel::Load(ResidualModel(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> x(2 * 8 * 12 * 12, 0.5f), y(2 * 4);
  (*model)->SetProfiling(true);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*model)->Run(2, {x.data()}, {y.data()}).ok());
  const std::vector<StepProfile> rows = (*model)->Profile();
  double in_steps = 0;
  for (const StepProfile& r : rows) in_steps += r.seconds;
  ASSERT_GT(in_steps, 0.0);

  const std::string text = FormatStepProfile(rows, 3, 0, in_steps * 1.5);
  const std::vector<std::string> lines = Lines(text);
  EXPECT_THAT(lines[0], HasSubstr("3 runs:"));
  EXPECT_THAT(lines[0], HasSubstr("outside steps"));
  int kinds = 0, top = 0;
  EXPECT_NEAR(ShareSum(lines, "kind", "  ", &kinds), 100.0, 0.5) << text;
  EXPECT_EQ(kinds, 4) << text;  // conv, matmul, pool, reorder
  EXPECT_NEAR(ShareSum(lines, "top", "  #", &top), 100.0, 0.5) << text;
  EXPECT_EQ(top, static_cast<int>(rows.size())) << text;
  EXPECT_THAT(text, HasSubstr("layout boundaries and residual reorders"));
  EXPECT_THAT(text, HasSubstr("reorder: residual into conv: conv2+add2+relu2"));
  EXPECT_THAT(text, HasSubstr("conv: conv1+relu1 ["));

  // --top 2 lists the two costliest rows only.
  const std::vector<std::string> two = Lines(FormatStepProfile(rows, 3, 2));
  int listed = 0;
  ShareSum(two, "top", "  #", &listed);
  EXPECT_EQ(listed, 2);

  const std::string json = StepProfileJson(rows, 3, in_steps);
  EXPECT_THAT(json, HasSubstr("\"runs\": 3"));
  EXPECT_THAT(json, HasSubstr("\"kind\": \"reorder\""));
  EXPECT_THAT(json, HasSubstr("\"step\": \"matmul: fc"));
}

// Steps below the thresholds run on the calling thread alone, and on every
// thread when the thresholds are 0; both ways give the reference's results.
// The thresholds are explicit here: the default ones follow the fork-join
// cost measured at load and the CPU's peak, and on a slow core (a Zen 1
// EPYC's 37.8 GFLOP/s) they fell below this model's 0.17 MFLOP convs in one
// run under ctest -j2 and not in another.
TEST(StepProfileTest, SmallStepsRunOnOneThread) {
  const std::string path = ResidualModel();
  const CompileOptions serial_options{
      .num_threads = 2, .serial_below_flops = 1e8, .serial_below_elements = 1 << 24};
  testing::ExpectCompiledMatchesReference("serial", path, {1, 3}, 1e-9, serial_options);
  testing::ExpectCompiledMatchesReference(
      "parallel", path, {1, 3}, 1e-9,
      {.num_threads = 2, .serial_below_flops = 0, .serial_below_elements = 0});
  // The default thresholds exist for more than one thread.
  EXPECT_GT(DefaultSerialBelowFlops(2), 0);
  EXPECT_EQ(DefaultSerialBelowFlops(1), 0);
  std::vector<float> x(8 * 12 * 12, 0.25f), y(4);
  for (bool serial : {true, false}) {
    CompileOptions options = serial_options;
    if (!serial) options.serial_below_flops = 0, options.serial_below_elements = 0;
    auto model = CompiledModel::Load(path, options);
    ASSERT_TRUE(model.ok()) << model.status();
    (*model)->SetProfiling(true);
    ASSERT_TRUE((*model)->Run(1, {x.data()}, {y.data()}).ok());
    for (const StepProfile& row : (*model)->Profile()) {
      if (row.kind == "reorder") continue;
      EXPECT_EQ(row.threads, serial ? 1 : 2) << row.description;
    }
  }
}

}  // namespace
}  // namespace numaserve::engine
