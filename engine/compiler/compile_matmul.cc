// CompiledModelImpl (compiled_model_impl.h): MatMul and Gemm on the GEMM
// backends, the GEMM choice, the GELU, attention and batched-matmul
// fusions, and the QDQ plan (which nodes run INT8).
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

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
    if (!SameShapes(shapes1, scale.outputs[0], out)) continue;  // the scalar broadcasts nothing
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
  const int step = static_cast<int>(plan_.steps.size());
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
  plan_.steps.push_back(std::make_unique<BatchedMatMulStep>(engine_, operands[0], operands[1], out,
                                                            std::move(dst_perm), alpha, name));
}

// An attention chain CompileAttention matches: the nodes after the first
// MatMul (-1: absent), the chain's output, and the operands as stored.
struct CompiledModelImpl::AttentionMatch {
  int scale = -1;  // the scalar Mul/Div of the scores
  float alpha = 1.0f;
  int softmax = -1;
  int pv = -1;  // MatMul(probabilities, v)
  int out_transpose = -1;
  size_t rank = 0;  // the product's
  ValueId out = kNoValue;
  std::vector<int64_t> dst_perm;
  // q, k and v: as the graph names them, as stored, and the transposes
  // read through to them (-1: none).
  ValueId logical[3] = {kNoValue, kNoValue, kNoValue};
  AttentionStep::Operand operands[3];
  int transposes[3] = {-1, -1, -1};
};

bool CompiledModelImpl::CompileAttention(int node_index,
                                         const std::vector<std::vector<int>>& consumers,
                                         const std::vector<Shape>& shapes1,
                                         const std::vector<int>& producer,
                                         std::vector<bool>& fused) {
  if (!options_.fuse_attention) return false;
  AttentionMatch m;
  if (!MatchAttentionChain(node_index, consumers, shapes1, m) ||
      !ResolveAttentionOperands(node_index, consumers, shapes1, producer, m) ||
      !AttentionShapesFit(shapes1, m) || (polymorphic_ && !AttentionShapesFit(probe2_, m))) {
    return false;
  }
  const auto& nodes = graph_.nodes();
  const Node& qk = nodes[node_index];
  const int step = static_cast<int>(plan_.steps.size());
  std::string name = qk.name;
  for (int k = 0; k < 3; ++k) {
    const int t = m.transposes[k];
    if (t < 0) continue;
    if (t < node_index) {
      step_of_node_[t] = step;  // read inside this step only
    } else {
      fused[t] = true;
    }
    absl::StrAppend(&name, "+", nodes[t].name);
  }
  for (int j : {m.scale, m.softmax, m.pv, m.out_transpose}) {
    if (j < 0) continue;
    fused[j] = true;
    absl::StrAppend(&name, "+", nodes[j].name);
  }
  plan_.steps.push_back(std::make_unique<AttentionStep>(
      m.operands[0], m.operands[1], m.operands[2], m.out, std::move(m.dst_perm), m.alpha, name));
  return true;
}

