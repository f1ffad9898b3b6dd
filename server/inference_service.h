// inference.GRPCInferenceService (KServe v2 / Open Inference Protocol) on
// gRPC's callback API, plus Triton's streaming, statistics, config and
// repository extensions: handlers validate, queue the request on its model
// version's batcher and return; the reactor is finished from the completion
// path.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "grpc_service.grpc.pb.h"
#include "server/model_manager.h"
#include "server/model_scheduler.h"
#include "server/model_statistics.h"

namespace numaserve::server {

class Metrics;
class WorkerSupervisor;

class InferenceService final : public inference::GRPCInferenceService::CallbackService {
 public:
  struct Options {
    // Deadline for a request whose client set none: it waits at most this
    // long for a worker, and is answered DEADLINE_EXCEEDED after.
    std::chrono::milliseconds default_timeout{60000};
    // The gRPC message limit: a request whose declared input or output
    // tensors would exceed it is refused before anything is allocated.
    size_t max_message_bytes = size_t{64} << 20;
    // Where per-version counters for ModelStatistics go (not owned; may be null).
    server::ModelStatistics* statistics = nullptr;
  };

  InferenceService(const Options& options, ModelManager* models, WorkerSupervisor* workers,
                   ModelScheduler* scheduler, Metrics* metrics);

  // Readiness turns false; new inferences get UNAVAILABLE.
  void SetShuttingDown() { shutting_down_ = true; }
  // Waits until every accepted ModelInfer call has been answered and no new
  // call has come for `quiet` (late callers get UNAVAILABLE rather than a
  // cancelled call once gRPC stops), or until `deadline`; true if idle.
  bool WaitUntilIdle(std::chrono::steady_clock::time_point deadline,
                     std::chrono::milliseconds quiet) const;
  bool Ready() const;

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest* request,
                                        inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest* request,
                                           inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override;
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context, const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context, const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;

 private:
  // NOT_FOUND for an unknown model or version; the model otherwise.
  absl::StatusOr<ModelHandle> Resolve(const std::string& name, const std::string& version) const;
  // Validates `request` and queues it; `answer` runs exactly once, after
  // `response` is filled (on success). `request` and `response` must live
  // until then. Used by ModelInfer and ModelStreamInfer.
  void StartInference(grpc::CallbackServerContext* context,
                      const inference::ModelInferRequest* request,
                      inference::ModelInferResponse* response,
                      std::function<void(const absl::Status&)> answer);

  const Options options_;
  ModelManager* const models_;
  WorkerSupervisor* const workers_;
  ModelScheduler* const scheduler_;
  Metrics* const metrics_;
  server::ModelStatistics* const statistics_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> in_flight_{0};     // ModelInfer calls not yet finished
  std::atomic<int64_t> last_call_ns_{0};  // steady clock, when the last ModelInfer arrived
};

// One mapping from absl::Status to grpc::Status, used at the edge only.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace numaserve::server
