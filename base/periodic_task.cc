// PeriodicTask (periodic_task.h).
#include "base/periodic_task.h"

#include <utility>

namespace numaserve::base {

PeriodicTask::PeriodicTask(std::chrono::microseconds period, std::function<void()> task,
                           FirstRun first)
    : task_(std::move(task)) {
  if (period.count() > 0) thread_ = std::thread([this, period, first] { Loop(period, first); });
}

void PeriodicTask::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void PeriodicTask::Loop(std::chrono::microseconds period, FirstRun first) {
  if (first == FirstRun::kAfterPeriod && !WaitPeriod(period)) return;
  do {
    task_();
  } while (WaitPeriod(period));
}

bool PeriodicTask::WaitPeriod(std::chrono::microseconds period) {
  MutexLock lock(&mu_);
  const auto until = std::chrono::steady_clock::now() + period;
  while (!stopping_) {
    if (cv_.WaitUntil(&mu_, until)) break;  // the period is over
  }
  return !stopping_;  // a Stop() at the deadline wins
}

}  // namespace numaserve::base
