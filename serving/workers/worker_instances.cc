// A model's copies on shares of the worker's cores (InstancePool: one
// pinned thread and OpenMP team per copy, taking batches from one queue)
// and the throughput measurement that instances_per_domain: auto chooses a
// count from (RowsPerSecond*). Declared in worker_internal.h; the Worker
// that loads them is in worker_main.cc.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "base/log.h"
#include "base/mutex.h"
#include "engine/model.h"
#include "serving/repository/model_repository.h"
#include "serving/workers/shared_arena.h"
#include "serving/workers/warmup.h"
#include "serving/workers/worker_internal.h"
#include "serving/workers/worker_main.h"
#include "worker.pb.h"

namespace numaserve::serving::worker_internal {

using base::Log;
using base::LogLevel;

absl::StatusOr<double> RowsPerSecond(engine::CompiledModel& model, int64_t rows) {
  const engine::ModelInfo& info = model.info();
  // Storage in 8-byte words, so every element type is aligned.
  std::vector<std::vector<uint64_t>> inputs, outputs;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  std::vector<size_t> in_bytes, out_bytes;
  auto add = [](int64_t elements, engine::DataType type, std::vector<std::vector<uint64_t>>* words,
                std::vector<size_t>* bytes) {
    bytes->push_back(static_cast<size_t>(elements) * engine::DataTypeSize(type));
    words->emplace_back((bytes->back() + 7) / 8 + 1);
  };
  for (const engine::TensorInfo& t : info.inputs) {
    int64_t elements = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) elements *= t.shape[d] < 0 ? rows : t.shape[d];
    add(elements, t.type, &inputs, &in_bytes);
  }
  const auto shapes = model.OutputShapes(rows);
  for (size_t i = 0; i < shapes.size() && i < info.outputs.size(); ++i) {
    int64_t elements = 1;
    for (int64_t d : shapes[i]) elements *= d;
    add(elements, info.outputs[i].type, &outputs, &out_bytes);
  }
  if (absl::Status s = model.CheckBufferSizes(rows, in_bytes, out_bytes); !s.ok()) return s;
  for (auto& v : inputs) in_ptrs.push_back(v.data());
  for (auto& v : outputs) out_ptrs.push_back(v.data());
  if (absl::Status s = model.Run(rows, in_ptrs, out_ptrs); !s.ok()) return s;  // warm-up
  const auto start = std::chrono::steady_clock::now();
  int runs = 0;
  double seconds = 0;
  do {
    if (absl::Status s = model.Run(rows, in_ptrs, out_ptrs); !s.ok()) return s;
    ++runs;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while ((runs < kAutoMinRuns || seconds < kAutoMinSeconds) && seconds < kAutoMaxSeconds);
  return static_cast<double>(rows) * runs / std::max(seconds, 1e-9);
}

absl::StatusOr<double> RowsPerSecondOnShares(const std::string& path,
                                             const engine::CompileOptions& options,
                                             const std::vector<std::vector<int>>& shares,
                                             int64_t rows) {
  const size_t n = shares.size();
  std::vector<absl::StatusOr<double>> results(n, absl::UnknownError("not measured"));
  base::Mutex mu;
  base::CondVar cv;
  size_t compiled = 0;  // under mu
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<std::unique_ptr<engine::CompiledModel>> model =
          absl::UnknownError("not compiled");
      if (absl::Status s = affinity::PinCallingThread(shares[i]); !s.ok()) {
        model = s;
      } else {
        engine::CompileOptions own = options;
        own.num_threads = static_cast<int>(shares[i].size());
        omp_set_num_threads(own.num_threads);
        affinity::PinOpenMpTeam(shares[i]);
        model = engine::CompiledModel::Load(path, own);
      }
      {
        base::MutexLock lock(&mu);
        ++compiled;
        cv.SignalAll();
        while (compiled != n) cv.Wait(&mu);
      }
      results[i] =
          model.ok() ? RowsPerSecond(**model, rows) : absl::StatusOr<double>(model.status());
    });
  }
  for (auto& t : threads) t.join();
  double total = 0;
  for (const absl::StatusOr<double>& r : results) {
    if (!r.ok()) return r.status();
    total += *r;
  }
  return total;
}

