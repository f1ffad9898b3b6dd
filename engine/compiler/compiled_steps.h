// The steps the compiler makes: each wraps one oneDNN-backed or numaserve
// kernel (possibly standing for several fused graph nodes) behind the Step
// interface the runtime runs (engine/runtime/step.h), with its StepTraits
// filled in when it is made.
#pragma once

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/ir/graph.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ops/op_registry.h"
#include "engine/runtime/step.h"
#include "kernels/bounded_cache.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/elementwise_onednn.h"
#include "kernels/onednn/matmul_onednn.h"
#include "kernels/onednn/pool_onednn.h"
#include "kernels/onednn/softmax_onednn.h"
#include "kernels/ref/elementwise_ref.h"

namespace numaserve::engine {

// "numaserve:<kernel> <tier>" for the own kernel `kernel` of the dispatch
// table in use ("numaserve:attention_head avx512").
std::string OwnKernelName(const char* kernel);

// "plain", or the blocked layout's name at rank 4 ("nChw16c" / "nChw8c" by
// the tier, or "nhwc"), at any rank.
inline const char* LayoutName(bool blocked, kernels::BlockedLayout layout) {
  return blocked ? kernels::BlockedLayoutName(layout) : "plain";
}

// The traits of a step reading src and writing dst in either layout
// (plain or blocked) with row i of dst from row i of src alone: pooling,
// and element-wise steps that a split batch runs per slice too.
inline StepTraits BlockedRowWiseTraits(ValueId src, ValueId dst) {
  StepTraits t = StepTraits::ReadsWrites({src}, {dst});
  t.blocked_reads = {src};
  t.blocked_write = dst;
  t.row_wise = {src, dst};
  return t;
}

// The traits of a reference step running graph node `node_index` as a
// whole: its inputs and outputs, each input looked up as a constant first
// at every Run (so a shape value is read as the signature's constant).
inline StepTraits NodeTraits(const Graph& graph, int node_index) {
  const Node& node = graph.nodes()[node_index];
  StepTraits t = StepTraits::ReadsWrites(node.inputs, node.outputs);
  t.reads_shape_values = true;
  return t;
}

// Gemm / MatMul with constant weights on one GEMM backend (kernels/gemm),
// with bias, Gemm's beta*C or a residual (copied into the output, then
// summed), and Relu or erf-GELU folded in. `backend_note` follows the nodes
// in Describe ("blis", "auto: onednn 16+105us, ... -> onednn"); empty for
// the default (oneDNN).
class MatMulStep final : public Step {
 public:
  MatMulStep(std::unique_ptr<kernels::GemmKernel> kernel, ValueId src, ValueId dst,
             ValueId accumulate_from, std::string name, std::string backend_note = "")
      : Step(Traits(*kernel, src, dst, accumulate_from)),
        kernel_(std::move(kernel)),
        src_(src),
        dst_(dst),
        accumulate_from_(accumulate_from),
        name_(std::move(name)),
        backend_note_(std::move(backend_note)) {}
  absl::Status Prepare(const std::vector<Shape>& shapes) override;
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override {
    return "matmul: " + name_ + (backend_note_.empty() ? "" : " [" + backend_note_ + "]");
  }
  double Flops(const std::vector<Shape>& shapes) const override;
  std::string Implementation(const std::vector<Shape>& shapes) const override;
  const kernels::GemmKernel& kernel() const { return *kernel_; }

 private:
  // Reads src and the residual (accumulate_from, copied into dst first),
  // row-wise in both; the kernel's weights, bias and arithmetic.
  static StepTraits Traits(const kernels::GemmKernel& kernel, ValueId src, ValueId dst,
                           ValueId accumulate_from);

  std::unique_ptr<kernels::GemmKernel> kernel_;
  ValueId src_, dst_, accumulate_from_;
  std::string name_;
  std::string backend_note_;
};

class AddStep final : public Step {
 public:
  AddStep(const dnnl::engine& engine, ValueId a, ValueId b, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({a, b}, {dst})),
        kernel_(engine),
        a_(a),
        b_(b),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "add: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return kernel_.ImplementationName(shapes[a_], shapes[b_]);
  }
  size_t CachedShapes() const override { return kernel_.cached_shapes(); }

