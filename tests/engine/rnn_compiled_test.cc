// LSTM and GRU compiled (oneDNN's RNN primitives, compile_rnn.cc) against
// the op's reference kernel (engine/ops/rnn_ops.cc): each cell (LSTM, GRU
// with linear_before_reset 0 and 1) in each direction, with and without
// bias and initial states, hidden 3 and 32, at several (seq, batch)
// signatures of one CompiledModel; and the forms that stay on the
// reference (clip, other activations, sequence_lens short of the
// sequence), which must match it too and say so in the plan.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using testing::RandomTensor;
using testing::RunAgainstReference;

constexpr int64_t kInput = 5;
constexpr double kTolerance = 1e-10;  // FP32 against the reference's double

enum class Cell { kLstm, kGru, kLbrGru };

// The test names' and messages' spelling of a cell.
void PrintTo(Cell cell, std::ostream* os) {
  static const char* const kNames[] = {"LSTM", "GRU", "GRU linear_before_reset"};
  *os << kNames[static_cast<int>(cell)];
}

struct Layer {
  Cell cell = Cell::kLstm;
  std::string direction = "forward";
  int64_t hidden = 3;
  bool bias = true;
  bool initial_h = false, initial_c = false;
  bool peepholes = false;
  int outputs = 0;  // 0: all of Y, Y_h[, Y_c]
  // Forms only the reference runs.
  float clip = 0;
  bool relu_cell = false;
  std::vector<int64_t> sequence_lens;  // constant lengths for batch 5; empty: none

  bool lstm() const { return cell == Cell::kLstm; }
  int64_t directions() const { return direction == "bidirectional" ? 2 : 1; }
  std::string Name() const {
    const char* cells[] = {"lstm", "gru", "lbr_gru"};
    return absl::StrCat(cells[static_cast<int>(cell)], "_", direction, "_h", hidden,
                        bias ? "_bias" : "", initial_h ? "_h0" : "", initial_c ? "_c0" : "",
                        peepholes ? "_peepholes" : "", outputs != 0 ? "_outputs" : "",
                        outputs != 0 ? absl::StrCat(outputs) : "", clip > 0 ? "_clip" : "",
                        relu_cell ? "_relu" : "", sequence_lens.empty() ? "" : "_lens");
  }
};

// A model holding one layer: X [seq, batch, kInput] with seq and batch
// dynamic (batch fixed at 5 with sequence_lens), initial states as inputs.
std::string LayerModel(const Layer& l) {
  OnnxModelBuilder b(14);
  const int64_t d = l.directions(), h = l.hidden, g = l.lstm() ? 4 : 3;
  const std::string batch = l.sequence_lens.empty() ? "batch" : "";
  const int64_t batch_dim = l.sequence_lens.empty() ? testing::kUnknownDim : 5;
  b.NamedInput("x", {testing::kUnknownDim, batch_dim, kInput}, {"seq", batch, ""});
  std::vector<std::string> inputs = {"x", "w", "r", l.bias ? "b" : "",
                                     l.sequence_lens.empty() ? "" : "lens"};
  if (l.initial_h || l.initial_c || l.peepholes) inputs.push_back(l.initial_h ? "h0" : "");
  if (l.initial_c || l.peepholes) inputs.push_back(l.initial_c ? "c0" : "");
  if (l.peepholes) inputs.push_back("p");
  if (l.initial_h) b.NamedInput("h0", {d, batch_dim, h}, {"", batch, ""});
  if (l.initial_c) b.NamedInput("c0", {d, batch_dim, h}, {"", batch, ""});
  b.Initializer("w", RandomTensor({d, g * h, kInput}, 101));
  b.Initializer("r", RandomTensor({d, g * h, h}, 102));
  if (l.bias) b.Initializer("b", RandomTensor({d, 2 * g * h}, 103));
  if (l.peepholes) b.Initializer("p", RandomTensor({d, 3 * h}, 104));
  if (!l.sequence_lens.empty()) {
    const std::vector<int32_t> lens(l.sequence_lens.begin(), l.sequence_lens.end());
    b.RawInitializer("lens", onnx::TensorProto::INT32, {static_cast<int64_t>(lens.size())},
                     lens.data(), lens.size() * sizeof(int32_t));
  }
  const int outputs = l.outputs != 0 ? l.outputs : (l.lstm() ? 3 : 2);
  const std::vector<std::string> names = {"y", "y_h", "y_c"};
  auto& node = b.Node(l.lstm() ? "LSTM" : "GRU", inputs,
                      std::vector<std::string>(names.begin(), names.begin() + outputs), "layer");
  OnnxModelBuilder::AttrInt(node, "hidden_size", h);
  OnnxModelBuilder::AttrString(node, "direction", l.direction);
  if (l.cell == Cell::kLbrGru) OnnxModelBuilder::AttrInt(node, "linear_before_reset", 1);
  if (l.clip > 0) OnnxModelBuilder::AttrFloat(node, "clip", l.clip);
  if (l.relu_cell) {
    auto* a = node.add_attribute();
    a->set_name("activations");
    a->set_type(onnx::AttributeProto::STRINGS);
    for (int64_t k = 0; k < d; ++k) {
      for (const char* f : {"Sigmoid", "Relu", "Tanh"}) a->add_strings(f);
    }
  }
  b.NamedOutput("y", {testing::kUnknownDim, d, batch_dim, h}, {"seq", "", batch, ""});
  if (outputs > 1) b.NamedOutput("y_h", {d, batch_dim, h}, {"", batch, ""});
  if (outputs > 2) b.NamedOutput("y_c", {d, batch_dim, h}, {"", batch, ""});
  return b.Save(l.Name());
}

