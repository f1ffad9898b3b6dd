// CompiledModelImpl (compiled_model_impl.h): the memory plan. Activation
// layouts, value lifetimes, in-place residuals, storage, and the batch
// split (which steps run in slices of rows).
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

void CompiledModelImpl::PlanInPlaceResiduals() {
  in_place_of_.assign(graph_.num_values(), kNoValue);
  if (!options_.in_place_residuals) return;
  for (size_t k = 0; k < steps_.size(); ++k) {
    // Conv's residual sum and MatMul's residual (or Gemm's C).
    const StepTraits& traits = steps_[k]->traits();
    const ValueId residual = traits.residual_input;
    if (residual == kNoValue) continue;
    const ValueId source = traits.residual_source, d = traits.residual_output;
    const ValueId s = root_[residual];
    if (root_[d] != d || storage_[s] != Storage::kArena || storage_[d] != Storage::kArena ||
        internal_[s] || internal_[d] || first_step_[s] < 0 || first_step_[d] < 0 ||
        last_step_[s] != static_cast<int>(k) || root_[source] == s ||
        shapes1_[residual] != shapes1_[d] || blocked_[s] != blocked_[d]) {
      continue;
    }
    in_place_of_[d] = s;
    // The bytes now live until d's last reader: extend every owner's
    // lifetime along the chain (residual blocks chain through each other).
    for (ValueId t = s; t != kNoValue; t = in_place_of_[t]) {
      last_step_[t] = std::max(last_step_[t], last_step_[d]);
    }
  }
}

ValueId CompiledModelImpl::BytesOwner(ValueId v, const std::vector<Shape>& shapes) const {
  while (in_place_of_[v] != kNoValue && shapes[in_place_of_[v]] == shapes[v]) v = in_place_of_[v];
  return v;
}

void CompiledModelImpl::PlanLifetimes(const std::vector<int>& producer,
                                      const std::vector<std::vector<int>>& consumers) {
  const int num_values = graph_.num_values();
  first_step_.assign(num_values, -1);
  last_step_.assign(num_values, -1);
  for (ValueId v = 0; v < num_values; ++v) {
    if (root_[v] != v || storage_[v] != Storage::kArena || producer[v] < 0) continue;
    first_step_[v] = step_of_node_[producer[v]];
  }
  for (ValueId v = 0; v < num_values; ++v) {
    const ValueId r = root_[v];
    if (storage_[r] != Storage::kArena || first_step_[r] < 0) continue;
    last_step_[r] = std::max(last_step_[r], first_step_[r]);
    for (int c : consumers[v]) last_step_[r] = std::max(last_step_[r], step_of_node_[c]);
  }
  // A value that only the step producing it reads (a conv's output before
  // its fused BatchNormalization, activation or depthwise conv) is never
  // stored: it needs no space.
  internal_.assign(num_values, false);
  std::vector<int> readers(num_values, 0), outside(num_values, 0);
  for (ValueId v = 0; v < num_values; ++v) {
    const ValueId r = root_[v];
    if (storage_[r] != Storage::kArena || first_step_[r] < 0) continue;
    for (int c : consumers[v]) {
      ++readers[r];
      if (step_of_node_[c] != first_step_[r]) ++outside[r];
    }
  }
  for (ValueId v = 0; v < num_values; ++v) {
    internal_[v] = root_[v] == v && storage_[v] == Storage::kArena && first_step_[v] >= 0 &&
                   readers[v] > 0 && outside[v] == 0;
  }
}

void CompiledModelImpl::ChooseBlockedLayout() {
  using Layout = CompileOptions::ActivationLayout;
  bool channels_last = options_.activation_layout == Layout::kChannelsLast;
  if (options_.activation_layout == Layout::kAuto) {
    // oneDNN 2.6's AMX convs (brgconv, INT8 and BF16) read and write only
    // channels-last; on channel-blocked tensors BF16 lands on the AVX512_BF16
    // kernels, which on AMX Xeons are no faster than FP32.
    const bool amx_bf16 =
        options_.precision == Precision::kBf16 && kernels::GetBf16Support().path == "amx_bf16";
    for (size_t i = 0; i < graph_.nodes().size(); ++i) {
      const bool conv = graph_.nodes()[i].op_type == "Conv";
      channels_last = channels_last || (conv && (int8_input_[i] || amx_bf16));
    }
  }
  blocked_layout_ = channels_last ? kernels::BlockedLayout::kChannelsLast
                                  : kernels::BlockedLayout::kChannelBlocked;
}

