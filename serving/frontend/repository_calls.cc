// InferenceService's model configuration and repository calls: ModelConfig
// (FillModelConfig: the config a version runs with, the server's defaults
// applied), RepositoryIndex (FillRepositoryIndex), and RepositoryModelLoad /
// RepositoryModelUnload (LoadModel, UnloadModel), which run one at a time on
// the lifecycle thread (RunLifecycle, LifecycleLoop, StopLifecycle).
#include <algorithm>
#include <deque>
#include <optional>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/mutex.h"
#include "serving/frontend/call_util.h"
#include "serving/frontend/inference_service.h"
#include "serving/repository/model_config.h"
#include "serving/request/datatypes.h"
#include "serving/workers/worker_supervisor.h"

namespace numaserve::serving {

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

absl::Status InferenceService::FillModelConfig(const std::string& name, const std::string& version,
                                               inference::ModelConfigResponse* response) const {
  auto model = Resolve(name, version);
  if (!model.ok()) return model.status();
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
    batching->set_priority_levels(d.priority_levels());
    batching->set_default_priority_level(d.default_priority_level());
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
  return absl::OkStatus();
}

absl::Status InferenceService::FillRepositoryIndex(
    const inference::RepositoryIndexRequest& request,
    inference::RepositoryIndexResponse* response) const {
  if (!request.repository_name().empty()) {
    return absl::NotFoundError("this server has one repository; leave repository_name empty");
  }
  for (const auto& e : models_->Index()) {
    if (request.ready() && e.state != ModelState::kReady) continue;
    auto* m = response->add_models();
    m->set_name(e.name);
    if (e.version > 0) m->set_version(absl::StrCat(e.version));
    m->set_state(ModelStateName(e.state));
    m->set_reason(e.reason);
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* InferenceService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  return FinishNow(context,
                   ToGrpcStatus(FillModelConfig(request->name(), request->version(), response)));
}

grpc::ServerUnaryReactor* InferenceService::RepositoryIndex(
    grpc::CallbackServerContext* context, const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  return FinishNow(context, ToGrpcStatus(FillRepositoryIndex(*request, response)));
}

void InferenceService::RunLifecycle(std::function<absl::Status()> fn,
                                    std::function<void(const absl::Status&)> answer) {
  {
    base::MutexLock lock(&lifecycle_mu_);
    if (!lifecycle_stopping_ && !shutting_down_) {
      lifecycle_jobs_.push_back({std::move(fn), std::move(answer)});
      lifecycle_cv_.Signal();
      return;
    }
  }
  answer(absl::UnavailableError("the server is shutting down"));
}

void InferenceService::LifecycleLoop() {
  while (true) {
    LifecycleJob job{};
    {
      base::MutexLock lock(&lifecycle_mu_);
      while (!lifecycle_stopping_ && lifecycle_jobs_.empty()) lifecycle_cv_.Wait(&lifecycle_mu_);
      if (lifecycle_jobs_.empty()) return;  // stopping, nothing left
      job = std::move(lifecycle_jobs_.front());
      lifecycle_jobs_.pop_front();
    }
    job.answer(job.run());
  }
}

void InferenceService::StopLifecycle() {
  std::deque<LifecycleJob> refused;
  {
    base::MutexLock lock(&lifecycle_mu_);
    lifecycle_stopping_ = true;
    refused.swap(lifecycle_jobs_);
  }
  lifecycle_cv_.SignalAll();
  for (auto& job : refused) job.answer(absl::UnavailableError("the server is shutting down"));
  if (lifecycle_.joinable()) lifecycle_.join();
}

namespace {

// The config override of a load request's parameters (nullopt: none);
// INVALID_ARGUMENT for any other parameter.
absl::StatusOr<std::optional<std::string>> LoadConfigOverride(
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& parameters) {
  std::optional<std::string> config;
  for (const auto& [key, value] : parameters) {
    if (key == "config") {
      if (value.parameter_choice_case() != inference::ModelRepositoryParameter::kStringParam) {
        return absl::InvalidArgumentError(
            "load parameter 'config' must be a string (the model's config as JSON)");
      }
      config = value.string_param();
    } else if (absl::StartsWith(key, "file:")) {
      return absl::InvalidArgumentError(
          "load parameters 'file:...' (model file contents in the request) are not supported; "
          "put the model file in the repository");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown load parameter '",
                                                     absl::CHexEscape(key.substr(0, 64)),
                                                     "' (a load takes only 'config')"));
    }
  }
  return config;
}

}  // namespace

void InferenceService::LoadModel(
    const std::string& name,
    const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& parameters,
    std::function<void(const absl::Status&)> answer) {
  if (models_->mode() != ModelControlMode::kExplicit) {
    return answer(absl::FailedPreconditionError(
        "loading models by request needs --model-control-mode explicit"));
  }
  if (shutting_down_) return answer(absl::UnavailableError("the server is shutting down"));
  auto config = LoadConfigOverride(parameters);
  if (!config.ok()) return answer(config.status());
  RunLifecycle([this, name, config = *std::move(config)] { return models_->Load(name, config); },
               std::move(answer));
}

void InferenceService::UnloadModel(const std::string& name,
                                   std::function<void(const absl::Status&)> answer) {
  if (models_->mode() != ModelControlMode::kExplicit) {
    return answer(absl::FailedPreconditionError(
        "unloading models by request needs --model-control-mode explicit"));
  }
  if (shutting_down_) return answer(absl::UnavailableError("the server is shutting down"));
  RunLifecycle([this, name] { return models_->Unload(name); }, std::move(answer));
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelLoad(
    grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  LoadModel(request->model_name(), request->parameters(),
            [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

grpc::ServerUnaryReactor* InferenceService::RepositoryModelUnload(
    grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  UnloadModel(request->model_name(),
              [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

}  // namespace numaserve::serving
