// The worker process (worker_main.h): WorkerCommand (its options, pinning,
// the arena, the Hello), the Worker's command loop and model table (load,
// run, unload; the count of instances for `auto`), and RunBatchOn. A
// model's copies (InstancePool) and their timing are in worker_instances.cc.
#include "serving/workers/worker_main.h"

#include <omp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "affinity/cpu_features.h"
#include "affinity/memory_bandwidth.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "base/args.h"
#include "base/log.h"
#include "base/mutex.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "serving/repository/model_config.h"
#include "serving/repository/model_repository.h"
#include "serving/workers/framing.h"
#include "serving/workers/process_options.h"
#include "serving/workers/shared_arena.h"
#include "serving/workers/warmup.h"
#include "serving/workers/worker_internal.h"
#include "worker.pb.h"

namespace numaserve::serving {

using base::Log;
using base::LogLevel;
using worker_internal::InstancePool;
using worker_internal::kAutoRows;
using worker_internal::RowsPerSecond;
using worker_internal::RowsPerSecondOnShares;

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

// Where this process's resident pages lie, per NUMA node ("0=1234 1=5");
// empty where /proc/self/numa_maps cannot be read.
std::string ReadMemoryNodes() {
  std::ifstream in("/proc/self/numa_maps");
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  return SumNumaMapsPages(text.str());
}

// The most copies whose measured throughput is at least this fraction of
// the best count's are chosen. Served, copies hold up better than their
// measurement at load says, and fewer, wider ones worse: the front end and
// the clients take cpu from the same cores, and a copy's whole OpenMP team
// waits at every operator for a thread that lost its core. MobileNetV2 on
// a 2-core AMX Xeon measured 398 rows/s as 1x2 threads and 407 as
// 2x1, and served 258 and 342; ResNet-50 on the 16-core Xeon measured 4x4
// 203 and 16x1 211 (one copy alone, times n), and served 171 and 221-235.
constexpr double kAutoTolerance = 0.95;

class Worker {
 public:
  Worker(int index, SharedArena* arena, std::vector<std::vector<int>> cores, bool pinned,
         std::chrono::microseconds min_compute, ProcessOptions process)
      : index_(index),
        arena_(arena),
        cores_(std::move(cores)),
        pinned_(pinned),
        process_(std::move(process)),
        min_compute_(min_compute) {}

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
          Unload(command.unload().key());
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
  bool Reply(const worker::Reply& reply) ABSL_LOCKS_EXCLUDED(write_mu_) {
    base::MutexLock lock(&write_mu_);
    if (!write_ok_) return false;
    write_ok_ = WriteFramed(kWorkerControlFd, reply).ok();
    return write_ok_;
  }

  void Load(const worker::LoadModel& load, worker::Reply* reply) {
    auto start = std::chrono::steady_clock::now();
    const ModelKeyParts key = SplitModelKey(load.key());  // the log's model and version
    absl::StatusOr<engine::CompileOptions> options = CompileOptionsFor(load);
    if (!options.ok()) {
      reply->set_error(std::string(options.status().message()));
      return;
    }
    int n = load.instances();
    absl::Status s = LoadCopies(load, *options, &n, reply);
    reply->set_load_ns(NanosSince(start));
    if (!s.ok()) {
      reply->set_error(std::string(s.message()));
      Log(LogLevel::kError, "worker",
          absl::StrCat("worker ", index_, ": cannot load ", load.key(), ": ", s.message()),
          {{"model", key.name},
           {"version", key.version},
           {"path", load.path()},
           {"error", s.message()}});
      return;
    }
    LogLoadNotes(load, key, *options);
    reply->set_instances(std::max(1, n));
    reply->set_memory_nodes(ReadMemoryNodes());
    reply->set_ok(true);
    const double seconds = static_cast<double>(reply->load_ns()) * 1e-9;
    Log(LogLevel::kDebug, "worker",
        absl::StrFormat("worker %d: %s loaded: %d instance(s), %d weight bytes, %.3f s", index_,
                        load.key(), reply->instances(), reply->weight_bytes(), seconds),
        {{"model", key.name},
         {"version", key.version},
         {"instances", reply->instances()},
         {"weight_bytes", reply->weight_bytes()},
         {"seconds", seconds}});
  }