void CompiledModelImpl::ChooseLayouts(const std::vector<Shape>& shapes1) {
  const int num_values = graph_.num_values();
  blocked_.assign(num_values, false);
  for (const auto& step : steps_) {
    const ValueId v = step->traits().blocked_write;
    if (v != kNoValue && root_[v] == v && storage_[v] == Storage::kArena &&
        shapes1[v].size() >= 3 && shapes1[v].size() <= 5) {
      blocked_[v] = true;
    }
  }
  for (ValueId v = 0; v < num_values; ++v) {
    if (root_[v] != v) blocked_[root_[v]] = false;  // a view reads it plain
  }
  for (bool changed = true; changed;) {
    changed = false;
    auto unblock = [&](ValueId v) {
      if (v != kNoValue && blocked_[v]) {
        blocked_[v] = false;
        changed = true;
      }
    };
    for (const auto& step : steps_) {
      const std::vector<ValueId>& ok = step->traits().blocked_reads;
      for (ValueId r : step->traits().reads) {
        if (r != kNoValue && std::find(ok.begin(), ok.end(), r) == ok.end()) unblock(r);
      }
    }
  }
  for (const auto& step : steps_) step->SetLayouts(blocked_);
}

// Roots produced by a step write straight into the caller's output buffer
// when exactly one graph output resolves to them; outputs that are views of
// inputs or constants, or that share a root, are copied at the end of Run.
void CompiledModelImpl::AssignStorage() {
  const int num_values = graph_.num_values();
  storage_.assign(num_values, Storage::kArena);
  output_slot_.assign(num_values, -1);
  for (ValueId v : graph_.inputs()) storage_[v] = Storage::kInput;
  for (const auto& [v, c] : graph_.constants()) storage_[v] = Storage::kConstant;
  std::vector<int> outputs_per_root(num_values, 0);
  for (ValueId v : graph_.outputs()) ++outputs_per_root[root_[v]];
  for (size_t j = 0; j < graph_.outputs().size(); ++j) {
    const ValueId r = root_[graph_.outputs()[j]];
    if (storage_[r] == Storage::kArena && outputs_per_root[r] == 1) {
      storage_[r] = Storage::kOutput;
      output_slot_[r] = static_cast<int>(j);
    }
  }
}

// What ChooseBatchSplit found: the last split step (-1: no split gains),
// the most rows a slice may hold and the floats per row of each value.
struct CompiledModelImpl::BatchSplitChoice {
  int best_end = -1;
  int64_t best_rows = 0;
  std::vector<int64_t> row_floats;  // by ValueId
};

void CompiledModelImpl::PlanBatchSplit(int64_t batch, BatchState& state) const {
  const int num_values = graph_.num_values();
  state.slice_local.assign(num_values, false);
  const int64_t cache = options_.batch_split_cache_bytes;
  if (cache <= 0 || batch < 2) return;
  BatchSplitChoice choice = ChooseBatchSplit(batch, state.shapes, cache);
  if (choice.best_end < 0) return;  // best_rows >= 1: the step made two slices or more
  // Of the sizes between half the most rows and that, one dividing the
  // batch is preferred.
  int64_t rows = choice.best_rows;
  if (rows * 2 > batch) return;  // not two slices: nothing to gain
  for (int64_t r = rows; r * 2 > rows; --r) {
    if (batch % r == 0) {
      rows = r;
      break;
    }
  }
  state.split_steps = choice.best_end + 1;
  state.slice_rows = rows;
  state.row_floats = std::move(choice.row_floats);
  MarkSliceLocal(state);
  std::vector<bool> seen(num_values, false);
  for (int k = 0; k < state.split_steps; ++k) {
    for (ValueId v : steps_[k]->traits().row_wise) {
      if (v != kNoValue && !seen[v]) {
        seen[v] = true;
        state.split_values.push_back(v);
      }
    }
  }
  state.slice_shapes = state.shapes;
  for (ValueId v : state.split_values) state.slice_shapes[v][0] = rows;
  if (batch % rows != 0) {
    state.tail_shapes = state.shapes;
    for (ValueId v : state.split_values) state.tail_shapes[v][0] = batch % rows;
  }
  state.slice_data.assign(num_values, nullptr);
}

