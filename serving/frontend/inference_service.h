// inference.GRPCInferenceService (KServe v2 / Open Inference Protocol) on
// gRPC's callback API, plus Triton's streaming, statistics, config and
// repository extensions: handlers validate, queue the request on its model
// version's batcher and return; the reactor is finished from the completion
// path. The calls are implemented in inference_service.cc (health, metadata,
// statistics, ModelInfer), infer_stream.cc (ModelStreamInfer) and
// repository_calls.cc (ModelConfig and the repository calls).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "grpc_service.grpc.pb.h"
#include "serving/observability/model_statistics.h"
#include "serving/request/infer_request.h"
#include "serving/scheduling/model_manager.h"
#include "serving/scheduling/model_scheduler.h"

namespace numaserve::serving {

class Metrics;
class WorkerSupervisor;
class InferStream;

// What a call's cancellation needs: whether it happened, the call's
// deadline, and the requests the call has queued (a stream queues many).
struct CallCancellation {
  base::Mutex mu;
  std::atomic<bool> cancelled{false};
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::vector<std::weak_ptr<PendingInference>> queued ABSL_GUARDED_BY(mu);
  size_t prune_at ABSL_GUARDED_BY(mu) = 64;  // when answered entries leave `queued`
};

// Which front end a request came through: the `protocol` label of its
// metrics.
enum class Protocol { kGrpc, kHttp };
const char* ProtocolName(Protocol protocol);  // "grpc", "http"

// The extensions server metadata names, on gRPC as on HTTP, as Triton lists
// them: what this server implements of Triton's (binary_tensor_data is
// HTTP's form of gRPC's raw contents, which Triton counts the same).
inline constexpr const char* kServerExtensions[] = {"binary_tensor_data", "model_configuration",
                                                    "model_repository", "statistics"};

// Gives an answered inference's bytes back to the in-flight budget. The
// call runs it once its reply has been written to the client (a unary
// call's OnDone, a stream's OnWriteDone), so a client that does not read
// its replies holds the budget, not memory outside it.
using InflightRelease = std::function<void()>;

// What a transport reads and writes in buffers of its own instead of the
// messages' raw contents, so each tensor byte is copied once between the
// socket and the worker's arena (and once on the way back).
struct TransportBuffers {
  // The request's raw input bytes (its raw_input_contents empty); null: in
  // the message.
  std::shared_ptr<const TransportInputs> inputs;
  // Takes each output's bytes (FillInferResponse); null: the response's
  // raw_output_contents.
  OutputSink outputs;
};

// The service's base: every call on gRPC's callback API; ModelInfer and
// ModelStreamInfer as raw methods, their messages read and written over
// gRPC's own buffers (raw_infer.h), the other calls with protobuf messages.
namespace grpc_bases {
using S = inference::GRPCInferenceService;
using Calls = S::WithCallbackMethod_ServerLive<
    S::WithCallbackMethod_ServerReady<S::WithCallbackMethod_ModelReady<
        S::WithCallbackMethod_ServerMetadata<S::WithCallbackMethod_ModelMetadata<
            S::WithRawCallbackMethod_ModelInfer<S::WithRawCallbackMethod_ModelStreamInfer<
                S::WithCallbackMethod_ModelStatistics<S::WithCallbackMethod_ModelConfig<
                    S::WithCallbackMethod_RepositoryIndex<S::WithCallbackMethod_RepositoryModelLoad<
                        S::WithCallbackMethod_RepositoryModelUnload<S::Service>>>>>>>>>>>>;
}  // namespace grpc_bases

class InferenceService final : public grpc_bases::Calls {
 public:
  struct Options {
    // Deadline for a request whose client set none: it waits at most this
    // long for a worker, and is answered DEADLINE_EXCEEDED after.
    std::chrono::milliseconds default_timeout{60000};
    // The gRPC message limit: a request whose declared input or output
    // tensors would exceed it is refused before anything is allocated.
    size_t max_message_bytes = size_t{64} << 20;
    // Where per-version counters for ModelStatistics go (not owned; may be null).
    serving::ModelStatistics* statistics = nullptr;
    // The queue bound of a model whose config sets none (--max-queue-size),
    // reported by ModelConfig.
    size_t default_max_queue_size = 4096;
    // Bytes of accepted inferences whose replies are not yet written to
    // their clients (their inputs, outputs and responses) the server holds
    // before it refuses more with RESOURCE_EXHAUSTED
    // (--max-inflight-bytes-mb); 0: no limit.
    size_t max_inflight_bytes = size_t{1} << 30;
    // Requests one ModelStreamInfer stream may have read and not yet
    // answered; the stream stops reading (gRPC flow control then holds the
    // client) until answers are written (--max-stream-outstanding).
    int64_t max_stream_outstanding = 128;
  };

