// Time as the batcher sees it: the real steady clock in the server, a fake
// one that tests advance by hand (so batching tests never sleep).
#pragma once

#include <atomic>
#include <chrono>

namespace numaserve::base {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // The process-wide steady clock.
  static const Clock* Real();
};

// Stands still until Advance(); thread-safe.
class FakeClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_.load())); }
  void Advance(Duration d) { now_ += d.count(); }

 private:
  std::atomic<Duration::rep> now_{Duration(std::chrono::hours(1)).count()};
};

}  // namespace numaserve::base
