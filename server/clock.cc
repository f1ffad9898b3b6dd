#include "server/clock.h"

namespace numaserve::server {
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

}  // namespace numaserve::server
