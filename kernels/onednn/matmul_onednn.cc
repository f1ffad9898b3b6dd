#include "kernels/onednn/matmul_onednn.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace numaserve::kernels {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Any M gives the same packed layout (see the header); this one is
// representative of serving batches.
constexpr int64_t kPackingM = 32;

}  // namespace

absl::StatusOr<std::unique_ptr<MatMulOnednn>> MatMulOnednn::Create(
    const dnnl::engine& engine, const MatMulOnednnOptions& options) {
  if (options.k <= 0 || options.n <= 0 ||
      (options.weights == nullptr && !options.int8.has_value())) {
    return absl::InvalidArgumentError("MatMulOnednn: K, N and weights are required");
  }
  if (options.int8.has_value()) {
    if (options.bf16) {
      return absl::InvalidArgumentError("MatMulOnednn: int8 and bf16 are exclusive");
    }
    if (absl::Status s =
            CheckInt8Params(*options.int8, options.n, options.k * options.n, "MatMulOnednn");
        !s.ok()) {
      return s;
    }
    if (!std::isfinite(options.weights_scale) || options.weights_scale == 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MatMulOnednn: int8 needs a finite nonzero weights_scale, not ", options.weights_scale));
    }
  }
  if (!options.bias.empty() && static_cast<int64_t>(options.bias.size()) != options.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMulOnednn: bias has ", options.bias.size(), " values, N is ", options.n));
  }
  std::unique_ptr<MatMulOnednn> mm(new MatMulOnednn(engine, options));
  absl::Status status = mm->PackWeights();
  MatMulOnednnOptions& kept = mm->options_;
  kept.weights = nullptr;  // only read while packing
  if (kept.int8.has_value()) kept.int8->weights = std::vector<int8_t>();
  if (!status.ok()) return status;
  return mm;
}

dnnl::memory::desc MatMulOnednn::UserSrcDesc(int64_t m, dt type) const {
  if (options_.src_transposed) {
    return dnnl::memory::desc({m, options_.k}, type, dnnl::memory::dims{1, m});
  }
  return dnnl::memory::desc({m, options_.k}, type, tag::ab);
}

dnnl::memory::desc MatMulOnednn::SrcDesc(int64_t m) const {
  if (options_.bf16) return dnnl::memory::desc({m, options_.k}, dt::bf16, tag::ab);
  if (options_.int8.has_value()) return dnnl::memory::desc({m, options_.k}, dt::u8, tag::ab);
  return UserSrcDesc(m);
}

dnnl::memory::desc MatMulOnednn::DstDesc(int64_t m) const {
  return dnnl::memory::desc({m, options_.n}, dt::f32, tag::ab);
}