  InferenceService(const Options& options, ModelManager* models, WorkerSupervisor* workers,
                   ModelScheduler* scheduler, Metrics* metrics);
  ~InferenceService() override;

  // Readiness turns false; new inferences and repository requests get
  // UNAVAILABLE. Every open ModelStreamInfer stream stops reading and ends
  // (UNAVAILABLE, "shutting down") once each request it has read is
  // answered; load and unload requests not yet started are refused.
  void SetShuttingDown() ABSL_LOCKS_EXCLUDED(streams_mu_, lifecycle_mu_);
  // Waits until every accepted inference (unary or streamed) has been
  // answered, every stream has ended and no new call has come for `quiet`
  // (late callers get UNAVAILABLE rather than a cancelled call once gRPC
  // stops), or until `deadline`; true if idle.
  bool WaitUntilIdle(std::chrono::steady_clock::time_point deadline,
                     std::chrono::milliseconds quiet) const ABSL_LOCKS_EXCLUDED(streams_mu_);
  // Waits for the load or unload under way (if any) to finish and be
  // answered, then stops the thread that runs them. Call it before gRPC
  // shuts down; idempotent.
  void StopLifecycle() ABSL_LOCKS_EXCLUDED(lifecycle_mu_);
  bool Ready() const;

  // --- What the calls do, apart from gRPC: the gRPC methods below and the
  // HTTP/REST front end (serving/http/) both answer through these, so both
  // protocols share the model manager, the scheduler, the in-flight byte
  // budget, the limits and the statistics.

  // Whether model `name` (`version`; empty: the server's choice) is loaded
  // on a ready worker and the server is not draining; false for an unknown
  // model or version, as Triton answers.
  absl::StatusOr<bool> ModelIsReady(const std::string& name, const std::string& version) const;
  // The name, the version and kServerExtensions: ServerMetadata on gRPC and
  // GET /v2 on HTTP answer the same.
  void FillServerMetadata(inference::ServerMetadataResponse* response) const;
  absl::Status FillModelMetadata(const std::string& name, const std::string& version,
                                 inference::ModelMetadataResponse* response) const;
  // The config version `version` serves with (repository_calls.cc).
  absl::Status FillModelConfig(const std::string& name, const std::string& version,
                               inference::ModelConfigResponse* response) const;
  // Every model when `name` is empty; NOT_FOUND for an unknown model.
  absl::Status FillModelStatistics(const std::string& name, const std::string& version,
                                   inference::ModelStatisticsResponse* response) const;
  absl::Status FillRepositoryIndex(const inference::RepositoryIndexRequest& request,
                                   inference::RepositoryIndexResponse* response) const;
  // Loads (or reloads) / drains and unloads model `name` on the lifecycle
  // thread, one at a time in the order asked; `answer` runs exactly once:
  // at once where refused (FAILED_PRECONDITION outside explicit mode,
  // UNAVAILABLE once shutting down), else with the load's status.
  // `parameters` are the load request's: "config" (a string, the model's
  // config as JSON, used instead of config.pbtxt for this load); any other,
  // the "file:" overrides of model files included, is INVALID_ARGUMENT.
  void LoadModel(
      const std::string& name,
      const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& parameters,
      std::function<void(const absl::Status&)> answer) ABSL_LOCKS_EXCLUDED(lifecycle_mu_);
  void UnloadModel(const std::string& name, std::function<void(const absl::Status&)> answer)
      ABSL_LOCKS_EXCLUDED(lifecycle_mu_);
  // Validates `request` and queues it; `answer` runs exactly once, after
  // `response` is filled (on success). `request` and `response` must live
  // until then. `cancel` is the call's: once the call is cancelled the
  // request leaves its queue at once, and its `deadline` bounds the wait.
  // `answer` is handed the request's InflightRelease, which it must run
  // exactly once, after the reply is written. `protocol` labels the
  // request's metrics. `transport`: where the transport keeps the tensor
  // bytes instead of the messages. Used by ModelInfer, ModelStreamInfer and
  // HTTP.
  void StartInference(Protocol protocol, const std::shared_ptr<CallCancellation>& cancel,
                      const inference::ModelInferRequest* request,
                      inference::ModelInferResponse* response,
                      std::function<void(const absl::Status&, InflightRelease)> answer,
                      TransportBuffers transport = {});

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
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* context) override;
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
  friend class InferCall;
  friend class InferStream;

