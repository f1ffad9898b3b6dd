#include "server/worker_main.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/cpu_features.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "engine/model.h"
#include "server/args.h"
#include "server/framing.h"
#include "server/model_config.h"
#include "server/shared_arena.h"
#include "worker.pb.h"

namespace numaserve::server {
namespace {

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

std::string OpenMpEnvironmentSeen() {
  std::string out;
  for (const char* name :
       {"OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "OMP_WAIT_POLICY", "KMP_AFFINITY",
        "KMP_BLOCKTIME", "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT"}) {
    if (const char* v = getenv(name)) absl::StrAppend(&out, out.empty() ? "" : " ", name, "=", v);
  }
  return out;
}

absl::Status PinThisThread(const std::vector<int>& cpus) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &mask);
  }
  int rc = pthread_setaffinity_np(pthread_self(), sizeof(mask), &mask);
  if (rc != 0) return absl::InternalError(absl::StrCat("pthread_setaffinity_np: ", strerror(rc)));
  return absl::OkStatus();
}

// Pins each thread of a new OpenMP team of cpus.size() threads to its own
// cpu of `cpus` (thread 0, the caller, is already pinned to the share).
void PinTeam(const std::vector<int>& cpus) {
  const int n = static_cast<int>(cpus.size());
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    if (t > 0 && t < n) (void)PinThisThread({cpus[t]});
  }
}

// Copies of one model (config.pbtxt instance_placement.instances_per_domain
// > 1), each owned by its own thread pinned to a disjoint share of the
// worker's cores, with an OpenMP team of that many threads (the team is
// the calling thread's own: libgomp keeps a thread pool per thread that
// starts parallel regions). Batches queue here and the first free copy
// takes the next; its thread writes the reply.
class InstancePool {
 public:
  using ReplyFn = std::function<void(const worker::Reply&)>;

  InstancePool(int worker, std::string key, SharedArena* arena, ReplyFn reply)
      : worker_(worker), key_(std::move(key)), arena_(arena), reply_(std::move(reply)) {}

  ~InstancePool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();  // each drains the queue first
  }

  // Starts `shares.size()` copies, one after the other (each compiles on its
  // own thread, inside its cores, so its weights are first touched there).
  // On error the copies already started are stopped by the destructor.
  absl::Status Start(const std::string& path, const engine::CompileOptions& options,
                     const std::vector<std::vector<int>>& shares, int64_t* weight_bytes) {
    for (size_t i = 0; i < shares.size(); ++i) {
      std::mutex started_mu;
      std::condition_variable started_cv;
      std::optional<absl::Status> started;
      threads_.emplace_back([&, i]() {
        std::unique_ptr<engine::CompiledModel> model;
        absl::Status s = PinThisThread(shares[i]);
        if (s.ok()) {
          engine::CompileOptions own = options;
          own.num_threads = static_cast<int>(shares[i].size());
          omp_set_num_threads(own.num_threads);
          // Pin the team too, one thread per core of the share, before the
          // model's first parallel region: OMP_PROC_BIND places its threads
          // on the worker's places, not the share's. libgomp keeps these
          // threads for every later region this thread starts.
          PinTeam(shares[i]);
          auto loaded = engine::CompiledModel::Load(path, own);
          if (loaded.ok()) {
            model = *std::move(loaded);
            *weight_bytes += model->info().parameter_bytes;
          } else {
            s = loaded.status();
          }
        }
        {
          // Notified under the lock: Start() may return (and these locals
          // go away) as soon as it can take the lock again.
          std::lock_guard<std::mutex> lock(started_mu);
          started = s;
          started_cv.notify_all();
        }
        if (model) Serve(static_cast<int>(i), model.get());
      });
      std::unique_lock<std::mutex> lock(started_mu);
      started_cv.wait(lock, [&] { return started.has_value(); });
      if (!started->ok()) return *started;
      fprintf(stderr, "numaserve: worker %d: %s: instance %zu of %zu on cpus %s (%zu threads)\n",
              worker_, key_.c_str(), i + 1, shares.size(),
              affinity::FormatCpuList(shares[i]).c_str(), shares[i].size());
    }
    return absl::OkStatus();
  }

  void Submit(worker::Command command) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(command));
    }
    cv_.notify_one();
  }

 private:
  void Serve(int instance, engine::CompiledModel* model) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      worker::Command command = std::move(queue_.front());
      queue_.pop_front();
      const int running = ++running_;
      if (running > peak_) {
        peak_ = running;
        // Once per new peak: how many batches of this model computed at once.
        fprintf(stderr, "numaserve: worker %d: %s: %d batches computing at once\n", worker_,
                key_.c_str(), running);
      }
      lock.unlock();
      worker::Reply reply;
      reply.set_id(command.id());
      RunBatchOn(*model, *arena_, command.run(), &reply);
      lock.lock();
      --running_;
      lock.unlock();
      reply_(reply);
      lock.lock();
    }
  }

  const int worker_;
  const std::string key_;
  SharedArena* const arena_;
  const ReplyFn reply_;
  std::vector<std::thread> threads_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<worker::Command> queue_;
  bool stop_ = false;
  int running_ = 0;
  int peak_ = 0;
};

