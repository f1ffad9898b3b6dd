#include "serving/scheduling/model_scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/mutex.h"
#include "serving/observability/metrics.h"

namespace numaserve::serving {

struct ModelScheduler::Flight {
  InferenceTask task;
  std::vector<std::shared_ptr<PendingInference>> requests;
  std::vector<size_t> row_bytes;    // per output, for scattering by row
  base::Clock::TimePoint launched;  // the last attempt's start
};

namespace {

double Seconds(base::Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

// Schedule() on a thread that is already inside Schedule() (a run answered
// at once, e.g. refused for arena space) only asks the outer call to go
// round again, so answers never recurse.
thread_local bool scheduling = false;
thread_local bool schedule_again = false;

}  // namespace

ModelScheduler::ModelScheduler(const Options& options, WorkerPool* workers, Metrics* metrics,
                               const base::Clock* clock)
    : options_(options),
      workers_(workers),
      metrics_(metrics),
      clock_(clock),
      in_flight_(static_cast<size_t>(workers->size()), 0),
      outboxes_(static_cast<size_t>(workers->size())) {}

ModelScheduler::~ModelScheduler() { Stop(); }

absl::Status ModelScheduler::AddModel(const std::shared_ptr<const RepositoryModel>& model) {
  const config::ModelConfig& c = model->config;
  DynamicBatcher::Options o;
  o.max_queue_size = options_.default_max_queue_size;
  if (c.has_dynamic_batching()) {
    const auto& d = c.dynamic_batching();
    o.max_batch_rows = c.max_batch_size();
    o.preferred_batch_rows.assign(d.preferred_batch_size().begin(), d.preferred_batch_size().end());
    o.max_queue_delay = std::chrono::microseconds(d.max_queue_delay_microseconds());
    if (d.max_queue_size() > 0) o.max_queue_size = d.max_queue_size();
    o.priority_levels = std::max<uint64_t>(1, d.priority_levels());
  }
  if (!model->info.unbatched_reason.empty()) {
    // A config asking to batch such a model was refused (ValidateModelConfig).
    base::Log(base::LogLevel::kInfo, "scheduler",
              absl::StrFormat("model '%s' version %d: served one request per run "
                              "(max_batch_size 0): %s",
                              model->name, model->version, model->info.unbatched_reason),
              {{"model", model->name},
               {"version", model->version},
               {"max_batch_size", 0},
               {"reason", model->info.unbatched_reason}});
  }
  // Pulled: this scheduler decides when a batch leaves (no callbacks).
  auto batcher = DynamicBatcher::Create(o, clock_, nullptr, nullptr);
  if (!batcher.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model->name, "' batching: ", batcher.status().message()));
  }
  auto queue = std::make_shared<Queue>();
  queue->model = model;
  queue->key = model->key();
  queue->version = absl::StrCat(model->version);
  queue->batcher = *std::move(batcher);
  {
    base::MutexLock lock(&mu_);
    queues_[queue->key] = queue;
  }
  ReportPending(*queue);
  if (options_.statistics != nullptr) options_.statistics->Register(model->name, model->version);
  return absl::OkStatus();
}

bool ModelScheduler::RemoveModel(const std::string& key, std::chrono::milliseconds timeout) {
  std::shared_ptr<Queue> queue;
  bool drained = true;
  std::deque<std::shared_ptr<Flight>> retries;
  {
    base::MutexLock lock(&mu_);
    auto it = queues_.find(key);
    if (it == queues_.end()) return true;
    queue = it->second;
    queue->draining = true;  // Submit refuses from now on
    // Batches leave as slots free (Finish runs Schedule); every Schedule
    // and every answer signals.
    auto is_drained = [&] {
      mu_.AssertHeld();
      return stopped_ || (queue->in_flight == 0 && queue->retries.empty() &&
                          queue->batcher->queued_requests() == 0);
    };
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!is_drained()) {
      // True once `timeout` has passed on the steady clock.
      if (drained_cv_.WaitUntil(&mu_, deadline)) {
        drained = is_drained();
        break;
      }
    }
    queues_.erase(key);
    queue->removed = true;
    retries.swap(queue->retries);
  }
  const absl::Status why = absl::UnavailableError(
      absl::StrCat("model version ", key, " was unloaded before this request was computed"));
  queue->batcher->Stop(why);
  for (auto& flight : retries) Answer(queue.get(), flight.get(), why, RunOutcome(), -1);
  return drained;
}

