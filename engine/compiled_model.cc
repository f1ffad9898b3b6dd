// CompiledModel: the graph lowered once, at Load, to a list of oneDNN-backed
// steps. Gemm/MatMul absorb a following constant-bias Add and Relu and run on
// the GEMM backend CompileOptions names (kernels/gemm); Flatten,
// Reshape and Identity become views (no step, no copy); weights are packed
// once. Per batch size, the concrete shapes, an activation arena and the
// primitives are created on first use and cached, so a Run at a batch size
// already seen allocates nothing of its own.
// Nodes touching a value of a type other than FP32 run on their op's typed
// reference (TypedReferenceStep); such values take their own byte size in
// the arena, and Run reads and writes every input and output as the bytes of
// its type.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "affinity/cpu_features.h"
#include "affinity/topology.h"
#include "base/log.h"
#include "engine/batch_groups.h"
#include "engine/compiled_steps.h"
#include "engine/model.h"
#include "engine/model_info.h"
#include "engine/onnx_import.h"
#include "engine/op_registry.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/shape_propagation.h"
#include "engine/typed_exec.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_autotune.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::engine {
namespace {

constexpr size_t kAlignment = 64;

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Where a value's data lives. Views share their source's storage: every
// value resolves to a root, and only roots have storage.
enum class Storage { kInput, kConstant, kArena, kOutput };

// Everything that depends on the batch size. Its activations live in the
// arena every state shares (CompiledModelImpl::arena_), at its offsets.
struct BatchState {
  int64_t batch = 0;
  std::vector<Shape> shapes;           // by ValueId
  std::vector<int64_t> arena_offset;   // by ValueId, for kArena roots
  std::vector<float*> data;            // by ValueId, refreshed per Run
  int64_t arena_bytes = 0;             // peak activation bytes (the plan's size)
  std::vector<double> step_flops;      // by step, per Run (for the profile)
  std::vector<double> step_bytes;      // by step, per Run: compulsory bytes moved
  std::vector<double> residual_bytes;  // by step: its residual read and copied into dst
  std::vector<char> serial;            // by step: runs on the calling thread alone
  // Batch splitting (CompileOptions::batch_split_cache_bytes): steps
  // [0, split_steps) run slice_rows rows at a time, the last slice with the
  // rest. Values those steps alone use ("slice-local") hold one slice and
  // are reused by every slice; the others hold the batch, and a slice sees
  // its rows of them.
  int split_steps = 0;
  int64_t slice_rows = 0;
  std::vector<Shape> slice_shapes, tail_shapes;  // by ValueId: a full slice's, the last's
  std::vector<char> slice_local;                 // by ValueId (views included)
  std::vector<int64_t> row_floats;    // by ValueId: floats per row, for batch-sized values
  std::vector<ValueId> split_values;  // every value the split steps read or write
  std::vector<float*> slice_data;     // by ValueId, per slice
  bool ran = false;                   // a Run at this batch has completed
  uint64_t last_used = 0;             // CompiledModelImpl::use_clock_ at its last use
};

// Per step, while profiling.
struct StepTimes {
  int64_t calls = 0;
  double seconds = 0;           // the step, its residual copy excluded
  double residual_seconds = 0;  // copying/reordering its residual into dst
  double flops = 0;
  double bytes = 0;
  double residual_bytes = 0;
};

class CompiledModelImpl final : public CompiledModel {
 public:
  CompiledModelImpl(Graph graph, ModelInfo info, const CompileOptions& options,
                    const dnnl::engine& engine)
      : graph_(std::move(graph)),
        info_(std::move(info)),
        options_(options),
        engine_(engine),
        stream_(engine_) {
    if (options_.batch_split_cache_bytes < 0) {
      options_.batch_split_cache_bytes = LastLevelCacheBytes();
    }
  }

  absl::Status Compile();
  ~CompiledModelImpl() override { PrintProfile(); }
  void SetProfiling(bool on) override {
    profiling_ = on;
    if (on) {
      times_.assign(steps_.size(), StepTimes());
      profile_runs_ = 0;
      events_.clear();
      events_full_ = false;
      profile_start_ = std::chrono::steady_clock::now();
    }
  }
  std::vector<StepProfile> Profile() const override;
  void SetStepEventLimit(int64_t max_events) override {
    event_limit_ = std::max<int64_t>(max_events, 0);
  }
  std::vector<StepEvent> StepEvents() const override { return events_; }

  const ModelInfo& info() const override { return info_; }
  std::string DescribePlan() const override;
  std::string ActivationLayoutName() const override {
    return kernels::BlockedLayoutName(blocked_layout_);
  }
  std::string DescribeInt8Kernels() const override { return int8_kernels_note_; }
  absl::StatusOr<std::vector<PlannedStep>> PlanAt(int64_t batch) const override;
  absl::StatusOr<int64_t> ActivationBytes(int64_t batch) override {
    auto state = GetBatchState(batch);
    if (!state.ok()) return state.status();
    return (*state)->arena_bytes;
  }
  std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const override;
  BatchPlanCache CachedBatchPlans() const override {
    return {static_cast<int64_t>(per_batch_.size()), arena_bytes_};
  }
  absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs) override;
  absl::Status CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                const std::vector<size_t>& output_bytes) const override;

 private:
  // shapes1: every value's shape at batch 1 (for ranks).
  absl::Status CompileMatMul(int node_index, const std::vector<std::vector<int>>& consumers,
                             const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                             std::vector<bool>& fused);
  // The GEMM kernel on the backend options_ names ("auto": the fastest, timed
  // here once per distinct shape, or remembered); `note` says which, for
  // DescribePlan.
  absl::StatusOr<std::unique_ptr<kernels::GemmKernel>> CreateGemm(
      const kernels::GemmOptions& options, const std::string& layer, std::string* note);
  // x / sqrt(2) -> Erf -> + 1 -> x * . -> * 0.5 (any operand order): the
  // nodes and the final value, when `x` feeds exactly that pattern.
  struct GeluMatch {
    std::vector<int> nodes;
    ValueId output;
  };
  std::optional<GeluMatch> MatchErfGelu(ValueId x,
                                        const std::vector<std::vector<int>>& consumers) const;
  // Conv (+BatchNormalization folded, +residual Add as a sum, +activation)
  // on oneDNN; false when the node needs the reference (runtime weights).
  absl::StatusOr<bool> CompileConv(int node_index, const std::vector<std::vector<int>>& consumers,
                                   const std::vector<Shape>& shapes1,
                                   const std::vector<int>& producer, std::vector<bool>& fused);
  // ConvTranspose with constant weights on oneDNN's deconvolution; false
  // when the node needs the reference.
  bool CompileConvTranspose(int node_index, const std::vector<Shape>& shapes1);
  // The fast step for an element-wise/layout op, or null.
  std::unique_ptr<Step> FastStep(int node_index, const std::vector<Shape>& shapes1);
  // Whether a conv or weight matmul doing `flops_per_input` FLOPs per
  // element of its input runs in BF16 (precision bf16, and at least
  // CompileOptions::bf16_min_flops_per_input).
  bool UseBf16(double flops_per_input) const {
    return options_.precision == Precision::kBf16 &&
           flops_per_input >= options_.bf16_min_flops_per_input;
  }
  void AssignStorage();
  // With NUMASERVE_PROFILE_STEPS set, Run times every step from the start;
  // the profile goes to stderr when the model is freed.
  void PrintProfile() const;
  // The compulsory bytes one Run of `step` moves at `shapes`: the values
  // it reads and writes (each once) and the parameters it holds.
  double StepBytes(const Step& step, const std::vector<Shape>& shapes) const;
  // Run's step loop, timing each step when `profile`.
  template <bool kProfile>
  absl::Status RunSteps(const StepContext& ctx, BatchState& state);
  // Steps [begin, end) on `ctx`; `first` is false for the second and later
  // slices of a split batch (the profile counts a step once per run).
  template <bool kProfile>
  absl::Status RunRange(const StepContext& ctx, const BatchState& state, size_t begin, size_t end,
                        bool first);
  // Decides state.split_steps and state.slice_rows for `batch`, and the
  // shapes and row sizes the slices use (BatchState).
  void PlanBatchSplit(int64_t batch, BatchState& state) const;
  // Keeps conv/pool activations in oneDNN's blocked layout where every
  // reader accepts it (conv chains); plain elsewhere.
  void ChooseLayouts(const std::vector<Shape>& shapes1);
  // blocked_layout_ from CompileOptions::activation_layout (after PlanQdq:
  // kAuto asks whether a conv runs INT8).
  void ChooseBlockedLayout();
  // Per arena value, the first step writing it and the last reading it
  // (views included), for the activation memory plan.
  void PlanLifetimes(const std::vector<int>& producer,
                     const std::vector<std::vector<int>>& consumers);
  // A conv that adds a residual dying at its step writes into the
  // residual's bytes instead of copying it into its own (same layout).
  void PlanInPlaceResiduals();
  // The arena root whose bytes `v` (an arena root) takes at these shapes,
  // following in-place links that hold (equal shapes); `v` itself if none.
  ValueId BytesOwner(ValueId v, const std::vector<Shape>& shapes) const;

  // The FP32 value a QDQ pair quantizes and the pair's parameters.
  struct QdqInput {
    ValueId source = kNoValue;  // the QuantizeLinear's FP32 input
    float scale = 1;
    int32_t zero_point = 0;
    bool is_uint8 = true;  // UINT8 (else INT8) quantized values
    int quantize_node = -1;
  };
  // Finds the QDQ pairs, the Conv/MatMul/Gemm nodes that run INT8 on them
  // and the pairs that need no step (qdq_of_node_, int8_input_,
  // absorbed_qdq_).
  void PlanQdq(const std::vector<std::vector<int>>& consumers, const std::vector<Shape>& shapes1);
  // The INT8 operands of a Conv/MatMul/Gemm node whose weights are a
  // folded DequantizeLinear of INT8 values with scales along its output
  // channels (`axis`), or nothing.
  std::optional<kernels::Int8Params> Int8WeightsOf(const Node& node, int64_t axis,
                                                   int64_t channels) const;
  // Whether node `i` can run INT8 reading value `v` (its input 0) quantized.
  bool Int8Capable(int i, ValueId v, const std::vector<Shape>& shapes1) const;

  // Records, when a node's step has been added, which step stands for it
  // and for the nodes it fused.
  struct StepOfNodes {
    StepOfNodes(int node, size_t steps_before, const std::vector<bool>& fused,
                const std::vector<std::unique_ptr<Step>>& steps, std::vector<int>& step_of_node)
        : node_(node),
          before_(steps_before),
          fused_(fused),
          steps_(steps),
          step_of_node_(step_of_node) {}
    ~StepOfNodes() {
      if (steps_.size() == before_) return;  // a view: no step
      step_of_node_[node_] = static_cast<int>(before_);
      for (size_t j = node_ + 1; j < fused_.size(); ++j) {
        if (fused_[j] && step_of_node_[j] < 0) step_of_node_[j] = static_cast<int>(before_);
      }
    }
    int node_;
    size_t before_;
    const std::vector<bool>& fused_;
    const std::vector<std::unique_ptr<Step>>& steps_;
    std::vector<int>& step_of_node_;
  };
  absl::StatusOr<BatchState*> GetBatchState(int64_t batch);
  // OK when `batch` is a row count Run takes: >= 1 when an input has a
  // dynamic dim 0, else 1.
  absl::Status CheckBatch(int64_t batch) const;
  // Follows a value's only consumer if it is `op_type` and the value is not
  // a graph output; -1 otherwise.
  // A Transpose whose only reader is a MatMul of two runtime FP32 operands
  // of the same rank: the matmul reads its input through strides instead.
  bool TransposeFeedsBatchedMatMul(int node_index, const std::vector<std::vector<int>>& consumers,
                                   const std::vector<Shape>& shapes1) const;
  // The matmul of two runtime operands, with the transposes before it, a
  // scalar Mul/Div and a Transpose after it absorbed.
  void CompileBatchedMatMul(int node_index, const std::vector<std::vector<int>>& consumers,
                            const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                            std::vector<bool>& fused);
  // A scalar Mul/Div reading a matmul's product `out` alone: the node and
  // the factor it applies; {-1, 1} when there is none.
  std::pair<int, float> ScaleOfProduct(ValueId out, const std::vector<std::vector<int>>& consumers,
                                       const std::vector<Shape>& shapes1) const;
  // A Transpose reading `out` alone, keeping its rank; -1 when there is none.
  int TransposeOfProduct(ValueId out, const std::vector<std::vector<int>>& consumers,
                         const std::vector<Shape>& shapes1) const;
  // Scaled dot-product attention starting at the MatMul `node_index` (see
  // AttentionStep): the whole chain becomes one step when it matches and
  // CompileOptions::fuse_attention is on; false (nothing done) otherwise.
  bool CompileAttention(int node_index, const std::vector<std::vector<int>>& consumers,
                        const std::vector<Shape>& shapes1, const std::vector<int>& producer,
                        std::vector<bool>& fused);
  int SoleConsumer(ValueId v, const char* op_type,
                   const std::vector<std::vector<int>>& consumers) const;

  Graph graph_;
  ModelInfo info_;
  CompileOptions options_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<std::unique_ptr<Step>> steps_;
  std::vector<ValueId> root_;     // by ValueId
  std::vector<Storage> storage_;  // by root ValueId
  std::vector<int> output_slot_;  // by root ValueId: index into Run's outputs, or -1
  std::vector<bool> is_output_;   // by ValueId
  std::vector<bool> blocked_;     // by root ValueId: blocked layout
  kernels::BlockedLayout blocked_layout_ = kernels::BlockedLayout::kChannelBlocked;
  std::vector<int> step_of_node_;            // by node index: the step computing it (-1: a view)
  std::vector<int> first_step_, last_step_;  // by arena root: lifetime in steps
  std::vector<bool> internal_;               // by arena root: read only inside its step
  std::vector<bool> absorbed_transpose_;     // by node: read through strides by a matmul
  // QDQ models: a QuantizeLinear -> DequantizeLinear pair, by the
  // DequantizeLinear node, where both take the same scalar constant scale and
  // zero point and the QuantizeLinear's input is FP32.
  std::vector<std::optional<QdqInput>> qdq_of_node_;
  // By node: a QuantizeLinear or DequantizeLinear with no step of its own
  // (every reader of its output runs INT8 on the pair's FP32 input).
  std::vector<bool> absorbed_qdq_;
  // By Conv/MatMul/Gemm node: the quantized input it runs INT8 on.
  std::vector<std::optional<QdqInput>> int8_input_;
  // Set by PlanQdq where CompileOptions::int8_kernels kept INT8-capable
  // steps on the FP32 path (DescribeInt8Kernels).
  std::string int8_kernels_note_;
  std::vector<ValueId> in_place_of_;  // by arena root: the residual whose bytes it takes
  // At most options_.batch_plans, the least recently used dropped first.
  std::map<int64_t, BatchState> per_batch_;
  uint64_t use_clock_ = 0;
  // The activation arena of every batch state (one Run at a time), as large
  // as the largest plan so far.
  std::unique_ptr<float, FreeDeleter> arena_;
  int64_t arena_bytes_ = 0;
  std::vector<Shape> shapes1_;              // every value's shape at batch 1
  int threads_ = 1;                         // kernel threads for steps not run serially
  const BatchState* last_state_ = nullptr;  // the last profiled Run's
  bool profiling_ = false;
  bool print_profile_at_exit_ = false;  // NUMASERVE_PROFILE_STEPS
  std::vector<StepTimes> times_;        // by step, since profiling started
  int64_t profile_runs_ = 0;
  std::chrono::steady_clock::time_point profile_start_;  // the last SetProfiling(true)
  int64_t event_limit_ = 0;                              // SetStepEventLimit
  std::vector<StepEvent> events_;                        // since profiling started
  bool events_full_ = false;                         // a Run went past event_limit_: keep no more
  bool record_events_ = false;                       // keep this Run's events
  const std::vector<Shape>* last_shapes_ = nullptr;  // the last Run's, for Profile
  bool unavailable_logged_[std::size(kernels::kAllGemmBackends)] = {};  // by GemmBackend
};

