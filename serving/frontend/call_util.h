// Internal to the gRPC front end: what the files that implement
// InferenceService's calls (inference_service.cc, infer_stream.cc,
// repository_calls.cc) share. Not part of the front end's API; nothing
// outside serving/frontend includes it.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

namespace numaserve::serving {

// Triton's platform name for an ONNX model: what ModelMetadata and
// ModelConfig both answer.
inline constexpr char kOnnxPlatform[] = "onnxruntime_onnx";

// Finishes a unary call at once with `status` and returns its reactor.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const grpc::Status& status);

}  // namespace numaserve::serving
