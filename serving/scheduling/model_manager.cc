#include "serving/scheduling/model_manager.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/mutex.h"
#include "engine/model.h"
#include "google/protobuf/util/message_differencer.h"
#include "serving/observability/metrics.h"
#include "serving/repository/model_warmup.h"
#include "serving/scheduling/model_scheduler.h"
#include "serving/workers/worker_supervisor.h"

namespace numaserve::serving {

using base::Log;
using base::LogLevel;

namespace {

// The reason a served version keeps its previous config.
constexpr char kNotApplied[] =
    "config.pbtxt change not applied; the served versions keep their previous config: ";

// True when `serving` already serves what `scanned` describes: same file,
// same config, same workers.
bool ServesAs(const RepositoryModel& serving, const RepositoryModel& scanned) {
  return serving.path == scanned.path && serving.workers == scanned.workers &&
         google::protobuf::util::MessageDifferencer::Equals(serving.config, scanned.config);
}

// A scan result that is about the model as a whole (bad config, no version).
bool IsModelLevelError(const std::vector<RepositoryModel>& scanned) {
  return scanned.size() == 1 && !scanned[0].error.empty() && scanned[0].path.empty();
}

}  // namespace

WorkerSupervisor::ModelToLoad ModelToLoadFor(const RepositoryModel& m,
                                             const ModelDefaults& defaults) {
  const int configured = m.config.instance_placement().instances_per_domain();
  const bool bf16 = m.config.precision() == engine::PrecisionName(engine::Precision::kBf16);
  std::string gemm = m.config.gemm_backend();
  if (gemm.empty()) gemm = bf16 ? "onednn" : defaults.gemm_backend;  // BF16 runs on oneDNN
  WorkerSupervisor::ModelToLoad load;
  load.key = m.key();
  load.name = m.name;
  load.version = absl::StrCat(m.version);
  load.path = m.path;
  load.workers = m.workers;
  load.gemm_backend = gemm;
  load.instances = configured != 0 ? configured : defaults.instances;
  load.precision = m.config.precision();
  // ValidateModelConfigFields keeps it within kMaxActivationBytes.
  load.max_activation_bytes = m.config.max_activation_bytes() > 0
                                  ? static_cast<int64_t>(m.config.max_activation_bytes())
                                  : defaults.max_activation_bytes;
  // ValidateModelConfig checked every warm-up against the model.
  for (int i = 0; i < m.config.model_warmup_size(); ++i) {
    auto shapes = WarmupInputShapes(m.config, i, m.name, m.info);
    if (!shapes.ok()) continue;
    const config::ModelWarmup& w = m.config.model_warmup(i);
    worker::Warmup& out = load.warmups.emplace_back();
    out.set_name(w.name());
    for (const auto& shape : *shapes) {
      out.add_input_shapes()->mutable_dims()->Add(shape.begin(), shape.end());
    }
    for (const engine::TensorInfo& t : m.info.inputs) {
      auto given = w.inputs().find(t.name);
      out.add_random_data(given != w.inputs().end() && given->second.random_data());
    }
    out.set_count(std::max<uint32_t>(1, w.count()));
  }
  return load;
}

absl::StatusOr<ModelControlMode> ParseModelControlMode(const std::string& text) {
  if (text == "none") return ModelControlMode::kNone;
  if (text == "poll") return ModelControlMode::kPoll;
  if (text == "explicit") return ModelControlMode::kExplicit;
  return absl::InvalidArgumentError(
      absl::StrCat("--model-control-mode '", text, "': expected none, poll or explicit"));
}

ModelManager::ModelManager(const Options& options, WorkerSupervisor* workers,
                           ModelScheduler* scheduler, Metrics* metrics)
    : options_(options), workers_(workers), scheduler_(scheduler), metrics_(metrics) {}

ModelManager::~ModelManager() { Stop(); }

void ModelManager::Start(const std::vector<RepositoryModel>& initial,
                         const std::vector<std::string>& not_loaded) {
  {
    base::MutexLock lock(&mu_);
    for (const auto& name : not_loaded) {
      models_[name].error = "not loaded (use RepositoryModelLoad)";
    }
    for (const auto& m : initial) {
      ModelEntry& entry = models_[m.name];
      entry.fingerprint = ModelRepository::Fingerprint(options_.repository, m.name);
      if (m.path.empty()) {
        entry.error = m.error;
        continue;
      }
      VersionState& v = entry.versions[m.version];
      if (!m.error.empty()) {
        v.state = ModelState::kUnavailable;
        v.reason = m.error;
        continue;
      }
      v.handle = std::make_shared<const RepositoryModel>(m);
      v.state = ModelState::kReady;
    }
  }
  for (const auto& m : initial) {
    if (!m.error.empty() || m.path.empty()) continue;
    ModelHandle handle;
    {
      base::MutexLock lock(&mu_);
      handle = models_[m.name].versions[m.version].handle;
    }
    if (absl::Status s = scheduler_->AddModel(handle); !s.ok()) {
      base::MutexLock lock(&mu_);
      VersionState& v = models_[m.name].versions[m.version];
      v.state = ModelState::kUnavailable;
      v.reason = std::string(s.message());
      v.handle = nullptr;
    }
  }
  if (options_.mode == ModelControlMode::kPoll) {
    poller_ = std::make_unique<base::PeriodicTask>(
        options_.poll_interval, [this] { PollOnce(); }, base::PeriodicTask::FirstRun::kAfterPeriod);
  }
}

void ModelManager::Stop() {
  if (poller_ != nullptr) poller_->Stop();
  // Waits for a load or unload under way; later ones are refused.
  base::MutexLock load_lock(&load_mu_);
  stopped_ = true;
}

absl::StatusOr<ModelHandle> ModelManager::Resolve(const std::string& name, int64_t version,
                                                  Need need) const {
  base::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrFormat("model '%s' is not in the repository", name));
  }
  const ModelEntry& entry = it->second;
  auto not_ready = [&](int64_t v, const VersionState& s) {
    std::string reason = s.reason;
    if (s.state == ModelState::kUnloading) reason = "it is being unloaded";
    if (reason.empty()) {
      reason =
          workers_->LoadError(s.handle != nullptr ? s.handle->key() : absl::StrCat(name, ":", v));
      if (reason.empty()) reason = "no worker has finished loading it";
    }
    return absl::UnavailableError(
        absl::StrFormat("model '%s' version %d is not ready: %s", name, v, reason));
  };
  auto ready = [&](int64_t v, const VersionState& s) {
    return s.handle != nullptr && s.state == ModelState::kReady &&
           (workers_->ModelAvailable(s.handle->key()) ||
            (need == Need::kServable && workers_->ModelExpected(s.handle->key())));
  };
  if (version == 0) {
    for (auto v = entry.versions.rbegin(); v != entry.versions.rend(); ++v) {
      if (ready(v->first, v->second)) return v->second.handle;
    }
    if (!entry.error.empty()) {
      return absl::UnavailableError(
          absl::StrCat("model '", name, "' is not available: ", entry.error));
    }
    if (entry.versions.empty()) {
      return absl::UnavailableError(absl::StrCat("model '", name, "' has no loaded version"));
    }
    return not_ready(entry.versions.rbegin()->first, entry.versions.rbegin()->second);
  }
  auto v = entry.versions.find(version);
  if (v == entry.versions.end() ||
      (v->second.handle == nullptr && v->second.state == ModelState::kUnavailable &&
       v->second.reason == "unloaded")) {
    std::vector<int64_t> served;
    for (const auto& [n, s] : entry.versions) {
      if (s.handle != nullptr) served.push_back(n);
    }
    return absl::NotFoundError(
        absl::StrFormat("model '%s' has no version '%d' (serving %s)", name, version,
                        served.empty() ? "none" : absl::StrJoin(served, ", ")));
  }
  if (ready(v->first, v->second)) return v->second.handle;
  return not_ready(v->first, v->second);
}