CompiledModelImpl::BatchSplitChoice CompiledModelImpl::ChooseBatchSplit(
    int64_t batch, const std::vector<Shape>& shapes, int64_t cache) const {
  const int num_values = graph_.num_values();
  // The leading row-wise steps whose values all have the batch as their
  // leading dimension; of those, the prefix that saves the most memory
  // traffic. Unsplit, a step's output larger than the cache goes to memory
  // and comes back (about twice its bytes); split, it stays in the cache (a
  // step reading a large value but writing a small one gains nothing: what
  // it writes is what the next step finds in the cache). But every slice
  // after the first reads the split steps' weights again: with small slices
  // and large weights (a CNN's last stages on an 8 MiB last-level cache)
  // that costs more than it saves. ResNet-50 at batch 32 ran 8% slower in
  // slices of one row through all its stages than unsplit on such a CPU.
  BatchSplitChoice choice;
  std::vector<int64_t>& row_floats = choice.row_floats;
  row_floats.assign(num_values, 0);
  int& best_end = choice.best_end;
  double saved = 0, weights = 0, best_net = 0;
  // The most rows a slice may hold for the steps so far: a step's largest
  // value for that many rows and its weights (read again by every slice)
  // fill at most half the cache, so that they and the next step's output
  // stay there; at least an eighth of the cache goes to the values.
  int64_t max_rows = std::numeric_limits<int64_t>::max();
  int64_t& best_rows = choice.best_rows;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const std::vector<ValueId>& values = steps_[k]->traits().row_wise;
    if (values.empty()) break;
    bool row_wise = true;
    int64_t written_bytes = 0, step_row_bytes = 0;
    for (ValueId v : values) {
      if (v == kNoValue) continue;
      const Shape& s = shapes[v];
      const Shape& s1 = shapes1_[v];
      if (RuntimeType(graph_, v) != DataType::kFloat32 || s.empty() || s.size() != s1.size() ||
          s[0] != batch || s1[0] != 1 || !std::equal(s.begin() + 1, s.end(), s1.begin() + 1)) {
        row_wise = false;
        break;
      }
      const bool blocked = blocked_[root_[v]];
      const int64_t bytes = blocked ? kernels::ActivationBytes(s, true, blocked_layout_)
                                    : kernels::NumElements(s) * static_cast<int64_t>(sizeof(float));
      row_floats[v] = bytes / batch / static_cast<int64_t>(sizeof(float));
      step_row_bytes = std::max(step_row_bytes, bytes / batch);
      written_bytes = bytes;  // the last value is the one written
    }
    if (!row_wise) break;
    if (step_row_bytes > 0) {
      const int64_t budget = std::max(cache / 2 - steps_[k]->traits().weight_bytes, cache / 8);
      max_rows = std::min(max_rows, std::max<int64_t>(1, budget / step_row_bytes));
    }
    if (written_bytes > cache) saved += 2.0 * static_cast<double>(written_bytes);
    weights += static_cast<double>(steps_[k]->traits().weight_bytes);
    const int64_t slices = max_rows >= batch ? 1 : (batch + max_rows - 1) / max_rows;
    const double net = saved - static_cast<double>(slices - 1) * weights;
    if (slices >= 2 && net > best_net) {
      best_net = net;
      best_end = static_cast<int>(k);
      best_rows = max_rows;
    }
  }
  return choice;
}

void CompiledModelImpl::MarkSliceLocal(BatchState& state) const {
  const int num_values = graph_.num_values();
  // Slice-local: arena values written and last read by the split steps.
  for (ValueId v = 0; v < num_values; ++v) {
    if (root_[v] != v || storage_[v] != Storage::kArena || internal_[v]) continue;
    state.slice_local[v] = first_step_[v] >= 0 && last_step_[v] < state.split_steps;
  }
  // Values sharing bytes in place share their class (a chain's lifetime
  // already spans its members'; this only guards the invariant).
  for (bool changed = true; changed;) {
    changed = false;
    for (ValueId v = 0; v < num_values; ++v) {
      const ValueId s = in_place_of_[v];
      if (s != kNoValue && state.slice_local[v] != state.slice_local[s]) {
        state.slice_local[v] = state.slice_local[s] = false;
        changed = true;
      }
    }
  }
  for (ValueId v = 0; v < num_values; ++v) state.slice_local[v] = state.slice_local[root_[v]];
}

}  // namespace numaserve::engine::internal
