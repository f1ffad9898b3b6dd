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
//
// This file: the Compile driver and its lowering table (LoweringOf), the
// element-wise and layout steps, the plan's description, Load, and the
// defaults CompileOptions derives from the machine. compiled_model_impl.h
// lists the others.
// To lower an op on a faster step: write one Lower* member function (a
// LowerContext in; true when it added the node's step or view, false to
// leave the node to FastStep and then the reference) and add one row for
// the op type to the table in LoweringOf.
#include <malloc.h>

#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "affinity/memory_policy.h"
#include "base/mutex.h"
#include "engine/compiler/compiled_model_impl.h"
#include "engine/compiler/concat_step.h"

namespace numaserve::engine::internal {

int CompiledModelImpl::SoleConsumer(ValueId v, const char* op_type,
                                    const std::vector<std::vector<int>>& consumers) const {
  if (is_output_[v] || consumers[v].size() != 1) return -1;
  const int j = consumers[v][0];
  return graph_.nodes()[j].op_type == op_type ? j : -1;
}

const absl::flat_hash_map<std::string_view, CompiledModelImpl::Lowering>&
CompiledModelImpl::Lowerings() {
  // One row per op type; ops sharing a lowering tell themselves apart by
  // their op_type inside it.
  static const auto* lowerings = new absl::flat_hash_map<std::string_view, Lowering>{
      {"Conv", &CompiledModelImpl::LowerConv},
      {"ConvTranspose", &CompiledModelImpl::LowerConvTranspose},
      {"Gemm", &CompiledModelImpl::LowerMatMul},
      {"MatMul", &CompiledModelImpl::LowerMatMul},
      {"Add", &CompiledModelImpl::LowerAdd},
      {"Relu", &CompiledModelImpl::LowerRelu},
      {"Softmax", &CompiledModelImpl::LowerSoftmax},
      {"Flatten", &CompiledModelImpl::LowerView},
      {"Reshape", &CompiledModelImpl::LowerView},
      {"Identity", &CompiledModelImpl::LowerView},
      {"Squeeze", &CompiledModelImpl::LowerView},
      {"Unsqueeze", &CompiledModelImpl::LowerView},
      {"Dropout", &CompiledModelImpl::LowerView},
      {"MaxPool", &CompiledModelImpl::LowerPool},
      {"AveragePool", &CompiledModelImpl::LowerPool},
      {"GlobalAveragePool", &CompiledModelImpl::LowerPool},
      {"GlobalMaxPool", &CompiledModelImpl::LowerPool},
      {"Transpose", &CompiledModelImpl::LowerTranspose},
      {"Concat", &CompiledModelImpl::LowerConcat},
      {"ReduceSum", &CompiledModelImpl::LowerReduce},
      {"ReduceMean", &CompiledModelImpl::LowerReduce},
      {"ReduceMax", &CompiledModelImpl::LowerReduce},
      {"ReduceMin", &CompiledModelImpl::LowerReduce},
      {"LayerNormalization", &CompiledModelImpl::LowerLayerNorm},
      {"Sigmoid", &CompiledModelImpl::LowerGate},
      {"HardSigmoid", &CompiledModelImpl::LowerGate},
      {"HardSwish", &CompiledModelImpl::LowerGate},
      {"Mul", &CompiledModelImpl::LowerMul},
      {"LSTM", &CompiledModelImpl::LowerRnn},
      {"GRU", &CompiledModelImpl::LowerRnn},
  };
  return *lowerings;
}

CompiledModelImpl::Lowering CompiledModelImpl::LoweringOf(const std::string& op_type) {
  const auto it = Lowerings().find(std::string_view(op_type));
  return it != Lowerings().end() ? it->second : nullptr;
}

std::vector<std::string> CompiledModelImpl::LoweredOpTypes() {
  std::vector<std::string> ops;
  for (const auto& [op, lowering] : Lowerings()) ops.emplace_back(op);
  return ops;
}

bool CompiledModelImpl::AddReferenceStep(int node_index) {
  plan_.steps.push_back(std::make_unique<ReferenceStep>(&graph_, node_index));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerConv(const LowerContext& c) {
  auto done = CompileConv(c.node_index, c.consumers, c.shapes1, c.producer, c.fused);
  if (!done.ok()) return done.status();
  if (!*done) AddReferenceStep(c.node_index);
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerConvTranspose(const LowerContext& c) {
  if (!CompileConvTranspose(c.node_index, c.shapes1)) AddReferenceStep(c.node_index);
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerMatMul(const LowerContext& c) {
  if (absl::Status s = CompileMatMul(c.node_index, c.consumers, c.shapes1, c.producer, c.fused);
      !s.ok()) {
    return s;
  }
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerAdd(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  if (node.inputs.size() != 2) return false;
  plan_.steps.push_back(std::make_unique<AddStep>(engine_, node.inputs[0], node.inputs[1],
                                                  node.outputs[0], node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerRelu(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  plan_.steps.push_back(
      std::make_unique<ReluStep>(engine_, node.inputs[0], node.outputs[0], node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerSoftmax(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  const SoftmaxSemantics sm = GetSoftmaxSemantics(graph_, node);
  plan_.steps.push_back(std::make_unique<SoftmaxStep>(engine_, sm.axis, sm.flatten_to_2d,
                                                      node.inputs[0], node.outputs[0], node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerView(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  if (node.op_type == "Dropout" && node.outputs.size() != 1) return false;
  plan_.root[node.outputs[0]] = plan_.root[node.inputs[0]];  // a view: same bytes, another shape
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerPool(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  const std::string& op = node.op_type;
  const ValueId in = node.inputs[0], out = node.outputs[0];
  const Shape& x = c.shapes1[in];
  const bool global = op.rfind("Global", 0) == 0;
  const bool is_max = op == "MaxPool" || op == "GlobalMaxPool";
  const bool include_pad = node.GetInt("count_include_pad", 0) != 0;
  if (x.size() < 3 || x.size() > 5 || node.outputs.size() != 1) {
    return AddReferenceStep(c.node_index);
  }
  if (include_pad && node.GetInt("ceil_mode", 0) != 0) return AddReferenceStep(c.node_index);
  kernels::WindowParams window;
  if (!global) {
    auto w = ops::ResolveWindow(node, x, node.GetInts("kernel_shape", {}));
    if (!w.ok() || !WindowHolds(node, in, node.GetInts("kernel_shape", {}), *w)) {
      return AddReferenceStep(c.node_index);
    }
    window = *w;
    if (!is_max) {
      for (int64_t d : window.dilations) {
        if (d != 1) return AddReferenceStep(c.node_index);
      }
    }
  }
  const dnnl::algorithm alg = is_max        ? dnnl::algorithm::pooling_max
                              : include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                            : dnnl::algorithm::pooling_avg_exclude_padding;
  plan_.steps.push_back(std::make_unique<PoolStep>(
      kernels::PoolOnednn(engine_, alg, window, global, plan_.blocked_layout), in, out, node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerTranspose(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  const ValueId in = node.inputs[0], out = node.outputs[0];
  auto perm = node.GetInts("perm", {});
  if (perm.empty()) {
    for (int64_t d = static_cast<int64_t>(c.shapes1[in].size()) - 1; d >= 0; --d) {
      perm.push_back(d);
    }
  }
  for (int64_t& p : perm) {
    if (p < 0) p += static_cast<int64_t>(perm.size());
  }
  plan_.steps.push_back(std::make_unique<TransposeStep>(perm, in, out, node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerConcat(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  if (node.outputs.size() != 1 || node.inputs.empty()) return AddReferenceStep(c.node_index);
  const ValueId out = node.outputs[0];
  // FP32 only: the integer concats of shapes stay on the typed reference.
  bool fp32 = graph_.value(out).type == DataType::kFloat32;
  for (ValueId v : node.inputs)
    fp32 = fp32 && v != kNoValue && graph_.value(v).type == DataType::kFloat32;
  const int64_t rank = static_cast<int64_t>(c.shapes1[out].size());
  int64_t axis = node.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (!fp32 || rank == 0 || axis < 0 || axis >= rank) return AddReferenceStep(c.node_index);
  plan_.steps.push_back(std::make_unique<ConcatStep>(node.inputs, axis, out, node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerReduce(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  const std::string& op = node.op_type;
  const ValueId in = node.inputs[0], out = node.outputs[0];
  if (node.outputs.size() != 1) return false;
  // Only reductions over trailing axes (contiguous rows) with the axes
  // known at compile time; anything else stays on the reference.
  const int64_t rank = static_cast<int64_t>(c.shapes1[in].size());
  auto axes = ops::IntsFromAttrOrInput(graph_, node, "axes", 1);
  if (!axes.ok() || rank == 0) return AddReferenceStep(c.node_index);
  int64_t first_axis = 0;     // no axes: all of them
  const auto& given = *axes;  // no axes, or the axes given
  if (given.has_value() && !given->empty()) {
    auto norm = ops::NormalizeAxes(node, *given, rank);
    if (!norm.ok()) return AddReferenceStep(c.node_index);
    std::vector<int64_t> sorted = *norm;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    first_axis = rank - static_cast<int64_t>(sorted.size());
    for (size_t j = 0; j < sorted.size(); ++j) {
      if (sorted[j] != first_axis + static_cast<int64_t>(j)) return AddReferenceStep(c.node_index);
    }
  } else if (node.GetInt("noop_with_empty_axes", 0) != 0) {
    return AddReferenceStep(c.node_index);
  }
  const auto kind = op == "ReduceSum"    ? ReduceRowsStep::Kind::kSum
                    : op == "ReduceMean" ? ReduceRowsStep::Kind::kMean
                    : op == "ReduceMax"  ? ReduceRowsStep::Kind::kMax
                                         : ReduceRowsStep::Kind::kMin;
  plan_.steps.push_back(std::make_unique<ReduceRowsStep>(kind, first_axis, in, out, node.name));
  return true;
}

absl::StatusOr<bool> CompiledModelImpl::LowerLayerNorm(const LowerContext& c) {
  const Node& node = graph_.nodes()[c.node_index];
  const ValueId in = node.inputs[0], out = node.outputs[0];
  if (node.outputs.size() != 1) return false;
  const Shape& x = c.shapes1[in];
  const int64_t axis = node.GetInt("axis", -1);
  const Constant* scale = graph_.FindConstant(node.inputs[1]);
  const Constant* bias = node.inputs.size() > 2 && node.inputs[2] != kNoValue
                             ? graph_.FindConstant(node.inputs[2])
                             : nullptr;
  const bool has_bias_input = node.inputs.size() > 2 && node.inputs[2] != kNoValue;
  if (x.empty() || (axis != -1 && axis != static_cast<int64_t>(x.size()) - 1)) {
    return AddReferenceStep(c.node_index);
  }
  const int64_t len = x.back();
  if (polymorphic_ && probe2_[in].back() != len) return AddReferenceStep(c.node_index);
  if (scale == nullptr || static_cast<int64_t>(scale->f32.data.size()) != len) {
    return AddReferenceStep(c.node_index);
  }
  if (has_bias_input && (bias == nullptr || static_cast<int64_t>(bias->f32.data.size()) != len)) {
    return AddReferenceStep(c.node_index);
  }
  std::vector<float> b = bias != nullptr ? bias->f32.data : std::vector<float>(len, 0.0f);
  plan_.steps.push_back(std::make_unique<LayerNormStep>(
      scale->f32.data, std::move(b), node.GetFloat("epsilon", 1e-5f), in, out, node.name));
  return true;
}

std::unique_ptr<Step> CompiledModelImpl::FastStep(int node_index,
                                                  const std::vector<Shape>& shapes1) {
  const Node& node = graph_.nodes()[node_index];
  const std::string& op = node.op_type;
  const ValueId in = node.inputs[0], out = node.outputs[0];
  // Compile sends every MatMul to CompileMatMul, which runs this case itself
  // before calling here; kept so FastStep answers for a MatMul as before.
  if (op == "MatMul" && shapes1[in].size() >= 2 && shapes1[node.inputs[1]].size() >= 2) {
    return std::make_unique<BatchedMatMulStep>(engine_, in, node.inputs[1], out, node.name);
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
  if (absl::Status s = RewriteEinsumsAsMatMuls(graph_); !s.ok()) return s;
  const int num_values = graph_.num_values();
  plan_.root.resize(num_values);
  for (ValueId v = 0; v < num_values; ++v) plan_.root[v] = v;
  is_output_.assign(num_values, false);
  for (ValueId v : graph_.outputs()) is_output_[v] = true;
  const auto consumers = graph_.Consumers();
  // Batch 1 (other dynamic dims at the first probe's size: the plan runs at
  // every signature, and what it decides from sizes holds at both probes).
  auto shapes1 = PropagateShapes(graph_, ProbeInputShapes(graph_, 0));
  if (!shapes1.ok()) return shapes1.status();
  plan_.shapes1 = *shapes1;
  polymorphic_ = HasDynamicNonBatchDims(graph_);
  if (polymorphic_) {
    auto probe2 = PropagateShapes(graph_, ProbeInputShapes(graph_, 1));
    if (!probe2.ok()) return probe2.status();
    probe2_ = *std::move(probe2);
    // Batch splitting compares a value's rows with its shape at batch 1,
    // which other dynamic dims change: off for such models.
    options_.batch_split_cache_bytes = 0;
  }
  // Shape values (shape_propagation.h) are computed for the whole batch of
  // a signature: a slice of the rows would read them at the wrong size.
  for (const Node& node : graph_.nodes()) {
    if (node.op_type == "Shape" || node.op_type == "Size") options_.batch_split_cache_bytes = 0;
  }
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
    const size_t steps_before = plan_.steps.size();
    StepOfNodes step_of(i, steps_before, fused, plan_.steps, step_of_node_);
    const Node& node = graph_.nodes()[i];
    const std::string& op = node.op_type;
    const ValueId out = node.outputs[0];
    const bool view = op == "Flatten" || op == "Reshape" || op == "Identity" || op == "Squeeze" ||
                      op == "Unsqueeze" || (op == "Dropout" && node.outputs.size() == 1);
    if (absorbed_qdq_[i]) continue;  // read inside the INT8 steps after it
    if (const std::optional<QdqInput>& q = qdq_of_node_[i]; q.has_value()) {
      // A QuantizeLinear -> DequantizeLinear pair whose readers do not all
      // run INT8: one FP32 step, the quantized tensor never stored.
      plan_.steps.push_back(std::make_unique<FakeQuantStep>(
          engine_, plan_.blocked_layout, q->scale, q->zero_point, q->is_uint8 ? 0 : -128,
          q->is_uint8 ? 255 : 127, q->source, out,
          absl::StrCat(graph_.nodes()[q->quantize_node].name, "+", node.name)));
      continue;
    }
    if (!view && NeedsTypedRun(graph_, node)) {
      // A value other than FP32 at runtime: the op's typed reference.
      auto step = TypedReferenceStep::Create(&graph_, i);
      if (!step.ok()) return step.status();
      plan_.steps.push_back(*std::move(step));
      continue;
    }
    if (op == "Transpose" && TransposeFeedsBatchedMatMul(i, consumers, *shapes1)) {
      absorbed_transpose_[i] = true;  // no step: the matmul after it reads through strides
      continue;
    }
    if (const Lowering lower = LoweringOf(op); lower != nullptr) {
      auto handled = (this->*lower)(LowerContext{i, consumers, *shapes1, producer, fused});
      if (!handled.ok()) return handled.status();
      if (*handled) continue;
    }
    if (auto fast = FastStep(i, *shapes1); fast != nullptr) {
      plan_.steps.push_back(std::move(fast));
    } else {
      plan_.steps.push_back(std::make_unique<ReferenceStep>(&graph_, i));
    }
  }
  PlanAfterLowering(consumers, producer);
  return absl::OkStatus();
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
  plan_.blocked_layout = channels_last ? kernels::BlockedLayout::kChannelsLast
                                       : kernels::BlockedLayout::kChannelBlocked;
}

void CompiledModelImpl::PlanAfterLowering(const std::vector<std::vector<int>>& consumers,
                                          const std::vector<int>& producer) {
  // An absorbed QDQ pair is read inside the steps of its readers: its
  // values (the pair's FP32 input included) live until the last of them.
  for (int i = static_cast<int>(graph_.nodes().size()) - 1; i >= 0; --i) {
    if (!absorbed_qdq_[i]) continue;
    for (ValueId v : graph_.nodes()[i].outputs) {
      for (int c : consumers[v]) step_of_node_[i] = std::max(step_of_node_[i], step_of_node_[c]);
    }
  }
  AssignStorage(plan_);
  ChooseLayouts(plan_);
  plan_.threads = options_.num_threads > 0 ? options_.num_threads : omp_get_max_threads();
  if (options_.serial_below_flops < 0) {
    options_.serial_below_flops = DefaultSerialBelowFlops(plan_.threads);
  }
  if (options_.serial_below_elements < 0) {
    options_.serial_below_elements = DefaultSerialBelowElements(plan_.threads);
  }
  plan_.num_threads = options_.num_threads;
  plan_.serial_below_flops = options_.serial_below_flops;
  plan_.serial_below_elements = options_.serial_below_elements;
  plan_.batch_split_cache_bytes = options_.batch_split_cache_bytes;
  plan_.batch_plans = options_.batch_plans;
  plan_.batch_plan_idle_runs = options_.batch_plan_idle_runs;
  plan_.max_activation_bytes = options_.max_activation_bytes;
  PlanLifetimes(plan_, step_of_node_, producer, consumers);
  PlanInPlaceResiduals(plan_, options_.in_place_residuals);
  PlanStepReads(plan_, step_of_node_, absorbed_qdq_);
  // The plan is complete: the runtime runs it from here on.
  executor_ = std::make_unique<runtime::Executor>(&plan_, engine_);
  if (options_.profile_steps) executor_->PrintProfileAtExit();
}

bool CompiledModelImpl::SameShapes(const std::vector<Shape>& shapes1, ValueId a, ValueId b) const {
  return shapes1[a] == shapes1[b] && (!polymorphic_ || probe2_[a] == probe2_[b]);
}

bool CompiledModelImpl::WindowHolds(const Node& node, ValueId x, const std::vector<int64_t>& kernel,
                                    const kernels::WindowParams& window) const {
  if (!polymorphic_) return true;
  // auto_pad SAME_* with a stride above 1 pads by the input's size modulo
  // the stride: no two probes can tell it holds, so a dynamic spatial dim
  // there runs on the reference.
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  const Shape& x1 = plan_.shapes1[x];
  const Shape& x2 = probe2_[x];
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (size_t d = 0; d < window.strides.size() && d + 2 < x1.size(); ++d) {
      if (window.strides[d] != 1 && x1[d + 2] != x2[d + 2]) return false;
    }
  }
  auto other = ops::ResolveWindow(node, x2, kernel);
  return other.ok() && other->kernel == window.kernel && other->strides == window.strides &&
         other->dilations == window.dilations && other->pads_begin == window.pads_begin &&
         other->pads_end == window.pads_end;
}

std::string CompiledModelImpl::DescribePlan() const {
  std::string plan;
  for (const auto& step : plan_.steps) absl::StrAppend(&plan, step->Describe(), "\n");
  return plan;
}

}  // namespace numaserve::engine::internal

namespace numaserve::engine {

int64_t LastLevelCacheBytes() {
  const uint64_t bytes = affinity::OuterCacheBytes(sched_getcpu());
  return bytes > 0 ? static_cast<int64_t>(bytes) : int64_t{32} << 20;
}

double ForkJoinSeconds(int threads) {
  static base::Mutex mu;
  static std::map<int, double> measured;  // under mu
  base::MutexLock lock(&mu);
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

std::string DefaultGemmCacheFile() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return absl::StrCat(xdg, "/numaserve/gemm_choices.tsv");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    return absl::StrCat(home, "/.cache/numaserve/gemm_choices.tsv");
  }
  return "";
}

namespace {

// Imports and compiles the model on the calling thread and its team of
// `threads`: under CompileOptions::weights_numa_node's policy where one is
// set, so that what the compile allocates (the weights) lands there.
absl::StatusOr<std::unique_ptr<internal::CompiledModelImpl>> ImportAndCompile(
    const std::string& path, const CompileOptions& options, int threads) {
  std::optional<affinity::ScopedTeamMemoryPolicy> weights_policy;
  if (options.weights_numa_node >= 0) {
    weights_policy.emplace(options.weights_numa_node,
                           options.weights_numa_strict ? affinity::MemoryPolicy::kStrict
                                                       : affinity::MemoryPolicy::kPrefer,
                           threads);
    if (const absl::Status& s = weights_policy->status(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": cannot place the weights on NUMA node ",
                                                 options.weights_numa_node, ": ", s.message()));
    }
  }
  auto graph = ImportOnnxModel(path);
  if (!graph.ok()) return graph.status();
  auto info = DescribeGraph(*graph, path);
  if (!info.ok()) return info.status();
  std::unique_ptr<internal::CompiledModelImpl> model;
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    model = std::make_unique<internal::CompiledModelImpl>(*std::move(graph), *std::move(info),
                                                          options, engine);
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
  return model;
}

}  // namespace

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
  if (options.max_activation_bytes < 0 || options.batch_plan_idle_runs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_activation_bytes and batch_plan_idle_runs must be >= 0, got ",
                     options.max_activation_bytes, " and ", options.batch_plan_idle_runs));
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
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  auto model = ImportAndCompile(path, options, threads);
  // What the compile freed (the parsed file, timing buffers) lies on the
  // weights' node: given back now, so that later allocations reusing it
  // fault fresh pages under the caller's own policy.
  if (options.weights_numa_node >= 0) malloc_trim(0);
  if (!model.ok()) return model.status();
  const int groups = BatchGroupsFor(options, threads);
  if (groups > 1) return WrapInBatchGroups(*std::move(model), path, options, threads, groups);
  return std::unique_ptr<CompiledModel>(*std::move(model));
}

}  // namespace numaserve::engine

namespace numaserve::engine {
namespace {

// The batch whose shapes ("dim 0 = batch, other dims as declared") are
// `input_shapes`, for a CompiledModel that runs at batch sizes only.
absl::StatusOr<int64_t> BatchOfSignature(const ModelInfo& info,
                                         const CompiledModel::InputShapes& input_shapes) {
  if (input_shapes.size() != info.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(info.path, ": expected ", info.inputs.size(),
                                                   " input shapes, got ", input_shapes.size()));
  }
  int64_t batch = -1;
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    const TensorInfo& t = info.inputs[i];
    if (!t.shape.empty() && t.shape[0] < 0 && !input_shapes[i].empty()) {
      batch = input_shapes[i][0];
      break;
    }
  }
  if (batch < 0) batch = 1;
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    std::vector<int64_t> want = info.inputs[i].shape;
    for (size_t d = 0; d < want.size(); ++d) {
      if (want[d] < 0) {
        if (d > 0) {
          return absl::UnimplementedError(absl::StrCat(info.path, ": input '", info.inputs[i].name,
                                                       "' has dynamic dim ", d,
                                                       ", which this model does not run"));
        }
        want[d] = batch;
      }
    }
    if (want != input_shapes[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          info.path, ": input '", info.inputs[i].name, "' is ", kernels::ShapeToString(want),
          " at batch ", batch, ", got ", kernels::ShapeToString(input_shapes[i])));
    }
  }
  return batch;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int64_t>>> CompiledModel::OutputShapes(
    const InputShapes& input_shapes) const {
  auto batch = BatchOfSignature(info(), input_shapes);
  if (!batch.ok()) return batch.status();
  std::vector<std::vector<int64_t>> shapes = OutputShapes(*batch);
  if (shapes.empty() && !info().outputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(info().path, ": cannot run at batch ", *batch));
  }
  return shapes;
}

absl::Status CompiledModel::Run(const InputShapes& input_shapes,
                                const std::vector<const void*>& inputs,
                                const std::vector<void*>& outputs) {
  auto batch = BatchOfSignature(info(), input_shapes);
  if (!batch.ok()) return batch.status();
  return Run(*batch, inputs, outputs);
}

absl::Status CompiledModel::CheckBufferSizes(const InputShapes& input_shapes,
                                             const std::vector<size_t>& input_bytes,
                                             const std::vector<size_t>& output_bytes) const {
  auto batch = BatchOfSignature(info(), input_shapes);
  if (!batch.ok()) return batch.status();
  return CheckBufferSizes(*batch, input_bytes, output_bytes);
}

absl::StatusOr<int64_t> CompiledModel::ActivationBytes(const InputShapes& input_shapes) {
  auto batch = BatchOfSignature(info(), input_shapes);
  if (!batch.ok()) return batch.status();
  return ActivationBytes(*batch);
}

}  // namespace numaserve::engine
