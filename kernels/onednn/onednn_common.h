// Shared plumbing for the oneDNN kernels: error translation (oneDNN's C++
// API throws; nothing thrown may leave kernels/) and a primitive plus its
// bound argument memories, reused across calls of the same shape.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/onednn/int8_params.h"
#include "kernels/tensor.h"

namespace numaserve::kernels {

absl::Status DnnlErrorToStatus(const dnnl::error& e, absl::string_view what);

dnnl::memory::dims ToDnnlDims(const Shape& shape);

// A primitive with memory objects for each argument created once with no
// data handle; Execute points them at the caller's buffers and runs.
struct BoundPrimitive {
  dnnl::primitive primitive;
  std::unordered_map<int, dnnl::memory> args;

  void SetHandle(int arg, const void* ptr) { args.at(arg).set_data_handle(const_cast<void*>(ptr)); }
  void Execute(dnnl::stream& stream) { primitive.execute(stream, args); }
  // oneDNN's implementation name ("jit:avx2", "ref:any"); "" when empty.
  std::string ImplementationName() const;
};

// Channels per block of the blocked activation layout (nC[D]HW<block>c) on
// the ISA oneDNN runs here: 16 where it runs AVX-512 (one zmm of floats), 8
// on AVX2 (one ymm). oneDNN has optimized kernels for the block of its own
// tier only: nChw16c on an AVX2-only CPU runs on its reference kernels,
// ~100x slower. Decided once, under the process's ISA cap
// (kernels::SetDispatchOptions; DNNL_MAX_CPU_ISA is honoured too).
int ActivationChannelBlock();

// What a "blocked" activation is, chosen per model: oneDNN's channel-blocked
// layout of the tier (nC[D]HW16c / nC[D]HW8c, ActivationChannelBlock), or
// channels-last (nwc / nhwc / ndhwc), the only layout oneDNN 2.6's INT8
// convs read and write with a jit kernel. Either way the batch is the
// outermost dimension, so a run of rows is one contiguous slice.
enum class BlockedLayout { kChannelBlocked, kChannelsLast };

// "nChw16c" / "nChw8c" / "nhwc": the blocked layout's name at rank 4.
const char* BlockedLayoutName(BlockedLayout layout = BlockedLayout::kChannelBlocked);

// True when an implementation name is a reference implementation: one of
// oneDNN's (impl_info_str "ref:any", a ref_fused_convolution chaining one)
// or numaserve's scalar FP32 reference ("numaserve:reference Conv").
// Correct but unoptimized: never to be chosen silently for heavy work.
bool IsReferenceImplementation(absl::string_view impl);

// A memory object of `md` without a data handle (bound later).
inline dnnl::memory UnboundMemory(const dnnl::memory::desc& md, const dnnl::engine& engine) {
  return dnnl::memory(md, engine, DNNL_MEMORY_NONE);
}

// A reorder from layout `from` to `to`, its memories unbound (oneDNN
// throws dnnl::error where it has none). `attr`: scale and zero-point masks
// (a quantizing reorder); oneDNN 3 takes their values as run-time
// arguments, which the caller adds to the args (DNNL_ARG_ATTR_SCALES |
// DNNL_ARG_DST, ...).
BoundPrimitive BoundReorder(const dnnl::engine& engine, const dnnl::memory::desc& from,
                            const dnnl::memory::desc& to,
                            const dnnl::primitive_attr& attr = dnnl::primitive_attr());

// INT8 (Int8Params) plumbing shared by ConvOnednn and MatMulOnednn.
//
// OK when `params` fits an op with `channels` output channels and
// `weight_count` weights; InvalidArgument naming `who` otherwise.
absl::Status CheckInt8Params(const Int8Params& params, int64_t channels, int64_t weight_count,
                             absl::string_view who);
// q[i] = saturate_0_255(nearbyint(x[i] / scale) + zero_point), rounding
// half to even: ONNX QuantizeLinear (and onnxruntime's MLAS), elementwise
// over any layout. Not a oneDNN reorder: 2.6's adds the zero point before
// rounding (0.5 with zero point 3 gives 4, ONNX 3) and multiplies by the
// reciprocal. SSE2 (the x86-64 baseline), threaded over large inputs.
void QuantizeToU8(const float* x, int64_t n, float scale, int32_t zero_point, uint8_t* q);
// y[i] = (q - zero_point) * scale with q = saturate_lo_hi(nearbyint(x[i] /
// scale) + zero_point): a QuantizeLinear -> DequantizeLinear pair in FP32
// (lo..hi: 0..255 for UINT8, -128..127 for INT8), rounding as
// QuantizeToU8; NaN quantizes to 0, as the engine's QuantizeLinear does.
// x and y may be the same. SSE2, threaded over large inputs.
void FakeQuantize(const float* x, int64_t n, float scale, int32_t zero_point, int32_t lo,
                  int32_t hi, float* y);
// Whether oneDNN's u8 x s8 products are exact at any weight here. With VNNI
// (AVX512_VNNI, AVX-VNNI) they accumulate into int32. Without it (AVX2,
// AVX-512 before Cascade Lake) oneDNN adds each pair of products into int16
// (vpmaddubsw), which saturates once a pair passes 32767 (255 x 127 x 2 is
// 64770); with |w| <= 64 no pair can. Decided once, after the dispatch
// table has applied any ISA cap to oneDNN.
bool OnednnInt8ProductsExact();
// Where OnednnInt8ProductsExact() is false and some |w| > 64: w split into
// hi + lo, both within [-64, 64] (hi = floor(w / 2)), so the op runs as two
// passes whose sum is exact. Returns false (and leaves hi/lo alone) where
// one pass is exact.
bool SplitInt8Weights(const std::vector<int8_t>& weights, std::vector<int8_t>* hi,
                      std::vector<int8_t>* lo);

// The calling thread's scratch for activations converted or reordered on
// their way into a primitive (a conv running channels-last, BF16 inputs),
// grown to at least `bytes` (64-byte aligned); null when it cannot be
// allocated. One per thread: a thread runs one primitive at a time, and a
// model's steps run one after another, so it holds the largest step's
// converted activations, not their sum. Valid until the thread's next call.
char* ThreadScratch(size_t bytes);

// Runs a BoundReorder from `src` into `dst`.
inline void RunReorder(BoundPrimitive& reorder, dnnl::stream& stream, const void* src, void* dst) {
  reorder.SetHandle(DNNL_ARG_FROM, src);
  reorder.SetHandle(DNNL_ARG_TO, dst);
  reorder.Execute(stream);
}

}  // namespace numaserve::kernels