 private:
  kernels::AddOnednn kernel_;
  ValueId a_, b_, dst_;
  std::string name_;
};

class ReluStep final : public Step {
 public:
  ReluStep(const dnnl::engine& engine, ValueId src, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({src}, {dst})),
        kernel_(engine),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "relu: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return kernel_.ImplementationName(kernels::NumElements(shapes[src_]));
  }
  size_t CachedShapes() const override { return kernel_.cached_shapes(); }

 private:
  kernels::ReluOnednn kernel_;
  ValueId src_, dst_;
  std::string name_;
};

class SoftmaxStep final : public Step {
 public:
  SoftmaxStep(const dnnl::engine& engine, int64_t axis, bool flatten_to_2d, ValueId src,
              ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({src}, {dst})),
        kernel_(engine, axis, flatten_to_2d),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "softmax: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return kernel_.ImplementationName(shapes[src_]);
  }
  size_t CachedShapes() const override { return kernel_.cached_shapes(); }

 private:
  kernels::SoftmaxOnednn kernel_;
  ValueId src_, dst_;
  std::string name_;
};

// Conv with folded BatchNormalization, bias, residual sum and activation
// post-ops. The residual (sum_from) is copied into dst before the conv.
class ConvStep final : public Step {
 public:
  ConvStep(std::unique_ptr<kernels::ConvOnednn> kernel, ValueId src, ValueId dst, ValueId sum_from,
           std::string name)
      : Step(Traits(kernel->options(), src, dst, sum_from)),
        kernel_(std::move(kernel)),
        src_(src),
        dst_(dst),
        sum_from_(sum_from),
        name_(std::move(name)) {}
  void SetEngine(const dnnl::engine& engine) {
    reorder_ = std::make_unique<kernels::ActivationReorder>(engine, layout());
  }
  absl::Status Prepare(const std::vector<Shape>& shapes) override {
    return kernel_->Prepare(shapes[src_], shapes[dst_], src_blocked_, dst_blocked_);
  }
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "conv: " + name_; }
  void SetLayouts(const std::vector<bool>& blocked) override {
    src_blocked_ = blocked[src_];
    dst_blocked_ = blocked[dst_];
    sum_blocked_ = sum_from_ != kNoValue && blocked[sum_from_];
  }
  double Flops(const std::vector<Shape>& shapes) const override;
  std::string Layouts() const override {
    return std::string(LayoutName(src_blocked_, layout())) + "->" +
           LayoutName(dst_blocked_, layout());
  }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return kernel_->ImplementationName(shapes[src_]);
  }
  // The residual's layout -> dst's ("plain->plain" is a copy).
  std::string ResidualLayouts() const override {
    return std::string(LayoutName(sum_blocked_, layout())) + "->" +
           LayoutName(dst_blocked_, layout());
  }
  size_t CachedShapes() const override {
    return kernel_->cached_shapes() + (reorder_ ? reorder_->cached_shapes() : 0);
  }

 private:
  // Reads src and the residual (sum_from, copied into dst first), both
  // blocked where the conv's layout allows, row-wise in both; writes dst
  // blocked. The weights, bias and arithmetic of the kernel's options.
  static StepTraits Traits(const kernels::ConvOnednnOptions& o, ValueId src, ValueId dst,
                           ValueId sum_from);
  kernels::BlockedLayout layout() const { return kernel_->options().blocked_layout; }

  std::unique_ptr<kernels::ConvOnednn> kernel_;
  ValueId src_, dst_, sum_from_;
  bool src_blocked_ = false, dst_blocked_ = false, sum_blocked_ = false;
  std::unique_ptr<kernels::ActivationReorder> reorder_;  // residual into dst
  std::string name_;
};

class PoolStep final : public Step {
 public:
  PoolStep(kernels::PoolOnednn kernel, ValueId src, ValueId dst, std::string name)
      : Step(BlockedRowWiseTraits(src, dst)),
        kernel_(std::move(kernel)),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override {
    return kernel_.Execute(ctx.stream, ctx.shapes[src_], ctx.shapes[dst_], ctx.data[src_],
                           ctx.data[dst_], src_blocked_, dst_blocked_);
  }
  std::string Describe() const override { return "pool: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return kernel_.ImplementationName(shapes[src_]);
  }
  void SetLayouts(const std::vector<bool>& blocked) override {
    src_blocked_ = blocked[src_];
    dst_blocked_ = blocked[dst_];
  }
  std::string Layouts() const override {
    return std::string(LayoutName(src_blocked_, kernel_.layout())) + "->" +
           LayoutName(dst_blocked_, kernel_.layout());
  }
  size_t CachedShapes() const override { return kernel_.cached_shapes(); }