void CompiledModelImpl::PrintProfile() const {
  if (!print_profile_at_exit_ || times_.empty() || profile_runs_ == 0) return;
  base::Log(base::LogLevel::kInfo, "engine", absl::StrCat("step profile for ", info_.path),
            {{"path", info_.path}});
  base::LogBlock(base::LogLevel::kInfo, "engine", FormatStepProfile(Profile(), profile_runs_, 15));
}

std::vector<StepProfile> CompiledModelImpl::Profile() const {
  std::vector<StepProfile> rows;
  if (times_.size() != steps_.size()) return rows;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& step = *steps_[k];
    const std::string d = step.Describe();
    StepProfile row;
    row.index = static_cast<int>(k);
    row.kind = d.substr(0, d.find(':'));
    row.description = d;
    row.layouts = step.Layouts();
    const bool sliced = last_state_ != nullptr && static_cast<int>(k) < last_state_->split_steps;
    if (last_shapes_ != nullptr) {
      row.implementation = step.Implementation(sliced ? last_state_->slice_shapes : *last_shapes_);
    }
    if (last_state_ != nullptr) row.threads = last_state_->serial[k] ? 1 : threads_;
    if (sliced) row.slice_rows = last_state_->slice_rows;
    row.calls = times_[k].calls;
    row.seconds = times_[k].seconds;
    row.flops = times_[k].flops;
    row.bytes = times_[k].bytes;
    row.precision = step.Arithmetic();
    rows.push_back(row);
    // A conv or matmul writing into its residual's bytes has nothing to copy.
    const ValueId out = step.ResidualOutput();
    if (out != kNoValue && last_shapes_ != nullptr && BytesOwner(out, *last_shapes_) != out) {
      continue;
    }
    if (step.ResidualInput() != kNoValue) {
      StepProfile r;
      r.index = static_cast<int>(k);
      r.kind = "reorder";
      r.description = absl::StrCat("reorder: residual into ", d);
      if (const auto* conv = dynamic_cast<const ConvStep*>(&step); conv != nullptr) {
        r.layouts = conv->ResidualLayouts();
      }
      r.calls = times_[k].calls;
      r.seconds = times_[k].residual_seconds;
      r.bytes = times_[k].residual_bytes;
      rows.push_back(r);
    }
  }
  return rows;
}

double CompiledModelImpl::StepBytes(const Step& step, const std::vector<Shape>& shapes) const {
  double bytes = static_cast<double>(step.ParameterBytes());
  std::vector<ValueId> counted;
  auto add = [&](ValueId v) {
    if (v == kNoValue || v >= static_cast<ValueId>(shapes.size())) return;
    if (std::find(counted.begin(), counted.end(), v) != counted.end()) return;
    counted.push_back(v);
    const size_t size = DataTypeSize(RuntimeType(graph_, v));
    bytes += static_cast<double>(kernels::NumElements(shapes[v])) *
             static_cast<double>(size > 0 ? size : sizeof(float));
  };
  for (ValueId v : step.Reads()) add(v);
  for (ValueId v : step.Writes()) add(v);
  return bytes;
}

int CompiledModelImpl::SoleConsumer(ValueId v, const char* op_type,
                                    const std::vector<std::vector<int>>& consumers) const {
  if (is_output_[v] || consumers[v].size() != 1) return -1;
  const int j = consumers[v][0];
  return graph_.nodes()[j].op_type == op_type ? j : -1;
}

namespace {

// The constant scalar operand of a binary node (the other being `x`).
std::optional<float> ScalarOperand(const Graph& graph, const Node& node, ValueId x) {
  if (node.inputs.size() != 2) return std::nullopt;
  const ValueId other = node.inputs[0] == x ? node.inputs[1] : node.inputs[0];
  const Constant* c = graph.FindConstant(other);
  if (c == nullptr || c->type != DataType::kFloat32 || c->f32.data.size() != 1) return std::nullopt;
  return c->f32.data[0];
}

}  // namespace

std::optional<CompiledModelImpl::GeluMatch> CompiledModelImpl::MatchErfGelu(
    ValueId x, const std::vector<std::vector<int>>& consumers) const {
  if (is_output_[x] || consumers[x].size() != 2) return std::nullopt;
  const auto& nodes = graph_.nodes();
  int div = -1, mul = -1;
  for (int c : consumers[x]) {
    if (nodes[c].op_type == "Div" && nodes[c].inputs[0] == x) div = c;
    if (nodes[c].op_type == "Mul") mul = c;
  }
  if (div < 0 || mul < 0) return std::nullopt;
  auto near = [](std::optional<float> v, float want) {
    return v.has_value() && std::fabs(*v - want) < 1e-3f;
  };
  if (!near(ScalarOperand(graph_, nodes[div], x), 1.41421356f)) return std::nullopt;
  const int erf = SoleConsumer(nodes[div].outputs[0], "Erf", consumers);
  if (erf < 0) return std::nullopt;
  const ValueId e = nodes[erf].outputs[0];
  const int add = SoleConsumer(e, "Add", consumers);
  if (add < 0 || !near(ScalarOperand(graph_, nodes[add], e), 1.0f)) return std::nullopt;
  const ValueId a = nodes[add].outputs[0];
  if (SoleConsumer(a, "Mul", consumers) != mul) return std::nullopt;
  const ValueId m = nodes[mul].outputs[0];
  const int half = SoleConsumer(m, "Mul", consumers);
  if (half < 0 || !near(ScalarOperand(graph_, nodes[half], m), 0.5f)) return std::nullopt;
  return GeluMatch{{div, erf, add, mul, half}, nodes[half].outputs[0]};
}

namespace {

// Transpose's permutation with negative entries and the default (reverse)
// resolved.
std::vector<int64_t> TransposePerm(const Node& node, size_t rank) {
  auto perm = node.GetInts("perm", {});
  if (perm.empty()) {
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) perm.push_back(d);
  }
  for (int64_t& p : perm) {
    if (p < 0) p += static_cast<int64_t>(perm.size());
  }
  return perm;
}

}  // namespace

bool CompiledModelImpl::TransposeFeedsBatchedMatMul(int node_index,
                                                    const std::vector<std::vector<int>>& consumers,
                                                    const std::vector<Shape>& shapes1) const {
  const Node& t = graph_.nodes()[node_index];
  if (t.inputs.empty() || t.outputs.size() != 1 || graph_.IsConstant(t.inputs[0])) return false;
  const ValueId x = t.outputs[0];
  const int j = SoleConsumer(x, "MatMul", consumers);
  if (j < 0 || NeedsTypedRun(graph_, t)) return false;
  const Node& mm = graph_.nodes()[j];
  if (NeedsTypedRun(graph_, mm) || mm.inputs.size() != 2 || mm.inputs[0] == mm.inputs[1]) {
    return false;
  }
  for (ValueId v : mm.inputs) {
    if (graph_.IsConstant(v) || shapes1[v].size() < 2) return false;
  }
  // Same rank as the product: no broadcast padding of a strided operand.
  return shapes1[x].size() == shapes1[mm.outputs[0]].size() &&
         TransposePerm(t, shapes1[x].size()).size() == shapes1[x].size();
}

std::pair<int, float> CompiledModelImpl::ScaleOfProduct(
    ValueId out, const std::vector<std::vector<int>>& consumers,
    const std::vector<Shape>& shapes1) const {
  for (const char* op : {"Mul", "Div"}) {
    const int j = SoleConsumer(out, op, consumers);
    if (j < 0 || NeedsTypedRun(graph_, graph_.nodes()[j])) continue;
    const Node& scale = graph_.nodes()[j];
    const auto c = ScalarOperand(graph_, scale, out);
    if (!c.has_value() || (scale.op_type == "Div" && (scale.inputs[0] != out || *c == 0))) {
      continue;
    }
    if (shapes1[scale.outputs[0]] != shapes1[out]) continue;  // the scalar broadcasts nothing
    return {j, scale.op_type == "Mul" ? *c : 1.0f / *c};
  }
  return {-1, 1.0f};
}

int CompiledModelImpl::TransposeOfProduct(ValueId out,
                                          const std::vector<std::vector<int>>& consumers,
                                          const std::vector<Shape>& shapes1) const {
  const int j = SoleConsumer(out, "Transpose", consumers);
  if (j < 0 || NeedsTypedRun(graph_, graph_.nodes()[j]) ||
      shapes1[graph_.nodes()[j].outputs[0]].size() != shapes1[out].size()) {
    return -1;
  }
  return j;
}

