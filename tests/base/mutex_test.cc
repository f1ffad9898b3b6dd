// base::Mutex and base::CondVar: a waiter wakes on Signal with its
// condition true and the mutex held, timed waits report a timeout when
// nothing signals, SignalAll wakes every waiter, and MutexLock excludes.
// (A step of the system clock cannot be made here without root; the
// steady-clock waits exist for that case, see the header.)
#include "base/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace numaserve::base {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TEST(MutexTest, SignalWakesAWaiterWithItsConditionTrue) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread signaller([&] {
    std::this_thread::sleep_for(milliseconds(20));
    MutexLock lock(&mu);
    ready = true;
    cv.Signal();
  });
  {
    MutexLock lock(&mu);
    while (!ready) cv.Wait(&mu);
    EXPECT_TRUE(ready);
  }
  signaller.join();
}

TEST(MutexTest, TimedWaitsTimeOutWhenNothingSignals) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  const steady_clock::time_point start = steady_clock::now();
  EXPECT_TRUE(cv.WaitFor(&mu, milliseconds(30)));
  EXPECT_GE(steady_clock::now() - start, milliseconds(30));
  const steady_clock::time_point deadline = steady_clock::now() + milliseconds(30);
  EXPECT_TRUE(cv.WaitUntil(&mu, deadline));
  EXPECT_GE(steady_clock::now(), deadline);
}

TEST(MutexTest, TimedWaitReturnsFalseWhenSignalled) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread signaller([&] {
    std::this_thread::sleep_for(milliseconds(20));
    MutexLock lock(&mu);
    ready = true;
    cv.Signal();
  });
  bool timed_out = false;
  {
    MutexLock lock(&mu);
    // A minute: only the signal can end this wait within the test.
    while (!ready && !timed_out) timed_out = cv.WaitFor(&mu, std::chrono::minutes(1));
  }
  signaller.join();
  EXPECT_FALSE(timed_out);
  EXPECT_TRUE(ready);
}

TEST(MutexTest, SignalAllWakesEveryWaiter) {
  Mutex mu;
  CondVar cv;
  bool go = false;
  int woken = 0;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      MutexLock lock(&mu);
      while (!go) cv.Wait(&mu);
      ++woken;
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  {
    MutexLock lock(&mu);
    go = true;
    cv.SignalAll();
  }
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(woken, 4);
}

TEST(MutexTest, MutexLockExcludes) {
  Mutex mu;
  int64_t counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, 400000);
  EXPECT_TRUE(mu.TryLock());
  mu.Unlock();
}

}  // namespace
}  // namespace numaserve::base
