// Full QDQ from `numaserve quantize` (engine/quantize/quantize_outputs.cc):
// a BatchNormalization after a conv is folded into it where it alone reads
// the conv (into weights of the conv's own); a quantized conv's
// output (after the Relu or Clip that alone reads it) that a quantized node
// reads is read through its QuantizeLinear -> DequantizeLinear pair by
// every reader, so the QuantizeLinear is its only reader (the pattern ONNX
// Runtime runs as QLinearConv); a conv output only a residual Add reads
// gets no pair; the file passes ONNX's checker; and numaserve runs it with
// every conv INT8 (an INT8 conv reading a pair that an FP32 Add reads too),
// the pairs folded into the convs before them, the residual Add still the
// conv's sum, within INT8's error of FP32.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/quantize/quantize.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/conv_bn_block.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::ConvBnBlocks;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// A ReLU6 stem (Clip) read by a heavy 3x3 conv and by a residual Add; a
// 1x1 conv whose output only that Add reads; a strided 3x3 after the
// Add's Relu; pooling and a Gemm.
std::string ResidualCnn() {
  OnnxModelBuilder b;
  uint32_t seed = 31;
  ConvBnBlocks blocks(&b, &seed, /*unit_gain=*/true);
  b.Input("x", {-1, 3, 16, 16});
  blocks.Add("x", "c1", 3, 16, 3, 1, 1, "relu6");
  blocks.Add("c1", "c2", 16, 16, 3, 1, 1, "relu");
  blocks.Add("c2", "c3", 16, 16, 1, 1, 1, "");
  b.Node("Add", {"c3", "c1"}, {"res"}, "res");
  b.Node("Relu", {"res"}, {"res_relu"}, "res_relu");
  blocks.Add("res_relu", "c4", 16, 32, 3, 2, 1, "");
  b.Node("GlobalAveragePool", {"c4"}, {"gap"}, "gap");
  b.Node("Flatten", {"gap"}, {"flat"}, "flat");
  b.Initializer("fc_w", RandomTensor({10, 32}, seed++));
  auto& fc = b.Node("Gemm", {"flat", "fc_w"}, {"y"}, "fc");
  OnnxModelBuilder::AttrInt(fc, "transB", 1);
  b.Output("y", {-1, 10});
  return b.Save("full_qdq_residual_cnn");
}

// The op types of the nodes reading each tensor of `graph`.
std::map<std::string, std::vector<std::string>> ReaderOps(const onnx::GraphProto& graph) {
  std::map<std::string, std::vector<std::string>> readers;
  for (const auto& n : graph.node()) {
    for (const auto& in : n.input()) readers[in].push_back(n.op_type());
  }
  return readers;
}

struct Quantized {
  std::string path;
  onnx::ModelProto proto;
  QuantizeReport report;
};

Quantized QuantizeOnRandomRows(const std::string& fp32) {
  std::vector<CalibrationBatch> calibration;
  for (uint32_t i = 0; i < 4; ++i) {
    CalibrationBatch batch;
    batch.rows = 8;
    batch.inputs.push_back(RandomTensor({8, 3, 16, 16}, 300 + i).data);
    calibration.push_back(std::move(batch));
  }
  Quantized q;
  auto model = QuantizeModel(fp32, calibration, QuantizeOptions());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return q;
  q.report = model->report;
  EXPECT_TRUE(q.proto.ParseFromString(model->onnx));
  q.path = absl::StrCat(::testing::TempDir(), "/full_qdq_", getpid(), ".onnx");
  std::ofstream(q.path, std::ios::binary) << model->onnx;
  return q;
}

