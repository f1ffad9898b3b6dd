#include "kernels/onednn/training_onednn.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels::training_onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using md = dnnl::memory::desc;
using kernels::DnnlErrorToStatus;

const dnnl::engine& Engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

md Plain(const dnnl::memory::dims& dims) {
  const tag t = dims.size() == 1 ? tag::a : dims.size() == 4 ? tag::abcd : tag::abcde;
  return md(dims, dt::f32, t);
}

// Moves one tensor between the plain layout of the ops' interface and the
// layout a primitive works in. When the two agree, the caller's buffer is
// used as it is; otherwise a reorder goes through a scratch buffer owned
// here. With `accumulate`, output transfers add into the caller's buffer.
class Relayout {
 public:
  Relayout() = default;
  Relayout(const md& plain, const md& inner, bool accumulate) {
    direct_ = plain == inner && !accumulate;
    user_ = kernels::UnboundMemory(plain, Engine());
    if (direct_) return;
    inner_ = dnnl::memory(inner, Engine());
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    to_inner_ = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), plain, Engine(), inner));
    to_user_ = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), inner, Engine(), plain, attr));
  }

  // An input: a memory in the inner layout holding the plain data at `src`.
  dnnl::memory In(const float* src) {
    user_.set_data_handle(const_cast<float*>(src));
    if (direct_) return user_;
    to_inner_.execute(Stream(), user_, inner_);
    return inner_;
  }

  // An output: the memory the primitive writes; Finish moves it to `dst`.
  dnnl::memory Out(float* dst) {
    user_.set_data_handle(dst);
    return direct_ ? user_ : inner_;
  }
  // Where In() last put the data (the caller's buffer or the scratch).
  const dnnl::memory& inner() const { return direct_ ? user_ : inner_; }

  void Finish() {
    if (direct_) return;
    to_user_.execute(Stream(), inner_, user_);
  }

 private:
  bool direct_ = true;
  dnnl::memory user_, inner_;
  dnnl::reorder to_inner_, to_user_;
};

dnnl::memory::dims Pair(int64_t a, int64_t b) { return {a, b}; }

std::vector<int64_t> WindowKey(const Window2d& w) {
  return {w.n,  w.c,  w.h,  w.w,  w.kh, w.kw, w.sh, w.sw,
          w.pt, w.pl, w.pb, w.pr, w.dh, w.dw, w.oh, w.ow};
}

// An error while executing: never a reason to fall back to the reference,
// which would add to gradients a second time.
absl::Status ExecutionError(const dnnl::error& e, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": oneDNN error ", static_cast<int>(e.status), ": ", e.what()));
}

// --- Conv ---------------------------------------------------------------------
// One Conv node's primitives for one geometry and what its last training
// forward leaves for backward: the input in the primitive's layout.
struct ConvEntry {
  md src, weights, bias, dst;          // plain
  const float* forward_src = nullptr;  // fwd_src holds it (null: nothing kept)
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  Relayout fwd_src, fwd_weights, fwd_bias, fwd_dst;
  // Made at the first backward.
  bool backward_ready = false;
  dnnl::convolution_backward_data bwd_data;
  Relayout bd_weights, bd_dst, bd_src;
  dnnl::convolution_backward_weights bwd_weights;
  Relayout bw_src, bw_dst, bw_weights, bw_bias;
  bool bw_src_as_forward = false;  // bwd_weights reads src in the forward's layout
  bool bd_dst_as_bw = false;       // both backward primitives read dy in one layout
  dnnl::memory::dims strides, dilates, pad_l, pad_r;
};

std::vector<int64_t> ConvKey(const ConvShape& s) {
  std::vector<int64_t> key = WindowKey(s.win);
  key.insert(key.end(), {s.m, s.groups, s.bias, s.bf16});
  return key;
}

std::atomic<int64_t> bf16_conv_primitives{0};
std::atomic<int64_t> bf16_conv_fp32_instead{0};

// Makes a primitive descriptor through `make(data type)` in BF16 when
// `bf16` and oneDNN has more than its reference kernel for it, else in
// FP32 (the reference BF16 kernels are far slower than FP32's).
template <typename Pd, typename Make>
Pd MixedPrecision(bool bf16, Make make) {
  if (bf16) {
    try {
      Pd pd = make(dt::bf16);
      if (!kernels::IsReferenceImplementation(pd.impl_info_str())) {
        bf16_conv_primitives.fetch_add(1, std::memory_order_relaxed);
        return pd;
      }
    } catch (const dnnl::error&) {
      // No BF16 implementation at all: FP32 below.
    }
    bf16_conv_fp32_instead.fetch_add(1, std::memory_order_relaxed);
  }
  return make(dt::f32);
}

