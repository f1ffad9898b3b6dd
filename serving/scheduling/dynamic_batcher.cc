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
    queue_.push_back(std::move(request));
  }
  const base::Clock::TimePoint next = Poll();
  if (next_poll != nullptr) *next_poll = next;
  return absl::OkStatus();
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
  for (const auto& r : queue_) {
    if (count > 0 && total + r->rows > options_.max_batch_rows) return count;  // full
    total += r->rows;
    ++count;
    if (!preferred.empty() && is_preferred(total)) best = count;
    if (total >= options_.max_batch_rows) return count;  // full
  }
  if (best == count) return count;  // a preferred size
  if (now - queue_.front()->enqueued < options_.max_queue_delay) return 0;
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
  const base::Clock::TimePoint delay_end = queue_.front()->enqueued + options_.max_queue_delay;
  if (delay_end > now) next = delay_end;
  for (const auto& r : queue_) next = std::min(next, r->deadline);
  return next;
}

std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>>
DynamicBatcher::DropExpiredLocked(base::Clock::TimePoint now) {
  std::vector<std::pair<std::shared_ptr<BatchRequest>, absl::Status>> dropped;
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

Batch DynamicBatcher::Take(size_t max_requests, int64_t max_rows, size_t max_bytes) {
  base::MutexLock lock(&mu_);
  size_t n = 0;
  int64_t rows = 0;
  size_t bytes = 0;  // at most max_bytes after the first request
  while (n < queue_.size() && n < max_requests &&
         (n == 0 || (rows + queue_[n]->rows <= max_rows && bytes <= max_bytes &&
                     queue_[n]->bytes <= max_bytes - bytes))) {
    rows += queue_[n]->rows;
    bytes += queue_[n]->bytes;
    ++n;
  }
  Batch batch(std::make_move_iterator(queue_.begin()),
              std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  return batch;
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
        if (n > 0 && can_dispatch_(full)) {
          batch.assign(std::make_move_iterator(queue_.begin()),
                       std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
          queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
        }
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