TEST(Int8FullQdqTest, QuantizedConvOutputsAreReadThroughTheirPairAlone) {
  const Quantized q = QuantizeOnRandomRows(ResidualCnn());
  ASSERT_FALSE(q.path.empty());
  const onnx::GraphProto& g = q.proto.graph();
  try {
    onnx::checker::check_model(q.proto, /*full_check=*/true);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "ONNX checker: " << e.what();
  }
  EXPECT_EQ(q.report.folded.size(), 4u);
  const auto readers = ReaderOps(g);
  int convs = 0;
  for (const auto& n : g.node()) {
    EXPECT_NE(n.op_type(), "BatchNormalization") << n.name() << " was not folded";
    if (n.op_type() != "Conv") continue;
    ++convs;
    std::string value = n.output(0);
    // The conv alone writes its Relu's or Clip's input.
    while (readers.count(value) && readers.at(value).size() == 1 &&
           (readers.at(value)[0] == "Relu" || readers.at(value)[0] == "Clip")) {
      for (const auto& r : g.node()) {
        if (!r.input().empty() && r.input(0) == value) {
          value = r.output(0);
          break;
        }
      }
    }
    ASSERT_TRUE(readers.count(value)) << value << ", written by " << n.name() << ", is not read";
    const std::vector<std::string>& ops = readers.at(value);
    if (std::count(ops.begin(), ops.end(), "QuantizeLinear") > 0) {
      EXPECT_THAT(ops, ::testing::ElementsAre("QuantizeLinear"))
          << value << ", written by " << n.name() << ": a reader reads it unquantized";
    }
  }
  EXPECT_EQ(convs, 4);
  // The stem's ReLU6 output: its pair is read by c2 and by the Add.
  ASSERT_TRUE(readers.count("c1") && readers.count("c1_dequantized") && readers.count("c3"));
  EXPECT_THAT(readers.at("c1"), ::testing::ElementsAre("QuantizeLinear"));
  EXPECT_THAT(readers.at("c1_dequantized"), ::testing::UnorderedElementsAre("Conv", "Add"));
  // The 1x1's output, which only the Add reads: no pair.
  EXPECT_THAT(readers.at("c3"), ::testing::ElementsAre("Add"));
}

TEST(Int8FullQdqTest, RunsEveryConvInt8WithThePairsFoldedWithinInt8ErrorOfFp32) {
  const std::string fp32_path = ResidualCnn();
  const Quantized q = QuantizeOnRandomRows(fp32_path);
  ASSERT_FALSE(q.path.empty());
  CompileOptions options;  // INT8 on any CPU, however light the conv
  options.int8_kernels = CompileOptions::Int8Kernels::kAlways;
  options.int8_min_flops_per_input = 0;
  auto graph = ImportOnnxModel(q.path);
  auto model = CompiledModel::Load(q.path, options);
  auto fp32 = CompiledModel::Load(fp32_path, CompileOptions());
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  const std::string plan = (*model)->DescribePlan();
  // The stem's pair in the stem's post-ops, the Add in c3 as its sum.
  EXPECT_THAT(plan, HasSubstr("c1_clip+c1_QuantizeLinear+c1_DequantizeLinear")) << plan;
  EXPECT_THAT(plan, Not(HasSubstr("fake-quantize: c1_"))) << plan;
  EXPECT_THAT(plan, HasSubstr("c3_conv+res+res_relu")) << plan;
  for (int64_t batch : {1, 5}) {
    SCOPED_TRACE(absl::StrCat("batch ", batch));
    const kernels::Tensor x = RandomTensor({batch, 3, 16, 16}, 700 + static_cast<uint32_t>(batch));
    auto expected = RunReference(*graph, {x});
    ASSERT_TRUE(expected.ok()) << expected.status();
    std::vector<float> y(batch * 10, -7.0f), y32(batch * 10, -7.0f);
    ASSERT_TRUE((*model)->Run(batch, {x.data.data()}, {y.data()}).ok());
    ASSERT_TRUE((*fp32)->Run(batch, {x.data.data()}, {y32.data()}).ok());
    EXPECT_LT(testing::NormalizedError((*expected)[0].data, y.data()), 1e-4);
    double err = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err = std::max(err, std::abs(static_cast<double>(y[i]) - y32[i]));
      scale = std::max(scale, std::abs(static_cast<double>(y32[i])));
    }
    EXPECT_LT(err / scale, 0.05);
    EXPECT_GT(err, 0) << "bit-equal to FP32: INT8 did not run";
    auto steps = (*model)->PlanAt(batch);
    ASSERT_TRUE(steps.ok()) << steps.status();
    int int8 = 0;
    for (const PlannedStep& s : *steps) {
      if (s.kind != "conv" && s.kind != "matmul") continue;
      EXPECT_THAT(s.implementation, HasSubstr("int8")) << s.description;
      EXPECT_FALSE(s.reference) << s.description << " on " << s.implementation;
      ++int8;
    }
    EXPECT_EQ(int8, 5);
  }
}