absl::StatusOr<ConvEntry*> GetConv(const void* node, const ConvShape& s) {
  thread_local std::map<std::tuple<const void*, std::vector<int64_t>>, std::unique_ptr<ConvEntry>>
      cache;
  std::tuple<const void*, std::vector<int64_t>> key(node, ConvKey(s));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  const Window2d& w = s.win;
  auto e = std::make_unique<ConvEntry>();
  try {
    e->src = Plain({w.n, w.c, w.h, w.w});
    e->dst = Plain({w.n, s.m, w.oh, w.ow});
    e->weights = s.groups > 1 ? Plain({s.groups, s.m / s.groups, w.c / s.groups, w.kh, w.kw})
                              : Plain({s.m, w.c, w.kh, w.kw});
    if (s.bias) e->bias = Plain({s.m});
    e->strides = Pair(w.sh, w.sw);
    e->dilates = Pair(w.dh - 1, w.dw - 1);
    e->pad_l = Pair(w.pt, w.pl);
    e->pad_r = Pair(w.pb, w.pr);
    // src and weights in the compute type; dst (and bias) always FP32.
    const md any_dst(e->dst.get_dims(), dt::f32, tag::any);
    e->fwd_pd = MixedPrecision<dnnl::convolution_forward::primitive_desc>(s.bf16, [&](dt type) {
      return dnnl::convolution_forward::primitive_desc(
          Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
          md(e->src.get_dims(), type, tag::any), md(e->weights.get_dims(), type, tag::any), e->bias,
          any_dst, e->strides, e->dilates, e->pad_l, e->pad_r);
    });
    e->fwd = dnnl::convolution_forward(e->fwd_pd);
    e->fwd_src = Relayout(e->src, e->fwd_pd.src_desc(), false);
    e->fwd_weights = Relayout(e->weights, e->fwd_pd.weights_desc(), false);
    if (s.bias) e->fwd_bias = Relayout(e->bias, e->fwd_pd.bias_desc(), false);
    e->fwd_dst = Relayout(e->dst, e->fwd_pd.dst_desc(), false);
  } catch (const dnnl::error& error) {
    return DnnlErrorToStatus(error, "creating a training convolution");
  }
  return cache.emplace(std::move(key), std::move(e)).first->second.get();
}

void PrepareConvBackward(ConvEntry& e, const ConvShape& s) {
  // Gradients are written in FP32; the operands read (weights and dy for
  // dx, x and dy for dw) in the compute type.
  const md any_src(e.src.get_dims(), dt::f32, tag::any);
  const md any_weights(e.weights.get_dims(), dt::f32, tag::any);
  const auto bd_pd =
      MixedPrecision<dnnl::convolution_backward_data::primitive_desc>(s.bf16, [&](dt type) {
        return dnnl::convolution_backward_data::primitive_desc(
            Engine(), dnnl::algorithm::convolution_direct, any_src,
            md(e.weights.get_dims(), type, tag::any), md(e.dst.get_dims(), type, tag::any),
            e.strides, e.dilates, e.pad_l, e.pad_r, e.fwd_pd);
      });
  e.bwd_data = dnnl::convolution_backward_data(bd_pd);
  e.bd_weights = Relayout(e.weights, bd_pd.weights_desc(), false);
  e.bd_dst = Relayout(e.dst, bd_pd.diff_dst_desc(), false);
  e.bd_src = Relayout(e.src, bd_pd.diff_src_desc(), true);
  const md any_bias = s.bias ? md(e.bias.get_dims(), dt::f32, tag::any) : md();
  const auto bw_pd =
      MixedPrecision<dnnl::convolution_backward_weights::primitive_desc>(s.bf16, [&](dt type) {
        return dnnl::convolution_backward_weights::primitive_desc(
            Engine(), dnnl::algorithm::convolution_direct, md(e.src.get_dims(), type, tag::any),
            any_weights, any_bias, md(e.dst.get_dims(), type, tag::any), e.strides, e.dilates,
            e.pad_l, e.pad_r, e.fwd_pd);
      });
  e.bwd_weights = dnnl::convolution_backward_weights(bw_pd);
  e.bw_src = Relayout(e.src, bw_pd.src_desc(), false);
  e.bw_dst = Relayout(e.dst, bw_pd.diff_dst_desc(), false);
  e.bw_weights = Relayout(e.weights, bw_pd.diff_weights_desc(), true);
  if (s.bias) e.bw_bias = Relayout(e.bias, bw_pd.diff_bias_desc(), true);
  e.bw_src_as_forward = bw_pd.src_desc() == e.fwd_pd.src_desc();
  e.bd_dst_as_bw = bd_pd.diff_dst_desc() == bw_pd.diff_dst_desc();
  e.backward_ready = true;
}

