// Between the gRPC front end and the router: one DynamicBatcher per served
// model version, a timer that runs them (queue delays, deadlines,
// cancellations), and the step that turns a formed batch into one router
// task whose inputs are gathered from every request and whose outputs are
// scattered back to each request by row.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/clock.h"
#include "server/dynamic_batcher.h"
#include "server/infer_request.h"
#include "server/model_repository.h"
#include "server/model_statistics.h"
#include "server/router.h"

namespace numaserve::server {

class Metrics;

// Where a request's time went, for metrics and statistics.
struct InferenceTiming {
  double queue_seconds = 0;          // enqueued -> its batch's inputs start to be copied
  double compute_input_seconds = 0;  // its batch's inputs into the worker's arena
  double compute_infer_seconds = 0;  // its batch in the engine
  int64_t batch_rows = 0;            // rows of the batch it was computed in
  int worker = -1;
};

// A validated ModelInfer request waiting for its batch.
struct PendingInference : BatchRequest {
  std::shared_ptr<const RepositoryModel> model;
  ParsedRequest parsed;  // points into the request message, which outlives this
  // Called exactly once. On success `outputs[i]` is model output i for this
  // request's rows, valid only during the call (copy it out).
  std::function<void(const absl::Status& status, const std::vector<const char*>& outputs,
                     const InferenceTiming& timing)>
      done;
};

class ModelScheduler {
 public:
  struct Options {
    // Queue bound of a model whose config sets no max_queue_size.
    size_t default_max_queue_size = 4096;
    // How often queues are checked for cancelled calls when nothing else is due.
    std::chrono::milliseconds idle_poll{10};
    // Where per-batch-size execution statistics go (not owned; may be null).
    ModelStatistics* statistics = nullptr;
  };

  ModelScheduler(const Options& options, Router* router, Metrics* metrics, const Clock* clock);
  ~ModelScheduler();

  // Creates the batcher of one served model version (any time).
  absl::Status AddModel(std::shared_ptr<const RepositoryModel> model);
  // Refuses new requests for `key` (UNAVAILABLE), waits until its queue is
  // empty and its batches are answered (at most `timeout`), then forgets it.
  // True if it drained in time.
  bool RemoveModel(const std::string& key, std::chrono::milliseconds timeout);
  // Starts the timer thread.
  void Start();
  // Queues the request on its model version's batcher. Not OK (and `done` is
  // not called) when the queue is full (RESOURCE_EXHAUSTED) or closed.
  absl::Status Submit(std::shared_ptr<PendingInference> request);
  // Takes a queued request out of its batcher and answers it with `why`
  // (its call was cancelled). False if it is no longer queued.
  bool Cancel(const std::shared_ptr<PendingInference>& request, const absl::Status& why);
  // Sends whatever is due; the supervisor's cue that a worker freed up.
  void Pump();
  // Answers every queued request UNAVAILABLE and stops the timer.
  void Stop();

  // Requests waiting in batcher queues.
  size_t pending() const;

 private:
  struct Queue {
    std::shared_ptr<const RepositoryModel> model;
    std::unique_ptr<DynamicBatcher> batcher;
    std::string version;                // metrics label
    std::atomic<int64_t> in_flight{0};  // dispatched batches not yet answered
    std::atomic<bool> draining{false};
  };
  void Dispatch(Queue* queue, Batch batch);
  void TimerLoop();
  void WakeBy(Clock::TimePoint when);
  void ReportPending(Queue* queue);
  Clock::TimePoint PollAll();
  std::vector<std::shared_ptr<Queue>> Queues() const;

  const Options options_;
  Router* const router_;
  Metrics* const metrics_;
  const Clock* const clock_;
  mutable std::shared_mutex queues_mu_;
  std::map<std::string, std::shared_ptr<Queue>> queues_;  // by "name:version"

  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  Clock::TimePoint wake_at_ = Clock::TimePoint::max();
  bool stopping_ = false;
  std::thread timer_;
};

}  // namespace numaserve::server
