// If and Loop at import (engine/import/control_flow.cc): an If whose
// condition is a constant or folds from a static dim is its branch,
// inlined (nested Ifs too); a Loop of a constant trip count is unrolled
// (loop-carried values, scan outputs stacked along axis 0). Conditions and
// trip counts known only at run time, loops past the node budget and
// loops whose condition turns false are refused at load, naming the node.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/import/onnx_import.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"
#include "engine/reference/reference_executor.h"
#include "tests/engine/onnx_model_builder.h"

namespace numaserve::engine {
namespace {

using testing::OnnxModelBuilder;
using P = onnx::TensorProto;

TypedTensor F32(Shape shape, std::vector<float> v) {
  return TypedTensor::FromValues(DataType::kFloat32, std::move(shape), v);
}

std::vector<float> Floats(const TypedTensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.size());
}

void Scalar(OnnxModelBuilder& b, const std::string& name, int32_t type, int64_t value) {
  if (type == P::BOOL) {
    const uint8_t v = value != 0;
    b.RawInitializer(name, type, {}, &v, 1);
  } else {
    b.RawInitializer(name, type, {}, &value, sizeof(value));
  }
}

void AttachGraph(onnx::NodeProto& node, const std::string& name, OnnxModelBuilder& sub) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = sub.proto().graph();
}

// A branch of one node OP(x, ...) writing `out` [-1, 3].
OnnxModelBuilder Branch(const std::string& op, const std::vector<std::string>& inputs,
                        const std::string& out) {
  OnnxModelBuilder b;
  b.Node(op, inputs, {out});
  b.Output(out, {-1, 3});
  return b;
}

// y = If(cond_value) then x + 1 else x - 1, x [batch, 3]; cond computed by
// the nodes MAKE_COND adds (writing "cond").
template <typename MakeCond>
OnnxModelBuilder IfModel(MakeCond make_cond) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3});
  b.Initializer("one", kernels::Tensor({1}, {1.0F}));
  make_cond(b);
  auto then_branch = Branch("Add", {"x", "one"}, "plus");
  auto else_branch = Branch("Sub", {"x", "one"}, "minus");
  auto& node = b.Node("If", {"cond"}, {"y"}, "choose");
  AttachGraph(node, "then_branch", then_branch);
  AttachGraph(node, "else_branch", else_branch);
  b.Output("y", {-1, 3});
  return b;
}

void ExpectRefused(OnnxModelBuilder& b, const std::string& stem, const std::string& what) {
  auto model = CompiledModel::Load(b.Save(stem), {});
  ASSERT_FALSE(model.ok()) << stem << " loaded";
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented) << model.status();
  EXPECT_NE(model.status().message().find(what), std::string::npos) << model.status();
}

// Imports, checks no If or Loop is left, runs the reference on x.
std::vector<TypedTensor> ImportAndRun(OnnxModelBuilder& b, const std::string& stem,
                                      const TypedTensor& x) {
  auto graph = ImportOnnxModel(b.Save(stem));
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  for (const Node& node : graph->nodes()) {
    EXPECT_NE(node.op_type, "If") << node.name;
    EXPECT_NE(node.op_type, "Loop") << node.name;
  }
  auto out = RunReferenceTyped(*graph, {x});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<TypedTensor>{};
}

TEST(ControlFlowTest, IfOfAConstantConditionIsItsBranchInlined) {
  for (int64_t cond : {1, 0}) {
    auto b = IfModel([&](OnnxModelBuilder& m) { Scalar(m, "cond", P::BOOL, cond); });
    auto out = ImportAndRun(b, "if_constant", F32({2, 3}, {1, 2, 3, 4, 5, 6}));
    ASSERT_EQ(out.size(), 1U);
    const std::vector<float> want =
        cond != 0 ? std::vector<float>{2, 3, 4, 5, 6, 7} : std::vector<float>{0, 1, 2, 3, 4, 5};
    EXPECT_EQ(Floats(out[0]), want) << "cond " << cond;
  }
}