 private:
  kernels::PoolOnednn kernel_;
  ValueId src_, dst_;
  bool src_blocked_ = false, dst_blocked_ = false;
  std::string name_;
};

// Unary element-wise op, OpenMP-parallel over elements.
class UnaryStep final : public Step {
 public:
  UnaryStep(kernels::UnaryParams params, ValueId src, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({src}, {dst})),
        params_(params),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "unary: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return "numaserve:loop";
  }

 private:
  kernels::UnaryParams params_;
  ValueId src_, dst_;
  std::string name_;
};

// QuantizeLinear followed by DequantizeLinear with the same scalar scale
// and zero point, FP32 in and out (the quantized tensor is never kept):
//   y = (clamp(round_half_even(x / scale) + zero_point, lo, hi) - zero_point) * scale
// with [lo, hi] the range of the quantized type (0..255 for UINT8, -128..127
// for INT8). OpenMP-parallel over elements, in either layout (a blocked
// tensor's channel padding holds zeros, which stay zeros); where src and
// dst layouts differ, src is reordered into dst first.
class FakeQuantStep final : public Step {
 public:
  FakeQuantStep(const dnnl::engine& engine, kernels::BlockedLayout layout, float scale,
                int32_t zero_point, int32_t lo, int32_t hi, ValueId src, ValueId dst,
                std::string name)
      : Step(BlockedRowWiseTraits(src, dst)),
        reorder_(engine, layout),
        layout_(layout),
        scale_(scale),
        zero_point_(zero_point),
        lo_(lo),
        hi_(hi),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "fake-quantize: " + name_; }
  void SetLayouts(const std::vector<bool>& blocked) override {
    src_blocked_ = blocked[src_];
    dst_blocked_ = blocked[dst_];
  }
  std::string Layouts() const override {
    return std::string(LayoutName(src_blocked_, layout_)) + "->" +
           LayoutName(dst_blocked_, layout_);
  }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return "numaserve:loop";
  }
  size_t CachedShapes() const override { return reorder_.cached_shapes(); }

 private:
  kernels::ActivationReorder reorder_;
  kernels::BlockedLayout layout_;
  float scale_;
  int32_t zero_point_, lo_, hi_;
  ValueId src_, dst_;
  bool src_blocked_ = false, dst_blocked_ = false;
  std::string name_;
};

// Binary element-wise op with numpy broadcasting, OpenMP-parallel; the
// broadcast offsets are computed once per shape pair (the
// kernels::kShapeCacheCapacity most recently run pairs kept).
class BinaryStep final : public Step {
 public:
  BinaryStep(kernels::BinaryKind kind, ValueId a, ValueId b, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({a, b}, {dst})),
        kind_(kind),
        a_(a),
        b_(b),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Prepare(const std::vector<Shape>& shapes) override;
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "binary: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override;
  size_t CachedShapes() const override { return plans_.size(); }

 private:
  struct Plan {
    // Inner run: the trailing elements over which both operands advance
    // contiguously (stride 1) or one stays put (stride 0).
    int64_t inner = 1;
    int64_t a_step = 1, b_step = 1;
    std::vector<int64_t> a_offsets, b_offsets;  // per outer index
    bool row_broadcast = false;                 // a contiguous, b one row of `inner` reused
  };
  // The plan for these shapes, made if absent; valid until the next one is
  // made.
  const Plan& PlanFor(const std::vector<Shape>& shapes);

  kernels::BinaryKind kind_;
  ValueId a_, b_, dst_;
  std::string name_;
  // By a's shape and b's (looked up through std::tie).
  kernels::BoundedCache<std::tuple<Shape, Shape>, Plan> plans_{kernels::kShapeCacheCapacity};
};