class Worker {
 public:
  Worker(int index, SharedArena* arena, std::vector<int> cpus)
      : index_(index), arena_(arena), cpus_(std::move(cpus)) {}

  // Serves commands until the server closes the socket.
  int Serve() {
    worker::Command command;
    while (true) {
      absl::Status s = ReadFramed(kWorkerControlFd, &command);
      if (!s.ok()) break;  // the server went away or shut us down
      worker::Reply reply;
      reply.set_id(command.id());
      switch (command.kind_case()) {
        case worker::Command::kLoad:
          Load(command.load(), &reply);
          break;
        case worker::Command::kRun:
          if (auto it = pools_.find(command.run().key()); it != pools_.end()) {
            it->second->Submit(std::move(command));  // its thread replies
            continue;
          }
          Run(command.run(), &reply);
          break;
        case worker::Command::kUnload:
          models_.erase(command.unload().key());
          pools_.erase(command.unload().key());  // finishes its queued batches first
          reply.set_ok(true);
          break;
        default:
          reply.set_error("unknown command");
      }
      if (!Reply(reply)) break;
    }
    pools_.clear();
    return 0;
  }

 private:
  bool Reply(const worker::Reply& reply) {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (!write_ok_) return false;
    write_ok_ = WriteFramed(kWorkerControlFd, reply).ok();
    return write_ok_;
  }

  void Load(const worker::LoadModel& load, worker::Reply* reply) {
    auto start = std::chrono::steady_clock::now();
    // config.pbtxt's gemm_backend, else `numaserve serve --gemm` (passed
    // down as NUMASERVE_GEMM), else auto.
    engine::CompileOptions options;
    options.gemm_backend = load.gemm_backend();
    if (options.gemm_backend.empty()) {
      const char* fallback = getenv("NUMASERVE_GEMM");
      options.gemm_backend = fallback != nullptr && *fallback != '\0' ? fallback : "auto";
    }
    options.gemm_cache_file = engine::DefaultGemmCacheFile();
    if (load.instances() > 1) return LoadInstances(load, options, start, reply);
    auto model = engine::CompiledModel::Load(load.path(), options);
    reply->set_load_ns(NanosSince(start));
    if (!model.ok()) {
      reply->set_error(std::string(model.status().message()));
      fprintf(stderr, "worker %d: cannot load %s: %s\n", index_, load.key().c_str(),
              std::string(model.status().message()).c_str());
      return;
    }
    if (options.gemm_backend != "auto") {
      fprintf(stderr, "numaserve: worker %d: %s: gemm backend %s\n", index_, load.key().c_str(),
              options.gemm_backend.c_str());
    }
    reply->set_weight_bytes((*model)->info().parameter_bytes);
    pools_.erase(load.key());
    models_[load.key()] = *std::move(model);
    reply->set_ok(true);
  }

  // N copies on N disjoint shares of this worker's cores (the first
  // cores % N shares get one core more).
  void LoadInstances(const worker::LoadModel& load, const engine::CompileOptions& options,
                     std::chrono::steady_clock::time_point start, worker::Reply* reply) {
    const int n = load.instances();
    const std::string name = load.key().substr(0, load.key().rfind(':'));
    absl::Status s = CheckInstancesFit(name, n, index_, static_cast<int>(cpus_.size()));
    std::vector<std::vector<int>> shares(n);
    for (size_t c = 0; s.ok() && c < cpus_.size(); ++c) {
      shares[c * n / cpus_.size()].push_back(cpus_[c]);
    }
    int64_t weight_bytes = 0;
    auto pool = std::make_unique<InstancePool>(index_, load.key(), arena_,
                                               [this](const worker::Reply& r) { Reply(r); });
    if (s.ok()) s = pool->Start(load.path(), options, shares, &weight_bytes);
    reply->set_load_ns(NanosSince(start));
    if (!s.ok()) {
      reply->set_error(std::string(s.message()));
      fprintf(stderr, "worker %d: cannot load %s: %s\n", index_, load.key().c_str(),
              std::string(s.message()).c_str());
      return;
    }
    reply->set_weight_bytes(weight_bytes);
    models_.erase(load.key());
    pools_[load.key()] = std::move(pool);
    reply->set_ok(true);
  }

  void Run(const worker::RunBatch& run, worker::Reply* reply) {
    auto it = models_.find(run.key());
    if (it == models_.end()) {
      reply->set_error(absl::StrCat("model ", run.key(), " is not loaded on this worker"));
      return;
    }
    RunBatchOn(*it->second, *arena_, run, reply);
  }

