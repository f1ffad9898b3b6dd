#include "base/clock.h"

namespace numaserve::base {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock* Clock::Real() {
  static const RealClock* const kClock = new RealClock();
  return kClock;
}

}  // namespace numaserve::base
