// Routes inference tasks to workers: the ready worker that holds the model
// and has the least outstanding work gets the task; its inputs are gathered
// straight into that worker's shared arena (the one copy on the way in).
// Tasks wait in a bounded FIFO when every worker is busy; a task whose
// worker dies is retried once elsewhere, then failed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/worker_supervisor.h"

namespace numaserve::server {

class Metrics;

struct TaskTiming {
  double queue_seconds = 0;    // submit -> handed to a worker (last attempt)
  double input_seconds = 0;    // gathering the inputs into the worker's arena
  double compute_seconds = 0;  // inside the engine
  int worker = -1;
};

struct InferenceTask {
  std::string model_key;  // "name:version"
  int64_t rows = 0;
  double flops = 0;  // for the worker's FLOP counter
  // Per model input (in model order), the pieces that make up the tensor:
  // one per request of a batch, laid end to end in the arena. They must
  // outlive the task.
  std::vector<std::vector<std::pair<const char*, size_t>>> inputs;
  std::vector<size_t> output_bytes;  // per model output
  std::chrono::steady_clock::time_point deadline;
  // Called exactly once. On success `outputs[i]` points at output i in the
  // worker's arena, valid only during the call (copy it out).
  std::function<void(const absl::Status& status, const std::vector<const char*>& outputs,
                     const TaskTiming& timing)>
      done;

  // Router bookkeeping.
  std::chrono::steady_clock::time_point submitted;
  int attempts = 0;
};

class Router {
 public:
  struct Options {
    // Commands in flight per worker: 2 lets the next batch's inputs be copied
    // while the current one computes; more only adds queueing in the worker.
    // For a model with N instances on the worker (instances_per_domain) the
    // limit is N - 1 more: N computing at once, plus the one being copied.
    int max_inflight_per_worker = 2;
    // Tasks waiting for a worker before new ones get RESOURCE_EXHAUSTED.
    size_t max_queue = 4096;
    // Total tries of a task whose worker dies under it.
    int max_attempts = 2;
  };

  Router(const Options& options, WorkerSupervisor* workers, Metrics* metrics);
  ~Router();

  // Takes the task; never blocks. Its `done` may run before this returns.
  void Submit(std::shared_ptr<InferenceTask> task);
  // Dispatches queued tasks to free workers (the supervisor's on_change hook).
  void Pump();
  // Fails every queued task with UNAVAILABLE and stops the timer.
  void Stop();

  size_t queued() const;
  // The batcher's cue that a batch for `model_key` can leave: nothing is
  // queued here and a worker that holds the model is idle, or, for a full
  // batch, has a free slot (a full batch gains nothing by waiting, and its
  // inputs are copied while the worker computes the one before; a partial
  // one waits in the batcher, where later requests can still join it).
  bool HasCapacity(const std::string& model_key, bool full_batch) const;

 private:
  bool TryDispatch(const std::shared_ptr<InferenceTask>& task);  // under mu_
  // Commands of `model_key` worker `worker` may have in flight.
  int InflightLimit(int worker, const std::string& model_key) const;
  void Dispatch(int worker, std::shared_ptr<InferenceTask> task);
  void OnReply(int worker, std::shared_ptr<InferenceTask> task, std::vector<uint64_t> offsets,
               const worker::Reply& reply, bool lost);
  void Release(int worker, const std::vector<uint64_t>& offsets);
  void ExpireLoop();

  const Options options_;
  WorkerSupervisor* const workers_;
  Metrics* const metrics_;

  mutable std::mutex mu_;
  std::deque<std::shared_ptr<InferenceTask>> queue_;
  std::vector<int> inflight_;  // per worker, reserved under mu_
  bool stopped_ = false;
  std::condition_variable stop_cv_;
  std::thread expirer_;
};

}  // namespace numaserve::server