// MatMul of two runtime operands (attention scores and context) on oneDNN,
// batch dims broadcast; one primitive per shape pair (the
// kernels::kShapeCacheCapacity most recently run pairs kept). A Transpose feeding
// an operand, or reading the product, is absorbed as strides: an operand
// (or the output) is then a permutation of the tensor stored (`perm`, as
// ONNX Transpose's: logical dim k is stored dim perm[k]; empty: as stored),
// so the attention heads' [B,S,H,D] <-> [B,H,S,D] copies disappear. A
// scalar Mul/Div of the product (the 1/sqrt(d) scale) is `alpha`, applied
// as an eltwise_linear post-op.
class BatchedMatMulStep final : public Step {
 public:
  struct Operand {
    ValueId value = kNoValue;   // the tensor stored
    std::vector<int64_t> perm;  // empty: read as stored
  };
  BatchedMatMulStep(const dnnl::engine& engine, ValueId a, ValueId b, ValueId dst, std::string name)
      : BatchedMatMulStep(engine, {a, {}}, {b, {}}, dst, {}, 1.0f, std::move(name)) {}
  // dst_perm: the output stored is Transpose(product, dst_perm).
  BatchedMatMulStep(const dnnl::engine& engine, Operand a, Operand b, ValueId dst,
                    std::vector<int64_t> dst_perm, float alpha, std::string name)
      : Step(StepTraits::ReadsWrites({a.value, b.value}, {dst})),
        engine_(engine),
        a_(std::move(a)),
        b_(std::move(b)),
        dst_(dst),
        dst_perm_(std::move(dst_perm)),
        alpha_(alpha),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "batched_matmul: " + name_; }
  double Flops(const std::vector<Shape>& shapes) const override;
  std::string Implementation(const std::vector<Shape>& shapes) const override;
  size_t CachedShapes() const override { return per_shape_.size(); }

 private:
  struct PerShape {
    kernels::BoundPrimitive call;
    std::string impl;  // oneDNN's implementation
  };

  dnnl::engine engine_;
  Operand a_, b_;
  ValueId dst_;
  std::vector<int64_t> dst_perm_;
  float alpha_;
  std::string name_;
  // By a's stored shape and b's (looked up through std::tie).
  kernels::BoundedCache<std::tuple<Shape, Shape>, PerShape> per_shape_{
      kernels::kShapeCacheCapacity};
};

// Into how many chunks of whole query blocks AttentionStep splits each of
// `heads` heads of `sq` queries for `threads` threads: the fewest that give
// the shortest longest-thread's work (1 where the heads alone share out
// evenly; BERT-base at batch 1, 12 heads on 16 threads: 4).
int64_t AttentionQueryChunks(int64_t heads, int64_t sq, int threads);

// Scaled dot-product attention, fused: MatMul(q, k) [then Mul/Div by a
// scalar, `alpha`] -> Softmax over the last axis -> MatMul(., v) [->
// Transpose, `dst_perm`], on the own attention_head kernel
// (kernels/cpu/attention.h), OpenMP-parallel over the heads (the product's
// leading dims, broadcast where an operand's is 1) and, where there are
// fewer heads than threads, over chunks of each head's queries. The scores stay in the
// kernel's scratch; the operands are read through the transposes before
// them as in BatchedMatMulStep. v and the output must have unit stride on
// their last logical axis (CompiledModel checks before fusing).
class AttentionStep final : public Step {
 public:
  using Operand = BatchedMatMulStep::Operand;
  AttentionStep(Operand q, Operand k, Operand v, ValueId dst, std::vector<int64_t> dst_perm,
                float alpha, std::string name)
      : Step(Traits(q, k, v, dst, dst_perm)),
        q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        dst_(dst),
        dst_perm_(std::move(dst_perm)),
        alpha_(alpha),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "attention: " + name_; }
  double Flops(const std::vector<Shape>& shapes) const override;
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return OwnKernelName("attention_head");
  }

 private:
  // Reads q, k and v; row-wise when the leading dim is a batch dim of
  // every operand as stored.
  static StepTraits Traits(const Operand& q, const Operand& k, const Operand& v, ValueId dst,
                           const std::vector<int64_t>& dst_perm);

  Operand q_, k_, v_;
  ValueId dst_;
  std::vector<int64_t> dst_perm_;
  float alpha_;
  std::string name_;
};