  // Frees a model (a pool finishes its queued batches first); logs it when
  // the worker held it.
  void Unload(const std::string& key) {
    fits_.erase(key);
    if (models_.erase(key) + pools_.erase(key) == 0) return;
    const ModelKeyParts parts = SplitModelKey(key);
    Log(LogLevel::kDebug, "worker", absl::StrFormat("worker %d: %s unloaded", index_, key),
        {{"model", parts.name}, {"version", parts.version}});
  }

  // The compile options a load asks for, with the worker's --gemm-cache and
  // --profile-steps; an unknown precision is the load's error.
  absl::StatusOr<engine::CompileOptions> CompileOptionsFor(const worker::LoadModel& load) const {
    // config.pbtxt's gemm_backend, else `numaserve serve --gemm`, else
    // oneDNN for a BF16 model: the front end fills the load message
    // (ModelToLoadFor); empty: auto. The
    // engine refuses BF16 where the CPU has no native path (the reply's
    // error, which the model's status shows).
    engine::CompileOptions options;
    if (!load.precision().empty()) {
      auto precision = engine::PrecisionFromName(load.precision());
      if (!precision.ok()) return precision.status();
      options.precision = *precision;
    }
    options.gemm_backend = load.gemm_backend().empty() ? "auto" : load.gemm_backend();
    options.gemm_cache_file = process_.gemm_cache;
    options.profile_steps = process_.profile_steps;
    // --weights-node: the weights there, strict with --membind strict;
    // everything else stays under the worker's own binding.
    options.weights_numa_node = WeightsNode(process_);
    options.weights_numa_strict = process_.membind == "strict";
    if (load.max_activation_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_activation_bytes must be >= 0, got ", load.max_activation_bytes()));
    }
    options.max_activation_bytes = load.max_activation_bytes();
    return options;
  }

  // Resolves the copies `*n` (per_core: the cores; auto: measured, see
  // ChooseInstances) and loads the model as that many instances, or inline.
  absl::Status LoadCopies(const worker::LoadModel& load, const engine::CompileOptions& options,
                          int* n, worker::Reply* reply) {
    std::unique_ptr<engine::CompiledModel> model;  // compiled inline while measuring `auto`
    absl::Status s;
    if (*n == kInstancesPerCore) {
      *n = Cores();
    } else if (*n == kInstancesAuto) {
      auto chosen = ChooseInstances(load, options, &model, reply);
      s = chosen.status();
      if (s.ok()) *n = *chosen;
    }
    if (s.ok()) {
      s = *n > 1 ? LoadInstances(load, options, *n, reply)
                 : LoadInline(load, options, std::move(model), reply);
    }
    return s;
  }

  // The log's notes on a loaded model: its GEMM backend when not auto, its
  // int8 kernels' note, its precision when not FP32.
  void LogLoadNotes(const worker::LoadModel& load, const ModelKeyParts& key,
                    const engine::CompileOptions& options) {
    if (options.gemm_backend != "auto") {
      Log(LogLevel::kInfo, "worker",
          absl::StrCat("worker ", index_, ": ", load.key(), ": gemm backend ",
                       options.gemm_backend),
          {{"model", key.name}, {"version", key.version}, {"gemm_backend", options.gemm_backend}});
    }
    std::string int8_note;
    if (auto it = pools_.find(load.key()); it != pools_.end()) {
      int8_note = it->second->int8_note();
    } else if (auto m = models_.find(load.key()); m != models_.end()) {
      int8_note = m->second->DescribeInt8Kernels();
    }
    if (!int8_note.empty()) {
      Log(LogLevel::kInfo, "worker",
          absl::StrFormat("worker %d: %s: %s", index_, load.key(), int8_note),
          {{"model", key.name}, {"version", key.version}, {"int8_kernels", "off"}});
    }
    if (options.precision != engine::Precision::kFp32) {
      const std::string path = kernels::GetBf16Support().path;
      Log(LogLevel::kInfo, "worker",
          absl::StrFormat("worker %d: %s: precision %s (%s)", index_, load.key(),
                          engine::PrecisionName(options.precision), path),
          {{"model", key.name},
           {"version", key.version},
           {"precision", engine::PrecisionName(options.precision)},
           {"bf16_path", path}});
    }
  }

