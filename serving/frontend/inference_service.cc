// InferenceService's health, metadata and statistics calls (ServerLive,
// ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelStatistics)
// and the unary ModelInfer with the path every inference takes:
// StartInference validates and queues a request, CancelCall takes a
// cancelled call's requests out of their queues. Also the service's own
// state: construction, Ready, WaitUntilIdle, and the model lookups (Resolve,
// IsKnownModel). ModelStreamInfer is in infer_stream.cc; ModelConfig and the
// repository calls in repository_calls.cc.
#include "serving/frontend/inference_service.h"

#include <algorithm>
#include <cctype>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/mutex.h"
#include "serving/frontend/call_util.h"
#include "serving/frontend/raw_infer.h"
#include "serving/observability/metrics.h"
#include "serving/observability/version.h"
#include "serving/request/datatypes.h"
#include "serving/request/infer_request.h"
#include "serving/request/request_parameters.h"
#include "serving/scheduling/admission.h"
#include "serving/workers/worker_supervisor.h"

namespace numaserve::serving {
namespace {

// The failure reasons of numaserve_request_failures_total.
std::string FailureReason(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kResourceExhausted:
      return "rejected";
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kCancelled:
      return "canceled";
    case absl::StatusCode::kInvalidArgument:
      return "invalid";
    case absl::StatusCode::kNotFound:
      return "not_found";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kInternal:
      return "internal";
    default:
      return "other";
  }
}

std::string OutcomeName(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk) return "success";
  std::string name = absl::StatusCodeToString(code);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

void AddTensorMetadata(const engine::TensorInfo& t,
                       inference::ModelMetadataResponse::TensorMetadata* out) {
  out->set_name(t.name);
  out->set_datatype(engine::DataTypeName(t.type));
  for (int64_t d : t.shape) out->add_shape(d);
}

}  // namespace

