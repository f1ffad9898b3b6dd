#include "engine/compiler/compiled_steps.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "engine/ops/typed_exec.h"
#include "kernels/cpu/attention.h"
#include "kernels/dispatch.h"
#include "kernels/ref/add_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine {
namespace {

int64_t RowsOf(const Shape& dst, int64_t n) { return kernels::NumElements(dst) / n; }

}  // namespace

absl::Status MatMulStep::Prepare(const std::vector<Shape>& shapes) {
  return kernel_->Prepare(RowsOf(shapes[dst_], kernel_->n()));
}

double MatMulStep::Flops(const std::vector<Shape>& shapes) const {
  return 2.0 * static_cast<double>(RowsOf(shapes[dst_], kernel_->n())) *
         static_cast<double>(kernel_->n()) * static_cast<double>(kernel_->k());
}

StepTraits MatMulStep::Traits(const kernels::GemmKernel& kernel, ValueId src, ValueId dst,
                              ValueId accumulate_from) {
  const kernels::GemmOptions& o = kernel.options();
  StepTraits t = StepTraits::ReadsWrites({src, accumulate_from}, {dst});
  t.residual_input = accumulate_from;
  t.residual_source = src;
  t.residual_output = dst;
  // Rows of the product are rows of src (and of a residual of the output's
  // shape); a broadcast Gemm C has no batch rows and ends a batch split.
  t.row_wise = accumulate_from == kNoValue ? std::vector<ValueId>{src, dst}
                                           : std::vector<ValueId>{src, accumulate_from, dst};
  t.weight_bytes = kernel.weight_bytes();
  const int64_t weight_size = o.int8.has_value() ? 1 : o.bf16 ? 2 : sizeof(float);
  t.parameter_bytes =
      kernel.k() * kernel.n() * weight_size + static_cast<int64_t>(o.bias.size() * sizeof(float));
  t.arithmetic = o.int8.has_value() ? "int8" : o.bf16 ? "bf16" : "fp32";
  return t;
}

std::string OwnKernelName(const char* kernel) {
  return absl::StrCat("numaserve:", kernel, " ",
                      kernels::IsaTierName(kernels::GetKernelTable().tier));
}

std::string MatMulStep::Implementation(const std::vector<Shape>& shapes) const {
  return kernel_->ImplementationName(RowsOf(shapes[dst_], kernel_->n()));
}

std::string BinaryStep::Implementation(const std::vector<Shape>& shapes) const {
  const Plan* plan = plans_.Peek(std::tie(shapes[a_], shapes[b_]));
  if (plan == nullptr) return "";
  if (plan->row_broadcast &&
      (kind_ == kernels::BinaryKind::kAdd || kind_ == kernels::BinaryKind::kMul)) {
    return OwnKernelName(kind_ == kernels::BinaryKind::kAdd ? "add_row_broadcast"
                                                            : "mul_row_broadcast");
  }
  return "numaserve:loop";
}

std::string TransposeStep::Implementation(const std::vector<Shape>& shapes) const {
  const size_t rank = shapes[dst_].size();
  bool last_two_swapped = rank >= 2 && perm_[rank - 2] == static_cast<int64_t>(rank) - 1 &&
                          perm_[rank - 1] == static_cast<int64_t>(rank) - 2;
  for (size_t d = 0; d + 2 < rank; ++d) last_two_swapped &= perm_[d] == static_cast<int64_t>(d);
  return last_two_swapped ? OwnKernelName("transpose_2d") : "numaserve:strided_copy";
}

