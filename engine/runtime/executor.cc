// Executor (executor.h): per-batch states, the step loop, the profile.
#include "engine/runtime/executor.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::engine::runtime {

Executor::Executor(const ExecutionPlan* plan, const dnnl::engine& engine)
    : plan_(*plan), graph_(*plan->graph), stream_(engine) {
  // A model with a dynamic dim besides dim 0 has no shape at a batch size
  // alone: its runs name their input shapes.
  for (ValueId id : graph_.inputs()) {
    const Value& v = graph_.value(id);
    for (size_t d = 1; d < v.shape.size() && batch_refusal_.empty(); ++d) {
      if (v.shape[d] >= 0) continue;
      const bool named = d < v.dim_names.size() && !v.dim_names[d].empty();
      batch_refusal_ = absl::StrCat("input '", v.name, "' has dynamic dim ", d,
                                    named ? absl::StrCat(" ('", v.dim_names[d], "')") : "",
                                    ": run it at input shapes, not at a batch size");
    }
  }
}

Executor::~Executor() { PrintProfile(); }

void Executor::SetProfiling(bool on) {
  profiling_ = on;
  if (on) {
    times_.assign(plan_.steps.size(), StepTimes());
    profile_runs_ = 0;
    events_.clear();
    events_full_ = false;
    profile_start_ = std::chrono::steady_clock::now();
  }
}

absl::StatusOr<BatchState*> Executor::GetState(const std::vector<int64_t>& key,
                                               const std::vector<Shape>* input_shapes) {
  const int64_t batch = key[0];
  auto it = per_batch_.find(key);
  if (it != per_batch_.end()) {
    it->second.last_used = ++use_clock_;
    // Nothing points into the arena between runs (BindData points every
    // value again at each one), so it may be allocated again here.
    if (DropIdlePlans()) {
      if (absl::Status s = FitArena(batch, it->second.arena_bytes, /*shrink=*/true); !s.ok()) {
        return s;
      }
    }
    return &it->second;
  }
  BatchState state;
  auto shapes = PropagateShapesAndValues(
      graph_, input_shapes != nullptr ? *input_shapes : InputShapesForBatch(graph_, batch),
      state.shape_values);
  if (!shapes.ok()) {
    if (input_shapes == nullptr) return shapes.status();
    return absl::Status(shapes.status().code(),
                        absl::StrCat("at input shapes ", DescribeSignature(graph_, *input_shapes),
                                     ": ", shapes.status().message()));
  }
  for (ValueId v : graph_.shape_parameters()) {
    // Read as a constant by its readers: never left to them as data.
    if (state.shape_values.contains(v)) continue;
    const std::string at =
        input_shapes == nullptr
            ? absl::StrFormat("a batch of %d rows", batch)
            : absl::StrCat("input shapes ", DescribeSignature(graph_, *input_shapes));
    return absl::InvalidArgumentError(
        absl::StrCat("at ", at, ": value '", graph_.value(v).name,
                     "', computed from shapes, is not known there (a shape value holds at most ",
                     kMaxShapeValueElements, " elements)"));
  }
  state.batch = batch;
  state.shapes = *std::move(shapes);
  PlanBatchSplit(plan_, state);
  PlanShapeValueSteps(plan_, state);
  PlanArena(plan_, state);
  // Refused before anything of its size is allocated or prepared.
  if (plan_.max_activation_bytes > 0 && state.arena_bytes > plan_.max_activation_bytes) {
    constexpr double kMiB = 1 << 20;
    const std::string what =
        input_shapes == nullptr
            ? absl::StrFormat("a batch of %d rows", batch)
            : absl::StrCat("input shapes ", DescribeSignature(graph_, *input_shapes));
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s needs %d activation bytes (%.1f MiB), above the limit of %d "
        "(%.1f MiB, max_activation_bytes)",
        what, state.arena_bytes, static_cast<double>(state.arena_bytes) / kMiB,
        plan_.max_activation_bytes, static_cast<double>(plan_.max_activation_bytes) / kMiB));
  }
  EvictBatchPlans();
  const bool dropped_idle = DropIdlePlans();
  if (absl::Status s = FitArena(batch, state.arena_bytes, dropped_idle); !s.ok()) return s;
  state.data.assign(graph_.num_values(), nullptr);
  PlanStepCosts(plan_, state);
  if (absl::Status s = PrepareSteps(state); !s.ok()) return s;
  state.last_used = ++use_clock_;
  return &per_batch_.emplace(key, std::move(state)).first->second;
}

