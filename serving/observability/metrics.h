// Every Prometheus metric family numaserve exports, in one place, with units
// in the names. Served as text at http(s)://HOST:PORT/metrics by prometheus-cpp.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "serving/observability/metrics_auth.h"

namespace prometheus {
class Exposer;
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace numaserve::serving {

class Metrics {
 public:
  // Starts the exposer on `address` ("127.0.0.1:8002"; port 0 picks one),
  // guarded by `auth` (HTTPS, bearer tokens; metrics_auth.h); nullptr =
  // plain HTTP, open to whoever reaches the port.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(
      const std::string& address, std::unique_ptr<MetricsAuth> auth = nullptr);
  ~Metrics();

  int port() const { return port_; }
  const MetricsAuth& auth() const { return *auth_; }

  // The `model` label of requests that name no model of the repository
  // (requests_total, request_failures_total, request_duration_seconds and
  // the other per-model request series): every such request counts under
  // model="", so made-up names never become series of their own. Requests
  // for a model of the repository (ready or not, any version) count under
  // its name.
  static constexpr char kUnknownModelLabel[] = "";

  // One finished inference request (a ModelInfer call, a streamed request,
  // an HTTP infer). `protocol` is the front end it came through ("grpc" or
  // "http"); `outcome` is "success" or the status code's name in lower case
  // ("invalid_argument", "not_found", "unavailable", ...).
  void RecordRequest(const std::string& model, const std::string& protocol,
                     const std::string& outcome, double seconds) ABSL_LOCKS_EXCLUDED(children_mu_);
  // A failed inference request by reason: rejected (queue full), timeout,
  // canceled, invalid, not_found, unavailable, internal, other.
  void RecordFailure(const std::string& model, const std::string& protocol,
                     const std::string& reason);
  // One computed request of `rows` rows: time queued (batcher and router),
  // copying its batch's inputs in, in the engine, and copying its outputs out.
  void RecordInference(const std::string& model, int64_t rows, double queue_seconds,
                       double compute_input_seconds, double compute_seconds,
                       double compute_output_seconds) ABSL_LOCKS_EXCLUDED(children_mu_);
  // One batch of `rows` rows went through the engine.
  void RecordExecution(const std::string& model, const std::string& version, int64_t rows);
  // Requests waiting in the model version's batcher queue.
  void SetPendingRequests(const std::string& model, const std::string& version, double count);
  // A worker spent `seconds` computing `rows` rows (`flops` floating-point operations).
  void RecordWorkerBusy(int worker, int numa_node, double seconds, int64_t rows, double flops)
      ABSL_LOCKS_EXCLUDED(totals_mu_);
  // One batch computed by instance `instance` of a model on the worker.
  void RecordInstanceBusy(int worker, int numa_node, int instance, double seconds);
  void RecordWorkerRestart(int worker, int numa_node);
  // The worker's FP32 peak (probe GFLOP/s per core x its cores), for the
  // fraction-of-peak gauge and the "fp32" peak-flops gauge.
  void SetWorkerPeak(int worker, int numa_node, double peak_gflops) ABSL_LOCKS_EXCLUDED(totals_mu_);
  // The worker's peak in another precision ("bf16", "int8") from the CPU
  // model: FLOP/s (INT8: operations/s) per core x its cores.
  void SetWorkerPeakFlops(int worker, int numa_node, const std::string& precision,
                          double per_second);
  // A NUMA node's memory bandwidth (STREAM triad bytes/s), measured at start
  // with serve --measure-bandwidth.
  void SetMemoryBandwidth(int numa_node, double bytes_per_second);
  void SetWorkerResidentBytes(int worker, int numa_node, double bytes);
  // Where a worker's resident memory lies (after its latest model load), from
  // the worker's report "0=1234 1=5": resident pages per NUMA node, each
  // labelled by its `memory_node`. Malformed fields are skipped.
  void SetWorkerNodePages(int worker, int numa_node, absl::string_view pages_by_node);
  void SetWorkerReady(int worker, int numa_node, bool ready);
  void SetModelReady(const std::string& model, const std::string& version, bool ready);
  void SetModelWeightBytes(const std::string& model, const std::string& version, int worker,
                           int numa_node, double bytes);
  void SetModelLoadSeconds(const std::string& model, const std::string& version, int worker,
                           int numa_node, double seconds);
  // The worker no longer holds the model version: its weight-bytes and
  // load-seconds series go, so sums over the workers count held weights only.
  void RemoveModelFromWorker(const std::string& model, const std::string& version, int worker,
                             int numa_node);

  // Training jobs the server runs (training_service.h), labelled by job id
  // and model: the figures of the job's latest progress line.
  struct TrainingFigures {
    int64_t epoch = 0;
    int64_t step = 0;
    int64_t total_steps = 0;
    double loss = 0;
    double accuracy = 0;  // 0..1, over the last log interval
    double images_per_second = 0;
    double eta_seconds = 0;
    double test_accuracy = -1;  // after the last epoch; < 0: none yet
  };
  void SetTrainingProgress(const std::string& job, const std::string& model,
                           const TrainingFigures& figures);
  // A job's state: running, succeeded, failed or cancelled; jobs_by_state
  // counts them.
  void SetTrainingState(const std::string& job, const std::string& model, const std::string& state)
      ABSL_LOCKS_EXCLUDED(training_mu_);
  // Removes a finished job's series (the training service forgets the job):
  // the series of the families above stay bounded by the jobs it keeps.
  // jobs_by_state keeps counting it.
  void RemoveTrainingJob(const std::string& job, const std::string& model)
      ABSL_LOCKS_EXCLUDED(training_mu_);

 private:
  Metrics() = default;
  // Create's metric families, by concern.
  void RegisterRequestFamilies(prometheus::Registry& r);
  void RegisterWorkerFamilies(prometheus::Registry& r);
  void RegisterTrainingFamilies(prometheus::Registry& r);
  int port_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  // Declared before the exposer, whose callbacks read it: destroyed after it.
  std::unique_ptr<MetricsAuth> auth_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* request_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* inferences_ = nullptr;
  prometheus::Family<prometheus::Histogram>* queue_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* compute_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* compute_input_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* compute_output_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* failures_ = nullptr;
  prometheus::Family<prometheus::Counter>* executions_ = nullptr;
  prometheus::Family<prometheus::Histogram>* batch_size_ = nullptr;
  prometheus::Family<prometheus::Gauge>* pending_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_gflops_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_peak_fraction_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_peak_flops_ = nullptr;
  prometheus::Family<prometheus::Gauge>* memory_bandwidth_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_resident_ = nullptr;
  prometheus::Family<prometheus::Gauge>* model_load_seconds_ = nullptr;
  // Per worker: busy seconds and FLOPs so far, and the peak (GFLOP/s).
  struct WorkerTotals {
    double seconds = 0;
    double flops = 0;
    double peak_gflops = 0;
  };
  base::Mutex totals_mu_;
  std::map<int, WorkerTotals> worker_totals_ ABSL_GUARDED_BY(totals_mu_);
  prometheus::Family<prometheus::Counter>* worker_busy_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_inferences_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_flops_ = nullptr;
  prometheus::Family<prometheus::Counter>* worker_restarts_ = nullptr;
  prometheus::Family<prometheus::Counter>* instance_busy_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_node_memory_ = nullptr;
  prometheus::Family<prometheus::Counter>* instance_batches_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_ready_ = nullptr;
  prometheus::Family<prometheus::Gauge>* model_ready_ = nullptr;
  prometheus::Family<prometheus::Gauge>* model_weight_bytes_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_jobs_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_epoch_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_step_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_total_steps_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_loss_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_accuracy_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_test_accuracy_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_images_per_second_ = nullptr;
  prometheus::Family<prometheus::Gauge>* training_eta_ = nullptr;
  base::Mutex training_mu_;
  // job -> state
  std::map<std::string, std::string> training_states_ ABSL_GUARDED_BY(training_mu_);

  // The children every request updates, looked up once per model (and
  // outcome) instead of hashing label sets on each call. prometheus-cpp keeps
  // a child until it is removed, and numaserve never removes these.
  struct PerModel {
    prometheus::Histogram* request_duration = nullptr;
    prometheus::Counter* inferences = nullptr;
    prometheus::Histogram* queue_duration = nullptr;
    prometheus::Histogram* compute_input_duration = nullptr;
    prometheus::Histogram* compute_duration = nullptr;
    prometheus::Histogram* compute_output_duration = nullptr;
    // by protocol, then outcome
    std::map<std::pair<std::string, std::string>, prometheus::Counter*> requests;
  };
  PerModel& ModelChildren(const std::string& model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(children_mu_);
  base::Mutex children_mu_;
  std::map<std::string, PerModel, std::less<>> per_model_ ABSL_GUARDED_BY(children_mu_);
};

}  // namespace numaserve::serving