void ModelScheduler::Start() {
  timer_ = std::thread([this] { TimerLoop(); });
}

std::vector<std::shared_ptr<ModelScheduler::Queue>> ModelScheduler::Queues() const {
  base::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Queue>> all;
  all.reserve(queues_.size());
  for (const auto& [key, queue] : queues_) all.push_back(queue);
  return all;
}

absl::Status ModelScheduler::Submit(std::shared_ptr<PendingInference> request) {
  std::shared_ptr<Queue> queue;
  {
    base::MutexLock lock(&mu_);
    auto it = queues_.find(request->model->key());
    if (it != queues_.end() && !it->second->draining && !stopped_) queue = it->second;
  }
  if (queue == nullptr) {
    return absl::UnavailableError(absl::StrCat("model '", request->model->name, "' version ",
                                               request->model->version,
                                               " is not loaded (or is being unloaded)"));
  }
  // Refused alone, before it can share a batch with other callers' requests.
  if (const size_t limit = workers_->BatchBytesLimit(); request->bytes > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request needs ", request->bytes,
                     " bytes of worker memory for its inputs and "
                     "outputs; a batch may take at most ",
                     limit, " (half of --worker-arena-mb); send fewer rows"));
  }
  if (absl::Status s = queue->batcher->Enqueue(std::move(request)); !s.ok()) return s;
  Schedule();
  ReportPending(*queue);
  return absl::OkStatus();
}

bool ModelScheduler::Cancel(const std::shared_ptr<PendingInference>& request,
                            const absl::Status& why) {
  // Every queue is looked at: the request's model may be switched to a
  // newer version by the thread submitting it while this runs.
  for (const auto& queue : Queues()) {
    if (queue->batcher->Cancel(request.get(), why)) {
      ReportPending(*queue);
      base::MutexLock lock(&mu_);
      drained_cv_.SignalAll();
      return true;
    }
  }
  return false;
}

void ModelScheduler::Pump() {
  for (const auto& queue : Queues()) queue->batcher->DropExpired();
  Schedule();
  // Workers change (and the timer runs) here, not on every submit and
  // answer: only a change can leave a model without workers.
  FailUnservable();
}

void ModelScheduler::ReportPending(const Queue& queue) {
  if (metrics_ == nullptr) return;
  metrics_->SetPendingRequests(queue.model->name, queue.version,
                               static_cast<double>(queue.batcher->queued_requests()));
}

