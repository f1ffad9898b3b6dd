// ConvOnednn (conv_onednn.h): Create, the per-shape primitives (EntryFor)
// and their FP32/BF16 paths (direct, oneDNN's and the own Winograd,
// channels-last, away from a reference kernel, the fused depthwise
// post-op), Execute, and ActivationDesc/ActivationReorder. The INT8 path
// (PrepareInt8 and what only it uses) is in conv_onednn_int8.cc.
#include "kernels/onednn/conv_onednn.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "kernels/dispatch.h"
#include "kernels/onednn/conv_onednn_internal.h"

namespace numaserve::kernels {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// The own AVX2 Winograd takes a conv from this many 4x4 output tiles on.
constexpr int64_t kOwnWinogradMinTiles = 4;

dnnl::memory::desc PlainDesc(const Shape& shape, dt type = dt::f32) {
  return dnnl::memory::desc(ToDnnlDims(shape), type, ToDnnlDims(RowMajorStrides(shape)));
}

// Checks Create's options (sizes, bias, and what goes with int8 and a
// depthwise post-op), turning off winograd and channels_last where they
// cannot apply; returns the weights' element count.
absl::StatusOr<int64_t> CheckConvOptions(ConvOnednnOptions& options) {
  const size_t spatial = options.kernel.size();
  if (spatial < 1 || spatial > 3 || options.strides.size() != spatial ||
      options.dilations.size() != spatial || options.pads_begin.size() != spatial ||
      options.pads_end.size() != spatial ||
      (options.weights == nullptr && !options.int8.has_value()) || options.group < 1 ||
      options.in_channels % options.group != 0 || options.out_channels % options.group != 0) {
    return absl::InvalidArgumentError("ConvOnednn: inconsistent options");
  }
  if (!options.bias.empty() && static_cast<int64_t>(options.bias.size()) != options.out_channels) {
    return absl::InvalidArgumentError("ConvOnednn: bias must have out_channels values");
  }
  int64_t count = options.out_channels * options.in_channels / options.group;
  for (int64_t k : options.kernel) count *= k;
  if (options.int8.has_value()) {
    if (options.bf16 || options.transposed || options.dw.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ConvOnednn ", options.name, ": int8 goes with none of bf16, ConvTranspose and a ",
          "fused depthwise post-op"));
    }
    if (absl::Status s = CheckInt8Params(*options.int8, options.out_channels, count,
                                         absl::StrCat("ConvOnednn ", options.name));
        !s.ok()) {
      return s;
    }
    options.winograd = false;  // oneDNN has no int8 Winograd on CPUs
    options.channels_last = ConvChannelsLast::kNever;
  }
  if (options.dw.has_value()) {
    const DepthwisePostOp& dw = *options.dw;
    bool one_by_one = spatial == 2 && options.group == 1 && !options.transposed && !options.sum;
    for (size_t d = 0; d < spatial && one_by_one; ++d) {
      one_by_one = options.kernel[d] == 1 && options.strides[d] == 1 && options.dilations[d] == 1 &&
                   options.pads_begin[d] == 0 && options.pads_end[d] == 0;
    }
    if (!one_by_one || (dw.stride != 1 && dw.stride != 2) ||
        static_cast<int64_t>(dw.weights.size()) != options.out_channels * 9 ||
        static_cast<int64_t>(dw.bias.size()) != options.out_channels) {
      return absl::InvalidArgumentError(
          "ConvOnednn: a depthwise post-op needs a 1x1 stride-1 unpadded 2D conv, "
          "[C,1,3,3] weights, C bias values and stride 1 or 2");
    }
    options.winograd = false;
  }
  return count;
}

}  // namespace

// What of a conv's eltwise post-ops the own Winograd's epilogue computes:
// none, ReLU, a fake-quantize (a QuantizeLinear -> DequantizeLinear pair
// folded into the conv: linear(1 / s, 0), round, clip(lo, hi), pow(s, 1)),
// or ReLU then a fake-quantize. nullopt for any other chain.
std::optional<ConvOnednn::OwnWinogradPostOps> ConvOnednn::OwnWinogradPostOpsOf(
    const std::vector<EltwisePostOp>& ops) {
  using alg = dnnl::algorithm;
  OwnWinogradPostOps out;
  size_t i = 0;
  if (i < ops.size() && ops[i].algorithm == alg::eltwise_relu && ops[i].alpha == 0.0f) {
    out.relu = true;
    ++i;
  }
  if (i == ops.size()) return out;
  if (ops.size() - i != 4 || ops[i].algorithm != alg::eltwise_linear || ops[i].beta != 0.0f ||
      ops[i + 1].algorithm != alg::eltwise_round || ops[i + 2].algorithm != alg::eltwise_clip ||
      !(ops[i + 2].alpha <= ops[i + 2].beta) || ops[i + 3].algorithm != alg::eltwise_pow ||
      ops[i + 3].beta != 1.0f) {
    return std::nullopt;
  }
  out.fake_quantize = cpu::WinogradFakeQuantize{.inverse_scale = ops[i].alpha,
                                                .lo = ops[i + 2].alpha,
                                                .hi = ops[i + 2].beta,
                                                .scale = ops[i + 3].alpha};
  return out;
}