std::vector<int64_t> ModelManager::ReadyVersions(const std::string& name) const {
  base::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  auto it = models_.find(name);
  if (it == models_.end()) return out;
  for (const auto& [v, s] : it->second.versions) {
    if (s.handle != nullptr && s.state == ModelState::kReady) out.push_back(v);
  }
  return out;
}

std::vector<ModelManager::IndexEntry> ModelManager::Index() const {
  base::MutexLock lock(&mu_);
  std::vector<IndexEntry> out;
  for (const auto& [name, entry] : models_) {
    if (entry.versions.empty()) {
      out.push_back({name, 0, ModelState::kUnavailable, entry.error});
      continue;
    }
    for (const auto& [v, s] : entry.versions) {
      IndexEntry e{name, v, s.state, s.reason};
      if (s.state == ModelState::kReady && s.handle != nullptr &&
          !workers_->ModelAvailable(s.handle->key())) {
        e.state = ModelState::kLoading;
        std::string error = workers_->LoadError(s.handle->key());
        e.reason = error.empty() ? "no worker has finished loading it" : error;
        if (!error.empty()) e.state = ModelState::kUnavailable;
      }
      if (e.reason.empty() && !entry.error.empty()) e.reason = entry.error;
      out.push_back(std::move(e));
    }
  }
  return out;
}

