// The op registry's tables, one function per family; op_registry.cc joins
// them into one lookup. Also the per-op parameter readers the compiled
// path shares with the references, so both read a node the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ops/op_registry.h"
#include "kernels/ref/conv_ref.h"
#include "kernels/ref/elementwise_ref.h"

namespace numaserve::engine::ops {

void AddElementwiseOps(std::vector<OpSchema>& table);
void AddNnOps(std::vector<OpSchema>& table);
void AddNormOps(std::vector<OpSchema>& table);
void AddTensorOps(std::vector<OpSchema>& table);
void AddResizeOps(std::vector<OpSchema>& table);
// QuantizeLinear and DequantizeLinear, with their typed references.
void AddQuantizeOps(std::vector<OpSchema>& table);
// ArgMax, ArgMin, CumSum, Trilu, TopK, OneHot, Range, NonZero (index_ops.cc).
void AddIndexOps(std::vector<OpSchema>& table);
// GatherElements, ScatterElements, GatherND, ScatterND (scatter_ops.cc).
void AddScatterOps(std::vector<OpSchema>& table);
// Einsum (einsum_ops.cc).
void AddEinsumOps(std::vector<OpSchema>& table);
// LSTM and GRU (rnn_ops.cc).
void AddRnnOps(std::vector<OpSchema>& table);
// RoiAlign (roi_ops.cc).
void AddRoiOps(std::vector<OpSchema>& table);
// If and Loop (control_flow_ops.cc): inlined at import where their
// condition or trip count is known at load; these rows refuse the rest.
void AddControlFlowOps(std::vector<OpSchema>& table);
// An Einsum's equation: each input's labels and the output's, in order.
struct EinsumSpec {
  std::vector<std::vector<int>> inputs;
  std::vector<int> output;
  int labels = 0;  // labels are 0..labels-1
  // Labels from here on stand for an ellipsis's dims: extent 1 broadcasts.
  int broadcast_from = 0;
};
// The equation of an Einsum node with inputs of these shapes (their ranks
// place each ellipsis: its dims become labels of their own, from
// broadcast_from on); INVALID_ARGUMENT / UNIMPLEMENTED naming the node as
// its validation does.
absl::StatusOr<EinsumSpec> EinsumLabelsOf(const Node& node,
                                          const std::vector<const Shape*>& inputs);
// Sets typed_reference/typed_accepts on the rows of ops with a typed
// reference (call last).
void AddTypedOps(std::vector<OpSchema>& table);

// Element-wise parameters of a unary op (incl. Clip with constant bounds).
absl::StatusOr<kernels::UnaryParams> UnaryParamsOf(const Graph& graph, const Node& node);
absl::StatusOr<kernels::BinaryKind> BinaryKindOf(const Node& node);

// QuantizeLinear / DequantizeLinear: the axis their scale runs along for x
// of shape `x`: -1 for a per-tensor scale (a scalar or one value), else the
// normalised `axis` (default 1) of a 1-D scale with x's extent there.
// INVALID_ARGUMENT for any other scale shape or an axis out of range,
// UNIMPLEMENTED for blocked quantization (block_size).
absl::StatusOr<int64_t> QuantizeAxisOf(const Node& node, const Shape& x, const Shape& scale);

// Conv / ConvTranspose / pooling window with auto_pad resolved for the
// given input shape ([N, C, spatial...]) and kernel spatial extents.
absl::StatusOr<kernels::WindowParams> ResolveWindow(const Node& node, const Shape& input,
                                                    const std::vector<int64_t>& kernel);

// ConvTranspose's window (pads_begin is the crop at the start of each output
// dim) and output shape for input x and weights w ([C, M/group, k...]).
struct ConvTransposeGeometry {
  kernels::WindowParams p;
  Shape out;
};
absl::StatusOr<ConvTransposeGeometry> ConvTransposeResolve(const Node& node, const Shape& x,
                                                           const Shape& w);

}  // namespace numaserve::engine::ops
