// Shared plumbing for the oneDNN kernels: error translation (oneDNN's C++
// API throws; nothing thrown may leave kernels/) and a primitive plus its
// bound argument memories, reused across calls of the same shape.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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
// ~100x slower. Decided once, after the dispatch table has applied any
// NUMASERVE_MAX_ISA cap to oneDNN (DNNL_MAX_CPU_ISA is honoured too).
int ActivationChannelBlock();

// "nChw16c" / "nChw8c": the blocked layout's name at rank 4.
const char* BlockedLayoutName();

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
// throws dnnl::error where it has none).
BoundPrimitive BoundReorder(const dnnl::engine& engine, const dnnl::memory::desc& from,
                            const dnnl::memory::desc& to);

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