absl::StatusOr<BatchState*> Executor::GetBatchState(int64_t batch) {
  batch_key_.assign(1, batch);  // no allocation after the first
  return GetState(batch_key_, nullptr);
}

absl::StatusOr<int64_t> Executor::ActivationBytes(const std::vector<Shape>& input_shapes) {
  auto key = CheckSignature(graph_, input_shapes);
  if (!key.ok()) return Named(key.status());
  auto state = GetState(*key, &input_shapes);
  if (!state.ok()) return state.status();
  return (*state)->arena_bytes;
}

absl::Status Executor::Named(const absl::Status& s) const {
  return absl::Status(s.code(), absl::StrCat(plan_.name, ": ", s.message()));
}

absl::StatusOr<int64_t> Executor::ActivationBytes(int64_t batch) {
  if (!batch_refusal_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(plan_.name, ": ", batch_refusal_));
  }
  auto state = GetBatchState(batch);
  if (!state.ok()) return state.status();
  return (*state)->arena_bytes;
}

absl::Status Executor::FitArena(int64_t batch, int64_t arena_bytes, bool shrink) {
  // One arena for every batch size: at least as large as the largest plan
  // kept.
  int64_t needed = std::max<int64_t>(arena_bytes, 1);
  for (const auto& [size, state] : per_batch_) needed = std::max(needed, state.arena_bytes);
  const int64_t bytes = (needed + kAlignment - 1) / kAlignment * kAlignment;
  // Smaller only after idle plans went, and only to half or less: sizes
  // coming and going (more than batch_plans of them, growing) would
  // otherwise map it again at every new plan.
  if (arena_ != nullptr && bytes <= arena_bytes_ && (!shrink || arena_bytes_ / 2 <= bytes)) {
    return absl::OkStatus();
  }
  arena_.reset();
  arena_bytes_ = 0;
  // Page-aligned, so kAlignment-aligned.
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " activation bytes for batch ", batch));
  }
  arena_ = std::unique_ptr<float, Unmap>(static_cast<float*>(p), Unmap{static_cast<size_t>(bytes)});
  arena_bytes_ = bytes;
  return absl::OkStatus();
}

void Executor::Unmap::operator()(float* p) const {
  if (p != nullptr) munmap(p, bytes);
}

absl::Status Executor::PrepareSteps(const BatchState& state) {
  const ScopedShapeValues scope(&graph_, &state.shape_values);
  for (size_t k = 0; k < plan_.steps.size(); ++k) {
    if (state.dropped[k]) continue;  // never run at this signature
    Step& step = *plan_.steps[k];
    // oneDNN sizes a primitive's thread split when it is created: create it
    // with the threads it will run on.
    omp_set_num_threads(state.serial[k] ? 1 : plan_.threads);
    absl::Status s = absl::OkStatus();
    if (static_cast<int>(k) >= state.split_steps) {
      s = step.Prepare(state.shapes);
    } else {
      s = step.Prepare(state.slice_shapes);
      if (s.ok() && state.batch % state.slice_rows != 0) s = step.Prepare(state.tail_shapes);
    }
    omp_set_num_threads(plan_.threads);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(step.Describe(), ": ", s.message()));
  }
  return absl::OkStatus();
}

void Executor::EvictBatchPlans() {
  // Bounded: a new batch size drops the least recently used plan (planned
  // again if that size comes back; the kernels keep their primitives).
  while (plan_.batch_plans > 0 && per_batch_.size() >= static_cast<size_t>(plan_.batch_plans)) {
    auto oldest = per_batch_.begin();
    for (auto p = per_batch_.begin(); p != per_batch_.end(); ++p) {
      if (p->second.last_used < oldest->second.last_used) oldest = p;
    }
    DropPlan(oldest);
  }
}

bool Executor::DropIdlePlans() {
  if (plan_.batch_plan_idle_runs <= 0) return false;
  const uint64_t idle = static_cast<uint64_t>(plan_.batch_plan_idle_runs);
  bool dropped = false;
  for (auto p = per_batch_.begin(); p != per_batch_.end();) {
    auto next = std::next(p);
    if (use_clock_ - p->second.last_used > idle) {
      DropPlan(p);
      dropped = true;
    }
    p = next;
  }
  return dropped;
}