absl::Status MatMulStep::Run(const StepContext& ctx) {
  const int64_t m = RowsOf(ctx.shapes[dst_], kernel_->n());
  float* dst = ctx.data[dst_];
  // When the plan gives dst the residual's bytes (the residual dies here),
  // it is already in place.
  if (accumulate_from_ != kNoValue && ctx.data[accumulate_from_] != dst) {
    const auto t0 = ctx.residual_seconds != nullptr ? std::chrono::steady_clock::now()
                                                    : std::chrono::steady_clock::time_point();
    // Gemm's C goes into the output first; the matmul adds beta * it.
    const Shape& c_shape = ctx.shapes[accumulate_from_];
    if (kernels::NumElements(c_shape) == m * kernel_->n()) {
      std::memcpy(dst, ctx.data[accumulate_from_], m * kernel_->n() * sizeof(float));
    } else {
      kernels::BroadcastTo(ctx.data[accumulate_from_], c_shape, dst, {m, kernel_->n()});
    }
    if (ctx.residual_seconds != nullptr) {
      *ctx.residual_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  return kernel_->Run(m, ctx.data[src_], dst);
}

absl::Status AddStep::Run(const StepContext& ctx) {
  return kernel_.Execute(ctx.stream, ctx.shapes[a_], ctx.data[a_], ctx.shapes[b_], ctx.data[b_],
                         ctx.shapes[dst_], ctx.data[dst_]);
}

absl::Status ReluStep::Run(const StepContext& ctx) {
  return kernel_.Execute(ctx.stream, kernels::NumElements(ctx.shapes[dst_]), ctx.data[src_],
                         ctx.data[dst_]);
}

absl::Status SoftmaxStep::Run(const StepContext& ctx) {
  return kernel_.Execute(ctx.stream, ctx.shapes[src_], ctx.data[src_], ctx.data[dst_]);
}

absl::Status ReferenceStep::Run(const StepContext& ctx) {
  const Node& node = graph_->nodes()[node_index_];
  inputs_.resize(node.inputs.size());
  std::vector<const kernels::Tensor*> in(node.inputs.size(), nullptr);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    if (v == kNoValue) continue;
    if (const Constant* c = graph_->FindConstant(v); c != nullptr) {
      if (c->f32.shape == c->shape) in[i] = &c->f32;
      continue;
    }
    const int64_t count = kernels::NumElements(ctx.shapes[v]);
    inputs_[i].shape = ctx.shapes[v];
    inputs_[i].data.assign(ctx.data[v], ctx.data[v] + count);
    in[i] = &inputs_[i];
  }
  auto out = schema_->reference(*graph_, node, in);
  if (!out.ok()) return out.status();
  for (size_t j = 0; j < node.outputs.size() && j < out->size(); ++j) {
    const ValueId v = node.outputs[j];
    const int64_t count = kernels::NumElements(ctx.shapes[v]);
    if ((*out)[j].size() != count) {
      return absl::InternalError(absl::StrCat(node.Describe(), ": output ", j, " has ",
                                              (*out)[j].size(), " elements, planned ", count));
    }
    if (count > 0) std::memcpy(ctx.data[v], (*out)[j].data.data(), count * sizeof(float));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TypedReferenceStep>> TypedReferenceStep::Create(const Graph* graph,
                                                                               int node_index) {
  std::unique_ptr<TypedReferenceStep> step(new TypedReferenceStep(graph, node_index));
  const Node& node = graph->nodes()[node_index];
  step->constants_.resize(node.inputs.size());
  step->inputs_.resize(node.inputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    const Constant* c = v == kNoValue ? nullptr : graph->FindConstant(v);
    if (c == nullptr) continue;
    auto t = ConstantAsTyped(*c);
    if (!t.ok()) {
      return absl::UnimplementedError(absl::StrCat(
          node.Describe(), ": input '", graph->value(v).name, "': ", t.status().message()));
    }
    step->constants_[i] = *std::move(t);
  }
  return step;
}

absl::Status TypedReferenceStep::Run(const StepContext& ctx) {
  const Node& node = graph_->nodes()[node_index_];
  std::vector<const TypedTensor*> in(node.inputs.size(), nullptr);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ValueId v = node.inputs[i];
    if (v == kNoValue) continue;
    if (const std::optional<TypedTensor>& constant = constants_[i]; constant.has_value()) {
      in[i] = &*constant;
      continue;
    }
    if (const Constant* c = graph_->FindConstant(v); c != nullptr) {
      // A shape value of this signature (ScopedShapeValues): the step
      // computing it may have been dropped from the plan.
      auto t = ConstantAsTyped(*c);
      if (!t.ok()) {
        return absl::InternalError(absl::StrCat(node.Describe(), ": input '", graph_->value(v).name,
                                                "': ", t.status().message()));
      }
      inputs_[i] = *std::move(t);
      in[i] = &inputs_[i];
      continue;
    }
    inputs_[i] = TypedTensor::View(RuntimeType(*graph_, v), ctx.shapes[v], ctx.data[v]);
    in[i] = &inputs_[i];
  }
  auto out = RunTypedNode(*graph_, node, in);
  if (!out.ok()) return out.status();
  for (size_t j = 0; j < node.outputs.size() && j < out->size(); ++j) {
    const ValueId v = node.outputs[j];
    const TypedTensor& t = (*out)[j];
    if (t.shape != ctx.shapes[v] || t.type != RuntimeType(*graph_, v)) {
      return absl::InternalError(absl::StrCat(
          node.Describe(), ": output ", j, " is ", DataTypeName(t.type), " ",
          kernels::ShapeToString(t.shape), ", planned ", DataTypeName(RuntimeType(*graph_, v)), " ",
          kernels::ShapeToString(ctx.shapes[v])));
    }
    if (!t.bytes.empty()) std::memcpy(ctx.data[v], t.bytes.data(), t.bytes.size());
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine

namespace numaserve::engine {

double ConvStep::Flops(const std::vector<Shape>& shapes) const {
  const kernels::ConvOnednnOptions& o = kernel_->options();
  double k = 1;
  for (int64_t e : o.kernel) k *= static_cast<double>(e);
  // Each output (conv) or input (deconv) element: (channels in per group) x
  // kernel multiply-adds.
  if (o.transposed) {
    return 2.0 * static_cast<double>(kernels::NumElements(shapes[src_])) *
           static_cast<double>(o.out_channels / o.group) * k;
  }
  if (o.dw.has_value()) {
    // The 1x1 conv over the depthwise input's extent, then 9 per output.
    const Shape& src = shapes[src_];
    const Shape& dst = shapes[dst_];
    const double expanded = static_cast<double>(src[0]) * static_cast<double>(dst[1]) *
                            static_cast<double>(src[2]) * static_cast<double>(src[3]);
    return 2.0 * expanded * static_cast<double>(o.in_channels) +
           2.0 * 9.0 * static_cast<double>(kernels::NumElements(dst));
  }
  return 2.0 * static_cast<double>(kernels::NumElements(shapes[dst_])) *
         static_cast<double>(o.in_channels / o.group) * k;
}

StepTraits ConvStep::Traits(const kernels::ConvOnednnOptions& o, ValueId src, ValueId dst,
                            ValueId sum_from) {
  StepTraits t = StepTraits::ReadsWrites({src, sum_from}, {dst});
  // An input of 1 to 3 channels (an image, after a fake-quantize step) is
  // read plain: oneDNN's jit kernels take it plain (their first-conv case)
  // and not channel-blocked, where only its reference does (which the conv
  // would reorder away from at each run).
  if (o.blocked_layout == kernels::BlockedLayout::kChannelBlocked && o.group == 1 &&
      !o.transposed && o.in_channels <= 3) {
    t.blocked_reads = {sum_from};
  } else {
    t.blocked_reads = {src, sum_from};
  }
  t.blocked_write = dst;
  t.residual_input = sum_from;
  t.residual_source = src;
  t.residual_output = dst;
  t.row_wise = sum_from == kNoValue ? std::vector<ValueId>{src, dst}
                                    : std::vector<ValueId>{src, sum_from, dst};
  int64_t weights = o.out_channels * (o.in_channels / std::max<int64_t>(o.group, 1));
  for (int64_t k : o.kernel) weights *= k;
  t.weight_bytes = weights * (o.bf16 ? 2 : static_cast<int64_t>(sizeof(float)));
  const int64_t weight_size = o.int8.has_value() ? 1 : o.bf16 ? 2 : sizeof(float);
  t.parameter_bytes = weights * weight_size + static_cast<int64_t>(o.bias.size() * sizeof(float));
  if (o.dw.has_value()) {
    // The fused depthwise conv's weights (BF16 with the 1x1's) and bias.
    t.parameter_bytes += static_cast<int64_t>(o.dw->weights.size()) * (o.bf16 ? 2 : sizeof(float)) +
                         static_cast<int64_t>(o.dw->bias.size() * sizeof(float));
  }
  t.arithmetic = o.int8.has_value() ? "int8" : o.bf16 ? "bf16" : "fp32";
  return t;
}

absl::Status ConvStep::Run(const StepContext& ctx) {
  float* dst = ctx.data[dst_];
  // When the plan gives dst the residual's bytes (the residual dies here),
  // the residual is already in place.
  if (sum_from_ != kNoValue && ctx.data[sum_from_] != dst) {
    // The residual enters dst in dst's layout; the conv adds onto it.
    const auto t0 = ctx.residual_seconds != nullptr ? std::chrono::steady_clock::now()
                                                    : std::chrono::steady_clock::time_point();
    if (absl::Status s = reorder_->Execute(ctx.stream, ctx.shapes[dst_], ctx.data[sum_from_],
                                           sum_blocked_, dst, dst_blocked_);
        !s.ok()) {
      return s;
    }
    if (ctx.residual_seconds != nullptr) {
      *ctx.residual_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  return kernel_->Execute(ctx.stream, ctx.shapes[src_], ctx.shapes[dst_], ctx.data[src_], dst);
}

absl::Status UnaryStep::Run(const StepContext& ctx) {
  const int64_t n = kernels::NumElements(ctx.shapes[dst_]);
  const float* x = ctx.data[src_];
  float* y = ctx.data[dst_];
  const kernels::UnaryParams p = params_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = kernels::ApplyUnary(p, x[i]);
  return absl::OkStatus();
}

absl::Status FakeQuantStep::Run(const StepContext& ctx) {
  const Shape& shape = ctx.shapes[dst_];
  const float* x = ctx.data[src_];
  float* y = ctx.data[dst_];
  if (src_blocked_ != dst_blocked_) {
    if (absl::Status s = reorder_.Execute(ctx.stream, shape, x, src_blocked_, y, dst_blocked_);
        !s.ok()) {
      return s;
    }
    x = y;
  }
  const int64_t n = dst_blocked_ ? kernels::ActivationBytes(shape, true, layout_) /
                                       static_cast<int64_t>(sizeof(float))
                                 : kernels::NumElements(shape);
  kernels::FakeQuantize(x, n, scale_, zero_point_, lo_, hi_, y);
  return absl::OkStatus();
}

absl::Status BinaryStep::Prepare(const std::vector<Shape>& shapes) {
  PlanFor(shapes);
  return absl::OkStatus();
}

const BinaryStep::Plan& BinaryStep::PlanFor(const std::vector<Shape>& shapes) {
  if (const Plan* found = plans_.Find(std::tie(shapes[a_], shapes[b_]))) return *found;
  const Shape& out = shapes[dst_];
  const size_t rank = out.size();
  const Shape pa = kernels::PadShapeLeft(shapes[a_], rank);
  const Shape pb = kernels::PadShapeLeft(shapes[b_], rank);
  Plan plan;
  // Grow the inner run from the last dim while both operands keep one mode.
  size_t d = rank;
  bool a_full = true, b_full = true;
  if (rank > 0) {
    a_full = pa[rank - 1] == out[rank - 1];
    b_full = pb[rank - 1] == out[rank - 1];
  }
  while (d > 0) {
    const bool af = pa[d - 1] == out[d - 1] || out[d - 1] == 1;
    const bool bf = pb[d - 1] == out[d - 1] || out[d - 1] == 1;
    const bool ab = pa[d - 1] == 1, bb = pb[d - 1] == 1;
    const bool a_ok = a_full ? af : ab;
    const bool b_ok = b_full ? bf : bb;
    if (!a_ok || !b_ok) break;
    plan.inner *= out[d - 1];
    --d;
  }
  plan.a_step = a_full ? 1 : 0;
  plan.b_step = b_full ? 1 : 0;
  const Shape outer(out.begin(), out.begin() + d);
  const Shape a_outer(pa.begin(), pa.begin() + d), b_outer(pb.begin(), pb.begin() + d);
  const int64_t a_inner = a_full ? plan.inner : 1, b_inner = b_full ? plan.inner : 1;
  plan.a_offsets = kernels::BroadcastOffsets(a_outer, outer);
  plan.b_offsets = kernels::BroadcastOffsets(b_outer, outer);
  for (int64_t& o : plan.a_offsets) o *= a_inner;
  for (int64_t& o : plan.b_offsets) o *= b_inner;
  plan.row_broadcast = plan.a_step == 1 && plan.b_step == 1 && plan.inner > 1;
  for (size_t o = 0; o < plan.a_offsets.size() && plan.row_broadcast; ++o) {
    plan.row_broadcast =
        plan.a_offsets[o] == static_cast<int64_t>(o) * plan.inner && plan.b_offsets[o] == 0;
  }
  return plans_.Emplace(std::make_tuple(shapes[a_], shapes[b_]), std::move(plan));
}

namespace {

// N elements of one run: a and b advancing by KA and KB (1, or 0 for one
// value repeated), known here so that the loop vectorizes.
template <kernels::BinaryKind kKind, int kA, int kB>
void BinarySegment(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = kernels::ApplyBinary(kKind, a[i * kA], b[i * kB]);
}

// y = a (op) b over OUTER runs of INNER elements. The threads split the
// OUTER * INNER elements evenly (a scalar times a whole tensor is one run:
// split too), each walking its share run by run.
template <kernels::BinaryKind kKind>
void BinaryRun(const float* a, const float* b, float* y, int64_t outer, int64_t inner,
               int64_t a_step, int64_t b_step, const int64_t* ao, const int64_t* bo) {
  const int64_t total = outer * inner;  // the output's elements: within the limit per tensor
  if (total == 0) return;
  const auto segment =
      a_step == 1 ? (b_step == 1 ? &BinarySegment<kKind, 1, 1> : &BinarySegment<kKind, 1, 0>)
                  : (b_step == 1 ? &BinarySegment<kKind, 0, 1> : &BinarySegment<kKind, 0, 0>);
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t begin = total * id / threads, end = total * (id + 1) / threads;
    int64_t o = begin / inner, i = begin % inner;
    for (int64_t left = end - begin; left > 0; ++o, i = 0) {
      const int64_t n = std::min(inner - i, left);
      segment(a + ao[o] + i * a_step, b + bo[o] + i * b_step, y + o * inner + i, n);
      left -= n;
    }
  }
}

}  // namespace

absl::Status BinaryStep::Run(const StepContext& ctx) {
  const Plan& p = PlanFor(ctx.shapes);
  const int64_t outer = static_cast<int64_t>(p.a_offsets.size());
  const float* a = ctx.data[a_];
  const float* b = ctx.data[b_];
  float* y = ctx.data[dst_];
  using K = kernels::BinaryKind;
  if (p.row_broadcast && (kind_ == K::kAdd || kind_ == K::kMul)) {
    // a full, b one row repeated: the dispatched row kernel.
    const kernels::KernelTable& k = kernels::GetKernelTable();
    const auto fn = kind_ == K::kAdd ? k.add_row_broadcast : k.mul_row_broadcast;
#pragma omp parallel
    {
      const int threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t begin = outer * id / threads, end = outer * (id + 1) / threads;
      if (end > begin) fn(a + begin * p.inner, b, y + begin * p.inner, end - begin, p.inner);
    }
    return absl::OkStatus();
  }
  switch (kind_) {
#define NUMASERVE_BINARY_CASE(k)                                                     \
  case K::k:                                                                         \
    BinaryRun<K::k>(a, b, y, outer, p.inner, p.a_step, p.b_step, p.a_offsets.data(), \
                    p.b_offsets.data());                                             \
    break;
    NUMASERVE_BINARY_CASE(kAdd)
    NUMASERVE_BINARY_CASE(kSub)
    NUMASERVE_BINARY_CASE(kMul)
    NUMASERVE_BINARY_CASE(kDiv)
    NUMASERVE_BINARY_CASE(kPow)
    NUMASERVE_BINARY_CASE(kMin)
    NUMASERVE_BINARY_CASE(kMax)
    NUMASERVE_BINARY_CASE(kPRelu)
    NUMASERVE_BINARY_CASE(kMod)
    NUMASERVE_BINARY_CASE(kFmod)
#undef NUMASERVE_BINARY_CASE
  }
  return absl::OkStatus();
}

namespace {

// The logical shape and strides (in elements) of `perm` applied to a
// row-major tensor of `stored` shape; as stored when `perm` is empty.
std::pair<Shape, Shape> PermutedView(const Shape& stored, const std::vector<int64_t>& perm) {
  const Shape strides = kernels::RowMajorStrides(stored);
  if (perm.empty()) return {stored, strides};
  Shape shape(perm.size()), view(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) {
    shape[k] = stored[perm[k]];
    view[k] = strides[perm[k]];
  }
  return {shape, view};
}

// Left-pads a shape/strides pair to `rank` with size-1 dims.
std::pair<Shape, Shape> PadView(std::pair<Shape, Shape> v, size_t rank) {
  while (v.first.size() < rank) {
    const int64_t outer = v.first.empty() ? 1 : v.first[0] * v.second[0];
    v.first.insert(v.first.begin(), 1);
    v.second.insert(v.second.begin(), outer);
  }
  return v;
}

// The product's logical shape and strides when the output stored is
// Transpose(product, dst_perm): product dim dst_perm[k] is stored dim k.
std::pair<Shape, Shape> ProductView(const Shape& stored, const std::vector<int64_t>& dst_perm) {
  const Shape strides = kernels::RowMajorStrides(stored);
  std::pair<Shape, Shape> y{stored, strides};
  for (size_t k = 0; k < dst_perm.size(); ++k) {
    y.first[dst_perm[k]] = stored[k];
    y.second[dst_perm[k]] = strides[k];
  }
  return y;
}

}  // namespace

double BatchedMatMulStep::Flops(const std::vector<Shape>& shapes) const {
  const Shape a = PermutedView(shapes[a_.value], a_.perm).first;
  return a.empty() ? 0.0
                   : 2.0 * static_cast<double>(kernels::NumElements(shapes[dst_])) *
                         static_cast<double>(a.back());
}

std::string BatchedMatMulStep::Implementation(const std::vector<Shape>& shapes) const {
  const PerShape* entry = per_shape_.Peek(std::tie(shapes[a_.value], shapes[b_.value]));
  return entry == nullptr ? "" : entry->impl;
}

absl::Status BatchedMatMulStep::Run(const StepContext& ctx) {
  const Shape& sa = ctx.shapes[a_.value];
  const Shape& sb = ctx.shapes[b_.value];
  PerShape* entry = per_shape_.Find(std::tie(sa, sb));
  if (entry == nullptr) {
    std::pair<Shape, Shape> y = ProductView(ctx.shapes[dst_], dst_perm_);
    const size_t rank = std::max<size_t>(y.first.size(), 2);
    const auto a = PadView(PermutedView(sa, a_.perm), rank);
    const auto b = PadView(PermutedView(sb, b_.perm), rank);
    y = PadView(y, rank);
    auto desc = [](const std::pair<Shape, Shape>& v) {
      return dnnl::memory::desc(kernels::ToDnnlDims(v.first), dnnl::memory::data_type::f32,
                                kernels::ToDnnlDims(v.second));
    };
    PerShape created;
    try {
      dnnl::primitive_attr attr;
      if (alpha_ != 1.0f) {
        dnnl::post_ops ops;
        ops.append_eltwise(dnnl::algorithm::eltwise_linear, alpha_, 0.0f);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd(engine_, desc(a), desc(b), desc(y), attr);
      created.impl = pd.impl_info_str();
      created.call.primitive = dnnl::matmul(pd);
      created.call.args[DNNL_ARG_SRC] = kernels::UnboundMemory(pd.src_desc(), engine_);
      created.call.args[DNNL_ARG_WEIGHTS] = kernels::UnboundMemory(pd.weights_desc(), engine_);
      created.call.args[DNNL_ARG_DST] = kernels::UnboundMemory(pd.dst_desc(), engine_);
    } catch (const dnnl::error& e) {
      return kernels::DnnlErrorToStatus(e, "creating batched matmul");
    }
    entry = &per_shape_.Emplace(std::make_tuple(sa, sb), std::move(created));
  }
  kernels::BoundPrimitive& call = entry->call;
  try {
    call.SetHandle(DNNL_ARG_SRC, ctx.data[a_.value]);
    call.SetHandle(DNNL_ARG_WEIGHTS, ctx.data[b_.value]);
    call.SetHandle(DNNL_ARG_DST, ctx.data[dst_]);
    call.Execute(ctx.stream);
  } catch (const dnnl::error& e) {
    return kernels::DnnlErrorToStatus(e, "executing batched matmul");
  }
  return absl::OkStatus();
}

double AttentionStep::Flops(const std::vector<Shape>& shapes) const {
  // q k: sq x sk x d; probabilities v: sq x dv x sk, per head.
  const Shape q = PermutedView(shapes[q_.value], q_.perm).first;
  const Shape k = PermutedView(shapes[k_.value], k_.perm).first;
  if (q.size() < 2 || k.size() < 2) return 0.0;
  const double out = static_cast<double>(kernels::NumElements(shapes[dst_]));
  const double sk = static_cast<double>(k.back()), d = static_cast<double>(q.back());
  const double dv = static_cast<double>(shapes[dst_].empty() ? 1 : shapes[dst_].back());
  return 2.0 * out * sk + 2.0 * out / dv * sk * d;
}

StepTraits AttentionStep::Traits(const Operand& q, const Operand& k, const Operand& v, ValueId dst,
                                 const std::vector<int64_t>& dst_perm) {
  StepTraits t = StepTraits::ReadsWrites({q.value, k.value, v.value}, {dst});
  // Row b of the output depends on row b of q, k and v alone when the
  // leading dim is a batch dim of every operand as stored (not transposed
  // away, not broadcast from a lower rank).
  for (const std::vector<int64_t>* perm : {&q.perm, &k.perm, &v.perm, &dst_perm}) {
    if (!perm->empty() && (*perm)[0] != 0) return t;
  }
  t.row_wise = {q.value, k.value, v.value, dst};
  return t;
}

int64_t AttentionQueryChunks(int64_t heads, int64_t sq, int threads) {
  if (heads <= 0 || threads <= 1 || heads % threads == 0) return 1;
  const int64_t blocks = std::max<int64_t>(
      1, (sq + kernels::cpu::kAttentionBlockRows - 1) / kernels::cpu::kAttentionBlockRows);
  // The longest thread's work, in heads, for c chunks a head: the fewest
  // chunks that reach the least of it (each chunk packs k again).
  int64_t best = 1;
  double best_span = 0;
  for (int64_t c = 1; c <= blocks; ++c) {
    const int64_t items = heads * c;
    const double span = static_cast<double>((items + threads - 1) / threads) / c;
    if (c == 1 || span < best_span - 1e-9) {
      best = c;
      best_span = span;
    }
  }
  return best;
}

namespace {

// Whether the first `n` (batch) dims of each operand view are 1 or the
// output's.
bool BatchDimsBroadcast(std::initializer_list<const std::pair<Shape, Shape>*> operands,
                        const Shape& out, size_t n) {
  for (size_t d = 0; d < n; ++d) {
    for (const auto* x : operands) {
      if (x->first[d] != 1 && x->first[d] != out[d]) return false;
    }
  }
  return true;
}

}  // namespace

absl::Status AttentionStep::Run(const StepContext& ctx) {
  std::pair<Shape, Shape> y = ProductView(ctx.shapes[dst_], dst_perm_);
  const size_t rank = std::max<size_t>(y.first.size(), 2);
  y = PadView(std::move(y), rank);
  const auto q = PadView(PermutedView(ctx.shapes[q_.value], q_.perm), rank);
  const auto k = PadView(PermutedView(ctx.shapes[k_.value], k_.perm), rank);
  const auto v = PadView(PermutedView(ctx.shapes[v_.value], v_.perm), rank);
  const size_t n = rank - 2;  // batch dims
  if (v.second[n + 1] != 1 || y.second[n + 1] != 1) {
    return absl::InternalError(absl::StrCat(Describe(), ": v and the output need unit strides"));
  }
  kernels::cpu::AttentionHead h;
  h.sq = y.first[n];
  h.dv = y.first[n + 1];
  h.d = q.first[n + 1];
  h.sk = k.first[n + 1];
  if (q.first[n] != h.sq || k.first[n] != h.d || v.first[n] != h.sk || v.first[n + 1] != h.dv) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(), ": operand shapes do not match"));
  }
  if (!BatchDimsBroadcast({&q, &k, &v}, y.first, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(), ": batch dims do not broadcast to the output's"));
  }
  if (h.sk < 1) {
    // No keys: the product with v sums nothing.
    std::fill_n(ctx.data[dst_], kernels::NumElements(ctx.shapes[dst_]), 0.0f);
    return absl::OkStatus();
  }
  h.q_row = q.second[n];
  h.q_col = q.second[n + 1];
  h.k_row = k.second[n + 1];
  h.k_col = k.second[n];
  h.v_row = v.second[n];
  h.out_row = y.second[n];
  h.alpha = alpha_;
  // Per head: the offset of each operand, a batch dim of size 1 broadcast.
  int64_t heads = 1;
  for (size_t d = 0; d < n; ++d) heads *= y.first[d];
  const float* qd = ctx.data[q_.value];
  const float* kd = ctx.data[k_.value];
  const float* vd = ctx.data[v_.value];
  float* yd = ctx.data[dst_];
  const kernels::KernelTable& table = kernels::GetKernelTable();
  // Fewer heads than threads (batch 1 on many cores): each head's queries
  // are split into chunks of whole blocks as well, so every thread works.
  const int64_t chunks = AttentionQueryChunks(heads, h.sq, omp_get_max_threads());
  const int64_t chunk_rows = (h.sq + chunks * kernels::cpu::kAttentionBlockRows - 1) /
                             (chunks * kernels::cpu::kAttentionBlockRows) *
                             kernels::cpu::kAttentionBlockRows;
#pragma omp parallel
  {
    std::vector<float> scratch(kernels::cpu::AttentionScratchFloats(h.sk, h.d));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < heads * chunks; ++item) {
      const int64_t head = item / chunks;
      const int64_t q_begin = (item % chunks) * chunk_rows;
      const int64_t q_end = std::min(h.sq, q_begin + chunk_rows);
      if (q_begin >= q_end) continue;
      kernels::cpu::AttentionHead hh = h;
      hh.sq = q_end - q_begin;
      int64_t rem = head, qo = q_begin * h.q_row, ko = 0, vo = 0, yo = q_begin * h.out_row;
      for (size_t d = n; d-- > 0;) {
        const int64_t i = rem % y.first[d];
        rem /= y.first[d];
        qo += q.first[d] == 1 ? 0 : i * q.second[d];
        ko += k.first[d] == 1 ? 0 : i * k.second[d];
        vo += v.first[d] == 1 ? 0 : i * v.second[d];
        yo += i * y.second[d];
      }
      hh.q = qd + qo;
      hh.k = kd + ko;
      hh.v = vd + vo;
      hh.out = yd + yo;
      table.attention_head(hh, scratch.data());
    }
  }
  return absl::OkStatus();
}

absl::Status LayerNormStep::Run(const StepContext& ctx) {
  const int64_t len = static_cast<int64_t>(scale_.size());
  const int64_t rows = kernels::NumElements(ctx.shapes[dst_]) / len;
  const float* x = ctx.data[src_];
  float* y = ctx.data[dst_];
  const kernels::KernelTable& k = kernels::GetKernelTable();
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t begin = rows * id / threads, end = rows * (id + 1) / threads;
    if (end > begin) {
      k.layer_norm_rows(x + begin * len, scale_.data(), bias_.data(), epsilon_, y + begin * len,
                        end - begin, len);
    }
  }
  return absl::OkStatus();
}

absl::Status TransposeStep::Run(const StepContext& ctx) {
  const Shape& in = ctx.shapes[src_];
  const Shape& out = ctx.shapes[dst_];
  const size_t rank = out.size();
  if (rank == 0) {
    ctx.data[dst_][0] = ctx.data[src_][0];
    return absl::OkStatus();
  }
  const float* x = ctx.data[src_];
  float* y = ctx.data[dst_];
  bool last_two_swapped = rank >= 2 && perm_[rank - 2] == static_cast<int64_t>(rank) - 1 &&
                          perm_[rank - 1] == static_cast<int64_t>(rank) - 2;
  for (size_t d = 0; d + 2 < rank; ++d) last_two_swapped &= perm_[d] == static_cast<int64_t>(d);
  if (last_two_swapped) {
    const int64_t rows = in[rank - 2], cols = in[rank - 1];
    const int64_t batch = rows * cols == 0 ? 0 : kernels::NumElements(in) / (rows * cols);
    const kernels::KernelTable& k = kernels::GetKernelTable();
#pragma omp parallel
    {
      const int threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t begin = batch * id / threads, end = batch * (id + 1) / threads;
      if (end > begin) {
        k.transpose_2d(x + begin * rows * cols, y + begin * rows * cols, end - begin, rows, cols);
      }
    }
    return absl::OkStatus();
  }
  const std::vector<int64_t> in_strides = kernels::RowMajorStrides(in);
  std::vector<int64_t> src_stride(rank);  // input stride for each output dim
  for (size_t d = 0; d < rank; ++d) src_stride[d] = in_strides[perm_[d]];
  const int64_t inner = out[rank - 1], inner_stride = src_stride[rank - 1];
  const int64_t rows = kernels::NumElements(out) / std::max<int64_t>(inner, 1);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, off = 0;
    for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      off += (rem % out[d]) * src_stride[d];
      rem /= out[d];
    }
    const float* xp = x + off;
    float* yp = y + r * inner;
    for (int64_t i = 0; i < inner; ++i) yp[i] = xp[i * inner_stride];
  }
  return absl::OkStatus();
}

