// ModelInfer's and ModelStreamInfer's messages read and written over gRPC's
// own buffers, so each
// tensor byte is copied once between the socket and the worker's arena:
// a request's raw_input_contents are found in the received slices and left
// there (the batch gathers them straight into the arena), the rest of the
// message is parsed by protobuf; a response's raw_output_contents are
// copied from the arena into slices of their own, after the rest of the
// message serialized by protobuf. Before, protobuf copied each input into
// the message and each output into the message and again into the wire
// buffer.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "grpc_service.pb.h"
#include "serving/request/infer_request.h"

namespace numaserve::serving {

// A ModelInferRequest received as gRPC slices: every field but
// raw_input_contents in `message`, the raw_input_contents (in order) in
// `transport`, whose owner holds the slices.
struct RawInferRequest {
  inference::ModelInferRequest message;
  std::shared_ptr<const TransportInputs> transport;
};

// Reads `buffer` (the wire form of a ModelInferRequest). Protobuf's rules
// hold: fields in any order, unknown fields skipped (wire types 0, 1, 2
// and 5), the last of a repeated singular field winning. INVALID_ARGUMENT
// naming the byte offset for what protobuf would refuse too: a truncated
// varint, tag or field, a length past the end, a group or an unknown wire
// type, field number 0, a message protobuf does not parse.
absl::StatusOr<RawInferRequest> ReadRawInferRequest(const grpc::ByteBuffer& buffer);

// The wire form of `head` (a ModelInferResponse without raw_output_contents)
// followed by one raw_output_contents entry per slice of `outputs`, in
// order: what protobuf would serialize for the whole message (field order
// aside, which protobuf's parsers do not depend on).
grpc::ByteBuffer WriteRawInferResponse(const inference::ModelInferResponse& head,
                                       std::vector<grpc::Slice> outputs);

// The same for a stream's reply: `head` (a ModelStreamInferResponse whose
// infer_response has no raw_output_contents) with `outputs` appended to
// its infer_response.
grpc::ByteBuffer WriteRawStreamResponse(const inference::ModelStreamInferResponse& head,
                                        std::vector<grpc::Slice> outputs);

}  // namespace numaserve::serving