// What loading a model's scanned versions produced, for the switch.
struct ModelManager::LoadOutcome {
  std::vector<ModelHandle> loaded;
  std::vector<ModelHandle> replaced;  // the previous loads of reloaded versions
  std::string first_error;
  std::set<int64_t> wanted;
};

absl::Status ModelManager::Load(const std::string& name,
                                const std::optional<std::string>& config_json) {
  base::MutexLock load_lock(&load_mu_);
  if (stopped_) return absl::UnavailableError("the server is shutting down");
  // A name with a NUL, a control character, a separator or ".." never
  // becomes a path (a NUL would cut "good\0x" to "good" for the kernel).
  if (absl::Status s = CheckModelName(name); !s.ok()) return s;
  {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::path(options_.repository) / name;
    if (!std::filesystem::is_directory(dir, ec)) {
      base::MutexLock lock(&mu_);
      if (models_.count(name) == 0) {
        return absl::NotFoundError(
            absl::StrCat("model '", name, "' is not in the repository ", options_.repository));
      }
    }
  }
  std::optional<ModelConfigFile> config_override;
  if (config_json.has_value()) {
    auto parsed =
        ReadModelConfigJson(*config_json, "the load request's config", options_.num_workers);
    if (!parsed.ok()) return parsed.status();
    config_override = *std::move(parsed);
  }
  const auto started = std::chrono::steady_clock::now();
  std::vector<RepositoryModel> scanned =
      ModelRepository::ScanModel(options_.repository, name, options_.num_workers,
                                 config_override.has_value() ? &*config_override : nullptr);
  const std::string fingerprint = ModelRepository::Fingerprint(options_.repository, name);
  if (IsModelLevelError(scanned)) {
    base::MutexLock lock(&mu_);
    ModelEntry& entry = models_[name];
    bool serving = false;
    for (const auto& [n, v] : entry.versions) serving |= v.handle != nullptr;
    // Whatever was serving keeps serving; the index shows why it did not change.
    entry.error = serving ? absl::StrCat(kNotApplied, scanned[0].error) : scanned[0].error;
    entry.fingerprint = fingerprint;
    return absl::InvalidArgumentError(scanned[0].error);
  }
  LoadOutcome outcome;
  LoadScannedVersions(name, scanned, &outcome);
  const std::vector<int64_t> retired = SwitchToLoaded(name, fingerprint, outcome);
  LogLoaded(outcome.loaded, started);
  DrainReplaced(outcome.replaced);
  if (!retired.empty()) {
    // The new versions already serve; a retired one that fails to unload is
    // logged, not a failure of this load.
    if (absl::Status s = UnloadVersions(name, retired); !s.ok()) {
      Log(LogLevel::kWarning, "models",
          absl::StrCat("model ", name, ": retiring old versions: ", s.message()),
          {{"model", name}, {"error", s.message()}});
    }
  }
  if (!outcome.first_error.empty()) {
    Log(LogLevel::kError, "models", absl::StrCat("model ", name, ": ", outcome.first_error),
        {{"model", name}, {"error", outcome.first_error}});
    return absl::InvalidArgumentError(outcome.first_error);
  }
  return absl::OkStatus();
}