// Shape -> Gather -> Equal on a fixed dim: what exporters emit.
TEST(ControlFlowTest, IfOnAFixedDimFoldsAndIsInlined) {
  auto b = IfModel([](OnnxModelBuilder& m) {
    Scalar(m, "dim", P::INT64, 1);
    Scalar(m, "three", P::INT64, 3);
    m.Node("Shape", {"x"}, {"shape"});
    OnnxModelBuilder::AttrInt(m.Node("Gather", {"shape", "dim"}, {"d"}), "axis", 0);
    m.Node("Equal", {"d", "three"}, {"cond"});
  });
  auto out = ImportAndRun(b, "if_fixed_dim", F32({1, 3}, {1, 2, 3}));
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{2, 3, 4}));
}

// The rank of an input with dynamic dims (Size(Shape(x)) == 2, as a check
// of x.dim() exports) is known at load: folds, and holds at every size.
TEST(ControlFlowTest, IfOnTheRankOfADynamicInputFoldsAndIsInlined) {
  auto b = IfModel([](OnnxModelBuilder& m) {
    Scalar(m, "two", P::INT64, 2);
    m.Node("Shape", {"x"}, {"shape"});
    m.Node("Size", {"shape"}, {"rank"});
    m.Node("Equal", {"rank", "two"}, {"cond"});
  });
  auto out = ImportAndRun(b, "if_rank", F32({2, 3}, {1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{2, 3, 4, 5, 6, 7}));
}

TEST(ControlFlowTest, IfOnRuntimeDataIsRefusedAtLoad) {
  auto b = IfModel([](OnnxModelBuilder& m) {
    m.Input("flag", {1}, P::FLOAT);
    OnnxModelBuilder::AttrInt(m.Node("Cast", {"flag"}, {"flag_b"}), "to", P::BOOL);
    m.Node("Squeeze", {"flag_b"}, {"cond"});
  });
  ExpectRefused(b, "if_runtime",
                "node 'choose' (op If): condition depends on input 'flag'; only conditions known "
                "at load are supported");
}

TEST(ControlFlowTest, IfOnTheBatchIsRefusedAtLoad) {
  auto b = IfModel([](OnnxModelBuilder& m) {
    Scalar(m, "dim", P::INT64, 0);
    Scalar(m, "single", P::INT64, 1);
    m.Node("Shape", {"x"}, {"shape"});
    OnnxModelBuilder::AttrInt(m.Node("Gather", {"shape", "dim"}, {"d"}), "axis", 0);
    m.Node("Equal", {"d", "single"}, {"cond"});
  });
  ExpectRefused(b, "if_batch", "node 'choose' (op If): condition depends on input 'x'");
}

// batch < 512 is true at the small batches folding looks at (1 to 3) and
// false from 512 rows on: refused, not inlined as true (folding's far batch
// sees it differ; CheckDecisions' sizes would too).
TEST(ControlFlowTest, IfOnTheBatchThatHoldsAtTheProbesIsRefusedAtLoad) {
  auto b = IfModel([](OnnxModelBuilder& m) {
    Scalar(m, "dim", P::INT64, 0);
    Scalar(m, "limit", P::INT64, 512);
    m.Node("Shape", {"x"}, {"shape"});
    OnnxModelBuilder::AttrInt(m.Node("Gather", {"shape", "dim"}, {"d"}), "axis", 0);
    m.Node("Less", {"d", "limit"}, {"cond"});
  });
  ExpectRefused(b, "if_batch_probes", "node 'choose' (op If): condition depends on input 'x'");
  // Where the batch cannot change the condition (batch >= 1), it folds.
  auto always = IfModel([](OnnxModelBuilder& m) {
    Scalar(m, "dim", P::INT64, 0);
    Scalar(m, "zero", P::INT64, 0);
    m.Node("Shape", {"x"}, {"shape"});
    OnnxModelBuilder::AttrInt(m.Node("Gather", {"shape", "dim"}, {"d"}), "axis", 0);
    m.Node("Greater", {"d", "zero"}, {"cond"});
  });
  auto out = ImportAndRun(always, "if_batch_always", F32({1, 3}, {1, 2, 3}));
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{2, 3, 4}));
}

