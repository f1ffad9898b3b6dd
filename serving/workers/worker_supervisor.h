// The server's side of the worker processes: spawns one per planned domain
// with its binding and OpenMP environment, loads the models into each,
// carries commands and replies over each worker's control socket, and
// restarts a worker that exits. Commands in flight on a lost worker are
// answered as lost, exactly once, so the caller can retry them elsewhere.
//
// Crash loops are bounded: a worker that dies is blamed on the oldest
// command it had not answered (it runs them in order; batches of models
// with several instances, which run beside them, only when nothing else
// was outstanding). When that was a model's load or one of its batches,
// the model is charged with the crash, whether or not it ran batches
// before (a request that kills the worker, by running it out of memory or
// otherwise, is retried once by the router and would kill it again). A
// model charged Options::max_model_crashes times within
// Options::crash_window is marked failed ("crashed the worker 2 times
// while running batches"), is no longer sent to any worker (restarted or
// not) and reports that reason through LoadError, while the other models
// keep loading and serving. Loading it again (LoadModel) clears its
// charges.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "affinity/placement.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "serving/workers/process_options.h"
#include "serving/workers/shared_arena.h"
#include "worker.pb.h"

namespace numaserve::serving {

class Metrics;

class WorkerSupervisor {
 public:
  struct Options {
    // The numaserve binary; workers run as `<executable> worker ...`.
    std::string executable = "/proc/self/exe";
    // Shared arena per worker: the largest batch's inputs plus outputs must
    // fit, times the commands in flight. Pages cost memory only when touched.
    // This is the size for the usual two commands in flight; a worker whose
    // models have N instances takes N + 1 and gets an arena of
    // ArenaBytesForBatches(arena_bytes, N + 1); for `auto` or `per_core`, N
    // is the worker's threads (the most it may choose).
    size_t arena_bytes = size_t{256} << 20;
    // Pause before restarting a worker that exited, so a worker that dies at
    // start-up does not spin.
    std::chrono::milliseconds restart_delay{250};
    // How long Stop() waits for a worker to exit before SIGKILL.
    std::chrono::milliseconds stop_grace{2000};
    // Worker deaths a model may cause, loading or running its batches,
    // within crash_window before it is marked failed and no longer sent (so
    // it is sent again after the first crash, once). At least 1.
    int max_model_crashes = 2;
    // How long a crash counts against its model: a worker killed now and
    // then (the kernel's OOM killer choosing it for another process's
    // memory, an operator's kill -9) while it ran some model's batch does
    // not add up, over days, to that model's failure, while a request that
    // crashes the worker does so twice within seconds (it is retried once).
    std::chrono::seconds crash_window{600};
    // The clock crash_window is measured on; null: base::Clock::Real().
    const base::Clock* clock = nullptr;
    // For scheduler tests only (`serve --test-batch-compute-us`): every batch
    // a worker computes takes at least this long, the worker's thread asleep
    // for the rest (`worker --test-batch-compute-us`), so many workers on
    // few cores each hold busy slots of a known length. 0: off.
    int64_t test_batch_compute_us = 0;
    // The server's process settings (process_options.h), handed to every
    // worker as flags (the kernel and model ones); a worker's environment
    // has none of their NUMASERVE_* variables.
    ProcessOptions process;
  };

  struct ModelToLoad {
    std::string key;           // "name:version"
    std::string name;          // for metrics labels
    std::string version;       // for metrics labels
    std::string path;          // model.onnx
    std::vector<int> workers;  // the workers that load it; empty: every worker
    std::string gemm_backend;  // config.pbtxt's, else serve --gemm's; empty: auto
    // config.pbtxt's instance_placement.instances_per_domain: copies of the
    // model per worker, each on its share of the worker's cores, running up
    // to this many batches at once (0 or 1: one copy on every core);
    // kInstancesAuto or kInstancesPerCore (serving/repository/model_config.h): each
    // worker resolves it at load and says what it chose (Instances()).
    int instances = 1;
    // config.pbtxt's precision: "" or "fp32", or "bf16" (the worker refuses
    // it where the CPU has no native BF16).
    std::string precision;
    // config.pbtxt's max_activation_bytes, else serve --max-activation-mb:
    // the activation bytes one run may need (the worker refuses a batch
    // needing more with RESOURCE_EXHAUSTED). 0: no limit.
    int64_t max_activation_bytes = 0;
    // config.pbtxt's model_warmup at the model's input shapes: each copy
    // runs them after it loads, before the load is answered.
    std::vector<worker::Warmup> warmups;
    bool LoadsOn(int worker) const;
  };

