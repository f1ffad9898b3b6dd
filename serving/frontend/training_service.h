// numaserve.training.TrainingService on the server: StartTraining runs
// `numaserve train` (which launches mpirun) as a child process group of the
// server; its progress lines are parsed into TrainingProgress messages that
// WatchTraining streams and ListTrainings lists, and into the
// numaserve_training_* metrics. A job does not depend on the client that
// started it.
//
// Stopping a job (CancelTraining, or the server shutting down): SIGUSR1 to
// its process group; mpirun forwards it to every rank, the ranks stop
// together after the step in flight and rank 0 writes the config's
// checkpoint (`--resume` continues from it). A job still running
// stop_grace later gets SIGTERM (mpirun kills its ranks), and SIGKILL 5 s
// after that. The server's shutdown waits for its jobs to end.
//
// Ended jobs: each StartTraining first joins the threads of the jobs that
// have ended and forgets the oldest ended jobs beyond max_finished_jobs
// (serve --training-max-finished-jobs, 64 by default), with their metric
// series; a forgotten job is NOT_FOUND. A thread that cannot be started
// (for a job's output, or to stop it) is RESOURCE_EXHAUSTED saying so.
//
// Who may do what (see serve --training-service): the service is only
// registered when asked for, every path a job's config names must resolve
// inside the training root (TrainingServiceOptions::root), a job writes
// only in its caller's own directory there, ranks, running jobs and config
// size are capped, and each job belongs to its caller.
//
//   * Paths (training_paths.h): a path with a '..' component, an absolute
//     path outside the root, an input whose real path (symbolic links
//     followed) leaves the root, an output whose directory's real path
//     leaves the root or whose file is a symbolic link: INVALID_ARGUMENT
//     naming the config field. The job runs with the resolved real paths,
//     and writes its outputs through fresh temporary files (O_EXCL |
//     O_NOFOLLOW) renamed into place.
//   * Callers' directories (training_paths.h): each caller has its own,
//     <root>/callers/<id>, made at its first job and returned by every
//     StartTraining (output_directory). Outputs (checkpoint, final weights,
//     timeline) go there only, relative ones taken from it, so `resume`
//     reads the caller's own checkpoint; inputs and the export repository
//     are taken from the root and may be shared, but not in another
//     caller's directory. An export goes only into a model directory that
//     the caller's exports made (`train --export-owner`). Otherwise
//     PERMISSION_DENIED naming the field. Without authentication every
//     caller is the same one, "anonymous".
//   * Owners: a job belongs to the identity its StartTraining came with
//     (TrainingServiceOptions::caller: a bearer token's name or a client
//     certificate's subject). Watch and Cancel of another caller's job are
//     NOT_FOUND, as for an unknown id, and ListTrainings lists the caller's
//     jobs only. Without authentication every caller is anonymous: a job id
//     carries 128 random bits and is the only way to reach the job (whoever
//     holds it may watch and cancel), and ListTrainings is PERMISSION_DENIED.
//     Metrics and the server's log name a job by its public prefix
//     ("train-3" of "train-3-<32 hex digits>"), never its whole id.
//   * Files: each job's config is written into a private directory (mkdtemp,
//     0700) under work_dir, removed when the job ends.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "serving/frontend/training_paths.h"
#include "serving/workers/process_options.h"
#include "training.grpc.pb.h"

