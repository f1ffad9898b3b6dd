#include "server/model_scheduler.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/metrics.h"

namespace numaserve::server {

ModelScheduler::ModelScheduler(const Options& options, Router* router, Metrics* metrics,
                               const Clock* clock)
    : options_(options), router_(router), metrics_(metrics), clock_(clock) {}

ModelScheduler::~ModelScheduler() { Stop(); }

absl::Status ModelScheduler::AddModel(std::shared_ptr<const RepositoryModel> model) {
  const config::ModelConfig& c = model->config;
  DynamicBatcher::Options o;
  o.max_queue_size = options_.default_max_queue_size;
  if (c.has_dynamic_batching()) {
    const auto& d = c.dynamic_batching();
    o.max_batch_rows = c.max_batch_size();
    o.preferred_batch_rows.assign(d.preferred_batch_size().begin(), d.preferred_batch_size().end());
    o.max_queue_delay = std::chrono::microseconds(d.max_queue_delay_microseconds());
    if (d.max_queue_size() > 0) o.max_queue_size = d.max_queue_size();
  }
  if (!model->info.unbatched_reason.empty()) {
    // A config asking to batch such a model was refused (ValidateModelConfig).
    fprintf(stderr,
            "numaserve: model '%s' version %lld: served one request per run "
            "(max_batch_size 0): %s\n",
            model->name.c_str(), static_cast<long long>(model->version),
            model->info.unbatched_reason.c_str());
  }
  auto queue = std::make_shared<Queue>();
  queue->model = model;
  queue->version = absl::StrCat(model->version);
  const std::string key = model->key();
  Queue* q = queue.get();
  auto batcher = DynamicBatcher::Create(
      o, clock_, [this, key](bool full) { return router_->HasCapacity(key, full); },
      [this, q](Batch batch) { Dispatch(q, std::move(batch)); });
  if (!batcher.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model->name, "' batching: ", batcher.status().message()));
  }
  queue->batcher = *std::move(batcher);
  {
    std::unique_lock<std::shared_mutex> lock(queues_mu_);
    queues_[key] = queue;
  }
  ReportPending(q);
  if (options_.statistics != nullptr) options_.statistics->Register(model->name, model->version);
  return absl::OkStatus();
}

bool ModelScheduler::RemoveModel(const std::string& key, std::chrono::milliseconds timeout) {
  std::shared_ptr<Queue> queue;
  {
    std::shared_lock<std::shared_mutex> lock(queues_mu_);
    auto it = queues_.find(key);
    if (it == queues_.end()) return true;
    queue = it->second;
  }
  queue->draining = true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool drained = true;
  while (queue->batcher->queued_requests() > 0 || queue->in_flight.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      drained = false;
      break;
    }
    Pump();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  {
    std::unique_lock<std::shared_mutex> lock(queues_mu_);
    queues_.erase(key);
  }
  queue->batcher->Stop(absl::UnavailableError(
      absl::StrCat("model version ", key, " was unloaded before this request was computed")));
  return drained;
}

void ModelScheduler::Start() {
  timer_ = std::thread([this] { TimerLoop(); });
}

std::vector<std::shared_ptr<ModelScheduler::Queue>> ModelScheduler::Queues() const {
  std::shared_lock<std::shared_mutex> lock(queues_mu_);
  std::vector<std::shared_ptr<Queue>> all;
  all.reserve(queues_.size());
  for (const auto& [key, queue] : queues_) all.push_back(queue);
  return all;
}

absl::Status ModelScheduler::Submit(std::shared_ptr<PendingInference> request) {
  std::shared_ptr<Queue> queue;
  {
    std::shared_lock<std::shared_mutex> lock(queues_mu_);
    auto it = queues_.find(request->model->key());
    if (it != queues_.end()) queue = it->second;
  }
  if (queue == nullptr || queue->draining) {
    return absl::UnavailableError(absl::StrCat("model '", request->model->name, "' version ",
                                               request->model->version,
                                               " is not loaded (or is being unloaded)"));
  }
  // Enqueue polls once (sending the batch if one is due); the timer covers
  // what that poll left waiting.
  Clock::TimePoint next = Clock::TimePoint::max();
  if (absl::Status s = queue->batcher->Enqueue(std::move(request), &next); !s.ok()) return s;
  if (next != Clock::TimePoint::max()) WakeBy(next);
  ReportPending(queue.get());
  return absl::OkStatus();
}

bool ModelScheduler::Cancel(const std::shared_ptr<PendingInference>& request,
                            const absl::Status& why) {
  // Every queue is looked at: the request's model may be switched to a
  // newer version by the thread submitting it while this runs.
  for (const auto& queue : Queues()) {
    if (queue->batcher->Cancel(request.get(), why)) {
      ReportPending(queue.get());
      return true;
    }
  }
  return false;
}

void ModelScheduler::ReportPending(Queue* queue) {
  if (metrics_ == nullptr) return;
  metrics_->SetPendingRequests(queue->model->name, queue->version,
                               static_cast<double>(queue->batcher->queued_requests()));
}

Clock::TimePoint ModelScheduler::PollAll() {
  Clock::TimePoint next = Clock::TimePoint::max();
  for (const auto& queue : Queues()) next = std::min(next, queue->batcher->Poll());
  return next;
}

void ModelScheduler::Pump() { WakeBy(PollAll()); }

void ModelScheduler::WakeBy(Clock::TimePoint when) {
  std::lock_guard<std::mutex> lock(timer_mu_);
  if (when < wake_at_) {
    wake_at_ = when;
    timer_cv_.notify_one();
  }
}