// --- pooling ------------------------------------------------------------------
struct PoolEntry {
  md src, dst;  // plain
  dnnl::memory::dims strides, kernel, dilation, pad_l, pad_r;
  dnnl::algorithm algorithm;
  dnnl::pooling_forward::primitive_desc train_pd;
  dnnl::pooling_forward train, infer;
  // Made at the first backward (evaluation-only geometries never need it).
  bool backward_ready = false;
  dnnl::pooling_backward bwd;
  Relayout bwd_src;  // diff_src, accumulated into the caller's gradient
  dnnl::memory src_mem, dst_mem, diff_dst_mem;
};

// The max-pooling workspace of one node's last training forward, valid for
// the input and output buffers it was computed from.
struct PoolWorkspace {
  dnnl::memory memory;
  const float* x = nullptr;
  const float* y = nullptr;
};

dnnl::algorithm PoolAlgorithm(PoolKind kind) {
  switch (kind) {
    case PoolKind::kMax:
      return dnnl::algorithm::pooling_max;
    case PoolKind::kAverageIncludePad:
      return dnnl::algorithm::pooling_avg_include_padding;
    case PoolKind::kAverageExcludePad:
      break;
  }
  return dnnl::algorithm::pooling_avg_exclude_padding;
}

std::vector<int64_t> PoolKey(PoolKind kind, const Window2d& w) {
  std::vector<int64_t> key = WindowKey(w);
  key.push_back(static_cast<int64_t>(kind));
  return key;
}

absl::StatusOr<PoolEntry*> GetPool(PoolKind kind, const Window2d& w) {
  thread_local std::map<std::vector<int64_t>, std::unique_ptr<PoolEntry>> cache;
  std::vector<int64_t> key = PoolKey(kind, w);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  auto e = std::make_unique<PoolEntry>();
  try {
    e->src = Plain({w.n, w.c, w.h, w.w});
    e->dst = Plain({w.n, w.c, w.oh, w.ow});
    e->strides = Pair(w.sh, w.sw);
    e->kernel = Pair(w.kh, w.kw);
    e->dilation = Pair(w.dh - 1, w.dw - 1);
    e->pad_l = Pair(w.pt, w.pl);
    e->pad_r = Pair(w.pb, w.pr);
    e->algorithm = PoolAlgorithm(kind);
    e->train_pd = dnnl::pooling_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_training,
                                                        e->algorithm, e->src, e->dst, e->strides,
                                                        e->kernel, e->dilation, e->pad_l, e->pad_r);
    e->train = dnnl::pooling_forward(e->train_pd);
    e->infer = dnnl::pooling_forward(dnnl::pooling_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_inference, e->algorithm, e->src, e->dst, e->strides,
        e->kernel, e->dilation, e->pad_l, e->pad_r));
    e->src_mem = kernels::UnboundMemory(e->src, Engine());
    e->dst_mem = kernels::UnboundMemory(e->dst, Engine());
    e->diff_dst_mem = kernels::UnboundMemory(e->dst, Engine());
  } catch (const dnnl::error& error) {
    return DnnlErrorToStatus(error, "creating a training pooling");
  }
  return cache.emplace(std::move(key), std::move(e)).first->second.get();
}

void PreparePoolBackward(PoolEntry& e) {
  dnnl::pooling_backward::primitive_desc bwd_pd(Engine(), e.algorithm, e.src, e.dst, e.strides,
                                                e.kernel, e.dilation, e.pad_l, e.pad_r, e.train_pd);
  e.bwd = dnnl::pooling_backward(bwd_pd);
  e.bwd_src = Relayout(e.src, bwd_pd.diff_src_desc(), true);
  e.backward_ready = true;
}