  // The log's line on a model's warm-ups (RunWarmups' report), if it has any.
  void LogWarmups(const worker::LoadModel& load, const std::string& report) {
    if (report.empty()) return;
    const ModelKeyParts key = SplitModelKey(load.key());
    Log(LogLevel::kInfo, "worker",
        absl::StrFormat("worker %d: %s: warm-up %s", index_, load.key(), report),
        {{"model", key.name}, {"version", key.version}, {"warmup", report}});
  }

  // The physical cores this worker's instances split (at least 1).
  int Cores() const { return std::max(1, static_cast<int>(cores_.size())); }

  // One copy on every core, run on the serving thread; `model` when the
  // measurement of `auto` already compiled it so.
  absl::Status LoadInline(const worker::LoadModel& load, const engine::CompileOptions& options,
                          std::unique_ptr<engine::CompiledModel> model, worker::Reply* reply) {
    if (model == nullptr) {
      auto loaded = engine::CompiledModel::Load(load.path(), options);
      if (!loaded.ok()) return loaded.status();
      model = *std::move(loaded);
    }
    std::string warmups;
    if (absl::Status s = RunWarmups(*model, load, &warmups); !s.ok()) return s;
    LogWarmups(load, warmups);
    reply->set_weight_bytes(model->info().parameter_bytes);
    pools_.erase(load.key());
    fits_.erase(load.key());  // a new copy: its rows that fit are found again
    models_[load.key()] = std::move(model);
    return absl::OkStatus();
  }

  // N copies on N disjoint shares of this worker's cores, whole cores each
  // (the shares' sizes differ by one core at most).
  absl::Status LoadInstances(const worker::LoadModel& load, const engine::CompileOptions& options,
                             int n, worker::Reply* reply) {
    const std::string name = load.key().substr(0, load.key().rfind(':'));
    if (absl::Status s = CheckInstancesFit(name, n, index_, static_cast<int>(cores_.size()));
        !s.ok()) {
      return s;
    }
    int64_t weight_bytes = 0;
    auto pool = std::make_unique<InstancePool>(index_, load.key(), arena_, min_compute_, pinned_,
                                               [this](const worker::Reply& r) { Reply(r); });
    if (absl::Status s =
            pool->Start(load.path(), options, affinity::SplitCores(cores_, n), &weight_bytes, load);
        !s.ok()) {
      return s;
    }
    reply->set_weight_bytes(weight_bytes);
    LogWarmups(load, pool->warmup_report());
    models_.erase(load.key());
    pools_[load.key()] = std::move(pool);
    return absl::OkStatus();
  }