const char* ProtocolName(Protocol protocol) {
  return protocol == Protocol::kHttp ? "http" : "grpc";
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

InferenceService::InferenceService(const Options& options, ModelManager* models,
                                   WorkerSupervisor* workers, ModelScheduler* scheduler,
                                   Metrics* metrics)
    : options_(options),
      models_(models),
      workers_(workers),
      scheduler_(scheduler),
      metrics_(metrics),
      statistics_(options.statistics) {
  lifecycle_ = std::thread([this] { LifecycleLoop(); });
}

InferenceService::~InferenceService() { StopLifecycle(); }

bool InferenceService::Ready() const {
  if (shutting_down_) return false;
  for (int w = 0; w < workers_->size(); ++w) {
    if (workers_->Ready(w)) return true;
  }
  return false;
}

bool InferenceService::WaitUntilIdle(std::chrono::steady_clock::time_point deadline,
                                     std::chrono::milliseconds quiet) const {
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const auto last_call =
        std::chrono::steady_clock::time_point(std::chrono::nanoseconds(last_call_ns_.load()));
    bool streams_open = false;
    {
      base::MutexLock lock(&streams_mu_);
      streams_open = !streams_.empty();
    }
    if (in_flight_.load() == 0 && !streams_open && now - last_call >= quiet) return true;
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool InferenceService::IsKnownModel(const std::string& name) const {
  // NOT_FOUND only for a name the repository does not have; a known model
  // that is not ready is UNAVAILABLE.
  auto any = models_->Resolve(name, 0);
  return any.ok() || any.status().code() != absl::StatusCode::kNotFound;
}

absl::StatusOr<ModelHandle> InferenceService::Resolve(const std::string& name,
                                                      const std::string& version,
                                                      ModelManager::Need need) const {
  int64_t v = 0;
  if (!version.empty() && (!absl::SimpleAtoi(version, &v) || v <= 0)) {
    return absl::NotFoundError(absl::StrFormat(
        "model '%s' has no version '%s' (versions are positive integers)", name, version));
  }
  return models_->Resolve(name, v, need);
}

absl::StatusOr<bool> InferenceService::ModelIsReady(const std::string& name,
                                                    const std::string& version) const {
  auto model = Resolve(name, version);
  // As Triton answers: an unknown model or version is not ready, not an
  // error (tritonclient's is_model_ready asks before loading one).
  if (!model.ok() && model.status().code() != absl::StatusCode::kUnavailable &&
      model.status().code() != absl::StatusCode::kNotFound) {
    return model.status();
  }
  return !shutting_down_ && model.ok();
}

void InferenceService::FillServerMetadata(inference::ServerMetadataResponse* response) const {
  response->set_name("numaserve");
  response->set_version(BuildVersion());
  for (const char* extension : kServerExtensions) response->add_extensions(extension);
}

absl::Status InferenceService::FillModelMetadata(const std::string& name,
                                                 const std::string& version,
                                                 inference::ModelMetadataResponse* response) const {
  auto model = Resolve(name, version);
  if (!model.ok()) return model.status();
  const RepositoryModel& m = **model;
  response->set_name(m.name);
  for (int64_t v : models_->ReadyVersions(m.name)) response->add_versions(absl::StrCat(v));
  response->set_platform(kOnnxPlatform);
  for (const auto& t : m.info.inputs) AddTensorMetadata(t, response->add_inputs());
  for (const auto& t : m.info.outputs) AddTensorMetadata(t, response->add_outputs());
  return absl::OkStatus();
}

absl::Status InferenceService::FillModelStatistics(
    const std::string& name, const std::string& version,
    inference::ModelStatisticsResponse* response) const {
  int64_t v = 0;
  if (!name.empty()) {
    auto model = Resolve(name, version);
    if (!model.ok() && model.status().code() == absl::StatusCode::kNotFound) {
      return model.status();
    }
    if (!version.empty() && (!absl::SimpleAtoi(version, &v) || v < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("version '", version, "' is not a version number"));
    }
  }
  if (statistics_ != nullptr) statistics_->Fill(name, v, response);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* InferenceService::ServerLive(grpc::CallbackServerContext* context,
                                                       const inference::ServerLiveRequest*,
                                                       inference::ServerLiveResponse* response) {
  response->set_live(true);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerReady(grpc::CallbackServerContext* context,
                                                        const inference::ServerReadyRequest*,
                                                        inference::ServerReadyResponse* response) {
  response->set_ready(Ready());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelReady(grpc::CallbackServerContext* context,
                                                       const inference::ModelReadyRequest* request,
                                                       inference::ModelReadyResponse* response) {
  absl::StatusOr<bool> ready = ModelIsReady(request->name(), request->version());
  if (!ready.ok()) return FinishNow(context, ToGrpcStatus(ready.status()));
  response->set_ready(*ready);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  FillServerMetadata(response);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  return FinishNow(context,
                   ToGrpcStatus(FillModelMetadata(request->name(), request->version(), response)));
}

namespace {

// Why a cancelled call's queued requests are answered as they are: gRPC
// cancels a call whose deadline passed too, and that is a timeout.
absl::Status CancellationStatus(const CallCancellation& cancel) {
  if (std::chrono::system_clock::now() + std::chrono::milliseconds(5) >= cancel.deadline) {
    return absl::DeadlineExceededError(
        "the request's deadline passed while it was queued; it was not computed");
  }
  return absl::CancelledError("the call was cancelled while queued; it was not computed");
}

}  // namespace

// One ModelInfer call. gRPC calls OnCancel when the client cancels or the
// call's deadline passes: a request still queued then leaves its queue at
// once instead of waiting for a batcher poll. The call reads its request
// from gRPC's buffers and writes its reply to them (raw_infer.h).
class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(InferenceService* service, grpc::CallbackServerContext* context,
            grpc::ByteBuffer* reply)
      : service_(service), cancel_(std::make_shared<CallCancellation>()), reply_(reply) {
    cancel_->deadline = context->deadline();
  }
  void OnCancel() override { service_->CancelCall(*cancel_); }
  // The reply is written (or the call is over): its bytes leave the budget.
  void OnDone() override {
    if (release_) release_();
    delete this;
  }
  const std::shared_ptr<CallCancellation>& cancellation() const { return cancel_; }
  RawInferRequest& request() { return request_; }
  inference::ModelInferResponse* response() { return &response_; }
  // Each output's bytes, copied out of the worker's arena into a slice of
  // the reply.
  OutputSink OutputSlices() {
    return [this](const char* data, size_t size) { outputs_.emplace_back(data, size); };
  }
  void Answer(const absl::Status& status, InflightRelease release) {
    release_ = std::move(release);  // before Finish: OnDone may run at once
    if (status.ok()) *reply_ = WriteRawInferResponse(response_, std::move(outputs_));
    Finish(ToGrpcStatus(status));
  }

 private:
  InferenceService* const service_;
  const std::shared_ptr<CallCancellation> cancel_;
  grpc::ByteBuffer* const reply_;
  RawInferRequest request_;
  inference::ModelInferResponse response_;  // every field but raw_output_contents
  std::vector<grpc::Slice> outputs_;
  InflightRelease release_;
};

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  auto* call = new InferCall(this, context, response);
  absl::StatusOr<RawInferRequest> read = ReadRawInferRequest(*request);
  if (!read.ok()) {
    RecordUnreadRequest(read.status());
    call->Answer(read.status(), nullptr);
    return call;
  }
  call->request() = *std::move(read);
  TransportBuffers transport{call->request().transport, call->OutputSlices()};
  StartInference(
      Protocol::kGrpc, call->cancellation(), &call->request().message, call->response(),
      [call](const absl::Status& status, InflightRelease release) {
        call->Answer(status, std::move(release));
      },
      std::move(transport));
  return call;
}

void InferenceService::RecordUnreadRequest(const absl::Status& why) {
  if (!metrics_) return;
  const char* protocol = ProtocolName(Protocol::kGrpc);
  metrics_->RecordRequest(Metrics::kUnknownModelLabel, protocol, OutcomeName(why.code()), 0);
  metrics_->RecordFailure(Metrics::kUnknownModelLabel, protocol, FailureReason(why.code()));
}

void InferenceService::CancelCall(CallCancellation& cancel) {
  std::vector<std::shared_ptr<PendingInference>> queued;
  {
    base::MutexLock lock(&cancel.mu);
    cancel.cancelled = true;
    for (const auto& weak : cancel.queued) {
      if (auto p = weak.lock()) queued.push_back(std::move(p));
    }
    cancel.queued.clear();
  }
  if (queued.empty()) return;
  const absl::Status why = CancellationStatus(cancel);
  for (const auto& p : queued) scheduler_->Cancel(p, why);
}

absl::Status InferenceService::ChargeInflight(size_t* held, size_t need) {
  if (options_.max_inflight_bytes == 0) return absl::OkStatus();
  if (need < *held) {
    inflight_bytes_.fetch_sub(*held - need);
    *held = need;
    return absl::OkStatus();
  }
  // Charged first, so two requests never both see room for one.
  const size_t others = inflight_bytes_.fetch_add(need - *held) - *held;
  *held = need;
  if (others + need > options_.max_inflight_bytes && others > 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the server holds %d bytes of accepted requests and this one needs %d more, over "
        "--max-inflight-bytes-mb (%d MiB); retry later",
        others, need, options_.max_inflight_bytes >> 20));
  }
  return absl::OkStatus();
}

// Longer than ~80 lines on purpose: every path out of it (each refusal,
// the queueing, the re-resolve of a switched version) answers through the
// one `finish` closure, which must run exactly once per call and releases
// what the call holds; kept in one function so that is visible on each
// return.
// NOLINTNEXTLINE(readability-function-size): the reason is above.
void InferenceService::StartInference(
    Protocol protocol, const std::shared_ptr<CallCancellation>& cancel,
    const inference::ModelInferRequest* request, inference::ModelInferResponse* response,
    std::function<void(const absl::Status&, InflightRelease)> answer, TransportBuffers transport) {
  const auto received = std::chrono::steady_clock::now();
  in_flight_.fetch_add(1);
  last_call_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(received.time_since_epoch()).count());
  // What the answer records: the model version once resolved, the timing
  // once computed.
  struct Call {
    std::string model;
    int64_t version = 0;
    int64_t rows = 0;
    InferenceTiming timing;
    double output_seconds = 0;
    size_t held_bytes = 0;  // counted in inflight_bytes_ until the reply is written
  };
  auto call = std::make_shared<Call>();
  // The model label stays kUnknownModelLabel until the name is known to the
  // repository: request text never becomes a label value by itself.
  call->model = Metrics::kUnknownModelLabel;
  auto finish = [this, call, cancel, received, protocol,
                 answer = std::move(answer)](const absl::Status& answered) {
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count();
    // A result computed for a call cancelled meanwhile never reaches the
    // client: it counts as cancelled.
    const absl::Status status =
        answered.ok() && cancel->cancelled.load()
            ? absl::CancelledError("the call was cancelled before its answer was sent")
            : answered;
    if (metrics_) {
      metrics_->RecordRequest(call->model, ProtocolName(protocol), OutcomeName(status.code()),
                              total);
      if (!status.ok()) {
        metrics_->RecordFailure(call->model, ProtocolName(protocol), FailureReason(status.code()));
      }
    }
    if (statistics_ != nullptr && call->version > 0) {
      if (status.ok()) {
        const InferenceTiming& t = call->timing;
        statistics_->RecordSuccess(call->model, call->version, call->rows, total, t.queue_seconds,
                                   t.compute_input_seconds, t.compute_infer_seconds,
                                   call->output_seconds);
      } else {
        statistics_->RecordFailure(call->model, call->version, total);
      }
    }
    // The bytes stay charged until the caller has written the reply.
    answer(answered, [this, held = call->held_bytes] { inflight_bytes_.fetch_sub(held); });
    in_flight_.fetch_sub(1);
  };

  if (shutting_down_) {
    if (IsKnownModel(request->model_name())) call->model = request->model_name();
    return finish(absl::UnavailableError("the server is shutting down"));
  }
  // A request may queue for a worker that restarts with its model.
  auto resolved =
      Resolve(request->model_name(), request->model_version(), ModelManager::Need::kServable);
  if (!resolved.ok()) {
    if (IsKnownModel(request->model_name())) call->model = request->model_name();
    return finish(resolved.status());
  }
  ModelHandle model = *std::move(resolved);
  call->model = model->name;
  call->version = model->version;
  const auto& batching = model->config.dynamic_batching();
  auto parameters = ReadRequestParameters(
      *request, {batching.priority_levels(), batching.default_priority_level()});
  if (!parameters.ok()) return finish(parameters.status());
  auto admitted = Admit(*model, *request, options_.max_message_bytes, transport.inputs.get());
  if (!admitted.ok()) return finish(admitted.status());
  // What the request holds until answered: its inputs (in the request
  // message), every output the worker computes for it and its response.
  if (absl::Status s = ChargeInflight(&call->held_bytes, admitted->held_bytes()); !s.ok()) {
    return finish(s);
  }

  auto pending = std::make_shared<PendingInference>();
  pending->model = model;
  pending->rows = admitted->parsed.rows;
  pending->bytes = admitted->worker_bytes();
  pending->shape_key = std::move(admitted->shape_key);
  pending->profile = parameters->profile;
  pending->priority = parameters->priority;
  // The request's own timeout, else the model's, else the server's; the
  // client's deadline where it is earlier.
  auto timeout =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.default_timeout);
  if (parameters->timeout_us > 0) {
    timeout = std::chrono::microseconds(parameters->timeout_us);
  } else if (uint64_t us = batching.default_timeout_microseconds(); us > 0) {
    timeout = std::chrono::microseconds(us);
  }
  const auto client_deadline = cancel->deadline;
  const auto now_system = std::chrono::system_clock::now();
  if (client_deadline < now_system + timeout) {
    timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(client_deadline -
                                                                              now_system);
  }
  pending->deadline = received + timeout;
  pending->is_cancelled = [cancel] { return cancel->cancelled.load(); };
  pending->reject = [finish](const absl::Status& status) { finish(status); };
  response->set_model_name(model->name);
  response->set_model_version(absl::StrCat(model->version));
  response->set_id(request->id());
  pending->parsed = std::move(admitted->parsed);
  PendingInference* p = pending.get();
  pending->done = [this, p, call, response, finish, sink = std::move(transport.outputs)](
                      const absl::Status& status, const std::vector<const char*>& outputs,
                      const InferenceTiming& timing) {
    if (status.ok()) {
      const auto copy_start = std::chrono::steady_clock::now();
      FillInferResponse(p->model->info, p->parsed, outputs, response, sink);
      // Asked for (and only then): the batch's step profile, as JSON text.
      if (p->profile && !timing.profile.empty()) {
        (*response->mutable_parameters())[kProfileParameter].set_string_param(timing.profile);
      }
      const double output_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count();
      call->rows = p->parsed.rows;
      call->timing = timing;
      call->output_seconds = output_seconds;
      if (metrics_) {
        metrics_->RecordInference(p->model->name, p->parsed.rows, timing.queue_seconds,
                                  timing.compute_input_seconds, timing.compute_infer_seconds,
                                  output_seconds);
      }
    }
    finish(status);
  };
  {
    base::MutexLock lock(&cancel->mu);
    if (cancel->cancelled) {
      return finish(absl::CancelledError("the call was cancelled before it was queued"));
    }
    // A stream's answered requests leave the list now and then (amortised:
    // the list at most doubles between two sweeps).
    if (cancel->queued.size() >= cancel->prune_at) {
      std::erase_if(cancel->queued, [](const auto& w) { return w.expired(); });
      cancel->prune_at = std::max<size_t>(64, 2 * cancel->queued.size());
    }
    cancel->queued.push_back(pending);
  }
  SwitchFollowing how;
  how.submit = [this](std::shared_ptr<PendingInference> p) {
    return scheduler_->Submit(std::move(p));
  };
  how.resolve = [this, request] {
    return Resolve(request->model_name(), request->model_version(), ModelManager::Need::kServable);
  };
  how.readmit = [this, call, response](const RepositoryModel& again, const Admission& a) {
    call->version = again.version;
    response->set_model_version(absl::StrCat(again.version));
    return ChargeInflight(&call->held_bytes, a.held_bytes());
  };
  how.max_message_bytes = options_.max_message_bytes;
  how.transport = transport.inputs.get();
  const absl::Status submitted = SubmitFollowingSwitch(pending, *request, how);
  if (!submitted.ok()) return finish(submitted);
  // Cancelled between the check above and the queueing: OnCancel may have
  // missed it in the queue.
  if (cancel->cancelled.load()) scheduler_->Cancel(pending, CancellationStatus(*cancel));
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  return FinishNow(
      context, ToGrpcStatus(FillModelStatistics(request->name(), request->version(), response)));
}

}  // namespace numaserve::serving