// Load the new versions, and new loads of served versions whose config
// changed, while the current ones serve.
void ModelManager::LoadScannedVersions(const std::string& name,
                                       const std::vector<RepositoryModel>& scanned,
                                       LoadOutcome* out) {
  for (const auto& m : scanned) {
    out->wanted.insert(m.version);
    ModelHandle serving;
    {
      base::MutexLock lock(&mu_);
      ModelEntry& entry = models_[name];
      VersionState& v = entry.versions[m.version];
      if (v.handle != nullptr && v.state == ModelState::kReady) serving = v.handle;
      if (serving != nullptr && ServesAs(*serving, m)) {
        // Unchanged. The model file of a served version is taken as
        // immutable (changes are published as new versions); its config is
        // not. A reason left by an earlier rejected edit is obsolete now.
        v.reason.clear();
        continue;
      }
      if (!m.error.empty()) {
        const std::string reason =
            serving != nullptr ? absl::StrCat(kNotApplied, m.error) : m.error;
        if (out->first_error.empty()) out->first_error = reason;
        if (serving == nullptr) v.state = ModelState::kUnavailable;
        v.reason = reason;
        continue;
      }
      if (serving == nullptr) v.state = ModelState::kLoading;
    }
    RepositoryModel next = m;
    if (serving != nullptr) next.generation = serving->generation + 1;
    auto handle = std::make_shared<const RepositoryModel>(std::move(next));
    absl::Status s =
        workers_->LoadModel(ModelToLoadFor(*handle, options_.defaults), options_.load_timeout);
    if (s.ok()) s = scheduler_->AddModel(handle);
    if (!s.ok()) {
      workers_->UnloadModel(handle->key());
      const std::string reason = absl::StrCat(serving != nullptr ? kNotApplied : "", "version ",
                                              m.version, ": ", s.message());
      if (out->first_error.empty()) out->first_error = reason;
      base::MutexLock lock(&mu_);
      VersionState& v = models_[name].versions[m.version];
      if (v.handle == nullptr) v.state = ModelState::kUnavailable;
      v.reason = reason;
      continue;
    }
    if (serving != nullptr) out->replaced.push_back(serving);
    out->loaded.push_back(std::move(handle));
  }
}

// Switch: every loaded version becomes ready at once; requests resolved
// from now on go to the new loads.
std::vector<int64_t> ModelManager::SwitchToLoaded(const std::string& name,
                                                  const std::string& fingerprint,
                                                  const LoadOutcome& outcome) {
  std::vector<int64_t> retired;
  base::MutexLock lock(&mu_);
  ModelEntry& entry = models_[name];
  for (const auto& h : outcome.loaded) {
    VersionState& v = entry.versions[h->version];
    v.handle = h;
    v.state = ModelState::kReady;
    v.reason.clear();
  }
  entry.error.clear();
  entry.fingerprint = fingerprint;
  // Versions the policy no longer selects leave only if something serves.
  bool any_ready = false;
  for (const auto& [n, s] : entry.versions) {
    any_ready |=
        outcome.wanted.count(n) > 0 && s.handle != nullptr && s.state == ModelState::kReady;
  }
  for (const auto& [n, s] : entry.versions) {
    if (outcome.wanted.count(n) == 0 && s.handle != nullptr && any_ready) retired.push_back(n);
  }
  return retired;
}

