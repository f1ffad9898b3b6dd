// Gathers the requests of one model version into batches. A batch goes out
// when a worker can take it (`can_dispatch`) and one of these holds: the
// queued rows reach max_batch_rows (or the next request would overflow it),
// the queued rows form a preferred size, or the oldest request has waited
// max_queue_delay. `can_dispatch` is told whether the batch is full (max
// rows or a preferred size): the server takes a partial batch only when a
// worker is idle, so requests that arrive while every worker computes join
// it instead of following in a small batch of their own. A request is never split across batches; a
// request of several rows counts as several rows. The queue is bounded: a full queue refuses at
// once. Requests whose deadline passes, or whose call is cancelled, leave the queue without being
// computed: at the next Poll(), or at once through Cancel() when the caller learns of the
// cancellation.
//
// Priorities: each request has a level (BatchRequest::priority, 1 before 2,
// as in Triton's priority levels); the queue is kept in level order, each
// level first come first served, so batches form from the highest non-empty
// level first. So that lower levels never starve, a request that has waited
// max_priority_wait is moved ahead of every request that has not (level 0),
// in the order such requests arrived.
//
// Shapes: requests batch together only where their inputs' dims besides
// dim 0 are equal (BatchRequest::shape_key; Triton's rule for a model with
// dynamic dims besides the batch). A batch is formed from the request at
// the front of the queue and the queued requests of its shape, in queue
// order; requests of other shapes keep their places and go in a later
// batch, led by the oldest of them once the front's batch has left. So the
// oldest request's shape goes first, no shape waits behind a stream of
// another, and max_queue_delay holds for each batch's oldest request.
//
// The batcher has no thread of its own: Enqueue() and Poll() do the work on
// the caller's thread, and Poll() says when it next needs to run. The server
// calls Poll() when a worker frees up and from a timer; tests call it after
// advancing a base::FakeClock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/mutex.h"

namespace numaserve::serving {

// One queued request; the server derives from it to carry the tensors.
struct BatchRequest {
  virtual ~BatchRequest() = default;
  int64_t rows = 1;
  // Worker memory the request needs in a batch (its inputs and outputs).
  size_t bytes = 0;
  base::Clock::TimePoint deadline = base::Clock::TimePoint::max();
  // Priority level: lower goes first; equal levels in arrival order. The
  // batcher sets it to 0 once the request has waited max_priority_wait.
  uint64_t priority = 1;
  // Requests batch together only where these are equal: a
  // shape-polymorphic model's input dims besides dim 0. Empty for a model
  // whose only dynamic dims are dims 0 (every request has the same).
  std::vector<int64_t> shape_key;
  // True once the client has gone away; may be empty.
  std::function<bool()> is_cancelled;
  // Answers a request that leaves the queue without a batch (deadline,
  // cancellation, shutdown). Called at most once, never under a lock.
  std::function<void(const absl::Status&)> reject;

  base::Clock::TimePoint enqueued;  // set by Enqueue
};

using Batch = std::vector<std::shared_ptr<BatchRequest>>;

class DynamicBatcher {
 public:
  struct Options {
    // Most rows in one batch; 0 sends every request as a batch of its own.
    int64_t max_batch_rows = 0;
    // Sizes worth sending at once (e.g. those the kernels run best at).
    std::vector<int64_t> preferred_batch_rows;
    // How long the oldest request may wait for company while a worker is
    // free: the latency paid for bigger batches. 0: never wait.
    std::chrono::microseconds max_queue_delay{0};
    // Queued requests before Enqueue refuses (RESOURCE_EXHAUSTED). At least 1.
    size_t max_queue_size = 4096;
    // Priority levels the requests use (dynamic_batching.priority_levels;
    // 1: none). With more than one, a request that has waited this long
    // goes ahead of every request that has not: the bound on how long a
    // low level can be passed over. At least 1 microsecond.
    uint64_t priority_levels = 1;
    std::chrono::microseconds max_priority_wait{std::chrono::seconds(1)};
  };
  // True when a worker could take a batch now; `full`: the batch has
  // max_batch_rows rows (or a preferred size, or batching is off).
  using CanDispatchFn = std::function<bool(bool full)>;
  // Takes a formed batch (called without the batcher's lock held).
  using DispatchFn = std::function<void(Batch batch)>;

  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(const Options& options,
                                                                const base::Clock* clock,
                                                                CanDispatchFn can_dispatch,
                                                                DispatchFn dispatch);

