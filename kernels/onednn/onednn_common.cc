#include "kernels/onednn/onednn_common.h"

#include <emmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/dispatch.h"

namespace numaserve::kernels {

absl::Status DnnlErrorToStatus(const dnnl::error& e, absl::string_view what) {
  const std::string message =
      absl::StrCat(what, ": oneDNN error ", static_cast<int>(e.status), ": ", e.what());
  if (e.status == dnnl_unimplemented) return absl::UnimplementedError(message);
  if (e.status == dnnl_out_of_memory) return absl::ResourceExhaustedError(message);
  if (e.status == dnnl_invalid_arguments) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

dnnl::memory::dims ToDnnlDims(const Shape& shape) {
  return dnnl::memory::dims(shape.begin(), shape.end());
}

std::string BoundPrimitive::ImplementationName() const {
  if (!primitive) return "";
  const char* name = nullptr;
  try {
    if (dnnl_primitive_desc_query(primitive.get_primitive_desc(), dnnl_query_impl_info_str, 0,
                                  static_cast<void*>(&name)) != dnnl_success) {
      return "";
    }
  } catch (const dnnl::error&) {
    return "";
  }
  return name != nullptr ? name : "";
}

BoundPrimitive BoundReorder(const dnnl::engine& engine, const dnnl::memory::desc& from,
                            const dnnl::memory::desc& to, const dnnl::primitive_attr& attr) {
  BoundPrimitive r;
  r.primitive = dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to, attr));
  r.args[DNNL_ARG_FROM] = UnboundMemory(from, engine);
  r.args[DNNL_ARG_TO] = UnboundMemory(to, engine);
  return r;
}

absl::Status CheckInt8Params(const Int8Params& params, int64_t channels, int64_t weight_count,
                             absl::string_view who) {
  auto usable = [](float s) { return std::isfinite(s) && s != 0.0f; };
  if (!usable(params.src_scale) || params.src_zero_point < 0 || params.src_zero_point > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": int8 src_scale must be finite and nonzero (is ", params.src_scale,
                     ") and src_zero_point within 0..255 (is ", params.src_zero_point, ")"));
  }
  const int64_t scales = static_cast<int64_t>(params.weight_scales.size());
  if (scales != 1 && scales != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": int8 weight_scales has ", scales, " values; needs 1 or ", channels));
  }
  for (float s : params.weight_scales) {
    if (!usable(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": int8 weight scale ", s, " is not finite and nonzero"));
    }
  }
  if (static_cast<int64_t>(params.weights.size()) != weight_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": int8 weights has ", params.weights.size(), " values; needs ", weight_count));
  }
  return absl::OkStatus();
}

void QuantizeToU8(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q) {
  // Clamped before the conversion so that cvtps2dq (round half to even
  // under the default MXCSR) never overflows; NaN becomes the lower bound.
  constexpr float kLow = -512.0f, kHigh = 512.0f;
  constexpr int64_t kBlock = 16384;  // elements per thread's turn
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    const __m128 s = _mm_set1_ps(scale), lo = _mm_set1_ps(kLow), hi = _mm_set1_ps(kHigh);
    const __m128i z = _mm_set1_epi32(zero_point);
    auto convert = [&](const float* p) {
      const __m128 v = _mm_min_ps(_mm_max_ps(_mm_div_ps(_mm_loadu_ps(p), s), lo), hi);
      return _mm_add_epi32(_mm_cvtps_epi32(v), z);
    };
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m128i a = _mm_packs_epi32(convert(x + i), convert(x + i + 4));
      const __m128i c = _mm_packs_epi32(convert(x + i + 8), convert(x + i + 12));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm_packus_epi16(a, c));
    }
    for (; i < end; ++i) {
      const __m128 v = _mm_min_ss(_mm_max_ss(_mm_div_ss(_mm_set_ss(x[i]), s), lo), hi);
      const int32_t r = _mm_cvtss_si32(v) + zero_point;
      q[i] = static_cast<uint8_t>(std::clamp(r, 0, 255));
    }
  }
}