dnnl::memory::desc ActivationDesc(const Shape& shape, bool blocked, dt type, BlockedLayout layout) {
  if (!blocked || shape.size() < 3 || shape.size() > 5) return PlainDesc(shape, type);
  if (layout == BlockedLayout::kChannelsLast) {
    const tag t = shape.size() == 3 ? tag::nwc : shape.size() == 4 ? tag::nhwc : tag::ndhwc;
    return dnnl::memory::desc(ToDnnlDims(shape), type, t);
  }
  const bool b16 = ActivationChannelBlock() == 16;
  const tag t = shape.size() == 3   ? (b16 ? tag::nCw16c : tag::nCw8c)
                : shape.size() == 4 ? (b16 ? tag::nChw16c : tag::nChw8c)
                                    : (b16 ? tag::nCdhw16c : tag::nCdhw8c);
  return dnnl::memory::desc(ToDnnlDims(shape), type, t);
}

int64_t ActivationBytes(const Shape& shape, bool blocked, BlockedLayout layout) {
  return static_cast<int64_t>(ActivationDesc(shape, blocked, dt::f32, layout).get_size());
}

absl::Status ActivationReorder::Execute(dnnl::stream& stream, const Shape& shape, const float* src,
                                        bool src_blocked, float* dst, bool dst_blocked) {
  if (src_blocked == dst_blocked) {
    std::memcpy(dst, src, ActivationBytes(shape, src_blocked, layout_));
    return absl::OkStatus();
  }
  BoundPrimitive* call = per_shape_.Find(std::tie(shape, src_blocked, dst_blocked));
  if (call == nullptr) {
    BoundPrimitive created;
    try {
      created = BoundReorder(engine_, ActivationDesc(shape, src_blocked, dt::f32, layout_),
                             ActivationDesc(shape, dst_blocked, dt::f32, layout_));
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, "creating an activation reorder");
    }
    call =
        &per_shape_.Emplace(std::make_tuple(shape, src_blocked, dst_blocked), std::move(created));
  }
  try {
    RunReorder(*call, stream, src, dst);
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "executing an activation reorder");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ConvOnednn>> ConvOnednn::Create(const dnnl::engine& engine,
                                                               ConvOnednnOptions options) {
  absl::StatusOr<int64_t> count = CheckConvOptions(options);
  if (!count.ok()) return count.status();
  std::unique_ptr<ConvOnednn> conv(new ConvOnednn(engine, std::move(options)));
  ConvOnednnOptions& o = conv->options_;
  conv->winograd_post_ops_ = OwnWinogradPostOpsOf(o.eltwise);
  // With int8 too the FP32 bias as it is: oneDNN 3 adds it after scaling
  // the accumulator, in FP32.
  const std::vector<float>& bias = o.bias;
  if (o.int8.has_value()) {
    conv->user_weights_s8_ = std::move(o.int8->weights);
    o.int8->weights = std::vector<int8_t>();
    std::vector<int8_t> hi;
    if (SplitInt8Weights(conv->user_weights_s8_, &hi, &conv->user_weights_s8_lo_)) {
      conv->user_weights_s8_ = std::move(hi);
    }
    if (absl::Status s = conv->CreateQuantizationArgs(); !s.ok()) return s;
  } else {
    conv->user_weights_.assign(o.weights, o.weights + *count);
  }
  o.weights = nullptr;
  if (!bias.empty()) {
    try {
      conv->bias_ = dnnl::memory(dnnl::memory::desc({o.out_channels}, dt::f32, tag::a), engine);
      std::memcpy(conv->bias_.get_data_handle(), bias.data(), bias.size() * sizeof(float));
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, "allocating conv bias");
    }
  }
  if (const std::optional<DepthwisePostOp>& dw = conv->options_.dw; dw.has_value()) {
    try {
      conv->dw_bias_ =
          dnnl::memory(dnnl::memory::desc({conv->options_.out_channels}, dt::f32, tag::a), engine);
      std::memcpy(conv->dw_bias_.get_data_handle(), dw->bias.data(),
                  dw->bias.size() * sizeof(float));
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, "allocating depthwise bias");
    }
  }
  return conv;
}

