#include "serving/scheduling/dynamic_batcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"

namespace numaserve::serving {

DynamicBatcher::DynamicBatcher(const Options& options, const base::Clock* clock,
                               CanDispatchFn can_dispatch, DispatchFn dispatch)
    : options_(options),
      clock_(clock),
      can_dispatch_(std::move(can_dispatch)),
      dispatch_(std::move(dispatch)) {}

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(const Options& options,
                                                                       const base::Clock* clock,
                                                                       CanDispatchFn can_dispatch,
                                                                       DispatchFn dispatch) {
  if (options.max_batch_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_rows is ", options.max_batch_rows, "; expected >= 0"));
  }
  for (int64_t p : options.preferred_batch_rows) {
    if (p < 1 || p > options.max_batch_rows) {
      return absl::InvalidArgumentError(absl::StrCat("preferred batch size ", p,
                                                     " is outside 1..max_batch_rows (",
                                                     options.max_batch_rows, ")"));
    }
  }
  if (options.max_queue_size < 1) {
    return absl::InvalidArgumentError("max_queue_size must be at least 1");
  }
  if (options.max_queue_delay.count() < 0) {
    return absl::InvalidArgumentError("max_queue_delay must not be negative");
  }
  if (options.priority_levels < 1 || options.max_priority_wait.count() < 1) {
    return absl::InvalidArgumentError(
        "priority_levels and max_priority_wait must be at least 1 (one level: no priorities)");
  }
  if (clock == nullptr || static_cast<bool>(can_dispatch) != static_cast<bool>(dispatch)) {
    return absl::InvalidArgumentError(
        "a batcher needs a clock, and both can_dispatch and dispatch or neither (pulled)");
  }
  return std::unique_ptr<DynamicBatcher>(
      new DynamicBatcher(options, clock, std::move(can_dispatch), std::move(dispatch)));
}

absl::Status DynamicBatcher::Enqueue(std::shared_ptr<BatchRequest> request,
                                     base::Clock::TimePoint* next_poll) {
  {
    base::MutexLock lock(&mu_);
    if (stopped_) return absl::UnavailableError("the model's queue is closed (shutting down)");
    if (queue_.size() >= options_.max_queue_size) {
      return absl::ResourceExhaustedError(absl::StrCat("the model's queue is full (",
                                                       options_.max_queue_size,
                                                       " waiting requests); retry later"));
    }
    request->enqueued = clock_->Now();
    InsertByPriorityLocked(std::move(request));
  }
  const base::Clock::TimePoint next = Poll();
  if (next_poll != nullptr) *next_poll = next;
  return absl::OkStatus();
}

void DynamicBatcher::InsertByPriorityLocked(std::shared_ptr<BatchRequest> request) {
  // The queue is in level order: the place is after the last request of
  // the same or a higher level (the back, when every request has one level).
  if (queue_.empty() || queue_.back()->priority <= request->priority) {
    queue_.push_back(std::move(request));
    return;
  }
  auto at = std::upper_bound(
      queue_.begin(), queue_.end(), request->priority,
      [](uint64_t level, const std::shared_ptr<BatchRequest>& r) { return level < r->priority; });
  queue_.insert(at, std::move(request));
}

void DynamicBatcher::PromoteAgedLocked(base::Clock::TimePoint now) {
  if (options_.priority_levels <= 1) return;
  auto aged = [&](const std::shared_ptr<BatchRequest>& r) {
    return r->priority > 0 && now - r->enqueued >= options_.max_priority_wait;
  };
  if (std::none_of(queue_.begin(), queue_.end(), aged)) return;
  // Level 0 (promoted before) stays in front; the newly aged follow in
  // arrival order; the rest keep their order.
  std::deque<std::shared_ptr<BatchRequest>> front, newly, rest;
  for (auto& r : queue_) {
    if (r->priority == 0) {
      front.push_back(std::move(r));
    } else if (aged(r)) {
      newly.push_back(std::move(r));
    } else {
      rest.push_back(std::move(r));
    }
  }
  std::stable_sort(newly.begin(), newly.end(),
                   [](const auto& a, const auto& b) { return a->enqueued < b->enqueued; });
  for (auto& r : newly) {
    r->priority = 0;
    front.push_back(std::move(r));
  }
  for (auto& r : rest) front.push_back(std::move(r));
  queue_.swap(front);
}

base::Clock::TimePoint DynamicBatcher::OldestLocked() const {
  base::Clock::TimePoint oldest = base::Clock::TimePoint::max();
  if (options_.priority_levels <= 1) {
    // One level: the queue is in arrival order.
    return queue_.empty() ? oldest : queue_.front()->enqueued;
  }
  for (const auto& r : queue_) oldest = std::min(oldest, r->enqueued);
  return oldest;
}

size_t DynamicBatcher::DueBatchSize(base::Clock::TimePoint now, bool* full) const {
  *full = true;
  if (queue_.empty()) return 0;
  if (options_.max_batch_rows <= 0) return 1;
  const auto& preferred = options_.preferred_batch_rows;
  auto is_preferred = [&](int64_t rows) {
    return std::find(preferred.begin(), preferred.end(), rows) != preferred.end();
  };
  // The batch the queue's front would form now: `count` requests, `total`
  // rows; `best` is the longest prefix of it whose rows are a preferred size.
  int64_t total = 0;
  size_t count = 0, best = 0;
  const std::vector<int64_t>& shape = queue_.front()->shape_key;
  for (const auto& r : queue_) {
    if (r->shape_key != shape) continue;  // another shape: a later batch
    if (count > 0 && total + r->rows > options_.max_batch_rows) return count;  // full
    total += r->rows;
    ++count;
    if (!preferred.empty() && is_preferred(total)) best = count;
    if (total >= options_.max_batch_rows) return count;  // full
  }
  if (best == count) return count;  // a preferred size
  if (now - OldestLocked() < options_.max_queue_delay) return 0;
  // The oldest request has waited long enough: the largest preferred batch
  // that can be formed, else everything queued (a partial batch).
  if (best > 0) return best;
  *full = false;
  return count;
}

base::Clock::TimePoint DynamicBatcher::NextWakeLocked() const {
  base::Clock::TimePoint next = base::Clock::TimePoint::max();
  if (queue_.empty()) return next;
  const base::Clock::TimePoint now = clock_->Now();
  const base::Clock::TimePoint delay_end = OldestLocked() + options_.max_queue_delay;
  if (delay_end > now) next = delay_end;
  const bool levels = options_.priority_levels > 1;
  for (const auto& r : queue_) {
    next = std::min(next, r->deadline);
    if (levels && r->priority > 0) next = std::min(next, r->enqueued + options_.max_priority_wait);
  }
  return next;
}

std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>>
DynamicBatcher::DropExpiredLocked(base::Clock::TimePoint now) {
  std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>> dropped;
  PromoteAgedLocked(now);
  for (auto it = queue_.begin(); it != queue_.end();) {
    BatchRequest& r = **it;
    if (r.deadline <= now) {
      dropped.emplace_back(std::move(*it),
                           absl::DeadlineExceededError("the request's deadline passed while it was "
                                                       "queued; it was not computed"));
    } else if (r.is_cancelled && r.is_cancelled()) {
      dropped.emplace_back(std::move(*it),
                           absl::CancelledError("the call was cancelled while queued"));
    } else {
      ++it;
      continue;
    }
    it = queue_.erase(it);
  }
  return dropped;
}

void DynamicBatcher::DropExpired() {
  std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>> dropped;
  {
    base::MutexLock lock(&mu_);
    dropped = DropExpiredLocked(clock_->Now());
  }
  for (auto& [request, status] : dropped) {
    if (request->reject) request->reject(status);
  }
}

DynamicBatcher::Due DynamicBatcher::Peek() const {
  base::MutexLock lock(&mu_);
  Due due;
  for (const auto& r : queue_) due.queued_rows += r->rows;
  if (!stopped_) due.requests = DueBatchSize(clock_->Now(), &due.full);
  return due;
}

Batch DynamicBatcher::ExtractLocked(size_t n) {
  Batch batch;
  if (queue_.empty() || n == 0) return batch;
  batch.reserve(n);
  batch.push_back(std::move(queue_.front()));
  const std::vector<int64_t>& shape = batch.front()->shape_key;
  // Requests of the front's shape join the batch; the others move up over
  // the gaps, keeping their order.
  size_t kept = 1;  // queue_[1..kept) holds the requests left so far
  size_t i = 1;
  for (; i < queue_.size() && batch.size() < n; ++i) {
    if (queue_[i]->shape_key == shape) {
      batch.push_back(std::move(queue_[i]));
    } else {
      if (kept != i) queue_[kept] = std::move(queue_[i]);
      ++kept;
    }
  }
  // queue_[1..kept) are left, queue_[kept..i) moved out or over, queue_[i..)
  // untouched: close the gap, then drop the front's empty slot.
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(kept),
               queue_.begin() + static_cast<std::ptrdiff_t>(i));
  queue_.pop_front();
  return batch;
}

