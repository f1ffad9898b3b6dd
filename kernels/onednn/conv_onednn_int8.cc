// ConvOnednn (conv_onednn.h): the INT8 path. PrepareInt8 and what only it
// uses: the input padded here for oneDNN's grouped int8 convs, the second
// pass of split weights on CPUs without VNNI, and the notes on the
// implementation name. The rest of ConvOnednn is in conv_onednn.cc.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/conv_onednn_internal.h"

namespace numaserve::kernels {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

}  // namespace

ConvOnednn::Int8Padding ConvOnednn::ResolveInt8Padding(const Shape& src_shape, bool split) const {
  const ConvOnednnOptions& o = options_;
  Int8Padding out;
  dnnl::memory::dims& src_dims = out.src_dims;
  dnnl::memory::dims& pads_begin = out.pads_begin;
  dnnl::memory::dims& pads_end = out.pads_end;
  dnnl::memory::dims& pad_offsets = out.pad_offsets;
  src_dims = ToDnnlDims(src_shape);
  pads_begin = ToDnnlDimsMinus(o.pads_begin, 0);
  pads_end = ToDnnlDimsMinus(o.pads_end, 0);
  // oneDNN 2.6's int8 grouped (depthwise) conv, given padding and a sum
  // post-op (a residual, or the second pass of split weights), adds some
  // output rows twice when it splits the rows over many threads: wrong
  // outputs, no error (seen at 8 to 24 threads on 9x9 to 13x13 images).
  // Such a conv gets no padding from oneDNN: the quantized input goes into
  // a larger buffer that holds the zero point (a real 0) around it.
  const bool padded = std::any_of(pads_begin.begin(), pads_begin.end(), [](auto p) { return p; }) ||
                      std::any_of(pads_end.begin(), pads_end.end(), [](auto p) { return p; });
  out.explicit_pad = o.group > 1 && padded && (split || o.sum);
  if (out.explicit_pad) {
    pad_offsets.assign(src_dims.size(), 0);
    for (size_t i = 0; i < pads_begin.size(); ++i) {
      pad_offsets[2 + i] = pads_begin[i];
      src_dims[2 + i] += pads_begin[i] + pads_end[i];
      pads_begin[i] = pads_end[i] = 0;
    }
  }
  return out;
}

void ConvOnednn::AnnotateInt8Entry(const dnnl::convolution_forward::primitive_desc& pd,
                                   const Shape& src_shape, bool src_blocked, const Int8Padding& pad,
                                   int32_t src_zero_point, PerShape* entry) const {
  const bool explicit_pad = pad.explicit_pad;
  const dnnl::memory::dims& src_dims = pad.src_dims;
  if (explicit_pad) {  // Run fills the buffer, then reorders into its interior
    entry->src_pad_fill = src_zero_point;
    entry->src_pad_bytes = pd.src_desc().get_size();
    absl::StrAppend(&entry->impl, " (input padded here)");
  }
  if (!absl::StrContains(entry->impl, "int8")) absl::StrAppend(&entry->impl, " int8");
  // Padding alone (the padded buffer in the caller's layout) is no reorder.
  Shape padded_shape = src_shape;
  for (size_t i = 2; i < padded_shape.size(); ++i) padded_shape[i] = src_dims[i];
  const bool src_reordered =
      entry->src_via_scratch &&
      (!explicit_pad || pd.src_desc() != Act(padded_shape, src_blocked, dt::u8));
  if (src_reordered || entry->dst_via_scratch) {
    absl::StrAppend(&entry->impl, " (reordered: ", src_reordered ? "src" : "",
                    src_reordered && entry->dst_via_scratch ? ", " : "",
                    entry->dst_via_scratch ? "dst" : "", ")");
  }
}

absl::Status ConvOnednn::CreateQuantizationArgs() {
  if (!options_.int8.has_value()) return absl::InternalError("ConvOnednn: no int8 parameters");
  const Int8Params& q = *options_.int8;
  auto values = [&](dt type, const void* data, int64_t n) {
    dnnl::memory m(dnnl::memory::desc({n}, type, tag::a), engine_);
    std::memcpy(m.get_data_handle(), data, m.get_desc().get_size());
    return m;
  };
  try {
    src_scale_ = values(dt::f32, &q.src_scale, 1);
    weight_scales_ =
        values(dt::f32, q.weight_scales.data(), static_cast<int64_t>(q.weight_scales.size()));
    if (q.src_zero_point != 0) src_zero_point_ = values(dt::s32, &q.src_zero_point, 1);
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "allocating int8 conv scales");
  }
  return absl::OkStatus();
}

void ConvOnednn::BindQuantization(BoundPrimitive* call) const {
  call->args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = src_scale_;
  call->args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = weight_scales_;
  if (src_zero_point_) call->args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = src_zero_point_;
}

