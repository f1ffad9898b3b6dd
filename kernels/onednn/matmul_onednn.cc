#include "kernels/onednn/matmul_onednn.h"

#include <cstring>

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
  if (options.k <= 0 || options.n <= 0 || options.weights == nullptr) {
    return absl::InvalidArgumentError("MatMulOnednn: K, N and weights are required");
  }
  if (!options.bias.empty() && static_cast<int64_t>(options.bias.size()) != options.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("MatMulOnednn: bias has ", options.bias.size(), " values, N is ", options.n));
  }
  std::unique_ptr<MatMulOnednn> mm(new MatMulOnednn(engine, options));
  absl::Status status = mm->PackWeights();
  mm->options_.weights = nullptr;  // only read while packing
  if (!status.ok()) return status;
  return mm;
}

dnnl::memory::desc MatMulOnednn::UserSrcDesc(int64_t m) const {
  if (options_.src_transposed) {
    return dnnl::memory::desc({m, options_.k}, dt::f32, dnnl::memory::dims{1, m});
  }
  return dnnl::memory::desc({m, options_.k}, dt::f32, tag::ab);
}

dnnl::memory::desc MatMulOnednn::SrcDesc(int64_t m) const {
  if (options_.bf16) return dnnl::memory::desc({m, options_.k}, dt::bf16, tag::ab);
  return UserSrcDesc(m);
}

dnnl::memory::desc MatMulOnednn::DstDesc(int64_t m) const {
  return dnnl::memory::desc({m, options_.n}, dt::f32, tag::ab);
}

dnnl::primitive_attr MatMulOnednn::Attr() const {
  dnnl::post_ops ops;
  if (options_.accumulate) ops.append_sum(options_.sum_scale);
  if (options_.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (options_.gelu_erf) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  return attr;
}

absl::Status MatMulOnednn::PackWeights() {
  const int64_t k = options_.k, n = options_.n;
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
    dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(SrcDesc(kPackingM), any_md,
                           options_.bias.empty() ? dnnl::memory::desc() : bias_md,
                           DstDesc(kPackingM)),
        Attr(), engine_);
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

absl::Status MatMulOnednn::Prepare(int64_t m) { return EntryFor(m).status(); }

absl::StatusOr<MatMulOnednn::PerM*> MatMulOnednn::EntryFor(int64_t m) {
  if (PerM* found = per_m_.Find(m)) return found;
  if (m <= 0) return absl::InvalidArgumentError(absl::StrCat("MatMulOnednn: M = ", m));
  const dnnl::memory::desc bias_md = bias_ ? bias_.get_desc() : dnnl::memory::desc();
  PerM entry;
  try {
    const dnnl::memory::desc packed_md = packed_weights_.get_desc();
    dnnl::matmul::primitive_desc pd;
    bool fits = false;
    try {
      pd = dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(SrcDesc(m), packed_md, bias_md, DstDesc(m)), Attr(), engine_);
      fits = !absl::StartsWith(pd.impl_info_str(), "ref");
    } catch (const dnnl::error&) {
      fits = false;
    }
    dnnl::memory weights = packed_weights_;
    if (!fits) {
      dnnl::memory::desc any_md({options_.k, options_.n}, packed_md.data_type(), tag::any);
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(SrcDesc(m), any_md, bias_md, DstDesc(m)),
                                        Attr(), engine_);
      if (pd.weights_desc() != packed_md) {
        entry.own_weights = dnnl::memory(pd.weights_desc(), engine_);
        dnnl::stream stream(engine_);
        dnnl::reorder(packed_weights_, entry.own_weights)
            .execute(stream, packed_weights_, entry.own_weights);
        stream.wait();
        weights = entry.own_weights;
      }
    }
    entry.impl = pd.impl_info_str();
    if (options_.bf16) {
      if (!absl::StrContains(entry.impl, "bf16")) absl::StrAppend(&entry.impl, " bf16");
      entry.to_src = BoundReorder(engine_, UserSrcDesc(m), pd.src_desc());
      entry.src_bytes = pd.src_desc().get_size();
    }
    entry.call.primitive = dnnl::matmul(pd);
    entry.call.args[DNNL_ARG_SRC] = UnboundMemory(pd.src_desc(), engine_);
    entry.call.args[DNNL_ARG_WEIGHTS] = weights;
    entry.call.args[DNNL_ARG_DST] = UnboundMemory(pd.dst_desc(), engine_);
    if (bias_) entry.call.args[DNNL_ARG_BIAS] = bias_;
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
    if (options_.bf16) {
      char* converted = ThreadScratch((*entry)->src_bytes);
      if (converted == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("MatMulOnednn: cannot allocate ",
                                                         (*entry)->src_bytes, " bytes for BF16 A"));
      }
      RunReorder((*entry)->to_src, stream, src, converted);
      src = reinterpret_cast<const float*>(converted);
    }
    call.SetHandle(DNNL_ARG_SRC, src);
    call.SetHandle(DNNL_ARG_DST, dst);
    call.Execute(stream);
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