// LayerNormalization over the last axis with constant scale/bias,
// OpenMP-parallel over rows.
class LayerNormStep final : public Step {
 public:
  LayerNormStep(std::vector<float> scale, std::vector<float> bias, float epsilon, ValueId src,
                ValueId dst, std::string name)
      : Step(Traits(src, dst, scale.size() + bias.size())),
        scale_(std::move(scale)),
        bias_(std::move(bias)),
        epsilon_(epsilon),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "layer_norm: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return OwnKernelName("layer_norm_rows");
  }

 private:
  // Row-wise; holds `parameters` floats of scale and bias.
  static StepTraits Traits(ValueId src, ValueId dst, size_t parameters) {
    StepTraits t = StepTraits::ReadsWrites({src}, {dst});
    t.row_wise = {src, dst};
    t.parameter_bytes = static_cast<int64_t>(parameters * sizeof(float));
    return t;
  }

  std::vector<float> scale_, bias_;
  float epsilon_;
  ValueId src_, dst_;
  std::string name_;
};

// Transpose as a strided copy, OpenMP-parallel over output rows; a
// batched swap of the last two axes (perm = [0 .. k-1, k+1, k]) runs on
// the own tiled transpose_2d kernel, parallel over the matrices.
class TransposeStep final : public Step {
 public:
  TransposeStep(std::vector<int64_t> perm, ValueId src, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({src}, {dst})),
        perm_(std::move(perm)),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "transpose: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override;

 private:
  std::vector<int64_t> perm_;
  ValueId src_, dst_;
  std::string name_;
};

// ReduceSum/Mean/Max/Min over trailing axes (contiguous in memory) on the
// own reduce_rows kernel, OpenMP-parallel over the kept elements; the
// reduced axes are [first_axis, rank). keepdims only changes the output
// shape, which shape propagation already gives.
class ReduceRowsStep final : public Step {
 public:
  enum class Kind { kSum, kMean, kMax, kMin };
  ReduceRowsStep(Kind kind, int64_t first_axis, ValueId src, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites({src}, {dst})),
        kind_(kind),
        first_axis_(first_axis),
        src_(src),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "reduce_rows: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return OwnKernelName("reduce_rows");
  }

 private:
  Kind kind_;
  int64_t first_axis_;
  ValueId src_, dst_;
  std::string name_;
};

// Any registered op on its scalar reference: inputs are copied into
// tensors, outputs copied back. The fallback for ops without a fast path.
class ReferenceStep final : public Step {
 public:
  ReferenceStep(const Graph* graph, int node_index)
      : Step(NodeTraits(*graph, node_index)),
        graph_(graph),
        node_index_(node_index),
        schema_(FindOpSchema(graph->nodes()[node_index].op_type)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override {
    return "reference: " + graph_->nodes()[node_index_].name;
  }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return "numaserve:reference " + graph_->nodes()[node_index_].op_type;
  }

 private:
  const Graph* graph_;
  int node_index_;
  const OpSchema* schema_;
  std::vector<kernels::Tensor> inputs_;  // reused buffers
};

// A node that reads or writes a value of a type other than FP32, on its
// op's typed reference: inputs are read in place (typed views of the
// buffers and constants, a shape value of the signature run as its
// constant), outputs copied back by their byte size. ctx.data holds every
// value's bytes whatever its type.
class TypedReferenceStep final : public Step {
 public:
  // Fails when a constant input has no readable data.
  static absl::StatusOr<std::unique_ptr<TypedReferenceStep>> Create(const Graph* graph,
                                                                    int node_index);
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override {
    return "typed_reference: " + graph_->nodes()[node_index_].name;
  }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return "numaserve:typed_reference " + graph_->nodes()[node_index_].op_type;
  }

 private:
  TypedReferenceStep(const Graph* graph, int node_index)
      : Step(NodeTraits(*graph, node_index)), graph_(graph), node_index_(node_index) {}
  const Graph* graph_;
  int node_index_;
  std::vector<std::optional<TypedTensor>> constants_;  // by input index
  std::vector<TypedTensor> inputs_;                    // views, per Run
};

}  // namespace numaserve::engine