  // instances_per_domain: auto. Times the model on 1, 2, 4, ... copies up to
  // this worker's cores (and the cores themselves), each count on its share
  // of cores/N, the N copies running at once (RowsPerSecondOnShares). The
  // most copies within kAutoTolerance of the best throughput win. One copy
  // is compiled as it runs inline and kept in `model` when one copy wins.
  // The measurement goes to reply.instances_report and the log.
  absl::StatusOr<int> ChooseInstances(const worker::LoadModel& load,
                                      const engine::CompileOptions& options,
                                      std::unique_ptr<engine::CompiledModel>* model,
                                      worker::Reply* reply) {
    auto inline_model = engine::CompiledModel::Load(load.path(), options);
    if (!inline_model.ok()) return inline_model.status();  // the load fails as it would inline
    const int64_t rows = (*inline_model)->info().batched ? kAutoRows : 1;
    const int cores = Cores();
    auto threads = [](int t) { return absl::StrFormat("%d thread%s", t, t == 1 ? "" : "s"); };
    std::vector<std::string> parts;
    std::vector<std::pair<int, double>> measured;  // (copies, rows/s)
    auto one = RowsPerSecond(**inline_model, rows);
    const std::string one_label = absl::StrCat("1x", threads(omp_get_max_threads()));
    if (one.ok()) {
      measured.emplace_back(1, *one);
      parts.push_back(absl::StrFormat("%s %.1f rows/s", one_label, *one));
    } else {
      parts.push_back(absl::StrCat(one_label, " failed (", one.status().message(), ")"));
    }
    *model = *std::move(inline_model);
    std::vector<int> counts;
    for (int n = 2; n < cores; n *= 2) counts.push_back(n);
    if (cores > 1) counts.push_back(cores);
    // What one more copy holds: its weights and its activations at `rows`.
    // The n copies of a count are all held while they are timed, so a count
    // whose copies would take more than half of the memory available now is
    // not tried (nor chosen).
    int64_t copy_bytes = (*model)->info().parameter_bytes;
    if (auto act = (*model)->ActivationBytes(rows); act.ok()) copy_bytes += *act;
    // What this worker's node (its memory policy's, else its cpus') and its
    // cgroup can still give, not the host's MemAvailable.
    const affinity::AvailableMemory memory =
        affinity::AvailableMemoryOn(affinity::CallingThreadMemoryNodes());
    const uint64_t available = memory.bytes;
    // Only when one copy ran at all: otherwise the model keeps one copy.
    for (int n : one.ok() ? counts : std::vector<int>()) {
      std::vector<std::vector<int>> shares = affinity::SplitCores(cores_, n);
      const std::vector<int>& smallest =
          *std::min_element(shares.begin(), shares.end(),
                            [](const auto& a, const auto& b) { return a.size() < b.size(); });
      const std::string label = absl::StrCat(n, "x", threads(static_cast<int>(smallest.size())));
      if (available > 0 && static_cast<double>(n) * static_cast<double>(copy_bytes) >
                               0.5 * static_cast<double>(available)) {
        parts.push_back(
            absl::StrFormat("%s not tried (%d copies of %.0f MiB, %.0f MiB available on %s)", label,
                            n, copy_bytes / 1048576.0, available / 1048576.0, memory.source));
        continue;
      }
      auto rate = RowsPerSecondOnShares(load.path(), options, shares, rows);
      if (!rate.ok()) {
        parts.push_back(absl::StrCat(label, " failed (", rate.status().message(), ")"));
        continue;
      }
      parts.push_back(absl::StrFormat("%s %.1f rows/s", label, *rate));
      measured.emplace_back(n, *rate);
    }
    double top = 0;
    for (const auto& [n, rate] : measured) top = std::max(top, rate);
    int best = 1;
    for (const auto& [n, rate] : measured) {
      if (rate >= kAutoTolerance * top) best = std::max(best, n);
    }
    if (best != 1) model->reset();
    const std::string report = absl::StrCat(absl::StrJoin(parts, ", "), " -> ", best);
    const ModelKeyParts key = SplitModelKey(load.key());
    Log(LogLevel::kInfo, "worker",
        absl::StrCat("worker ", index_, ": ", load.key(), ": instances auto: ", report),
        {{"model", key.name}, {"version", key.version}, {"instances", best}, {"report", report}});
    reply->set_instances_report(report);
    return best;
  }

  void Run(const worker::RunBatch& run, worker::Reply* reply) {
    auto it = models_.find(run.key());
    if (it == models_.end()) {
      reply->set_error(absl::StrCat("model ", run.key(), " is not loaded on this worker"));
      reply->set_code(static_cast<int>(absl::StatusCode::kInternal));
      return;
    }
    reply->set_instance(0);
    RunBatchOn(*it->second, *arena_, run, reply, min_compute_, &fits_[run.key()]);
  }

