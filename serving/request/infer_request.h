// Checks a ModelInfer request against the model's metadata and finds its
// tensor bytes; builds the response from the outputs. Pure functions, so
// every bad-input case is unit-testable without a server.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "engine/ir/types.h"
#include "grpc_service.pb.h"

namespace numaserve::serving {

// A span of bytes: where they start, how many.
using ByteSpan = std::pair<const char*, size_t>;

// One input's bytes: one piece where they lie end to end (a message's
// field), several where a transport received them in buffers of its own
// (gRPC's slices); the pieces laid end to end are the tensor.
struct InputBytes {
  absl::InlinedVector<ByteSpan, 1> pieces;
  size_t size = 0;  // the pieces' bytes together
  void Add(ByteSpan piece) {
    pieces.push_back(piece);
    size += piece.second;
  }
};

// The raw input bytes of a request whose transport kept them in its own
// buffers instead of copying them into raw_input_contents (the request's
// raw_input_contents is then empty): per request input, in the request's
// order, its bytes, read in place (one copy fewer between the socket and
// the worker's arena).
struct TransportInputs {
  std::vector<InputBytes> inputs;
  // Owns the buffers the pieces point into; ParsedRequest keeps it.
  std::shared_ptr<const void> owner;
};

struct ParsedRequest {
  // The batch dims of the inputs (a dynamic dim 0, unnamed or of a name no
  // other dim has; every such input agrees): the rows the engine runs at; 1
  // for a model without one.
  int64_t rows = 1;
  // Per model input, in model order: the shape the request gives it. A
  // shape-polymorphic model runs at these (its signature).
  std::vector<std::vector<int64_t>> input_shapes;
  // Per model input, in model order: the tensor's bytes in the model's
  // datatype, pointing into the request, into the transport's buffers
  // (TransportInputs), or into `converted` where typed contents had to be
  // narrowed (int_contents for INT8/INT16, uint_contents for UINT8/UINT16).
  std::vector<InputBytes> inputs;
  // Owns the narrowed copies `inputs` points to (shared, so a copy of the
  // ParsedRequest points to the same live bytes).
  std::vector<std::shared_ptr<const std::string>> converted;
  // Owns the transport's buffers `inputs` points into, if any.
  std::shared_ptr<const void> transport;
  // Which model outputs to return, in the order asked for (all if none asked).
  std::vector<int> outputs;
  // Bytes and shapes of every model output for `rows` rows, in model order:
  // what the engine writes (OutputShapesFor).
  std::vector<size_t> output_bytes;
  std::vector<std::vector<int64_t>> output_shapes;
};

// A shape-polymorphic model's output shapes at a signature (every input's
// shape, in model order), after checking the signature as the engine will:
// INVALID_ARGUMENT naming the input and dim (MakeSignatureShapes,
// serving/repository/signature_shapes.h).
using SignatureShapesFn = std::function<absl::StatusOr<std::vector<std::vector<int64_t>>>(
    const std::vector<std::vector<int64_t>>& input_shapes)>;

// Inputs come in raw_input_contents (little-endian bytes of the model's
// datatype; BOOL bytes 0 or 1) or in the KServe v2 typed field of their
// datatype: bool_contents (BOOL), int_contents (INT8, INT16, INT32),
// int64_contents (INT64), uint_contents (UINT8, UINT16, UINT32),
// uint64_contents (UINT64), fp32_contents (FP32), fp64_contents (FP64).
// FP16 and BF16 have no typed field and travel raw only.
//
// INVALID_ARGUMENT naming the tensor and what was expected, for: a missing,
// unknown or repeated input; a datatype other than the model's (naming the
// given and the expected one); a shape of the wrong rank or dimensions, or
// inconsistent batch sizes; raw contents of the wrong byte count, or a raw
// BOOL byte other than 0 or 1; typed values in another datatype's field, of
// the wrong count, or outside the datatype's range (int_contents value 300
// for INT8); FP16/BF16 in typed contents; a mix of raw and typed contents;
// an unknown output.
// An input whose declared shape needs more than `max_bytes` bytes (0: no
// limit) is refused from its shape alone, before its contents are looked at.
//
// Shapes: each input of the model's rank, its fixed dims as the model (or
// config.pbtxt) fixes them, its dynamic dims >= 1, naming the input and the
// dim; the batch dims one size. A shape-polymorphic model's request is then
// checked and its outputs sized by `signature_shapes` (one size per named
// dim, the engine's limits; output_shapes at the signature); without it,
// the outputs follow the rows (OutputShapesFor).
//
// `transport`, where given, holds the raw input bytes in the transport's
// buffers: checked as raw_input_contents would be (one entry per request
// input, no typed contents beside them), the request's raw_input_contents
// must be empty, and ParsedRequest keeps its owner.
absl::StatusOr<ParsedRequest> ParseInferRequest(const engine::ModelInfo& model,
                                                const inference::ModelInferRequest& request,
                                                size_t max_bytes = 0,
                                                const SignatureShapesFn& signature_shapes = nullptr,
                                                const TransportInputs* transport = nullptr);

// The shape of every model output of a run at `rows` (the inputs' dynamic
// dim 0; 1 without one): from the model's shape function where its output
// shapes follow the rows in other ways (ModelInfo::output_shapes_at;
// INVALID_ARGUMENT when the model cannot run at `rows`), else the metadata's
// shapes with a dynamic dim 0 set to `rows`.
absl::StatusOr<std::vector<std::vector<int64_t>>> OutputShapesFor(const engine::ModelInfo& model,
                                                                  int64_t rows);

// Where output bytes go instead of raw_output_contents: called once per
// output the response carries, in the response's order, with bytes valid
// only during the call (a transport copying them into its own buffers).
using OutputSink = std::function<void(const char* data, size_t size)>;

// Fills outputs and raw_output_contents from `outputs` (one pointer per
// model output); with `sink`, the bytes go to it and raw_output_contents
// stays empty.
void FillInferResponse(const engine::ModelInfo& model, const ParsedRequest& parsed,
                       const std::vector<const char*>& outputs,
                       inference::ModelInferResponse* response, const OutputSink& sink = nullptr);

// The request parameter (and response parameter) that carries a request's
// step profile.
inline constexpr char kProfileParameter[] = "profile";

// Whether the request asks for its batch's step profile: the parameter
// `profile` as bool_param, or string_param "true" / "false"; false when it
// is absent. Any other value is INVALID_ARGUMENT naming the parameter.
absl::StatusOr<bool> RequestsProfile(const inference::ModelInferRequest& request);

std::string ShapeString(const std::vector<int64_t>& shape);  // "[-1,1,28,28]"

}  // namespace numaserve::serving
