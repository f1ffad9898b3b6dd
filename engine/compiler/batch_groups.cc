#include "engine/compiler/batch_groups.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/memory_bandwidth.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "base/log.h"
#include "base/mutex.h"

namespace numaserve::engine {

int BatchGroupsFor(const CompileOptions& options, int threads) {
  return std::max(1, std::min(options.batch_groups, threads));
}

int64_t MinRowsPerGroup(double flops_per_row) {
  constexpr int64_t kMinRows = 4;
  constexpr double kMinGroupFlops = 1e9;
  if (!(flops_per_row > 0)) return 0;
  const double rows = std::ceil(kMinGroupFlops / flops_per_row);
  return rows > 1e9 ? int64_t{1'000'000'000}
                    : std::max<int64_t>(kMinRows, static_cast<int64_t>(rows));
}

namespace {

// Bytes per row of each tensor of `shapes` (dim 0 the rows, `rows` of them);
// 0 for a tensor whose dim 0 is not `rows`.
std::vector<size_t> RowBytes(const std::vector<std::vector<int64_t>>& shapes,
                             const std::vector<TensorInfo>& tensors, int64_t rows) {
  std::vector<size_t> out;
  for (size_t i = 0; i < shapes.size() && i < tensors.size(); ++i) {
    const std::vector<int64_t>& s = shapes[i];
    if (s.empty() || s[0] != rows) {
      out.push_back(0);
      continue;
    }
    size_t bytes = DataTypeSize(tensors[i].type);
    for (size_t d = 1; d < s.size(); ++d) bytes *= static_cast<size_t>(std::max<int64_t>(s[d], 0));
    out.push_back(bytes);
  }
  return out;
}

class BatchGroupedModel final : public CompiledModel {
 public:
  // The calls at input shapes: CompiledModel's, at the batch they stand for.
  using CompiledModel::ActivationBytes;
  using CompiledModel::CheckBufferSizes;
  using CompiledModel::OutputShapes;
  using CompiledModel::PlanAt;
  using CompiledModel::Run;

  BatchGroupedModel(std::unique_ptr<CompiledModel> full, int64_t min_rows,
                    std::vector<size_t> input_row_bytes, std::vector<size_t> output_row_bytes)
      : full_(std::move(full)),
        min_rows_(min_rows),
        input_row_bytes_(std::move(input_row_bytes)),
        output_row_bytes_(std::move(output_row_bytes)),
        last_(full_.get()) {}

  ~BatchGroupedModel() override {
    {
      base::MutexLock lock(&mu_);
      stop_ = true;
    }
    work_cv_.SignalAll();
    for (Group& g : groups_) {
      if (g.thread.joinable()) g.thread.join();
    }
  }

  // Starts the copies one after the other, each compiled on its own thread
  // inside its cpus (so that its weights are first touched there).
  absl::Status Start(const std::string& path, const CompileOptions& options,
                     const std::vector<std::vector<int>>& cpu_shares,
                     const std::vector<int>& thread_shares) {
    groups_ = std::vector<Group>(thread_shares.size());
    for (size_t i = 0; i < groups_.size(); ++i) {
      std::optional<absl::Status> loaded;
      groups_[i].thread =
          std::thread([this, i, &path, &options, &cpu_shares, &thread_shares, &loaded] {
            Group& g = groups_[i];
            const std::vector<int> cpus = cpu_shares.empty() ? std::vector<int>() : cpu_shares[i];
            absl::Status s;
            if (!cpus.empty()) s = affinity::PinCallingThread(cpus);
            if (s.ok()) {
              CompileOptions own = options;
              own.num_threads = thread_shares[i];
              own.batch_groups = 1;
              omp_set_num_threads(own.num_threads);
              if (!cpus.empty()) affinity::PinOpenMpTeam(cpus);
              auto model = CompiledModel::Load(path, own);
              if (model.ok()) {
                g.model = *std::move(model);
              } else {
                s = model.status();
              }
            }
            {
              base::MutexLock lock(&mu_);
              loaded = s;
            }
            done_cv_.SignalAll();
            if (g.model) Serve(g);
          });
      base::MutexLock lock(&mu_);
      while (!loaded.has_value()) done_cv_.Wait(&mu_);
      if (!loaded->ok()) return *loaded;
    }
    return absl::OkStatus();
  }

  const ModelInfo& info() const override { return full_->info(); }
  std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const override {
    return full_->OutputShapes(batch);
  }
  absl::Status CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const override {
    return full_->CheckBufferSizes(batch, input_bytes, output_bytes);
  }

  absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs) override {
    const int n = GroupsAt(batch);
    bool plain = n < 2 || inputs.size() != input_row_bytes_.size() ||
                 outputs.size() != output_row_bytes_.size();
    for (const void* p : inputs) plain = plain || p == nullptr;
    for (const void* p : outputs) plain = plain || p == nullptr;
    if (plain) {
      last_ = full_.get();
      return full_->Run(batch, inputs, outputs);  // its checks and errors
    }
    base::MutexLock lock(&mu_);
    for (int k = 0; k < n; ++k) {
      const int64_t first = batch * k / n, rows = batch * (k + 1) / n - first;
      Group& g = groups_[k];
      g.rows = rows;
      g.inputs.resize(inputs.size());
      g.outputs.resize(outputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        g.inputs[i] = static_cast<const char*>(inputs[i]) + first * input_row_bytes_[i];
      }
      for (size_t i = 0; i < outputs.size(); ++i) {
        g.outputs[i] = static_cast<char*>(outputs[i]) + first * output_row_bytes_[i];
      }
      g.pending = true;
    }
    running_ = n;
    work_cv_.SignalAll();
    while (running_ != 0) done_cv_.Wait(&mu_);
    last_ = groups_[0].model.get();
    for (int k = 0; k < n; ++k) {
      if (!groups_[k].status.ok()) return groups_[k].status;
    }
    return absl::OkStatus();
  }

  BatchPlanCache CachedBatchPlans() const override {
    BatchPlanCache total = full_->CachedBatchPlans();
    for (const Group& g : groups_) {
      const BatchPlanCache c = g.model->CachedBatchPlans();
      total.plans += c.plans;
      total.arena_bytes += c.arena_bytes;
    }
    return total;
  }

  absl::StatusOr<int64_t> ActivationBytes(int64_t batch) override {
    const int n = GroupsAt(batch);
    if (n < 2) return full_->ActivationBytes(batch);
    int64_t total = 0;
    for (int k = 0; k < n; ++k) {
      auto bytes = groups_[k].model->ActivationBytes(batch * (k + 1) / n - batch * k / n);
      if (!bytes.ok()) return bytes.status();
      total += *bytes;
    }
    return total;
  }

  std::string ActivationLayoutName() const override { return full_->ActivationLayoutName(); }
  std::string DescribeInt8Kernels() const override { return full_->DescribeInt8Kernels(); }

  std::string DescribeBatchGroups() const override { return description_; }

  // The steps are the full model's; how batches split is DescribeBatchGroups.
  std::string DescribePlan() const override { return full_->DescribePlan(); }

  absl::StatusOr<std::vector<PlannedStep>> PlanAt(int64_t batch) const override {
    const int n = GroupsAt(batch);
    if (n < 2) return full_->PlanAt(batch);
    return groups_[0].model->PlanAt(batch / n);  // group 0's plan at its rows
  }

  void SetProfiling(bool on) override {
    full_->SetProfiling(on);
    for (Group& g : groups_) g.model->SetProfiling(on);
  }
  // The copy that ran the last batch: with groups, group 0's steps at its
  // rows and threads (the groups run at once, so its time per run is the
  // run's).
  std::vector<StepProfile> Profile() const override { return last_->Profile(); }
  void SetStepEventLimit(int64_t max_events) override {
    full_->SetStepEventLimit(max_events);
    for (Group& g : groups_) g.model->SetStepEventLimit(max_events);
  }
  std::vector<StepEvent> StepEvents() const override { return last_->StepEvents(); }

  void set_description(std::string d) { description_ = std::move(d); }

 private:
  struct Group {
    std::thread thread;
    std::unique_ptr<CompiledModel> model;
    bool pending = false;  // under mu_
    int64_t rows = 0;
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    absl::Status status;
  };

  // Every group, or none: a batch too small to give each its rows runs on
  // the whole team (a subset of the groups would leave the others' cpus
  // idle).
  int GroupsAt(int64_t batch) const {
    const int64_t n = static_cast<int64_t>(groups_.size());
    if (min_rows_ <= 0 || n < 2 || batch < n * min_rows_) return 1;
    return static_cast<int>(n);
  }

  void Serve(Group& g) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    while (true) {
      while (!stop_ && !g.pending) work_cv_.Wait(&mu_);
      if (!g.pending) return;  // stopping
      g.pending = false;
      mu_.Unlock();  // the group's rows run unlocked; Run does not touch them meanwhile
      absl::Status s = g.model->Run(g.rows, g.inputs, g.outputs);
      mu_.Lock();
      g.status = std::move(s);
      if (--running_ == 0) done_cv_.SignalAll();
    }
  }

  std::unique_ptr<CompiledModel> full_;
  const int64_t min_rows_;
  const std::vector<size_t> input_row_bytes_, output_row_bytes_;
  CompiledModel* last_;  // the copy that ran the last batch
  std::vector<Group> groups_;
  std::string description_;
  // Guards every Group's pending/rows/inputs/outputs/status as well (a
  // group's fields cannot name their owner's mutex in an annotation).
  base::Mutex mu_;
  base::CondVar work_cv_, done_cv_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Each group's thread count, and in *cpu_shares the cpus to pin each
// group to where the calling thread may run on at least `threads` cpus
// (else none: the copies float, like the team), split by whole cores in the
// topology's (the plan's) order: the thread's cpus read back ascending put
// a core's SMT siblings in two groups.
std::vector<int> GroupShares(int threads, int groups, std::vector<std::vector<int>>* cpu_shares) {
  cpu_shares->clear();
  const std::vector<int> cpus = affinity::CallingThreadCpus();
  if (static_cast<int>(cpus.size()) >= threads) {
    const absl::StatusOr<affinity::Topology> topology = affinity::DiscoverTopology({});
    *cpu_shares = affinity::TeamShares(topology.ok() ? *topology : affinity::Topology{}, cpus,
                                       threads, groups);
    if (std::any_of(cpu_shares->begin(), cpu_shares->end(),
                    [](const std::vector<int>& share) { return share.empty(); })) {
      cpu_shares->clear();  // more groups than cpus: they float
    }
  }
  // Each pinned group's cpus, else `threads` split evenly.
  std::vector<int> thread_shares;
  std::vector<int> indices(threads);
  for (int i = 0; i < threads; ++i) indices[i] = i;
  for (const std::vector<int>& share :
       cpu_shares->empty() ? affinity::SplitCpus(indices, groups) : *cpu_shares) {
    thread_shares.push_back(static_cast<int>(share.size()));
  }
  return thread_shares;
}

// Why `groups` copies of a model's weights do not fit, "" if they do: each
// copy holds its own weights (and oneDNN's reordered copies of them), and
// all of them must take at most half of what the calling thread's node
// (its memory policy's, else its cpus') and its cgroup can still give, not
// the host's MemAvailable.
std::string CopiesDoNotFit(int groups, int64_t parameter_bytes) {
  const double copies_bytes = 2.0 * groups * static_cast<double>(parameter_bytes);
  const affinity::AvailableMemory memory =
      affinity::AvailableMemoryOn(affinity::CallingThreadMemoryNodes());
  const double available = static_cast<double>(memory.bytes);
  if (memory.bytes == 0 || copies_bytes <= available / 2.0) return "";
  return absl::StrFormat(
      "%d copies of its weights (%.0f MB) would take more than half the memory available on %s "
      "(%.0f MB)",
      groups, copies_bytes / 1e6, memory.source, available / 1e6);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CompiledModel>> WrapInBatchGroups(
    std::unique_ptr<CompiledModel> full, const std::string& path, const CompileOptions& options,
    int threads, int groups) {
  groups = std::min(groups, threads);
  if (groups < 2) return full;
  const ModelInfo& info = full->info();
  auto keep = [&](const std::string& why) {
    base::Log(base::LogLevel::kInfo, "engine", absl::StrCat(path, ": batch groups off: ", why),
              {{"path", path}});
    return std::move(full);
  };
  const int64_t min_rows = options.batch_group_min_rows > 0 ? options.batch_group_min_rows
                                                            : MinRowsPerGroup(info.flops_per_row);
  if (!info.batched) return keep("its rows are not independent");
  if (min_rows <= 0) return keep("it counts no conv or matmul FLOPs");
  // Row sizes from the shapes at 1 and 2 rows: fixed where every dim after
  // the rows is.
  std::vector<std::vector<int64_t>> in1, in2;
  for (const TensorInfo& t : info.inputs) {
    if (t.shape.empty()) return keep(absl::StrCat("input '", t.name, "' has no rows"));
    std::vector<int64_t> s = t.shape;
    for (size_t d = 1; d < s.size(); ++d) {
      if (s[d] < 0) return keep(absl::StrCat("input '", t.name, "' has a dynamic dim ", d));
    }
    s[0] = 1;
    in1.push_back(s);
    s[0] = 2;
    in2.push_back(s);
  }
  const std::vector<size_t> input_rows = RowBytes(in1, info.inputs, 1);
  const std::vector<size_t> output_rows = RowBytes(full->OutputShapes(1), info.outputs, 1);
  if (RowBytes(in2, info.inputs, 2) != input_rows ||
      RowBytes(full->OutputShapes(2), info.outputs, 2) != output_rows ||
      output_rows.size() != info.outputs.size()) {
    return keep("an output's size does not follow its rows");
  }
  for (size_t b : output_rows) {
    if (b == 0) return keep("an output has no rows");
  }
  if (std::string why = CopiesDoNotFit(groups, info.parameter_bytes); !why.empty()) {
    return keep(why);
  }

  std::vector<std::vector<int>> cpu_shares;
  const std::vector<int> thread_shares = GroupShares(threads, groups, &cpu_shares);
  auto model =
      std::make_unique<BatchGroupedModel>(std::move(full), min_rows, input_rows, output_rows);
  if (absl::Status s = model->Start(path, options, cpu_shares, thread_shares); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": batch group copy: ", s.message()));
  }
  std::string where;
  for (const std::vector<int>& share : cpu_shares) {
    absl::StrAppend(&where, where.empty() ? "" : " | ", affinity::FormatCpuList(share));
  }
  const std::string description =
      absl::StrFormat("%d x %d threads%s, batches of %lld+ rows (a copy of the model each)", groups,
                      thread_shares[0], where.empty() ? "" : absl::StrCat(" on cpus ", where),
                      static_cast<long long>(groups * min_rows));
  model->set_description(description);
  base::Log(base::LogLevel::kInfo, "engine", absl::StrCat(path, ": batch groups: ", description),
            {{"path", path}});
  return std::unique_ptr<CompiledModel>(std::move(model));
}

}  // namespace numaserve::engine