dnnl::memory::desc ConvOnednn::UserWeightsDesc(dt type) const {
  const ConvOnednnOptions& o = options_;
  const int64_t g = o.group, ocg = o.out_channels / g, icg = o.in_channels / g;
  int64_t k_elems = 1;
  for (int64_t k : o.kernel) k_elems *= k;
  // oneDNN's logical dims are [G,] OC/G, IC/G, k...; the strides say where
  // ONNX keeps them: [M, C/G, k] for Conv, [C, M/G, k] for ConvTranspose.
  dnnl::memory::dims dims, strides;
  if (g > 1) {
    dims.push_back(g);
    strides.push_back(ocg * icg * k_elems);
  }
  dims.push_back(ocg);
  strides.push_back(o.transposed ? k_elems : icg * k_elems);
  dims.push_back(icg);
  strides.push_back(o.transposed ? ocg * k_elems : k_elems);
  const std::vector<int64_t> kstrides = RowMajorStrides(o.kernel);
  for (size_t d = 0; d < o.kernel.size(); ++d) {
    dims.push_back(o.kernel[d]);
    strides.push_back(kstrides[d]);
  }
  return dnnl::memory::desc(dims, type, strides);
}

bool ConvOnednn::WinogradCandidate() const {
  const ConvOnednnOptions& o = options_;
  // oneDNN has no BF16 Winograd kernel.
  if (!o.winograd || o.bf16 || o.transposed || o.group != 1 || o.kernel.size() != 2) return false;
  for (size_t d = 0; d < 2; ++d) {
    if (o.kernel[d] != 3 || o.strides[d] != 1 || o.dilations[d] != 1) return false;
  }
  return true;
}

bool ConvOnednn::OwnWinogradFits(const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                                 bool dst_blocked, cpu::WinogradConvShape* shape) const {
  const ConvOnednnOptions& o = options_;
  if (!WinogradCandidate() || o.int8.has_value() || o.dw.has_value() || !src_blocked ||
      !dst_blocked || o.blocked_layout != BlockedLayout::kChannelBlocked ||
      ActivationChannelBlock() != 8 || GetDispatchDecision().max_tier == IsaTier::kScalar ||
      src_shape.size() != 4 || dst_shape.size() != 4 || user_weights_.empty()) {
    return false;
  }
  // Channels: whole vectors, and few enough that a thread's buffers stay
  // small (36 x 120 tiles x (C + K) floats at most).
  const int64_t c = o.in_channels, k = o.out_channels;
  if (c % 8 != 0 || k % 8 != 0 || c > 4096 || k > 4096 || src_shape[1] != c || dst_shape[1] != k ||
      dst_shape[0] != src_shape[0]) {
    return false;
  }
  if (!winograd_post_ops_.has_value()) return false;
  cpu::WinogradConvShape s;
  s.batch = src_shape[0];
  s.in_channels = c;
  s.out_channels = k;
  s.in_h = src_shape[2];
  s.in_w = src_shape[3];
  s.out_h = dst_shape[2];
  s.out_w = dst_shape[3];
  s.pad_top = o.pads_begin[0];
  s.pad_left = o.pads_begin[1];
  if (s.out_h != s.in_h + o.pads_begin[0] + o.pads_end[0] - 2 ||
      s.out_w != s.in_w + o.pads_begin[1] + o.pads_end[1] - 2 || s.out_h < 1 || s.out_w < 1) {
    return false;
  }
  if (cpu::WinogradF4x3Tiles(s) < kOwnWinogradMinTiles) return false;
  *shape = s;
  return true;
}

bool ConvOnednn::ChannelsLastCandidate(const Shape& src_shape, const Shape& dst_shape,
                                       bool src_blocked, bool dst_blocked) const {
  const ConvOnednnOptions& o = options_;
  if (o.channels_last == ConvChannelsLast::kNever ||
      o.blocked_layout == BlockedLayout::kChannelsLast || o.transposed || o.sum ||
      o.dw.has_value() || o.group != 1 || o.kernel.size() != 2 || src_shape.size() != 4 ||
      dst_shape.size() != 4 || !src_blocked || !dst_blocked) {
    return false;
  }
  if (o.channels_last == ConvChannelsLast::kAlways) return true;
  for (size_t d = 0; d < 2; ++d) {
    if (o.kernel[d] != 3 || o.strides[d] != 2 || o.dilations[d] != 1) return false;
  }
  // Measured on ResNet-50's three (56x56, 28x28 and 14x14 inputs) at
  // batch 1 to 32: channels-last wins at every batch on a 7x7 output, from
  // batch 2 on a 14x14 one, and on larger outputs only once the batch's
  // output has 16K pixels (28x28 at batch 32; at batch 8 and 16 the
  // reorders cost what the brgemm kernel gains).
  const int64_t n = src_shape[0], pixels = dst_shape[2] * dst_shape[3];
  return pixels <= 64 || (pixels <= 196 && n >= 2) || n * pixels >= 16384;
}