  // Queues the request and polls. RESOURCE_EXHAUSTED (request not taken) if
  // the queue is full; UNAVAILABLE after Stop(). When `next_poll` is given,
  // it receives what that poll returned (see Poll()), so a caller with a
  // timer needs no second poll.
  absl::Status Enqueue(std::shared_ptr<BatchRequest> request,
                       base::Clock::TimePoint* next_poll = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops expired and cancelled requests, sends every batch that is due
  // while workers can take one. Returns when it next needs to run if nothing
  // else happens (TimePoint::max() when the queue is empty).
  base::Clock::TimePoint Poll() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `request` out of the queue and rejects it with `why` (the call
  // was cancelled). False if it is not queued (already batched, rejected or
  // never enqueued): then nothing happens.
  bool Cancel(const BatchRequest* request, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Rejects everything queued with `why`; later Enqueue calls fail.
  void Stop(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Rejects everything queued with `why`; the queue stays open. Returns how
  // many were rejected.
  size_t RejectAll(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  size_t queued_requests() const ABSL_LOCKS_EXCLUDED(mu_);
  const Options& options() const { return options_; }

  // The pull side, for a scheduler that owns the slots (serving/scheduling/model_scheduler.h):
  // it asks what is due and takes batches itself, so one lock of its own
  // covers choosing a slot and taking the batch for it. A batcher made for
  // pulling has no can_dispatch / dispatch (pass nullptr to Create) and its
  // Poll() only drops requests.
  //
  // Drops expired and cancelled requests (rejecting them, outside the
  // batcher's lock; call it without locks of your own held).
  void DropExpired() ABSL_LOCKS_EXCLUDED(mu_);
  struct Due {
    size_t requests = 0;      // requests of the batch due now; 0: none is due
    bool full = true;         // that batch is full (see CanDispatchFn)
    int64_t queued_rows = 0;  // rows of every queued request
  };
  // What is due now (nothing after Stop()).
  Due Peek() const ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the front request and the queued requests of its shape (in queue
  // order) while their rows fit `max_rows` and their bytes `max_bytes` (at
  // least one request, at most `max_requests`).
  Batch Take(size_t max_requests, int64_t max_rows,
             size_t max_bytes = std::numeric_limits<size_t>::max()) ABSL_LOCKS_EXCLUDED(mu_);
  // When the oldest request's delay ends, the first deadline passes or a
  // request is due to move up a level; max() when the queue is empty.
  base::Clock::TimePoint NextWake() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  DynamicBatcher(const Options& options, const base::Clock* clock, CanDispatchFn can_dispatch,
                 DispatchFn dispatch);
  // Under mu_: how many requests of the front's shape (the front's and the
  // queued requests of its shape, in order) make the batch due now; 0 if
  // none is due yet. `full` says whether that batch is full (see CanDispatchFn).
  size_t DueBatchSize(base::Clock::TimePoint now, bool* full) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  base::Clock::TimePoint NextWakeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: takes the first `n` requests of the front's shape out of the
  // queue, in order; the others keep their order.
  Batch ExtractLocked(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: puts `request` behind every queued request of its level or a
  // higher one (a lower number).
  void InsertByPriorityLocked(std::shared_ptr<BatchRequest> request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: moves the requests that have waited max_priority_wait to
  // level 0 (see the class comment).
  void PromoteAgedLocked(base::Clock::TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: when the longest-waiting queued request was enqueued.
  base::Clock::TimePoint OldestLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>> DropExpiredLocked(
      base::Clock::TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const base::Clock* const clock_;
  const CanDispatchFn can_dispatch_;
  const DispatchFn dispatch_;

  mutable base::Mutex mu_;
  std::deque<std::shared_ptr<BatchRequest>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace numaserve::serving
