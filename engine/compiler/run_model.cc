// CompiledModelImpl (compiled_model_impl.h): running. The per-batch states
// (shapes, arena offsets, prepared steps) and Run.
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

absl::StatusOr<BatchState*> CompiledModelImpl::GetBatchState(int64_t batch) {
  auto it = per_batch_.find(batch);
  if (it != per_batch_.end()) {
    it->second.last_used = ++use_clock_;
    return &it->second;
  }
  auto shapes = PropagateShapes(graph_, InputShapesForBatch(graph_, batch));
  if (!shapes.ok()) return shapes.status();
  BatchState state;
  state.batch = batch;
  state.shapes = *std::move(shapes);
  PlanBatchSplit(batch, state);
  PlanArena(state);
  if (absl::Status s = GrowArena(batch, state.arena_bytes); !s.ok()) return s;
  state.data.assign(graph_.num_values(), nullptr);
  if (absl::Status s = PrepareSteps(batch, state); !s.ok()) return s;
  EvictBatchPlans();
  state.last_used = ++use_clock_;
  return &per_batch_.emplace(batch, std::move(state)).first->second;
}

void CompiledModelImpl::PlanArena(BatchState& state) const {
  const int num_values = graph_.num_values();
  state.arena_offset.assign(num_values, -1);
  // Greedy memory plan: largest first, each at the lowest offset that does
  // not overlap a placed value whose lifetime (in steps) intersects its own.
  constexpr int64_t kAlign = kAlignment / sizeof(float);
  struct Block {
    ValueId v;
    int64_t size;
  };
  std::vector<Block> blocks;
  for (ValueId v = 0; v < num_values; ++v) {
    if (root_[v] != v || storage_[v] != Storage::kArena || internal_[v]) continue;
    if (BytesOwner(v, state.shapes) != v) continue;  // placed with the residual it replaces
    // A slice-local value holds one slice of rows.
    const Shape& shape = state.slice_local[v] ? state.slice_shapes[v] : state.shapes[v];
    // Values of other types take their bytes, rounded up to whole floats.
    const int64_t bytes =
        kernels::NumElements(shape) * static_cast<int64_t>(DataTypeSize(RuntimeType(graph_, v)));
    const int64_t n = blocked_[v] ? kernels::ActivationBytes(shape, true, blocked_layout_) /
                                        static_cast<int64_t>(sizeof(float))
                                  : (bytes + static_cast<int64_t>(sizeof(float)) - 1) /
                                        static_cast<int64_t>(sizeof(float));
    blocks.push_back({v, (std::max<int64_t>(n, 1) + kAlign - 1) / kAlign * kAlign});
  }
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.size > b.size; });
  auto lifetime = [&](ValueId v) {
    // Values never written by a step (unused) still get their own space.
    if (first_step_[v] < 0) return std::make_pair(-1, std::numeric_limits<int>::max());
    // A batch-sized value the split steps write is written slice by slice
    // while those steps run again for the next slices: it lives from the
    // first of them on.
    if (first_step_[v] < state.split_steps && !state.slice_local[v]) {
      return std::make_pair(0, last_step_[v]);
    }
    return std::make_pair(first_step_[v], last_step_[v]);
  };
  std::vector<Block> placed;
  int64_t floats = 0;
  for (const Block& b : blocks) {
    const auto [b0, b1] = lifetime(b.v);
    std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of overlapping lives
    for (const Block& p : placed) {
      const auto [p0, p1] = lifetime(p.v);
      if (p0 <= b1 && b0 <= p1)
        busy.push_back({state.arena_offset[p.v], state.arena_offset[p.v] + p.size});
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [start, end] : busy) {
      if (offset + b.size <= start) break;
      offset = std::max(offset, end);
    }
    state.arena_offset[b.v] = offset;
    floats = std::max(floats, offset + b.size);
    placed.push_back(b);
  }
  for (ValueId v = 0; v < num_values; ++v) {
    if (root_[v] != v || storage_[v] != Storage::kArena || internal_[v]) continue;
    const ValueId owner = BytesOwner(v, state.shapes);
    if (owner != v) state.arena_offset[v] = state.arena_offset[owner];
  }
  state.arena_bytes = floats * static_cast<int64_t>(sizeof(float));
}

absl::Status CompiledModelImpl::GrowArena(int64_t batch, int64_t arena_bytes) {
  if (arena_bytes > arena_bytes_ || arena_ == nullptr) {
    // One arena for every batch size: it grows to the largest plan.
    const size_t bytes =
        (std::max<int64_t>(arena_bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    arena_.reset();
    arena_bytes_ = 0;
    arena_.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
    if (arena_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " activation bytes for batch ", batch));
    }
    arena_bytes_ = static_cast<int64_t>(bytes);
  }
  return absl::OkStatus();
}

