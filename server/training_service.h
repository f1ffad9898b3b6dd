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
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "training.grpc.pb.h"

namespace numaserve::server {

class Metrics;

struct TrainingServiceOptions {
  // The numaserve executable to run `train` with; empty = this process's own.
  std::string binary;
  // Where job configs are written; empty = $TMPDIR/numaserve-training-<pid>.
  // Relative paths inside a config are relative to the server's directory.
  std::string work_dir;
  // Where job figures are exported; may be null.
  Metrics* metrics = nullptr;
  // How long a stopped job may take to write its checkpoint and exit.
  std::chrono::milliseconds stop_grace{20000};
};

class TrainingJob;

class TrainingService final : public training::TrainingService::CallbackService {
 public:
  explicit TrainingService(TrainingServiceOptions options);
  // Stops every running job (see above) and waits for them to end.
  ~TrainingService() override;

  // Starts stopping every running job and returns; for the server's
  // shutdown, which then goes on draining inference while they stop.
  void StopAll();

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
  std::shared_ptr<TrainingJob> Find(const std::string& id);

  TrainingServiceOptions options_;
  std::mutex mu_;
  std::vector<std::shared_ptr<TrainingJob>> jobs_;
  int next_id_ = 1;
};

}  // namespace numaserve::server