void Executor::DropPlan(std::map<std::vector<int64_t>, BatchState>::iterator it) {
  if (last_state_ == &it->second) last_state_ = nullptr;
  per_batch_.erase(it);
}

std::vector<std::vector<int64_t>> Executor::OutputShapes(int64_t batch) const {
  if (!batch_refusal_.empty()) return {};
  auto it = per_batch_.find(std::vector<int64_t>{batch});
  std::vector<Shape> shapes;
  if (it != per_batch_.end()) {
    shapes = it->second.shapes;
  } else if (auto s = PropagateShapes(graph_, InputShapesForBatch(graph_, batch)); s.ok()) {
    shapes = *std::move(s);
  } else {
    return {};
  }
  std::vector<std::vector<int64_t>> out;
  for (ValueId v : graph_.outputs()) out.push_back(shapes[v]);
  return out;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> Executor::OutputShapes(
    const std::vector<Shape>& input_shapes) const {
  auto key = CheckSignature(graph_, input_shapes);
  if (!key.ok()) return Named(key.status());
  auto shapes = ValueShapes(*key, input_shapes);
  if (!shapes.ok()) return shapes.status();
  std::vector<std::vector<int64_t>> out;
  for (ValueId v : graph_.outputs()) out.push_back((*shapes)[v]);
  return out;
}

absl::StatusOr<std::vector<Shape>> Executor::ValueShapes(
    const std::vector<int64_t>& key, const std::vector<Shape>& input_shapes) const {
  if (auto it = per_batch_.find(key); it != per_batch_.end()) return it->second.shapes;
  auto shapes = PropagateShapes(graph_, input_shapes);
  if (!shapes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(plan_.name, ": cannot run at input shapes ",
                                                   DescribeSignature(graph_, input_shapes), ": ",
                                                   shapes.status().message()));
  }
  return shapes;
}

template <bool kProfile>
absl::Status Executor::RunRange(const StepContext& ctx, const BatchState& state, size_t begin,
                                size_t end, bool first) {
  using Clock = std::chrono::steady_clock;
  bool serial = false;
  for (size_t k = begin; k < end; ++k) {
    if (state.dropped[k]) continue;  // its shape values were computed with the plan
    if (state.serial[k] != serial) {
      serial = state.serial[k];
      omp_set_num_threads(serial ? 1 : plan_.threads);
    }
    Clock::time_point t0;
    if constexpr (kProfile) {
      *ctx.residual_seconds = 0;
      t0 = Clock::now();
    }
    absl::Status s = plan_.steps[k]->Run(ctx);
    if (!s.ok()) {
      if (serial) omp_set_num_threads(plan_.threads);
      return absl::Status(s.code(), absl::StrCat(plan_.steps[k]->Describe(), ": ", s.message()));
    }
    if constexpr (kProfile) {
      // The CPU stream is in order and synchronous: the primitive is done.
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      StepTimes& t = times_[k];
      if (first) {
        ++t.calls;
        t.flops += state.step_flops[k];
        t.bytes += state.step_bytes[k];
        t.residual_bytes += state.residual_bytes[k];
      }
      if (record_events_) {
        events_.push_back({static_cast<int>(k), profile_runs_ - 1,
                           std::chrono::duration<double>(t0 - profile_start_).count(), dt});
      }
      t.seconds += dt - *ctx.residual_seconds;
      t.residual_seconds += *ctx.residual_seconds;
    }
  }
  if (serial) omp_set_num_threads(plan_.threads);
  return absl::OkStatus();
}