  int index_;
  SharedArena* arena_;
  // The physical cores this worker is bound to, each core's cpus, in the
  // plan's order (OwnCores).
  std::vector<std::vector<int>> cores_;
  const bool pinned_;                            // false: cores_ are the plan's, advisory
  const ProcessOptions process_;                 // the server's, from the flags
  const std::chrono::microseconds min_compute_;  // --test-batch-compute-us
  base::Mutex write_mu_;  // replies come from the serving thread and the pools' threads
  bool write_ok_ ABSL_GUARDED_BY(write_mu_) = true;
  std::map<std::string, std::unique_ptr<engine::CompiledModel>> models_;
  std::map<std::string, std::unique_ptr<InstancePool>> pools_;  // instances_per_domain > 1
  std::map<std::string, RowsThatFit> fits_;  // per key in models_, found at its first chunked batch
};

// Logs the worker's start: its binding and OpenMP environment (a warning
// when it runs unpinned, another when its memory is not bound as asked),
// and --test-batch-compute-us when set.
void LogWorkerStart(int64_t index, int64_t node, const worker::Hello& h,
                    const WorkerBinding& binding, int64_t test_batch_compute_us) {
  std::vector<base::LogField> fields = {{"numa_node", node},
                                        {"binding", h.binding()},
                                        {"cpu_binding", binding.cpus_bound ? "held" : "failed"},
                                        {"memory_policy", binding.memory_policy},
                                        {"environment", h.environment()}};
  if (!h.bind_warning().empty()) fields.emplace_back("bind_warning", h.bind_warning());
  Log(h.bind_warning().empty() ? LogLevel::kInfo : LogLevel::kWarning, "worker",
      absl::StrCat("worker ", index, " pid ", getpid(), ": ", h.binding(), "; ", h.environment(),
                   h.bind_warning().empty() ? "" : "; unpinned: ", h.bind_warning()),
      fields);
  if (!binding.memory_error.empty()) {
    Log(LogLevel::kWarning, "worker",
        absl::StrFormat("worker %d: memory not bound by policy (%s): %s", index,
                        binding.memory_policy, binding.memory_error),
        {{"numa_node", node},
         {"memory_policy", binding.memory_policy},
         {"memory_error", binding.memory_error}});
  }
  if (test_batch_compute_us > 0) {
    Log(LogLevel::kInfo, "worker",
        absl::StrFormat("worker %d: every batch takes at least %d us (--test-batch-compute-us; "
                        "for scheduler tests)",
                        index, test_batch_compute_us),
        {{"test_batch_compute_us", test_batch_compute_us}});
  }
}

// The worker's cores, for models with several instances: the plan's
// (`cores`, from --cores; without it each cpu of --cpus is a core of its
// own), in the plan's order, less the cpus outside --cpus and, when the
// worker is bound (or --cpus did not parse), less those it is not bound to
// (see WorkerCommand).
std::vector<std::vector<int>> OwnCores(bool pinned, const absl::StatusOr<std::vector<int>>& cpus,
                                       std::vector<std::vector<int>> cores) {
  if (cores.empty() && cpus.ok()) {
    for (int cpu : *cpus) cores.push_back({cpu});
  }
  if (cpus.ok()) cores = affinity::CoresWithin(cores, *cpus);
  if (pinned || !cpus.ok()) {
    std::vector<int> bound;
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &mask)) bound.push_back(c);
      }
    }
    if (cores.empty()) {
      for (int cpu : bound) cores.push_back({cpu});
    } else if (auto within = affinity::CoresWithin(cores, bound); !within.empty()) {
      cores = std::move(within);
    }
  }
  return cores;
}

}  // namespace

WorkerBinding BindWorker(const absl::StatusOr<std::vector<int>>& cpus, int numa_node,
                         affinity::MemoryPolicy policy, SharedArena& arena) {
  WorkerBinding binding;
  // Cpus first: the first-touch fallback below relies on them.
  absl::Status cpu_status = cpus.ok() ? affinity::BindProcessCpus(*cpus) : cpus.status();
  binding.cpus_bound = cpu_status.ok();
  binding.cpu_error = std::string(cpu_status.message());
  if (numa_node < 0) return binding;  // no node planned: "none", nothing to say
  absl::Status memory = affinity::BindProcessMemory(numa_node, policy);
  if (memory.ok())
    memory = affinity::BindMemoryToNode(arena.data(), arena.size(), numa_node, policy);
  if (memory.ok()) {
    binding.memory_policy = affinity::MemoryPolicyName(policy);
    return binding;
  }
  binding.memory_error = std::string(memory.message());
  // A node the machine lacks (a synthetic topology's plan): nothing to place.
  if (memory.code() == absl::StatusCode::kInvalidArgument || !binding.cpus_bound) return binding;
  // The policy refused: under the default policy a page lands on the node
  // of the cpu that first writes it. The worker's own memory is written
  // first by its pinned threads; the arena, the server writes into, is
  // touched here first, from this pinned thread (a restarted worker finds
  // it placed already).
  absl::StatusOr<std::string> how = affinity::PrefaultPages(arena.data(), arena.size());
  if (how.ok()) {
    binding.memory_policy = "first-touch";
    binding.prefault = *std::move(how);
  } else {
    absl::StrAppend(&binding.memory_error,
                    "; cannot pre-fault the arena: ", how.status().message());
  }
  return binding;
}