  // Called exactly once per command: with the worker's reply, or with
  // worker_lost = true (reply.error says why) if the worker exited first.
  using ReplyFn = std::function<void(const worker::Reply& reply, bool worker_lost)>;

  // `on_change` runs on a supervisor thread whenever a worker becomes ready,
  // is lost, or finishes a command other than a batch (a batch's reply
  // reaches the scheduler through its ReplyFn): the router's cue to
  // dispatch more work.
  static absl::StatusOr<std::unique_ptr<WorkerSupervisor>> Create(const Options& options,
                                                                  const affinity::Plan& plan,
                                                                  std::vector<ModelToLoad> models,
                                                                  Metrics* metrics,
                                                                  std::function<void()> on_change);
  ~WorkerSupervisor();

  // Starts every worker; returns once each has started and loaded its models
  // (or failed to), or after `timeout`.
  void Start(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(start_mu_);
  // Closes every control socket, waits for the workers, kills stragglers
  // after Options::stop_grace: a worker spawned but not yet started (no
  // hello) too, also one spawned while Stop() runs.
  void Stop();

  int size() const { return static_cast<int>(slots_.size()); }
  // The arena space of one batch (Options::arena_bytes is the size for two).
  size_t batch_bytes() const { return options_.arena_bytes / 2; }
  const affinity::WorkerPlacement& placement(int w) const { return slots_[w]->placement; }
  bool Ready(int w) const;
  bool HasModel(int w, const std::string& key) const;
  int Outstanding(int w) const;
  // Batches of `key` worker w computes at once: the copies it runs, as its
  // load reply said (auto and per_core resolved); 1 when it does not hold it.
  int Instances(int w, const std::string& key) const;
  // For `instances_per_domain: auto`: worker w's measurement behind its
  // choice ("1x2 threads 41.0 rows/s, 2x1 thread 70.2 rows/s -> 2"); empty
  // otherwise.
  std::string InstancesReport(int w, const std::string& key) const;
  // Where worker w's resident memory lay after its latest model load, pages
  // per NUMA node ("0=1234 1=5"); empty when unknown.
  std::string MemoryNodes(int w) const;
  // The worker process's pid from its spawn (before its hello) until it is
  // reaped; -1 between processes.
  pid_t Pid(int w) const;
  SharedArena& arena(int w) const { return *slots_[w]->arena; }
  ArenaAllocator& allocator(int w) const { return *slots_[w]->allocator; }

  // Sends `command` to worker w if it is ready; false (and `fn` is not
  // called) if it is not. The command id is assigned here.
  bool Send(int w, worker::Command command, ReplyFn fn);

  // Loads a model version on its workers while they serve (and on any worker
  // that restarts later); returns once every ready worker of its placement
  // has answered, or after `timeout`. OK if at least one worker has it;
  // otherwise the workers' reason.
  absl::Status LoadModel(const ModelToLoad& model, std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(models_mu_);
  // Forgets a model version: no worker is chosen for it from now on, and the
  // workers free it. Call it once nothing is in flight for it.
  void UnloadModel(const std::string& key) ABSL_LOCKS_EXCLUDED(models_mu_);

  // Why `key` failed to load on the workers, empty if it loaded somewhere;
  // for a model marked failed after crashing workers, that reason.
  std::string LoadError(const std::string& key) const ABSL_LOCKS_EXCLUDED(models_mu_);
  // True when some ready worker has `key` loaded.
  bool ModelAvailable(const std::string& key) const;
  // True when a worker that loads `key` is starting, restarting or still
  // loading it, and `key` is not marked failed: a worker will hold it
  // unless its load fails. Requests may wait for that worker.
  bool ModelExpected(const std::string& key) const ABSL_LOCKS_EXCLUDED(models_mu_);

 private:
  struct Slot {
    int index = 0;
    affinity::WorkerPlacement placement;
    std::unique_ptr<SharedArena> arena;
    std::unique_ptr<ArenaAllocator> allocator;
    std::thread thread;

    mutable base::Mutex mu;
    pid_t pid ABSL_GUARDED_BY(mu) = -1;
    int fd ABSL_GUARDED_BY(mu) = -1;
    bool ready ABSL_GUARDED_BY(mu) = false;
    bool started_once ABSL_GUARDED_BY(mu) = false;
    uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
    // A command in flight and the model it concerns, to blame a crash on.
    struct Pending {
      ReplyFn fn;
      std::string model;  // the key of a LoadModel or RunBatch; empty otherwise
      bool load = false;  // a LoadModel
      bool run = false;   // a RunBatch: its reply changes no worker's models or readiness
    };
    std::map<uint64_t, Pending> pending ABSL_GUARDED_BY(mu);
    std::set<std::string> models ABSL_GUARDED_BY(mu);
    // Of each loaded model, when > 1.
    std::map<std::string, int> instances ABSL_GUARDED_BY(mu);
    // Of `auto` models.
    std::map<std::string, std::string> instances_reports ABSL_GUARDED_BY(mu);
    std::string memory_nodes ABSL_GUARDED_BY(mu);  // of the latest load reply
    std::map<std::string, std::string> load_errors ABSL_GUARDED_BY(mu);
    // The models this worker process was sent while it started (before it
    // turned ready), compared with models_ each time they have all answered;
    // cleared when the process is lost.
    std::set<std::string> sent ABSL_GUARDED_BY(mu);
    base::Mutex write_mu;  // one writer at a time on fd
  };

  WorkerSupervisor(const Options& options, std::vector<ModelToLoad> models, Metrics* metrics,
                   std::function<void()> on_change);
  void Run(Slot* slot);  // spawn, load, serve, restart; one thread per slot
  // Sends the started worker every model it loads and has not been sent;
  // once all have answered it compares again with models_, loading what was
  // added and unloading what was removed meanwhile, until they agree: then
  // the worker turns ready (and Start() is told).
  void LoadModels(Slot* slot) ABSL_LOCKS_EXCLUDED(models_mu_, slot->mu);
  // LoadModels' comparison, under both locks: sends the unloads and loads
  // it finds; returns the number of loads sent.
  int SendMissingLoads(Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(models_mu_, slot->mu);
  // Hands each reply on `fd` to its command's callback until the worker's
  // end of the socket closes.
  void ServeReplies(Slot* slot, int fd) ABSL_LOCKS_EXCLUDED(models_mu_, slot->mu);
  // Reaps the exited worker `pid`, answers the commands it held (Lose) and
  // tells Start() and the router.
  void ReapWorker(Slot* slot, pid_t pid) ABSL_LOCKS_EXCLUDED(slot->mu, start_mu_);
  // The worker's command line: its index, cpus, NUMA node, arena size and
  // the server's log settings, its process settings (and
  // --test-batch-compute-us when set).
  std::vector<std::string> WorkerArgs(const Slot& slot) const;
  absl::StatusOr<pid_t> Spawn(Slot* slot, int* control_fd);
  bool SendLocked(Slot* slot, worker::Command command, ReplyFn fn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot->mu);
  // Forgets `key` on the slot (errors, instances) and, where the worker
  // holds it, sends the unload.
  void ForgetModelLocked(Slot* slot, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(slot->mu);
  // Answers the lost worker's commands; true when its death was charged to
  // a model that will be sent to it again (a load crash below the limit).
  bool Lose(Slot* slot, const std::string& why) ABSL_LOCKS_EXCLUDED(slot->mu);
  // Charges a crash to the model of `oldest` (the lost worker's command
  // blamed for it, see above), a load or a batch; marks the model failed at
  // the limit. True when the model will be sent again after a load crash.
  bool ChargeCrash(const Slot::Pending& oldest, const std::string& why)
      ABSL_LOCKS_EXCLUDED(models_mu_);
  // Frees a model marked failed on every worker that holds it.
  void UnloadFailed(const std::string& key) ABSL_LOCKS_EXCLUDED(models_mu_);
  // The LoadModel command for `model`.
  static worker::Command LoadCommand(const ModelToLoad& model);
  // Records a worker's answer to LoadCommand: the model it now holds, or why
  // it failed, and the load's metrics.
  void RecordLoad(Slot* slot, const ModelToLoad& model, const worker::Reply& reply)
      ABSL_LOCKS_EXCLUDED(slot->mu);

  const Options options_;
  mutable base::Mutex models_mu_;
  // What every (re)started worker loads.
  std::vector<ModelToLoad> models_ ABSL_GUARDED_BY(models_mu_);
  // A crash charged to a model: when, and whether it was loading.
  struct Crash {
    base::Clock::TimePoint at;
    bool load = false;
  };
  // The crashes charged per model key within Options::crash_window, oldest
  // first, and the keys marked failed with the reason.
  std::map<std::string, std::deque<Crash>> crashes_ ABSL_GUARDED_BY(models_mu_);
  std::map<std::string, std::string> failed_ ABSL_GUARDED_BY(models_mu_);
  Metrics* const metrics_;
  const std::function<void()> on_change_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::atomic<bool> stopping_{false};
  // Start() waits on start_cv_ under it; whoever sets a slot's started_once
  // signals under it too, so Start() never misses the signal.
  base::Mutex start_mu_;
  base::CondVar start_cv_;
};

}  // namespace numaserve::serving
