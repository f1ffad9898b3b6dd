// A shape-polymorphic model's output shapes at a request's signature, in the
// server process: the front end sizes a request's outputs (and refuses a
// signature the model cannot run at) before the request is queued, as the
// worker that runs it will check it.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/ir/graph.h"
#include "engine/ir/types.h"
#include "serving/request/infer_request.h"

namespace numaserve::serving {

// Whether the model has a dynamic dim besides dim 0 of an input (a sequence
// length, an image's height): it runs at a signature, every input's shape,
// not at a batch size alone.
bool IsShapePolymorphic(const engine::ModelInfo& info);

// For a shape-polymorphic `graph`: a function that checks a signature
// against the graph's inputs (engine::CheckSignature: rank, fixed dims,
// dynamic dims >= 1, one size per named dim and for the batch, each input
// within the per-tensor limit; INVALID_ARGUMENT naming the input and dim)
// and propagates shapes to the outputs. It keeps a copy of the graph without
// its weights (shape functions read shapes and small constants only), so it
// holds kilobytes, not the model, and the answers for the last 1024
// signatures it was asked (a signature seen before costs a lookup, not a
// walk over the graph). Thread-safe; it outlives `graph`.
SignatureShapesFn MakeSignatureShapes(const engine::Graph& graph);

// ModelInfo of the model file at `path` (engine::InspectModel), and for a
// shape-polymorphic model its SignatureShapesFn (null otherwise).
struct InspectedModel {
  engine::ModelInfo info;
  SignatureShapesFn signature_shapes;
};
absl::StatusOr<InspectedModel> InspectModelWithSignatures(const std::string& path);

}  // namespace numaserve::serving
