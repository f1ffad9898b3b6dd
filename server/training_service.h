// numaserve.training.TrainingService on the server: StartTraining runs
// `numaserve train` (which launches mpirun) as a child process group of the
// server; its progress lines are parsed into TrainingProgress messages that
// WatchTraining streams and ListTrainings lists. A job does not depend on
// the client that started it; CancelTraining sends SIGTERM to its process
// group. Jobs still running when the server shuts down are cancelled.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "training.grpc.pb.h"

namespace numaserve::server {

struct TrainingServiceOptions {
  // The numaserve executable to run `train` with; empty = this process's own.
  std::string binary;
  // Where job configs are written; empty = $TMPDIR/numaserve-training-<pid>.
  // Relative paths inside a config are relative to the server's directory.
  std::string work_dir;
};

class TrainingJob;

class TrainingService final : public training::TrainingService::CallbackService {
 public:
  explicit TrainingService(TrainingServiceOptions options);
  ~TrainingService() override;

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
