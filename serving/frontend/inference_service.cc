#include "serving/frontend/inference_service.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "serving/observability/metrics.h"
#include "serving/observability/version.h"
#include "serving/repository/model_config.h"
#include "serving/request/datatypes.h"
#include "serving/request/infer_request.h"
#include "serving/workers/worker_supervisor.h"

namespace numaserve::server {
namespace {

// Triton's platform name for an ONNX model: what ModelMetadata and
// ModelConfig both answer.
constexpr char kOnnxPlatform[] = "onnxruntime_onnx";

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

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
      std::lock_guard<std::mutex> lock(streams_mu_);
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
  auto model = Resolve(request->name(), request->version());
  if (!model.ok() && model.status().code() != absl::StatusCode::kUnavailable) {
    return FinishNow(context, ToGrpcStatus(model.status()));
  }
  response->set_ready(!shutting_down_ && model.ok());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  response->set_name("numaserve");
  response->set_version(BuildVersion());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  auto model = Resolve(request->name(), request->version());
  if (!model.ok()) return FinishNow(context, ToGrpcStatus(model.status()));
  const RepositoryModel& m = **model;
  response->set_name(m.name);
  for (int64_t v : models_->ReadyVersions(m.name)) response->add_versions(absl::StrCat(v));
  response->set_platform(kOnnxPlatform);
  for (const auto& t : m.info.inputs) AddTensorMetadata(t, response->add_inputs());
  for (const auto& t : m.info.outputs) AddTensorMetadata(t, response->add_outputs());
  return FinishNow(context, grpc::Status::OK);
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
// once instead of waiting for a batcher poll.
class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(InferenceService* service, grpc::CallbackServerContext* context)
      : service_(service), cancel_(std::make_shared<CallCancellation>()) {
    cancel_->deadline = context->deadline();
  }
  void OnCancel() override { service_->CancelCall(*cancel_); }
  void OnDone() override { delete this; }
  const std::shared_ptr<CallCancellation>& cancellation() const { return cancel_; }

 private:
  InferenceService* const service_;
  const std::shared_ptr<CallCancellation> cancel_;
};

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* request,
                                                       inference::ModelInferResponse* response) {
  auto* call = new InferCall(this, context);
  StartInference(context, call->cancellation(), request, response,
                 [call](const absl::Status& status) { call->Finish(ToGrpcStatus(status)); });
  return call;
}