absl::StatusOr<bool> ConvOnednn::PrepareChannelsLast(const Shape& src_shape, const Shape& dst_shape,
                                                     bool src_blocked, bool dst_blocked,
                                                     PerShape* entry) {
  const ConvOnednnOptions& o = options_;
  const dnnl::memory::desc nhwc_src(ToDnnlDims(src_shape), ComputeType(), tag::nhwc);
  const dnnl::memory::desc nhwc_dst(ToDnnlDims(dst_shape), dt::f32, tag::nhwc);
  const dnnl::memory::desc any_w(UserWeightsDesc().get_dims(), ComputeType(), tag::any);
  const dnnl::memory::desc bias_md = bias_ ? bias_.get_desc() : dnnl::memory::desc();
  dnnl::convolution_forward::primitive_desc pd;
  try {
    pd = dnnl::convolution_forward::primitive_desc(
        engine_, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, nhwc_src,
        any_w, bias_md, nhwc_dst, ToDnnlDimsMinus(o.strides, 0), ToDnnlDimsMinus(o.dilations, 1),
        ToDnnlDimsMinus(o.pads_begin, 0), ToDnnlDimsMinus(o.pads_end, 0), Attr());
  } catch (const dnnl::error&) {
    return false;
  }
  const std::string impl = pd.impl_info_str();
  // Only oneDNN's AVX-512 brgemm kernels were measured to win.
  if (impl.rfind("brg", 0) != 0 || impl.find("avx512") == std::string::npos) return false;
  if (absl::Status s = BindReordered(pd, src_shape, dst_shape, src_blocked, dst_blocked, entry);
      !s.ok()) {
    return s;
  }
  entry->impl = absl::StrCat(impl, " (nhwc, reordered)");
  return true;
}

dnnl::memory::desc ConvOnednn::Act(const Shape& shape, bool blocked, dt type) const {
  return ActivationDesc(shape, blocked, type, options_.blocked_layout);
}

dt ConvOnednn::ComputeType() const {
  return options_.bf16 ? dt::bf16 : options_.int8.has_value() ? dt::u8 : dt::f32;
}

void ConvOnednn::BindSrc(const dnnl::memory::desc& src_md, const dnnl::memory::desc& conv_src,
                         PerShape* entry, const dnnl::memory::dims& pad_offsets) {
  if (conv_src == src_md && pad_offsets.empty()) return;
  entry->src_via_scratch = true;
  entry->to_conv_src = BoundReorder(
      engine_, src_md,
      pad_offsets.empty() ? conv_src : conv_src.submemory_desc(src_md.get_dims(), pad_offsets));
  entry->dst_offset = Align64(conv_src.get_size());
  entry->scratch_bytes = entry->dst_offset;
}