Batch DynamicBatcher::Take(size_t max_requests, int64_t max_rows, size_t max_bytes) {
  base::MutexLock lock(&mu_);
  PromoteAgedLocked(clock_->Now());
  if (queue_.empty()) return {};
  size_t n = 0;
  int64_t rows = 0;
  size_t bytes = 0;  // at most max_bytes after the first request
  const std::vector<int64_t>& shape = queue_.front()->shape_key;
  for (const auto& r : queue_) {
    if (n >= max_requests) break;
    if (r->shape_key != shape) continue;  // another shape: a later batch
    if (n > 0 && (rows + r->rows > max_rows || bytes > max_bytes || r->bytes > max_bytes - bytes)) {
      break;
    }
    rows += r->rows;
    bytes += r->bytes;
    ++n;
  }
  return ExtractLocked(n);
}

base::Clock::TimePoint DynamicBatcher::NextWake() const {
  base::MutexLock lock(&mu_);
  return NextWakeLocked();
}

base::Clock::TimePoint DynamicBatcher::Poll() {
  while (true) {
    std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>> dropped;
    Batch batch;
    base::Clock::TimePoint next;
    {
      base::MutexLock lock(&mu_);
      const base::Clock::TimePoint now = clock_->Now();
      dropped = DropExpiredLocked(now);
      if (!stopped_ && can_dispatch_) {
        bool full = true;
        size_t n = DueBatchSize(now, &full);
        if (n > 0 && can_dispatch_(full)) batch = ExtractLocked(n);
      }
      next = NextWakeLocked();
    }
    for (auto& [request, status] : dropped) {
      if (request->reject) request->reject(status);
    }
    if (batch.empty()) return next;
    dispatch_(std::move(batch));
  }
}

bool DynamicBatcher::Cancel(const BatchRequest* request, const absl::Status& why) {
  std::shared_ptr<BatchRequest> found;
  {
    base::MutexLock lock(&mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [&](const auto& r) { return r.get() == request; });
    if (it == queue_.end()) return false;
    found = std::move(*it);
    queue_.erase(it);
  }
  if (found->reject) found->reject(why);
  return true;
}

void DynamicBatcher::Stop(const absl::Status& why) {
  std::deque<std::shared_ptr<BatchRequest>> queued;
  {
    base::MutexLock lock(&mu_);
    stopped_ = true;
    queued.swap(queue_);
  }
  for (auto& r : queued) {
    if (r->reject) r->reject(why);
  }
}

size_t DynamicBatcher::RejectAll(const absl::Status& why) {
  std::deque<std::shared_ptr<BatchRequest>> queued;
  {
    base::MutexLock lock(&mu_);
    queued.swap(queue_);
  }
  for (auto& r : queued) {
    if (r->reject) r->reject(why);
  }
  return queued.size();
}

size_t DynamicBatcher::queued_requests() const {
  base::MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace numaserve::serving