void InferenceService::CancelCall(CallCancellation& cancel) {
  std::vector<std::shared_ptr<PendingInference>> queued;
  {
    std::lock_guard<std::mutex> lock(cancel.mu);
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

// Longer than ~80 lines on purpose: every path out of it (each refusal,
// the queueing, the re-resolve of a switched version) answers through the
// one `finish` closure, which must run exactly once per call and releases
// what the call holds; kept in one function so that is visible on each
// return.
// NOLINTNEXTLINE(readability-function-size): the reason is above.
void InferenceService::StartInference(grpc::CallbackServerContext* context,
                                      const std::shared_ptr<CallCancellation>& cancel,
                                      const inference::ModelInferRequest* request,
                                      inference::ModelInferResponse* response,
                                      std::function<void(const absl::Status&)> answer) {
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
    size_t held_bytes = 0;  // counted in inflight_bytes_ until answered
  };
  auto call = std::make_shared<Call>();
  // The model label stays kUnknownModelLabel until the name is known to the
  // repository: request text never becomes a label value by itself.
  call->model = Metrics::kUnknownModelLabel;
  auto finish = [this, call, cancel, received,
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
      metrics_->RecordRequest(call->model, OutcomeName(status.code()), total);
      if (!status.ok()) metrics_->RecordFailure(call->model, FailureReason(status.code()));
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
    answer(answered);
    inflight_bytes_.fetch_sub(call->held_bytes);
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
  auto profile = RequestsProfile(*request);
  if (!profile.ok()) return finish(profile.status());
  auto parsed = ParseInferRequest(model->info, *request, options_.max_message_bytes);
  if (!parsed.ok()) return finish(parsed.status());
  const int64_t max_batch = model->config.max_batch_size();
  if (max_batch > 0 && parsed->rows > max_batch) {
    return finish(absl::InvalidArgumentError(absl::StrFormat(
        "the request has %d rows; model '%s' takes at most max_batch_size = %d per request",
        parsed->rows, model->name, max_batch)));
  }
  size_t response_bytes = 0;
  for (int index : parsed->outputs) response_bytes += parsed->output_bytes[index];
  if (response_bytes > options_.max_message_bytes) {
    return finish(absl::InvalidArgumentError(absl::StrFormat(
        "the response would carry %d bytes of outputs, more than the %d-byte message limit "
        "(--grpc-max-message-bytes); send fewer rows",
        response_bytes, options_.max_message_bytes)));
  }

  // What the request holds until answered: its inputs (in the request
  // message) and every output the worker computes for it.
  size_t request_bytes = 0;
  for (const auto& input : parsed->inputs) request_bytes += input.second;
  size_t output_bytes = 0;
  for (size_t bytes : parsed->output_bytes) output_bytes += bytes;
  const size_t held = request_bytes + output_bytes + response_bytes;
  if (options_.max_inflight_bytes > 0) {
    const size_t before = inflight_bytes_.fetch_add(held);
    call->held_bytes = held;
    if (before + held > options_.max_inflight_bytes && before > 0) {
      return finish(absl::ResourceExhaustedError(absl::StrFormat(
          "the server holds %d bytes of accepted requests and this one needs %d more, over "
          "--max-inflight-bytes-mb (%d MiB); retry later",
          before, held, options_.max_inflight_bytes >> 20)));
    }
  }

  auto pending = std::make_shared<PendingInference>();
  pending->model = model;
  pending->rows = parsed->rows;
  pending->bytes = request_bytes + output_bytes;
  pending->profile = *profile;
  auto timeout =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.default_timeout);
  if (uint64_t us = model->config.dynamic_batching().default_timeout_microseconds(); us > 0) {
    timeout = std::chrono::microseconds(us);
  }
  const auto client_deadline = context->deadline();
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
  pending->parsed = *std::move(parsed);
  PendingInference* p = pending.get();
  pending->done = [this, p, call, response, finish](const absl::Status& status,
                                                    const std::vector<const char*>& outputs,
                                                    const InferenceTiming& timing) {
    if (status.ok()) {
      const auto copy_start = std::chrono::steady_clock::now();
      FillInferResponse(p->model->info, p->parsed, outputs, response);
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
    std::lock_guard<std::mutex> lock(cancel->mu);
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
  absl::Status submitted = scheduler_->Submit(pending);
  if (submitted.code() == absl::StatusCode::kUnavailable) {
    // The version this request resolved to was switched out meanwhile (a
    // newer version, or the same version reloaded with an edited config):
    // what the request names now takes it.
    auto again =
        Resolve(request->model_name(), request->model_version(), ModelManager::Need::kServable);
    if (again.ok() && *again != model) {
      auto parsed_again = ParseInferRequest((*again)->info, *request, options_.max_message_bytes);
      if (parsed_again.ok()) {
        pending->model = *again;
        pending->parsed = *std::move(parsed_again);
        call->version = (*again)->version;
        response->set_model_version(absl::StrCat((*again)->version));
        submitted = scheduler_->Submit(pending);
      }
    }
  }
  if (!submitted.ok()) return finish(submitted);
  // Cancelled between the check above and the queueing: OnCancel may have
  // missed it in the queue.
  if (cancel->cancelled.load()) scheduler_->Cancel(pending, CancellationStatus(*cancel));
}

// One ModelStreamInfer call: every request read starts an inference; the
// answers are written back one at a time as they complete. The call ends
// when the client has finished writing and every answer has been written,
// or, once the server drains, when every request read so far is answered.
class InferStream final : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                                         inference::ModelStreamInferResponse> {
 public:
  InferStream(InferenceService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), cancel_(std::make_shared<CallCancellation>()) {
    cancel_->deadline = context->deadline();
    if (service_->AddStream(this)) {
      ReadNext();
    } else {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    }
  }

  void OnReadDone(bool ok) override {
    bool read_more = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok || finished_) {
        reads_done_ = true;
        MaybeFinishLocked();
        return;
      }
      ++outstanding_;
      // Draining: this request is answered (UNAVAILABLE), no more are read.
      read_more = !draining_;
      if (!read_more) reads_done_ = true;
      // At the limit, the next read waits for an answer to be written.
      if (read_more && outstanding_ >= service_->options_.max_stream_outstanding) {
        read_more = false;
        read_paused_ = true;
      }
    }
    std::shared_ptr<Item> item = std::move(reading_);
    service_->StartInference(
        context_, cancel_, &item->request, item->reply.mutable_infer_response(),
        [this, item](const absl::Status& status) {
          if (!status.ok()) {
            const std::string id = item->request.id();
            item->reply.Clear();
            item->reply.set_error_message(
                absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
            item->reply.mutable_infer_response()->set_id(id);
            item->reply.mutable_infer_response()->set_model_name(item->request.model_name());
          }
          Write(item);
        });
    if (read_more) ReadNext();
  }

  void OnWriteDone(bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.pop_front();
    --outstanding_;
    if (read_paused_ && !draining_ && !finished_ &&
        outstanding_ < service_->options_.max_stream_outstanding) {
      read_paused_ = false;
      ReadNext();  // the read chain was idle: nothing else touches reading_
    }
    if (!writes_.empty()) {
      StartWrite(&writes_.front()->reply);
      return;
    }
    writing_ = false;
    MaybeFinishLocked();
  }

  void OnCancel() override { service_->CancelCall(*cancel_); }

  void OnDone() override {
    service_->RemoveStream(this);
    delete this;
  }

  // The server is shutting down: stop reading, end the call once every
  // request read so far has been answered.
  void Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    MaybeFinishLocked();
  }

 private:
  struct Item {
    inference::ModelInferRequest request;
    inference::ModelStreamInferResponse reply;
  };

  void ReadNext() {
    reading_ = std::make_shared<Item>();
    StartRead(&reading_->request);
  }

  void Write(std::shared_ptr<Item> item) {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.push_back(std::move(item));
    if (!writing_) {
      writing_ = true;
      StartWrite(&writes_.front()->reply);
    }
  }

  void MaybeFinishLocked() {
    if ((!reads_done_ && !draining_) || outstanding_ > 0 || writing_ || finished_) return;
    finished_ = true;
    if (reads_done_ && !draining_) {
      Finish(grpc::Status::OK);
    } else {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server is shutting down; every request read on this stream "
                          "has been answered"));
    }
  }

  InferenceService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::shared_ptr<CallCancellation> cancel_;
  std::shared_ptr<Item> reading_;  // only touched by the read chain
  std::mutex mu_;
  std::deque<std::shared_ptr<Item>> writes_;  // front: being written
  int64_t outstanding_ = 0;                   // read, not yet written
  bool writing_ = false;
  bool read_paused_ = false;  // at max_stream_outstanding; OnWriteDone reads on
  bool reads_done_ = false;
  bool draining_ = false;
  bool finished_ = false;
};

