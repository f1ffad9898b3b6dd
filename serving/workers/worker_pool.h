// The scheduler's view of the worker processes: which worker is ready,
// which models it holds with how many instances (slots), and a way to run
// a formed batch on one of them. `SupervisedWorkerPool` is the real one: it
// gathers the batch's inputs straight into the worker's shared arena (the
// one copy on the way in) and carries the command over the worker's control
// socket; unit tests of the scheduler put a fake pool behind the same
// interface.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "base/clock.h"
#include "serving/workers/input_copier.h"

namespace numaserve::serving {

class WorkerSupervisor;

// One formed batch on its way to a worker.
struct InferenceTask {
  std::string model_key;  // "name:version"
  int64_t rows = 0;
  double flops = 0;  // for the worker's FLOP counter
  // Per model input (in model order), the pieces that make up the tensor:
  // each request's (one, or several where its transport received it in
  // pieces), laid end to end in the arena. They must outlive the task.
  std::vector<std::vector<std::pair<const char*, size_t>>> inputs;
  std::vector<size_t> output_bytes;  // per model output
  // A shape-polymorphic model's signature: every input's shape for this
  // run, dim 0 of a batched input at `rows` (worker::RunBatch::input_shapes).
  // Empty for a model whose only dynamic dims are dims 0.
  std::vector<std::vector<int64_t>> input_shapes;
  base::Clock::TimePoint deadline = base::Clock::TimePoint::max();
  int attempts = 0;  // runs started (the scheduler retries a lost one once)
  // A request of the batch asked for its step profile: the worker times
  // every step of this run only and answers RunOutcome::profile_json.
  bool profile = false;
};

// How a run ended.
struct RunOutcome {
  // OK; the engine's error with the engine's code; or UNAVAILABLE with
  // `lost` set when the worker exited before answering.
  absl::Status status;
  // The worker died under the batch (inference is idempotent: it may run
  // again elsewhere), or was not ready when the batch was sent (it never
  // ran).
  bool lost = false;
  bool not_sent = false;
  // On success, output i in the worker's arena: valid only during the call.
  std::vector<const char*> outputs;
  double input_seconds = 0;    // gathering the inputs into the worker's arena
  double compute_seconds = 0;  // inside the worker, the engine's run
  int instance = 0;            // the model instance that computed it
  // On success of a task with `profile`: the run's step profile, one JSON
  // object (worker::Reply::profile_json); empty otherwise.
  std::string profile_json;
};

class WorkerPool {
 public:
  using RunDoneFn = std::function<void(const RunOutcome& outcome)>;

  virtual ~WorkerPool() = default;
  virtual int size() const = 0;
  virtual bool Ready(int worker) const = 0;
  virtual bool HasModel(int worker, const std::string& key) const = 0;
  // True when a worker that will hold `key` is on its way: starting,
  // restarting after a crash or still loading it (and the model is not
  // marked failed). Work for `key` may then wait for it; when no ready
  // worker holds `key` and this is false, nothing ever will.
  virtual bool ModelExpected(const std::string& key) const = 0;
  // Batches of `key` the worker computes at once (its instances; >= 1).
  virtual int Instances(int worker, const std::string& key) const = 0;
  virtual int NumaNode(int worker) const = 0;
  // Most worker memory (inputs + outputs) one batch may take: the
  // scheduler forms no larger batch and refuses a larger request at once.
  virtual size_t BatchBytesLimit() const = 0;
  // Starts `task` on `worker`. `done` runs exactly once, on any thread,
  // possibly before Run returns; it must not call Run itself. `task` stays
  // valid until `done` runs (the copy of its inputs may be made later, on
  // another thread: serve --input-copy).
  virtual void Run(int worker, const InferenceTask& task, RunDoneFn done) = 0;
};

// The worker processes of a WorkerSupervisor.
class SupervisedWorkerPool final : public WorkerPool {
 public:
  explicit SupervisedWorkerPool(WorkerSupervisor* workers);
  // StopCopiers().
  ~SupervisedWorkerPool() override;
  SupervisedWorkerPool(const SupervisedWorkerPool&) = delete;
  SupervisedWorkerPool& operator=(const SupervisedWorkerPool&) = delete;

  // `copier_cpus` (InputCopyCpus): per worker, the cpus of a thread that
  // copies its batches' inputs into its arena from then on; an empty list
  // (or none) leaves the copy to the thread calling Run. Called once, before
  // the first Run and after the front end's threads are pinned (a thread
  // started earlier would be moved to the front end's cpus with them).
  void StartCopiers(const std::vector<std::vector<int>>& copier_cpus);
  // Copies still queued are made and their batches sent (or, with the
  // workers stopped, answered as not sent); later runs copy on the caller's
  // thread. Idempotent.
  void StopCopiers();

  int size() const override;
  bool Ready(int worker) const override;
  bool HasModel(int worker, const std::string& key) const override;
  bool ModelExpected(const std::string& key) const override;
  int Instances(int worker, const std::string& key) const override;
  int NumaNode(int worker) const override;
  size_t BatchBytesLimit() const override;
  void Run(int worker, const InferenceTask& task, RunDoneFn done) override;

 private:
  // Run's work on the thread that copies: the inputs into the arena, the
  // command to the worker.
  void CopyAndSend(int worker, const InferenceTask& task, RunDoneFn done);

  WorkerSupervisor* const workers_;
  // Per worker: its copier, or null where the caller copies.
  std::vector<std::unique_ptr<CopierThread>> copiers_;
};

}  // namespace numaserve::serving
