// Between the gRPC front end and the workers: a pull scheduler in the shape
// of TensorFlow Serving's shared batch scheduler. Each served model version
// has a queue (a DynamicBatcher used for its batching rules: max rows,
// preferred sizes, queue delay, deadlines). The slots are the instances of
// the models on the workers: a worker holding a model with N instances
// computes N of its batches at once. Whenever a slot is free (a batch was
// answered, a worker became ready, a request arrived, a delay ran out) the
// scheduler takes the next due batch for it, round-robin over the queues of
// the models the worker holds, under one lock, so two queues never claim
// the same slot:
//
//   * a partial batch (its delay ran out) goes to an idle instance only;
//     a full one (max rows or a preferred size) may also wait in a busy
//     worker's pipeline, one batch per instance, its inputs copied while
//     the instances compute, so a worker of N instances has N batches ready
//     as N single-instance workers would;
//   * the slot an answered batch frees is filled before that batch's
//     callers are answered, so the answering never keeps a slot idle;
//   * with several idle instances, the queued rows are shared between them
//     (each batch takes its share, up to max rows, and at least the smallest
//     preferred batch size where the config names one), so 64 requests and
//     16 idle instances make 16 batches of 4, not two of 32 and 14 idle
//     slots;
//   * among the workers with a free slot, the least loaded one relative to
//     its instances wins, ties taken in turn so every slot gets its share.
//
// A batch is one InferenceTask run through a WorkerPool; its outputs are
// scattered back to each request by row. A batch whose worker dies is run
// once more on any worker, then failed. One timer thread covers queue delays,
// deadlines and cancelled calls. Start / Drain (RemoveModel) / Stop are the
// lifecycle; nothing here busy-waits.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "serving/observability/model_statistics.h"
#include "serving/repository/model_repository.h"
#include "serving/request/infer_request.h"
#include "serving/scheduling/dynamic_batcher.h"
#include "serving/workers/worker_pool.h"

namespace numaserve::serving {

class Metrics;

// Where a request's time went, for metrics and statistics.
struct InferenceTiming {
  double queue_seconds = 0;          // enqueued -> its batch's inputs start to be copied
  double compute_input_seconds = 0;  // its batch's inputs into the worker's arena
  double compute_infer_seconds = 0;  // its batch in the engine
  int64_t batch_rows = 0;            // rows of the batch it was computed in
  int worker = -1;
  // For a request that asked for it (PendingInference::profile): its
  // batch's step profile as one JSON object (RunOutcome::profile_json).
  // Empty for every other request.
  std::string profile;
};

// A validated ModelInfer request waiting for its batch.
struct PendingInference : BatchRequest {
  std::shared_ptr<const RepositoryModel> model;
  ParsedRequest parsed;  // points into the request message, which outlives this
  // The caller asked for its batch's step profile (the request parameter
  // `profile`): the batch it joins runs with the engine's step timing on,
  // and only this request's timing carries the result.
  bool profile = false;
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
    // How often the timer checks the queues when nothing is due; zero (the
    // default): never. Nothing needs it: a cancelled call takes its requests
    // out of their queues itself (InferenceService::CancelCall, and after a
    // cancellation racing the queueing), deadlines and queue delays set the
    // timer (WakeBy), and worker changes pump. (A 10 ms poll once cost the
    // front end 100 wake-ups a second whenever requests were queued.)
    std::chrono::milliseconds idle_poll{0};
    // Full batches a worker may hold waiting, per instance of the model,
    // beyond the ones its instances compute: 1 lets each instance's next
    // batch be copied in while it computes. (One per worker instead left a
    // worker of 16 instances with one batch ready for 16 slots.)
    int pipeline_depth = 1;
    // Total runs of a batch whose worker dies under it.
    int max_attempts = 2;
    // Where per-batch-size execution statistics go (not owned; may be null).
    ModelStatistics* statistics = nullptr;
  };

  ModelScheduler(const Options& options, WorkerPool* workers, Metrics* metrics,
                 const base::Clock* clock);
  ~ModelScheduler();