absl::Status ReduceRowsStep::Run(const StepContext& ctx) {
  const Shape& in = ctx.shapes[src_];
  int64_t len = 1;
  for (size_t d = static_cast<size_t>(first_axis_); d < in.size(); ++d) len *= in[d];
  const int64_t rows = kernels::NumElements(ctx.shapes[dst_]);
  const float* x = ctx.data[src_];
  float* y = ctx.data[dst_];
  if (len == 0) {  // as the reference: the identity of each reduction
    const float v = kind_ == Kind::kMax   ? -INFINITY
                    : kind_ == Kind::kMin ? INFINITY
                    : kind_ == Kind::kSum ? 0.0f
                                          : NAN;
    std::fill(y, y + rows, v);
    return absl::OkStatus();
  }
  const kernels::cpu::ReduceOp op = kind_ == Kind::kMax   ? kernels::cpu::ReduceOp::kMax
                                    : kind_ == Kind::kMin ? kernels::cpu::ReduceOp::kMin
                                                          : kernels::cpu::ReduceOp::kSum;
  const kernels::KernelTable& k = kernels::GetKernelTable();
  const float inv_len = 1.0f / static_cast<float>(len);
  const bool mean = kind_ == Kind::kMean;
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t begin = rows * id / threads, end = rows * (id + 1) / threads;
    if (end > begin) {
      k.reduce_rows(x + begin * len, y + begin, end - begin, len, op);
      if (mean) {
        for (int64_t r = begin; r < end; ++r) y[r] *= inv_len;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine
