// Constant folding at import: a node whose inputs are all constants runs
// once on its scalar reference and becomes a constant, and a Shape node
// whose input shape does not depend on the dynamic dims becomes one too. A
// Shape that does depend on them is evaluated at four sizes of the dynamic
// dims (every one 1, every one 2, then twice each dim its own size), and
// what is computed from it (small integer values only) folds where all four
// agree (the sequence length Gather(Shape(ids), 1) with only the batch
// dynamic; never seq - batch, 0 wherever the dims are equal); the Shape is
// then dropped when nothing else reads it. What does not fold is computed
// per signature (PropagateShapesAndValues, shape_propagation.h). Shape arithmetic
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and weight-only
// subgraphs (a transposed or scaled initializer) thus cost nothing at run
// time. Non-FP32 constants fold through the typed references (exact).
//
// What folding may allocate is bounded twice, before anything is
// allocated, from the output shapes inferred first:
// - per node: an output of more than 2^24 elements beyond what the node's
//   constant inputs hold (a ConstantOfShape, Expand or Tile blowing a few
//   values up) is not folded; the node stays and runs at run time;
// - per graph: every folded constant stays in the graph, and together they
//   may hold at most the fold budget (FoldOptions::budget_bytes). A node
//   whose fold would take them past it makes the import fail, naming the
//   node and the budget, so a few hundred bytes of Expand and Concat
//   cannot make the importer (and the server's front end, which imports
//   every model it lists) allocate gigabytes.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

// The default fold budget is the larger of these two: a floor that any
// model may fold (64 MiB: a 4096x4096 FP32 mask), and twice what the
// model's own constants (initializers, Constant nodes) hold once read, so
// weights may be transformed (dequantized, cast, transposed, scaled) twice
// over. Bytes are counted as held in memory: an FP32 copy of every
// constant, plus the exact elements and, for integers and BOOL, int64
// values of the non-FP32 ones (an INT8 weight holds 13 bytes per element,
// its folded FP32 DequantizeLinear 5).
inline constexpr int64_t kMinFoldBudgetBytes = int64_t{64} << 20;
inline constexpr int64_t kFoldBudgetPerConstantByte = 2;

struct FoldOptions {
  // Bytes all folded constants of the graph may hold together; 0 for the
  // default above. Raise it for a model refused with "above the constant
  // folding budget" whose computed constants are meant to be that large.
  int64_t budget_bytes = 0;
};

struct FoldResult {
  int folded_nodes = 0;        // nodes folded or dropped
  int64_t folded_bytes = 0;    // what the folded constants hold
  int64_t constant_bytes = 0;  // what the model's own constants hold
  int64_t budget_bytes = 0;    // the budget the folded constants were held to
};

// Bytes a constant holds in memory (all its copies).
int64_t HeldBytes(const Constant& c);

// The default budget for a graph whose own constants hold CONSTANT_BYTES.
int64_t DefaultFoldBudgetBytes(int64_t constant_bytes);

// Folds in place and removes the folded nodes. Nodes that cannot be
// evaluated are left for validation to report. RESOURCE_EXHAUSTED, naming
// the node, the bytes and the budget, when a fold would exceed the budget.
absl::StatusOr<FoldResult> FoldConstants(Graph& graph, const FoldOptions& options = {});

}  // namespace numaserve::engine
