// Concrete shapes of every value for given input shapes, using the op
// registry's shape functions (independent of ONNX's symbolic inference, so
// it also resolves Reshape's -1 against a real batch size).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/types.h"

namespace numaserve::engine {

// The graph inputs' shapes at `batch` rows: dynamic dims (-1) become batch.
std::vector<Shape> InputShapesForBatch(const Graph& graph, int64_t batch);

// Whether an input has a dynamic dim other than dim 0 (a sequence length,
// an image's height): such a model runs at input shapes given per run (a
// signature), not at a batch size alone.
bool HasDynamicNonBatchDims(const Graph& graph);

// The two probes at which import, ModelInfo and the compiler look at a
// model with dynamic dims: probe `which` (0 or 1) sets the batch to
// which + 1 (batch 1, then 2) and every other dynamic dim to
// kProbeDims[which]. The batch is a dynamic dim 0, unnamed or of a name
// that no dim besides a dim 0 has (pos [seq, hidden] beside x [batch, seq,
// hidden]: pos's dim 0 is 'seq', not the batch). A dim that differs between the two follows a
// dynamic dim. Probe 0 of a model whose only dynamic dims are dims 0 is InputShapesForBatch(graph,
// 1). A dim an output names as an input's takes the size the graph computes
// for the output's (a decoder's mask [batch, total_sequence] the size of its
// present keys' total_sequence, past + sequence), so that the probe is a
// signature the model runs.
inline constexpr int64_t kProbeDims[2] = {64, 96};
std::vector<Shape> ProbeInputShapes(const Graph& graph, int which);
// Probe `which`'s shapes with the batch at `rows`.
std::vector<Shape> ProbeInputShapesAtRows(const Graph& graph, int which, int64_t rows);

// The names of dynamic dims other than dims 0 (a dim 0 of one of these
// names is not the batch: pos [seq, hidden] beside x [batch, seq, hidden]).
std::set<std::string> NonBatchDimNames(const Graph& graph);
// Whether dynamic dim `d` of `v` is the batch: a dim 0, unnamed or of a
// name no other dim has.
bool IsBatchDim(const Value& v, size_t d, const std::set<std::string>& non_batch_names);

// A signature: every input's concrete shape for one run. CheckSignature
// checks it against the graph's inputs before anything of its size is
// allocated: as many shapes as inputs, each of the input's rank, its fixed
// dims as declared, its dynamic dims >= 1, every batch dim one size (as
// for ProbeInputShapes), the dims of one name (dim_param) one size, and each input
// within kernels::kMaxTensorElements. INVALID_ARGUMENT naming the input and
// the dim otherwise. Its key: {batch (1 without a dynamic dim 0), then
// every other dynamic dim in input order}; a model whose only dynamic dims
// are dims 0 has the key {batch}, its batch size.
absl::StatusOr<std::vector<int64_t>> CheckSignature(const Graph& graph,
                                                    const std::vector<Shape>& input_shapes);

// " ('seq')" where dim `d` of `t` has a name; "" otherwise.
std::string DimNameSuffix(const TensorInfo& t, size_t d);

// "'x' [2,128,768], 'mask' [2,128]": a signature in messages.
std::string DescribeSignature(const Graph& graph, const std::vector<Shape>& input_shapes);

// Shapes indexed by ValueId; values never computed have an empty shape.
absl::StatusOr<std::vector<Shape>> PropagateShapes(const Graph& graph,
                                                   const std::vector<Shape>& input_shapes);

// Shape values: what a graph computes from shapes alone, exactly, at one
// signature. A Shape or Size node's output is one; so is the output of a
// node whose inputs are graph constants (of at most
// kMaxShapeValueConstantElements elements each: the constants a copy of the
// graph without its weights keeps) or shape values, at least one of them a
// shape value, with an op that has a typed reference and outputs of at most
// kMaxShapeValueElements elements, of an op whose cost follows its
// elements: Gather, Slice, Concat, Unsqueeze, Reshape, elementwise
// arithmetic and comparisons, Cast, Where, Range, ConstantOfShape, Expand,
// Tile, the reductions... on the dims (no MatMul, no Conv). All the values
// of one propagation hold at most kMaxShapeValuesTotal elements (past that,
// values are left to run time). Nothing that reads an input's elements is
// one (a value computed from data stays a runtime value, and an op that
// needs it as a constant is refused).
inline constexpr int64_t kMaxShapeValueElements = 4096;
inline constexpr int64_t kMaxShapeValuesTotal = int64_t{1} << 20;
// Shape values of at most this many elements at the first probe are the
// graph's shape parameters (Graph::AddShapeParameter): dims vectors and
// scalars, which ops read as constants.
inline constexpr int64_t kMaxShapeParameterElements = 16;
inline constexpr int64_t kMaxShapeValueConstantElements = 1024;

// PropagateShapes, computing the shape values as it goes into VALUES
// (cleared first; filled as far as it got when it fails): while it runs
// they answer Graph::FindConstant (ScopedShapeValues), so a Reshape whose
// target, a Slice whose ends, an Expand whose shape, a Range whose limit,
// a Resize whose sizes are shape values has its shape here, and a node
// reading one is validated at these shapes (OpSchema::validate), since its
// values change with the signature.
absl::StatusOr<std::vector<Shape>> PropagateShapesAndValues(const Graph& graph,
                                                            const std::vector<Shape>& input_shapes,
                                                            ShapeValues& values);

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
// Every op type CheckRowIndependence has a rule for (each should name an
// op of the registry; tests/engine/op_tables_test.cc checks both ways).
std::vector<std::string> RowRuleOps();

// The graph's output shapes at `rows` (the dynamic dim 0 of its inputs),
// from a copy of the graph that keeps shapes and small constants only
// (shape functions never read weights).
using OutputShapeFn = std::function<absl::StatusOr<std::vector<std::vector<int64_t>>>(int64_t)>;
OutputShapeFn MakeOutputShapeFn(const Graph& graph);

// Fills info->batched, info->unbatched_reason and info->output_shapes_at
// (when not batched and an output's shape follows the rows) for `graph`.
absl::Status DescribeBatching(const Graph& graph, ModelInfo* info);

}  // namespace numaserve::engine
