// Where each batch's inputs are copied into its worker's shared arena
// (serve --input-copy). By default the thread that forms the batch makes
// the copy (a gRPC or HTTP thread, the scheduler's timer, a supervisor
// thread); with `node`, each worker has a thread of its own on its NUMA
// node ("copier-N"), so the arena's pages are written by a cpu of the node
// they lie on and the bytes cross the socket link as reads.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "affinity/placement.h"
#include "base/mutex.h"

namespace numaserve::serving {

enum class InputCopy { kAuto, kCaller, kNode };

// "auto" | "caller" | "node"; anything else is INVALID_ARGUMENT naming it.
absl::StatusOr<InputCopy> ParseInputCopy(const std::string& text);

// Per worker of `plan`, the cpus of its copier thread; an empty list means
// the caller copies. kNode: the worker's supervisor cpus (the front end's
// cpus on its node, where --frontend-cpus gives some), else the worker's
// own cpus. kAuto: kNode when the plan has front-end cpus and its workers
// span more than one NUMA node (where a remote write is there to save),
// kCaller otherwise (one node: every thread already writes locally, and a
// hand-off would only add a wake-up).
std::vector<std::vector<int>> InputCopyCpus(const affinity::Plan& plan, InputCopy mode);

// One thread that runs posted closures in order, named and pinned.
class CopierThread {
 public:
  // Starts the thread "copier-<index>", pinned to `cpus` (a pin that fails
  // is logged; the thread then runs where the process may).
  CopierThread(int index, std::vector<int> cpus);
  // Stop().
  ~CopierThread();
  CopierThread(const CopierThread&) = delete;
  CopierThread& operator=(const CopierThread&) = delete;

  // Runs `work` on the thread after what was posted before it; once
  // stopped, on the calling thread at once (nothing posted is dropped).
  void Post(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs what is queued, then joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<int>& cpus() const { return cpus_; }

 private:
  void Loop(int index) ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<int> cpus_;
  base::Mutex mu_;
  base::CondVar cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is initialised
};

}  // namespace numaserve::serving