PoolWorkspace& Workspace(const void* node, PoolKind kind, const Window2d& w) {
  thread_local std::map<std::tuple<const void*, std::vector<int64_t>>, PoolWorkspace> workspaces;
  return workspaces[{node, PoolKey(kind, w)}];
}

// --- batch normalization -------------------------------------------------------
// One BatchNormalization node's primitives for one shape and what its last
// training forward leaves for backward: the input in the primitives' layout
// and the batch statistics. With 16 or more channels the primitives work
// on channel blocks of 16 (oneDNN's vectorized kernels; plain NCHW only has
// its scalar one), with reorders from and to NCHW.
struct BatchNormEntry {
  md plain, data, stats;  // [n, c, spatial, 1] plain and in the primitives' layout; [c]
  dnnl::batch_normalization_forward::primitive_desc train_pd;
  dnnl::batch_normalization_forward train, infer;
  Relayout fwd_src, fwd_dst;
  dnnl::memory scale, shift, mean, variance;  // point at the caller's buffers
  const float* forward_src = nullptr;         // fwd_src and kept_* are this x's (null: none)
  std::vector<float> kept_mean, kept_variance;
  // Made at the first backward.
  bool backward_ready = false;
  dnnl::batch_normalization_backward bwd;
  Relayout bwd_dst, bwd_src;  // dy in; dx out, added to the caller's buffer
  dnnl::memory diff_scale, diff_shift;
  std::vector<float> scratch_y, scratch_dscale, scratch_dshift;
};

dnnl::normalization_flags ScaleShift() {
  return dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
}

absl::StatusOr<BatchNormEntry*> GetBatchNorm(const void* node, const BatchNormShape& s) {
  thread_local std::map<std::tuple<const void*, std::vector<int64_t>>,
                        std::unique_ptr<BatchNormEntry>>
      cache;
  int32_t eps_bits;
  static_assert(sizeof(eps_bits) == sizeof(s.epsilon));
  std::memcpy(&eps_bits, &s.epsilon, sizeof(eps_bits));
  std::tuple<const void*, std::vector<int64_t>> key(node, {s.n, s.c, s.spatial, eps_bits});
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  auto e = std::make_unique<BatchNormEntry>();
  try {
    e->plain = Plain({s.n, s.c, s.spatial, 1});
    // Channel-blocked by the tier's block (oneDNN's optimized batch norm
    // kernels take only their own tier's block).
    const int block = kernels::ActivationChannelBlock();
    e->data = s.c >= block
                  ? md(e->plain.get_dims(), dt::f32, block == 16 ? tag::aBcd16b : tag::aBcd8b)
                  : e->plain;
    e->stats = Plain({s.c});
    e->train_pd = dnnl::batch_normalization_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_training, e->data, e->data, s.epsilon, ScaleShift());
    e->train = dnnl::batch_normalization_forward(e->train_pd);
    e->infer = dnnl::batch_normalization_forward(dnnl::batch_normalization_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_inference, e->data, e->data, s.epsilon,
        ScaleShift() | dnnl::normalization_flags::use_global_stats));
    e->fwd_src = Relayout(e->plain, e->data, false);
    e->fwd_dst = Relayout(e->plain, e->data, false);
    e->scale = kernels::UnboundMemory(e->stats, Engine());
    e->shift = kernels::UnboundMemory(e->stats, Engine());
    e->mean = kernels::UnboundMemory(e->stats, Engine());
    e->variance = kernels::UnboundMemory(e->stats, Engine());
  } catch (const dnnl::error& error) {
    return DnnlErrorToStatus(error, "creating a training batch normalization");
  }
  e->kept_mean.resize(s.c);
  e->kept_variance.resize(s.c);
  return cache.emplace(std::move(key), std::move(e)).first->second.get();
}

void PrepareBatchNormBackward(BatchNormEntry& e, const BatchNormShape& s) {
  e.bwd = dnnl::batch_normalization_backward(dnnl::batch_normalization_backward::primitive_desc(
      Engine(), dnnl::prop_kind::backward, e.data, e.data, e.data, s.epsilon, ScaleShift(),
      e.train_pd));
  e.bwd_dst = Relayout(e.plain, e.data, false);
  e.bwd_src = Relayout(e.plain, e.data, true);
  e.scratch_dscale.resize(s.c);
  e.scratch_dshift.resize(s.c);
  e.diff_scale = dnnl::memory(e.stats, Engine(), e.scratch_dscale.data());
  e.diff_shift = dnnl::memory(e.stats, Engine(), e.scratch_dshift.data());
  e.backward_ready = true;
}