TEST(ControlFlowTest, NestedIfReadingOuterValuesIsInlined) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3});
  b.Initializer("one", kernels::Tensor({1}, {1.0F}));
  Scalar(b, "outer", P::BOOL, 1);
  Scalar(b, "inner_cond", P::BOOL, 0);
  // then: If(inner_cond) then x + 1 else x * x; else: x - 1.
  OnnxModelBuilder then_branch;
  auto inner_then = Branch("Add", {"x", "one"}, "p");
  auto inner_else = Branch("Mul", {"x", "x"}, "sq");
  auto& inner = then_branch.Node("If", {"inner_cond"}, {"inner_y"}, "inner");
  AttachGraph(inner, "then_branch", inner_then);
  AttachGraph(inner, "else_branch", inner_else);
  then_branch.Output("inner_y", {-1, 3});
  auto else_branch = Branch("Sub", {"x", "one"}, "minus");
  auto& node = b.Node("If", {"outer"}, {"y"}, "outer_if");
  AttachGraph(node, "then_branch", then_branch);
  AttachGraph(node, "else_branch", else_branch);
  b.Output("y", {-1, 3});
  auto out = ImportAndRun(b, "if_nested", F32({1, 3}, {1, 2, 3}));
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{1, 4, 9}));
}

// acc = x; M times: acc = acc + x (x read from outside the body); the scan
// output is each iteration's acc.
OnnxModelBuilder LoopModel(int64_t trips, bool cond_turns_false = false) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3});
  Scalar(b, "m", P::INT64, trips);
  Scalar(b, "go", P::BOOL, 1);
  OnnxModelBuilder body;
  body.Input("i", {}, P::INT64);
  body.Input("cond_in", {}, P::BOOL);
  body.Input("acc_in", {-1, 3});
  body.Node("Add", {"acc_in", "x"}, {"acc_out"});
  body.Node("Identity", {"acc_out"}, {"scan"});
  if (cond_turns_false) {
    Scalar(body, "limit", P::INT64, 1);
    body.Node("Less", {"i", "limit"}, {"cond_out"});
  } else {
    body.Node("Identity", {"cond_in"}, {"cond_out"});
  }
  body.Output("cond_out", {}, P::BOOL);
  body.Output("acc_out", {-1, 3});
  body.Output("scan", {-1, 3});
  auto& node = b.Node("Loop", {"m", "go", "x"}, {"acc", "scans"}, "steps");
  AttachGraph(node, "body", body);
  b.Output("acc", {-1, 3});
  b.Output("scans", {testing::kUnknownDim, -1, 3});
  return b;
}

TEST(ControlFlowTest, LoopOfAConstantTripCountIsUnrolled) {
  auto b = LoopModel(3);
  auto out = ImportAndRun(b, "loop_unrolled", F32({1, 3}, {1, 2, 3}));
  ASSERT_EQ(out.size(), 2U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{4, 8, 12}));
  EXPECT_EQ(out[1].shape, (Shape{3, 1, 3}));
  EXPECT_EQ(Floats(out[1]), (std::vector<float>{2, 4, 6, 3, 6, 9, 4, 8, 12}));
}

// An If on the iteration number inside the body (what a scripted loop
// exports): each unrolled copy's condition is a constant, and its branch,
// which reads the body's loop-carried value and x from two scopes out, is
// inlined in the next round. acc = x; acc = i == 0 ? acc + x : acc * 2.
TEST(ControlFlowTest, IfOnTheIterationInsideALoopIsInlinedInEachCopy) {
  OnnxModelBuilder b;
  b.Input("x", {-1, 3});
  Scalar(b, "m", P::INT64, 3);
  b.Initializer("two", kernels::Tensor({1}, {2.0F}));
  OnnxModelBuilder body;
  body.Input("i", {}, P::INT64);
  body.Input("cond_in", {}, P::BOOL);
  body.Input("acc_in", {-1, 3});
  Scalar(body, "zero", P::INT64, 0);
  body.Node("Equal", {"i", "zero"}, {"first"});
  auto add = Branch("Add", {"acc_in", "x"}, "added");
  auto doubled = Branch("Mul", {"acc_in", "two"}, "doubled");
  auto& choose = body.Node("If", {"first"}, {"acc_out"}, "step");
  AttachGraph(choose, "then_branch", add);
  AttachGraph(choose, "else_branch", doubled);
  body.Node("Identity", {"cond_in"}, {"cond_out"});
  body.Output("cond_out", {}, P::BOOL);
  body.Output("acc_out", {-1, 3});
  auto& node = b.Node("Loop", {"m", "", "x"}, {"acc"}, "steps");
  AttachGraph(node, "body", body);
  b.Output("acc", {-1, 3});
  auto out = ImportAndRun(b, "loop_if", F32({1, 3}, {1, 2, 3}));
  ASSERT_EQ(out.size(), 1U);
  EXPECT_EQ(Floats(out[0]), (std::vector<float>{8, 16, 24}));
}