// Marks each newly loaded version ready in the metrics and logs it, with the
// time since the load began at `started`.
void ModelManager::LogLoaded(const std::vector<ModelHandle>& loaded,
                             std::chrono::steady_clock::time_point started) {
  for (const auto& h : loaded) {
    if (metrics_) metrics_->SetModelReady(h->name, absl::StrCat(h->version), true);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    Log(LogLevel::kInfo, "models",
        absl::StrFormat("model %s version %d %s (%.2f s)", h->name, h->version,
                        h->generation > 0 ? "reloaded with its edited config.pbtxt" : "loaded",
                        seconds),
        {{"model", h->name},
         {"version", h->version},
         {"generation", h->generation},
         {"path", h->path},
         {"seconds", seconds}});
  }
}

// The previous loads of reloaded versions: what they queued or run
// finishes on them, then the workers free them.
void ModelManager::DrainReplaced(const std::vector<ModelHandle>& replaced) {
  for (const auto& h : replaced) {
    if (!scheduler_->RemoveModel(h->key(), options_.drain_timeout)) {
      Log(LogLevel::kWarning, "models",
          absl::StrFormat("model %s version %d: requests still queued on the previous config "
                          "after the drain timeout were answered UNAVAILABLE",
                          h->name, h->version),
          {{"model", h->name}, {"version", h->version}});
    }
    workers_->UnloadModel(h->key());
  }
}

absl::Status ModelManager::UnloadVersions(const std::string& name,
                                          const std::vector<int64_t>& versions) {
  std::vector<ModelHandle> handles;
  {
    base::MutexLock lock(&mu_);
    ModelEntry& entry = models_[name];
    for (int64_t n : versions) {
      VersionState& v = entry.versions[n];
      if (v.handle == nullptr) continue;
      v.state = ModelState::kUnloading;
      handles.push_back(v.handle);
    }
  }
  bool drained = true;
  for (const auto& h : handles) {
    drained &= scheduler_->RemoveModel(h->key(), options_.drain_timeout);
    workers_->UnloadModel(h->key());
    if (metrics_) metrics_->SetModelReady(h->name, absl::StrCat(h->version), false);
    base::MutexLock lock(&mu_);
    VersionState& v = models_[name].versions[h->version];
    v.handle = nullptr;
    v.state = ModelState::kUnavailable;
    v.reason = "unloaded";
    Log(LogLevel::kInfo, "models",
        absl::StrFormat("model %s version %d unloaded", name, h->version),
        {{"model", name}, {"version", h->version}});
  }
  if (!drained) {
    return absl::DeadlineExceededError(
        absl::StrCat("model '", name, "': requests still queued after the drain timeout"));
  }
  return absl::OkStatus();
}

absl::Status ModelManager::Unload(const std::string& name) {
  base::MutexLock load_lock(&load_mu_);
  if (stopped_) return absl::UnavailableError("the server is shutting down");
  std::vector<int64_t> versions;
  {
    base::MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model '", name, "' is not in the repository"));
    }
    for (const auto& [n, s] : it->second.versions) {
      if (s.handle != nullptr) versions.push_back(n);
    }
  }
  return UnloadVersions(name, versions);
}

void ModelManager::PollOnce() {
  const std::vector<std::string> names = ModelRepository::ListModels(options_.repository);
  std::vector<std::string> changed, gone;
  {
    base::MutexLock l(&mu_);
    for (const auto& name : names) {
      auto it = models_.find(name);
      if (it == models_.end() ||
          it->second.fingerprint != ModelRepository::Fingerprint(options_.repository, name)) {
        changed.push_back(name);
      }
    }
    for (const auto& [name, entry] : models_) {
      if (!std::binary_search(names.begin(), names.end(), name)) gone.push_back(name);
    }
  }
  for (const auto& name : changed) Load(name).IgnoreError();
  for (const auto& name : gone) {
    Unload(name).IgnoreError();
    base::MutexLock l(&mu_);
    models_.erase(name);
  }
}

}  // namespace numaserve::serving