void AddInto(const std::vector<float>& from, float* to) {
  const int64_t size = static_cast<int64_t>(from.size());
#pragma omp parallel for if (size > (1 << 16))
  for (int64_t i = 0; i < size; ++i) to[i] += from[i];
}

// --- layer normalization -------------------------------------------------------
// One LayerNormalization node's primitives for one shape and the row
// statistics its last training forward computed (for backward).
struct LayerNormEntry {
  md data, stats, weights;  // plain [rows, inner], [rows] and [inner]
  dnnl::normalization_flags flags;
  dnnl::layer_normalization_forward::primitive_desc train_pd;
  dnnl::layer_normalization_forward train;
  dnnl::memory src, dst, scale, shift, mean, variance;
  const float* forward_src = nullptr;  // mean and variance are this x's (null: none)
  std::vector<float> kept_mean, kept_variance;
  // Made at the first backward.
  bool backward_ready = false;
  dnnl::layer_normalization_backward bwd;
  dnnl::memory diff_dst, diff_src, diff_scale, diff_shift;
  std::vector<float> scratch_dx, scratch_dscale, scratch_dshift;
};

absl::StatusOr<LayerNormEntry*> GetLayerNorm(const void* node, const LayerNormShape& s) {
  thread_local std::map<std::tuple<const void*, std::vector<int64_t>>,
                        std::unique_ptr<LayerNormEntry>>
      cache;
  int32_t eps_bits;
  std::memcpy(&eps_bits, &s.epsilon, sizeof(eps_bits));
  std::tuple<const void*, std::vector<int64_t>> key(node, {s.rows, s.inner, eps_bits, s.shift});
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  auto e = std::make_unique<LayerNormEntry>();
  try {
    e->data = md({s.rows, s.inner}, dt::f32, tag::ab);
    e->stats = Plain({s.rows});
    e->weights = Plain({s.inner});
    e->flags = s.shift ? ScaleShift() : dnnl::normalization_flags::use_scale;
    e->train_pd = dnnl::layer_normalization_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_training, e->data, e->data, e->stats, s.epsilon,
        e->flags);
    e->train = dnnl::layer_normalization_forward(e->train_pd);
    e->src = kernels::UnboundMemory(e->data, Engine());
    e->dst = kernels::UnboundMemory(e->data, Engine());
    e->scale = kernels::UnboundMemory(e->weights, Engine());
    e->shift = kernels::UnboundMemory(e->weights, Engine());
    e->kept_mean.resize(s.rows);
    e->kept_variance.resize(s.rows);
    e->mean = dnnl::memory(e->stats, Engine(), e->kept_mean.data());
    e->variance = dnnl::memory(e->stats, Engine(), e->kept_variance.data());
  } catch (const dnnl::error& error) {
    return DnnlErrorToStatus(error, "creating a training layer normalization");
  }
  return cache.emplace(std::move(key), std::move(e)).first->second.get();
}

void PrepareLayerNormBackward(LayerNormEntry& e, const LayerNormShape& s) {
  e.bwd = dnnl::layer_normalization_backward(dnnl::layer_normalization_backward::primitive_desc(
      Engine(), dnnl::prop_kind::backward, e.data, e.data, e.data, e.stats, s.epsilon, e.flags,
      e.train_pd));
  e.scratch_dx.resize(s.rows * s.inner);
  e.scratch_dscale.resize(s.inner);
  e.scratch_dshift.resize(s.inner);
  e.diff_dst = kernels::UnboundMemory(e.data, Engine());
  e.diff_src = dnnl::memory(e.data, Engine(), e.scratch_dx.data());
  e.diff_scale = dnnl::memory(e.weights, Engine(), e.scratch_dscale.data());
  e.diff_shift = dnnl::memory(e.weights, Engine(), e.scratch_dshift.data());
  e.backward_ready = true;
}

}  // namespace

