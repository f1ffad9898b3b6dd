// PeriodicTask: runs a function on a thread of its own every period, until
// Stop() or destruction. Stop() wakes the thread at once and waits for a
// run under way to end. The waits are on the steady clock (base::CondVar).
// The shape of every periodic thread of the server: the resident-memory
// sampler and the systemd watchdog (tools/numaserve/serve_command.cc) and
// the repository poll (serving/scheduling/model_manager.cc).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace numaserve::base {

class PeriodicTask {
 public:
  // Whether the first run comes at once or after one period.
  enum class FirstRun { kNow, kAfterPeriod };

  // Starts the thread; for a period of zero or less there is none, and
  // Stop() has nothing to do. `task` must not call Stop().
  PeriodicTask(std::chrono::microseconds period, std::function<void()> task,
               FirstRun first = FirstRun::kNow);
  ~PeriodicTask() { Stop(); }
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

  // No run starts after it returns. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop(std::chrono::microseconds period, FirstRun first) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits out `period`: true when it is over, false when Stop() came first.
  bool WaitPeriod(std::chrono::microseconds period) ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<void()> task_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is initialised
};

}  // namespace numaserve::base
