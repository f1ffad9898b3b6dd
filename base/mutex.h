// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations, so that `make tidy` (-Wthread-safety)
// checks every access to state declared ABSL_GUARDED_BY a Mutex. The names
// and calls are absl's (Lock, Unlock, MutexLock(&mu), CondVar::Wait(&mu),
// Signal, SignalAll). Why not absl::Mutex itself, as packaged by Debian
// (Abseil 20220623):
//  - ThreadSanitizer cannot see it: its locking runs inside a library built
//    without TSan, so `make test-tsan` would report every guarded access
//    as a race. pthread mutexes are intercepted.
//  - Its timed waits turn a timeout into a wall-clock deadline, which a
//    step of the system clock (NTP at boot, a resumed VM) would stretch;
//    std::condition_variable waits on the steady clock.
//  - Its lock-order checker is built in: a global lock on every Lock (35 ns
//    instead of 6 uncontended on a Zen 4). TSan finds inversions instead.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace numaserve::base {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds the mutex, where it cannot follow
  // (a lambda run under the lock). It checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable for a Mutex. Each wait releases the mutex, waits for
// a Signal (or a spurious wake-up) and takes the mutex again; callers loop
// on their condition. Timed waits run on the steady clock.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // True when `timeout` ran out.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool timed_out = cv_.wait_for(lock, timeout) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  // True when `deadline` has passed.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool timed_out = cv_.wait_until(lock, deadline) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace numaserve::base