absl::Status ConvForward(const void* node, const ConvShape& s, const float* x, const float* w,
                         const float* b, float* y, bool training) {
  absl::StatusOr<ConvEntry*> entry = GetConv(node, s);
  if (!entry.ok()) return entry.status();
  ConvEntry& e = **entry;
  e.forward_src = nullptr;
  try {
    std::unordered_map<int, dnnl::memory> args;
    args[DNNL_ARG_SRC] = e.fwd_src.In(x);
    args[DNNL_ARG_WEIGHTS] = e.fwd_weights.In(w);
    if (s.bias) args[DNNL_ARG_BIAS] = e.fwd_bias.In(b);
    args[DNNL_ARG_DST] = e.fwd_dst.Out(y);
    e.fwd.execute(Stream(), args);
    e.fwd_dst.Finish();
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training convolution forward");
  }
  if (training) e.forward_src = x;
  return absl::OkStatus();
}

absl::Status ConvBackward(const void* node, const ConvShape& s, const float* x, const float* w,
                          const float* dy, float* dx, float* dw, float* db) {
  absl::StatusOr<ConvEntry*> entry = GetConv(node, s);
  if (!entry.ok()) return entry.status();
  ConvEntry& e = **entry;
  if (!e.backward_ready) {
    try {
      PrepareConvBackward(e, s);
    } catch (const dnnl::error& error) {
      return DnnlErrorToStatus(error, "creating a training convolution backward");
    }
  }
  try {
    bool dy_ready = false;
    if (dw != nullptr || (db != nullptr && s.bias)) {
      // Both gradients land in scratch buffers (added to the caller's
      // buffers by Finish), so one that is not wanted is simply dropped.
      std::unordered_map<int, dnnl::memory> args;
      // The forward's reordered input, when it is this x's.
      args[DNNL_ARG_SRC] =
          e.bw_src_as_forward && e.forward_src == x ? e.fwd_src.inner() : e.bw_src.In(x);
      args[DNNL_ARG_DIFF_DST] = e.bw_dst.In(dy);
      dy_ready = true;
      args[DNNL_ARG_DIFF_WEIGHTS] = e.bw_weights.Out(dw);
      if (s.bias) args[DNNL_ARG_DIFF_BIAS] = e.bw_bias.Out(db);
      e.bwd_weights.execute(Stream(), args);
      if (dw != nullptr) e.bw_weights.Finish();
      if (s.bias && db != nullptr) e.bw_bias.Finish();
    }
    if (dx != nullptr) {
      std::unordered_map<int, dnnl::memory> args;
      args[DNNL_ARG_DIFF_DST] = dy_ready && e.bd_dst_as_bw ? e.bw_dst.inner() : e.bd_dst.In(dy);
      args[DNNL_ARG_WEIGHTS] = e.bd_weights.In(w);
      args[DNNL_ARG_DIFF_SRC] = e.bd_src.Out(dx);
      e.bwd_data.execute(Stream(), args);
      e.bd_src.Finish();
    }
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training convolution backward");
  }
  return absl::OkStatus();
}

absl::Status PoolForward(const void* node, PoolKind kind, const Window2d& win, const float* x,
                         float* y, bool training) {
  absl::StatusOr<PoolEntry*> entry = GetPool(kind, win);
  if (!entry.ok()) return entry.status();
  PoolEntry& e = **entry;
  PoolWorkspace& ws = Workspace(node, kind, win);
  ws.x = ws.y = nullptr;  // invalid until a training forward completes
  try {
    e.src_mem.set_data_handle(const_cast<float*>(x));
    e.dst_mem.set_data_handle(y);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, e.src_mem},
                                               {DNNL_ARG_DST, e.dst_mem}};
    const bool keep = training && kind == PoolKind::kMax;
    if (keep) {
      if (!ws.memory) ws.memory = dnnl::memory(e.train_pd.workspace_desc(), Engine());
      args[DNNL_ARG_WORKSPACE] = ws.memory;
      e.train.execute(Stream(), args);
    } else {
      e.infer.execute(Stream(), args);
    }
    Stream().wait();
    if (keep) ws.x = x, ws.y = y;
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training pooling forward");
  }
  return absl::OkStatus();
}