  // Creates the queue of one served model version (any time).
  absl::Status AddModel(const std::shared_ptr<const RepositoryModel>& model)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new requests for `key` (UNAVAILABLE), waits until its queue is
  // empty and its batches are answered (at most `timeout`), then forgets it
  // (what is still queued is answered UNAVAILABLE). True if it drained in time.
  bool RemoveModel(const std::string& key, std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the timer thread (tests on a fake clock call Pump() instead).
  void Start();
  // Queues the request on its model version's queue. Not OK (and `done` is
  // not called) when the queue is full (RESOURCE_EXHAUSTED) or closed.
  absl::Status Submit(std::shared_ptr<PendingInference> request) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a queued request out of its queue and answers it with `why`
  // (its call was cancelled). False if it is no longer queued.
  bool Cancel(const std::shared_ptr<PendingInference>& request, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Fills free slots with due batches, and answers the work of models no
  // worker will hold (FailUnservable); the cue that a worker changed or
  // that the fake clock moved.
  void Pump() ABSL_LOCKS_EXCLUDED(mu_);
  // Answers every queued request UNAVAILABLE and stops the timer; batches
  // in flight are answered as their workers reply.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, timer_mu_);

  // Requests waiting in queues (batches waiting for a retry not included).
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);
  // Batches in flight on `worker` (tests and the load balance check).
  int InFlight(int worker) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One batch on its way: the task and the requests it answers.
  struct Flight;
  struct Queue {
    std::shared_ptr<const RepositoryModel> model;
    std::string key;
    std::string version;  // metrics label
    std::unique_ptr<DynamicBatcher> batcher;
    // The rest is under the scheduler's mu_ (not annotated: ABSL_GUARDED_BY
    // cannot name a mutex of the enclosing object).
    // Batches whose worker died, formed and waiting to run again.
    std::deque<std::shared_ptr<Flight>> retries;
    int64_t in_flight = 0;  // batches started and not yet answered
    // Due rows are being shared between idle instances: what remains of
    // them goes to the next idle ones without waiting again.
    bool sharing = false;
    bool draining = false;
    // RemoveModel has forgotten the queue: nothing reads `retries` any
    // more, so a batch lost from now on is answered instead of retried.
    bool removed = false;
  };
  // A decision taken under mu_, carried out outside it.
  struct Launch {
    std::shared_ptr<Queue> queue;
    std::shared_ptr<Flight> flight;
    int worker = -1;
  };

  // Forms and launches batches while slots are free; then arms the timer.
  void Schedule() ABSL_LOCKS_EXCLUDED(mu_);
  // Answers the queued requests and retries of every model that no ready
  // worker holds and none is on its way to (WorkerPool::ModelExpected):
  // they would otherwise wait for their deadline, or forever. While a
  // worker restarts with the model they wait for it.
  void FailUnservable() ABSL_LOCKS_EXCLUDED(mu_);
  // Under mu_: the next batch to launch, or false when no free slot can
  // take a due batch.
  bool NextLaunch(Launch* launch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: the worker for a batch of `queue`: an idle instance
  // (`partial_ok`), else a pipeline place (full batches only); -1 if none.
  // `idle_slots` receives the idle instances of the model over all workers.
  int PickWorker(const Queue& queue, bool partial_ok, int* idle_slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Flight> Form(const std::shared_ptr<Queue>& queue, const Batch& batch);
  // Runs `worker`'s outbox in order (outside mu_) until it is empty.
  void SendInOrder(int worker) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs a launch decided by NextLaunch (outside mu_).
  void Begin(const Launch& launch);
  void Finish(const std::shared_ptr<Queue>& queue, const std::shared_ptr<Flight>& flight,
              int worker, const RunOutcome& outcome);
  void Answer(Queue* queue, Flight* flight, const absl::Status& status, const RunOutcome& outcome,
              int worker);
  void ReportPending(const Queue& queue);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(timer_mu_);
  void WakeBy(base::Clock::TimePoint when) ABSL_LOCKS_EXCLUDED(timer_mu_);
  std::vector<std::shared_ptr<Queue>> Queues() const ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  WorkerPool* const workers_;
  Metrics* const metrics_;
  const base::Clock* const clock_;

  mutable base::Mutex mu_;  // also guards the scheduling fields of every Queue
  base::CondVar drained_cv_;
  std::map<std::string, std::shared_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);  // by "name:version"
  std::vector<int> in_flight_ ABSL_GUARDED_BY(mu_);                            // per worker
  // Per worker, the launches decided and not yet begun. NextLaunch's
  // decisions reach a worker in the order they were taken, though several
  // threads schedule: whichever finds no one sending begins them all.
  struct Outbox {
    std::deque<Launch> launches;
    bool sending = false;
  };
  std::vector<Outbox> outboxes_ ABSL_GUARDED_BY(mu_);
  // Round-robin position over queues_.
  size_t next_queue_ ABSL_GUARDED_BY(mu_) = 0;
  // Rotation among equally loaded workers.
  int next_worker_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;

  base::Mutex timer_mu_;
  base::CondVar timer_cv_;
  base::Clock::TimePoint wake_at_ ABSL_GUARDED_BY(timer_mu_) = base::Clock::TimePoint::max();
  bool timer_stopping_ ABSL_GUARDED_BY(timer_mu_) = false;
  std::thread timer_;
};

}  // namespace numaserve::serving
