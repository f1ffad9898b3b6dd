// CompiledModelImpl (compiled_model_impl.h): Conv (with folded
// BatchNormalization, residual sums, activations and fused depthwise convs)
// and ConvTranspose on oneDNN and the own kernels.
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

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

}  // namespace

std::optional<kernels::EltwisePostOp> ActivationPostOp(const Graph& graph, const Node& node) {
  using dnnl::algorithm;
  const std::string& op = node.op_type;
  if (op == "Relu") return kernels::EltwisePostOp{algorithm::eltwise_relu, 0.0f, 0.0f};
  if (op == "LeakyRelu") {
    return kernels::EltwisePostOp{algorithm::eltwise_relu, node.GetFloat("alpha", 0.01f), 0.0f};
  }
  if (op == "Sigmoid") return kernels::EltwisePostOp{algorithm::eltwise_logistic, 0.0f, 0.0f};
  if (op == "Tanh") return kernels::EltwisePostOp{algorithm::eltwise_tanh, 0.0f, 0.0f};
  // ONNX's max(0, min(1, alpha * x + beta)), and x times it with alpha 1/6
  // and beta 1/2: oneDNN 3's hardsigmoid and hardswish take the same form.
  if (op == "HardSigmoid") {
    return kernels::EltwisePostOp{algorithm::eltwise_hardsigmoid, node.GetFloat("alpha", 0.2f),
                                  node.GetFloat("beta", 0.5f)};
  }
  if (op == "HardSwish") {
    return kernels::EltwisePostOp{algorithm::eltwise_hardswish, 1.0f / 6.0f, 0.5f};
  }
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

// What CompileConv's phases share: the arguments it was called with and
// the conv being built (its options, weights and bias, output and name).
struct CompiledModelImpl::ConvBuild {
  ConvBuild(const Node& conv_node, int index, const std::vector<std::vector<int>>& node_consumers,
            const std::vector<Shape>& value_shapes1, const std::vector<int>& value_producer,
            std::vector<bool>& fused_nodes)
      : node(conv_node),
        node_index(index),
        consumers(node_consumers),
        shapes1(value_shapes1),
        producer(value_producer),
        fused(fused_nodes) {}

  const Node& node;
  int node_index;
  const std::vector<std::vector<int>>& consumers;
  const std::vector<Shape>& shapes1;
  const std::vector<int>& producer;
  std::vector<bool>& fused;
  kernels::ConvOnednnOptions o;
  std::vector<float> weights;  // o.weights points here (read until Create)
  std::vector<float> bias;
  bool has_bias = false;
  std::string name;
  ValueId out = kNoValue;
  ValueId input = kNoValue;  // the step's input (a QDQ pair's FP32 one for INT8)
  ValueId sum_from = kNoValue;
  std::optional<kernels::Int8Params> int8;
};

// A QuantizeLinear -> DequantizeLinear pair that reads only this conv's
// output and is not read inside INT8 steps (it would run as a
// fake-quantize step of its own: MobileNetV2's pairs before its depthwise
// convs) folds into the conv's post-ops. With an integer zero point z,
// (saturate_lo_hi(round(x / s) + z) - z) * s is s * clip(round(x / s),
// lo - z, hi - z): linear(1 / s), round half to even, clip, pow(s, 1)
// (one linear: see kernels::CanAppendEltwise). As in the INT8 kernels,
// the reciprocal may differ from ONNX's division by one unit in the last
// place, so at an exact tie once in a while.
struct CompiledModelImpl::FoldableQdqPair {
  int quantize_node = -1, dequantize_node = -1;
  std::vector<kernels::EltwisePostOp> post_ops;
};

// A depthwise 3x3 conv that can run as a 1x1 conv's depthwise post-op: its
// node, weights, bias (when it has one) and stride.
struct CompiledModelImpl::DepthwiseMatch {
  int node = -1;
  const Constant* weights = nullptr;
  bool has_bias = false;
  const Constant* bias = nullptr;
  int64_t stride = 0;
};

namespace {

// Appends a QDQ pair's post-ops `pair_ops` to `chain` where oneDNN runs
// them right (kernels::CanAppendEltwise); false, and `chain` as it was,
// otherwise.
bool AppendQdqPostOps(const std::vector<kernels::EltwisePostOp>& pair_ops,
                      std::vector<kernels::EltwisePostOp>& chain) {
  std::vector<kernels::EltwisePostOp> trial = chain;
  for (const kernels::EltwisePostOp& e : pair_ops) {
    if (!kernels::CanAppendEltwise(trial, e)) return false;
    trial.push_back(e);
  }
  chain = std::move(trial);
  return true;
}

}  // namespace

absl::StatusOr<bool> CompiledModelImpl::CompileConv(int node_index,
                                                    const std::vector<std::vector<int>>& consumers,
                                                    const std::vector<Shape>& shapes1,
                                                    const std::vector<int>& producer,
                                                    std::vector<bool>& fused) {
  const Node& node = graph_.nodes()[node_index];
  ConvBuild cb(node, node_index, consumers, shapes1, producer, fused);
  if (absl::StatusOr<bool> read = ReadConvParams(cb); !read.ok() || !*read) return read;
  FuseConvOutputs(cb);
  ChooseConvImplementation(cb);
  // A QDQ pair reading only the conv's output (FoldableQdqPair).
  if (const std::optional<FoldableQdqPair> pair = FoldableQdqPairOf(cb, cb.out); pair.has_value()) {
    kernels::ConvOnednnOptions trial = cb.o;
    const ValueId dq_out = graph_.nodes()[pair->dequantize_node].outputs[0];
    if (AppendQdqPostOps(pair->post_ops, trial.eltwise) &&
        ConvRunsFast(trial, shapes1[cb.input], shapes1[dq_out])) {
      cb.o.eltwise = std::move(trial.eltwise);
      TakeQdqPair(cb, *pair, cb.out, cb.name);
    }
  }
  if (const std::optional<DepthwiseMatch> dw = DepthwiseAfterConv(cb); dw.has_value()) {
    FuseConvDepthwise(cb, *dw);
  }
  cb.o.name = cb.name;
  auto conv = kernels::ConvOnednn::Create(engine_, std::move(cb.o));
  if (!conv.ok()) {
    return absl::Status(conv.status().code(),
                        absl::StrCat(node.Describe(), ": ", conv.status().message()));
  }
  auto step = std::make_unique<ConvStep>(*std::move(conv), cb.input, cb.out, cb.sum_from,
                                         std::move(cb.name));
  step->SetEngine(engine_);
  plan_.steps.push_back(std::move(step));
  return true;
}

// Reads the conv's window, weights and bias into cb (and the INT8 operands
// when a QDQ pair feeds it); false when the node needs the reference.
absl::StatusOr<bool> CompiledModelImpl::ReadConvParams(ConvBuild& cb) const {
  const Node& node = cb.node;
  const Constant* w = graph_.FindConstant(node.inputs[1]);
  const Constant* b = node.inputs.size() > 2 && node.inputs[2] != kNoValue
                          ? graph_.FindConstant(node.inputs[2])
                          : nullptr;
  const Shape& x_shape = cb.shapes1[node.inputs[0]];
  if (w == nullptr || w->type != DataType::kFloat32 || x_shape.size() < 3 || x_shape.size() > 5 ||
      (node.inputs.size() > 2 && node.inputs[2] != kNoValue && b == nullptr)) {
    return false;
  }
  const std::vector<int64_t> kernel =
      node.GetInts("kernel_shape", std::vector<int64_t>(w->shape.begin() + 2, w->shape.end()));
  auto window = ops::ResolveWindow(node, x_shape, kernel);
  if (!window.ok()) return window.status();
  // Pads that follow a dynamic input size: the reference runs it.
  if (!WindowHolds(node, node.inputs[0], kernel, *window)) return false;
  kernels::ConvOnednnOptions& o = cb.o;
  o.blocked_layout = plan_.blocked_layout;
  o.group = node.GetInt("group", 1);
  o.in_channels = x_shape[1];
  o.out_channels = w->shape[0];
  o.kernel = window->kernel;
  o.strides = window->strides;
  o.dilations = window->dilations;
  o.pads_begin = window->pads_begin;
  o.pads_end = window->pads_end;
  cb.weights = w->f32.data;
  cb.bias = std::vector<float>(o.out_channels, 0.0f);
  cb.has_bias = b != nullptr;
  if (b != nullptr) cb.bias = b->f32.data;
  cb.name = node.name;
  cb.out = node.outputs[0];
  // A QDQ pair before it: INT8 on the pair's FP32 input (its weights a
  // folded DequantizeLinear of INT8 values).
  cb.input = node.inputs[0];
  if (const std::optional<QdqInput>& q8 = int8_input_[cb.node_index]; q8.has_value()) {
    cb.int8 = Int8WeightsOf(node, 0, o.out_channels);
    if (cb.int8.has_value()) {
      cb.int8->src_scale = q8->scale;
      cb.int8->src_zero_point = q8->zero_point;
      cb.input = q8->source;
      cb.name = absl::StrCat(graph_.nodes()[q8->quantize_node].name, "+", cb.name);
    }
  }
  return true;
}

// Folds the nodes reading the conv's output into it: a BatchNormalization,
// a residual Add (as the sum post-op) and a chain of activations.
void CompiledModelImpl::FuseConvOutputs(ConvBuild& cb) const {
  if (FoldConvBatchNorm(cb, cb.out, cb.o.out_channels, cb.weights, cb.bias, cb.name,
                        cb.int8.has_value() ? &cb.int8->weight_scales : nullptr)) {
    cb.has_bias = true;
  }
  // A residual Add whose other operand is ready before this conv runs.
  if (int j = SoleConsumer(cb.out, "Add", cb.consumers); j >= 0) {
    const Node& add = graph_.nodes()[j];
    const ValueId out = cb.out;
    const ValueId other = add.inputs[0] == out ? add.inputs[1] : add.inputs[0];
    const bool ready =
        !graph_.IsConstant(other) && (cb.producer[other] < cb.node_index) && other != out;
    if (ready && SameShapes(cb.shapes1, other, out) && !graph_.IsConstant(other)) {
      cb.o.sum = true;
      cb.sum_from = other;
      cb.fused[j] = true;
      cb.out = add.outputs[0];
      absl::StrAppend(&cb.name, "+", add.name);
    }
  }
  // Activations (a chain of them).
  FuseConvActivations(cb, cb.out, cb.o.eltwise, cb.name);
}

// BatchNormalization with constant parameters folds into weights + bias
// (and, for INT8 weights, into their per-channel scales: q * s * a).
bool CompiledModelImpl::FoldConvBatchNorm(ConvBuild& cb, ValueId& value, int64_t channels,
                                          std::vector<float>& wts, std::vector<float>& bs,
                                          std::string& label,
                                          std::vector<float>* int8_scales) const {
  const int j = SoleConsumer(value, "BatchNormalization", cb.consumers);
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
  cb.fused[j] = true;
  value = bn.outputs[0];
  absl::StrAppend(&label, "+", bn.name);
  return true;
}

// Appends the chain of activations reading `value` alone to `posts`
// (a gated activation, GatedActivationOf, counting as one), moving `value`
// to the last one's output.
void CompiledModelImpl::FuseConvActivations(ConvBuild& cb, ValueId& value,
                                            std::vector<kernels::EltwisePostOp>& posts,
                                            std::string& label) const {
  while (!is_output_[value]) {
    // x * Sigmoid(x) or x * HardSigmoid(x) reading the value alone: one
    // post-op (swish, hardswish) for the gate and the Mul.
    if (const auto gated = GatedActivationOf(value, cb.consumers);
        gated.has_value() && !cb.fused[gated->gate] && !cb.fused[gated->mul]) {
      if (!kernels::CanAppendEltwise(posts, gated->op)) break;
      posts.push_back(gated->op);
      cb.fused[gated->gate] = true;
      cb.fused[gated->mul] = true;
      value = graph_.nodes()[gated->mul].outputs[0];
      absl::StrAppend(&label, "+", graph_.nodes()[gated->gate].name, "+",
                      graph_.nodes()[gated->mul].name);
      continue;
    }
    if (cb.consumers[value].size() != 1) break;
    const Node& act = graph_.nodes()[cb.consumers[value][0]];
    auto post = ActivationPostOp(graph_, act);
    if (!post.has_value() || !kernels::CanAppendEltwise(posts, *post)) break;
    posts.push_back(*post);
    cb.fused[cb.consumers[value][0]] = true;
    value = act.outputs[0];
    absl::StrAppend(&label, "+", act.name);
  }
}

// Sets the conv's bias and weights and its implementation: Winograd, BF16
// or INT8 (from the options and the work it does).
void CompiledModelImpl::ChooseConvImplementation(ConvBuild& cb) const {
  kernels::ConvOnednnOptions& o = cb.o;
  if (cb.has_bias) o.bias = std::move(cb.bias);
  o.weights = cb.weights.data();
  o.winograd = options_.conv_algorithm == "winograd";
  // BF16 where the conv does enough work per input element
  // (CompileOptions::bf16_min_flops_per_input): a depthwise conv on its own
  // or a 1x1 conv projecting many channels to few stays FP32.
  o.bf16 = UseBf16(ConvFlopsPerInput(o, 0));
  if (cb.int8.has_value()) {
    // No INT8 Winograd or depthwise post-op in oneDNN.
    o.winograd = false;
    o.bf16 = false;
    o.int8 = std::move(cb.int8);
  }
}

// Whether a conv with `trial`'s options (a fusion being considered)
// runs on a non-reference kernel between blocked activations (what conv
// chains get; plain ones run oneDNN's reference with or without it).
bool CompiledModelImpl::ConvRunsFast(kernels::ConvOnednnOptions trial, const Shape& src,
                                     const Shape& dst) const {
  trial.log_reference = false;
  auto conv = kernels::ConvOnednn::Create(engine_, std::move(trial));
  return conv.ok() && (*conv)->Prepare(src, dst, true, true).ok() &&
         !kernels::IsReferenceImplementation((*conv)->ImplementationName(src));
}

// The QDQ pair reading `value` alone that can fold into a conv's post-ops
// (FoldableQdqPair), or nothing.
std::optional<CompiledModelImpl::FoldableQdqPair> CompiledModelImpl::FoldableQdqPairOf(
    const ConvBuild& cb, ValueId value) const {
  const std::vector<std::vector<int>>& consumers = cb.consumers;
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
      (*pair)->quantize_node != qn || cb.fused[qn] || cb.fused[dqn]) {
    return std::nullopt;
  }
  const QdqInput& fq = **pair;
  // A scale so small that 1 / s overflows (a subnormal one) would turn
  // x * (1 / s) into inf or NaN where x / s is finite: a step of its own.
  const float inverse_scale = 1.0f / fq.scale;
  if (!std::isfinite(inverse_scale)) return std::nullopt;
  const float zp = static_cast<float>(fq.zero_point);
  const float lo = fq.is_uint8 ? 0.0f : -128.0f, hi = fq.is_uint8 ? 255.0f : 127.0f;
  return FoldableQdqPair{qn,
                         dqn,
                         {{dnnl::algorithm::eltwise_linear, inverse_scale, 0.0f},
                          {dnnl::algorithm::eltwise_round, 0.0f, 0.0f},
                          {dnnl::algorithm::eltwise_clip, lo - zp, hi - zp},
                          {dnnl::algorithm::eltwise_pow, fq.scale, 1.0f}}};
}

// Marks the pair fused into the conv named `step_name`, whose output
// (`value`) becomes the pair's.
void CompiledModelImpl::TakeQdqPair(ConvBuild& cb, const FoldableQdqPair& pair, ValueId& value,
                                    std::string& step_name) const {
  cb.fused[pair.quantize_node] = true;
  cb.fused[pair.dequantize_node] = true;
  value = graph_.nodes()[pair.dequantize_node].outputs[0];
  absl::StrAppend(&step_name, "+", graph_.nodes()[pair.quantize_node].name, "+",
                  graph_.nodes()[pair.dequantize_node].name);
}

// A depthwise 3x3 conv (pad 1, stride 1 or 2) reading only this 1x1
// conv's output, which may run as oneDNN's depthwise post-op (so the
// expanded tensor is never written out), or nothing.
std::optional<CompiledModelImpl::DepthwiseMatch> CompiledModelImpl::DepthwiseAfterConv(
    const ConvBuild& cb) const {
  const kernels::ConvOnednnOptions& o = cb.o;
  const ValueId out = cb.out;
  const Shape& x_shape = cb.shapes1[cb.node.inputs[0]];
  // In either layout: oneDNN 3's fused kernels are right in nhwc too
  // (2.6's jit_1x1 with a depthwise post-op on nhwc was not: isa_tier_test's
  // channels-last CNN and conv_depthwise_fusion_test check it).
  bool one_by_one = !o.sum && o.group == 1 && x_shape.size() == 4 && !o.int8.has_value();
  for (size_t d = 0; d < o.kernel.size() && one_by_one; ++d) {
    one_by_one = o.kernel[d] == 1 && o.strides[d] == 1 && o.dilations[d] == 1 &&
                 o.pads_begin[d] == 0 && o.pads_end[d] == 0;
  }
  const int d = one_by_one ? SoleConsumer(out, "Conv", cb.consumers) : -1;
  if (d < 0) return std::nullopt;
  const Node& dn = graph_.nodes()[d];
  const int64_t c = o.out_channels;
  const Constant* dw_w = dn.inputs.size() > 1 ? graph_.FindConstant(dn.inputs[1]) : nullptr;
  const bool has_dw_b = dn.inputs.size() > 2 && dn.inputs[2] != kNoValue;
  const Constant* dw_b = has_dw_b ? graph_.FindConstant(dn.inputs[2]) : nullptr;
  const bool ok = dn.inputs[0] == out && dn.outputs.size() == 1 && dw_w != nullptr &&
                  dw_w->type == DataType::kFloat32 && dw_w->shape == Shape{c, 1, 3, 3} &&
                  dn.GetInt("group", 1) == c &&
                  (!has_dw_b || (dw_b != nullptr && dw_b->type == DataType::kFloat32 &&
                                 static_cast<int64_t>(dw_b->f32.data.size()) == c));
  if (!ok) return std::nullopt;
  auto w = ops::ResolveWindow(dn, cb.shapes1[out], {3, 3});
  const bool window_ok =
      w.ok() && WindowHolds(dn, out, {3, 3}, *w) && w->kernel == std::vector<int64_t>{3, 3} &&
      w->strides[0] == w->strides[1] && (w->strides[0] == 1 || w->strides[0] == 2) &&
      w->dilations == std::vector<int64_t>{1, 1} && w->pads_begin == std::vector<int64_t>{1, 1} &&
      w->pads_end == std::vector<int64_t>{1, 1};
  if (!window_ok) return std::nullopt;
  return DepthwiseMatch{d, dw_w, has_dw_b, dw_b, w->strides[0]};
}