absl::Status PoolBackward(const void* node, PoolKind kind, const Window2d& win, const float* x,
                          const float* y, const float* dy, float* dx) {
  absl::StatusOr<PoolEntry*> entry = GetPool(kind, win);
  if (!entry.ok()) return entry.status();
  PoolEntry& e = **entry;
  if (!e.backward_ready) {
    try {
      PreparePoolBackward(e);
    } catch (const dnnl::error& error) {
      return DnnlErrorToStatus(error, "creating a training pooling backward");
    }
  }
  try {
    std::unordered_map<int, dnnl::memory> args;
    if (kind == PoolKind::kMax) {
      PoolWorkspace& ws = Workspace(node, kind, win);
      if (ws.x != x || ws.y != y) {
        // Not from this forward (or none kept): recompute it into scratch.
        std::vector<float> y_again(win.n * win.c * win.oh * win.ow);
        if (absl::Status s = PoolForward(node, kind, win, x, y_again.data(), true); !s.ok())
          return s;
        ws.x = x, ws.y = y;
      }
      args[DNNL_ARG_WORKSPACE] = ws.memory;
    }
    e.diff_dst_mem.set_data_handle(const_cast<float*>(dy));
    args[DNNL_ARG_DIFF_DST] = e.diff_dst_mem;
    args[DNNL_ARG_DIFF_SRC] = e.bwd_src.Out(dx);
    e.bwd.execute(Stream(), args);
    e.bwd_src.Finish();
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training pooling backward");
  }
  return absl::OkStatus();
}

absl::Status BatchNormForward(const void* node, const BatchNormShape& s, const float* x,
                              const float* scale, const float* shift, float* mean, float* variance,
                              float* y, bool training) {
  absl::StatusOr<BatchNormEntry*> entry = GetBatchNorm(node, s);
  if (!entry.ok()) return entry.status();
  BatchNormEntry& e = **entry;
  e.forward_src = nullptr;
  try {
    e.scale.set_data_handle(const_cast<float*>(scale));
    e.shift.set_data_handle(const_cast<float*>(shift));
    // Training: the primitive writes the batch statistics where backward
    // finds them, then they are copied out.
    e.mean.set_data_handle(training ? e.kept_mean.data() : mean);
    e.variance.set_data_handle(training ? e.kept_variance.data() : variance);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, e.fwd_src.In(x)}, {DNNL_ARG_DST, e.fwd_dst.Out(y)},
        {DNNL_ARG_SCALE, e.scale},       {DNNL_ARG_SHIFT, e.shift},
        {DNNL_ARG_MEAN, e.mean},         {DNNL_ARG_VARIANCE, e.variance}};
    (training ? e.train : e.infer).execute(Stream(), args);
    e.fwd_dst.Finish();
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training batch normalization forward");
  }
  if (training) {
    std::copy(e.kept_mean.begin(), e.kept_mean.end(), mean);
    std::copy(e.kept_variance.begin(), e.kept_variance.end(), variance);
    e.forward_src = x;
  }
  return absl::OkStatus();
}

absl::Status BatchNormBackward(const void* node, const BatchNormShape& s, const float* x,
                               const float* scale, const float* shift, const float* dy, float* dx,
                               float* dscale, float* dshift) {
  absl::StatusOr<BatchNormEntry*> entry = GetBatchNorm(node, s);
  if (!entry.ok()) return entry.status();
  BatchNormEntry& e = **entry;
  if (!e.backward_ready) {
    try {
      PrepareBatchNormBackward(e, s);
    } catch (const dnnl::error& error) {
      return DnnlErrorToStatus(error, "creating a training batch normalization backward");
    }
  }
  if (e.forward_src != x) {
    // Not from this x's training forward (or none kept): compute the batch
    // statistics (and x in the primitives' layout) again.
    std::vector<float> mean(s.c), variance(s.c);
    e.scratch_y.resize(s.n * s.c * s.spatial);
    if (absl::Status st = BatchNormForward(node, s, x, scale, shift, mean.data(), variance.data(),
                                           e.scratch_y.data(), true);
        !st.ok())
      return st;
  }
  try {
    e.scale.set_data_handle(const_cast<float*>(scale));
    // No shift: no gradient depends on it, and oneDNN 3's batch norm
    // backward rejects it at execution (its count of inputs leaves the
    // shift out: "bad number of inputs"), where 2.6 took it with use_shift.
    e.mean.set_data_handle(e.kept_mean.data());
    e.variance.set_data_handle(e.kept_variance.data());
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, e.fwd_src.inner()},   {DNNL_ARG_MEAN, e.mean},
        {DNNL_ARG_VARIANCE, e.variance},     {DNNL_ARG_DIFF_DST, e.bwd_dst.In(dy)},
        {DNNL_ARG_SCALE, e.scale},           {DNNL_ARG_DIFF_SRC, e.bwd_src.Out(dx)},
        {DNNL_ARG_DIFF_SCALE, e.diff_scale}, {DNNL_ARG_DIFF_SHIFT, e.diff_shift}};
    e.bwd.execute(Stream(), args);
    if (dx != nullptr) e.bwd_src.Finish();
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training batch normalization backward");
  }
  if (dscale != nullptr) AddInto(e.scratch_dscale, dscale);
  if (dshift != nullptr) AddInto(e.scratch_dshift, dshift);
  return absl::OkStatus();
}