// The model's input shapes at (seq, batch).
CompiledModel::InputShapes ShapesAt(const Layer& l, int64_t seq, int64_t batch) {
  CompiledModel::InputShapes shapes = {{seq, batch, kInput}};
  if (l.initial_h) shapes.push_back({l.directions(), batch, l.hidden});
  if (l.initial_c) shapes.push_back({l.directions(), batch, l.hidden});
  return shapes;
}

// Compiles `l`, checks that its plan is one of `plan_lines`, and compares
// it with the reference at every (seq, batch) of `signatures` on the one
// CompiledModel; the implementation at each must be oneDNN's where the
// plan says "[onednn", numaserve's reference otherwise.
void ExpectMatchesReference(const Layer& l, const std::vector<std::string>& plan_lines,
                            const std::vector<std::pair<int64_t, int64_t>>& signatures) {
  SCOPED_TRACE(l.Name());
  const std::string path = LayerModel(l);
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string plan = (*model)->DescribePlan();
  std::vector<std::string> plans;
  for (const std::string& line : plan_lines) plans.push_back(line + "\n");
  EXPECT_THAT(plan, ::testing::AnyOfArray(plans));
  const bool on_onednn = plan.find("[onednn ") != std::string::npos;
  uint32_t seed = 7;
  for (const auto& [seq, batch] : signatures) {
    SCOPED_TRACE(absl::StrCat("seq ", seq, ", batch ", batch));
    const CompiledModel::InputShapes shapes = ShapesAt(l, seq, batch);
    EXPECT_LT(RunAgainstReference(**model, *graph, shapes, seed), kTolerance);
    seed += 10;
    auto steps = (*model)->PlanAt(shapes);
    ASSERT_TRUE(steps.ok()) << steps.status();
    ASSERT_EQ(steps->size(), 1u);
    const std::string& impl = (*steps)[0].implementation;
    EXPECT_EQ(impl.rfind("numaserve:reference", 0) == 0, !on_onednn) << impl;
    EXPECT_EQ((*steps)[0].reference, !on_onednn) << impl;
  }
}

const std::vector<std::pair<int64_t, int64_t>> kSignatures = {
    {7, 5}, {1, 1}, {7, 1}, {1, 5}, {7, 5}};

// The plan of a layer oneDNN runs: for a GRU without linear_before_reset,
// oneDNN 3.7's ref+matmul, which stays on numaserve's reference, or a
// oneDNN with more for it.
std::vector<std::string> OnednnLines(const Layer& l) {
  const char* cells[] = {"lstm", "gru", "lbr_gru"};
  const char* cell = cells[static_cast<int>(l.cell)];
  std::vector<std::string> lines = {
      absl::StrCat("rnn: layer [onednn ", cell, " ", l.direction, "]")};
  if (l.cell == Cell::kGru) {
    lines.push_back("rnn: layer [reference: oneDNN has only ref+matmul for gru]");
  }
  return lines;
}

class RnnCompiledTest : public ::testing::TestWithParam<std::tuple<Cell, std::string>> {};

TEST_P(RnnCompiledTest, MatchesTheReferenceWithAndWithoutBiasAndInitialStates) {
  for (int64_t hidden : {3, 32}) {
    for (bool bias : {false, true}) {
      for (bool initial : {false, true}) {
        Layer l;
        l.cell = std::get<0>(GetParam());
        l.direction = std::get<1>(GetParam());
        l.hidden = hidden;
        l.bias = bias;
        l.initial_h = initial;
        l.initial_c = initial && l.lstm();
        ExpectMatchesReference(l, OnednnLines(l), kSignatures);
      }
    }
  }
}

