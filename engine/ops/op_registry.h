// What the engine knows about each supported operator, in one table:
// import-time validation, shape inference on concrete shapes, the scalar
// reference implementation and a FLOP count. Adding an op = adding a row;
// fast paths (compiled_model.cc) decide separately how to run it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

struct OpSchema {
  absl::string_view op_type;
  // Checks attributes, input counts and required constant inputs.
  absl::Status (*validate)(const Graph& graph, const Node& node);
  // Output shapes from the inputs' concrete shapes (null for an omitted
  // optional input).
  absl::StatusOr<std::vector<Shape>> (*infer_shapes)(const Graph& graph, const Node& node,
                                                     const std::vector<const Shape*>& inputs);
  // Runs the op on reference kernels. FP32 inputs are given; non-float
  // constant inputs (e.g. Reshape's shape) are null and read from `graph`.
  absl::StatusOr<std::vector<kernels::Tensor>> (*reference)(
      const Graph& graph, const Node& node, const std::vector<const kernels::Tensor*>& inputs);
  // Floating-point operations (2 per multiply-add) for the given shapes.
  double (*flops)(const Node& node, const std::vector<const Shape*>& inputs);
  // The typed reference (engine/ops/typed_ops.cc and the files it names), for nodes that read or
  // write a runtime value of a type other than FP32; null when the op runs
  // on FP32 only. Every input is given (constants too; null only for an
  // omitted optional input); outputs have the node's output types.
  absl::StatusOr<std::vector<TypedTensor>> (*typed_reference)(
      const Graph& graph, const Node& node,
      const std::vector<const TypedTensor*>& inputs) = nullptr;
  // Whether typed_reference accepts these input/output element types (null
  // entries: kUnknown for omitted inputs); an UNIMPLEMENTED status naming
  // what it does not accept otherwise. Checked at load.
  absl::Status (*typed_accepts)(const Node& node, const std::vector<DataType>& inputs,
                                const std::vector<DataType>& outputs) = nullptr;
  // The family the op's row comes from ("element-wise", "neural network",
  // ...), for the generated op list in docs/engine.md; set by the registry.
  absl::string_view family = {};
};

// Null when the op is not supported.
const OpSchema* FindOpSchema(absl::string_view op_type);

// Names of the supported ops, for error messages.
std::string SupportedOpsList();

// Every supported op, sorted by op type (tools/op_docs.cc lists them).
absl::Span<const OpSchema> AllOpSchemas();

// Softmax's effective axis and semantics for the graph's opset (the default
// axis is 1 before opset 13 and -1 from it; before 13 the input is
// flattened to 2-D around the axis).
struct SoftmaxSemantics {
  int64_t axis;
  bool flatten_to_2d;
};
SoftmaxSemantics GetSoftmaxSemantics(const Graph& graph, const Node& node);

// Reshape's target (from its constant second input) and allowzero.
absl::StatusOr<std::vector<int64_t>> ReshapeTarget(const Graph& graph, const Node& node);

}  // namespace numaserve::engine
