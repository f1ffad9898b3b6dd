// Internal to the worker process, shared by serving/workers/worker_main.cc (the
// Worker's loads) and serving/workers/worker_instances.cc (their definitions): a
// model's copies on shares of the worker's cores (InstancePool) and the
// throughput measurement behind instances_per_domain: auto. Nothing else
// includes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "engine/model.h"
#include "serving/workers/shared_arena.h"
#include "worker.pb.h"

namespace numaserve::serving::worker_internal {

// instances_per_domain: auto. Each candidate count n is timed with its n
// copies running at once (RowsPerSecondOnShares), each at kAutoRows rows (1
// for a model that does not batch): one warm-up run, then runs until at
// least kAutoMinRuns took kAutoMinSeconds, or kAutoMaxSeconds passed (a big
// model's load stays within seconds).
inline constexpr int64_t kAutoRows = 8;
inline constexpr int kAutoMinRuns = 3;
inline constexpr double kAutoMinSeconds = 0.2;
inline constexpr double kAutoMaxSeconds = 0.5;

// Rows per second of `model` run back to back at `rows` rows on the calling
// thread (and its OpenMP team), on zeroed inputs.
absl::StatusOr<double> RowsPerSecond(engine::CompiledModel& model, int64_t rows);

// The rows per second `shares.size()` copies of the model make together,
// each compiled and run as an instance on its share: on its own thread
// pinned to the share, with an OpenMP team of one thread per core of the
// share, each pinned to its core. The copies compile first, then all run at
// once, so that each sees the memory bandwidth and clock its siblings take
// (on a 16-core Xeon one single-thread copy alone ran ResNet-50 at 19.7
// rows/s, sixteen at once at 15.6 each).
absl::StatusOr<double> RowsPerSecondOnShares(const std::string& path,
                                             const engine::CompileOptions& options,
                                             const std::vector<std::vector<int>>& shares,
                                             int64_t rows);

// Copies of one model (config.pbtxt instance_placement.instances_per_domain
// > 1), each owned by its own thread pinned to a disjoint share of the
// worker's cores, with an OpenMP team of that many threads (the team is
// the calling thread's own: libgomp keeps a thread pool per thread that
// starts parallel regions). Batches queue here and the first free copy
// takes the next; its thread writes the reply.
class InstancePool {
 public:
  using ReplyFn = std::function<void(const worker::Reply&)>;

  // `pinned`: the worker is bound to its cores. When it is not (a
  // synthetic topology's cpus, bindings advisory), each copy's pinning is
  // tried and a failure is not an error.
  InstancePool(int worker, std::string key, SharedArena* arena,
               std::chrono::microseconds min_compute, bool pinned, ReplyFn reply)
      : worker_(worker),
        key_(std::move(key)),
        arena_(arena),
        min_compute_(min_compute),
        pinned_(pinned),
        reply_(std::move(reply)) {}

  ~InstancePool() ABSL_LOCKS_EXCLUDED(mu_);

  // Starts `shares.size()` copies, one after the other (each compiles on its
  // own thread, inside its cores, so its weights are first touched there).
  // On error the copies already started are stopped by the destructor.
  // Each copy runs `load`'s warm-ups (RunWarmups) before it counts as
  // started; the first copy's report is warmup_report().
  absl::Status Start(const std::string& path, const engine::CompileOptions& options,
                     const std::vector<std::vector<int>>& shares, int64_t* weight_bytes,
                     const worker::LoadModel& load);

  // The first copy's DescribeInt8Kernels (every copy compiles alike).
  const std::string& int8_note() const { return int8_note_; }
  // The first copy's warm-ups, as RunWarmups reports them; empty without.
  const std::string& warmup_report() const { return warmup_report_; }

  void Submit(worker::Command command) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Serve(int instance, engine::CompiledModel* model) ABSL_LOCKS_EXCLUDED(mu_);

  const int worker_;
  const std::string key_;
  SharedArena* const arena_;
  const std::chrono::microseconds min_compute_;
  const bool pinned_;
  const ReplyFn reply_;
  std::vector<std::thread> threads_;
  std::string int8_note_;      // written by copy 0's thread before Start reads it
  std::string warmup_report_;  // likewise
  base::Mutex mu_;
  base::CondVar cv_;
  std::deque<worker::Command> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace numaserve::serving::worker_internal