absl::Status LayerNormForward(const void* node, const LayerNormShape& s, const float* x,
                              const float* scale, const float* shift, float* y, bool training) {
  absl::StatusOr<LayerNormEntry*> entry = GetLayerNorm(node, s);
  if (!entry.ok()) return entry.status();
  LayerNormEntry& e = **entry;
  e.forward_src = nullptr;
  try {
    e.src.set_data_handle(const_cast<float*>(x));
    e.dst.set_data_handle(y);
    e.scale.set_data_handle(const_cast<float*>(scale));
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, e.src},
                                               {DNNL_ARG_DST, e.dst},
                                               {DNNL_ARG_SCALE, e.scale},
                                               {DNNL_ARG_MEAN, e.mean},
                                               {DNNL_ARG_VARIANCE, e.variance}};
    if (s.shift) {
      e.shift.set_data_handle(const_cast<float*>(shift));
      args[DNNL_ARG_SHIFT] = e.shift;
    }
    e.train.execute(Stream(), args);
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training layer normalization forward");
  }
  if (training) e.forward_src = x;
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const void* node, const LayerNormShape& s, const float* x,
                               const float* scale, const float* shift, const float* dy, float* dx,
                               float* dscale, float* dshift) {
  absl::StatusOr<LayerNormEntry*> entry = GetLayerNorm(node, s);
  if (!entry.ok()) return entry.status();
  LayerNormEntry& e = **entry;
  if (!e.backward_ready) {
    try {
      PrepareLayerNormBackward(e, s);
    } catch (const dnnl::error& error) {
      return DnnlErrorToStatus(error, "creating a training layer normalization backward");
    }
  }
  if (e.forward_src != x) {
    // Not from this x's training forward: compute the row statistics again,
    // the output going to the dx scratch.
    if (absl::Status st = LayerNormForward(node, s, x, scale, shift, e.scratch_dx.data(), true);
        !st.ok())
      return st;
  }
  try {
    e.src.set_data_handle(const_cast<float*>(x));
    e.scale.set_data_handle(const_cast<float*>(scale));
    e.diff_dst.set_data_handle(const_cast<float*>(dy));
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, e.src},
                                               {DNNL_ARG_MEAN, e.mean},
                                               {DNNL_ARG_VARIANCE, e.variance},
                                               {DNNL_ARG_DIFF_DST, e.diff_dst},
                                               {DNNL_ARG_SCALE, e.scale},
                                               {DNNL_ARG_DIFF_SRC, e.diff_src},
                                               {DNNL_ARG_DIFF_SCALE, e.diff_scale}};
    if (s.shift) {
      // Taken as an input of backward too (with use_shift), though no
      // gradient depends on it.
      e.shift.set_data_handle(const_cast<float*>(shift));
      args[DNNL_ARG_SHIFT] = e.shift;
      args[DNNL_ARG_DIFF_SHIFT] = e.diff_shift;
    }
    e.bwd.execute(Stream(), args);
    Stream().wait();
  } catch (const dnnl::error& error) {
    return ExecutionError(error, "training layer normalization backward");
  }
  if (dx != nullptr) AddInto(e.scratch_dx, dx);
  if (dscale != nullptr) AddInto(e.scratch_dscale, dscale);
  if (dshift != nullptr && s.shift) AddInto(e.scratch_dshift, dshift);
  return absl::OkStatus();
}

Bf16ConvPrimitives Bf16ConvPrimitiveCounts() {
  return {.bf16 = bf16_conv_primitives.load(), .fp32_instead = bf16_conv_fp32_instead.load()};
}

bool ShapeRejected(const absl::Status& s, std::atomic<int64_t>& fallbacks) {
  const bool rejected = absl::IsUnimplemented(s) || absl::IsInvalidArgument(s);
  if (rejected) fallbacks.fetch_add(1, std::memory_order_relaxed);
  return rejected;
}

}  // namespace numaserve::kernels::training_onednn
