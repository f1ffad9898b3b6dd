#include "server/inference_service.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

InferenceService::InferenceService(const Options& options, const ModelRepository* repository,
                                   WorkerSupervisor* workers, Router* router, Metrics* metrics)
    : options_(options),
      repository_(repository),
      workers_(workers),
      router_(router),
      metrics_(metrics) {}

bool InferenceService::Ready() const {
  if (shutting_down_) return false;
  for (int w = 0; w < workers_->size(); ++w) {
    if (workers_->Ready(w)) return true;
  }
  return false;
}

ModelState InferenceService::StateOf(const RepositoryModel& model, std::string* reason) const {
  if (!model.error.empty()) {
    *reason = model.error;
    return ModelState::kUnavailable;
  }
  if (workers_->ModelAvailable(model.key())) return ModelState::kReady;
  std::string error = workers_->LoadError(model.key());
  if (!error.empty()) {
    *reason = error;
    return ModelState::kUnavailable;
  }
  *reason = "no worker has finished loading it";
  return ModelState::kLoading;
}

absl::StatusOr<const RepositoryModel*> InferenceService::Resolve(const std::string& name,
                                                                 const std::string& version) const {
  const RepositoryModel* model = repository_->Find(name);
  if (model == nullptr) {
    return absl::NotFoundError(absl::StrFormat("model '%s' is not in the repository", name));
  }
  if (!version.empty()) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(version, &v) || v != model->version) {
      return absl::NotFoundError(absl::StrFormat("model '%s' has no version '%s' (serving %d)",
                                                 name, version, model->version));
    }
  }
  return model;
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
  if (!model.ok()) return FinishNow(context, ToGrpcStatus(model.status()));
  std::string reason;
  response->set_ready(!shutting_down_ && StateOf(**model, &reason) == ModelState::kReady);
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
  if (!m.error.empty()) {
    return FinishNow(
        context, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("model '", m.name, "' is not available: ", m.error)));
  }
  response->set_name(m.name);
  response->add_versions(absl::StrCat(m.version));
  response->set_platform("onnx");
  for (const auto& t : m.info.inputs) AddTensorMetadata(t, response->add_inputs());
  for (const auto& t : m.info.outputs) AddTensorMetadata(t, response->add_outputs());
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ModelInfer(grpc::CallbackServerContext* context,
                                                       const inference::ModelInferRequest* request,
                                                       inference::ModelInferResponse* response) {
  const auto received = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string model_label = request->model_name();
  auto finish = [this, reactor, received, model_label](const absl::Status& status) {
    if (metrics_) {
      metrics_->RecordRequest(
          model_label, OutcomeName(status.code()),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count());
    }
    reactor->Finish(ToGrpcStatus(status));
  };

  if (shutting_down_) {
    finish(absl::UnavailableError("the server is shutting down"));
    return reactor;
  }
  auto resolved = Resolve(request->model_name(), request->model_version());
  if (!resolved.ok()) {
    finish(resolved.status());
    return reactor;
  }
  const RepositoryModel* model = *resolved;
  std::string reason;
  if (StateOf(*model, &reason) != ModelState::kReady) {
    finish(absl::UnavailableError(
        model->version > 0 ? absl::StrFormat("model '%s' version %d is not ready: %s", model->name,
                                             model->version, reason)
                           : absl::StrFormat("model '%s' is not ready: %s", model->name, reason)));
    return reactor;
  }
  auto parsed = ParseInferRequest(model->info, *request);
  if (!parsed.ok()) {
    finish(parsed.status());
    return reactor;
  }

  auto task = std::make_shared<InferenceTask>();
  task->model_key = model->key();
  task->rows = parsed->rows;
  task->flops = model->info.flops_per_row * static_cast<double>(parsed->rows);
  task->inputs = parsed->inputs;
  task->output_bytes = parsed->output_bytes;
  auto deadline = context->deadline();
  auto now_system = std::chrono::system_clock::now();
  auto timeout =
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.default_timeout);
  if (deadline < now_system + options_.default_timeout) {
    timeout =
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(deadline - now_system);
  }
  task->deadline = received + timeout;
  response->set_model_name(model->name);
  response->set_model_version(absl::StrCat(model->version));
  response->set_id(request->id());
  task->done = [this, model, parsed = *std::move(parsed), response, finish](
                   const absl::Status& status, const std::vector<const char*>& outputs,
                   const TaskTiming& timing) {
    if (status.ok()) {
      FillInferResponse(model->info, parsed, outputs, response);
      if (metrics_) {
        metrics_->RecordInference(model->name, parsed.rows, timing.queue_seconds,
                                  timing.compute_seconds);
      }
    }
    finish(status);
  };
  router_->Submit(std::move(task));
  return reactor;
}

}  // namespace numaserve::server
