// The compiler's passes over an ExecutionPlan (engine/compiler/memory_plan.h)
// on their own: storage, layouts, lifetimes and in-place residuals on plans
// built here from steps that are nothing but their traits.
#include "engine/compiler/memory_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace numaserve::engine::internal {
namespace {

using runtime::ExecutionPlan;
using runtime::Storage;
using ::testing::ElementsAre;

// A step with the given traits; it keeps the layouts it is told.
class TraitsStep : public Step {
 public:
  explicit TraitsStep(StepTraits traits) : Step(std::move(traits)) {}
  absl::Status Run(const StepContext&) override { return absl::OkStatus(); }
  std::string Describe() const override { return "traits"; }
  void SetLayouts(const std::vector<bool>& blocked) override { layouts_ = blocked; }
  const std::vector<bool>& layouts() const { return layouts_; }

 private:
  std::vector<bool> layouts_;
};

// A graph of `n` values v0..v{n-1} (v0 the input) and a plan over it with
// every value its own root.
class MemoryPlanTest : public ::testing::Test {
 protected:
  void MakeValues(int n, const Shape& shape1) {
    for (int v = 0; v < n; ++v) {
      const ValueId id = graph_.GetOrAddValue(absl::StrCat("v", v));
      graph_.value(id).type = DataType::kFloat32;
    }
    graph_.inputs() = {0};
    plan_.graph = &graph_;
    plan_.root.resize(n);
    for (ValueId v = 0; v < n; ++v) plan_.root[v] = v;
    plan_.shapes1.assign(n, shape1);
  }
  // A graph node reading `in` and writing `out`, computed by step `step`.
  void AddNode(std::vector<ValueId> in, ValueId out, int step) {
    Node node;
    node.name = absl::StrCat("n", graph_.nodes().size());
    node.op_type = "Add";
    node.inputs = std::move(in);
    node.outputs = {out};
    graph_.nodes().push_back(node);
    step_of_node_.push_back(step);
  }
  TraitsStep* AddStep(StepTraits traits) {
    auto step = std::make_unique<TraitsStep>(std::move(traits));
    TraitsStep* raw = step.get();
    plan_.steps.push_back(std::move(step));
    return raw;
  }
  // AssignStorage and PlanLifetimes as the compiler runs them.
  void PlanStorageAndLifetimes() {
    AssignStorage(plan_);
    const auto consumers = graph_.Consumers();
    std::vector<int> producer(graph_.num_values(), -1);
    for (int i = 0; i < static_cast<int>(graph_.nodes().size()); ++i) {
      for (ValueId v : graph_.nodes()[i].outputs) producer[v] = i;
    }
    plan_.blocked.assign(graph_.num_values(), false);
    PlanLifetimes(plan_, step_of_node_, producer, consumers);
  }