  // Counts a gRPC inference request that could not be read (a malformed
  // message) in the metrics, under no model.
  void RecordUnreadRequest(const absl::Status& why);
  // NOT_FOUND for an unknown model or version; the model otherwise.
  absl::StatusOr<ModelHandle> Resolve(const std::string& name, const std::string& version,
                                      ModelManager::Need need = ModelManager::Need::kReady) const;
  // Whether the repository has a model `name` (in any state): only such
  // names become metric label values.
  bool IsKnownModel(const std::string& name) const;
  // Moves a request's charge on the in-flight byte budget from `*held` to
  // `need` (and sets `*held`); RESOURCE_EXHAUSTED where the budget is
  // exceeded by it (the charge stays: the caller releases `*held`).
  absl::Status ChargeInflight(size_t* held, size_t need);
  // The call's OnCancel: its queued requests are answered CANCELLED (or
  // DEADLINE_EXCEEDED when the call's deadline is what cancelled it) and
  // leave their queues without being computed.
  void CancelCall(CallCancellation& cancel);
  // Runs `fn` (a load or unload) on the lifecycle thread and answers with
  // its status; UNAVAILABLE at once once the server is shutting down.
  void RunLifecycle(std::function<absl::Status()> fn,
                    std::function<void(const absl::Status&)> answer)
      ABSL_LOCKS_EXCLUDED(lifecycle_mu_);
  void LifecycleLoop() ABSL_LOCKS_EXCLUDED(lifecycle_mu_);
  // False (not added) once the server is shutting down.
  bool AddStream(InferStream* stream) ABSL_LOCKS_EXCLUDED(streams_mu_);
  void RemoveStream(InferStream* stream) ABSL_LOCKS_EXCLUDED(streams_mu_);

  const Options options_;
  ModelManager* const models_;
  WorkerSupervisor* const workers_;
  ModelScheduler* const scheduler_;
  Metrics* const metrics_;
  serving::ModelStatistics* const statistics_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> in_flight_{0};      // inferences not yet answered
  std::atomic<size_t> inflight_bytes_{0};  // their inputs and outputs
  std::atomic<int64_t> last_call_ns_{0};   // steady clock, when the last inference arrived

  mutable base::Mutex streams_mu_;
  std::set<InferStream*> streams_ ABSL_GUARDED_BY(streams_mu_);  // open ModelStreamInfer calls

  // RepositoryModelLoad / RepositoryModelUnload run one at a time here.
  struct LifecycleJob {
    std::function<absl::Status()> run;
    std::function<void(const absl::Status&)> answer;
  };
  base::Mutex lifecycle_mu_;
  base::CondVar lifecycle_cv_;
  std::deque<LifecycleJob> lifecycle_jobs_ ABSL_GUARDED_BY(lifecycle_mu_);
  bool lifecycle_stopping_ ABSL_GUARDED_BY(lifecycle_mu_) = false;
  std::thread lifecycle_;
};

// One mapping from absl::Status to grpc::Status, used at the edge only.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace numaserve::serving