// Runs the depthwise conv `m` (with its BatchNormalization and activations)
// as the conv's depthwise post-op where oneDNN has a non-reference
// implementation for it; cb and its fused nodes as they were otherwise.
void CompiledModelImpl::FuseConvDepthwise(ConvBuild& cb, const DepthwiseMatch& m) const {
  kernels::ConvOnednnOptions& o = cb.o;
  std::vector<bool>& fused = cb.fused;
  const Node& dn = graph_.nodes()[m.node];
  const int64_t c = o.out_channels;
  const std::vector<bool> saved = fused;
  kernels::DepthwisePostOp dw;
  dw.weights = m.weights->f32.data;
  dw.bias = m.has_bias ? m.bias->f32.data : std::vector<float>(c, 0.0f);
  dw.stride = m.stride;
  ValueId dw_out = dn.outputs[0];
  std::string dw_name = absl::StrCat(cb.name, "+", dn.name);
  fused[m.node] = true;
  FoldConvBatchNorm(cb, dw_out, c, dw.weights, dw.bias, dw_name);
  FuseConvActivations(cb, dw_out, dw.eltwise, dw_name);
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
  const std::optional<FoldableQdqPair> dw_pair = FoldableQdqPairOf(cb, dw_out);
  const bool dw_pair_ok =
      chain_ok && dw_pair.has_value() && AppendQdqPostOps(dw_pair->post_ops, dw.eltwise);
  kernels::ConvOnednnOptions trial = o;
  trial.dw = dw;
  trial.winograd = false;
  // The pair's work per input element decides (in BF16, the 1x1 output
  // stays BF16 in cache: MobileNetV2's 192-channel stride-2 pair at
  // batch 32 took 9.0 ms against 10.7 ms in FP32).
  trial.bf16 = UseBf16(ConvFlopsPerInput(o, m.stride));
  // oneDNN's ref_fused_convolution chaining its jit 1x1 and depthwise
  // kernels counts as fast (MobileNetV2 ran 17-20% faster with it, and
  // the expanded tensor needs no arena memory); one chaining a
  // reference kernel does not.
  bool fast = dw_pair_ok && ConvRunsFast(trial, cb.shapes1[cb.input], cb.shapes1[dw_out]);
  if (fast) {
    TakeQdqPair(cb, *dw_pair, dw_out, dw_name);
  } else if (dw_pair_ok) {  // without the pair, which runs as a step of its own
    dw.eltwise.resize(dw.eltwise.size() - dw_pair->post_ops.size());
    trial.dw = dw;
  }
  if (!fast) fast = chain_ok && ConvRunsFast(trial, cb.shapes1[cb.input], cb.shapes1[dw_out]);
  if (fast) {
    o.dw = std::move(dw);
    o.winograd = false;
    o.bf16 = UseBf16(ConvFlopsPerInput(o, m.stride));
    cb.out = dw_out;
    cb.name = std::move(dw_name);
  } else {
    fused = saved;
  }
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
  std::optional<ops::ConvTransposeGeometry> g2;  // at the second probe (polymorphic_)
  if (polymorphic_) {
    // Pads and crops resolved from sizes (auto_pad, output_shape) follow
    // the input's size: the reference runs them.
    const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
    if ((auto_pad != "NOTSET" && auto_pad != "VALID") || node.HasAttribute("output_shape")) {
      return false;
    }
    auto at2 = ops::ConvTransposeResolve(node, probe2_[node.inputs[0]], w->shape);
    if (!at2.ok() || at2->p.pads_begin != g->p.pads_begin) return false;
    g2 = *std::move(at2);
  }
  kernels::ConvOnednnOptions o;
  o.blocked_layout = plan_.blocked_layout;
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
    // The same crop at every input size, or the reference runs it.
    if (g2.has_value() && (probe2_[node.inputs[0]][d + 2] - 1) * o.strides[d] + eff -
                                  o.pads_begin[d] - g2->out[d + 2] !=
                              end) {
      return false;
    }
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
  plan_.steps.push_back(std::move(step));
  return true;
}

}  // namespace numaserve::engine::internal