std::string DescribeWorkerBinding(const WorkerBinding& binding, int numa_node) {
  std::string text = affinity::DescribeBinding();
  absl::StrAppend(&text, "; cpu binding ",
                  binding.cpus_bound ? "held" : absl::StrCat("failed (", binding.cpu_error, ")"));
  if (binding.memory_policy == "first-touch") {
    absl::StrAppend(&text, "; memory first-touch on node ", numa_node,
                    " (the policy was refused: ", binding.memory_error,
                    "; the arena pre-faulted from the worker's cpus, ", binding.prefault, ")");
  } else if (binding.memory_policy != "none") {
    absl::StrAppend(&text, "; memory ", binding.memory_policy, " on node ", numa_node);
  } else if (numa_node < 0) {
    absl::StrAppend(&text, "; memory not bound (no NUMA node planned)");
  } else {
    absl::StrAppend(&text, "; memory not bound (", binding.memory_error, ")");
  }
  return text;
}

engine::CompiledModel::InputShapes SignatureOf(const worker::RunBatch& run) {
  engine::CompiledModel::InputShapes shapes;
  shapes.reserve(static_cast<size_t>(run.input_shapes_size()));
  for (const worker::Shape& shape : run.input_shapes()) {
    shapes.emplace_back(shape.dims().begin(), shape.dims().end());
  }
  return shapes;
}

void RunBatchOn(engine::CompiledModel& model, const SharedArena& arena, const worker::RunBatch& run,
                worker::Reply* reply, std::chrono::microseconds min_compute, RowsThatFit* fit) {
  auto in_arena = [&](const worker::TensorSlice& slice) {
    return slice.offset() <= arena.size() && slice.bytes() <= arena.size() - slice.offset();
  };
  // The worker's own checks: the server's slots are wrong, not the request.
  auto internal = [&](std::string error) {
    reply->set_error(std::move(error));
    reply->set_code(static_cast<int>(absl::StatusCode::kInternal));
  };
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  std::vector<size_t> input_bytes, output_bytes;
  for (const auto& slice : run.inputs()) {
    if (!in_arena(slice)) return internal("input slice outside the arena");
    inputs.push_back(arena.data() + slice.offset());
    input_bytes.push_back(static_cast<size_t>(slice.bytes()));
  }
  for (const auto& slice : run.outputs()) {
    if (!in_arena(slice)) return internal("output slice outside the arena");
    outputs.push_back(arena.data() + slice.offset());
    output_bytes.push_back(static_cast<size_t>(slice.bytes()));
  }
  // The engine reads and writes whole tensors: a slice of another size
  // would read another request's bytes or write over them. A
  // shape-polymorphic model's batch runs at its signature, every other at
  // its batch size.
  const engine::CompiledModel::InputShapes signature = SignatureOf(run);
  absl::Status fits = signature.empty()
                          ? model.CheckBufferSizes(run.batch(), input_bytes, output_bytes)
                          : model.CheckBufferSizes(signature, input_bytes, output_bytes);
  if (!fits.ok()) {
    return internal(absl::StrCat("the server's buffers do not fit the model (", run.key(),
                                 " at batch ", run.batch(), "): ", fits.message()));
  }
  // A request of this batch asked for its profile: time every step of this
  // run only (from zero), and stop before anything else runs on the model.
  if (run.profile()) model.SetProfiling(true);
  auto start = std::chrono::steady_clock::now();
  absl::Status s = RunRowsInChunks(model, run.batch(), inputs, outputs, input_bytes, output_bytes,
                                   fit, signature);
  const int64_t run_ns = NanosSince(start);
  if (run.profile()) model.SetProfiling(false);
  if (!s.ok()) {
    reply->set_compute_ns(run_ns);
    reply->set_error(std::string(s.message()));
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      // The engine's limit on activations, or its allocation failing: the
      // client learns which model and what sets the limit.
      const ModelKeyParts key = SplitModelKey(run.key());
      reply->set_error(absl::StrFormat(
          "model '%s' version %d: %s (the model's limit: config.pbtxt max_activation_bytes, "
          "else serve --max-activation-mb)",
          key.name, key.version, s.message()));
    }
    reply->set_code(static_cast<int>(s.code()));
    return;
  }
  // --test-batch-compute-us: hold the batch's slot until then, asleep.
  if (min_compute.count() > 0) std::this_thread::sleep_until(start + min_compute);
  reply->set_compute_ns(NanosSince(start));
  if (run.profile()) {
    reply->set_profile_json(BatchProfileJson(
        run.batch(), reply->compute_ns(),
        engine::StepProfileJson(model.Profile(), 1, static_cast<double>(run_ns) * 1e-9)));
  }
  reply->set_ok(true);
}

