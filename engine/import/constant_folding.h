// Constant folding at import: a node whose inputs are all constants runs
// once on its scalar reference and becomes a constant, and a Shape node
// whose input shape does not depend on the batch becomes one too. A Shape
// that does depend on it is evaluated at two batch sizes, and what is
// computed from it (small integer values only) folds where both agree (the
// sequence length Gather(Shape(ids), 1) with only the batch dynamic); the
// Shape is then dropped when nothing else reads it. Shape arithmetic
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and weight-only
// subgraphs (a transposed or scaled initializer) thus cost nothing at run
// time. Non-FP32 constants fold through the typed references (exact).
#pragma once

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"

namespace numaserve::engine {

// Folds in place and removes the folded nodes; returns how many were
// folded. Nodes that cannot be evaluated are left for validation to report.
absl::StatusOr<int> FoldConstants(Graph& graph);

}  // namespace numaserve::engine