template <bool kProfile>
absl::Status Executor::RunSteps(const StepContext& ctx, BatchState& state) {
  double residual = 0;
  StepContext timed = ctx;
  if constexpr (kProfile) {
    timed.residual_seconds = &residual;
    last_state_ = &state;
    ++profile_runs_;
    // Events of whole runs only: one that does not fit ends the keeping.
    // A split step runs once per slice.
    const int64_t slices =
        state.split_steps > 0 ? (state.batch + state.slice_rows - 1) / state.slice_rows : 1;
    const int64_t calls = static_cast<int64_t>(plan_.steps.size()) - state.dropped_steps +
                          state.split_steps * (slices - 1);
    events_full_ = events_full_ || static_cast<int64_t>(events_.size()) + calls > event_limit_;
    record_events_ = !events_full_;
  }
  const int64_t batch = state.batch;
  if (state.split_steps > 0) {
    std::vector<float*>& slice = state.slice_data;
    for (int64_t row = 0; row < batch; row += state.slice_rows) {
      const int64_t rows = std::min(state.slice_rows, batch - row);
      for (ValueId v : state.split_values) {
        slice[v] = ctx.data[v] == nullptr || state.slice_local[v]
                       ? ctx.data[v]
                       : ctx.data[v] + row * state.row_floats[v];
      }
      StepContext part{ctx.stream,
                       rows == state.slice_rows ? state.slice_shapes : state.tail_shapes, slice,
                       timed.residual_seconds};
      if (absl::Status s = RunRange<kProfile>(part, state, 0, state.split_steps, row == 0);
          !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s =
          RunRange<kProfile>(timed, state, state.split_steps, plan_.steps.size(), true);
      !s.ok()) {
    return s;
  }
  try {
    stream_.wait();
  } catch (const dnnl::error& e) {
    return kernels::DnnlErrorToStatus(e, "waiting for the stream");
  }
  return absl::OkStatus();
}

absl::Status Executor::CheckBatch(int64_t batch) const {
  if (!batch_refusal_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(plan_.name, ": ", batch_refusal_));
  }
  bool dynamic = false;
  for (ValueId v : graph_.inputs()) {
    dynamic |= !graph_.value(v).shape.empty() && graph_.value(v).shape[0] < 0;
  }
  if (batch < 1 || (!dynamic && batch != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(plan_.name, ": batch ", batch,
                     dynamic ? " must be >= 1" : " must be 1 (no input has a dynamic dim 0)"));
  }
  return absl::OkStatus();
}

absl::Status Executor::CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                        const std::vector<size_t>& output_bytes) const {
  if (absl::Status s = CheckBatch(batch); !s.ok()) return s;
  const std::vector<Shape> in_shapes = InputShapesForBatch(graph_, batch);
  const auto it = per_batch_.find(std::vector<int64_t>{batch});
  return CheckSizes(absl::StrCat(batch, " rows"), in_shapes,
                    it != per_batch_.end() ? &it->second.shapes : nullptr, input_bytes,
                    output_bytes);
}

absl::Status Executor::CheckBufferSizes(const std::vector<Shape>& input_shapes,
                                        const std::vector<size_t>& input_bytes,
                                        const std::vector<size_t>& output_bytes) const {
  auto key = CheckSignature(graph_, input_shapes);
  if (!key.ok()) return Named(key.status());
  const auto it = per_batch_.find(*key);
  return CheckSizes("these input shapes", input_shapes,
                    it != per_batch_.end() ? &it->second.shapes : nullptr, input_bytes,
                    output_bytes);
}

absl::Status Executor::CheckSizes(const std::string& at, const std::vector<Shape>& in_shapes,
                                  const std::vector<Shape>* planned,
                                  const std::vector<size_t>& input_bytes,
                                  const std::vector<size_t>& output_bytes) const {
  if (input_bytes.size() != graph_.inputs().size() ||
      output_bytes.size() != graph_.outputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        plan_.name, ": expected ", graph_.inputs().size(), " inputs and ", graph_.outputs().size(),
        " outputs, got ", input_bytes.size(), " and ", output_bytes.size()));
  }
  // Sizes in bytes, checked for overflow (a shape the engine would refuse
  // anyway must not wrap around to a size that matches).
  auto bytes_of = [&](const Shape& shape, ValueId v) -> std::optional<size_t> {
    uint64_t n = DataTypeSize(RuntimeType(graph_, v));
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))) {
        return std::nullopt;
      }
      n *= static_cast<uint64_t>(d);
    }
    return static_cast<size_t>(n);
  };
  auto mismatch = [&](const char* kind, ValueId v, const Shape& shape, std::optional<size_t> want,
                      size_t have) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " '", graph_.value(v).name, "' at ", at, " is ",
                     kernels::ShapeToString(shape), " of ", DataTypeName(RuntimeType(graph_, v)),
                     want ? absl::StrCat(" (", *want, " bytes)") : std::string(" (too large)"),
                     "; its buffer holds ", have, " bytes"));
  };
  for (size_t i = 0; i < input_bytes.size(); ++i) {
    const ValueId v = graph_.inputs()[i];
    const auto want = bytes_of(in_shapes[i], v);
    if (!want || *want != input_bytes[i]) {
      return mismatch("input", v, in_shapes[i], want, input_bytes[i]);
    }
  }
  absl::StatusOr<std::vector<Shape>> shapes = planned != nullptr
                                                  ? absl::StatusOr<std::vector<Shape>>(*planned)
                                                  : PropagateShapes(graph_, in_shapes);
  if (!shapes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(plan_.name, ": cannot run at ", at, ": ", shapes.status().message()));
  }
  for (size_t j = 0; j < output_bytes.size(); ++j) {
    const ValueId v = graph_.outputs()[j];
    const auto want = bytes_of((*shapes)[v], v);
    if (!want || *want != output_bytes[j]) {
      return mismatch("output", v, (*shapes)[v], want, output_bytes[j]);
    }
  }
  return absl::OkStatus();
}

