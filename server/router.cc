#include "server/router.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/metrics.h"

namespace numaserve::server {
namespace {

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Fail(const std::shared_ptr<InferenceTask>& task, absl::Status status) {
  TaskTiming timing;
  timing.queue_seconds = SecondsBetween(task->submitted, std::chrono::steady_clock::now());
  task->done(status, {}, timing);
}

}  // namespace

Router::Router(const Options& options, WorkerSupervisor* workers, Metrics* metrics)
    : options_(options), workers_(workers), metrics_(metrics), inflight_(workers->size(), 0) {
  expirer_ = std::thread([this] { ExpireLoop(); });
}

Router::~Router() { Stop(); }

void Router::Submit(std::shared_ptr<InferenceTask> task) {
  task->submitted = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) {
    lock.unlock();
    return Fail(task, absl::UnavailableError("the server is shutting down"));
  }
  if (queue_.empty() && TryDispatch(task)) return;
  if (queue_.size() >= options_.max_queue) {
    lock.unlock();
    return Fail(task, absl::ResourceExhaustedError(absl::StrCat(
                          "inference queue is full (", options_.max_queue, " waiting requests)")));
  }
  queue_.push_back(std::move(task));
}

bool Router::TryDispatch(const std::shared_ptr<InferenceTask>& task) {
  int best = -1;
  for (int w = 0; w < workers_->size(); ++w) {
    if (inflight_[w] >= InflightLimit(w, task->model_key)) continue;
    if (!workers_->HasModel(w, task->model_key)) continue;
    if (best < 0 || inflight_[w] < inflight_[best]) best = w;
  }
  if (best < 0) return false;
  ++inflight_[best];
  // Dispatch copies the inputs; that happens outside the lock.
  mu_.unlock();
  Dispatch(best, task);
  mu_.lock();
  return true;
}

int Router::InflightLimit(int worker, const std::string& model_key) const {
  // One batch per instance, plus the pipelining slot(s) beyond the first.
  return options_.max_inflight_per_worker - 1 + workers_->Instances(worker, model_key);
}

void Router::Pump() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!queue_.empty() && !stopped_) {
    std::shared_ptr<InferenceTask> task = queue_.front();
    queue_.pop_front();
    if (!TryDispatch(task)) {
      queue_.push_front(std::move(task));
      break;
    }
  }
}

void Router::Release(int worker, const std::vector<uint64_t>& offsets) {
  for (uint64_t offset : offsets) workers_->allocator(worker).Free(offset);
  std::lock_guard<std::mutex> lock(mu_);
  --inflight_[worker];
}

void Router::Dispatch(int worker, std::shared_ptr<InferenceTask> task) {
  ++task->attempts;
  ArenaAllocator& allocator = workers_->allocator(worker);
  char* base = workers_->arena(worker).data();
  worker::Command command;
  worker::RunBatch* run = command.mutable_run();
  run->set_key(task->model_key);
  run->set_batch(task->rows);
  std::vector<uint64_t> offsets;
  auto reserve = [&](size_t bytes, worker::TensorSlice* slice) {
    auto offset = allocator.Allocate(bytes);
    if (!offset) return false;
    offsets.push_back(*offset);
    slice->set_offset(*offset);
    slice->set_bytes(bytes);
    return true;
  };
  bool fits = true;
  const auto copy_start = std::chrono::steady_clock::now();
  for (const auto& pieces : task->inputs) {
    size_t bytes = 0;
    for (const auto& piece : pieces) bytes += piece.second;
    worker::TensorSlice* slice = run->add_inputs();
    if (!(fits = reserve(bytes, slice))) break;
    char* to = base + slice->offset();
    for (const auto& [data, n] : pieces) {
      memcpy(to, data, n);  // the one copy in
      to += n;
    }
  }
  const double input_seconds = SecondsBetween(copy_start, std::chrono::steady_clock::now());
  for (size_t i = 0; fits && i < task->output_bytes.size(); ++i) {
    fits = reserve(task->output_bytes[i], run->add_outputs());
  }
  if (!fits) {
    Release(worker, offsets);
    return Fail(task,
                absl::ResourceExhaustedError(absl::StrCat(
                    "the request's tensors do not fit in worker ", worker, "'s shared arena of ",
                    allocator.capacity(), " bytes (see --worker-arena-mb)")));
  }
  double queue_seconds = SecondsBetween(task->submitted, copy_start);
  bool sent = workers_->Send(
      worker, std::move(command),
      [this, worker, task, offsets, queue_seconds, input_seconds](const worker::Reply& reply,
                                                                  bool lost) {
        TaskTiming timing;
        timing.queue_seconds = queue_seconds;
        timing.input_seconds = input_seconds;
        timing.compute_seconds = static_cast<double>(reply.compute_ns()) * 1e-9;
        timing.worker = worker;
        if (reply.ok()) {
          std::vector<const char*> outputs;
          // `offsets` holds the inputs' slices, then the outputs'.
          for (size_t i = task->inputs.size(); i < offsets.size(); ++i) {
            outputs.push_back(workers_->arena(worker).data() + offsets[i]);
          }
          if (metrics_) {
            metrics_->RecordWorkerBusy(worker, workers_->placement(worker).numa_node,
                                       timing.compute_seconds, task->rows, task->flops);
          }
          task->done(absl::OkStatus(), outputs, timing);  // copies out of the arena
          Release(worker, offsets);
          return;
        }
        Release(worker, offsets);
        if (lost && task->attempts < options_.max_attempts) {
          // Inference is idempotent: try again on whichever worker is free.
          std::unique_lock<std::mutex> lock(mu_);
          if (!stopped_) {
            queue_.push_front(task);
            return;
          }
        }
        task->done(lost ? absl::UnavailableError(
                              absl::StrCat(reply.error(), " while computing this request (attempt ",
                                           task->attempts, " of ", options_.max_attempts, ")"))
                        : absl::InternalError(reply.error()),
                   {}, timing);
      });
  if (!sent) {
    // The worker turned unready between choosing it and sending: queue again.
    Release(worker, offsets);
    --task->attempts;
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_front(std::move(task));
  }
}

void Router::ExpireLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(20));
    auto now = std::chrono::steady_clock::now();
    std::vector<std::shared_ptr<InferenceTask>> expired;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->deadline <= now) {
        expired.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (auto& task : expired) {
      Fail(task, absl::DeadlineExceededError(
                     "the request's deadline passed while it waited for a worker"));
    }
    Pump();  // retries queued by a lost worker wait for the next free one
    lock.lock();
  }
}

void Router::Stop() {
  std::deque<std::shared_ptr<InferenceTask>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ && !expirer_.joinable()) return;
    stopped_ = true;
    queued.swap(queue_);
  }
  stop_cv_.notify_all();
  if (expirer_.joinable()) expirer_.join();
  for (auto& task : queued) Fail(task, absl::UnavailableError("the server is shutting down"));
}

bool Router::HasCapacity(const std::string& model_key, bool full_batch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || !queue_.empty()) return false;
  for (int w = 0; w < workers_->size(); ++w) {
    // A partial batch leaves when an instance is idle, a full one when the
    // worker can take it at all.
    const int limit = full_batch ? InflightLimit(w, model_key) : workers_->Instances(w, model_key);
    if (inflight_[w] < limit && workers_->HasModel(w, model_key)) return true;
  }
  return false;
}

size_t Router::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace numaserve::server
