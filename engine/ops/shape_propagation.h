// Concrete shapes of every value for given input shapes, using the op
// registry's shape functions (independent of ONNX's symbolic inference, so
// it also resolves Reshape's -1 against a real batch size).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/types.h"

namespace numaserve::engine {

// The graph inputs' shapes at `batch` rows: dynamic dims (-1) become batch.
std::vector<Shape> InputShapesForBatch(const Graph& graph, int64_t batch);

// Shapes indexed by ValueId; values never computed have an empty shape.
absl::StatusOr<std::vector<Shape>> PropagateShapes(const Graph& graph,
                                                   const std::vector<Shape>& input_shapes);

}  // namespace numaserve::engine

// --- Rows: may requests be batched together? ---------------------------------

namespace numaserve::engine {

// Whether requests can be computed together in one run and their output
// rows scattered back: every input is [rows, ...] (dim 0 dynamic), and every
// output is [rows, static...] whose row i is computed from row i of the
// inputs alone. Decided from the shapes at 1, 2 and 3 rows (the axis of a
// value whose size follows the rows is its row axis) and, per op, whether it
// combines elements along that axis: a reduction, softmax or normalization
// over it, a matmul contracting it, a reshape moving it, a gather or a
// reversed slice along it, batch statistics. An op without a rule here is
// taken to combine rows.
struct RowIndependence {
  bool independent = false;
  // Why not, naming the input, output or node: "output 'y' is [3,3] at 3
  // rows: node 'mm' (op MatMul) pairs rows with rows"; empty when
  // independent.
  std::string reason;
};
absl::StatusOr<RowIndependence> CheckRowIndependence(const Graph& graph);

// Whether CheckRowIndependence has a rule of its own for `op_type` (every
// op of the registry should).
bool HasRowRule(const std::string& op_type);

// The graph's output shapes at `rows` (the dynamic dim 0 of its inputs),
// from a copy of the graph that keeps shapes and small constants only
// (shape functions never read weights).
using OutputShapeFn = std::function<absl::StatusOr<std::vector<std::vector<int64_t>>>(int64_t)>;
OutputShapeFn MakeOutputShapeFn(const Graph& graph);

// Fills info->batched, info->unbatched_reason and info->output_shapes_at
// (when not batched and an output's shape follows the rows) for `graph`.
absl::Status DescribeBatching(const Graph& graph, ModelInfo* info);

}  // namespace numaserve::engine