// Two convs sharing one weight tensor: the first's BatchNormalization
// folds (into weights of its own: the second conv still reads the
// original), the second's does not, since a Relu reads the conv's output
// too; the model keeps its meaning within INT8's error.
TEST(Int8FullQdqTest, ABatchNormalizationFoldsOnlyWhereItAloneReadsTheConv) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 8, 8, 8});
  kernels::Tensor w = RandomTensor({8, 8, 3, 3}, 41);
  for (float& v : w.data) v *= 0.2f;
  b.Initializer("w", w);
  for (const std::string p : {"a", "b"}) {
    kernels::Tensor var = RandomTensor({8}, 43);
    for (float& v : var.data) v = 1.0f + std::abs(v);
    b.Initializer(p + "_scale", RandomTensor({8}, 42));
    b.Initializer(p + "_bias", RandomTensor({8}, 44));
    b.Initializer(p + "_mean", RandomTensor({8}, 45));
    b.Initializer(p + "_var", var);
  }
  auto& ca = b.Node("Conv", {"x", "w"}, {"ca"}, "conv_a");
  OnnxModelBuilder::AttrInts(ca, "pads", {1, 1, 1, 1});
  b.Node("BatchNormalization", {"ca", "a_scale", "a_bias", "a_mean", "a_var"}, {"na"}, "bn_a");
  auto& cb = b.Node("Conv", {"na", "w"}, {"cb"}, "conv_b");
  OnnxModelBuilder::AttrInts(cb, "pads", {1, 1, 1, 1});
  b.Node("BatchNormalization", {"cb", "b_scale", "b_bias", "b_mean", "b_var"}, {"nb"}, "bn_b");
  b.Node("Relu", {"cb"}, {"rb"}, "relu_b");
  b.Node("Add", {"nb", "rb"}, {"y"}, "add");
  b.Output("y", {-1, 8, 8, 8});
  const std::string fp32_path = b.Save("full_qdq_bn_fold");
  std::vector<CalibrationBatch> calibration(1);
  calibration[0].rows = 8;
  calibration[0].inputs.push_back(RandomTensor({8, 8, 8, 8}, 46).data);
  auto q = QuantizeModel(fp32_path, calibration, QuantizeOptions());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_THAT(q->report.folded, ::testing::ElementsAre("bn_a (BatchNormalization) into conv_a"));
  EXPECT_EQ(q->report.quantized.size(), 2u);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(q->onnx));
  int batch_norms = 0;
  for (const auto& n : proto.graph().node()) batch_norms += n.op_type() == "BatchNormalization";
  EXPECT_EQ(batch_norms, 1);
  const std::string path = absl::StrCat(::testing::TempDir(), "/full_qdq_bn_", getpid(), ".onnx");
  std::ofstream(path, std::ios::binary) << q->onnx;
  auto model = CompiledModel::Load(path, CompileOptions());
  auto fp32 = CompiledModel::Load(fp32_path, CompileOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  const kernels::Tensor x = RandomTensor({2, 8, 8, 8}, 47);
  std::vector<float> y(2 * 512), y32(2 * 512);
  ASSERT_TRUE((*model)->Run(2, {x.data.data()}, {y.data()}).ok());
  ASSERT_TRUE((*fp32)->Run(2, {x.data.data()}, {y32.data()}).ok());
  EXPECT_LT(testing::NormalizedError(y32, y.data()), 1e-3);
}

}  // namespace
}  // namespace numaserve::engine