bool CompiledModelImpl::MatchAttentionChain(int node_index,
                                            const std::vector<std::vector<int>>& consumers,
                                            const std::vector<Shape>& shapes1,
                                            AttentionMatch& m) const {
  const auto& nodes = graph_.nodes();
  const Node& qk = nodes[node_index];
  if (qk.op_type != "MatMul" || qk.inputs.size() != 2 || qk.inputs[0] == qk.inputs[1]) {
    return false;
  }
  // qk -> [scale] -> Softmax(last axis) -> MatMul(probabilities, v) -> [Transpose]
  ValueId scores = qk.outputs[0];
  const auto [scale, alpha] = ScaleOfProduct(scores, consumers, shapes1);
  m.scale = scale;
  m.alpha = alpha;
  if (scale >= 0) scores = nodes[scale].outputs[0];
  const size_t rank = shapes1[qk.outputs[0]].size();
  m.rank = rank;
  const int softmax = SoleConsumer(scores, "Softmax", consumers);
  m.softmax = softmax;
  if (softmax < 0 || NeedsTypedRun(graph_, nodes[softmax]) || rank < 2) return false;
  const int64_t axis = GetSoftmaxSemantics(graph_, nodes[softmax]).axis;
  if (axis != -1 && axis != static_cast<int64_t>(rank) - 1) return false;
  const ValueId probs = nodes[softmax].outputs[0];
  const int pv = SoleConsumer(probs, "MatMul", consumers);
  m.pv = pv;
  if (pv < 0 || NeedsTypedRun(graph_, nodes[pv]) || nodes[pv].inputs.size() != 2 ||
      nodes[pv].inputs[0] != probs || nodes[pv].inputs[1] == probs) {
    return false;
  }
  m.out = nodes[pv].outputs[0];
  if (shapes1[m.out].size() != rank) return false;
  m.out_transpose = TransposeOfProduct(m.out, consumers, shapes1);
  if (m.out_transpose >= 0) {
    m.dst_perm = TransposePerm(nodes[m.out_transpose], rank);
    m.out = nodes[m.out_transpose].outputs[0];
  }
  return true;
}

bool CompiledModelImpl::ResolveAttentionOperands(int node_index,
                                                 const std::vector<std::vector<int>>& consumers,
                                                 const std::vector<Shape>& shapes1,
                                                 const std::vector<int>& producer,
                                                 AttentionMatch& m) const {
  const auto& nodes = graph_.nodes();
  const Node& qk = nodes[node_index];
  const size_t rank = m.rank;
  // The operands as stored, through the transposes feeding them; each must
  // be ready here (computed by an earlier node) and of the product's rank.
  m.logical[0] = qk.inputs[0];
  m.logical[1] = qk.inputs[1];
  m.logical[2] = nodes[m.pv].inputs[1];
  for (int k = 0; k < 3; ++k) {
    const ValueId v = m.logical[k];
    if (graph_.IsConstant(v) || shapes1[v].size() != rank) return false;
    AttentionStep::Operand& operand = m.operands[k];
    operand.value = v;
    const int t = producer[v];
    if (t >= 0 && nodes[t].op_type == "Transpose" &&
        (absorbed_transpose_[t] ||
         (t > node_index && TransposeFeedsBatchedMatMul(t, consumers, shapes1)))) {
      operand.value = nodes[t].inputs[0];
      operand.perm = TransposePerm(nodes[t], rank);
      m.transposes[k] = t;
    }
    const int p = producer[operand.value];
    if (p > node_index || graph_.IsConstant(operand.value)) return false;
  }
  return true;
}