std::string BatchProfileJson(int64_t batch, int64_t compute_ns, std::string_view steps_json) {
  std::string out = absl::StrCat("{\"batch\": ", batch,
                                 ", \"compute_ms\": ", static_cast<double>(compute_ns) * 1e-6);
  // StepProfileJson's object, its fields after these.
  const size_t open = steps_json.find('{');
  if (open == std::string_view::npos) return out + "}";
  std::string_view rest = steps_json.substr(open + 1);
  const size_t first = rest.find_first_not_of(" \t\n");
  if (first != std::string_view::npos && rest[first] != '}') absl::StrAppend(&out, ", ");
  out.append(first == std::string_view::npos ? rest : rest.substr(first));
  return out;
}

namespace {

// Whether a numa_maps line is the process's own memory: anonymous (heap,
// stacks, malloc arenas, the copied-on-write pages of a library's data:
// "anon=") or shared memory (memfd, /dev/shm, SysV: the arena). Not the
// page cache of a file it maps (libraries' code, read-only data), which
// lies wherever the file was first read, by any process, and is shared.
bool IsOwnMemory(const std::vector<absl::string_view>& fields) {
  absl::string_view file;
  for (absl::string_view field : fields) {
    if (absl::StartsWith(field, "anon=")) return true;
    if (absl::StartsWith(field, "file=")) file = field.substr(5);
  }
  return file.empty() || absl::StartsWith(file, "/memfd:") || absl::StartsWith(file, "/dev/shm/") ||
         absl::StartsWith(file, "/SYSV");
}

}  // namespace

std::string SumNumaMapsPages(std::string_view numa_maps) {
  std::map<int, int64_t> pages;
  for (absl::string_view line : absl::StrSplit(
           absl::string_view(numa_maps.data(), numa_maps.size()), '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (!IsOwnMemory(fields)) continue;
    for (absl::string_view field : fields) {
      // "N0=1234": pages of this mapping on node 0.
      if (field.size() < 4 || field[0] != 'N') continue;
      const size_t eq = field.find('=');
      int node = 0;
      int64_t count = 0;
      if (eq == absl::string_view::npos || !absl::SimpleAtoi(field.substr(1, eq - 1), &node) ||
          !absl::SimpleAtoi(field.substr(eq + 1), &count) || node < 0 || count < 0) {
        continue;
      }
      pages[node] += count;
    }
  }
  std::vector<std::string> parts;
  for (const auto& [node, count] : pages) parts.push_back(absl::StrCat(node, "=", count));
  return absl::StrJoin(parts, " ");
}

namespace {

// What `numaserve worker` is told on its command line.
struct WorkerFlags {
  std::string cpus_text;
  std::string cores_text;
  std::vector<std::vector<int>> cores;  // --cores parsed; empty without it
  int64_t index = 0, node = -1, arena_bytes = 0, test_batch_compute_us = 0;
  // The server's process settings: its flags are all the worker takes (its
  // environment has none of their variables).
  ProcessOptions process;
};

// Parses the flags and configures the log before anything is logged, a
// parse error included (in the format asked for, if it was read).
absl::Status ParseWorkerFlags(const std::vector<std::string>& args, WorkerFlags* f) {
  std::string log_format = "text", log_level = "info";
  base::ArgParser parser("worker", "Internal: one worker process, started by `numaserve serve`.");
  parser.AddInt("index", &f->index, "worker index");
  parser.AddString("cpus", &f->cpus_text, "cpus to bind to, e.g. 0-7");
  parser.AddString("cores", &f->cores_text,
                   "the same cpus by physical core, in the plan's order, e.g. 0,4;1,5 (the "
                   "instances' shares take whole cores); default: each cpu a core");
  parser.AddInt("numa-node", &f->node, "NUMA node for memory, -1 for none");
  parser.AddInt("arena-bytes", &f->arena_bytes, "size of the shared arena at fd 4");
  parser.AddInt("test-batch-compute-us", &f->test_batch_compute_us,
                "for scheduler tests: every batch takes at least this long (sleeping)");
  parser.AddString("log-format", &log_format,
                   "text | json, as `serve --log-format` (serve passes its own)");
  parser.AddString("log-level", &log_level,
                   "least level logged: debug | info | warning | error (serve passes its own)");
  AddProcessFlags(parser, f->process, kKernelFlags | kModelFlags | kPlacementFlags | kWeightsFlags);
  absl::Status parsed = parser.Parse(args);
  absl::StatusOr<base::LogOptions> log_options = base::LogOptionsFromFlags(log_format, log_level);
  if (!log_options.ok()) return log_options.status();
  base::ConfigureLog(*log_options);
  if (parsed.ok() && !f->cores_text.empty()) {
    auto cores = affinity::ParseCoreList(f->cores_text);
    if (!cores.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cores: ", cores.status().message()));
    }
    f->cores = *std::move(cores);
  }
  return parsed;
}

}  // namespace

int WorkerCommand(const std::vector<std::string>& args) {
  // Die with the server: a worker never outlives the process that feeds it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The server decides when workers stop (it drains first): a SIGINT or
  // SIGTERM sent to the whole process group (a terminal's ^C, systemd's
  // control-group kill) must not end accepted work here.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);

  WorkerFlags flags;
  if (absl::Status s = ParseWorkerFlags(args, &flags); !s.ok()) {
    Log(LogLevel::kError, "worker", absl::StrCat("worker: ", s.message()));
    return 2;
  }
  const int64_t index = flags.index, node = flags.node;
  // Every record of this process (the kernels' too) says which worker it is.
  base::SetLogContext({{"worker", index}, {"pid", getpid()}});

  // 1. Map the arena, then pin the process and bind its memory and the
  // arena's pages, before any OpenMP or oneDNN code runs in this process.
  auto arena = SharedArena::Attach(kWorkerArenaFd, static_cast<size_t>(flags.arena_bytes));
  if (!arena.ok()) {
    Log(LogLevel::kError, "worker", absl::StrCat("worker ", index, ": ", arena.status().message()),
        {{"error", arena.status().message()}});
    return 1;
  }
  // A malformed --membind stops the worker below (ApplyProcessOptions).
  const affinity::MemoryPolicy policy =
      affinity::ParseMemoryPolicy(flags.process.membind).value_or(affinity::MemoryPolicy::kPrefer);
  auto cpus = affinity::ParseCpuList(flags.cpus_text);
  const WorkerBinding binding = BindWorker(cpus, static_cast<int>(node), policy, **arena);
  const bool pinned = binding.cpus_bound;
  worker::Reply hello;
  worker::Hello* h = hello.mutable_hello();
  h->set_worker_index(static_cast<int>(index));
  h->set_pid(getpid());
  h->set_bind_warning(binding.cpu_error);
  // The ISA cap and the BLAS kernels, before anything touches oneDNN.
  if (absl::Status s = ApplyProcessOptions(flags.process); !s.ok()) {
    Log(LogLevel::kError, "worker", absl::StrCat("worker ", index, ": ", s.message()),
        {{"error", s.message()}});
    return 2;
  }

  h->set_binding(DescribeWorkerBinding(binding, static_cast<int>(node)));
  h->set_environment(OpenMpEnvironmentSeen());
  h->set_isa(affinity::FeatureList(affinity::GetCpuFeatures()));
  hello.set_ok(true);
  LogWorkerStart(index, node, *h, binding, flags.test_batch_compute_us);
  if (!WriteFramed(kWorkerControlFd, hello).ok()) return 1;

  // 2. Serve.
  // The worker's cores, for models with several instances: the plan's, in
  // its order (--cores), less the cpus the worker is not bound to; all of
  // them when pinning failed (the plan's cores, advisory: a synthetic
  // topology's 16 cores on a 2-cpu machine are 16 instance slots, as the
  // scheduler counts them; the process's own mask then says nothing,
  // libgomp having moved its first thread to the first of
  // GOMP_CPU_AFFINITY's cpus before main).
  std::vector<std::vector<int>> own_cores = OwnCores(pinned, cpus, std::move(flags.cores));
  Worker worker(static_cast<int>(index), arena->get(), std::move(own_cores), pinned,
                std::chrono::microseconds(std::max<int64_t>(0, flags.test_batch_compute_us)),
                std::move(flags.process));
  return worker.Serve();
}

}  // namespace numaserve::serving
