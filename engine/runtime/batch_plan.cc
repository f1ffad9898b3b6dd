// The plan at one batch size (batch_plan.h): the batch split, the arena
// and the per-step costs.
#include "engine/runtime/batch_plan.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "engine/ops/typed_exec.h"
#include "kernels/onednn/conv_onednn.h"

namespace numaserve::engine::runtime {
namespace {

// What ChooseBatchSplit found: the last split step (-1: no split gains),
// the most rows a slice may hold and the floats per row of each value.
struct BatchSplitChoice {
  int best_end = -1;
  int64_t best_rows = 0;
  std::vector<int64_t> row_floats;  // by ValueId
};

// The prefix of row-wise steps whose split saves the most memory traffic at `shapes`.
BatchSplitChoice ChooseBatchSplit(const ExecutionPlan& plan, int64_t batch,
                                  const std::vector<Shape>& shapes, int64_t cache) {
  const int num_values = plan.graph->num_values();
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
  for (size_t k = 0; k < plan.steps.size(); ++k) {
    const std::vector<ValueId>& values = plan.steps[k]->traits().row_wise;
    if (values.empty()) break;
    bool row_wise = true;
    int64_t written_bytes = 0, step_row_bytes = 0;
    for (ValueId v : values) {
      if (v == kNoValue) continue;
      const Shape& s = shapes[v];
      const Shape& s1 = plan.shapes1[v];
      if (RuntimeType(*plan.graph, v) != DataType::kFloat32 || s.empty() || s.size() != s1.size() ||
          s[0] != batch || s1[0] != 1 || !std::equal(s.begin() + 1, s.end(), s1.begin() + 1)) {
        row_wise = false;
        break;
      }
      const bool blocked = plan.blocked[plan.root[v]];
      const int64_t bytes = blocked ? kernels::ActivationBytes(s, true, plan.blocked_layout)
                                    : kernels::NumElements(s) * static_cast<int64_t>(sizeof(float));
      row_floats[v] = bytes / batch / static_cast<int64_t>(sizeof(float));
      step_row_bytes = std::max(step_row_bytes, bytes / batch);
      written_bytes = bytes;  // the last value is the one written
    }
    if (!row_wise) break;
    if (step_row_bytes > 0) {
      const int64_t budget = std::max(cache / 2 - plan.steps[k]->traits().weight_bytes, cache / 8);
      max_rows = std::min(max_rows, std::max<int64_t>(1, budget / step_row_bytes));
    }
    if (written_bytes > cache) saved += 2.0 * static_cast<double>(written_bytes);
    weights += static_cast<double>(plan.steps[k]->traits().weight_bytes);
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

// Sets state.slice_local: the values the split steps alone write and read.
void MarkSliceLocal(const ExecutionPlan& plan, BatchState& state) {
  const int num_values = plan.graph->num_values();
  // Slice-local: arena values written and last read by the split steps.
  for (ValueId v = 0; v < num_values; ++v) {
    if (plan.root[v] != v || plan.storage[v] != Storage::kArena || plan.internal[v]) continue;
    state.slice_local[v] = plan.first_step[v] >= 0 && plan.last_step[v] < state.split_steps;
  }
  // Values sharing bytes in place share their class (a chain's lifetime
  // already spans its members'; this only guards the invariant).
  for (bool changed = true; changed;) {
    changed = false;
    for (ValueId v = 0; v < num_values; ++v) {
      const ValueId s = plan.in_place_of[v];
      if (s != kNoValue && state.slice_local[v] != state.slice_local[s]) {
        state.slice_local[v] = state.slice_local[s] = false;
        changed = true;
      }
    }
  }
  for (ValueId v = 0; v < num_values; ++v) state.slice_local[v] = state.slice_local[plan.root[v]];
}

}  // namespace

void PlanBatchSplit(const ExecutionPlan& plan, BatchState& state) {
  const int64_t batch = state.batch;
  const int num_values = plan.graph->num_values();
  state.slice_local.assign(num_values, false);
  const int64_t cache = plan.batch_split_cache_bytes;
  if (cache <= 0 || batch < 2) return;
  BatchSplitChoice choice = ChooseBatchSplit(plan, batch, state.shapes, cache);
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
  MarkSliceLocal(plan, state);
  std::vector<bool> seen(num_values, false);
  for (int k = 0; k < state.split_steps; ++k) {
    for (ValueId v : plan.steps[k]->traits().row_wise) {
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

void PlanShapeValueSteps(const ExecutionPlan& plan, BatchState& state) {
  const size_t steps = plan.steps.size();
  const int num_values = plan.graph->num_values();
  state.dropped.assign(steps, 0);
  state.dropped_value.assign(num_values, 0);
  state.dropped_steps = 0;
  if (state.shape_values.empty() || plan.step_reads.size() != steps) return;
  auto shape_value = [&](ValueId v) { return state.shape_values.contains(v); };
  // Candidates: steps writing shape values alone, each an arena root of its own.
  for (size_t k = 0; k < steps; ++k) {
    const std::vector<ValueId>& writes = plan.steps[k]->traits().writes;
    bool drop = !writes.empty();
    for (ValueId w : writes) {
      drop = drop && w != kNoValue && w < num_values && shape_value(w) && plan.root[w] == w &&
             plan.storage[w] == Storage::kArena;
    }
    state.dropped[k] = drop;
  }
  // A candidate whose value a running step reads as data runs after all;
  // then what it reads may be needed too: until nothing changes (each
  // round runs one more step at least).
  std::vector<char> read(num_values, 0);
  for (ValueId v : plan.read_outside_steps) {
    if (v != kNoValue && v < num_values) read[plan.root[v]] = 1;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < steps; ++k) {
      if (state.dropped[k]) continue;
      for (const ExecutionPlan::ValueRead& r : plan.step_reads[k]) {
        if (r.value == kNoValue || r.value >= num_values) continue;
        if (r.as_shape_value && shape_value(r.value)) continue;
        read[plan.root[r.value]] = 1;
      }
    }
    for (size_t k = 0; k < steps; ++k) {
      if (!state.dropped[k]) continue;
      for (ValueId w : plan.steps[k]->traits().writes) {
        if (read[w]) {
          state.dropped[k] = 0;
          changed = true;
          break;
        }
      }
    }
  }
  for (size_t k = 0; k < steps; ++k) {
    if (!state.dropped[k]) continue;
    ++state.dropped_steps;
    for (ValueId w : plan.steps[k]->traits().writes) state.dropped_value[w] = 1;
  }
}

void PlanArena(const ExecutionPlan& plan, BatchState& state) {
  const int num_values = plan.graph->num_values();
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
    if (plan.root[v] != v || plan.storage[v] != Storage::kArena || plan.internal[v]) continue;
    if (BytesOwner(plan, v, state.shapes) != v) continue;  // placed with the residual it replaces
    if (!state.dropped_value.empty() && state.dropped_value[v]) continue;  // never written
    // A slice-local value holds one slice of rows.
    const Shape& shape = state.slice_local[v] ? state.slice_shapes[v] : state.shapes[v];
    // Values of other types take their bytes, rounded up to whole floats.
    const int64_t bytes = kernels::NumElements(shape) *
                          static_cast<int64_t>(DataTypeSize(RuntimeType(*plan.graph, v)));
    const int64_t n = plan.blocked[v] ? kernels::ActivationBytes(shape, true, plan.blocked_layout) /
                                            static_cast<int64_t>(sizeof(float))
                                      : (bytes + static_cast<int64_t>(sizeof(float)) - 1) /
                                            static_cast<int64_t>(sizeof(float));
    blocks.push_back({v, (std::max<int64_t>(n, 1) + kAlign - 1) / kAlign * kAlign});
  }
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.size > b.size; });
  auto lifetime = [&](ValueId v) {
    // Values never written by a step (unused) still get their own space.
    if (plan.first_step[v] < 0) return std::make_pair(-1, std::numeric_limits<int>::max());
    // A batch-sized value the split steps write is written slice by slice
    // while those steps run again for the next slices: it lives from the
    // first of them on.
    if (plan.first_step[v] < state.split_steps && !state.slice_local[v]) {
      return std::make_pair(0, plan.last_step[v]);
    }
    return std::make_pair(plan.first_step[v], plan.last_step[v]);
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
    if (plan.root[v] != v || plan.storage[v] != Storage::kArena || plan.internal[v]) continue;
    const ValueId owner = BytesOwner(plan, v, state.shapes);
    if (owner != v) state.arena_offset[v] = state.arena_offset[owner];
  }
  state.arena_bytes = floats * static_cast<int64_t>(sizeof(float));
}

void PlanStepCosts(const ExecutionPlan& plan, BatchState& state) {
  const std::vector<Shape>& shapes = state.shapes;
  for (const auto& step : plan.steps) {
    const double flops = step->Flops(shapes);
    int64_t elements = 0;
    for (ValueId v : step->traits().reads) {
      if (v != kNoValue) elements += kernels::NumElements(shapes[v]);
    }
    const bool serial =
        plan.threads > 1 && (flops > 0 ? step->ParallelGrainFlops(shapes) < plan.serial_below_flops
                                       : elements < plan.serial_below_elements);
    state.step_flops.push_back(flops);
    state.step_bytes.push_back(StepBytes(*plan.graph, *step, shapes));
    const ValueId residual = step->traits().residual_input;
    state.residual_bytes.push_back(
        residual == kNoValue
            ? 0.0
            : 2.0 * static_cast<double>(kernels::NumElements(shapes[residual])) * sizeof(float));
    state.serial.push_back(serial);
  }
}

double StepBytes(const Graph& graph, const Step& step, const std::vector<Shape>& shapes) {
  double bytes = static_cast<double>(step.traits().parameter_bytes);
  std::vector<ValueId> counted;
  auto add = [&](ValueId v) {
    if (v == kNoValue || v >= static_cast<ValueId>(shapes.size())) return;
    if (std::find(counted.begin(), counted.end(), v) != counted.end()) return;
    counted.push_back(v);
    const size_t size = DataTypeSize(RuntimeType(graph, v));
    bytes += static_cast<double>(kernels::NumElements(shapes[v])) *
             static_cast<double>(size > 0 ? size : sizeof(float));
  };
  for (ValueId v : step.traits().reads) add(v);
  for (ValueId v : step.traits().writes) add(v);
  return bytes;
}

}  // namespace numaserve::engine::runtime