TEST(ControlFlowTest, LoopPastTheNodeBudgetIsRefusedAtLoad) {
  auto b = LoopModel(1000000);
  ExpectRefused(b, "loop_budget", "node 'steps' (op Loop): unrolling its 1000000 iterations");
}

TEST(ControlFlowTest, LoopWhoseConditionTurnsFalseIsRefusedAtLoad) {
  auto b = LoopModel(3, /*cond_turns_false=*/true);
  ExpectRefused(b, "loop_cond_false",
                "node 'steps' (op Loop): its condition after iteration 1 is not known at load to "
                "stay true");
}

TEST(ControlFlowTest, LoopOfARuntimeTripCountIsRefusedAtLoad) {
  auto b = LoopModel(3);
  auto* g = b.proto().mutable_graph();
  for (int i = 0; i < g->initializer_size(); ++i) {
    if (g->initializer(i).name() == "m") g->mutable_initializer()->DeleteSubrange(i, 1);
  }
  b.Input("m", {}, P::INT64);
  ExpectRefused(b, "loop_runtime",
                "node 'steps' (op Loop): trip count M depends on input 'm'; only trip counts "
                "known at load are supported");
}

// libonnx's shape inference also runs inside If and Loop subgraphs: the
// attributes it divides by or indexes with unchecked (a Conv's strides 0,
// a SIGFPE in libonnx 1.12) and a conv without kernel_shape whose weights
// outrank its input are checked there too, and LayerNormalization's
// statistics inside a subgraph are refused, before it runs.
TEST(ControlFlowTest, HostileSubgraphsAreRefusedBeforeShapeInference) {
  auto branch_model = [](const std::function<void(OnnxModelBuilder&)>& make_branch) {
    OnnxModelBuilder b;
    b.Input("x", {1, 1, 8, 8});
    b.Initializer("w", kernels::Tensor({1, 1, 3, 3}, std::vector<float>(9, 1.0F)));
    b.Initializer("w5", kernels::Tensor({1, 1, 3, 3, 3}, std::vector<float>(27, 1.0F)));
    Scalar(b, "cond", P::BOOL, 1);
    OnnxModelBuilder then_branch;
    make_branch(then_branch);
    then_branch.Output("t", {testing::kUnknownDim, testing::kUnknownDim, testing::kUnknownDim,
                             testing::kUnknownDim});
    OnnxModelBuilder else_branch;
    else_branch.Node("Identity", {"x"}, {"e"});
    else_branch.Output("e", {1, 1, 8, 8});
    auto& node = b.Node("If", {"cond"}, {"y"}, "choose");
    AttachGraph(node, "then_branch", then_branch);
    AttachGraph(node, "else_branch", else_branch);
    b.Output("y", {testing::kUnknownDim, testing::kUnknownDim, testing::kUnknownDim,
                   testing::kUnknownDim});
    return b;
  };
  auto zero_strides = branch_model([](OnnxModelBuilder& t) {
    auto& n = t.Node("Conv", {"x", "w"}, {"t"}, "victim");
    OnnxModelBuilder::AttrInts(n, "strides", {0, 0});
    OnnxModelBuilder::AttrInts(n, "kernel_shape", {3, 3});
  });
  auto model = CompiledModel::Load(zero_strides.Save("branch_zero_strides"), {});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("node 'victim' (op Conv): attribute 'strides' has 0"),
            std::string::npos)
      << model.status();
  auto high_rank = branch_model([](OnnxModelBuilder& t) { t.Node("Conv", {"x", "w5"}, {"t"}); });
  model = CompiledModel::Load(high_rank.Save("branch_weights_rank"), {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  auto statistics = branch_model([](OnnxModelBuilder& t) {
    OnnxModelBuilder::AttrInt(t.Node("LayerNormalization", {"x", "w"}, {"t", "mean"}, "ln"), "axis",
                              -1);
  });
  ExpectRefused(statistics, "branch_statistics",
                "node 'ln' (op LayerNormalization): Mean or InvStdDev inside a subgraph");
}

}  // namespace
}  // namespace numaserve::engine