void CompiledModelImpl::CompileBatchedMatMul(int node_index,
                                             const std::vector<std::vector<int>>& consumers,
                                             const std::vector<Shape>& shapes1,
                                             const std::vector<int>& producer,
                                             std::vector<bool>& fused) {
  const Node& node = graph_.nodes()[node_index];
  std::string name = node.name;
  const int step = static_cast<int>(steps_.size());
  BatchedMatMulStep::Operand operands[2];
  for (int k = 0; k < 2; ++k) {
    const ValueId v = node.inputs[k];
    operands[k].value = v;
    const int t = producer[v];
    if (t >= 0 && absorbed_transpose_[t]) {
      const Node& tn = graph_.nodes()[t];
      operands[k].value = tn.inputs[0];
      operands[k].perm = TransposePerm(tn, shapes1[v].size());
      step_of_node_[t] = step;  // its output is read inside this step only
      absl::StrAppend(&name, "+", tn.name);
    }
  }
  ValueId out = node.outputs[0];
  float alpha = 1.0f;
  if (const auto [j, c] = ScaleOfProduct(out, consumers, shapes1); j >= 0) {
    alpha = c;
    fused[j] = true;
    absl::StrAppend(&name, "+", graph_.nodes()[j].name);
    out = graph_.nodes()[j].outputs[0];
  }
  std::vector<int64_t> dst_perm;
  if (const int j = TransposeOfProduct(out, consumers, shapes1); j >= 0) {
    const Node& t = graph_.nodes()[j];
    dst_perm = TransposePerm(t, shapes1[out].size());
    fused[j] = true;
    absl::StrAppend(&name, "+", t.name);
    out = t.outputs[0];
  }
  steps_.push_back(std::make_unique<BatchedMatMulStep>(engine_, operands[0], operands[1], out,
                                                       std::move(dst_perm), alpha, name));
}

bool CompiledModelImpl::CompileAttention(int node_index,
                                         const std::vector<std::vector<int>>& consumers,
                                         const std::vector<Shape>& shapes1,
                                         const std::vector<int>& producer,
                                         std::vector<bool>& fused) {
  if (!options_.fuse_attention) return false;
  const auto& nodes = graph_.nodes();
  const Node& qk = nodes[node_index];
  if (qk.op_type != "MatMul" || qk.inputs.size() != 2 || qk.inputs[0] == qk.inputs[1]) {
    return false;
  }
  // qk -> [scale] -> Softmax(last axis) -> MatMul(probabilities, v) -> [Transpose]
  ValueId scores = qk.outputs[0];
  const auto [scale, alpha] = ScaleOfProduct(scores, consumers, shapes1);
  if (scale >= 0) scores = nodes[scale].outputs[0];
  const size_t rank = shapes1[qk.outputs[0]].size();
  const int softmax = SoleConsumer(scores, "Softmax", consumers);
  if (softmax < 0 || NeedsTypedRun(graph_, nodes[softmax]) || rank < 2) return false;
  const int64_t axis = GetSoftmaxSemantics(graph_, nodes[softmax]).axis;
  if (axis != -1 && axis != static_cast<int64_t>(rank) - 1) return false;
  const ValueId probs = nodes[softmax].outputs[0];
  const int pv = SoleConsumer(probs, "MatMul", consumers);
  if (pv < 0 || NeedsTypedRun(graph_, nodes[pv]) || nodes[pv].inputs.size() != 2 ||
      nodes[pv].inputs[0] != probs || nodes[pv].inputs[1] == probs) {
    return false;
  }
  ValueId out = nodes[pv].outputs[0];
  if (shapes1[out].size() != rank) return false;
  const int out_transpose = TransposeOfProduct(out, consumers, shapes1);
  std::vector<int64_t> dst_perm;
  if (out_transpose >= 0) {
    dst_perm = TransposePerm(nodes[out_transpose], rank);
    out = nodes[out_transpose].outputs[0];
  }
  // The operands as stored, through the transposes feeding them; each must
  // be ready here (computed by an earlier node) and of the product's rank.
  AttentionStep::Operand operands[3];
  int transposes[3] = {-1, -1, -1};
  const ValueId logical[3] = {qk.inputs[0], qk.inputs[1], nodes[pv].inputs[1]};
  for (int k = 0; k < 3; ++k) {
    const ValueId v = logical[k];
    if (graph_.IsConstant(v) || shapes1[v].size() != rank) return false;
    operands[k].value = v;
    const int t = producer[v];
    if (t >= 0 && nodes[t].op_type == "Transpose" &&
        (absorbed_transpose_[t] ||
         (t > node_index && TransposeFeedsBatchedMatMul(t, consumers, shapes1)))) {
      operands[k].value = nodes[t].inputs[0];
      operands[k].perm = TransposePerm(nodes[t], rank);
      transposes[k] = t;
    }
    const int p = producer[operands[k].value];
    if (p > node_index || graph_.IsConstant(operands[k].value)) return false;
  }
  // v and the output are read and written a row of a head at a time.
  const size_t last = rank - 1;
  if (!operands[2].perm.empty() && operands[2].perm[last] != static_cast<int64_t>(last)) {
    return false;
  }
  if (!dst_perm.empty() && dst_perm[last] != static_cast<int64_t>(last)) return false;
  // Shapes at batch 1: q [.., sq, d], k [.., d, sk], v [.., sk, dv], batch
  // dims equal to the product's or 1.
  const Shape& q = shapes1[logical[0]];
  const Shape& k = shapes1[logical[1]];
  const Shape& v = shapes1[logical[2]];
  const Shape& y = shapes1[nodes[pv].outputs[0]];
  if (k[last - 1] != q[last] || v[last - 1] != k[last] || y[last - 1] != q[last - 1] ||
      y[last] != v[last]) {
    return false;
  }
  for (size_t d = 0; d + 2 < rank; ++d) {
    for (const Shape* x : {&q, &k, &v}) {
      if ((*x)[d] != 1 && (*x)[d] != y[d]) return false;
    }
  }
  const int step = static_cast<int>(steps_.size());
  std::string name = qk.name;
  for (int k = 0; k < 3; ++k) {
    const int t = transposes[k];
    if (t < 0) continue;
    if (t < node_index) {
      step_of_node_[t] = step;  // read inside this step only
    } else {
      fused[t] = true;
    }
    absl::StrAppend(&name, "+", nodes[t].name);
  }
  for (int j : {scale, softmax, pv, out_transpose}) {
    if (j < 0) continue;
    fused[j] = true;
    absl::StrAppend(&name, "+", nodes[j].name);
  }
  steps_.push_back(std::make_unique<AttentionStep>(operands[0], operands[1], operands[2], out,
                                                   std::move(dst_perm), alpha, name));
  return true;
}

namespace {

std::optional<float> ScalarFloatConstant(const Graph& graph, ValueId v) {
  const Constant* c = v != kNoValue ? graph.FindConstant(v) : nullptr;
  if (c == nullptr || c->type != DataType::kFloat32 || c->f32.data.size() != 1) return std::nullopt;
  return c->f32.data[0];
}

// A QuantizeLinear/DequantizeLinear's zero point (input 2): its value and
// whether it is UINT8 (else INT8); absent: UINT8 0. Nothing for other
// types, non-scalars or non-constants.
std::optional<std::pair<int32_t, bool>> ScalarZeroPoint(const Graph& graph, const Node& node) {
  if (node.inputs.size() < 3 || node.inputs[2] == kNoValue) {
    // Without a zero point, opset 21's output_dtype may name another type.
    if (node.GetInt("output_dtype", 0) != 0 && node.GetInt("output_dtype", 0) != 2) {
      return std::nullopt;
    }
    return std::make_pair(0, true);
  }
  const Constant* c = graph.FindConstant(node.inputs[2]);
  if (c == nullptr || (c->type != DataType::kUint8 && c->type != DataType::kInt8) ||
      kernels::NumElements(c->shape) != 1) {
    return std::nullopt;
  }
  int64_t value = 0;
  if (!c->i64.empty()) {
    value = c->i64[0];
  } else if (!c->bytes.empty()) {
    value = c->type == DataType::kUint8 ? c->bytes[0] : static_cast<int8_t>(c->bytes[0]);
  } else {
    return std::nullopt;
  }
  return std::make_pair(static_cast<int32_t>(value), c->type == DataType::kUint8);
}

}  // namespace

std::optional<kernels::Int8Params> CompiledModelImpl::Int8WeightsOf(const Node& node, int64_t axis,
                                                                    int64_t channels) const {
  const Constant* w = node.inputs.size() > 1 ? graph_.FindConstant(node.inputs[1]) : nullptr;
  if (w == nullptr || !w->int8_origin.has_value() || w->type != DataType::kFloat32) {
    return std::nullopt;
  }
  const Constant::Int8Origin& origin = *w->int8_origin;
  if (origin.axis != -1 && origin.axis != axis) return std::nullopt;
  if (static_cast<int64_t>(origin.values.size()) != kernels::NumElements(w->shape)) {
    return std::nullopt;
  }
  kernels::Int8Params p;
  if (origin.axis == -1 && origin.scales.size() == 1) {
    p.weight_scales.assign(channels, origin.scales[0]);
  } else if (static_cast<int64_t>(origin.scales.size()) == channels) {
    p.weight_scales = origin.scales;
  } else {
    return std::nullopt;
  }
  p.weights = origin.values;
  return p;
}

bool CompiledModelImpl::Int8Capable(int i, ValueId v, const std::vector<Shape>& shapes1) const {
  const Node& node = graph_.nodes()[i];
  if (node.inputs.size() < 2 || node.inputs[0] != v || node.inputs[1] == v) return false;
  for (size_t k = 2; k < node.inputs.size(); ++k) {
    if (node.inputs[k] == v) return false;
  }
  const Constant* w = graph_.FindConstant(node.inputs[1]);
  if (w == nullptr || !w->int8_origin.has_value() || w->type != DataType::kFloat32) return false;
  const Shape& x = shapes1[v];
  const double min_flops = options_.int8_min_flops_per_input;
  if (node.op_type == "Conv") {
    // As CompileConv takes it: rank 3 to 5, a constant bias if any.
    const bool bias_ok = node.inputs.size() < 3 || node.inputs[2] == kNoValue ||
                         graph_.FindConstant(node.inputs[2]) != nullptr;
    if (x.size() < 3 || x.size() > 5 || !bias_ok || w->shape.size() != x.size()) return false;
    // FLOPs per input element: 2 x (M / group) x kernel / strides.
    const int64_t group = std::max<int64_t>(node.GetInt("group", 1), 1);
    double per_input = 2.0 * static_cast<double>(w->shape[0]) / static_cast<double>(group);
    for (size_t d = 2; d < w->shape.size(); ++d) per_input *= static_cast<double>(w->shape[d]);
    for (int64_t s : node.GetInts("strides", {}))
      per_input /= static_cast<double>(std::max<int64_t>(s, 1));
    return per_input >= min_flops && Int8WeightsOf(node, 0, w->shape[0]).has_value();
  }
  if (node.op_type == "MatMul" || node.op_type == "Gemm") {
    if (w->shape.size() != 2 || x.size() < 2) return false;
    const bool gemm = node.op_type == "Gemm";
    if (gemm && node.GetInt("transA", 0) != 0) return false;
    const bool trans_b = gemm && node.GetInt("transB", 0) != 0;
    const int64_t n = w->shape[trans_b ? 0 : 1];
    return 2.0 * static_cast<double>(n) >= min_flops &&
           Int8WeightsOf(node, trans_b ? 0 : 1, n).has_value();
  }
  return false;
}

