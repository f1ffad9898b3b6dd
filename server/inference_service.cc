#include "server/inference_service.h"

#include <cctype>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/infer_request.h"
#include "server/metrics.h"
#include "server/worker_supervisor.h"

namespace numaserve::server {
namespace {

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
      statistics_(options.statistics) {}

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
    if (in_flight_.load() == 0 && now - last_call >= quiet) return true;
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

absl::StatusOr<ModelHandle> InferenceService::Resolve(const std::string& name,
                                                      const std::string& version) const {
  int64_t v = 0;
  if (!version.empty() && (!absl::SimpleAtoi(version, &v) || v <= 0)) {
    return absl::NotFoundError(absl::StrFormat(
        "model '%s' has no version '%s' (versions are positive integers)", name, version));
  }
  return models_->Resolve(name, v);
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
  response->set_version(NUMASERVE_VERSION);
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
  response->set_platform("onnx");
  for (const auto& t : m.info.inputs) AddTensorMetadata(t, response->add_inputs());
  for (const auto& t : m.info.outputs) AddTensorMetadata(t, response->add_outputs());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* request,
                                                       inference::ModelInferResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  StartInference(context, request, response,
                 [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

void InferenceService::StartInference(grpc::CallbackServerContext* context,
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
  };
  auto call = std::make_shared<Call>();
  call->model = request->model_name();
  auto finish = [this, call, received, answer = std::move(answer)](const absl::Status& status) {
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count();
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
    answer(status);
    in_flight_.fetch_sub(1);
  };

  if (shutting_down_) return finish(absl::UnavailableError("the server is shutting down"));
  auto resolved = Resolve(request->model_name(), request->model_version());
  if (!resolved.ok()) return finish(resolved.status());
  ModelHandle model = *std::move(resolved);
  call->version = model->version;
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

  auto pending = std::make_shared<PendingInference>();
  pending->model = model;
  pending->rows = parsed->rows;
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
  pending->is_cancelled = [context] { return context->IsCancelled(); };
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
  absl::Status submitted = scheduler_->Submit(pending);
  if (submitted.code() == absl::StatusCode::kUnavailable && request->model_version().empty()) {
    // The version this request resolved to was switched out meanwhile: the
    // newly served version takes it (same inputs, as the model name promises).
    auto again = Resolve(request->model_name(), "");
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
  if (!submitted.ok()) finish(submitted);
}

namespace {

// One ModelStreamInfer call: every request read starts an inference; the
// answers are written back one at a time as they complete. The call ends
// when the client has finished writing and every answer has been written.
class InferStream final : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                                         inference::ModelStreamInferResponse> {
 public:
  using StartFn =
      std::function<void(const inference::ModelInferRequest*, inference::ModelInferResponse*,
                         std::function<void(const absl::Status&)>)>;
  explicit InferStream(StartFn start) : start_(std::move(start)) { ReadNext(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu_);
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    std::shared_ptr<Item> item = std::move(reading_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++outstanding_;
    }
    start_(&item->request, item->reply.mutable_infer_response(),
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
    ReadNext();
  }

  void OnWriteDone(bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.pop_front();
    --outstanding_;
    if (!writes_.empty()) {
      StartWrite(&writes_.front()->reply);
      return;
    }
    writing_ = false;
    MaybeFinishLocked();
  }

  void OnDone() override { delete this; }

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
    if (reads_done_ && outstanding_ == 0 && !writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  const StartFn start_;
  std::shared_ptr<Item> reading_;  // only touched by the read chain
  std::mutex mu_;
  std::deque<std::shared_ptr<Item>> writes_;  // front: being written
  int64_t outstanding_ = 0;                   // read, not yet written
  bool writing_ = false;
  bool reads_done_ = false;
  bool finished_ = false;
};

// The config completed with the model's tensors where it lists none.
config::ModelConfig CompletedConfig(const RepositoryModel& m) {
  config::ModelConfig c = m.config;
  c.set_name(m.name);
  const bool batched = c.max_batch_size() > 0;
  auto add = [&](const engine::TensorInfo& t, config::ModelTensor* out) {
    out->set_name(t.name);
    out->set_data_type(engine::DataTypeName(t.type));
    for (size_t d = batched ? 1 : 0; d < t.shape.size(); ++d) out->add_dims(t.shape[d]);
  };
  if (c.input_size() == 0) {
    for (const auto& t : m.info.inputs) add(t, c.add_input());
  }
  if (c.output_size() == 0) {
    for (const auto& t : m.info.outputs) add(t, c.add_output());
  }
  if (c.gemm_backend().empty()) c.set_gemm_backend("auto");
  return c;
}

}  // namespace

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
InferenceService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return new InferStream([this, context](const inference::ModelInferRequest* request,
                                         inference::ModelInferResponse* response,
                                         std::function<void(const absl::Status&)> answer) {
    StartInference(context, request, response, std::move(answer));
  });
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

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  auto model = Resolve(request->name(), request->version());
  if (!model.ok()) return FinishNow(context, ToGrpcStatus(model.status()));
  *response->mutable_config() = CompletedConfig(**model);
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

namespace {

// Runs a (slow) load or unload off the gRPC threads and finishes the call.
template <typename Fn>
grpc::ServerUnaryReactor* RunDetached(grpc::CallbackServerContext* context, Fn fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::thread([reactor, fn = std::move(fn)]() mutable {
    reactor->Finish(ToGrpcStatus(fn()));
  }).detach();
  return reactor;
}

}  // namespace

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
  std::string name = request->model_name();
  return RunDetached(context, [this, name] { return models_->Load(name); });
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  if (models_->mode() != ModelControlMode::kExplicit) {
    return FinishNow(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "unloading models by request needs "
                                           "--model-control-mode explicit"));
  }
  std::string name = request->model_name();
  return RunDetached(context, [this, name] { return models_->Unload(name); });
}

}  // namespace numaserve::server