bool InferenceService::AddStream(InferStream* stream) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.insert(stream);
  return !shutting_down_;
}

void InferenceService::RemoveStream(InferStream* stream) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.erase(stream);
}

void InferenceService::SetShuttingDown() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    shutting_down_ = true;
    for (InferStream* stream : streams_) stream->Drain();
  }
  // Loads and unloads not yet started are refused; the one under way ends.
  std::deque<LifecycleJob> refused;
  {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    refused.swap(lifecycle_jobs_);
  }
  for (auto& job : refused) {
    job.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
}

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
InferenceService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return new InferStream(this, context);
}

grpc::ServerUnaryReactor* InferenceService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  int64_t version = 0;
  if (!request->name().empty()) {
    auto model = Resolve(request->name(), request->version());
    if (!model.ok() && model.status().code() == absl::StatusCode::kNotFound) {
      return FinishNow(context, ToGrpcStatus(model.status()));
    }
    if (!request->version().empty()) absl::SimpleAtoi(request->version(), &version);
  }
  if (statistics_ != nullptr) statistics_->Fill(request->name(), version, response);
  return FinishNow(context, grpc::Status::OK);
}

namespace {

// The version policy as the config has it, `latest` (1) by default.
void FillVersionPolicy(const config::ModelConfig& c, inference::ModelConfig* out) {
  switch (c.version_policy().policy_choice_case()) {
    case config::VersionPolicy::kAll:
      out->mutable_version_policy()->mutable_all();
      break;
    case config::VersionPolicy::kSpecific:
      for (int64_t v : c.version_policy().specific().versions()) {
        out->mutable_version_policy()->mutable_specific()->add_versions(v);
      }
      break;
    default:
      out->mutable_version_policy()->mutable_latest()->set_num_versions(
          std::max<uint32_t>(1, c.version_policy().latest().num_versions()));
  }
}

// Inputs and outputs from the ONNX file (the config's lists were checked
// against it); dims without the batch dimension when batched, -1 dynamic.
void FillTensors(const RepositoryModel& m, inference::ModelConfig* out) {
  const size_t first_dim = m.config.max_batch_size() > 0 ? 1 : 0;
  for (const auto& t : m.info.inputs) {
    auto* in = out->add_input();
    in->set_name(t.name);
    in->set_data_type(TritonDataType(t.type));
    for (size_t d = first_dim; d < t.shape.size(); ++d) in->add_dims(t.shape[d]);
  }
  for (const auto& t : m.info.outputs) {
    auto* o = out->add_output();
    o->set_name(t.name);
    o->set_data_type(TritonDataType(t.type));
    for (size_t d = first_dim; d < t.shape.size(); ++d) o->add_dims(t.shape[d]);
  }
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  auto model = Resolve(request->name(), request->version());
  if (!model.ok()) return FinishNow(context, ToGrpcStatus(model.status()));
  const RepositoryModel& m = **model;
  const config::ModelConfig& c = m.config;
  inference::ModelConfig* out = response->mutable_config();
  out->set_name(m.name);
  out->set_platform(kOnnxPlatform);
  out->set_backend("numaserve");
  out->set_max_batch_size(c.max_batch_size());
  FillVersionPolicy(c, out);
  FillTensors(m, out);
  // The copies the workers holding this version run (auto and per_core
  // resolved by each worker at load); where none holds it now, what the
  // config asks for.
  const int configured = c.instance_placement().instances_per_domain();
  int32_t count = 0;
  for (int w = 0; workers_ != nullptr && w < workers_->size(); ++w) {
    if (workers_->HasModel(w, m.key())) count += workers_->Instances(w, m.key());
  }
  if (count == 0) count = static_cast<int32_t>(m.workers.size()) * std::max(1, configured);
  auto* group = out->add_instance_group();
  group->set_name(absl::StrCat(m.name, "_0"));
  group->set_kind(inference::ModelInstanceGroup::KIND_CPU);
  group->set_count(count);
  // The batcher the version runs with, the server's defaults applied.
  if (c.has_dynamic_batching()) {
    const auto& d = c.dynamic_batching();
    auto* batching = out->mutable_dynamic_batching();
    for (int32_t p : d.preferred_batch_size()) batching->add_preferred_batch_size(p);
    batching->set_max_queue_delay_microseconds(d.max_queue_delay_microseconds());
    auto* queue = batching->mutable_default_queue_policy();
    queue->set_timeout_action(inference::ModelQueuePolicy::REJECT);
    queue->set_default_timeout_microseconds(
        d.default_timeout_microseconds() > 0
            ? d.default_timeout_microseconds()
            : static_cast<uint64_t>(options_.default_timeout.count()) * 1000);
    queue->set_allow_timeout_override(true);  // a shorter client deadline wins
    queue->set_max_queue_size(static_cast<uint32_t>(
        d.max_queue_size() > 0 ? d.max_queue_size() : options_.default_max_queue_size));
  }
  auto& parameters = *out->mutable_parameters();
  parameters["gemm_backend"].set_string_value(c.gemm_backend().empty() ? "auto" : c.gemm_backend());
  parameters["precision"].set_string_value(c.precision().empty() ? "fp32" : c.precision());
  parameters["instance_placement.domains"].set_string_value(
      c.instance_placement().domains_size() == 0 ? "all" : absl::StrJoin(m.workers, ","));
  parameters["instance_placement.instances_per_domain"].set_string_value(
      FormatInstances(configured));
  // Throughput mode: what each worker measured and chose ("1x2 threads
  // 41.0 rows/s, 2x1 thread 70.2 rows/s -> 2").
  for (int w = 0; workers_ != nullptr && w < workers_->size(); ++w) {
    if (!workers_->HasModel(w, m.key())) continue;
    const std::string report = workers_->InstancesReport(w, m.key());
    if (!report.empty()) {
      parameters[absl::StrCat("instances_auto.worker", w)].set_string_value(report);
    }
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  if (!request->repository_name().empty()) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                           "this server has one repository; leave "
                                           "repository_name empty"));
  }
  for (const auto& e : models_->Index()) {
    if (request->ready() && e.state != ModelState::kReady) continue;
    auto* m = response->add_models();
    m->set_name(e.name);
    if (e.version > 0) m->set_version(absl::StrCat(e.version));
    m->set_state(ModelStateName(e.state));
    m->set_reason(e.reason);
  }
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::RunLifecycle(grpc::CallbackServerContext* context,
                                                         std::function<absl::Status()> fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    if (!lifecycle_stopping_ && !shutting_down_) {
      lifecycle_jobs_.push_back({reactor, std::move(fn)});
      lifecycle_cv_.notify_one();
      return reactor;
    }
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  return reactor;
}