void Executor::BindData(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                        BatchState& state) const {
  // Point every root at its bytes, then every view at its root's.
  std::vector<float*>& data = state.data;
  for (size_t i = 0; i < inputs.size(); ++i) {
    data[graph_.inputs()[i]] = static_cast<float*>(const_cast<void*>(inputs[i]));
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    if (plan_.root[v] != v) continue;
    switch (plan_.storage[v]) {
      case Storage::kInput:
        break;
      case Storage::kConstant: {
        const Constant* c = graph_.FindConstant(v);
        // Constants of other types: their exact bytes.
        data[v] = c->type == DataType::kFloat32 || c->type == DataType::kUnknown
                      ? const_cast<float*>(c->f32.data.data())
                      : reinterpret_cast<float*>(const_cast<uint8_t*>(c->bytes.data()));
        break;
      }
      case Storage::kArena:
        data[v] = state.arena_offset[v] >= 0 ? arena_.get() + state.arena_offset[v] : nullptr;
        break;
      case Storage::kOutput:
        data[v] = static_cast<float*>(outputs[plan_.output_slot[v]]);
        break;
    }
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) data[v] = data[plan_.root[v]];
}

absl::Status Executor::CheckBuffers(const std::vector<const void*>& inputs,
                                    const std::vector<void*>& outputs) const {
  if (inputs.size() != graph_.inputs().size() || outputs.size() != graph_.outputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        plan_.name, ": expected ", graph_.inputs().size(), " inputs and ", graph_.outputs().size(),
        " outputs, got ", inputs.size(), " and ", outputs.size()));
  }
  for (const void* p : inputs) {
    if (p == nullptr) return absl::InvalidArgumentError("null input buffer");
  }
  for (const void* p : outputs) {
    if (p == nullptr) return absl::InvalidArgumentError("null output buffer");
  }
  return absl::OkStatus();
}

absl::Status Executor::Run(int64_t batch, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs) {
  if (absl::Status s = CheckBatch(batch); !s.ok()) return s;
  if (absl::Status s = CheckBuffers(inputs, outputs); !s.ok()) return s;
  if (plan_.num_threads > 0) omp_set_num_threads(plan_.num_threads);
  auto state_or = GetBatchState(batch);
  if (!state_or.ok()) return state_or.status();
  return RunState(**state_or, inputs, outputs);
}

absl::Status Executor::Run(const std::vector<Shape>& input_shapes,
                           const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs) {
  auto key = CheckSignature(graph_, input_shapes);
  if (!key.ok()) return Named(key.status());
  if (absl::Status s = CheckBuffers(inputs, outputs); !s.ok()) return s;
  if (plan_.num_threads > 0) omp_set_num_threads(plan_.num_threads);
  auto state_or = GetState(*key, &input_shapes);
  if (!state_or.ok()) return state_or.status();
  return RunState(**state_or, inputs, outputs);
}

absl::Status Executor::RunState(BatchState& state, const std::vector<const void*>& inputs,
                                const std::vector<void*>& outputs) {
  BindData(inputs, outputs, state);
  const ScopedShapeValues scope(&graph_, &state.shape_values);
  const std::vector<float*>& data = state.data;
  const StepContext ctx{stream_, state.shapes, data};
  if (absl::Status s = profiling_ ? RunSteps<true>(ctx, state) : RunSteps<false>(ctx, state);
      !s.ok()) {
    return s;
  }
  state.ran = true;
  for (size_t j = 0; j < outputs.size(); ++j) {
    const ValueId v = graph_.outputs()[j];
    if (plan_.storage[plan_.root[v]] == Storage::kOutput &&
        plan_.output_slot[plan_.root[v]] == static_cast<int>(j)) {
      continue;  // written in place
    }
    const size_t bytes =
        kernels::NumElements(state.shapes[v]) * DataTypeSize(RuntimeType(graph_, v));
    if (bytes > 0) std::memcpy(outputs[j], data[v], bytes);  // empty: data may be null
  }
  return absl::OkStatus();
}