TEST_P(RnnCompiledTest, WritesOnlyTheOutputsAsked) {
  for (int outputs : {1, 2}) {
    Layer l;
    l.cell = std::get<0>(GetParam());
    l.direction = std::get<1>(GetParam());
    l.initial_h = true;
    l.outputs = outputs;
    ExpectMatchesReference(l, OnednnLines(l), kSignatures);
  }
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<Cell, std::string>>& info) {
  static const char* const kCells[] = {"Lstm", "Gru", "LbrGru"};
  return absl::StrCat(kCells[static_cast<int>(std::get<0>(info.param))], "_",
                      std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    CellsAndDirections, RnnCompiledTest,
    ::testing::Combine(::testing::Values(Cell::kLstm, Cell::kGru, Cell::kLbrGru),
                       ::testing::Values("forward", "reverse", "bidirectional")),
    CaseName);

TEST(RnnCompiledTest, LstmPeepholesAndOneInitialStateRunOnOnednn) {
  for (const char* direction : {"forward", "bidirectional"}) {
    for (bool h0 : {false, true}) {
      Layer l;
      l.direction = direction;
      l.hidden = 32;
      l.peepholes = true;
      l.initial_h = h0;
      l.initial_c = !h0;  // the other state given alone: zeros for the missing one
      ExpectMatchesReference(l, OnednnLines(l), kSignatures);
    }
  }
}

// oneDNN's threads meet at every time step: a layer whose time steps are
// small runs on one thread even where its whole sequence is past the serial
// threshold (its p99 on two shared cpus was 37-1084 ms against ONNX
// Runtime's 9-48 ms), and on every thread when one time step is past it.
TEST(RnnCompiledTest, ALayerOfSmallTimeStepsRunsOnOneThread) {
  Layer l;
  l.hidden = 32;
  const std::string path = LayerModel(l);
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  // One time step: 2 x 4 gates x 32 x (5 + 32) = 9472 FLOPs a sequence;
  // seven of them at batch 1 are 66304, past the threshold.
  auto model = CompiledModel::Load(
      path, {.num_threads = 2, .serial_below_flops = 20000, .serial_below_elements = 0});
  ASSERT_TRUE(model.ok()) << model.status();
  (*model)->SetProfiling(true);
  for (const auto& [batch, threads] : {std::pair<int64_t, int>{1, 1}, {5, 2}}) {
    SCOPED_TRACE(absl::StrCat("batch ", batch));
    EXPECT_LT(RunAgainstReference(**model, *graph, ShapesAt(l, 7, batch), 11), kTolerance);
    const std::vector<StepProfile> rows = (*model)->Profile();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].threads, threads) << rows[0].description;
  }
}

TEST(RnnCompiledTest, ClipAndOtherActivationsStayOnTheReference) {
  Layer clipped;
  clipped.direction = "bidirectional";
  clipped.initial_h = clipped.initial_c = true;
  clipped.clip = 0.5f;
  ExpectMatchesReference(clipped, {"rnn: layer [reference: clip]"}, kSignatures);
  Layer relu;
  relu.direction = "reverse";
  relu.hidden = 32;
  relu.relu_cell = true;
  ExpectMatchesReference(relu, {"rnn: layer [reference: activations other than the defaults]"},
                         kSignatures);
  Layer gru_clipped;
  gru_clipped.cell = Cell::kLbrGru;
  gru_clipped.clip = 0.5f;
  ExpectMatchesReference(gru_clipped, {"rnn: layer [reference: clip]"}, kSignatures);
}

TEST(RnnCompiledTest, SequenceLensShortOfTheSequenceRunOnTheReference) {
  // Lengths of 7 fill a sequence of 7 (oneDNN) and exceed none shorter;
  // at seq 7 a short length sends the run to the reference.
  Layer full;
  full.direction = "bidirectional";
  full.sequence_lens = {7, 7, 7, 7, 7};
  std::string line = OnednnLines(full)[0];
  line.insert(line.size() - 1, "; sequence_lens short of seq: reference");
  ExpectMatchesReference(full, {line}, {{7, 5}});
  // The same plan; the run goes to the reference.
  Layer short_lens = full;
  short_lens.sequence_lens = {7, 3, 7, 0, 1};
  const std::string path = LayerModel(short_lens);
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto model = CompiledModel::Load(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->DescribePlan(), line + "\n");
  EXPECT_LT(RunAgainstReference(**model, *graph, ShapesAt(short_lens, 7, 5), 3), kTolerance);
  auto steps = (*model)->PlanAt(ShapesAt(short_lens, 7, 5));
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ((*steps)[0].implementation, "numaserve:reference LSTM");
}

}  // namespace
}  // namespace numaserve::engine