InstancePool::~InstancePool() {
  {
    base::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (auto& t : threads_) t.join();  // each drains the queue first
}

absl::Status InstancePool::Start(const std::string& path, const engine::CompileOptions& options,
                                 const std::vector<std::vector<int>>& shares, int64_t* weight_bytes,
                                 const worker::LoadModel& load) {
  for (size_t i = 0; i < shares.size(); ++i) {
    base::Mutex started_mu;
    base::CondVar started_cv;
    std::optional<absl::Status> started;  // under started_mu
    threads_.emplace_back([&, i]() {
      std::unique_ptr<engine::CompiledModel> model;
      absl::Status s = affinity::PinCallingThread(shares[i]);
      if (!pinned_) s = absl::OkStatus();  // advisory, as the worker's own binding
      if (s.ok()) {
        engine::CompileOptions own = options;
        own.num_threads = static_cast<int>(shares[i].size());
        omp_set_num_threads(own.num_threads);
        // Pin the team too, one thread per core of the share, before the
        // model's first parallel region: OMP_PROC_BIND places its threads
        // on the worker's places, not the share's. libgomp keeps these
        // threads for every later region this thread starts.
        affinity::PinOpenMpTeam(shares[i]);
        auto loaded = engine::CompiledModel::Load(path, own);
        if (loaded.ok()) {
          model = *std::move(loaded);
          *weight_bytes += model->info().parameter_bytes;
          if (i == 0) int8_note_ = model->DescribeInt8Kernels();
          // On the copy's own cores, before it counts as started.
          s = RunWarmups(*model, load, i == 0 ? &warmup_report_ : nullptr);
          if (!s.ok()) model.reset();
        } else {
          s = loaded.status();
        }
      }
      {
        // Signalled under the lock: Start() may return (and these locals
        // go away) as soon as it can take the lock again.
        base::MutexLock lock(&started_mu);
        started = s;
        started_cv.SignalAll();
      }
      if (model) Serve(static_cast<int>(i), model.get());
    });
    base::MutexLock lock(&started_mu);
    while (!started.has_value()) started_cv.Wait(&started_mu);
    if (!started->ok()) return *started;
    const ModelKeyParts key = SplitModelKey(key_);
    const std::string cpus = affinity::FormatCpuList(shares[i]);
    Log(LogLevel::kInfo, "worker",
        absl::StrFormat("worker %d: %s: instance %zu of %zu on cpus %s (%zu threads)", worker_,
                        key_, i + 1, shares.size(), cpus, shares[i].size()),
        {{"model", key.name},
         {"version", key.version},
         {"instance", i + 1},
         {"instances", shares.size()},
         {"cpus", cpus},
         {"threads", shares[i].size()}});
  }
  return absl::OkStatus();
}

void InstancePool::Submit(worker::Command command) {
  {
    base::MutexLock lock(&mu_);
    queue_.push_back(std::move(command));
  }
  cv_.Signal();
}

void InstancePool::Serve(int instance, engine::CompiledModel* model) {
  RowsThatFit fit;  // this copy's, for its life
  while (true) {
    worker::Command command;
    {
      base::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and nothing left to run
      command = std::move(queue_.front());
      queue_.pop_front();
      const int running = ++running_;
      if (running > peak_) {
        peak_ = running;
        // Once per new peak: how many batches of this model computed at once.
        const ModelKeyParts key = SplitModelKey(key_);
        Log(LogLevel::kInfo, "worker",
            absl::StrFormat("worker %d: %s: %d batches computing at once", worker_, key_, running),
            {{"model", key.name}, {"version", key.version}, {"batches", running}});
      }
    }
    worker::Reply reply;
    reply.set_id(command.id());
    reply.set_instance(instance);
    RunBatchOn(*model, *arena_, command.run(), &reply, min_compute_, &fit);
    {
      base::MutexLock lock(&mu_);
      --running_;
    }
    reply_(reply);
  }
}

}  // namespace numaserve::serving::worker_internal