void CompiledModelImpl::PlanQdq(const std::vector<std::vector<int>>& consumers,
                                const std::vector<Shape>& shapes1) {
  const int n = static_cast<int>(graph_.nodes().size());
  qdq_of_node_.assign(n, std::nullopt);
  absorbed_qdq_.assign(n, false);
  int8_input_.assign(n, std::nullopt);
  int8_kernels_note_.clear();
  using Int8Kernels = CompileOptions::Int8Kernels;
  const bool use_int8 =
      options_.int8_kernels == Int8Kernels::kAlways ||
      (options_.int8_kernels == Int8Kernels::kAuto && kernels::OnednnInt8ProductsExact());
  int kept_fp32 = 0;
  std::vector<int> producer(graph_.num_values(), -1);
  for (int i = 0; i < n; ++i) {
    for (ValueId v : graph_.nodes()[i].outputs) producer[v] = i;
  }
  auto block_size = [](const Node& node) { return node.GetInt("block_size", 0); };
  for (int i = 0; i < n; ++i) {
    const Node& dq = graph_.nodes()[i];
    if (dq.op_type != "DequantizeLinear" || dq.inputs.empty() || dq.outputs.size() != 1 ||
        block_size(dq) != 0) {
      continue;
    }
    const int j = producer[dq.inputs[0]];
    if (j < 0) continue;
    const Node& q = graph_.nodes()[j];
    if (q.op_type != "QuantizeLinear" || q.inputs.size() < 2 || q.outputs.size() != 1 ||
        block_size(q) != 0 || graph_.IsConstant(q.inputs[0]) ||
        RuntimeType(graph_, q.inputs[0]) != DataType::kFloat32) {
      continue;
    }
    const auto q_scale = ScalarFloatConstant(graph_, q.inputs[1]);
    const auto dq_scale =
        ScalarFloatConstant(graph_, dq.inputs.size() > 1 ? dq.inputs[1] : kNoValue);
    const auto q_zp = ScalarZeroPoint(graph_, q);
    const auto dq_zp = ScalarZeroPoint(graph_, dq);
    if (!q_scale || !dq_scale || *q_scale != *dq_scale || !(*q_scale > 0) ||
        !std::isfinite(*q_scale) || !q_zp || !dq_zp || *q_zp != *dq_zp) {
      continue;
    }
    QdqInput in;
    in.source = q.inputs[0];
    in.scale = *q_scale;
    in.zero_point = q_zp->first;
    in.is_uint8 = q_zp->second;
    in.quantize_node = j;
    qdq_of_node_[i] = in;
  }
  // A QuantizeLinear needs no step when only recognised pairs read it.
  std::vector<bool> q_absorbed(n, false);
  for (int j = 0; j < n; ++j) {
    const Node& q = graph_.nodes()[j];
    if (q.op_type != "QuantizeLinear" || q.outputs.size() != 1 || is_output_[q.outputs[0]] ||
        consumers[q.outputs[0]].empty()) {
      continue;
    }
    bool all = true;
    for (int c : consumers[q.outputs[0]]) all = all && qdq_of_node_[c].has_value();
    q_absorbed[j] = all;
  }
  for (int i = 0; i < n; ++i) {
    if (!qdq_of_node_[i].has_value()) continue;
    if (!q_absorbed[qdq_of_node_[i]->quantize_node]) {
      qdq_of_node_[i].reset();  // the QuantizeLinear runs: its DequantizeLinear too
      continue;
    }
    absorbed_qdq_[qdq_of_node_[i]->quantize_node] = true;
    // INT8 kernels take UINT8 inputs; their readers must all run INT8 for
    // the pair to need no step (else it runs as a fake-quantize step).
    const ValueId out = graph_.nodes()[i].outputs[0];
    bool all = qdq_of_node_[i]->is_uint8 && !is_output_[out] && !consumers[out].empty();
    for (int c : consumers[out]) all = all && Int8Capable(c, out, shapes1);
    if (!all) continue;
    if (!use_int8) {
      kept_fp32 += static_cast<int>(consumers[out].size());
      continue;
    }
    absorbed_qdq_[i] = true;
    for (int c : consumers[out]) int8_input_[c] = qdq_of_node_[i];
  }
  if (kept_fp32 > 0) {
    int8_kernels_note_ = absl::StrCat(
        "INT8 kernels off (",
        options_.int8_kernels == CompileOptions::Int8Kernels::kNever
            ? "int8_kernels never"
            : "no VNNI on this CPU: u8 x s8 products would take two passes, slower than FP32",
        "): ", kept_fp32, " QDQ conv/matmul step(s) run FP32 on their dequantized weights");
  }
}