void InferenceService::LifecycleLoop() {
  std::unique_lock<std::mutex> lock(lifecycle_mu_);
  while (true) {
    lifecycle_cv_.wait(lock, [&] { return lifecycle_stopping_ || !lifecycle_jobs_.empty(); });
    if (lifecycle_jobs_.empty()) return;  // stopping, nothing left
    LifecycleJob job = std::move(lifecycle_jobs_.front());
    lifecycle_jobs_.pop_front();
    lock.unlock();
    job.reactor->Finish(ToGrpcStatus(job.run()));
    lock.lock();
  }
}

void InferenceService::StopLifecycle() {
  std::deque<LifecycleJob> refused;
  {
    std::lock_guard<std::mutex> lock(lifecycle_mu_);
    lifecycle_stopping_ = true;
    refused.swap(lifecycle_jobs_);
  }
  lifecycle_cv_.notify_all();
  for (auto& job : refused) {
    job.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
  if (lifecycle_.joinable()) lifecycle_.join();
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  if (models_->mode() != ModelControlMode::kExplicit) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "loading models by request needs "
                                           "--model-control-mode explicit"));
  }
  if (shutting_down_) {
    return FinishNow(context,
                     grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
  const std::string& name = request->model_name();
  return RunLifecycle(context, [this, name] { return models_->Load(name); });
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  if (models_->mode() != ModelControlMode::kExplicit) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "unloading models by request needs "
                                           "--model-control-mode explicit"));
  }
  if (shutting_down_) {
    return FinishNow(context,
                     grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }
  const std::string& name = request->model_name();
  return RunLifecycle(context, [this, name] { return models_->Unload(name); });
}

}  // namespace numaserve::server
