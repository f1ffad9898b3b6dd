// base::PeriodicTask: it runs again and again, first at once or after a
// period, Stop() wakes it however long the period and no run starts after
// Stop() returns, and a period of zero starts nothing.
#include "base/periodic_task.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace numaserve::base {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Waits up to 10 s for `count` to reach `n`.
bool ReachesWithin10s(const std::atomic<int>& count, int n) {
  const auto deadline = steady_clock::now() + std::chrono::seconds(10);
  while (count.load() < n) {
    if (steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(PeriodicTaskTest, RunsEveryPeriodUntilStopped) {
  std::atomic<int> runs{0};
  PeriodicTask task(milliseconds(1), [&] { ++runs; });
  ASSERT_TRUE(ReachesWithin10s(runs, 3));
  task.Stop();
  const int after_stop = runs.load();
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(runs.load(), after_stop);  // no run after Stop() returned
  task.Stop();                         // again: nothing to do
}

TEST(PeriodicTaskTest, StopWakesAWaitOfAnHour) {
  std::atomic<int> runs{0};
  PeriodicTask task(hours(1), [&] { ++runs; });
  ASSERT_TRUE(ReachesWithin10s(runs, 1));  // the first run comes at once
  const auto t0 = steady_clock::now();
  task.Stop();
  EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(runs.load(), 1);
}

TEST(PeriodicTaskTest, AfterPeriodWaitsBeforeTheFirstRun) {
  std::atomic<int> runs{0};
  {
    PeriodicTask task(hours(1), [&] { ++runs; }, PeriodicTask::FirstRun::kAfterPeriod);
    std::this_thread::sleep_for(milliseconds(20));
  }  // the destructor stops it
  EXPECT_EQ(runs.load(), 0);
  PeriodicTask soon(milliseconds(1), [&] { ++runs; }, PeriodicTask::FirstRun::kAfterPeriod);
  EXPECT_TRUE(ReachesWithin10s(runs, 2));
}

TEST(PeriodicTaskTest, AZeroPeriodStartsNothing) {
  std::atomic<int> runs{0};
  PeriodicTask task(milliseconds(0), [&] { ++runs; });
  std::this_thread::sleep_for(milliseconds(20));
  task.Stop();
  EXPECT_EQ(runs.load(), 0);
}

}  // namespace
}  // namespace numaserve::base