absl::Status CompiledModelImpl::CompileMatMul(int node_index,
                                              const std::vector<std::vector<int>>& consumers,
                                              const std::vector<Shape>& shapes1,
                                              const std::vector<int>& producer,
                                              std::vector<bool>& fused) {
  const Node& node = graph_.nodes()[node_index];
  const bool is_gemm = node.op_type == "Gemm";
  const Constant* weights = graph_.FindConstant(node.inputs[1]);
  if (weights == nullptr || weights->type != DataType::kFloat32 || weights->shape.size() != 2 ||
      shapes1[node.inputs[0]].size() < 2) {
    // Not a weight matmul (B computed at run time, or a 1-D A).
    if (node.op_type == "MatMul" && shapes1[node.inputs[0]].size() >= 2 &&
        shapes1[node.inputs[1]].size() >= 2) {
      if (!CompileAttention(node_index, consumers, shapes1, producer, fused)) {
        CompileBatchedMatMul(node_index, consumers, shapes1, producer, fused);
      }
    } else if (auto fast = FastStep(node_index, shapes1); fast != nullptr) {
      steps_.push_back(std::move(fast));
    } else {
      steps_.push_back(std::make_unique<ReferenceStep>(&graph_, node_index));
    }
    return absl::OkStatus();
  }
  kernels::GemmOptions mm;
  mm.weights = weights->f32.data.data();
  mm.weights_transposed = is_gemm && node.GetInt("transB", 0) != 0;
  mm.k = weights->shape[mm.weights_transposed ? 1 : 0];
  mm.n = weights->shape[mm.weights_transposed ? 0 : 1];
  // 2N FLOPs per element of A: a classifier of 10 outputs stays FP32.
  mm.bf16 = UseBf16(2.0 * static_cast<double>(mm.n));
  std::string name = node.name;
  ValueId src = node.inputs[0];
  if (const std::optional<QdqInput>& q8 = int8_input_[node_index]; q8.has_value()) {
    // A QDQ pair before it: INT8 on the pair's FP32 input.
    mm.int8 = Int8WeightsOf(node, mm.weights_transposed ? 0 : 1, mm.n);
    if (mm.int8.has_value()) {
      mm.int8->src_scale = q8->scale;
      mm.int8->src_zero_point = q8->zero_point;
      mm.bf16 = false;
      src = q8->source;
      name = absl::StrCat(graph_.nodes()[q8->quantize_node].name, "+", name);
    }
  }
  ValueId accumulate_from = kNoValue;
  if (is_gemm) {
    mm.weights_scale = node.GetFloat("alpha", 1.0f);
    mm.src_transposed = node.GetInt("transA", 0) != 0;
    const float beta = node.GetFloat("beta", 1.0f);
    const ValueId c_id = node.inputs.size() > 2 ? node.inputs[2] : kNoValue;
    const Constant* c = c_id != kNoValue ? graph_.FindConstant(c_id) : nullptr;
    // A constant C that is a row vector (scalar, [N], [1,N]) is a bias.
    const bool row_vector =
        c != nullptr && c->type == DataType::kFloat32 &&
        (c->shape.size() <= 1 || c->shape[0] == 1) &&
        (kernels::NumElements(c->shape) == mm.n || kernels::NumElements(c->shape) == 1);
    if (row_vector) {
      mm.bias.resize(mm.n);
      for (int64_t j = 0; j < mm.n; ++j) {
        mm.bias[j] = beta * c->f32.data[c->f32.data.size() == 1 ? 0 : j];
      }
    } else if (c_id != kNoValue && beta != 0.0f) {
      mm.accumulate = true;
      mm.sum_scale = beta;
      accumulate_from = c_id;
    }
  }
  ValueId out = node.outputs[0];
  const size_t out_rank = shapes1[out].size();
  // + constant bias along N (any leading dims 1, rank not above the output's).
  if (int j = SoleConsumer(out, "Add", consumers); j >= 0) {
    const Node& add = graph_.nodes()[j];
    const ValueId other = add.inputs[0] == out ? add.inputs[1] : add.inputs[0];
    const Constant* b = graph_.FindConstant(other);
    const bool bias_like = b != nullptr && b->type == DataType::kFloat32 &&
                           b->shape.size() <= out_rank && !b->shape.empty() &&
                           b->shape.back() == mm.n && kernels::NumElements(b->shape) == mm.n;
    if (bias_like) {
      if (mm.bias.empty()) mm.bias.assign(mm.n, 0.0f);
      for (int64_t i = 0; i < mm.n; ++i) mm.bias[i] += b->f32.data[i];
      fused[j] = true;
      out = add.outputs[0];
      absl::StrAppend(&name, "+", add.name);
    }
  }
  if (int j = SoleConsumer(out, "Relu", consumers); j >= 0) {
    mm.relu = true;
    fused[j] = true;
    out = graph_.nodes()[j].outputs[0];
    absl::StrAppend(&name, "+", graph_.nodes()[j].name);
  } else if (auto gelu = MatchErfGelu(out, consumers); gelu.has_value()) {
    mm.gelu_erf = true;
    for (int j : gelu->nodes) fused[j] = true;
    out = gelu->output;
    absl::StrAppend(&name, "+gelu(", graph_.nodes()[gelu->nodes.front()].name, "..",
                    graph_.nodes()[gelu->nodes.back()].name, ")");
  } else if (int j = SoleConsumer(out, "Add", consumers); j >= 0 && !mm.accumulate) {
    // A residual Add of a tensor computed earlier: dst starts as it, the
    // matmul adds onto it (a sum post-op).
    const Node& add = graph_.nodes()[j];
    const ValueId other = add.inputs[0] == out ? add.inputs[1] : add.inputs[0];
    if (other != out && !graph_.IsConstant(other) && producer[other] < node_index &&
        shapes1[other] == shapes1[out]) {
      mm.accumulate = true;
      mm.sum_scale = 1.0f;
      accumulate_from = other;
      fused[j] = true;
      out = add.outputs[0];
      absl::StrAppend(&name, "+", add.name);
    }
  }
  std::string note;
  auto kernel = CreateGemm(mm, name, &note);
  if (!kernel.ok()) {
    return absl::Status(kernel.status().code(),
                        absl::StrCat(node.Describe(), ": ", kernel.status().message()));
  }
  steps_.push_back(std::make_unique<MatMulStep>(*std::move(kernel), src, out, accumulate_from,
                                                std::move(name), std::move(note)));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<kernels::GemmKernel>> CompiledModelImpl::CreateGemm(
    const kernels::GemmOptions& options, const std::string& layer, std::string* note) {
  // BF16 runs on oneDNN alone (Load refuses another named backend); so
  // does INT8 (a QDQ model's quantized matmuls), whatever the backend named.
  if (options.bf16 || options.int8.has_value()) {
    return kernels::CreateGemmKernel(kernels::GemmBackend::kOnednn, options, engine_);
  }
  if (options_.gemm_backend != "auto") {
    const std::optional<kernels::GemmBackend> backend =
        kernels::GemmBackendFromName(options_.gemm_backend);
    if (!backend.has_value()) return CheckGemmBackendChoice(options_.gemm_backend);
    if (absl::Status s = kernels::GemmBackendAvailable(*backend); !s.ok()) return s;
    if (*backend != kernels::GemmBackend::kOnednn) *note = options_.gemm_backend;
    return kernels::CreateGemmKernel(*backend, options, engine_);
  }
  std::error_code ec;
  const std::filesystem::path model = std::filesystem::weakly_canonical(info_.path, ec);
  kernels::GemmChoiceCache::Key key{
      .model = ec ? info_.path : model.string(),
      .k = options.k,
      .n = options.n,
      .src_transposed = options.src_transposed,
      .threads = omp_get_max_threads(),
      // The backends timed, with what each runs (AvailableGemmBackends).
      .cpu = absl::StrCat(affinity::GetCpuFeatures().brand, " [", kernels::IsaDescription(), "; ",
                          kernels::AvailableGemmBackends(), "]")};
  auto& cache = kernels::GemmChoiceCache::Global();
  std::string where;
  if (auto cached = cache.Find(key, options_.gemm_cache_file, &where);
      cached.has_value() && kernels::GemmBackendAvailable(*cached).ok()) {
    auto kernel = kernels::CreateGemmKernel(*cached, options, engine_);
    if (kernel.ok()) {
      *note = absl::StrCat("auto: ", kernels::GemmBackendName(*cached), ", cached");
      if (where != "this process") {
        base::Log(base::LogLevel::kInfo, "gemm",
                  absl::StrFormat("gemm %s K=%d N=%d: %s (cached in %s)", layer, options.k,
                                  options.n, kernels::GemmBackendName(*cached), where),
                  {{"layer", layer},
                   {"k", options.k},
                   {"n", options.n},
                   {"backend", kernels::GemmBackendName(*cached)},
                   {"cache", where}});
      }
      return kernel;
    }
  }
  kernels::GemmChoice choice;
  auto kernel = kernels::CreateFastestGemmKernel(options, engine_, {}, &choice);
  if (!kernel.ok()) return kernel.status();
  const bool contended = choice.contention > options_.gemm_cache_max_contention;
  std::string unremembered;
  if (contended && !options_.gemm_cache_file.empty()) {
    unremembered = absl::StrFormat(
        "; not written to %s: timed while off the cpu %.0f%% of the time (other work on the "
        "cores)",
        options_.gemm_cache_file, 100 * choice.contention);
  }
  base::Log(base::LogLevel::kInfo, "gemm",
            absl::StrFormat("gemm %s K=%d N=%d: %s%s", layer, options.k, options.n,
                            choice.Summary(), unremembered),
            {{"layer", layer},
             {"k", options.k},
             {"n", options.n},
             {"backend", kernels::GemmBackendName(choice.backend)},
             {"contention", choice.contention}});
  for (const kernels::GemmTiming& t : choice.timings) {
    if (!t.status.ok() && !unavailable_logged_[static_cast<int>(t.backend)]) {
      unavailable_logged_[static_cast<int>(t.backend)] = true;
      base::Log(base::LogLevel::kWarning, "gemm",
                absl::StrCat("gemm backend ", kernels::GemmBackendName(t.backend),
                             " not timed: ", t.status.message()),
                {{"backend", kernels::GemmBackendName(t.backend)}, {"error", t.status.message()}});
    }
  }
  cache.Store(key, choice.backend, contended ? std::string() : options_.gemm_cache_file);
  *note = absl::StrCat("auto: ", choice.Summary());
  return kernel;
}

namespace {

// FLOPs a (non-transposed) conv does per element of its input: 2 x
// (M/group) x kernel per output position, input positions / strides
// of them; with a fused depthwise 3x3 of stride `dw_stride` (0: none), its
// 2 x 9 per expanded channel per output position as well.
double ConvFlopsPerInput(const kernels::ConvOnednnOptions& o, int64_t dw_stride) {
  double per_input = 2.0 * static_cast<double>(o.out_channels / std::max<int64_t>(o.group, 1));
  for (int64_t k : o.kernel) per_input *= static_cast<double>(k);
  for (int64_t s : o.strides) per_input /= static_cast<double>(std::max<int64_t>(s, 1));
  if (dw_stride > 0 && o.in_channels > 0) {
    per_input += 18.0 * static_cast<double>(o.out_channels) /
                 static_cast<double>(o.in_channels * dw_stride * dw_stride);
  }
  return per_input;
}

// The oneDNN post-op for an activation node, if it maps to one.
std::optional<kernels::EltwisePostOp> ActivationPostOp(const Graph& graph, const Node& node) {
  using dnnl::algorithm;
  const std::string& op = node.op_type;
  if (op == "Relu") return kernels::EltwisePostOp{algorithm::eltwise_relu, 0.0f, 0.0f};
  if (op == "LeakyRelu") {
    return kernels::EltwisePostOp{algorithm::eltwise_relu, node.GetFloat("alpha", 0.01f), 0.0f};
  }
  if (op == "Sigmoid") return kernels::EltwisePostOp{algorithm::eltwise_logistic, 0.0f, 0.0f};
  if (op == "Tanh") return kernels::EltwisePostOp{algorithm::eltwise_tanh, 0.0f, 0.0f};
  if (op == "Clip") {
    auto p = ops::UnaryParamsOf(graph, node);
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      if (node.inputs[i] != kNoValue && !graph.IsConstant(node.inputs[i])) return std::nullopt;
    }
    if (!p.ok()) return std::nullopt;
    return kernels::EltwisePostOp{algorithm::eltwise_clip_v2, p->alpha, p->beta};
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<bool> CompiledModelImpl::CompileConv(int node_index,
                                                    const std::vector<std::vector<int>>& consumers,
                                                    const std::vector<Shape>& shapes1,
                                                    const std::vector<int>& producer,
                                                    std::vector<bool>& fused) {
  const Node& node = graph_.nodes()[node_index];
  const Constant* w = graph_.FindConstant(node.inputs[1]);
  const Constant* b = node.inputs.size() > 2 && node.inputs[2] != kNoValue
                          ? graph_.FindConstant(node.inputs[2])
                          : nullptr;
  const Shape& x_shape = shapes1[node.inputs[0]];
  if (w == nullptr || w->type != DataType::kFloat32 || x_shape.size() < 3 || x_shape.size() > 5 ||
      (node.inputs.size() > 2 && node.inputs[2] != kNoValue && b == nullptr)) {
    return false;
  }
  const std::vector<int64_t> kernel =
      node.GetInts("kernel_shape", std::vector<int64_t>(w->shape.begin() + 2, w->shape.end()));
  auto window = ops::ResolveWindow(node, x_shape, kernel);
  if (!window.ok()) return window.status();
  kernels::ConvOnednnOptions o;
  o.blocked_layout = blocked_layout_;
  o.group = node.GetInt("group", 1);
  o.in_channels = x_shape[1];
  o.out_channels = w->shape[0];
  o.kernel = window->kernel;
  o.strides = window->strides;
  o.dilations = window->dilations;
  o.pads_begin = window->pads_begin;
  o.pads_end = window->pads_end;
  std::vector<float> weights = w->f32.data;
  std::vector<float> bias(o.out_channels, 0.0f);
  bool has_bias = b != nullptr;
  if (b != nullptr) bias = b->f32.data;
  std::string name = node.name;
  ValueId out = node.outputs[0];
  // A QDQ pair before it: INT8 on the pair's FP32 input (its weights a
  // folded DequantizeLinear of INT8 values).
  ValueId input = node.inputs[0];
  std::optional<kernels::Int8Params> int8;
  if (const std::optional<QdqInput>& q8 = int8_input_[node_index]; q8.has_value()) {
    int8 = Int8WeightsOf(node, 0, o.out_channels);
    if (int8.has_value()) {
      int8->src_scale = q8->scale;
      int8->src_zero_point = q8->zero_point;
      input = q8->source;
      name = absl::StrCat(graph_.nodes()[q8->quantize_node].name, "+", name);
    }
  }
  // BatchNormalization with constant parameters folds into weights + bias
  // (and, for INT8 weights, into their per-channel scales: q * s * a).
  auto fold_bn = [&](ValueId& value, int64_t channels, std::vector<float>& wts,
                     std::vector<float>& bs, std::string& label,
                     std::vector<float>* int8_scales = nullptr) {
    const int j = SoleConsumer(value, "BatchNormalization", consumers);
    if (j < 0) return false;
    const Node& bn = graph_.nodes()[j];
    std::vector<const Constant*> p;
    for (size_t i = 1; i < 5 && i < bn.inputs.size(); ++i)
      p.push_back(graph_.FindConstant(bn.inputs[i]));
    // Training mode normalises with the batch's statistics: not a constant.
    bool foldable = p.size() == 4 && bn.outputs.size() == 1 && bn.GetInt("training_mode", 0) == 0;
    for (const Constant* c : p) {
      foldable = foldable && c != nullptr && c->type == DataType::kFloat32 &&
                 static_cast<int64_t>(c->f32.data.size()) == channels;
    }
    if (!foldable) return false;
    const float eps = bn.GetFloat("epsilon", 1e-5f);
    const int64_t per_out = static_cast<int64_t>(wts.size()) / channels;
    for (int64_t m = 0; m < channels; ++m) {
      const double a = p[0]->f32.data[m] / std::sqrt(static_cast<double>(p[3]->f32.data[m]) + eps);
      for (int64_t i = 0; i < per_out; ++i) wts[m * per_out + i] *= static_cast<float>(a);
      if (int8_scales != nullptr) (*int8_scales)[m] *= static_cast<float>(a);
      bs[m] = static_cast<float>(a * (bs[m] - p[2]->f32.data[m]) + p[1]->f32.data[m]);
    }
    fused[j] = true;
    value = bn.outputs[0];
    absl::StrAppend(&label, "+", bn.name);
    return true;
  };
  if (fold_bn(out, o.out_channels, weights, bias, name,
              int8.has_value() ? &int8->weight_scales : nullptr)) {
    has_bias = true;
  }
  // A residual Add whose other operand is ready before this conv runs.
  ValueId sum_from = kNoValue;
  if (int j = SoleConsumer(out, "Add", consumers); j >= 0) {
    const Node& add = graph_.nodes()[j];
    const ValueId other = add.inputs[0] == out ? add.inputs[1] : add.inputs[0];
    const bool ready = !graph_.IsConstant(other) && (producer[other] < node_index) && other != out;
    if (ready && shapes1[other] == shapes1[out] && !graph_.IsConstant(other)) {
      o.sum = true;
      sum_from = other;
      fused[j] = true;
      out = add.outputs[0];
      absl::StrAppend(&name, "+", add.name);
    }
  }
  // Activations (a chain of them).
  auto fuse_activations = [&](ValueId& value, std::vector<kernels::EltwisePostOp>& posts,
                              std::string& label) {
    while (!is_output_[value] && consumers[value].size() == 1) {
      const Node& act = graph_.nodes()[consumers[value][0]];
      auto post = ActivationPostOp(graph_, act);
      if (!post.has_value() || !kernels::CanAppendEltwise(posts, *post)) break;
      posts.push_back(*post);
      fused[consumers[value][0]] = true;
      value = act.outputs[0];
      absl::StrAppend(&label, "+", act.name);
    }
  };
  // Whether a conv with `trial`'s options (a fusion being considered)
  // runs on a non-reference kernel between blocked activations (what conv
  // chains get; plain ones run oneDNN's reference with or without it).
  auto runs_fast = [&](kernels::ConvOnednnOptions trial, const Shape& src, const Shape& dst) {
    trial.log_reference = false;
    auto conv = kernels::ConvOnednn::Create(engine_, std::move(trial));
    return conv.ok() && (*conv)->Prepare(src, dst, true, true).ok() &&
           !kernels::IsReferenceImplementation((*conv)->ImplementationName(src));
  };
  fuse_activations(out, o.eltwise, name);
  if (has_bias) o.bias = std::move(bias);
  o.weights = weights.data();
  o.winograd = options_.conv_algorithm == "winograd";
  // BF16 where the conv does enough work per input element
  // (CompileOptions::bf16_min_flops_per_input): a depthwise conv on its own
  // or a 1x1 conv projecting many channels to few stays FP32.
  o.bf16 = UseBf16(ConvFlopsPerInput(o, 0));
  if (int8.has_value()) {
    // No INT8 Winograd or depthwise post-op in oneDNN.
    o.winograd = false;
    o.bf16 = false;
    o.int8 = std::move(int8);
  }
  // A QuantizeLinear -> DequantizeLinear pair that reads only this conv's
  // output and is not read inside INT8 steps (it would run as a
  // fake-quantize step of its own: MobileNetV2's pairs before its depthwise
  // convs) folds into the conv's post-ops. With an integer zero point z,
  // (saturate_lo_hi(round(x / s) + z) - z) * s is s * clip(round(x / s),
  // lo - z, hi - z): linear(1 / s), round half to even, clip, pow(s, 1)
  // (one linear: see kernels::CanAppendEltwise). As in the INT8 kernels,
  // the reciprocal may differ from ONNX's division by one unit in the last
  // place, so at an exact tie once in a while.
  struct FoldablePair {
    int quantize_node = -1, dequantize_node = -1;
    std::vector<kernels::EltwisePostOp> post_ops;
  };
  auto foldable_pair = [&](ValueId value) -> std::optional<FoldablePair> {
    if (is_output_[value] || consumers[value].size() != 1) return std::nullopt;
    const int qn = consumers[value][0];
    const Node& q = graph_.nodes()[qn];
    const ValueId q_out = q.outputs.empty() ? kNoValue : q.outputs[0];
    const int dqn = q.op_type == "QuantizeLinear" && q.outputs.size() == 1 && !is_output_[q_out] &&
                            consumers[q_out].size() == 1
                        ? consumers[q_out][0]
                        : -1;
    const std::optional<QdqInput>* pair = dqn >= 0 ? &qdq_of_node_[dqn] : nullptr;
    if (pair == nullptr || !pair->has_value() || absorbed_qdq_[dqn] || (*pair)->source != value ||
        (*pair)->quantize_node != qn || fused[qn] || fused[dqn]) {
      return std::nullopt;
    }
    const QdqInput& fq = **pair;
    // A scale so small that 1 / s overflows (a subnormal one) would turn
    // x * (1 / s) into inf or NaN where x / s is finite: a step of its own.
    const float inverse_scale = 1.0f / fq.scale;
    if (!std::isfinite(inverse_scale)) return std::nullopt;
    const float zp = static_cast<float>(fq.zero_point);
    const float lo = fq.is_uint8 ? 0.0f : -128.0f, hi = fq.is_uint8 ? 255.0f : 127.0f;
    return FoldablePair{qn,
                        dqn,
                        {{dnnl::algorithm::eltwise_linear, inverse_scale, 0.0f},
                         {dnnl::algorithm::eltwise_round, 0.0f, 0.0f},
                         {dnnl::algorithm::eltwise_clip, lo - zp, hi - zp},
                         {dnnl::algorithm::eltwise_pow, fq.scale, 1.0f}}};
  };
  // Appends the pair's post-ops to `chain` where oneDNN runs them right
  // (kernels::CanAppendEltwise); false, and `chain` as it was, otherwise.
  auto append_pair = [](const FoldablePair& pair, std::vector<kernels::EltwisePostOp>& chain) {
    std::vector<kernels::EltwisePostOp> trial = chain;
    for (const kernels::EltwisePostOp& e : pair.post_ops) {
      if (!kernels::CanAppendEltwise(trial, e)) return false;
      trial.push_back(e);
    }
    chain = std::move(trial);
    return true;
  };
  // Marks the pair fused into the conv named `name`, whose output becomes
  // the pair's.
  auto take_pair = [&](const FoldablePair& pair, ValueId& value, std::string& step_name) {
    fused[pair.quantize_node] = true;
    fused[pair.dequantize_node] = true;
    value = graph_.nodes()[pair.dequantize_node].outputs[0];
    absl::StrAppend(&step_name, "+", graph_.nodes()[pair.quantize_node].name, "+",
                    graph_.nodes()[pair.dequantize_node].name);
  };
  if (const std::optional<FoldablePair> pair = foldable_pair(out); pair.has_value()) {
    kernels::ConvOnednnOptions trial = o;
    const ValueId dq_out = graph_.nodes()[pair->dequantize_node].outputs[0];
    if (append_pair(*pair, trial.eltwise) && runs_fast(trial, shapes1[input], shapes1[dq_out])) {
      o.eltwise = std::move(trial.eltwise);
      take_pair(*pair, out, name);
    }
  }
  // A depthwise 3x3 conv (pad 1, stride 1 or 2, with its BatchNormalization
  // and activations) reading only this 1x1 conv's output runs as oneDNN's
  // depthwise post-op, so the expanded tensor is never written out, where
  // oneDNN has a non-reference implementation for it.
  // Channel-blocked activations only: oneDNN 2.6's jit_1x1 with a
  // depthwise post-op on nhwc (which it picks at batch 32 of a 16->48
  // channel pair) computes wrong values (normalized error 0.8 against the
  // reference; isa_tier_test's channels-last CNN).
  bool one_by_one = !o.sum && o.group == 1 && x_shape.size() == 4 && !o.int8.has_value() &&
                    blocked_layout_ == kernels::BlockedLayout::kChannelBlocked;
  for (size_t d = 0; d < o.kernel.size() && one_by_one; ++d) {
    one_by_one = o.kernel[d] == 1 && o.strides[d] == 1 && o.dilations[d] == 1 &&
                 o.pads_begin[d] == 0 && o.pads_end[d] == 0;
  }
  if (const int d = one_by_one ? SoleConsumer(out, "Conv", consumers) : -1; d >= 0) {
    const Node& dn = graph_.nodes()[d];
    const int64_t c = o.out_channels;
    const Constant* dw_w = dn.inputs.size() > 1 ? graph_.FindConstant(dn.inputs[1]) : nullptr;
    const bool has_dw_b = dn.inputs.size() > 2 && dn.inputs[2] != kNoValue;
    const Constant* dw_b = has_dw_b ? graph_.FindConstant(dn.inputs[2]) : nullptr;
    bool ok = dn.inputs[0] == out && dn.outputs.size() == 1 && dw_w != nullptr &&
              dw_w->type == DataType::kFloat32 && dw_w->shape == Shape{c, 1, 3, 3} &&
              dn.GetInt("group", 1) == c &&
              (!has_dw_b || (dw_b != nullptr && dw_b->type == DataType::kFloat32 &&
                             static_cast<int64_t>(dw_b->f32.data.size()) == c));
    int64_t stride = 0;
    if (ok) {
      auto w = ops::ResolveWindow(dn, shapes1[out], {3, 3});
      ok = w.ok() && w->kernel == std::vector<int64_t>{3, 3} && w->strides[0] == w->strides[1] &&
           (w->strides[0] == 1 || w->strides[0] == 2) &&
           w->dilations == std::vector<int64_t>{1, 1} &&
           w->pads_begin == std::vector<int64_t>{1, 1} && w->pads_end == std::vector<int64_t>{1, 1};
      if (ok) stride = w->strides[0];
    }
    if (ok) {
      const std::vector<bool> saved = fused;
      kernels::DepthwisePostOp dw;
      dw.weights = dw_w->f32.data;
      dw.bias = has_dw_b ? dw_b->f32.data : std::vector<float>(c, 0.0f);
      dw.stride = stride;
      ValueId dw_out = dn.outputs[0];
      std::string dw_name = absl::StrCat(name, "+", dn.name);
      fused[d] = true;
      fold_bn(dw_out, c, dw.weights, dw.bias, dw_name);
      fuse_activations(dw_out, dw.eltwise, dw_name);
      // One primitive's post-ops (kernels::CanAppendEltwise).
      bool chain_ok = true;
      for (const kernels::EltwisePostOp& e : dw.eltwise) {
        chain_ok = chain_ok && kernels::CanAppendEltwise(o.eltwise, e);
      }
      // A QDQ pair reading only the depthwise output folds into the
      // depthwise's own chain (MobileNetV2's pairs after each depthwise
      // conv: a fake-quantize pass of their own otherwise). oneDNN runs the
      // depthwise post-op's chain in a kernel of its own (the jit 1x1's
      // depthwise kernel, or a primitive of its own in
      // ref_fused_convolution), so its linear(1 / s) and pow(s, 1) may
      // differ from the 1x1's pair's.
      const std::optional<FoldablePair> dw_pair = foldable_pair(dw_out);
      const bool dw_pair_ok = chain_ok && dw_pair.has_value() && append_pair(*dw_pair, dw.eltwise);
      kernels::ConvOnednnOptions trial = o;
      trial.dw = dw;
      trial.winograd = false;
      // The pair's work per input element decides (in BF16, the 1x1 output
      // stays BF16 in cache: MobileNetV2's 192-channel stride-2 pair at
      // batch 32 took 9.0 ms against 10.7 ms in FP32).
      trial.bf16 = UseBf16(ConvFlopsPerInput(o, stride));
      // oneDNN's ref_fused_convolution chaining its jit 1x1 and depthwise
      // kernels counts as fast (MobileNetV2 ran 17-20% faster with it, and
      // the expanded tensor needs no arena memory); one chaining a
      // reference kernel does not.
      bool fast = dw_pair_ok && runs_fast(trial, shapes1[input], shapes1[dw_out]);
      if (fast) {
        take_pair(*dw_pair, dw_out, dw_name);
      } else if (dw_pair_ok) {  // without the pair, which runs as a step of its own
        dw.eltwise.resize(dw.eltwise.size() - dw_pair->post_ops.size());
        trial.dw = dw;
      }
      if (!fast) fast = chain_ok && runs_fast(trial, shapes1[input], shapes1[dw_out]);
      if (fast) {
        o.dw = std::move(dw);
        o.winograd = false;
        o.bf16 = UseBf16(ConvFlopsPerInput(o, stride));
        out = dw_out;
        name = std::move(dw_name);
      } else {
        fused = saved;
      }
    }
  }
  o.name = name;
  auto conv = kernels::ConvOnednn::Create(engine_, std::move(o));
  if (!conv.ok()) {
    return absl::Status(conv.status().code(),
                        absl::StrCat(node.Describe(), ": ", conv.status().message()));
  }
  auto step = std::make_unique<ConvStep>(*std::move(conv), input, out, sum_from, std::move(name));
  step->SetEngine(engine_);
  steps_.push_back(std::move(step));
  return true;
}

bool CompiledModelImpl::CompileConvTranspose(int node_index, const std::vector<Shape>& shapes1) {
  const Node& node = graph_.nodes()[node_index];
  const Constant* w = graph_.FindConstant(node.inputs[1]);
  const bool has_bias = node.inputs.size() > 2 && node.inputs[2] != kNoValue;
  const Constant* b = has_bias ? graph_.FindConstant(node.inputs[2]) : nullptr;
  const Shape& x = shapes1[node.inputs[0]];
  if (w == nullptr || w->type != DataType::kFloat32 || (has_bias && b == nullptr)) return false;
  auto g = ops::ConvTransposeResolve(node, x, w->shape);
  if (!g.ok()) return false;
  kernels::ConvOnednnOptions o;
  o.blocked_layout = blocked_layout_;
  o.transposed = true;
  o.group = node.GetInt("group", 1);
  o.in_channels = x[1];
  o.out_channels = g->out[1];
  o.kernel = g->p.kernel;
  o.strides = g->p.strides;
  o.dilations = g->p.dilations;
  o.pads_begin = g->p.pads_begin;
  for (size_t d = 0; d < o.kernel.size(); ++d) {
    // oneDNN's end crop, from the output extent (covers output_padding).
    const int64_t eff = (o.kernel[d] - 1) * o.dilations[d] + 1;
    const int64_t end = (x[d + 2] - 1) * o.strides[d] + eff - o.pads_begin[d] - g->out[d + 2];
    if (end < 0 || o.pads_begin[d] < 0) return false;
    o.pads_end.push_back(end);
  }
  if (b != nullptr) o.bias = b->f32.data;
  o.weights = w->f32.data.data();
  // Each input element meets M/group x kernel weights.
  double per_input = 2.0 * static_cast<double>(o.out_channels / std::max<int64_t>(o.group, 1));
  for (int64_t k : o.kernel) per_input *= static_cast<double>(k);
  o.bf16 = UseBf16(per_input);
  auto conv = kernels::ConvOnednn::Create(engine_, std::move(o));
  if (!conv.ok()) return false;
  auto step = std::make_unique<ConvStep>(*std::move(conv), node.inputs[0], node.outputs[0],
                                         kNoValue, node.name);
  step->SetEngine(engine_);
  steps_.push_back(std::move(step));
  return true;
}

std::unique_ptr<Step> CompiledModelImpl::FastStep(int node_index,
                                                  const std::vector<Shape>& shapes1) {
  const Node& node = graph_.nodes()[node_index];
  const std::string& op = node.op_type;
  const ValueId in = node.inputs[0], out = node.outputs[0];
  if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
      op == "GlobalMaxPool") {
    const Shape& x = shapes1[in];
    const bool global = op.rfind("Global", 0) == 0;
    const bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
    const bool include_pad = node.GetInt("count_include_pad", 0) != 0;
    if (x.size() < 3 || x.size() > 5 || node.outputs.size() != 1) return nullptr;
    if (include_pad && node.GetInt("ceil_mode", 0) != 0) return nullptr;
    kernels::WindowParams window;
    if (!global) {
      auto w = ops::ResolveWindow(node, x, node.GetInts("kernel_shape", {}));
      if (!w.ok()) return nullptr;
      window = *w;
      if (!is_max) {
        for (int64_t d : window.dilations) {
          if (d != 1) return nullptr;
        }
      }
    }
    const dnnl::algorithm alg = is_max        ? dnnl::algorithm::pooling_max
                                : include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                              : dnnl::algorithm::pooling_avg_exclude_padding;
    return std::make_unique<PoolStep>(
        kernels::PoolOnednn(engine_, alg, window, global, blocked_layout_), in, out, node.name);
  }
  if (op == "Transpose") {
    auto perm = node.GetInts("perm", {});
    if (perm.empty()) {
      for (int64_t d = static_cast<int64_t>(shapes1[in].size()) - 1; d >= 0; --d) perm.push_back(d);
    }
    for (int64_t& p : perm) {
      if (p < 0) p += static_cast<int64_t>(perm.size());
    }
    return std::make_unique<TransposeStep>(perm, in, out, node.name);
  }
  if ((op == "ReduceSum" || op == "ReduceMean" || op == "ReduceMax" || op == "ReduceMin") &&
      node.outputs.size() == 1) {
    // Only reductions over trailing axes (contiguous rows) with the axes
    // known at compile time; anything else stays on the reference.
    const int64_t rank = static_cast<int64_t>(shapes1[in].size());
    auto axes = ops::IntsFromAttrOrInput(graph_, node, "axes", 1);
    if (!axes.ok() || rank == 0) return nullptr;
    int64_t first_axis = 0;  // no axes: all of them
    if (axes->has_value() && !(*axes)->empty()) {
      auto norm = ops::NormalizeAxes(node, **axes, rank);
      if (!norm.ok()) return nullptr;
      std::vector<int64_t> sorted = *norm;
      std::sort(sorted.begin(), sorted.end());
      sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
      first_axis = rank - static_cast<int64_t>(sorted.size());
      for (size_t j = 0; j < sorted.size(); ++j) {
        if (sorted[j] != first_axis + static_cast<int64_t>(j)) return nullptr;
      }
    } else if (node.GetInt("noop_with_empty_axes", 0) != 0) {
      return nullptr;
    }
    const auto kind = op == "ReduceSum"    ? ReduceRowsStep::Kind::kSum
                      : op == "ReduceMean" ? ReduceRowsStep::Kind::kMean
                      : op == "ReduceMax"  ? ReduceRowsStep::Kind::kMax
                                           : ReduceRowsStep::Kind::kMin;
    return std::make_unique<ReduceRowsStep>(kind, first_axis, in, out, node.name);
  }
  if (op == "MatMul" && shapes1[in].size() >= 2 && shapes1[node.inputs[1]].size() >= 2) {
    return std::make_unique<BatchedMatMulStep>(engine_, in, node.inputs[1], out, node.name);
  }
  if (op == "LayerNormalization" && node.outputs.size() == 1) {
    const Shape& x = shapes1[in];
    const int64_t axis = node.GetInt("axis", -1);
    const Constant* scale = graph_.FindConstant(node.inputs[1]);
    const Constant* bias = node.inputs.size() > 2 && node.inputs[2] != kNoValue
                               ? graph_.FindConstant(node.inputs[2])
                               : nullptr;
    const bool has_bias_input = node.inputs.size() > 2 && node.inputs[2] != kNoValue;
    if (x.empty() || (axis != -1 && axis != static_cast<int64_t>(x.size()) - 1)) return nullptr;
    const int64_t len = x.back();
    if (scale == nullptr || static_cast<int64_t>(scale->f32.data.size()) != len) return nullptr;
    if (has_bias_input && (bias == nullptr || static_cast<int64_t>(bias->f32.data.size()) != len)) {
      return nullptr;
    }
    std::vector<float> b = bias != nullptr ? bias->f32.data : std::vector<float>(len, 0.0f);
    return std::make_unique<LayerNormStep>(scale->f32.data, std::move(b),
                                           node.GetFloat("epsilon", 1e-5f), in, out, node.name);
  }
  if (node.inputs.size() == 1 && node.outputs.size() == 1 && op != "Softmax") {
    if (auto p = ops::UnaryParamsOf(graph_, node); p.ok()) {
      return std::make_unique<UnaryStep>(*p, in, out, node.name);
    }
  }
  if (op == "Clip" && ActivationPostOp(graph_, node).has_value()) {
    if (auto p = ops::UnaryParamsOf(graph_, node); p.ok()) {
      return std::make_unique<UnaryStep>(*p, in, out, node.name);
    }
  }
  if (node.inputs.size() == 2 && node.outputs.size() == 1 && op != "MatMul" && op != "Gemm" &&
      op != "Mean") {
    auto kind = ops::BinaryKindOf(node);
    const bool legacy_prelu = op == "PRelu" && graph_.opset() < 7;
    if (kind.ok() && !legacy_prelu && node.inputs[1] != kNoValue) {
      return std::make_unique<BinaryStep>(*kind, in, node.inputs[1], out, node.name);
    }
  }
  return nullptr;
}

absl::Status CompiledModelImpl::Compile() {
  const int num_values = graph_.num_values();
  root_.resize(num_values);
  for (ValueId v = 0; v < num_values; ++v) root_[v] = v;
  is_output_.assign(num_values, false);
  for (ValueId v : graph_.outputs()) is_output_[v] = true;
  const auto consumers = graph_.Consumers();
  auto shapes1 = PropagateShapes(graph_, InputShapesForBatch(graph_, 1));
  if (!shapes1.ok()) return shapes1.status();
  shapes1_ = *shapes1;
  std::vector<bool> fused(graph_.nodes().size(), false);
  step_of_node_.assign(graph_.nodes().size(), -1);
  absorbed_transpose_.assign(graph_.nodes().size(), false);
  std::vector<int> producer(num_values, -1);  // node index, -1 for inputs/constants
  for (int i = 0; i < static_cast<int>(graph_.nodes().size()); ++i) {
    for (ValueId v : graph_.nodes()[i].outputs) producer[v] = i;
  }
  PlanQdq(consumers, *shapes1);
  ChooseBlockedLayout();
  for (int i = 0; i < static_cast<int>(graph_.nodes().size()); ++i) {
    if (fused[i]) continue;
    const size_t steps_before = steps_.size();
    StepOfNodes step_of(i, steps_before, fused, steps_, step_of_node_);
    const Node& node = graph_.nodes()[i];
    const std::string& op = node.op_type;
    const ValueId in = node.inputs[0], out = node.outputs[0];
    const bool view = op == "Flatten" || op == "Reshape" || op == "Identity" || op == "Squeeze" ||
                      op == "Unsqueeze" || (op == "Dropout" && node.outputs.size() == 1);
    if (absorbed_qdq_[i]) continue;  // read inside the INT8 steps after it
    if (const std::optional<QdqInput>& q = qdq_of_node_[i]; q.has_value()) {
      // A QuantizeLinear -> DequantizeLinear pair whose readers do not all
      // run INT8: one FP32 step, the quantized tensor never stored.
      steps_.push_back(std::make_unique<FakeQuantStep>(
          engine_, blocked_layout_, q->scale, q->zero_point, q->is_uint8 ? 0 : -128,
          q->is_uint8 ? 255 : 127, q->source, out,
          absl::StrCat(graph_.nodes()[q->quantize_node].name, "+", node.name)));
      continue;
    }
    if (!view && NeedsTypedRun(graph_, node)) {
      // A value other than FP32 at runtime: the op's typed reference.
      auto step = TypedReferenceStep::Create(&graph_, i);
      if (!step.ok()) return step.status();
      steps_.push_back(*std::move(step));
      continue;
    }
    if (op == "Transpose" && TransposeFeedsBatchedMatMul(i, consumers, *shapes1)) {
      absorbed_transpose_[i] = true;  // no step: the matmul after it reads through strides
      continue;
    }
    if (op == "Conv") {
      auto done = CompileConv(i, consumers, *shapes1, producer, fused);
      if (!done.ok()) return done.status();
      if (!*done) steps_.push_back(std::make_unique<ReferenceStep>(&graph_, i));
    } else if (op == "ConvTranspose") {
      if (!CompileConvTranspose(i, *shapes1)) {
        steps_.push_back(std::make_unique<ReferenceStep>(&graph_, i));
      }
    } else if (op == "Gemm" || op == "MatMul") {
      if (absl::Status s = CompileMatMul(i, consumers, *shapes1, producer, fused); !s.ok()) {
        return s;
      }
    } else if (op == "Add" && node.inputs.size() == 2) {
      steps_.push_back(std::make_unique<AddStep>(engine_, in, node.inputs[1], out, node.name));
    } else if (op == "Relu") {
      steps_.push_back(std::make_unique<ReluStep>(engine_, in, out, node.name));
    } else if (op == "Softmax") {
      const SoftmaxSemantics sm = GetSoftmaxSemantics(graph_, node);
      steps_.push_back(
          std::make_unique<SoftmaxStep>(engine_, sm.axis, sm.flatten_to_2d, in, out, node.name));
    } else if (op == "Flatten" || op == "Reshape" || op == "Identity" || op == "Squeeze" ||
               op == "Unsqueeze" || (op == "Dropout" && node.outputs.size() == 1)) {
      root_[out] = root_[in];  // a view: same bytes, another shape
    } else if (auto fast = FastStep(i, *shapes1); fast != nullptr) {
      steps_.push_back(std::move(fast));
    } else {
      steps_.push_back(std::make_unique<ReferenceStep>(&graph_, i));
    }
  }
  // An absorbed QDQ pair is read inside the steps of its readers: its
  // values (the pair's FP32 input included) live until the last of them.
  for (int i = static_cast<int>(graph_.nodes().size()) - 1; i >= 0; --i) {
    if (!absorbed_qdq_[i]) continue;
    for (ValueId v : graph_.nodes()[i].outputs) {
      for (int c : consumers[v]) step_of_node_[i] = std::max(step_of_node_[i], step_of_node_[c]);
    }
  }
  AssignStorage();
  ChooseLayouts(*shapes1);
  threads_ = options_.num_threads > 0 ? options_.num_threads : omp_get_max_threads();
  if (options_.serial_below_flops < 0) {
    options_.serial_below_flops = DefaultSerialBelowFlops(threads_);
  }
  if (options_.serial_below_elements < 0) {
    options_.serial_below_elements = DefaultSerialBelowElements(threads_);
  }
  if (std::getenv("NUMASERVE_PROFILE_STEPS") != nullptr) {
    SetProfiling(true);
    print_profile_at_exit_ = true;
  }
  PlanLifetimes(producer, consumers);
  PlanInPlaceResiduals();
  return absl::OkStatus();
}

void CompiledModelImpl::PlanInPlaceResiduals() {
  in_place_of_.assign(graph_.num_values(), kNoValue);
  if (!options_.in_place_residuals) return;
  for (size_t k = 0; k < steps_.size(); ++k) {
    // Conv's residual sum and MatMul's residual (or Gemm's C).
    const Step& step = *steps_[k];
    const ValueId residual = step.ResidualInput();
    if (residual == kNoValue) continue;
    const ValueId source = step.ResidualSource(), d = step.ResidualOutput();
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
    const ValueId v = step->BlockedWrite();
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
      const std::vector<ValueId> ok = step->BlockedReads();
      for (ValueId r : step->Reads()) {
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

std::string CompiledModelImpl::DescribePlan() const {
  std::string plan;
  for (const auto& step : steps_) absl::StrAppend(&plan, step->Describe(), "\n");
  return plan;
}

absl::StatusOr<std::vector<PlannedStep>> CompiledModelImpl::PlanAt(int64_t batch) const {
  auto it = per_batch_.find(batch);
  if (it == per_batch_.end() || !it->second.ran) {
    return absl::FailedPreconditionError(
        absl::StrCat("no run at batch ", batch, " yet: implementations are known after one"));
  }
  const BatchState& state = it->second;
  std::vector<PlannedStep> plan;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& step = *steps_[k];
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
  if (state.arena_bytes > arena_bytes_ || arena_ == nullptr) {
    // One arena for every batch size: it grows to the largest plan.
    const size_t bytes =
        (std::max<int64_t>(state.arena_bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    arena_.reset();
    arena_bytes_ = 0;
    arena_.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
    if (arena_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " activation bytes for batch ", batch));
    }
    arena_bytes_ = static_cast<int64_t>(bytes);
  }
  state.data.assign(num_values, nullptr);
  for (const auto& step : steps_) {
    const double flops = step->Flops(state.shapes);
    int64_t elements = 0;
    for (ValueId v : step->Reads()) {
      if (v != kNoValue) elements += kernels::NumElements(state.shapes[v]);
    }
    const bool serial = threads_ > 1 && (flops > 0 ? flops < options_.serial_below_flops
                                                   : elements < options_.serial_below_elements);
    state.step_flops.push_back(flops);
    state.step_bytes.push_back(StepBytes(*step, state.shapes));
    const ValueId residual = step->ResidualInput();
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
  state.last_used = ++use_clock_;
  return &per_batch_.emplace(batch, std::move(state)).first->second;
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

void CompiledModelImpl::PlanBatchSplit(int64_t batch, BatchState& state) const {
  const int num_values = graph_.num_values();
  state.slice_local.assign(num_values, false);
  const int64_t cache = options_.batch_split_cache_bytes;
  if (cache <= 0 || batch < 2) return;
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
  std::vector<int64_t> row_floats(num_values, 0);
  int best_end = -1;
  double saved = 0, weights = 0, best_net = 0;
  // The most rows a slice may hold for the steps so far: a step's largest
  // value for that many rows and its weights (read again by every slice)
  // fill at most half the cache, so that they and the next step's output
  // stay there; at least an eighth of the cache goes to the values.
  int64_t max_rows = std::numeric_limits<int64_t>::max(), best_rows = 0;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const std::vector<ValueId> values = steps_[k]->RowWiseValues();
    if (values.empty()) break;
    bool row_wise = true;
    int64_t written_bytes = 0, step_row_bytes = 0;
    for (ValueId v : values) {
      if (v == kNoValue) continue;
      const Shape& s = state.shapes[v];
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
      const int64_t budget = std::max(cache / 2 - steps_[k]->WeightBytes(), cache / 8);
      max_rows = std::min(max_rows, std::max<int64_t>(1, budget / step_row_bytes));
    }
    if (written_bytes > cache) saved += 2.0 * static_cast<double>(written_bytes);
    weights += static_cast<double>(steps_[k]->WeightBytes());
    const int64_t slices = max_rows >= batch ? 1 : (batch + max_rows - 1) / max_rows;
    const double net = saved - static_cast<double>(slices - 1) * weights;
    if (slices >= 2 && net > best_net) {
      best_net = net;
      best_end = static_cast<int>(k);
      best_rows = max_rows;
    }
  }
  if (best_end < 0) return;  // best_rows >= 1: the step made two slices or more
  // Of the sizes between half the most rows and that, one dividing the
  // batch is preferred.
  int64_t rows = best_rows;
  if (rows * 2 > batch) return;  // not two slices: nothing to gain
  for (int64_t r = rows; r * 2 > rows; --r) {
    if (batch % r == 0) {
      rows = r;
      break;
    }
  }
  state.split_steps = best_end + 1;
  state.slice_rows = rows;
  state.row_floats = std::move(row_floats);
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
  std::vector<bool> seen(num_values, false);
  for (int k = 0; k < state.split_steps; ++k) {
    for (ValueId v : steps_[k]->RowWiseValues()) {
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

}  // namespace

int64_t LastLevelCacheBytes() {
  const uint64_t bytes = affinity::OuterCacheBytes(sched_getcpu());
  return bytes > 0 ? static_cast<int64_t>(bytes) : int64_t{32} << 20;
}

double ForkJoinSeconds(int threads) {
  static std::mutex mu;
  static std::map<int, double> measured;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = measured.find(threads); it != measured.end()) return it->second;
  constexpr int kRegions = 200;
  std::vector<double> seconds;
  seconds.reserve(kRegions);
  std::atomic<int> sink{0};
  for (int i = 0; i < kRegions + 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    sink.fetch_add(1, std::memory_order_relaxed);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 10) seconds.push_back(s);  // the first ones create the team
  }
  std::nth_element(seconds.begin(), seconds.begin() + kRegions / 2, seconds.end());
  return measured[threads] = seconds[kRegions / 2];
}

double ElementwiseFloatsPerSecond() {
  static const double rate = [] {
    constexpr int64_t kFloats = 64 * 1024;  // 256 KiB in, 256 KiB out: in L2
    std::vector<float> x(kFloats, 1.0f), y(kFloats);
    double best = 1e30;
    for (int rep = 0; rep < 20; ++rep) {
      const float a = 1.0f + 1e-7f * static_cast<float>(rep);
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < kFloats; ++i) y[i] = a * x[i] + 0.5f;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      x[rep] = y[kFloats - 1 - rep];  // keeps each pass's result alive
      best = std::min(best, s);
    }
    return best > 0 ? static_cast<double>(kFloats) / best : 1e9;
  }();
  return rate;
}

int64_t DefaultSerialBelowElements(int threads) {
  if (threads <= 1) return 0;
  return static_cast<int64_t>(kSerialForkJoins * ForkJoinSeconds(threads) *
                              ElementwiseFloatsPerSecond() * threads / (threads - 1));
}

double DefaultSerialBelowFlops(int threads) {
  if (threads <= 1) return 0;
  const double flops_per_second = 0.5 * kernels::Fp32PeakGflopsPerCore() * 1e9;
  return kSerialForkJoins * ForkJoinSeconds(threads) * flops_per_second * threads / (threads - 1);
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

const std::vector<std::string>& PrecisionChoices() {
  static const std::vector<std::string> kChoices = {"fp32", "bf16"};
  return kChoices;
}

absl::StatusOr<Precision> PrecisionFromName(const std::string& name) {
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    if (name == PrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("precision '", absl::CHexEscape(name),
                                                 "' is not one of ",
                                                 absl::StrJoin(PrecisionChoices(), ", ")));
}

const std::vector<std::string>& GemmBackendChoices() {
  static const std::vector<std::string> kChoices = {"onednn", "blis", "openblas", "numaserve",
                                                    "auto"};
  return kChoices;
}

absl::Status CheckGemmBackendChoice(const std::string& name) {
  const auto& choices = GemmBackendChoices();
  if (std::find(choices.begin(), choices.end(), name) != choices.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("gemm backend '", name, "' is not one of ", absl::StrJoin(choices, ", ")));
}

namespace {

std::string ProfileRowNote(const StepProfile& row) {
  std::string note = row.layouts;
  if (row.threads == 1) absl::StrAppend(&note, note.empty() ? "" : ", ", "1 thread");
  if (row.slice_rows > 0) {
    absl::StrAppend(&note, note.empty() ? "" : ", ", "slices of ", row.slice_rows, " rows");
  }
  if (!row.implementation.empty()) {
    absl::StrAppend(&note, note.empty() ? "" : ", ", row.implementation);
  }
  return note.empty() ? "" : absl::StrCat(" [", note, "]");
}

std::string Gflops(const StepProfile& row) {
  if (row.flops <= 0 || row.seconds <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", row.flops / row.seconds / 1e9);
  return buf;
}

bool IsBoundary(const StepProfile& row) {
  if (row.kind == "reorder") return true;
  const size_t arrow = row.layouts.find("->");
  return arrow != std::string::npos &&
         row.layouts.substr(0, arrow) != row.layouts.substr(arrow + 2);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string FormatStepProfile(const std::vector<StepProfile>& profile, int64_t runs, int top,
                              double wall_seconds) {
  const double per_run = 1e3 / static_cast<double>(std::max<int64_t>(runs, 1));  // s -> ms/run
  double total = 0;
  std::map<std::string, StepProfile> kinds;  // summed per kind
  std::map<std::string, int> kind_rows;
  for (const StepProfile& row : profile) {
    total += row.seconds;
    StepProfile& k = kinds[row.kind];
    k.seconds += row.seconds;
    k.flops += row.flops;
    ++kind_rows[row.kind];
  }
  auto share = [&](double seconds) { return total > 0 ? 100.0 * seconds / total : 0.0; };
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "  %lld runs: %.3f ms per run in %zu profiled rows",
                static_cast<long long>(runs), total * per_run, profile.size());
  out += line;
  if (wall_seconds > 0) {
    std::snprintf(line, sizeof(line), ", %.3f ms outside steps (run wall %.3f ms)",
                  std::max(0.0, wall_seconds - total) * per_run, wall_seconds * per_run);
    out += line;
  }
  out += "\n";
  std::vector<std::pair<std::string, StepProfile>> by_kind(kinds.begin(), kinds.end());
  std::stable_sort(by_kind.begin(), by_kind.end(), [](const auto& a, const auto& b) {
    return a.second.seconds > b.second.seconds;
  });
  std::snprintf(line, sizeof(line), "  %-16s %5s %10s %7s %8s\n", "kind", "rows", "ms/run", "share",
                "GFLOP/s");
  out += line;
  for (const auto& [kind, k] : by_kind) {
    std::snprintf(line, sizeof(line), "  %-16s %5d %10.3f %6.1f%% %8s\n", kind.c_str(),
                  kind_rows[kind], k.seconds * per_run, share(k.seconds), Gflops(k).c_str());
    out += line;
  }
  std::vector<const StepProfile*> sorted;
  for (const StepProfile& row : profile) sorted.push_back(&row);
  std::stable_sort(sorted.begin(), sorted.end(), [](const StepProfile* a, const StepProfile* b) {
    return a->seconds > b->seconds;
  });
  const size_t shown = top <= 0 ? sorted.size() : std::min(sorted.size(), static_cast<size_t>(top));
  std::snprintf(line, sizeof(line), "  top %zu of %zu rows %7s %7s %8s  step\n", shown,
                sorted.size(), "ms/run", "share", "GFLOP/s");
  out += line;
  auto print_row = [&](const StepProfile& row) {
    std::snprintf(line, sizeof(line), "  #%-4d %15.3f %6.1f%% %8s  ", row.index,
                  row.seconds * per_run, share(row.seconds), Gflops(row).c_str());
    absl::StrAppend(&out, line, row.description, ProfileRowNote(row), "\n");
  };
  for (size_t i = 0; i < shown; ++i) print_row(*sorted[i]);
  double boundary = 0;
  int boundaries = 0;
  for (const StepProfile& row : profile) {
    if (IsBoundary(row)) {
      boundary += row.seconds;
      ++boundaries;
    }
  }
  std::snprintf(line, sizeof(line),
                "  layout boundaries and residual reorders: %d rows, %.3f ms per run, %.1f%%\n",
                boundaries, boundary * per_run, share(boundary));
  out += line;
  for (const StepProfile& row : profile) {
    if (IsBoundary(row)) print_row(row);
  }
  return out;
}

std::string StepProfileJson(const std::vector<StepProfile>& profile, int64_t runs,
                            double wall_seconds) {
  const double per_run = 1e3 / static_cast<double>(std::max<int64_t>(runs, 1));
  double total = 0;
  for (const StepProfile& row : profile) total += row.seconds;
  std::string out = absl::StrCat("{\"runs\": ", runs, ", \"step_ms\": ", total * per_run,
                                 ", \"wall_ms\": ", wall_seconds * per_run, ", \"rows\": [");
  for (size_t i = 0; i < profile.size(); ++i) {
    const StepProfile& row = profile[i];
    absl::StrAppend(
        &out, i == 0 ? "" : ", ", "{\"index\": ", row.index, ", \"kind\": ", JsonString(row.kind),
        ", \"step\": ", JsonString(row.description), ", \"layouts\": ", JsonString(row.layouts),
        ", \"implementation\": ", JsonString(row.implementation), ", \"threads\": ", row.threads,
        ", \"ms\": ", row.seconds * per_run, ", \"share\": ", total > 0 ? row.seconds / total : 0.0,
        ", \"gflops\": ", row.seconds > 0 ? row.flops / row.seconds / 1e9 : 0.0,
        ", \"bytes\": ", row.bytes / static_cast<double>(std::max<int64_t>(runs, 1)),
        ", \"precision\": ", JsonString(row.precision),
        ", \"boundary\": ", IsBoundary(row) ? "true" : "false", "}");
  }
  return out + "]}";
}

std::string DefaultGemmCacheFile() {
  if (const char* file = std::getenv("NUMASERVE_GEMM_CACHE"); file != nullptr) return file;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return absl::StrCat(xdg, "/numaserve/gemm_choices.tsv");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    return absl::StrCat(home, "/.cache/numaserve/gemm_choices.tsv");
  }
  return "";
}

absl::StatusOr<std::unique_ptr<CompiledModel>> CompiledModel::Load(const std::string& path,
                                                                   const CompileOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  if (options.batch_groups < 1 || options.batch_group_min_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_groups must be >= 1 and batch_group_min_rows >= 0, got ",
                     options.batch_groups, " and ", options.batch_group_min_rows));
  }
  if (absl::Status s = CheckGemmBackendChoice(options.gemm_backend); !s.ok()) return s;
  if (options.conv_algorithm != "direct" && options.conv_algorithm != "winograd") {
    return absl::InvalidArgumentError(absl::StrCat("conv algorithm '", options.conv_algorithm,
                                                   "' is not one of direct, winograd"));
  }
  if (options.precision == Precision::kBf16) {
    if (options.gemm_backend != "onednn" && options.gemm_backend != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": precision bf16 runs matmuls on oneDNN; gemm backend '",
                       options.gemm_backend, "' has no BF16 path (use onednn or auto)"));
    }
    // Never emulated: where oneDNN has no native BF16 kernels, say why.
    const kernels::Bf16Support& bf16 = kernels::GetBf16Support();
    if (!bf16.native) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": precision bf16 is not available on this CPU: ", bf16.reason,
                       " (native BF16 needs AVX512_BF16 or AMX-BF16; use precision fp32)"));
    }
  }
  if (options.num_threads > 0) omp_set_num_threads(options.num_threads);
  // The ISA tier (and oneDNN's cap) is fixed before any primitive exists.
  kernels::GetKernelTable();
  auto graph = ImportOnnxModel(path);
  if (!graph.ok()) return graph.status();
  auto info = DescribeGraph(*graph, path);
  if (!info.ok()) return info.status();
  std::unique_ptr<CompiledModelImpl> model;
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    model =
        std::make_unique<CompiledModelImpl>(*std::move(graph), *std::move(info), options, engine);
  } catch (const dnnl::error& e) {
    return kernels::DnnlErrorToStatus(e, path + ": creating the oneDNN engine");
  }
  // A oneDNN error or failed allocation while compiling fails this load,
  // not the worker.
  absl::Status s;
  try {
    s = model->Compile();
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError("out of memory compiling the model (std::bad_alloc)");
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat("compiling the model failed: ", e.what()));
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  const int groups = BatchGroupsFor(options, threads);
  if (groups > 1) return WrapInBatchGroups(std::move(model), path, options, threads, groups);
  return std::unique_ptr<CompiledModel>(std::move(model));
}

}  // namespace numaserve::engine