namespace numaserve::serving {

class Metrics;

struct TrainingServiceOptions {
  // The numaserve executable to run `train` with; empty = this process's own.
  std::string binary;
  // Every model, dataset, checkpoint, final_weights, timeline and export
  // path of a job must be inside this directory, its outputs in the
  // caller's own directory <root>/callers/<id> (made here, 0700). Required.
  std::string root;
  // Most ranks one job may run ("auto" is capped to it too). Bounds the
  // processes a caller can start: the machine's NUMA domains by default.
  int max_ranks = 1;
  // Most jobs running at once; StartTraining beyond is RESOURCE_EXHAUSTED.
  int max_jobs = 1;
  // Most ended jobs kept for WatchTraining and ListTrainings (and their
  // metric series); beyond, the oldest ended job is forgotten (NOT_FOUND).
  size_t max_finished_jobs = 64;
  // Largest config_text accepted.
  size_t max_config_bytes = size_t{1} << 20;
  // Where each job's private directory is made; empty = $TMPDIR or /tmp.
  std::string work_dir;
  // The caller of a call: "" = anonymous. Null: every caller is anonymous.
  std::function<std::string(const grpc::ServerContextBase&)> caller;
  // Callers are authenticated: an empty caller is then refused
  // (UNAUTHENTICATED) rather than treated as anonymous.
  bool authenticated = false;
  // Where job figures are exported; may be null.
  Metrics* metrics = nullptr;
  // How long a stopped job may take to write its checkpoint and exit.
  std::chrono::milliseconds stop_grace{20000};
  // The server's process settings (serving/workers/process_options.h),
  // handed to every job as flags (the kernel and training ones), which
  // `numaserve train` hands on to its ranks; a job's environment has none of
  // their NUMASERVE_* variables.
  ProcessOptions process;
  // The cpus a job may run on, set in the job's process before exec; empty:
  // those of the thread starting it. The server pinned to its front-end
  // cpus (serve --frontend-cpus) gives the cpus it may use, so that a job's
  // ranks plan over the machine, not over the front end's cores.
  std::vector<int> job_cpus;
};

class TrainingJob;

class TrainingService final : public training::TrainingService::CallbackService {
 public:
  // Checks the options (the root must be a directory; the caps positive).
  static absl::StatusOr<std::unique_ptr<TrainingService>> Create(TrainingServiceOptions options);
  // Stops every running job (see above) and waits for them to end.
  ~TrainingService() override;

  // Starts stopping every running job and returns; for the server's
  // shutdown, which then goes on draining inference while they stop.
  void StopAll() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerUnaryReactor* StartTraining(grpc::CallbackServerContext* context,
                                          const training::StartTrainingRequest* request,
                                          training::StartTrainingResponse* response) override;
  grpc::ServerWriteReactor<training::TrainingProgress>* WatchTraining(
      grpc::CallbackServerContext* context, const training::WatchTrainingRequest* request) override;
  grpc::ServerUnaryReactor* CancelTraining(grpc::CallbackServerContext* context,
                                           const training::CancelTrainingRequest* request,
                                           training::CancelTrainingResponse* response) override;
  grpc::ServerUnaryReactor* ListTrainings(grpc::CallbackServerContext* context,
                                          const training::ListTrainingsRequest* request,
                                          training::ListTrainingsResponse* response) override;

 private:
  explicit TrainingService(TrainingServiceOptions options);
  // The caller's job `id`, or null (also when another caller owns it).
  std::shared_ptr<TrainingJob> Find(const std::string& id, const std::string& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The caller, or UNAUTHENTICATED when authenticated callers are expected.
  absl::StatusOr<std::string> Caller(const grpc::ServerContextBase& context) const;
  // The caller's scope (training_paths.h), its directory made at its first
  // job (logged, with the caller); INTERNAL when it cannot be.
  absl::StatusOr<training_paths::CallerScope> Scope(const std::string& caller) const;
  absl::StatusOr<int> Ranks(const std::string& requested) const;
  // Joins the threads of the jobs that have ended, and forgets the oldest
  // ended jobs beyond options_.max_finished_jobs (their metric series
  // too). Made before each start: only starts add jobs.
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  TrainingServiceOptions options_;
  base::Mutex mu_;
  std::vector<std::shared_ptr<TrainingJob>> jobs_ ABSL_GUARDED_BY(mu_);
  int starting_ ABSL_GUARDED_BY(mu_) = 0;  // jobs between the concurrency check and jobs_
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace numaserve::serving
