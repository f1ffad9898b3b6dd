// The checks a ModelInfer request passes before it is queued on a model
// version, and the queueing that follows a version switched out meanwhile:
// a request re-submitted to the version that replaced it passes the same
// checks as a new one (its rows against the new max_batch_size, its
// response against the message limit, its bytes against the budget).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpc_service.pb.h"
#include "serving/repository/model_repository.h"
#include "serving/request/infer_request.h"
#include "serving/scheduling/model_scheduler.h"

namespace numaserve::serving {

// A request admitted to one model version, and the bytes it holds there.
struct Admission {
  ParsedRequest parsed;
  size_t request_bytes = 0;   // its inputs, in the request message
  size_t output_bytes = 0;    // every output the worker computes for it
  size_t response_bytes = 0;  // the outputs asked for, in the response
  // What the in-flight budget is charged for it until it is answered.
  size_t held_bytes() const { return request_bytes + output_bytes + response_bytes; }
  // What a batch needs of the worker's arena for it (BatchRequest::bytes).
  size_t worker_bytes() const { return request_bytes + output_bytes; }
  // Which requests it may share a batch with (BatchRequest::shape_key): a
  // shape-polymorphic model's input dims besides dim 0; empty otherwise.
  std::vector<int64_t> shape_key;
};

// The dims besides dim 0 of every input (each input's rank first): requests
// of a shape-polymorphic model batch together only where these are equal.
// Empty for a model without a signature (null signature_shapes).
std::vector<int64_t> BatchShapeKey(const RepositoryModel& model, const ParsedRequest& parsed);

// Parses `request` against `model` (ParseInferRequest) and checks its rows
// against max_batch_size and its response against `max_message_bytes`:
// INVALID_ARGUMENT with the reason where it does not fit. `transport`: the
// raw input bytes where the transport kept them (ParseInferRequest).
absl::StatusOr<Admission> Admit(const RepositoryModel& model,
                                const inference::ModelInferRequest& request,
                                size_t max_message_bytes,
                                const TransportInputs* transport = nullptr);

// How a request follows a switch of its version.
struct SwitchFollowing {
  // Queues a request (ModelScheduler::Submit).
  std::function<absl::Status(std::shared_ptr<PendingInference>)> submit;
  // What the request names now (the version that replaced it, if any).
  std::function<absl::StatusOr<std::shared_ptr<const RepositoryModel>>()> resolve;
  // Takes the admission to the new version before the request is queued
  // there (charges its bytes, records its version); not OK refuses it.
  std::function<absl::Status(const RepositoryModel& model, const Admission& admission)> readmit;
  size_t max_message_bytes = 0;
  // The request's raw input bytes where its transport kept them, or null.
  const TransportInputs* transport = nullptr;
};

// Submits `pending`. Where its version was switched out between resolving
// and queueing (UNAVAILABLE), the request is admitted to what it names now
// with Admit and `readmit`, and queued there; where it no longer fits, the
// error a new request would get is returned. Not OK: `pending` was not
// queued (its `done` is not called).
absl::Status SubmitFollowingSwitch(const std::shared_ptr<PendingInference>& pending,
                                   const inference::ModelInferRequest& request,
                                   const SwitchFollowing& how);

}  // namespace numaserve::serving