absl::Status ConvOnednn::BindReordered(const dnnl::convolution_forward::primitive_desc& pd,
                                       const Shape& src_shape, const Shape& dst_shape,
                                       bool src_blocked, bool dst_blocked, PerShape* entry,
                                       const dnnl::memory::dims& src_pad_offsets) {
  // With int8 the input is quantized (in the caller's layout) first.
  const dnnl::memory::desc src_md =
      Act(src_shape, src_blocked, options_.int8.has_value() ? dt::u8 : dt::f32);
  const dnnl::memory::desc dst_md = Act(dst_shape, dst_blocked);
  const dnnl::memory::desc conv_src = pd.src_desc(), conv_dst = pd.dst_desc();
  auto weights = WeightsFor(pd.weights_desc());
  if (!weights.ok()) return weights.status();
  entry->impl = pd.impl_info_str();
  entry->call.primitive = dnnl::convolution_forward(pd);
  entry->call.args[DNNL_ARG_SRC] = UnboundMemory(conv_src, engine_);
  entry->call.args[DNNL_ARG_WEIGHTS] = *weights;
  entry->call.args[DNNL_ARG_DST] = UnboundMemory(conv_dst, engine_);
  if (bias_) entry->call.args[DNNL_ARG_BIAS] = bias_;
  if (options_.int8.has_value()) BindQuantization(&entry->call);
  BindSrc(src_md, conv_src, entry, src_pad_offsets);
  if (conv_dst != dst_md) {
    entry->dst_via_scratch = true;
    if (options_.sum) entry->to_conv_dst = BoundReorder(engine_, dst_md, conv_dst);
    entry->from_conv_dst = BoundReorder(engine_, conv_dst, dst_md);
    // dst after src in the scratch, 64-byte aligned.
    entry->scratch_bytes = entry->dst_offset + conv_dst.get_size();
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ConvOnednn::PrepareAwayFromReference(const Shape& src_shape,
                                                          const Shape& dst_shape, bool src_blocked,
                                                          bool dst_blocked, PerShape* entry) {
  const ConvOnednnOptions& o = options_;
  if (o.transposed || o.dw.has_value()) return false;
  const dnnl::memory::desc any_w(UserWeightsDesc().get_dims(), ComputeType(), tag::any);
  const dnnl::memory::desc bias_md = bias_ ? bias_.get_desc() : dnnl::memory::desc();
  const dnnl::memory::dims src_dims = ToDnnlDims(src_shape), dst_dims = ToDnnlDims(dst_shape);
  // oneDNN's own choice first, then plain (its im2col + GEMM exists for
  // every shape), then channels-last.
  const std::pair<dnnl::memory::desc, dnnl::memory::desc> candidates[] = {
      {dnnl::memory::desc(src_dims, ComputeType(), tag::any),
       dnnl::memory::desc(dst_dims, dt::f32, tag::any)},
      {PlainDesc(src_shape, ComputeType()), PlainDesc(dst_shape)},
      {ActivationDesc(src_shape, true, ComputeType(), BlockedLayout::kChannelsLast),
       ActivationDesc(dst_shape, true, dt::f32, BlockedLayout::kChannelsLast)},
  };
  for (const auto& [src_md, dst_md] : candidates) {
    dnnl::convolution_forward::primitive_desc pd;
    try {
      pd = dnnl::convolution_forward::primitive_desc(
          engine_, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
          any_w, bias_md, dst_md, ToDnnlDimsMinus(o.strides, 0), ToDnnlDimsMinus(o.dilations, 1),
          ToDnnlDimsMinus(o.pads_begin, 0), ToDnnlDimsMinus(o.pads_end, 0), Attr());
    } catch (const dnnl::error&) {
      continue;
    }
    if (IsReferenceImplementation(pd.impl_info_str())) continue;
    if (absl::Status s = BindReordered(pd, src_shape, dst_shape, src_blocked, dst_blocked, entry);
        !s.ok()) {
      return s;
    }
    entry->impl = absl::StrCat(pd.impl_info_str(), " (reordered: no ",
                               src_blocked ? BlockedLayoutName(options_.blocked_layout) : "plain",
                               " kernel)");
    return true;
  }
  return false;
}

bool CanAppendEltwise(const std::vector<EltwisePostOp>& chain, const EltwisePostOp& next) {
  for (const EltwisePostOp& e : chain) {
    if (e.algorithm == next.algorithm && (e.alpha != next.alpha || e.beta != next.beta)) {
      return false;
    }
  }
  return true;
}

dnnl::primitive_attr ConvOnednn::Attr(Pass pass) const {
  dnnl::post_ops ops;
  // The second pass adds onto the first's output.
  if (pass == Pass::kSecond || options_.sum) ops.append_sum(1.0f);
  if (pass != Pass::kFirst) {
    for (const EltwisePostOp& e : options_.eltwise) {
      ops.append_eltwise(e.algorithm, e.alpha, e.beta);
    }
  }
  if (options_.dw.has_value()) {
    ops.append_dw(ComputeType(), dt::f32, dt::f32, 3, options_.dw->stride, 1);
    for (const EltwisePostOp& e : options_.dw->eltwise) {
      ops.append_eltwise(e.algorithm, e.alpha, e.beta);
    }
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  if (options_.int8.has_value()) {
    // oneDNN 3: dst = post-ops(src_scale * weight_scale[oc] * int32 acc +
    // bias), the scales and the src zero point given at run time
    // (BindQuantization). Per output channel the weights' mask is their OC
    // dim: 0 in [OC, IC, k...], 0 and 1 (G and OC/G) in grouped
    // [G, OC/G, IC/G, k...].
    const bool per_channel = options_.int8->weight_scales.size() > 1;
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, !per_channel         ? 0
                                           : options_.group > 1 ? (1 << 0) | (1 << 1)
                                                                : 1 << 0);
    if (options_.int8->src_zero_point != 0) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  }
  return attr;
}

absl::StatusOr<dnnl::memory> ConvOnednn::WeightsFor(const dnnl::memory::desc& md, Pass pass) {
  std::vector<dnnl::memory>& cache = pass == Pass::kSecond ? packed_lo_ : packed_;
  for (const dnnl::memory& m : cache) {
    if (m.get_desc() == md) return m;
  }
  try {
    dnnl::memory user;
    if (options_.int8.has_value()) {
      std::vector<int8_t>& s8 = pass == Pass::kSecond ? user_weights_s8_lo_ : user_weights_s8_;
      user = dnnl::memory(UserWeightsDesc(dt::s8), engine_, s8.data());
    } else {
      user = dnnl::memory(UserWeightsDesc(), engine_, user_weights_.data());
    }
    dnnl::memory packed(md, engine_);
    dnnl::stream stream(engine_);
    dnnl::reorder(user, packed).execute(stream, user, packed);
    stream.wait();
    cache.push_back(packed);
    return packed;
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "packing conv weights");
  }
}

absl::Status ConvOnednn::Prepare(const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                                 bool dst_blocked) {
  src_blocked_ = src_blocked;
  dst_blocked_ = dst_blocked;
  return EntryFor(src_shape, dst_shape, src_blocked, dst_blocked).status();
}

absl::StatusOr<ConvOnednn::PerShape*> ConvOnednn::EntryFor(const Shape& src_shape,
                                                           const Shape& dst_shape, bool src_blocked,
                                                           bool dst_blocked) {
  if (PerShape* found = per_shape_.Find(src_shape)) return found;
  PerShape entry;
  if (options_.int8.has_value()) {
    if (absl::Status s = PrepareInt8(src_shape, dst_shape, src_blocked, dst_blocked, &entry);
        !s.ok()) {
      return s;
    }
    if (IsReferenceImplementation(entry.impl) && options_.log_reference) {
      base::Log(base::LogLevel::kWarning, "onednn",
                absl::StrCat(options_.name, ", input ", ShapeToString(src_shape),
                             ": oneDNN has only ", entry.impl, " for this int8 conv here"),
                {{"node", options_.name}, {"reference", entry.impl}});
    }
    return &per_shape_.Emplace(src_shape, std::move(entry));
  }
  if (ChannelsLastCandidate(src_shape, dst_shape, src_blocked, dst_blocked)) {
    absl::StatusOr<bool> done;
    try {
      done = PrepareChannelsLast(src_shape, dst_shape, src_blocked, dst_blocked, &entry);
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(
          e, absl::StrCat("creating channels-last conv for input ", ShapeToString(src_shape)));
    }
    if (!done.ok()) return done.status();
    if (*done) return &per_shape_.Emplace(src_shape, std::move(entry));
    entry = PerShape();
  }
  if (OwnWinogradFits(src_shape, dst_shape, src_blocked, dst_blocked, &entry.winograd_shape)) {
    if (!winograd_weights_) {
      winograd_weights_ =
          std::make_shared<const cpu::WinogradF4x3Weights>(cpu::TransformWinogradF4x3Weights(
              user_weights_.data(), options_.out_channels, options_.in_channels));
    }
    entry.own_winograd = true;
    entry.impl = "numaserve:winograd_f4x3 avx2";
    return &per_shape_.Emplace(src_shape, std::move(entry));
  }
  if (absl::Status s = PrepareDirect(src_shape, dst_shape, src_blocked, dst_blocked, &entry);
      !s.ok()) {
    return s;
  }
  if (IsReferenceImplementation(entry.impl)) {
    const std::string reference = entry.impl;
    PerShape other;
    absl::StatusOr<bool> done;
    try {
      done = PrepareAwayFromReference(src_shape, dst_shape, src_blocked, dst_blocked, &other);
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(
          e, absl::StrCat("creating a reordered conv for input ", ShapeToString(src_shape)));
    }
    if (!done.ok()) return done.status();
    if (*done) entry = std::move(other);
    if (options_.log_reference) {
      base::Log(
          base::LogLevel::kWarning, "onednn",
          absl::StrCat(options_.name, ", input ", ShapeToString(src_shape), ": oneDNN has only ",
                       reference, " for ",
                       src_blocked ? BlockedLayoutName(options_.blocked_layout) : "plain", " -> ",
                       dst_blocked ? BlockedLayoutName(options_.blocked_layout) : "plain",
                       *done ? "; running " : " on this CPU, and nothing else: it runs there",
                       *done ? entry.impl : ""),
          {{"node", options_.name}, {"reference", reference}});
    }
  }
  return &per_shape_.Emplace(src_shape, std::move(entry));
}

dnnl::convolution_forward::primitive_desc ConvOnednn::DirectConvPd(
    const dnnl::memory::desc& src_md, const dnnl::memory::desc& any_w,
    const dnnl::memory::desc& bias_md, const dnnl::memory::desc& dst_md) const {
  const ConvOnednnOptions& o = options_;
  auto make_pd = [&](dnnl::algorithm algorithm) {
    return dnnl::convolution_forward::primitive_desc(
        engine_, dnnl::prop_kind::forward_inference, algorithm, src_md, any_w, bias_md, dst_md,
        ToDnnlDimsMinus(o.strides, 0), ToDnnlDimsMinus(o.dilations, 1),
        ToDnnlDimsMinus(o.pads_begin, 0), ToDnnlDimsMinus(o.pads_end, 0), Attr());
  };
  dnnl::convolution_forward::primitive_desc pd;
  if (WinogradCandidate()) {
    try {
      pd = make_pd(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
      // Not implemented for this shape, layout or CPU: direct.
    }
  }
  if (!pd) pd = make_pd(dnnl::algorithm::convolution_direct);
  return pd;
}

absl::Status ConvOnednn::BindDepthwise(const Shape& dst_shape, const dnnl::memory::desc& dst_desc,
                                       const dnnl::memory::desc& final_dst_md,
                                       const dnnl::memory::desc& dw_weights_md, PerShape* entry) {
  const ConvOnednnOptions& o = options_;
  if (!o.dw.has_value()) return absl::InternalError("ConvOnednn: no depthwise post-op to bind");
  const DepthwisePostOp& dw = *o.dw;
  if (dst_desc.get_dims() != final_dst_md.get_dims()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConvOnednn: the fused depthwise output is not ", ShapeToString(dst_shape)));
  }
  if (dst_desc != final_dst_md) {
    // oneDNN writes the depthwise output in the 1x1 output's layout
    // (the caller's src layout where dst is plain, as for a graph
    // output): reordered from the scratch.
    entry->dst_via_scratch = true;
    entry->from_conv_dst = BoundReorder(engine_, dst_desc, final_dst_md);
    entry->scratch_bytes = entry->dst_offset + dst_desc.get_size();
  }
  dnnl::memory user(dnnl::memory::desc({o.out_channels, 1, 1, 3, 3}, dt::f32, tag::goihw), engine_,
                    const_cast<float*>(dw.weights.data()));
  dnnl::memory dw_weights(dw_weights_md, engine_);
  dnnl::stream stream(engine_);
  dnnl::reorder(user, dw_weights).execute(stream, user, dw_weights);
  stream.wait();
  entry->call.args[DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS] = dw_weights;
  entry->call.args[DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS] = dw_bias_;
  return absl::OkStatus();
}

absl::Status ConvOnednn::PrepareDirect(const Shape& src_shape, const Shape& dst_shape,
                                       bool src_blocked, bool dst_blocked, PerShape* entry) {
  const ConvOnednnOptions& o = options_;
  try {
    dnnl::memory::dims wdims = UserWeightsDesc().get_dims();
    dnnl::memory::desc any_w(wdims, ComputeType(), tag::any);
    dnnl::memory::desc bias_md = bias_ ? bias_.get_desc() : dnnl::memory::desc();
    // The caller's input as the conv reads it: BF16 (converted through the
    // scratch) with options.bf16.
    const dnnl::memory::desc src_md = Act(src_shape, src_blocked, ComputeType());
    const dnnl::memory::desc final_dst_md = Act(dst_shape, dst_blocked);
    // With a depthwise post-op the conv itself is described by the 1x1
    // output (dst's channels at src's extent) in dst's layout.
    dnnl::memory::desc dst_md = final_dst_md;
    if (o.dw.has_value()) {
      if (src_shape.size() != 4 || dst_shape.size() != 4) {
        return absl::InvalidArgumentError("ConvOnednn: a depthwise post-op needs 4D tensors");
      }
      // BF16: the 1x1 output stays BF16 in cache, the depthwise conv reads
      // it as such and writes FP32.
      dst_md =
          Act({src_shape[0], dst_shape[1], src_shape[2], src_shape[3]}, dst_blocked, ComputeType());
    }
    dnnl::memory::desc weights_md, src_desc, dst_desc, dw_weights_md;
    if (o.transposed) {
      dnnl::deconvolution_forward::primitive_desc pd(
          engine_, dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
          src_md, any_w, bias_md, dst_md, ToDnnlDimsMinus(o.strides, 0),
          ToDnnlDimsMinus(o.dilations, 1), ToDnnlDimsMinus(o.pads_begin, 0),
          ToDnnlDimsMinus(o.pads_end, 0), Attr());
      weights_md = pd.weights_desc();
      src_desc = pd.src_desc();
      dst_desc = pd.dst_desc();
      entry->impl = pd.impl_info_str();
      entry->call.primitive = dnnl::deconvolution_forward(pd);
    } else {
      dnnl::convolution_forward::primitive_desc pd = DirectConvPd(src_md, any_w, bias_md, dst_md);
      if (o.dw.has_value()) {
        dw_weights_md =
            pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
      }
      weights_md = pd.weights_desc();
      src_desc = pd.src_desc();
      dst_desc = pd.dst_desc();
      entry->impl = pd.impl_info_str();
      entry->call.primitive = dnnl::convolution_forward(pd);
    }
    auto weights = WeightsFor(weights_md);
    if (!weights.ok()) return weights.status();
    entry->call.args[DNNL_ARG_SRC] = UnboundMemory(src_desc, engine_);
    entry->call.args[DNNL_ARG_WEIGHTS] = *weights;
    entry->call.args[DNNL_ARG_DST] = UnboundMemory(dst_desc, engine_);
    if (bias_) entry->call.args[DNNL_ARG_BIAS] = bias_;
    BindSrc(Act(src_shape, src_blocked), src_desc, entry);
    if (o.dw.has_value()) {
      if (absl::Status s = BindDepthwise(dst_shape, dst_desc, final_dst_md, dw_weights_md, entry);
          !s.ok()) {
        return s;
      }
    }
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, absl::StrCat("creating conv for input ", ShapeToString(src_shape)));
  }
  return absl::OkStatus();
}

absl::Status ConvOnednn::Execute(dnnl::stream& stream, const Shape& src_shape,
                                 const Shape& dst_shape, const float* src, float* dst) {
  absl::StatusOr<PerShape*> entry = EntryFor(src_shape, dst_shape, src_blocked_, dst_blocked_);
  if (!entry.ok()) return entry.status();
  PerShape& e = **entry;
  if (e.own_winograd) {
    // OwnWinogradFits accepted the post-ops.
    if (!winograd_post_ops_.has_value()) {
      return absl::InternalError("ConvOnednn: Winograd chosen without its post-ops");
    }
    const OwnWinogradPostOps& post_ops = *winograd_post_ops_;
    const cpu::WinogradEpilogue epilogue{
        .bias = options_.bias.empty() ? nullptr : options_.bias.data(),
        .sum = options_.sum,
        .relu = post_ops.relu,
        .fake_quantize = post_ops.fake_quantize.has_value() ? &*post_ops.fake_quantize : nullptr};
    // In the thread's reordering scratch: this path reorders nothing.
    const cpu::WinogradF4x3Plan plan = cpu::PlanWinogradF4x3(*winograd_weights_, e.winograd_shape);
    char* scratch = ThreadScratch(static_cast<size_t>(plan.scratch_floats) * sizeof(float));
    if (scratch == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("ConvOnednn ", options_.name, ": cannot allocate the Winograd buffers for ",
                       "input ", ShapeToString(src_shape)));
    }
    cpu::winograd_f4x3_conv_avx2(*winograd_weights_, e.winograd_shape, plan, epilogue, src, dst,
                                 reinterpret_cast<float*>(scratch));
    return absl::OkStatus();
  }
  try {
    if (e.src_via_scratch || e.dst_via_scratch || e.quantized_bytes != 0) {
      char* scratch = ThreadScratch(e.scratch_bytes);
      if (scratch == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("ConvOnednn: cannot allocate ", e.scratch_bytes,
                         " bytes of reordering scratch for input ", ShapeToString(src_shape)));
      }
      const void* conv_src = src;
      void* conv_dst = dst;
      if (e.quantized_bytes != 0) {
        if (!options_.int8.has_value()) {
          return absl::InternalError("ConvOnednn: a quantized input without int8 parameters");
        }
        const Int8Params& q = *options_.int8;
        QuantizeToU8(src, e.quantized_count, q.src_scale, q.src_zero_point,
                     reinterpret_cast<uint8_t*>(scratch));
        conv_src = scratch;
        scratch += e.quantized_bytes;  // the reordered src and dst follow
      }
      if (e.src_via_scratch) {
        if (e.src_pad_fill >= 0) std::memset(scratch, e.src_pad_fill, e.src_pad_bytes);
        RunReorder(e.to_conv_src, stream, conv_src, scratch);
        conv_src = scratch;
      }
      if (e.dst_via_scratch) {
        conv_dst = scratch + e.dst_offset;
        // With a sum post-op, the residual in the conv's layout.
        if (options_.sum) RunReorder(e.to_conv_dst, stream, dst, conv_dst);
      }
      e.call.SetHandle(DNNL_ARG_SRC, conv_src);
      e.call.SetHandle(DNNL_ARG_DST, conv_dst);
      e.call.Execute(stream);
      if (e.second.primitive) {
        e.second.SetHandle(DNNL_ARG_SRC, conv_src);
        e.second.SetHandle(DNNL_ARG_DST, conv_dst);
        e.second.Execute(stream);
      }
      if (e.dst_via_scratch) RunReorder(e.from_conv_dst, stream, conv_dst, dst);
      return absl::OkStatus();
    }
    e.call.SetHandle(DNNL_ARG_SRC, src);
    e.call.SetHandle(DNNL_ARG_DST, dst);
    e.call.Execute(stream);
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "executing conv");
  }
  return absl::OkStatus();
}

std::string ConvOnednn::ImplementationName(const Shape& src_shape) const {
  const PerShape* entry = per_shape_.Peek(src_shape);
  if (entry == nullptr) return std::string();
  if (options_.bf16 && !absl::StrContains(entry->impl, "bf16")) return entry->impl + " bf16";
  if (options_.int8.has_value() && !absl::StrContains(entry->impl, "int8")) {
    return entry->impl + " int8";
  }
  return entry->impl;
}

}  // namespace numaserve::kernels
