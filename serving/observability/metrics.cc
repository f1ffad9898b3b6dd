#include "serving/observability/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/mutex.h"

namespace numaserve::serving {
namespace {

// Latency buckets from 50 us to 10 s: small-batch MLPs finish in well under
// a millisecond, big CNN batches take seconds.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,    0.1,    0.25,    0.5,    1.0,   2.5,    5.0,   10.0};
}

// Batch sizes in rows: powers of two up to 1024.
prometheus::Histogram::BucketBoundaries BatchBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

prometheus::Labels WorkerLabels(int worker, int numa_node) {
  return {{"worker", absl::StrCat(worker)}, {"numa_node", absl::StrCat(numa_node)}};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& address,
                                                         std::unique_ptr<MetricsAuth> auth) {
  std::unique_ptr<Metrics> m(new Metrics());
  if (auth == nullptr) {
    absl::StatusOr<std::unique_ptr<MetricsAuth>> open = MetricsAuth::Create({});
    if (!open.ok()) return open.status();
    auth = *std::move(open);
  }
  m->auth_ = std::move(auth);
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer = m->auth_->StartExposer(address);
  if (!exposer.ok()) return exposer.status();
  m->exposer_ = *std::move(exposer);
  auto ports = m->exposer_->GetListeningPorts();
  m->port_ = ports.empty() ? 0 : ports.front();
  m->registry_ = std::make_shared<prometheus::Registry>();
  auto& r = *m->registry_;
  m->RegisterRequestFamilies(r);
  m->RegisterWorkerFamilies(r);
  m->RegisterTrainingFamilies(r);
  m->exposer_->RegisterCollectable(m->registry_);
  return m;
}

// Requests, batches and queues, by model.
void Metrics::RegisterRequestFamilies(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  requests_ = &BuildCounter()
                   .Name("numaserve_requests_total")
                   .Help(
                       "Inference requests by model, protocol (grpc or http) and outcome "
                       "(success or status code)")
                   .Register(r);
  request_duration_ = &BuildHistogram()
                           .Name("numaserve_request_duration_seconds")
                           .Help("Time from receiving an inference request to answering it")
                           .Register(r);
  inferences_ = &BuildCounter()
                     .Name("numaserve_inferences_total")
                     .Help("Rows (samples) inferred, by model")
                     .Register(r);
  queue_duration_ = &BuildHistogram()
                         .Name("numaserve_queue_duration_seconds")
                         .Help("Time a request waited for a worker")
                         .Register(r);
  compute_duration_ = &BuildHistogram()
                           .Name("numaserve_compute_duration_seconds")
                           .Help("Time a request's batch spent in the engine on a worker")
                           .Register(r);
  compute_input_duration_ =
      &BuildHistogram()
           .Name("numaserve_compute_input_duration_seconds")
           .Help("Time copying a request's batch inputs into the worker's shared arena")
           .Register(r);
  compute_output_duration_ =
      &BuildHistogram()
           .Name("numaserve_compute_output_duration_seconds")
           .Help("Time copying a request's output rows out of the worker's arena into its response")
           .Register(r);
  failures_ = &BuildCounter()
                   .Name("numaserve_request_failures_total")
                   .Help(
                       "Failed inference requests by model, protocol and reason (rejected: "
                       "queue full; timeout; canceled; invalid; not_found; unavailable; internal)")
                   .Register(r);
  executions_ = &BuildCounter()
                     .Name("numaserve_executions_total")
                     .Help(
                         "Batches computed by model and version; inferences_total / "
                         "executions_total is the mean batch size")
                     .Register(r);
  batch_size_ = &BuildHistogram()
                     .Name("numaserve_batch_size_rows")
                     .Help("Rows per computed batch, by model and version")
                     .Register(r);
  pending_ = &BuildGauge()
                  .Name("numaserve_pending_requests")
                  .Help("Requests waiting in a model version's batcher queue")
                  .Register(r);
}

// Workers and their instances: compute, memory, peaks, readiness.
void Metrics::RegisterWorkerFamilies(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  worker_gflops_ = &BuildGauge()
                        .Name("numaserve_worker_achieved_gflops")
                        .Help("GFLOP/s a worker achieves while busy (FLOPs / busy seconds)")
                        .Register(r);
  worker_peak_fraction_ =
      &BuildGauge()
           .Name("numaserve_worker_peak_fraction_ratio")
           .Help("Achieved GFLOP/s over the worker's FP32 peak (probe GFLOP/s per core x cores)")
           .Register(r);
  worker_peak_flops_ =
      &BuildGauge()
           .Name("numaserve_worker_peak_flops")
           .Help(
               "A worker's peak from the CPU model by precision: FLOP/s (int8: operations/s) "
               "per core x its cores")
           .Register(r);
  memory_bandwidth_ = &BuildGauge()
                           .Name("numaserve_memory_bandwidth_bytes_per_second")
                           .Help(
                               "A NUMA node's memory bandwidth, STREAM triad measured at "
                               "start (serve --measure-bandwidth)")
                           .Register(r);
  worker_resident_ = &BuildGauge()
                          .Name("numaserve_worker_resident_memory_bytes")
                          .Help("Resident memory of each worker process")
                          .Register(r);
  model_load_seconds_ = &BuildGauge()
                             .Name("numaserve_model_load_duration_seconds")
                             .Help("Time a worker took to load and compile a model version")
                             .Register(r);
  worker_busy_ = &BuildCounter()
                      .Name("numaserve_worker_busy_seconds_total")
                      .Help("Seconds each worker spent computing")
                      .Register(r);
  worker_inferences_ = &BuildCounter()
                            .Name("numaserve_worker_inferences_total")
                            .Help("Rows computed by each worker")
                            .Register(r);
  worker_flops_ = &BuildCounter()
                       .Name("numaserve_worker_flops_total")
                       .Help("Floating-point operations executed by each worker")
                       .Register(r);
  worker_node_memory_ = &BuildGauge()
                             .Name("numaserve_worker_node_memory_bytes")
                             .Help(
                                 "Resident memory of each worker by the NUMA node it lies "
                                 "on (memory_node), read after its latest model load")
                             .Register(r);
  instance_busy_ = &BuildCounter()
                        .Name("numaserve_instance_busy_seconds_total")
                        .Help(
                            "Seconds each model instance (slot) of each worker spent "
                            "computing; idle slots show as flat lines")
                        .Register(r);
  instance_batches_ = &BuildCounter()
                           .Name("numaserve_instance_batches_total")
                           .Help("Batches each model instance (slot) of each worker computed")
                           .Register(r);
  worker_restarts_ = &BuildCounter()
                          .Name("numaserve_worker_restarts_total")
                          .Help("Times the supervisor restarted a worker that exited")
                          .Register(r);
  worker_ready_ = &BuildGauge()
                       .Name("numaserve_worker_ready")
                       .Help("1 when the worker process is up and has its models loaded")
                       .Register(r);
  model_ready_ = &BuildGauge()
                      .Name("numaserve_model_ready")
                      .Help("1 when the model version is ready to serve")
                      .Register(r);
  model_weight_bytes_ = &BuildGauge()
                             .Name("numaserve_model_weight_bytes")
                             .Help("Bytes of model weights resident on each worker")
                             .Register(r);
}

// Training jobs of the training service.
void Metrics::RegisterTrainingFamilies(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  training_jobs_ = &BuildGauge()
                        .Name("numaserve_training_jobs")
                        .Help(
                            "Training jobs the server started, by state (running, "
                            "succeeded, failed, cancelled)")
                        .Register(r);
  for (const char* state : {"running", "succeeded", "failed", "cancelled"}) {
    training_jobs_->Add({{"state", state}}).Set(0);
  }
  training_epoch_ = &BuildGauge()
                         .Name("numaserve_training_epoch")
                         .Help("Epoch (1-based) of a training job's latest progress line")
                         .Register(r);
  training_step_ = &BuildGauge()
                        .Name("numaserve_training_step")
                        .Help("Steps a training job has completed")
                        .Register(r);
  training_total_steps_ = &BuildGauge()
                               .Name("numaserve_training_total_steps")
                               .Help("Steps a training job runs in all")
                               .Register(r);
  training_loss_ = &BuildGauge()
                        .Name("numaserve_training_loss")
                        .Help("Mean training loss (cross-entropy) over the last log interval")
                        .Register(r);
  training_accuracy_ = &BuildGauge()
                            .Name("numaserve_training_accuracy_ratio")
                            .Help("Training accuracy over the last log interval, 0..1")
                            .Register(r);
  training_test_accuracy_ = &BuildGauge()
                                 .Name("numaserve_training_test_accuracy_ratio")
                                 .Help("Test-set accuracy after the last finished epoch, 0..1")
                                 .Register(r);
  training_images_per_second_ =
      &BuildGauge()
           .Name("numaserve_training_images_per_second")
           .Help("Training throughput over the last log interval, all ranks together")
           .Register(r);
  training_eta_ = &BuildGauge()
                       .Name("numaserve_training_eta_seconds")
                       .Help("Estimated time until a training job's last step (0 once ended)")
                       .Register(r);
}

Metrics::~Metrics() = default;

Metrics::PerModel& Metrics::ModelChildren(const std::string& model) {
  auto it = per_model_.find(model);
  if (it != per_model_.end()) return it->second;
  PerModel& m = per_model_[model];
  const prometheus::Labels labels = {{"model", model}};
  m.request_duration = &request_duration_->Add(labels, LatencyBuckets());
  m.inferences = &inferences_->Add(labels);
  m.queue_duration = &queue_duration_->Add(labels, LatencyBuckets());
  m.compute_input_duration = &compute_input_duration_->Add(labels, LatencyBuckets());
  m.compute_duration = &compute_duration_->Add(labels, LatencyBuckets());
  m.compute_output_duration = &compute_output_duration_->Add(labels, LatencyBuckets());
  return m;
}

void Metrics::RecordRequest(const std::string& model, const std::string& protocol,
                            const std::string& outcome, double seconds) {
  prometheus::Counter* requests = nullptr;
  prometheus::Histogram* duration = nullptr;
  {
    base::MutexLock lock(&children_mu_);
    PerModel& m = ModelChildren(model);
    auto key = std::make_pair(protocol, outcome);
    auto it = m.requests.find(key);
    if (it == m.requests.end()) {
      it = m.requests
               .emplace(key, &requests_->Add(
                                 {{"model", model}, {"protocol", protocol}, {"outcome", outcome}}))
               .first;
    }
    requests = it->second;
    duration = m.request_duration;
  }
  requests->Increment();
  duration->Observe(seconds);
}

void Metrics::RecordFailure(const std::string& model, const std::string& protocol,
                            const std::string& reason) {
  failures_->Add({{"model", model}, {"protocol", protocol}, {"reason", reason}}).Increment();
}

void Metrics::RecordInference(const std::string& model, int64_t rows, double queue_seconds,
                              double compute_input_seconds, double compute_seconds,
                              double compute_output_seconds) {
  PerModel* m = nullptr;
  {
    base::MutexLock lock(&children_mu_);
    m = &ModelChildren(model);  // std::map nodes do not move
  }
  m->inferences->Increment(static_cast<double>(rows));
  m->queue_duration->Observe(queue_seconds);
  m->compute_input_duration->Observe(compute_input_seconds);
  m->compute_duration->Observe(compute_seconds);
  m->compute_output_duration->Observe(compute_output_seconds);
}

void Metrics::RecordExecution(const std::string& model, const std::string& version, int64_t rows) {
  prometheus::Labels labels = {{"model", model}, {"version", version}};
  executions_->Add(labels).Increment();
  batch_size_->Add(labels, BatchBuckets()).Observe(static_cast<double>(rows));
}

void Metrics::SetPendingRequests(const std::string& model, const std::string& version,
                                 double count) {
  pending_->Add({{"model", model}, {"version", version}}).Set(count);
}

void Metrics::RecordWorkerBusy(int worker, int numa_node, double seconds, int64_t rows,
                               double flops) {
  auto labels = WorkerLabels(worker, numa_node);
  worker_busy_->Add(labels).Increment(seconds);
  worker_inferences_->Add(labels).Increment(static_cast<double>(rows));
  worker_flops_->Add(labels).Increment(flops);
  double gflops = 0;
  double peak = 0;
  {
    base::MutexLock lock(&totals_mu_);
    WorkerTotals& t = worker_totals_[worker];
    t.seconds += seconds;
    t.flops += flops;
    if (t.seconds > 0) gflops = t.flops / t.seconds * 1e-9;
    peak = t.peak_gflops;
  }
  worker_gflops_->Add(labels).Set(gflops);
  if (peak > 0) worker_peak_fraction_->Add(labels).Set(gflops / peak);
}

void Metrics::SetWorkerNodePages(int worker, int numa_node, absl::string_view pages_by_node) {
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  for (absl::string_view field : absl::StrSplit(pages_by_node, ' ', absl::SkipEmpty())) {
    const size_t eq = field.find('=');
    int node = 0;
    double pages = 0;
    if (eq == absl::string_view::npos || !absl::SimpleAtoi(field.substr(0, eq), &node) ||
        !absl::SimpleAtod(field.substr(eq + 1), &pages) || node < 0 || node > 4096) {
      continue;
    }
    auto labels = WorkerLabels(worker, numa_node);
    labels["memory_node"] = absl::StrCat(node);
    worker_node_memory_->Add(labels).Set(pages * page);
  }
}

void Metrics::RecordInstanceBusy(int worker, int numa_node, int instance, double seconds) {
  auto labels = WorkerLabels(worker, numa_node);
  // "slot", not "instance": Prometheus keeps its target in `instance`.
  labels["slot"] = std::to_string(instance);
  instance_busy_->Add(labels).Increment(seconds);
  instance_batches_->Add(labels).Increment();
}

void Metrics::SetWorkerPeak(int worker, int numa_node, double peak_gflops) {
  {
    base::MutexLock lock(&totals_mu_);
    worker_totals_[worker].peak_gflops = peak_gflops;
  }
  auto labels = WorkerLabels(worker, numa_node);
  worker_gflops_->Add(labels).Set(0);
  worker_peak_fraction_->Add(labels).Set(0);
  SetWorkerPeakFlops(worker, numa_node, "fp32", peak_gflops * 1e9);
}

void Metrics::SetWorkerPeakFlops(int worker, int numa_node, const std::string& precision,
                                 double per_second) {
  auto labels = WorkerLabels(worker, numa_node);
  labels["precision"] = precision;
  worker_peak_flops_->Add(labels).Set(per_second);
}

void Metrics::SetMemoryBandwidth(int numa_node, double bytes_per_second) {
  memory_bandwidth_->Add({{"numa_node", std::to_string(numa_node)}}).Set(bytes_per_second);
}

void Metrics::SetWorkerResidentBytes(int worker, int numa_node, double bytes) {
  worker_resident_->Add(WorkerLabels(worker, numa_node)).Set(bytes);
}

void Metrics::SetModelLoadSeconds(const std::string& model, const std::string& version, int worker,
                                  int numa_node, double seconds) {
  auto labels = WorkerLabels(worker, numa_node);
  labels["model"] = model;
  labels["version"] = version;
  model_load_seconds_->Add(labels).Set(seconds);
}

void Metrics::RecordWorkerRestart(int worker, int numa_node) {
  worker_restarts_->Add(WorkerLabels(worker, numa_node)).Increment();
}

void Metrics::SetWorkerReady(int worker, int numa_node, bool ready) {
  const auto labels = WorkerLabels(worker, numa_node);
  worker_ready_->Add(labels).Set(ready ? 1 : 0);
  // The restart counter exists from the worker's first report, at 0, so
  // increase() sees its first restart.
  worker_restarts_->Add(labels);
}

void Metrics::SetModelReady(const std::string& model, const std::string& version, bool ready) {
  model_ready_->Add({{"model", model}, {"version", version}}).Set(ready ? 1 : 0);
}

void Metrics::SetModelWeightBytes(const std::string& model, const std::string& version, int worker,
                                  int numa_node, double bytes) {
  auto labels = WorkerLabels(worker, numa_node);
  labels["model"] = model;
  labels["version"] = version;
  model_weight_bytes_->Add(labels).Set(bytes);
}

void Metrics::RemoveModelFromWorker(const std::string& model, const std::string& version,
                                    int worker, int numa_node) {
  auto labels = WorkerLabels(worker, numa_node);
  labels["model"] = model;
  labels["version"] = version;
  for (prometheus::Family<prometheus::Gauge>* family : {model_weight_bytes_, model_load_seconds_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
}

void Metrics::SetTrainingProgress(const std::string& job, const std::string& model,
                                  const TrainingFigures& f) {
  const prometheus::Labels labels = {{"job_id", job}, {"model", model}};
  training_epoch_->Add(labels).Set(static_cast<double>(f.epoch));
  training_step_->Add(labels).Set(static_cast<double>(f.step));
  training_total_steps_->Add(labels).Set(static_cast<double>(f.total_steps));
  training_loss_->Add(labels).Set(f.loss);
  training_accuracy_->Add(labels).Set(f.accuracy);
  training_images_per_second_->Add(labels).Set(f.images_per_second);
  training_eta_->Add(labels).Set(f.eta_seconds);
  if (f.test_accuracy >= 0) training_test_accuracy_->Add(labels).Set(f.test_accuracy);
}

void Metrics::SetTrainingState(const std::string& job, const std::string& model,
                               const std::string& state) {
  base::MutexLock lock(&training_mu_);
  auto [it, inserted] = training_states_.try_emplace(job, state);
  if (!inserted) {
    if (it->second == state) return;
    training_jobs_->Add({{"state", it->second}}).Decrement();
    it->second = state;
  }
  training_jobs_->Add({{"state", state}}).Increment();
  if (state != "running") training_eta_->Add({{"job_id", job}, {"model", model}}).Set(0);
}

void Metrics::RemoveTrainingJob(const std::string& job, const std::string& model) {
  base::MutexLock lock(&training_mu_);
  training_states_.erase(job);
  const prometheus::Labels labels = {{"job_id", job}, {"model", model}};
  for (prometheus::Family<prometheus::Gauge>* family :
       {training_epoch_, training_step_, training_total_steps_, training_loss_, training_accuracy_,
        training_test_accuracy_, training_images_per_second_, training_eta_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
}

}  // namespace numaserve::serving