  Graph graph_;
  ExecutionPlan plan_;
  std::vector<int> step_of_node_;
};

TEST_F(MemoryPlanTest, OutputsWriteIntoTheCallersBufferUnlessTheyShareARoot) {
  // v0 input, v1 constant; v2 and v3 outputs of their own; v4 a view of
  // v5, both outputs (one root, two outputs: copied); v6 an output that is
  // a view of the input.
  MakeValues(7, {1, 4});
  graph_.SetConstant(1, Constant());
  plan_.root[4] = 5;
  plan_.root[6] = 0;
  graph_.outputs() = {2, 3, 4, 5, 6};
  AssignStorage(plan_);
  EXPECT_THAT(plan_.storage,
              ElementsAre(Storage::kInput, Storage::kConstant, Storage::kOutput, Storage::kOutput,
                          Storage::kArena, Storage::kArena, Storage::kArena));
  EXPECT_EQ(plan_.output_slot[2], 0);
  EXPECT_EQ(plan_.output_slot[3], 1);
  EXPECT_EQ(plan_.output_slot[5], -1);
  EXPECT_EQ(plan_.output_slot[0], -1);  // the input stays the caller's
}

TEST_F(MemoryPlanTest, ABlockedValueNeedsItsWriterAndEveryReaderToTakeIt) {
  // step 0: v0 -> v1 (writes blocked); step 1: v1 -> v2 (reads and writes
  // blocked); step 2: v2 -> v3 (plain only); step 3: v3 -> v4 (writes
  // blocked, nobody reads v4).
  MakeValues(5, {1, 8, 4, 4});
  graph_.outputs() = {4};
  StepTraits t0 = StepTraits::ReadsWrites({0}, {1});
  t0.blocked_write = 1;
  StepTraits t1 = StepTraits::ReadsWrites({1}, {2});
  t1.blocked_reads = {1};
  t1.blocked_write = 2;
  StepTraits t2 = StepTraits::ReadsWrites({2}, {3});
  StepTraits t3 = StepTraits::ReadsWrites({3}, {4});
  t3.blocked_write = 4;
  AddStep(t0);
  TraitsStep* s1 = AddStep(t1);
  AddStep(t2);
  AddStep(t3);
  AssignStorage(plan_);
  ChooseLayouts(plan_);
  // v1: written and read blocked. v2: its reader takes it plain only. v4:
  // the caller's output buffer, plain.
  EXPECT_THAT(plan_.blocked, ElementsAre(false, true, false, false, false));
  EXPECT_THAT(s1->layouts(), ElementsAre(false, true, false, false, false));
}

TEST_F(MemoryPlanTest, AViewOrARankOutsideThreeToFiveStaysPlain) {
  MakeValues(4, {1, 8, 4, 4});
  graph_.outputs() = {3};
  plan_.shapes1[2] = {1, 8};  // rank 2
  StepTraits t0 = StepTraits::ReadsWrites({0}, {1});
  t0.blocked_write = 1;
  StepTraits t1 = StepTraits::ReadsWrites({1}, {2});
  t1.blocked_reads = {1};
  t1.blocked_write = 2;
  AddStep(t0);
  AddStep(t1);
  AddStep(StepTraits::ReadsWrites({2}, {3}));
  AssignStorage(plan_);
  ChooseLayouts(plan_);
  EXPECT_TRUE(plan_.blocked[1]);
  EXPECT_FALSE(plan_.blocked[2]);  // rank 2
  plan_.root[3] = 1;               // a view of v1 now
  graph_.outputs() = {2};
  AssignStorage(plan_);
  ChooseLayouts(plan_);
  EXPECT_FALSE(plan_.blocked[1]);
}

TEST_F(MemoryPlanTest, LifetimesRunFromTheWriterToTheLastReaderOfTheValueOrItsViews) {
  // Nodes: n0 v0 -> v1 (step 0), n1 v1 -> v2 (step 0: fused into step 0),
  // n2 v2 -> v3 (step 1), n3 [v1 through its view v4] -> v5 (step 2).
  MakeValues(6, {1, 4});
  graph_.outputs() = {3, 5};
  plan_.root[4] = 1;
  AddNode({0}, 1, 0);
  AddNode({1}, 2, 0);
  AddNode({2}, 3, 1);
  AddNode({4}, 5, 2);
  PlanStorageAndLifetimes();
  EXPECT_EQ(plan_.first_step[1], 0);
  EXPECT_EQ(plan_.last_step[1], 2);  // read through its view at step 2
  EXPECT_EQ(plan_.first_step[2], 0);
  EXPECT_EQ(plan_.last_step[2], 1);
  EXPECT_FALSE(plan_.internal[1]);
  EXPECT_FALSE(plan_.internal[2]);
  // v1 read only by the step writing it: fused inside step 0, no bytes.
  graph_.nodes()[3].inputs = {0};
  PlanStorageAndLifetimes();
  EXPECT_TRUE(plan_.internal[1]);
  EXPECT_EQ(plan_.first_step[3], -1);  // an output: not the arena's
}

// Step 0: v0 -> v1; step 1: v1 -> v2; step 2: v2 + residual v1 -> v3 (the
// residual copied into v3 first); step 3: v3 -> v4.
class InPlaceResidualTest : public MemoryPlanTest {
 protected:
  void SetUp() override {
    MakeValues(5, {1, 4});
    graph_.outputs() = {4};
    AddNode({0}, 1, 0);
    AddNode({1}, 2, 1);
    AddNode({2, 1}, 3, 2);
    AddNode({3}, 4, 3);
    AddStep(StepTraits::ReadsWrites({0}, {1}));
    AddStep(StepTraits::ReadsWrites({1}, {2}));
    StepTraits t = StepTraits::ReadsWrites({2, 1}, {3});
    t.residual_input = 1;
    t.residual_source = 2;
    t.residual_output = 3;
    AddStep(t);
    AddStep(StepTraits::ReadsWrites({3}, {4}));
  }
};

TEST_F(InPlaceResidualTest, AnOutputTakesTheBytesOfTheResidualDyingAtItsStep) {
  PlanStorageAndLifetimes();
  PlanInPlaceResiduals(plan_, true);
  EXPECT_EQ(plan_.in_place_of[3], 1);
  EXPECT_EQ(plan_.last_step[1], 3);  // v1's bytes live on as v3 until step 3
  PlanStorageAndLifetimes();
  PlanInPlaceResiduals(plan_, false);
  EXPECT_EQ(plan_.in_place_of[3], kNoValue);
}

TEST_F(InPlaceResidualTest, NotWhenTheResidualIsReadLaterOrDiffersInShapeOrLayout) {
  AddNode({1}, 4, 3);  // v1 read again at step 3
  PlanStorageAndLifetimes();
  PlanInPlaceResiduals(plan_, true);
  EXPECT_EQ(plan_.in_place_of[3], kNoValue);

  graph_.nodes().pop_back();
  step_of_node_.pop_back();
  plan_.shapes1[3] = {1, 8};
  PlanStorageAndLifetimes();
  PlanInPlaceResiduals(plan_, true);
  EXPECT_EQ(plan_.in_place_of[3], kNoValue);

  plan_.shapes1[3] = {1, 4};
  PlanStorageAndLifetimes();
  plan_.blocked[1] = true;
  PlanInPlaceResiduals(plan_, true);
  EXPECT_EQ(plan_.in_place_of[3], kNoValue);
}

}  // namespace
}  // namespace numaserve::engine::internal