bool CompiledModelImpl::AttentionShapesFit(const std::vector<Shape>& shapes1,
                                           const AttentionMatch& m) const {
  const size_t rank = m.rank;
  // v and the output are read and written a row of a head at a time.
  const size_t last = rank - 1;
  if (!m.operands[2].perm.empty() && m.operands[2].perm[last] != static_cast<int64_t>(last)) {
    return false;
  }
  if (!m.dst_perm.empty() && m.dst_perm[last] != static_cast<int64_t>(last)) return false;
  // Shapes at batch 1: q [.., sq, d], k [.., d, sk], v [.., sk, dv], batch
  // dims equal to the product's or 1.
  const Shape& q = shapes1[m.logical[0]];
  const Shape& k = shapes1[m.logical[1]];
  const Shape& v = shapes1[m.logical[2]];
  const Shape& y = shapes1[graph_.nodes()[m.pv].outputs[0]];
  if (k[last - 1] != q[last] || v[last - 1] != k[last] || y[last - 1] != q[last - 1] ||
      y[last] != v[last]) {
    return false;
  }
  for (size_t d = 0; d + 2 < rank; ++d) {
    for (const Shape* x : {&q, &k, &v}) {
      if ((*x)[d] != 1 && (*x)[d] != y[d]) return false;
    }
  }
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
  FindQdqPairs();
  const std::vector<bool> q_absorbed = QuantizesReadByPairsAlone(consumers);
  for (int i = 0; i < n; ++i) {
    if (!qdq_of_node_[i].has_value()) continue;
    const QdqInput pair = *qdq_of_node_[i];
    if (!q_absorbed[pair.quantize_node]) {
      qdq_of_node_[i].reset();  // the QuantizeLinear runs: its DequantizeLinear too
      continue;
    }
    absorbed_qdq_[pair.quantize_node] = true;
    // INT8 kernels take UINT8 inputs; when their readers all run INT8 the
    // pair needs no step (else it runs as a fake-quantize step).
    const ValueId out = graph_.nodes()[i].outputs[0];
    std::vector<int> int8_readers;
    for (int c : consumers[out]) {
      if (pair.is_uint8 && Int8Capable(c, out, shapes1)) int8_readers.push_back(c);
    }
    if (int8_readers.empty()) continue;
    if (!use_int8) {
      kept_fp32 += static_cast<int>(int8_readers.size());
      continue;
    }
    if (int8_readers.size() == consumers[out].size() && !is_output_[out]) {
      absorbed_qdq_[i] = true;
      for (int c : int8_readers) int8_input_[c] = pair;
      continue;
    }
    // Read by FP32 steps too (a full-QDQ file's residual Add): the pair
    // runs (in the conv before it where it folds), and its INT8 readers
    // quantize its dequantized output again with the same scale and zero
    // point, which gives back the same integers.
    QdqInput requantize = pair;
    requantize.source = out;
    for (int c : int8_readers) int8_input_[c] = requantize;
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

void CompiledModelImpl::FindQdqPairs() {
  const int n = static_cast<int>(graph_.nodes().size());
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
}

std::vector<bool> CompiledModelImpl::QuantizesReadByPairsAlone(
    const std::vector<std::vector<int>>& consumers) const {
  const int n = static_cast<int>(graph_.nodes().size());
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
  return q_absorbed;
}

namespace {

// Gemm's alpha, transA, beta and C on `mm`: a constant row-vector C becomes
// the bias, another C (beta not 0) the value the product adds onto.
void ReadGemmAttributes(const Graph& graph, const Node& node, kernels::GemmOptions& mm,
                        ValueId& accumulate_from) {
  mm.weights_scale = node.GetFloat("alpha", 1.0f);
  mm.src_transposed = node.GetInt("transA", 0) != 0;
  const float beta = node.GetFloat("beta", 1.0f);
  const ValueId c_id = node.inputs.size() > 2 ? node.inputs[2] : kNoValue;
  const Constant* c = c_id != kNoValue ? graph.FindConstant(c_id) : nullptr;
  // A constant C that is a row vector (scalar, [N], [1,N]) is a bias.
  const bool row_vector =
      c != nullptr && c->type == DataType::kFloat32 && (c->shape.size() <= 1 || c->shape[0] == 1) &&
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

}  // namespace

// A weight matmul being built: the kernel's options, the step's name and
// the values it reads, adds onto and writes.
struct CompiledModelImpl::MatMulBuild {
  kernels::GemmOptions mm;
  std::string name;
  ValueId src = kNoValue;
  ValueId accumulate_from = kNoValue;
  ValueId out = kNoValue;
};

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
      plan_.steps.push_back(std::move(fast));
    } else {
      plan_.steps.push_back(std::make_unique<ReferenceStep>(&graph_, node_index));
    }
    return absl::OkStatus();
  }
  MatMulBuild b;
  kernels::GemmOptions& mm = b.mm;
  mm.weights = weights->f32.data.data();
  mm.weights_transposed = is_gemm && node.GetInt("transB", 0) != 0;
  mm.k = weights->shape[mm.weights_transposed ? 1 : 0];
  mm.n = weights->shape[mm.weights_transposed ? 0 : 1];
  // 2N FLOPs per element of A: a classifier of 10 outputs stays FP32.
  mm.bf16 = UseBf16(2.0 * static_cast<double>(mm.n));
  b.name = node.name;
  b.src = node.inputs[0];
  if (const std::optional<QdqInput>& q8 = int8_input_[node_index]; q8.has_value()) {
    // A QDQ pair before it: INT8 on the pair's FP32 input.
    mm.int8 = Int8WeightsOf(node, mm.weights_transposed ? 0 : 1, mm.n);
    if (mm.int8.has_value()) {
      mm.int8->src_scale = q8->scale;
      mm.int8->src_zero_point = q8->zero_point;
      mm.bf16 = false;
      b.src = q8->source;
      b.name = absl::StrCat(graph_.nodes()[q8->quantize_node].name, "+", b.name);
    }
  }
  if (is_gemm) ReadGemmAttributes(graph_, node, mm, b.accumulate_from);
  b.out = node.outputs[0];
  FuseMatMulOutputs(node_index, consumers, shapes1, producer, fused, b);
  std::string note;
  auto kernel = CreateGemm(mm, b.name, &note);
  if (!kernel.ok()) {
    return absl::Status(kernel.status().code(),
                        absl::StrCat(node.Describe(), ": ", kernel.status().message()));
  }
  plan_.steps.push_back(std::make_unique<MatMulStep>(
      *std::move(kernel), b.src, b.out, b.accumulate_from, std::move(b.name), std::move(note)));
  return absl::OkStatus();
}