void ModelScheduler::TimerLoop() {
  std::unique_lock<std::mutex> lock(timer_mu_);
  while (!stopping_) {
    // The timer sleeps on the real clock; the batchers read `clock_`.
    const auto now = std::chrono::steady_clock::now();
    auto until = std::min(wake_at_, now + options_.idle_poll);
    timer_cv_.wait_until(lock, until);
    if (stopping_) break;
    wake_at_ = Clock::TimePoint::max();
    lock.unlock();
    Clock::TimePoint next = Clock::TimePoint::max();
    for (const auto& queue : Queues()) {
      next = std::min(next, queue->batcher->Poll());
      ReportPending(queue.get());
    }
    lock.lock();
    wake_at_ = std::min(wake_at_, next);
  }
}

void ModelScheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(timer_mu_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  for (const auto& queue : Queues()) {
    queue->batcher->Stop(absl::UnavailableError("the server is shutting down"));
  }
}

size_t ModelScheduler::pending() const {
  size_t n = 0;
  for (const auto& queue : Queues()) n += queue->batcher->queued_requests();
  return n;
}

void ModelScheduler::Dispatch(Queue* queue, Batch batch) {
  const RepositoryModel* model = queue->model.get();
  const Clock::TimePoint dispatched = clock_->Now();
  ReportPending(queue);
  queue->in_flight.fetch_add(1);
  auto task = std::make_shared<InferenceTask>();
  task->model_key = model->key();
  std::vector<std::shared_ptr<PendingInference>> requests;
  requests.reserve(batch.size());
  int64_t rows = 0;
  Clock::TimePoint deadline = Clock::TimePoint::min();
  for (auto& b : batch) {
    auto r = std::static_pointer_cast<PendingInference>(b);
    rows += r->rows;
    deadline = std::max(deadline, r->deadline);
    requests.push_back(std::move(r));
  }
  task->rows = rows;
  task->flops = model->info.flops_per_row * static_cast<double>(rows);
  task->deadline = deadline;
  const size_t num_inputs = model->info.inputs.size();
  const size_t num_outputs = model->info.outputs.size();
  task->inputs.resize(num_inputs);
  for (size_t i = 0; i < num_inputs; ++i) {
    for (const auto& r : requests) task->inputs[i].push_back(r->parsed.inputs[i]);
  }
  // Output bytes per row, from the first request: every request of a batch
  // of several has the same row shape ([rows, static...]: a batched model);
  // a model that is not batched runs one request at a time, its outputs
  // whatever shape they are.
  const auto& first = requests.front()->parsed;
  std::vector<size_t> row_bytes(num_outputs);
  absl::Status mismatch;
  for (size_t i = 0; i < num_outputs; ++i) {
    row_bytes[i] = first.output_bytes[i] / static_cast<size_t>(std::max<int64_t>(1, first.rows));
    task->output_bytes.push_back(requests.size() == 1 ? first.output_bytes[i]
                                                      : row_bytes[i] * static_cast<size_t>(rows));
    for (const auto& r : requests) {
      if (requests.size() > 1 &&
          r->parsed.output_bytes[i] != row_bytes[i] * static_cast<size_t>(r->rows)) {
        mismatch = absl::InternalError(absl::StrCat(
            "output '", model->info.outputs[i].name, "' is not ", row_bytes[i],
            " bytes per row in every request of the batch; it cannot be split by rows"));
      }
    }
  }
  if (requests.size() > 1 && !model->info.batched) {
    mismatch = absl::InternalError(absl::StrCat(
        "model '", model->name, "' cannot be batched: ", model->info.unbatched_reason));
  }
  const std::string model_name = model->name;
  const std::string version = absl::StrCat(model->version);
  task->done = [this, queue, requests = std::move(requests), row_bytes, dispatched, rows,
                model_name, version](const absl::Status& status,
                                     const std::vector<const char*>& outputs, const TaskTiming& t) {
    InferenceTiming timing;
    timing.compute_input_seconds = t.input_seconds;
    timing.compute_infer_seconds = t.compute_seconds;
    timing.batch_rows = rows;
    timing.worker = t.worker;
    if (status.ok() && metrics_) {
      metrics_->RecordExecution(model_name, version, rows);
    }
    const auto scatter_start = std::chrono::steady_clock::now();
    int64_t offset_rows = 0;
    std::vector<const char*> mine(outputs.size());
    for (const auto& r : requests) {
      timing.queue_seconds =
          std::chrono::duration<double>(dispatched - r->enqueued).count() + t.queue_seconds;
      if (status.ok()) {
        for (size_t i = 0; i < outputs.size(); ++i) {
          mine[i] = outputs[i] + static_cast<size_t>(offset_rows) * row_bytes[i];
        }
      }
      r->done(status, status.ok() ? mine : std::vector<const char*>{}, timing);
      offset_rows += r->rows;
    }
    if (status.ok() && options_.statistics != nullptr) {
      const double output_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - scatter_start).count();
      options_.statistics->RecordExecution(model_name, queue->model->version, rows, t.input_seconds,
                                           t.compute_seconds, output_seconds);
    }
    queue->in_flight.fetch_sub(1);
  };
  if (!mismatch.ok()) {
    // Never scatter rows that are not rows: fail the batch instead.
    task->done(mismatch, {}, TaskTiming());
    return;
  }
  router_->Submit(std::move(task));
}

}  // namespace numaserve::server