  int index_;
  SharedArena* arena_;
  std::vector<int> cpus_;  // the cores this worker is bound to
  std::mutex write_mu_;    // replies come from the serving thread and the pools' threads
  bool write_ok_ = true;
  std::map<std::string, std::unique_ptr<engine::CompiledModel>> models_;
  std::map<std::string, std::unique_ptr<InstancePool>> pools_;  // instances_per_domain > 1
};

}  // namespace

void RunBatchOn(engine::CompiledModel& model, const SharedArena& arena, const worker::RunBatch& run,
                worker::Reply* reply) {
  auto in_arena = [&](const worker::TensorSlice& slice) {
    return slice.offset() <= arena.size() && slice.bytes() <= arena.size() - slice.offset();
  };
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  std::vector<size_t> input_bytes, output_bytes;
  for (const auto& slice : run.inputs()) {
    if (!in_arena(slice)) return reply->set_error("input slice outside the arena");
    inputs.push_back(arena.data() + slice.offset());
    input_bytes.push_back(static_cast<size_t>(slice.bytes()));
  }
  for (const auto& slice : run.outputs()) {
    if (!in_arena(slice)) return reply->set_error("output slice outside the arena");
    outputs.push_back(arena.data() + slice.offset());
    output_bytes.push_back(static_cast<size_t>(slice.bytes()));
  }
  // The engine reads and writes whole tensors: a slice of another size
  // would read another request's bytes or write over them.
  if (absl::Status s = model.CheckBufferSizes(run.batch(), input_bytes, output_bytes); !s.ok()) {
    return reply->set_error(absl::StrCat("the server's buffers do not fit the model (", run.key(),
                                         " at batch ", run.batch(), "): ", s.message()));
  }
  auto start = std::chrono::steady_clock::now();
  absl::Status s = model.Run(run.batch(), inputs, outputs);
  reply->set_compute_ns(NanosSince(start));
  if (!s.ok()) return reply->set_error(std::string(s.message()));
  reply->set_ok(true);
}

int WorkerCommand(const std::vector<std::string>& args) {
  // Die with the server: a worker never outlives the process that feeds it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The server decides when workers stop (it drains first): a SIGINT or
  // SIGTERM sent to the whole process group (a terminal's ^C, systemd's
  // control-group kill) must not end accepted work here.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);

  std::string cpus_text;
  int64_t index = 0, node = -1, arena_bytes = 0;
  ArgParser parser("worker", "Internal: one worker process, started by `numaserve serve`.");
  parser.AddInt("index", &index, "worker index");
  parser.AddString("cpus", &cpus_text, "cpus to bind to, e.g. 0-7");
  parser.AddInt("numa-node", &node, "NUMA node for memory, -1 for none");
  parser.AddInt("arena-bytes", &arena_bytes, "size of the shared arena at fd 4");
  if (absl::Status s = parser.Parse(args); !s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }

  // 1. Pin, before any OpenMP or oneDNN code runs in this process.
  worker::Reply hello;
  worker::Hello* h = hello.mutable_hello();
  h->set_worker_index(static_cast<int>(index));
  h->set_pid(getpid());
  auto cpus = affinity::ParseCpuList(cpus_text);
  if (!cpus.ok()) {
    h->set_bind_warning(std::string(cpus.status().message()));
  } else if (absl::Status s = affinity::BindProcess(*cpus, static_cast<int>(node)); !s.ok()) {
    h->set_bind_warning(std::string(s.message()));
  }

  // 2. Map the arena and bind its pages to this worker's node.
  auto arena = SharedArena::Attach(kWorkerArenaFd, static_cast<size_t>(arena_bytes));
  if (!arena.ok()) {
    fprintf(stderr, "worker %ld: %s\n", index, std::string(arena.status().message()).c_str());
    return 1;
  }
  if (absl::Status s =
          affinity::BindMemoryToNode((*arena)->data(), (*arena)->size(), static_cast<int>(node));
      !s.ok() && h->bind_warning().empty()) {
    h->set_bind_warning(std::string(s.message()));
  }

  h->set_binding(affinity::DescribeBinding());
  h->set_environment(OpenMpEnvironmentSeen());
  h->set_isa(affinity::FeatureList(affinity::GetCpuFeatures()));
  hello.set_ok(true);
  fprintf(stderr, "worker %ld pid %d: %s; %s%s%s\n", index, getpid(), h->binding().c_str(),
          h->environment().c_str(),
          h->bind_warning().empty() ? "" : "; warning: ", h->bind_warning().c_str());
  if (!WriteFramed(kWorkerControlFd, hello).ok()) return 1;

  // 3. Serve.
  // The worker's cores, for models with several instances: those it is
  // actually bound to (the --cpus list when pinning failed).
  std::vector<int> own_cpus;
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mask)) own_cpus.push_back(c);
    }
  }
  if (own_cpus.empty() && cpus.ok()) own_cpus = *cpus;
  Worker worker(static_cast<int>(index), arena->get(), std::move(own_cpus));
  return worker.Serve();
}

}  // namespace numaserve::server