dnnl::primitive_attr MatMulOnednn::Attr(Pass pass) const {
  dnnl::post_ops ops;
  if (pass == Pass::kSecond) {
    ops.append_sum(1.0f);  // onto the first pass's output
  } else if (options_.accumulate) {
    ops.append_sum(options_.sum_scale);
  }
  if (pass != Pass::kFirst) {
    if (options_.relu) ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    if (options_.gelu_erf) ops.append_eltwise(dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  if (options_.int8.has_value()) {
    // The values are run-time arguments (BindQuantization).
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    // Per column n of W[K,N] (weights dim 1), or one for all.
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, options_.int8->weight_scales.size() == 1 ? 0 : 1 << 1);
    if (options_.int8->src_zero_point != 0) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  }
  return attr;
}

absl::Status MatMulOnednn::PackWeights() {
  const int64_t k = options_.k, n = options_.n;
  if (options_.int8.has_value()) {
    const Int8Params& q = *options_.int8;
    std::vector<int8_t> hi, lo;
    const bool split = SplitInt8Weights(q.weights, &hi, &lo);
    // oneDNN 3 adds the bias after scaling the accumulator: the FP32 bias
    // as it is.
    const std::vector<float>& bias = options_.bias;
    // weights_scale scales W: folded into the weight scales.
    std::vector<float> weight_scales = q.weight_scales;
    for (float& s : weight_scales) s *= options_.weights_scale;
    try {
      auto values = [&](dt type, const void* data, int64_t count) {
        dnnl::memory m(dnnl::memory::desc({count}, type, tag::a), engine_);
        std::memcpy(m.get_data_handle(), data, m.get_desc().get_size());
        return m;
      };
      src_scale_ = values(dt::f32, &q.src_scale, 1);
      weight_scales_ =
          values(dt::f32, weight_scales.data(), static_cast<int64_t>(weight_scales.size()));
      if (q.src_zero_point != 0) src_zero_point_ = values(dt::s32, &q.src_zero_point, 1);
      dnnl::memory::desc user_md({k, n}, dt::s8, options_.weights_transposed ? tag::ba : tag::ab);
      dnnl::memory::desc bias_md({1, n}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc pd(
          engine_, SrcDesc(kPackingM), dnnl::memory::desc({k, n}, dt::s8, tag::any),
          bias.empty() ? dnnl::memory::desc() : bias_md, DstDesc(kPackingM),
          Attr(split ? Pass::kFirst : Pass::kWhole));
      dnnl::stream stream(engine_);
      auto pack = [&](const std::vector<int8_t>& w, const dnnl::memory::desc& md) {
        dnnl::memory packed(md, engine_);
        dnnl::memory user(user_md, engine_, const_cast<int8_t*>(w.data()));
        dnnl::reorder(user, packed).execute(stream, user, packed);
        stream.wait();
        return packed;
      };
      packed_weights_ = pack(split ? hi : q.weights, pd.weights_desc());
      if (split) {
        dnnl::matmul::primitive_desc pd2(engine_, SrcDesc(kPackingM),
                                         dnnl::memory::desc({k, n}, dt::s8, tag::any),
                                         DstDesc(kPackingM), Attr(Pass::kSecond));
        packed_weights_lo_ = pack(lo, pd2.weights_desc());
      }
      if (!bias.empty()) {
        bias_ = dnnl::memory(bias_md, engine_);
        std::memcpy(bias_.get_data_handle(), bias.data(), n * sizeof(float));
      }
    } catch (const dnnl::error& e) {
      return DnnlErrorToStatus(e, absl::StrCat("packing ", k, "x", n, " int8 matmul weights"));
    }
    return absl::OkStatus();
  }
  std::vector<float> scaled;
  const float* weights = options_.weights;
  if (options_.weights_scale != 1.0f) {
    scaled.assign(weights, weights + k * n);
    for (float& w : scaled) w *= options_.weights_scale;
    weights = scaled.data();
  }
  try {
    dnnl::memory::desc user_md({k, n}, dt::f32, options_.weights_transposed ? tag::ba : tag::ab);
    dnnl::memory::desc any_md({k, n}, options_.bf16 ? dt::bf16 : dt::f32, tag::any);
    dnnl::memory::desc bias_md({1, n}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(engine_, SrcDesc(kPackingM), any_md,
                                    options_.bias.empty() ? dnnl::memory::desc() : bias_md,
                                    DstDesc(kPackingM), Attr());
    packed_weights_ = dnnl::memory(pd.weights_desc(), engine_);
    dnnl::memory user(user_md, engine_, const_cast<float*>(weights));
    dnnl::stream stream(engine_);
    dnnl::reorder(user, packed_weights_).execute(stream, user, packed_weights_);
    stream.wait();
    if (!options_.bias.empty()) {
      bias_ = dnnl::memory(bias_md, engine_);
      std::memcpy(bias_.get_data_handle(), options_.bias.data(), n * sizeof(float));
    }
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, absl::StrCat("packing ", k, "x", n, " matmul weights"));
  }
  return absl::OkStatus();
}

void MatMulOnednn::BindQuantization(BoundPrimitive* call) const {
  if (!src_scale_) return;  // not int8
  call->args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = src_scale_;
  call->args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = weight_scales_;
  if (src_zero_point_) call->args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = src_zero_point_;
}

absl::Status MatMulOnednn::Prepare(int64_t m) { return EntryFor(m).status(); }

dnnl::memory MatMulOnednn::WeightsIn(const dnnl::memory& packed,
                                     const dnnl::memory::desc& md) const {
  if (packed.get_desc() == md) return packed;
  dnnl::memory from = packed, own(md, engine_);  // handles: execute takes them mutable
  dnnl::stream stream(engine_);
  dnnl::reorder(from, own).execute(stream, from, own);
  stream.wait();
  return own;
}

dnnl::matmul::primitive_desc MatMulOnednn::PrimitiveFor(int64_t m, const dnnl::memory& packed,
                                                        bool with_bias, Pass pass,
                                                        dnnl::memory* own) const {
  const dnnl::memory::desc bias_md = with_bias ? bias_.get_desc() : dnnl::memory::desc();
  const dnnl::memory::desc packed_md = packed.get_desc();
  // A kernel on the packed layout for this m, else (none, or a reference)
  // the layout of its own below.
  auto on_packed = [&]() -> std::optional<dnnl::matmul::primitive_desc> {
    try {
      dnnl::matmul::primitive_desc pd(engine_, SrcDesc(m), packed_md, bias_md, DstDesc(m),
                                      Attr(pass));
      if (absl::StartsWith(pd.impl_info_str(), "ref")) return std::nullopt;
      return pd;
    } catch (const dnnl::error&) {
      return std::nullopt;
    }
  };
  if (std::optional<dnnl::matmul::primitive_desc> pd = on_packed(); pd.has_value()) return *pd;
  dnnl::memory::desc any_md({options_.k, options_.n}, packed_md.get_data_type(), tag::any);
  dnnl::matmul::primitive_desc pd(engine_, SrcDesc(m), any_md, bias_md, DstDesc(m), Attr(pass));
  if (pd.weights_desc() != packed_md) *own = WeightsIn(packed, pd.weights_desc());
  return pd;
}

absl::StatusOr<MatMulOnednn::PerM*> MatMulOnednn::EntryFor(int64_t m) {
  if (PerM* found = per_m_.Find(m)) return found;
  if (m <= 0) return absl::InvalidArgumentError(absl::StrCat("MatMulOnednn: M = ", m));
  const bool split = static_cast<bool>(packed_weights_lo_);
  PerM entry;
  try {
    dnnl::matmul::primitive_desc pd =
        PrimitiveFor(m, packed_weights_, static_cast<bool>(bias_),
                     split ? Pass::kFirst : Pass::kWhole, &entry.own_weights);
    entry.impl = pd.impl_info_str();
    if (options_.bf16) {
      if (!absl::StrContains(entry.impl, "bf16")) absl::StrAppend(&entry.impl, " bf16");
      entry.to_src = BoundReorder(engine_, UserSrcDesc(m), pd.src_desc());
      entry.src_bytes = pd.src_desc().get_size();
    }
    if (options_.int8.has_value()) {
      if (!absl::StrContains(entry.impl, "int8")) absl::StrAppend(&entry.impl, " int8");
      if (options_.src_transposed) {
        entry.to_src = BoundReorder(engine_, UserSrcDesc(m, dt::u8), pd.src_desc());
      }
      entry.src_bytes = pd.src_desc().get_size();
    }
    entry.call.primitive = dnnl::matmul(pd);
    entry.call.args[DNNL_ARG_SRC] = UnboundMemory(pd.src_desc(), engine_);
    entry.call.args[DNNL_ARG_WEIGHTS] = entry.own_weights ? entry.own_weights : packed_weights_;
    entry.call.args[DNNL_ARG_DST] = UnboundMemory(pd.dst_desc(), engine_);
    if (bias_) entry.call.args[DNNL_ARG_BIAS] = bias_;
    BindQuantization(&entry.call);
    if (split) {
      dnnl::matmul::primitive_desc pd2 =
          PrimitiveFor(m, packed_weights_lo_, false, Pass::kSecond, &entry.own_weights_lo);
      entry.second.primitive = dnnl::matmul(pd2);
      entry.second.args[DNNL_ARG_SRC] = UnboundMemory(pd2.src_desc(), engine_);
      entry.second.args[DNNL_ARG_WEIGHTS] =
          entry.own_weights_lo ? entry.own_weights_lo : packed_weights_lo_;
      entry.second.args[DNNL_ARG_DST] = UnboundMemory(pd2.dst_desc(), engine_);
      BindQuantization(&entry.second);
      entry.impl = absl::StrCat(
          absl::StartsWith(pd2.impl_info_str(), "ref") ? pd2.impl_info_str() : entry.impl,
          " (x2: s8 weights split, no VNNI)");
    }
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(
        e, absl::StrCat("creating matmul M=", m, " K=", options_.k, " N=", options_.n));
  }
  return &per_m_.Emplace(m, std::move(entry));
}

absl::Status MatMulOnednn::Execute(dnnl::stream& stream, int64_t m, const float* src, float* dst) {
  absl::StatusOr<PerM*> entry = EntryFor(m);
  if (!entry.ok()) return entry.status();
  BoundPrimitive& call = (*entry)->call;
  try {
    if (options_.bf16 || options_.int8.has_value()) {
      // int8: A quantized as it comes, then (transposed) reordered after it.
      const size_t quantized = (*entry)->src_bytes / 64 * 64 + 64;
      const size_t bytes = options_.bf16                ? (*entry)->src_bytes
                           : (*entry)->to_src.primitive ? quantized + (*entry)->src_bytes
                                                        : (*entry)->src_bytes;
      char* converted = ThreadScratch(bytes);
      if (converted == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("MatMulOnednn: cannot allocate ", bytes,
                                                         " bytes for ",
                                                         options_.bf16 ? "BF16" : "u8", " A"));
      }
      if (options_.int8.has_value()) {
        const Int8Params& q = *options_.int8;
        QuantizeToU8(src, m * options_.k, q.src_scale, q.src_zero_point,
                     reinterpret_cast<uint8_t*>(converted));
        if ((*entry)->to_src.primitive) {
          RunReorder((*entry)->to_src, stream, converted, converted + quantized);
          converted += quantized;
        }
      } else {
        RunReorder((*entry)->to_src, stream, src, converted);
      }
      src = reinterpret_cast<const float*>(converted);
    }
    call.SetHandle(DNNL_ARG_SRC, src);
    call.SetHandle(DNNL_ARG_DST, dst);
    call.Execute(stream);
    if (BoundPrimitive& second = (*entry)->second; second.primitive) {
      second.SetHandle(DNNL_ARG_SRC, src);
      second.SetHandle(DNNL_ARG_DST, dst);
      second.Execute(stream);
    }
  } catch (const dnnl::error& e) {
    return DnnlErrorToStatus(e, "executing matmul");
  }
  return absl::OkStatus();
}

int64_t MatMulOnednn::packed_weight_bytes() const {
  return packed_weights_ ? static_cast<int64_t>(packed_weights_.get_desc().get_size()) : 0;
}

std::string MatMulOnednn::ImplementationName(int64_t m) const {
  const PerM* entry = per_m_.Peek(m);
  return entry == nullptr ? std::string() : entry->impl;
}

bool MatMulOnednn::UsesFallbackWeights(int64_t m) const {
  const PerM* entry = per_m_.Peek(m);
  return entry != nullptr && static_cast<bool>(entry->own_weights);
}

}  // namespace numaserve::kernels