void ModelScheduler::Schedule() {
  if (scheduling) {
    schedule_again = true;
    return;
  }
  scheduling = true;
  do {
    schedule_again = false;
    std::vector<std::shared_ptr<Queue>> touched;
    while (true) {
      Launch launch;
      bool send = false;
      {
        base::MutexLock lock(&mu_);
        if (!NextLaunch(&launch)) {
          drained_cv_.SignalAll();
          break;
        }
        Outbox& outbox = outboxes_[static_cast<size_t>(launch.worker)];
        outbox.launches.push_back(launch);
        send = !std::exchange(outbox.sending, true);
      }
      touched.push_back(launch.queue);
      if (send) SendInOrder(launch.worker);  // copies the inputs outside the lock
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (const auto& queue : touched) ReportPending(*queue);
  } while (schedule_again);
  scheduling = false;
  // The timer wakes for the earliest queue delay or deadline.
  base::Clock::TimePoint next = base::Clock::TimePoint::max();
  for (const auto& queue : Queues()) next = std::min(next, queue->batcher->NextWake());
  WakeBy(next);
}

void ModelScheduler::FailUnservable() {
  for (const auto& queue : Queues()) {
    {
      base::MutexLock lock(&mu_);
      if (queue->retries.empty() && queue->batcher->queued_requests() == 0) continue;
    }
    bool held = false;
    for (int w = 0; w < workers_->size() && !held; ++w) {
      held = workers_->Ready(w) && workers_->HasModel(w, queue->key);
    }
    if (held || workers_->ModelExpected(queue->key)) continue;
    const absl::Status why = absl::UnavailableError(
        absl::StrCat("model '", queue->model->name, "' version ", queue->version,
                     ": no worker holds it and none is loading it (see the model's state in "
                     "RepositoryIndex); the request was not computed"));
    std::deque<std::shared_ptr<Flight>> retries;
    {
      base::MutexLock lock(&mu_);
      retries.swap(queue->retries);
    }
    for (auto& flight : retries) Answer(queue.get(), flight.get(), why, RunOutcome(), -1);
    queue->batcher->RejectAll(why);
    ReportPending(*queue);
    base::MutexLock lock(&mu_);
    drained_cv_.SignalAll();
  }
}

int ModelScheduler::PickWorker(const Queue& queue, bool partial_ok, int* idle_slots) {
  const int n = workers_->size();
  int best = -1, best_instances = 1;
  *idle_slots = 0;
  for (int i = 0; i < n; ++i) {
    // In turn from next_worker_, so equally loaded workers share the work.
    const int w = (next_worker_ + i) % n;
    if (!workers_->Ready(w) || !workers_->HasModel(w, queue.key)) continue;
    const int instances = workers_->Instances(w, queue.key);
    const int busy = in_flight_[static_cast<size_t>(w)];
    if (busy < instances) *idle_slots += instances - busy;
    const int limit = partial_ok ? instances : instances * (1 + options_.pipeline_depth);
    if (busy >= limit) continue;
    // Least loaded relative to its instances: busy / instances, compared
    // without division.
    if (best < 0 || static_cast<int64_t>(busy) * best_instances <
                        static_cast<int64_t>(in_flight_[static_cast<size_t>(best)]) * instances) {
      best = w;
      best_instances = instances;
    }
  }
  return best;
}

bool ModelScheduler::NextLaunch(Launch* launch) {
  if (stopped_ || queues_.empty()) return false;
  // Round-robin over the queues, from the one after the last served.
  std::vector<std::shared_ptr<Queue>> order;
  order.reserve(queues_.size());
  for (const auto& [key, queue] : queues_) order.push_back(queue);
  const size_t n = order.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t index = (next_queue_ + i) % n;
    const std::shared_ptr<Queue>& queue = order[index];
    int idle = 0;
    // A batch to run again (its worker died) goes first, to any free slot.
    if (!queue->retries.empty()) {
      const int w = PickWorker(*queue, /*partial_ok=*/false, &idle);
      if (w < 0) continue;
      launch->flight = queue->retries.front();
      queue->retries.pop_front();
      launch->queue = queue;
      launch->worker = w;
    } else {
      DynamicBatcher::Due due = queue->batcher->Peek();
      if (due.queued_rows == 0) queue->sharing = false;
      if (due.requests == 0 && queue->sharing) {
        // The rest of rows that were due and shared: idle instances take it
        // now rather than after another delay.
        due.requests = queue->batcher->queued_requests();
        due.full = false;
      }
      if (due.requests == 0) continue;
      int w = PickWorker(*queue, /*partial_ok=*/true, &idle);
      if (idle == 0) queue->sharing = false;
      // No idle instance: a full batch may still wait in a worker's pipeline.
      if (w < 0 && due.full) w = PickWorker(*queue, /*partial_ok=*/false, &idle);
      if (w < 0) continue;
      const int64_t max_rows = queue->batcher->options().max_batch_rows;
      int64_t rows = std::max<int64_t>(1, max_rows);
      if (max_rows > 0 && idle > 1) {
        // Share the queued rows between the idle instances, down to the
        // smallest preferred batch size where the config names one.
        const auto& preferred = queue->batcher->options().preferred_batch_rows;
        const int64_t floor =
            preferred.empty() ? 1 : *std::min_element(preferred.begin(), preferred.end());
        rows = std::clamp<int64_t>((due.queued_rows + idle - 1) / idle, floor, max_rows);
        queue->sharing = true;
      }
      const size_t max_requests = max_rows > 0 ? due.requests : 1;
      Batch batch = queue->batcher->Take(max_requests, rows, workers_->BatchBytesLimit());
      if (batch.empty()) continue;  // cancelled meanwhile
      launch->queue = queue;
      launch->flight = Form(queue, batch);
      launch->worker = w;
    }
    ++in_flight_[static_cast<size_t>(launch->worker)];
    ++queue->in_flight;
    next_queue_ = (index + 1) % n;
    next_worker_ = (launch->worker + 1) % std::max(1, workers_->size());
    return true;
  }
  return false;
}