absl::Status CompiledModelImpl::PrepareSteps(int64_t batch, BatchState& state) {
  for (const auto& step : steps_) {
    const double flops = step->Flops(state.shapes);
    int64_t elements = 0;
    for (ValueId v : step->traits().reads) {
      if (v != kNoValue) elements += kernels::NumElements(state.shapes[v]);
    }
    const bool serial = threads_ > 1 && (flops > 0 ? flops < options_.serial_below_flops
                                                   : elements < options_.serial_below_elements);
    state.step_flops.push_back(flops);
    state.step_bytes.push_back(StepBytes(*step, state.shapes));
    const ValueId residual = step->traits().residual_input;
    state.residual_bytes.push_back(
        residual == kNoValue
            ? 0.0
            : 2.0 * static_cast<double>(kernels::NumElements(state.shapes[residual])) *
                  sizeof(float));
    state.serial.push_back(serial);
    // oneDNN sizes a primitive's thread split when it is created: create it
    // with the threads it will run on.
    omp_set_num_threads(serial ? 1 : threads_);
    const size_t k = state.step_flops.size() - 1;
    absl::Status s = absl::OkStatus();
    if (static_cast<int>(k) >= state.split_steps) {
      s = step->Prepare(state.shapes);
    } else {
      s = step->Prepare(state.slice_shapes);
      if (s.ok() && batch % state.slice_rows != 0) s = step->Prepare(state.tail_shapes);
    }
    omp_set_num_threads(threads_);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(step->Describe(), ": ", s.message()));
  }
  return absl::OkStatus();
}

void CompiledModelImpl::EvictBatchPlans() {
  // Bounded: a new batch size drops the least recently used plan (planned
  // again if that size comes back; the kernels keep their primitives).
  while (options_.batch_plans > 0 &&
         per_batch_.size() >= static_cast<size_t>(options_.batch_plans)) {
    auto oldest = per_batch_.begin();
    for (auto p = per_batch_.begin(); p != per_batch_.end(); ++p) {
      if (p->second.last_used < oldest->second.last_used) oldest = p;
    }
    if (last_state_ == &oldest->second) {
      last_state_ = nullptr;
      last_shapes_ = nullptr;
    }
    per_batch_.erase(oldest);
  }
}