void Executor::PrintProfile() const {
  if (!print_profile_at_exit_ || times_.empty() || profile_runs_ == 0) return;
  base::Log(base::LogLevel::kInfo, "engine", absl::StrCat("step profile for ", plan_.name),
            {{"path", plan_.name}});
  base::LogBlock(base::LogLevel::kInfo, "engine", FormatStepProfile(Profile(), profile_runs_, 15));
}

std::vector<StepProfile> Executor::Profile() const {
  std::vector<StepProfile> rows;
  if (times_.size() != plan_.steps.size()) return rows;
  for (size_t k = 0; k < plan_.steps.size(); ++k) {
    // Steps the last signature run dropped (shape values) are not listed.
    if (last_state_ != nullptr && last_state_->dropped[k]) continue;
    const Step& step = *plan_.steps[k];
    const std::string d = step.Describe();
    StepProfile row;
    row.index = static_cast<int>(k);
    row.kind = d.substr(0, d.find(':'));
    row.description = d;
    row.layouts = step.Layouts();
    const bool sliced = last_state_ != nullptr && static_cast<int>(k) < last_state_->split_steps;
    if (last_state_ != nullptr) {
      row.implementation =
          step.Implementation(sliced ? last_state_->slice_shapes : last_state_->shapes);
      row.threads = last_state_->serial[k] ? 1 : plan_.threads;
    }
    if (sliced) row.slice_rows = last_state_->slice_rows;
    row.calls = times_[k].calls;
    row.seconds = times_[k].seconds;
    row.flops = times_[k].flops;
    row.bytes = times_[k].bytes;
    row.precision = step.traits().arithmetic;
    rows.push_back(row);
    // A conv or matmul writing into its residual's bytes has nothing to copy.
    const ValueId out = step.traits().residual_output;
    if (out != kNoValue && last_state_ != nullptr &&
        BytesOwner(plan_, out, last_state_->shapes) != out) {
      continue;
    }
    if (step.traits().residual_input != kNoValue) {
      StepProfile r;
      r.index = static_cast<int>(k);
      r.kind = "reorder";
      r.description = absl::StrCat("reorder: residual into ", d);
      r.layouts = step.ResidualLayouts();
      r.calls = times_[k].calls;
      r.seconds = times_[k].residual_seconds;
      r.bytes = times_[k].residual_bytes;
      rows.push_back(r);
    }
  }
  return rows;
}

absl::StatusOr<std::vector<PlannedStep>> Executor::PlanAt(int64_t batch) const {
  return PlanAtKey(std::vector<int64_t>{batch}, absl::StrCat("batch ", batch));
}

absl::StatusOr<std::vector<PlannedStep>> Executor::PlanAt(
    const std::vector<Shape>& input_shapes) const {
  auto key = CheckSignature(graph_, input_shapes);
  if (!key.ok()) return Named(key.status());
  return PlanAtKey(*key, absl::StrCat("input shapes ", DescribeSignature(graph_, input_shapes)));
}

absl::StatusOr<std::vector<PlannedStep>> Executor::PlanAtKey(const std::vector<int64_t>& key,
                                                             const std::string& at) const {
  auto it = per_batch_.find(key);
  if (it == per_batch_.end() || !it->second.ran) {
    return absl::FailedPreconditionError(
        absl::StrCat("no run at ", at, " yet: implementations are known after one"));
  }
  const BatchState& state = it->second;
  std::vector<PlannedStep> plan;
  for (size_t k = 0; k < plan_.steps.size(); ++k) {
    if (state.dropped[k]) continue;  // not run at this signature (shape values)
    const Step& step = *plan_.steps[k];
    const bool sliced = static_cast<int>(k) < state.split_steps;
    PlannedStep row;
    row.index = static_cast<int>(k);
    row.description = step.Describe();
    row.kind = row.description.substr(0, row.description.find(':'));
    row.layouts = step.Layouts();
    row.implementation = step.Implementation(sliced ? state.slice_shapes : state.shapes);
    row.reference = kernels::IsReferenceImplementation(row.implementation);
    row.serial = state.serial[k] != 0;
    row.slice_rows = sliced ? state.slice_rows : 0;
    plan.push_back(std::move(row));
  }
  return plan;
}

}  // namespace numaserve::engine::runtime