std::shared_ptr<ModelScheduler::Flight> ModelScheduler::Form(const std::shared_ptr<Queue>& queue,
                                                             const Batch& batch) {
  const RepositoryModel* model = queue->model.get();
  auto flight = std::make_shared<Flight>();
  InferenceTask& task = flight->task;
  task.model_key = queue->key;
  base::Clock::TimePoint deadline = base::Clock::TimePoint::min();
  int64_t rows = 0;
  for (auto& b : batch) {
    auto r = std::static_pointer_cast<PendingInference>(b);
    rows += r->rows;
    deadline = std::max(deadline, r->deadline);
    task.profile = task.profile || r->profile;
    flight->requests.push_back(std::move(r));
  }
  task.rows = rows;
  task.flops = model->info.flops_per_row * static_cast<double>(rows);
  task.deadline = deadline;
  const size_t num_inputs = model->info.inputs.size();
  const size_t num_outputs = model->info.outputs.size();
  task.inputs.resize(num_inputs);
  for (size_t i = 0; i < num_inputs; ++i) {
    for (const auto& r : flight->requests) {
      const auto& pieces = r->parsed.inputs[i].pieces;
      task.inputs[i].insert(task.inputs[i].end(), pieces.begin(), pieces.end());
    }
  }
  if (model->signature_shapes) {
    // The batch's signature: its requests' shapes (one shape_key), the
    // rows stacked along dim 0 of every input (a batched model's are all
    // its rows).
    task.input_shapes = flight->requests.front()->parsed.input_shapes;
    if (flight->requests.size() > 1) {
      for (auto& shape : task.input_shapes) {
        if (!shape.empty()) shape[0] = rows;
      }
    }
  }
  // Output bytes per row, from the first request: every request of a batch
  // of several has the same row shape ([rows, static...]: a batched model);
  // a model that is not batched runs one request at a time, its outputs
  // whatever shape they are.
  const auto& first = flight->requests.front()->parsed;
  const bool single = flight->requests.size() == 1;
  flight->row_bytes.resize(num_outputs);
  for (size_t i = 0; i < num_outputs; ++i) {
    flight->row_bytes[i] =
        first.output_bytes[i] / static_cast<size_t>(std::max<int64_t>(1, first.rows));
    task.output_bytes.push_back(single ? first.output_bytes[i]
                                       : flight->row_bytes[i] * static_cast<size_t>(rows));
  }
  return flight;
}

void ModelScheduler::SendInOrder(int worker) {
  while (true) {
    Launch launch;
    {
      base::MutexLock lock(&mu_);
      Outbox& outbox = outboxes_[static_cast<size_t>(worker)];
      if (outbox.launches.empty()) {
        outbox.sending = false;
        return;
      }
      launch = std::move(outbox.launches.front());
      outbox.launches.pop_front();
    }
    Begin(launch);
  }
}

