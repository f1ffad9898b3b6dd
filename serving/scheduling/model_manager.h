// The live set of served model versions and their lifecycle. Requests
// resolve a (name, version) here to a shared handle that stays valid while
// they are in flight. A (re)load reads the model's directory again, loads
// new versions on the workers while the old ones keep serving, then swaps
// the served set in one step; versions no longer wanted are drained and
// unloaded. A served version whose config.pbtxt changed is loaded again with
// the new config under a new key (RepositoryModel::generation) and switched
// to the same way; its previous load drains, then leaves the workers. A
// failed load, or an edited config that does not validate, keeps what was
// serving and records the reason.
// In poll mode a thread re-reads the repository every few seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "base/periodic_task.h"
#include "serving/repository/model_repository.h"
#include "serving/workers/worker_supervisor.h"

namespace numaserve::serving {

class Metrics;
class ModelScheduler;
class WorkerSupervisor;

enum class ModelControlMode {
  kNone,      // load everything at start-up, never change
  kPoll,      // load everything, then follow the repository's changes
  kExplicit,  // load what RepositoryModelLoad asks for
};
absl::StatusOr<ModelControlMode> ParseModelControlMode(const std::string& text);

using ModelHandle = std::shared_ptr<const RepositoryModel>;

// The server's settings for models whose config.pbtxt sets none.
struct ModelDefaults {
  // Instances per worker (`serve --instances`): a count, kInstancesAuto or
  // kInstancesPerCore.
  int instances = 1;
  // The GEMM backend (`serve --gemm`).
  std::string gemm_backend = "auto";
  // The activation bytes one run may need (`serve --max-activation-mb`);
  // 0: no limit.
  int64_t max_activation_bytes = 0;
};

// What the workers load for repository model `m`: its config's choices,
// and the server's defaults where the config sets none (for a BF16 model
// whose config names no GEMM backend, "onednn": its matmuls run on
// oneDNN).
WorkerSupervisor::ModelToLoad ModelToLoadFor(const RepositoryModel& m,
                                             const ModelDefaults& defaults);

class ModelManager {
 public:
  struct Options {
    std::string repository;
    int num_workers = 1;
    ModelControlMode mode = ModelControlMode::kNone;
    // Poll mode: how often the repository is read again (> 0; zero: never).
    std::chrono::milliseconds poll_interval{15000};
    // How long a load may take on the workers before it counts as failed.
    std::chrono::milliseconds load_timeout{std::chrono::minutes(5)};
    // How long unloading waits for queued and running requests.
    std::chrono::milliseconds drain_timeout{std::chrono::seconds(30)};
    // What a model whose config sets none gets (`serve --instances`,
    // `--gemm`, `--max-activation-mb`).
    ModelDefaults defaults;
  };

  // One row of RepositoryIndex.
  struct IndexEntry {
    std::string name;
    int64_t version = 0;  // 0 when the model has no usable version
    ModelState state = ModelState::kUnavailable;
    std::string reason;
  };

  ModelManager(const Options& options, WorkerSupervisor* workers, ModelScheduler* scheduler,
               Metrics* metrics);
  ~ModelManager();

  // Takes the versions the workers loaded at start-up (their state follows
  // the workers) and the names left unloaded (explicit mode), then starts
  // polling in poll mode.
  void Start(const std::vector<RepositoryModel>& initial,
             const std::vector<std::string>& not_loaded) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(load_mu_);

  // What a caller of Resolve needs: a version that a worker holds now
  // (ModelReady, metadata), or one that may take requests: held now or
  // held again soon by a worker restarting with it (inference requests
  // queue for that worker rather than fail; WorkerSupervisor::ModelExpected).
  enum class Need { kReady, kServable };
  // The ready version `version` of `name` (0: the highest ready one).
  // NOT_FOUND for an unknown model or version; UNAVAILABLE with the reason
  // for a known one that is not ready.
  absl::StatusOr<ModelHandle> Resolve(const std::string& name, int64_t version,
                                      Need need = Need::kReady) const ABSL_LOCKS_EXCLUDED(mu_);
  // Versions of `name` that are ready, ascending.
  std::vector<int64_t> ReadyVersions(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<IndexEntry> Index() const ABSL_LOCKS_EXCLUDED(mu_);

  // Reads DIR/name again and serves what its policy selects now.
  // `config_json`, when given, is used instead of config.pbtxt for this load
  // (ReadModelConfigJson; INVALID_ARGUMENT naming the field, and nothing
  // changes, where it does not parse).
  absl::Status Load(const std::string& name,
                    const std::optional<std::string>& config_json = std::nullopt)
      ABSL_LOCKS_EXCLUDED(load_mu_, mu_);
  // Stops serving every version of `name` (drains, then unloads).
  absl::Status Unload(const std::string& name) ABSL_LOCKS_EXCLUDED(load_mu_, mu_);
  ModelControlMode mode() const { return options_.mode; }

 private:
  struct VersionState {
    ModelHandle handle;  // set while loaded (ready or unloading)
    ModelState state = ModelState::kLoading;
    std::string reason;
  };
  struct ModelEntry {
    std::map<int64_t, VersionState> versions;
    std::string error;        // model-level problem (config, no version)
    std::string fingerprint;  // for polling
  };

  void RefreshReady();  // start-up versions: READY once a worker has them
  // One poll: loads the models that are new or changed in the repository,
  // unloads those gone from it.
  void PollOnce() ABSL_LOCKS_EXCLUDED(load_mu_, mu_);
  absl::Status UnloadVersions(const std::string& name, const std::vector<int64_t>& versions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  // Load's phases.
  struct LoadOutcome;  // what loading the scanned versions produced (model_manager.cc)
  // Loads the new and the reconfigured versions in `scanned` while the current ones serve.
  void LoadScannedVersions(const std::string& name, const std::vector<RepositoryModel>& scanned,
                           LoadOutcome* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Serves every loaded version at once; returns the versions to retire.
  std::vector<int64_t> SwitchToLoaded(const std::string& name, const std::string& fingerprint,
                                      const LoadOutcome& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the loaded versions ready in the metrics and logs each one.
  void LogLoaded(const std::vector<ModelHandle>& loaded,
                 std::chrono::steady_clock::time_point started);
  // Drains the previous loads of reloaded versions, then unloads them.
  void DrainReplaced(const std::vector<ModelHandle>& replaced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);

  const Options options_;
  WorkerSupervisor* const workers_;
  ModelScheduler* const scheduler_;
  Metrics* const metrics_;

  base::Mutex load_mu_;                             // one load or unload at a time
  bool stopped_ ABSL_GUARDED_BY(load_mu_) = false;  // Stop() has run
  mutable base::Mutex mu_;
  std::map<std::string, ModelEntry> models_ ABSL_GUARDED_BY(mu_);

  // kPoll: PollOnce every options_.poll_interval, from Start to Stop.
  std::unique_ptr<base::PeriodicTask> poller_;
};

}  // namespace numaserve::serving