absl::Status ConvOnednn::BindSecondPass(const dnnl::convolution_forward::primitive_desc& pd2,
                                        PerShape* entry) {
  auto weights = WeightsFor(pd2.weights_desc(), Pass::kSecond);
  if (!weights.ok()) return weights.status();
  entry->second.primitive = dnnl::convolution_forward(pd2);
  entry->second.args[DNNL_ARG_SRC] = UnboundMemory(pd2.src_desc(), engine_);
  entry->second.args[DNNL_ARG_WEIGHTS] = *weights;
  entry->second.args[DNNL_ARG_DST] = UnboundMemory(pd2.dst_desc(), engine_);
  BindQuantization(&entry->second);
  absl::StrAppend(&entry->impl, " (x2: s8 weights split, no VNNI)");
  if (IsReferenceImplementation(pd2.impl_info_str())) entry->impl = pd2.impl_info_str();
  return absl::OkStatus();
}

absl::Status ConvOnednn::PrepareInt8(const Shape& src_shape, const Shape& dst_shape,
                                     bool src_blocked, bool dst_blocked, PerShape* entry) {
  const ConvOnednnOptions& o = options_;
  if (!o.int8.has_value()) return absl::InternalError("ConvOnednn: no int8 parameters");
  const int32_t src_zero_point = o.int8->src_zero_point;
  const bool split = !user_weights_s8_lo_.empty();
  const dnnl::memory::desc any_w(UserWeightsDesc().get_dims(), dt::s8, tag::any);
  const dnnl::memory::desc bias_md = bias_ ? bias_.get_desc() : dnnl::memory::desc();
  const Int8Padding pad = ResolveInt8Padding(src_shape, split);
  const dnnl::memory::dims& src_dims = pad.src_dims;
  const dnnl::memory::dims dst_dims = ToDnnlDims(dst_shape);
  auto make_pd = [&](const dnnl::memory::desc& src_md, const dnnl::memory::desc& bias,
                     const dnnl::memory::desc& dst_md, Pass pass) {
    return dnnl::convolution_forward::primitive_desc(
        engine_, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
        any_w, bias, dst_md, ToDnnlDimsMinus(o.strides, 0), ToDnnlDimsMinus(o.dilations, 1),
        pad.pads_begin, pad.pads_end, Attr(pass));
  };
  try {
    // The u8 src is ours (quantized into the scratch): oneDNN's layout. dst:
    // the caller's where a jit kernel writes it, else oneDNN's, else
    // channels-last (reordered into the caller's).
    // oneDNN's int8 convs (2.6's avx512_core_vnni and avx2, 3.7's brgemm
    // (AMX, VNNI) and jit_uni_int8:avx2 alike) take only channels-last src
    // and dst: blocked or plain ones get ref:any, so with
    // channel-blocked activations the src is quantized, then reordered to
    // nhwc, and the dst goes through the scratch (with a residual,
    // reordered there first); the engine keeps a model with INT8 convs
    // channels-last (BlockedLayout::kChannelsLast) to avoid both.
    const dnnl::memory::desc src_any(src_dims, dt::u8, tag::any);
    const dnnl::memory::desc dst_candidates[] = {
        Act(dst_shape, dst_blocked), dnnl::memory::desc(dst_dims, dt::f32, tag::any),
        ActivationDesc(dst_shape, true, dt::f32, BlockedLayout::kChannelsLast)};
    const Pass first = split ? Pass::kFirst : Pass::kWhole;
    dnnl::convolution_forward::primitive_desc pd;
    for (const dnnl::memory::desc& dst_md : dst_candidates) {
      dnnl::convolution_forward::primitive_desc candidate;
      try {
        candidate = make_pd(src_any, bias_md, dst_md, first);
      } catch (const dnnl::error&) {
        continue;
      }
      if (!pd) pd = candidate;  // a reference, kept should nothing else exist
      if (!IsReferenceImplementation(candidate.impl_info_str())) {
        pd = candidate;
        break;
      }
    }
    if (!pd) {
      return absl::UnimplementedError(absl::StrCat(
          "ConvOnednn ", o.name, ": oneDNN has no int8 conv for input ", ShapeToString(src_shape)));
    }
    if (absl::Status s = BindReordered(pd, src_shape, dst_shape, src_blocked, dst_blocked, entry,
                                       pad.pad_offsets);
        !s.ok()) {
      return s;
    }
    AnnotateInt8Entry(pd, src_shape, src_blocked, pad, src_zero_point, entry);
    if (split) {
      // The same src and dst layouts: both passes read one quantized src
      // and write one dst.
      if (absl::Status s = BindSecondPass(
              make_pd(pd.src_desc(), dnnl::memory::desc(), pd.dst_desc(), Pass::kSecond), entry);
          !s.ok()) {
        return s;
      }
    }
    const size_t caller_u8 = Act(src_shape, src_blocked, dt::u8).get_size();
    entry->quantized_count = static_cast<int64_t>(caller_u8);
    entry->quantized_bytes = Align64(caller_u8);
    entry->scratch_bytes += entry->quantized_bytes;
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(
        e, absl::StrCat("creating int8 conv for input ", ShapeToString(src_shape)));
  }
  return absl::OkStatus();
}

}  // namespace numaserve::kernels