void ModelScheduler::Begin(const Launch& launch) {
  Flight* flight = launch.flight.get();
  const RepositoryModel* model = launch.queue->model.get();
  // Never scatter rows that are not rows: such a batch fails instead.
  absl::Status mismatch;
  if (flight->requests.size() > 1) {
    if (!model->info.batched) {
      mismatch = absl::InternalError(absl::StrCat(
          "model '", model->name, "' cannot be batched: ", model->info.unbatched_reason));
    }
    for (const auto& r : flight->requests) {
      if (mismatch.ok() && r->shape_key != flight->requests.front()->shape_key) {
        mismatch = absl::InternalError(absl::StrCat(
            "model '", model->name, "': a batch holds requests whose dims besides dim 0 differ"));
      }
    }
    for (size_t i = 0; mismatch.ok() && i < flight->row_bytes.size(); ++i) {
      for (const auto& r : flight->requests) {
        if (r->parsed.output_bytes[i] != flight->row_bytes[i] * static_cast<size_t>(r->rows)) {
          mismatch = absl::InternalError(absl::StrCat(
              "output '", model->info.outputs[i].name, "' is not ", flight->row_bytes[i],
              " bytes per row in every request of the batch; it cannot be split by rows"));
          break;
        }
      }
    }
  }
  const base::Clock::TimePoint now = clock_->Now();
  if (mismatch.ok() && flight->task.deadline <= now) {
    mismatch = absl::DeadlineExceededError(
        "the request's deadline passed while it waited for a worker; it was not computed");
  }
  if (!mismatch.ok()) {
    RunOutcome outcome;
    outcome.status = mismatch;
    Finish(launch.queue, launch.flight, launch.worker, outcome);
    return;
  }
  flight->launched = now;
  ++flight->task.attempts;
  workers_->Run(launch.worker, flight->task,
                [this, queue = launch.queue, flight = launch.flight, worker = launch.worker](
                    const RunOutcome& outcome) { Finish(queue, flight, worker, outcome); });
}

void ModelScheduler::Finish(const std::shared_ptr<Queue>& queue,
                            const std::shared_ptr<Flight>& flight, int worker,
                            const RunOutcome& outcome) {
  bool retry = false;
  bool removed = false;
  {
    base::MutexLock lock(&mu_);
    --in_flight_[static_cast<size_t>(worker)];
    removed = queue->removed;
    if (outcome.lost && !stopped_ && !removed &&
        (outcome.not_sent || flight->task.attempts < options_.max_attempts)) {
      // Inference is idempotent: run it again on whichever slot frees first.
      if (outcome.not_sent) --flight->task.attempts;
      queue->retries.push_front(flight);
      --queue->in_flight;
      retry = true;
    }
  }
  // A slot is free: its next batch goes first, then this one's callers are
  // answered (the queue still counts this batch in flight, so RemoveModel
  // waits for the answers). A batch that could not be sent waits for the
  // worker's next change or the timer, so a worker that refuses sends does
  // not spin.
  if (!outcome.not_sent) Schedule();
  if (!retry) {
    absl::Status status = outcome.status;
    if (outcome.lost && removed) {
      // RemoveModel gave up waiting and forgot the queue: no slot will
      // take this batch again.
      status = absl::UnavailableError(
          absl::StrCat("model '", queue->model->name, "' version ", queue->version,
                       " was unloaded while this request waited to be computed again (",
                       outcome.status.message(), "); it was not computed"));
    } else if (outcome.lost) {
      status = absl::UnavailableError(
          absl::StrCat(outcome.status.message(), " while computing this request (attempt ",
                       flight->task.attempts, " of ", options_.max_attempts, ")"));
    }
    Answer(queue.get(), flight.get(), status, outcome, worker);
    base::MutexLock lock(&mu_);
    --queue->in_flight;
  }
  base::MutexLock lock(&mu_);
  drained_cv_.SignalAll();
}