void FakeQuantize(const float* x, int64_t n, float scale, int32_t zero_point, int32_t lo,
                  int32_t hi, float* y) {
  constexpr float kLow = -512.0f, kHigh = 512.0f;  // as QuantizeToU8: cvtps2dq never overflows
  constexpr int64_t kBlock = 16384;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    const __m128 s = _mm_set1_ps(scale), low = _mm_set1_ps(kLow), high = _mm_set1_ps(kHigh);
    const __m128 z = _mm_set1_ps(static_cast<float>(zero_point));
    const __m128 qlo = _mm_set1_ps(static_cast<float>(lo)),
                 qhi = _mm_set1_ps(static_cast<float>(hi));
    auto one = [&](__m128 v) {
      const __m128 nan = _mm_cmpunord_ps(v, v);
      const __m128 r = _mm_min_ps(_mm_max_ps(_mm_div_ps(v, s), low), high);
      __m128 q = _mm_add_ps(_mm_cvtepi32_ps(_mm_cvtps_epi32(r)), z);
      q = _mm_min_ps(_mm_max_ps(q, qlo), qhi);
      q = _mm_andnot_ps(nan, q);  // NaN: q = 0
      return _mm_mul_ps(_mm_sub_ps(q, z), s);
    };
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) _mm_storeu_ps(y + i, one(_mm_loadu_ps(x + i)));
    for (; i < end; ++i) _mm_store_ss(y + i, one(_mm_set_ss(x[i])));
  }
}

bool OnednnInt8ProductsExact() {
  static const bool exact = [] {
    GetDispatchDecision();  // no cap is set after this: oneDNN reads its ISA
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    auto has = [isa](dnnl::cpu_isa tier) {
      return (isa & static_cast<unsigned>(tier)) == static_cast<unsigned>(tier);
    };
    return has(dnnl::cpu_isa::avx512_core_vnni) || has(dnnl::cpu_isa::avx2_vnni);
  }();
  return exact;
}

bool SplitInt8Weights(const std::vector<int8_t>& weights, std::vector<int8_t>* hi,
                      std::vector<int8_t>* lo) {
  if (OnednnInt8ProductsExact()) return false;
  bool needed = false;
  for (int8_t w : weights) needed |= w > 64 || w < -64;
  if (!needed) return false;
  hi->resize(weights.size());
  lo->resize(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const int h = weights[i] >= 0 ? weights[i] / 2 : -((1 - weights[i]) / 2);  // floor(w / 2)
    (*hi)[i] = static_cast<int8_t>(h);
    (*lo)[i] = static_cast<int8_t>(weights[i] - h);
  }
  return true;
}

char* ThreadScratch(size_t bytes) {
  thread_local std::unique_ptr<char, void (*)(void*)> buffer{nullptr, &std::free};
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer.reset();
    capacity = 0;
    buffer.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    if (buffer) capacity = bytes;
  }
  return buffer.get();
}

int ActivationChannelBlock() {
  static const int block = [] {
    GetDispatchDecision();  // no cap is set after this: oneDNN reads its ISA
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const unsigned avx512_core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & avx512_core) == avx512_core ? 16 : 8;
  }();
  return block;
}

const char* BlockedLayoutName(BlockedLayout layout) {
  if (layout == BlockedLayout::kChannelsLast) return "nhwc";
  return ActivationChannelBlock() == 16 ? "nChw16c" : "nChw8c";
}

bool IsReferenceImplementation(absl::string_view impl) {
  // oneDNN's ref_fused_convolution chains other primitives (a 1x1 conv and
  // its depthwise post-op: "ref_fused_convolution:any:jit_1x1:avx2:jit_dw:
  // avx2"); it is a reference only where one of them is.
  constexpr absl::string_view kChain = "ref_fused_convolution:any:";
  if (absl::ConsumePrefix(&impl, kChain)) return absl::StrContains(impl, "ref");
  return absl::StartsWith(impl, "ref") || absl::StartsWith(impl, "numaserve:reference");
}

}  // namespace numaserve::kernels