void CompiledModelImpl::FuseMatMulOutputs(int node_index,
                                          const std::vector<std::vector<int>>& consumers,
                                          const std::vector<Shape>& shapes1,
                                          const std::vector<int>& producer,
                                          std::vector<bool>& fused, MatMulBuild& b) const {
  kernels::GemmOptions& mm = b.mm;
  std::string& name = b.name;
  ValueId& out = b.out;
  const size_t out_rank = shapes1[out].size();
  // + constant bias along N (any leading dims 1, rank not above the output's).
  if (int j = SoleConsumer(out, "Add", consumers); j >= 0) {
    const Node& add = graph_.nodes()[j];
    const ValueId other = add.inputs[0] == out ? add.inputs[1] : add.inputs[0];
    const Constant* bias = graph_.FindConstant(other);
    const bool bias_like = bias != nullptr && bias->type == DataType::kFloat32 &&
                           bias->shape.size() <= out_rank && !bias->shape.empty() &&
                           bias->shape.back() == mm.n && kernels::NumElements(bias->shape) == mm.n;
    if (bias_like) {
      if (mm.bias.empty()) mm.bias.assign(mm.n, 0.0f);
      for (int64_t i = 0; i < mm.n; ++i) mm.bias[i] += bias->f32.data[i];
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
  } else if (int j = SoleConsumer(out, "Gelu", consumers);
             j >= 0 && graph_.nodes()[j].GetString("approximate", "none") == "none") {
    // Opset 20's Gelu node in its erf form: the same epilogue.
    mm.gelu_erf = true;
    fused[j] = true;
    out = graph_.nodes()[j].outputs[0];
    absl::StrAppend(&name, "+", graph_.nodes()[j].name);
  } else if (int j = SoleConsumer(out, "Add", consumers); j >= 0 && !mm.accumulate) {
    // A residual Add of a tensor computed earlier: dst starts as it, the
    // matmul adds onto it (a sum post-op).
    const Node& add = graph_.nodes()[j];
    const ValueId other = add.inputs[0] == out ? add.inputs[1] : add.inputs[0];
    if (other != out && !graph_.IsConstant(other) && producer[other] < node_index &&
        SameShapes(shapes1, other, out)) {
      mm.accumulate = true;
      mm.sum_scale = 1.0f;
      b.accumulate_from = other;
      fused[j] = true;
      out = add.outputs[0];
      absl::StrAppend(&name, "+", add.name);
    }
  }
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

}  // namespace numaserve::engine::internal