std::vector<std::vector<int64_t>> CompiledModelImpl::OutputShapes(int64_t batch) const {
  auto it = per_batch_.find(batch);
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

template <bool kProfile>
absl::Status CompiledModelImpl::RunRange(const StepContext& ctx, const BatchState& state,
                                         size_t begin, size_t end, bool first) {
  using Clock = std::chrono::steady_clock;
  bool serial = false;
  for (size_t k = begin; k < end; ++k) {
    if (state.serial[k] != serial) {
      serial = state.serial[k];
      omp_set_num_threads(serial ? 1 : threads_);
    }
    Clock::time_point t0;
    if constexpr (kProfile) {
      *ctx.residual_seconds = 0;
      t0 = Clock::now();
    }
    absl::Status s = steps_[k]->Run(ctx);
    if (!s.ok()) {
      if (serial) omp_set_num_threads(threads_);
      return absl::Status(s.code(), absl::StrCat(steps_[k]->Describe(), ": ", s.message()));
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
  if (serial) omp_set_num_threads(threads_);
  return absl::OkStatus();
}

template <bool kProfile>
absl::Status CompiledModelImpl::RunSteps(const StepContext& ctx, BatchState& state) {
  double residual = 0;
  StepContext timed = ctx;
  if constexpr (kProfile) {
    timed.residual_seconds = &residual;
    last_shapes_ = &state.shapes;
    last_state_ = &state;
    ++profile_runs_;
    // Events of whole runs only: one that does not fit ends the keeping.
    // A split step runs once per slice.
    const int64_t slices =
        state.split_steps > 0 ? (state.batch + state.slice_rows - 1) / state.slice_rows : 1;
    const int64_t calls = static_cast<int64_t>(steps_.size()) + state.split_steps * (slices - 1);
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
  if (absl::Status s = RunRange<kProfile>(timed, state, state.split_steps, steps_.size(), true);
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

absl::Status CompiledModelImpl::CheckBatch(int64_t batch) const {
  bool dynamic = false;
  for (ValueId v : graph_.inputs()) {
    dynamic |= !graph_.value(v).shape.empty() && graph_.value(v).shape[0] < 0;
  }
  if (batch < 1 || (!dynamic && batch != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.path, ": batch ", batch,
                     dynamic ? " must be >= 1" : " must be 1 (no input has a dynamic dim 0)"));
  }
  return absl::OkStatus();
}

absl::Status CompiledModelImpl::CheckBufferSizes(int64_t batch,
                                                 const std::vector<size_t>& input_bytes,
                                                 const std::vector<size_t>& output_bytes) const {
  if (absl::Status s = CheckBatch(batch); !s.ok()) return s;
  if (input_bytes.size() != graph_.inputs().size() ||
      output_bytes.size() != graph_.outputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        info_.path, ": expected ", graph_.inputs().size(), " inputs and ", graph_.outputs().size(),
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
  const std::vector<Shape> in_shapes = InputShapesForBatch(graph_, batch);
  for (size_t i = 0; i < input_bytes.size(); ++i) {
    const ValueId v = graph_.inputs()[i];
    const auto want = bytes_of(in_shapes[i], v);
    if (!want || *want != input_bytes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", graph_.value(v).name, "' at ", batch, " rows is ",
                       absl::StrCat("[", absl::StrJoin(in_shapes[i], ","), "]"), " of ",
                       DataTypeName(RuntimeType(graph_, v)),
                       want ? absl::StrCat(" (", *want, " bytes)") : std::string(" (too large)"),
                       "; its buffer holds ", input_bytes[i], " bytes"));
    }
  }
  const auto it = per_batch_.find(batch);
  absl::StatusOr<std::vector<Shape>> shapes =
      it != per_batch_.end() ? absl::StatusOr<std::vector<Shape>>(it->second.shapes)
                             : PropagateShapes(graph_, in_shapes);
  if (!shapes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.path, ": cannot run at ", batch, " rows: ", shapes.status().message()));
  }
  for (size_t j = 0; j < output_bytes.size(); ++j) {
    const ValueId v = graph_.outputs()[j];
    const auto want = bytes_of((*shapes)[v], v);
    if (!want || *want != output_bytes[j]) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", graph_.value(v).name, "' at ", batch, " rows is ",
                       absl::StrCat("[", absl::StrJoin((*shapes)[v], ","), "]"), " of ",
                       DataTypeName(RuntimeType(graph_, v)),
                       want ? absl::StrCat(" (", *want, " bytes)") : std::string(" (too large)"),
                       "; its buffer holds ", output_bytes[j], " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CompiledModelImpl::Run(int64_t batch, const std::vector<const void*>& inputs,
                                    const std::vector<void*>& outputs) {
  if (absl::Status s = CheckBatch(batch); !s.ok()) return s;
  if (inputs.size() != graph_.inputs().size() || outputs.size() != graph_.outputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        info_.path, ": expected ", graph_.inputs().size(), " inputs and ", graph_.outputs().size(),
        " outputs, got ", inputs.size(), " and ", outputs.size()));
  }
  for (const void* p : inputs) {
    if (p == nullptr) return absl::InvalidArgumentError("null input buffer");
  }
  for (const void* p : outputs) {
    if (p == nullptr) return absl::InvalidArgumentError("null output buffer");
  }
  if (options_.num_threads > 0) omp_set_num_threads(options_.num_threads);
  auto state_or = GetBatchState(batch);
  if (!state_or.ok()) return state_or.status();
  BatchState& state = **state_or;

  // Point every root at its bytes, then every view at its root's.
  std::vector<float*>& data = state.data;
  for (size_t i = 0; i < inputs.size(); ++i) {
    data[graph_.inputs()[i]] = static_cast<float*>(const_cast<void*>(inputs[i]));
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) {
    if (root_[v] != v) continue;
    switch (storage_[v]) {
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
        data[v] = static_cast<float*>(outputs[output_slot_[v]]);
        break;
    }
  }
  for (ValueId v = 0; v < graph_.num_values(); ++v) data[v] = data[root_[v]];

  const StepContext ctx{stream_, state.shapes, data};
  if (absl::Status s = profiling_ ? RunSteps<true>(ctx, state) : RunSteps<false>(ctx, state);
      !s.ok()) {
    return s;
  }
  state.ran = true;
  for (size_t j = 0; j < outputs.size(); ++j) {
    const ValueId v = graph_.outputs()[j];
    if (storage_[root_[v]] == Storage::kOutput && output_slot_[root_[v]] == static_cast<int>(j)) {
      continue;  // written in place
    }
    const size_t bytes =
        kernels::NumElements(state.shapes[v]) * DataTypeSize(RuntimeType(graph_, v));
    if (bytes > 0) std::memcpy(outputs[j], data[v], bytes);  // empty: data may be null
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine::internal