void ModelScheduler::Answer(Queue* queue, Flight* flight, const absl::Status& status,
                            const RunOutcome& outcome, int worker) {
  const RepositoryModel* model = queue->model.get();
  const int64_t rows = flight->task.rows;
  InferenceTiming timing;
  timing.compute_input_seconds = outcome.input_seconds;
  timing.compute_infer_seconds = outcome.compute_seconds;
  timing.batch_rows = rows;
  timing.worker = worker;
  if (status.ok() && metrics_ != nullptr) {
    const int node = workers_->NumaNode(worker);
    metrics_->RecordExecution(model->name, queue->version, rows);
    metrics_->RecordWorkerBusy(worker, node, outcome.compute_seconds, rows, flight->task.flops);
    metrics_->RecordInstanceBusy(worker, node, outcome.instance, outcome.compute_seconds);
  }
  const auto scatter_start = std::chrono::steady_clock::now();
  const bool launched = flight->launched != base::Clock::TimePoint();
  int64_t offset_rows = 0;
  std::vector<const char*> mine(outcome.outputs.size());
  for (const auto& r : flight->requests) {
    timing.queue_seconds = launched ? Seconds(flight->launched - r->enqueued) : 0;
    // The profile goes to the requests that asked for it, no other.
    if (r->profile) {
      timing.profile = outcome.profile_json;
    } else {
      timing.profile.clear();
    }
    if (status.ok()) {
      for (size_t i = 0; i < outcome.outputs.size(); ++i) {
        mine[i] = outcome.outputs[i] + static_cast<size_t>(offset_rows) * flight->row_bytes[i];
      }
    }
    r->done(status, status.ok() ? mine : std::vector<const char*>{}, timing);
    offset_rows += r->rows;
  }
  if (status.ok() && options_.statistics != nullptr) {
    const double output_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - scatter_start).count();
    options_.statistics->RecordExecution(model->name, model->version, rows, outcome.input_seconds,
                                         outcome.compute_seconds, output_seconds);
  }
}

void ModelScheduler::WakeBy(base::Clock::TimePoint when) {
  if (when == base::Clock::TimePoint::max()) return;
  base::MutexLock lock(&timer_mu_);
  if (when < wake_at_) {
    wake_at_ = when;
    timer_cv_.Signal();
  }
}

void ModelScheduler::TimerLoop() {
  pthread_setname_np(pthread_self(), "scheduler");  // in /proc/PID/task/*/comm, top -H
  while (true) {
    {
      base::MutexLock lock(&timer_mu_);
      if (timer_stopping_) return;
      // The timer sleeps on the real clock; the queues read `clock_`.
      auto until = wake_at_;
      if (options_.idle_poll.count() > 0) {
        until = std::min(until, std::chrono::steady_clock::now() + options_.idle_poll);
      }
      // One wait, woken early by WakeBy or Stop (its result is not needed);
      // with nothing due, until one of them (a wait until the clock's
      // maximum would overflow in the conversion to the wait's clock).
      if (until == base::Clock::TimePoint::max()) {
        timer_cv_.Wait(&timer_mu_);
      } else {
        timer_cv_.WaitUntil(&timer_mu_, until);
      }
      if (timer_stopping_) return;
      wake_at_ = base::Clock::TimePoint::max();
    }
    Pump();  // drops expired and cancelled requests, launches what is due
  }
}

void ModelScheduler::Stop() {
  std::vector<std::shared_ptr<Queue>> queues;
  std::vector<std::pair<std::shared_ptr<Queue>, std::shared_ptr<Flight>>> retries;
  {
    base::MutexLock lock(&mu_);
    stopped_ = true;
    for (const auto& [key, queue] : queues_) {
      queues.push_back(queue);
      for (auto& flight : queue->retries) retries.emplace_back(queue, flight);
      queue->retries.clear();
    }
    drained_cv_.SignalAll();
  }
  {
    base::MutexLock lock(&timer_mu_);
    timer_stopping_ = true;
  }
  timer_cv_.SignalAll();
  if (timer_.joinable()) timer_.join();
  const absl::Status why = absl::UnavailableError("the server is shutting down");
  for (const auto& queue : queues) queue->batcher->Stop(why);
  // (A batch waiting to run again is no longer counted in flight.)
  for (auto& [queue, flight] : retries) Answer(queue.get(), flight.get(), why, RunOutcome(), -1);
}

size_t ModelScheduler::pending() const {
  size_t n = 0;
  for (const auto& queue : Queues()) n += queue->batcher->queued_requests();
  return n;
}

int ModelScheduler::InFlight(int worker) const {
  base::MutexLock lock(&mu_);
  return in_flight_.at(static_cast<size_t>(worker));
}

}  // namespace numaserve::serving
