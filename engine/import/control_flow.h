// If and Loop at import, where what decides them is known at load:
// - an If whose condition is a constant (an initializer, or folded from
//   initializers and from shapes that do not depend on the batch or other
//   dynamic dims) becomes its chosen branch's nodes, inlined where the If
//   was: the branch's names get the prefix "<if node>/then/" (or /else/),
//   what it reads from outside resolves to the enclosing scope's values,
//   and its outputs are the If's outputs;
// - a Loop whose trip count M is a constant and whose condition input is
//   absent or a constant true is unrolled: M copies of its body (prefix
//   "<loop node>/<iteration>/"), the iteration number and the condition
//   constants, the loop-carried values threaded from one copy to the next,
//   the scan outputs stacked along a new axis 0 (Unsqueeze, Concat). Each
//   copy's condition output but the last must fold to a constant true
//   (CheckLoopConditions), else the Loop is refused.
// Subgraphs inside an inlined one are read as nodes and inlined in a later
// round, once folding has decided them. At most kMaxInlinedNodes nodes are
// added in all; past that the If or Loop is refused, naming it. An If or
// Loop that stays is refused by its op row's validation (control_flow_ops.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/import/onnx_read.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

// The most nodes inlining and unrolling may add to one model.
inline constexpr int64_t kMaxInlinedNodes = 10000;

// A Loop copy's condition output, which must fold to a constant true.
struct LoopCondition {
  std::string loop;  // the Loop node, described
  int64_t iteration = 0;
  std::string value;  // the name the condition output got
};

// Inlines every If and unrolls every Loop of GRAPH that is decided at load
// (above). Returns whether it changed the graph; errors name the node.
// CONDITIONS receives the condition outputs to check once folded.
absl::StatusOr<bool> InlineControlFlow(Graph& graph, Subgraphs& subgraphs,
                                       std::vector<LoopCondition>& conditions);

// An If's condition or a Loop's trip count or condition, not yet known,
// that is computed from a graph input with a dynamic dim: a copy of the nodes it is computed
// from (RecordDecisions, before a fold). Folding decides such a value from
// shapes at two probe sizes of the dynamic dims; CheckDecisions then folds
// the copy again at other sizes, and a value that differs at any of them
// is refused (a condition such as seq <= 512 agrees at the probes only).
struct PendingDecision {
  std::string node;   // the If or Loop, described
  std::string what;   // "condition", "trip count M"
  std::string input;  // the graph input it is computed from
  ValueId value = kNoValue;
  Graph nodes;  // its ancestry; its one output is the value
};
std::vector<PendingDecision> RecordDecisions(const Graph& graph);

// The sizes of dynamic dims at which CheckDecisions folds again.
inline constexpr int64_t kDecisionCheckDims[] = {
    3,   4,   5,   7,   8,   9,   15,  16,  17,   31,   32,   33,   63,   64,   65,   100, 127,
    128, 129, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 2049, 4096};

// OK when every recorded value that folded folds to the same value at
// every size of kDecisionCheckDims; UNIMPLEMENTED naming the node and the
// input otherwise.
absl::Status CheckDecisions(const Graph& graph, const std::vector<PendingDecision>& pending);

// Each condition's value is a constant true; UNIMPLEMENTED naming the Loop
// and the iteration otherwise.
absl::Status CheckLoopConditions(const Graph& graph, const std::vector<LoopCondition>& conditions);

}  // namespace numaserve::engine
