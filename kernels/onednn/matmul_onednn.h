// Y[M,N] = op(A)[M,K] x W[K,N] (+ bias[N]) (+ sum_scale * Y) (relu) on a
// oneDNN matmul primitive, with the constant weights reordered once, at
// Create, into the layout the primitive prefers (format_tag::any).
//
// M (the batch) varies per call. Measured with oneDNN 2.6.3 (f32 matmul,
// implementation brg:avx512_core; the build host reported an AVX-512 CPU
// without AMX): the preferred packed weights format does NOT depend on M.
// For K x N in {784x1024, 784x256, 256x128, 128x10, 1024x1024} and M in
// {1, 2, 3, 8, 16, 32, 64, 100, 256, 1024} it is always "BA16a64b" (K in
// blocks of 16, N in blocks of 64, both padded), and a primitive created for
// any M with that fixed weights desc picks the same brg:avx512_core
// implementation. So the weights are packed once and primitives are created
// lazily per M, all reading the one packed buffer. Should another library
// version or ISA prefer a different layout for some M, that M falls back to
// its own preferred layout, reordered once from the packed buffer and cached
// with its primitive (UsesFallbackWeights reports it). oneDNN 3.7.2 on a
// Sapphire Rapids keeps it: "BA16a64b" on brg_matmul:avx512_core for M in
// {1, 8, 32, 256} at 784x1024 (plain "ab" on gemm:jit:f32 under the AVX2
// cap), no M falling back.
// Packing pays most for skinny M (2 threads, K=784, N=1024, median of 400):
// M=1 16 us packed vs 44 us plain, M=8 32 vs 58 us, M=32 105 vs 135 us,
// M=256 784 vs 804 us.
//
// With options.bf16 the packed weights are BF16 (converted once, at Create)
// and A is converted to BF16 at each call, through the calling thread's
// scratch (ThreadScratch), into a BF16 x BF16 -> FP32 matmul: Y, the bias
// and the post-ops stay FP32 (oneDNN accumulates in FP32). On the 2-vCPU
// Zen 5 (AVX512_BF16, no AMX) M=32, K=N=1024 ran in 99 us against 191 us
// for FP32 (brg:avx512_core_bf16 against brg:avx512_core).
//
// With options.int8 (Int8Params) the packed weights are s8 (packed once, at
// Create, from int8->weights) and A is quantized to u8 at each call
// (QuantizeToU8: ONNX QuantizeLinear) into the same scratch (then reordered
// to row-major where A is transposed), into a u8 x s8 -> FP32 matmul: oneDNN 3 multiplies the
// int32 accumulator by src_scale * weight_scale[n] * weights_scale (run-time scale arguments), then
// adds the FP32 bias as it is; the sum and the activations follow in FP32. The zero point is
// oneDNN's (a run-time argument too). Measured with 2.6.3: brg:avx512_core_vnni on AVX-512 VNNI,
// gemm:jit under the AVX2 cap, both with a zero point; with 3.7.2 on a Sapphire Rapids:
// brg_matmul:avx10_1_512_amx (brg_matmul:avx10_1_512 for some small M), gemm:jit under the AVX2
// cap. Without VNNI oneDNN's u8 x s8 pairs saturate in int16, so weights beyond [-64, 64] are
// split in two halves, run as two matmuls, the second adding onto the first (exact;
// OnednnInt8ProductsExact).
#pragma once

#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/bounded_cache.h"
#include "kernels/gemm/gemm_options.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels {

// The options every GEMM backend shares (kernels/gemm/gemm_options.h).
using MatMulOnednnOptions = GemmOptions;

class MatMulOnednn {
 public:
  static absl::StatusOr<std::unique_ptr<MatMulOnednn>> Create(const dnnl::engine& engine,
                                                              const MatMulOnednnOptions& options);

  // Creates (once per m) the primitive for m rows. Execute calls it lazily;
  // callers may warm up ahead of time. The primitives of the
  // kShapeCacheCapacity most recently run row counts are kept; another is
  // created again when it comes back.
  absl::Status Prepare(int64_t m);

  // src: [M,K] (or [K,M] if src_transposed); dst: [M,N].
  absl::Status Execute(dnnl::stream& stream, int64_t m, const float* src, float* dst);

  int64_t k() const { return options_.k; }
  int64_t n() const { return options_.n; }
  // Bytes of the packed weights (padded blocks included).
  int64_t packed_weight_bytes() const;
  // oneDNN's implementation name for m rows ("" if not prepared or dropped),
  // followed by " bf16" with options.bf16 where the name does not say so
  // already ("brg:avx512_core_bf16", "brg:avx512_core_amx bf16" on 2.6), and
  // " int8" with options.int8 ("brg_matmul:avx10_1_512_amx int8", "gemm:jit
  // int8" on 3.7).
  std::string ImplementationName(int64_t m) const;
  // True if m needed its own weights layout (see the header comment).
  bool UsesFallbackWeights(int64_t m) const;
  // Row counts whose primitive is kept (at most kShapeCacheCapacity).
  size_t cached_shapes() const { return per_m_.size(); }

 private:
  struct PerM {
    BoundPrimitive call;
    std::string impl;
    dnnl::memory own_weights;  // only when the packed layout did not fit
    // With bf16: A (FP32) into the scratch as BF16. With int8 and
    // src_transposed: the quantized A (u8, [K,M]) into the scratch as [M,K].
    BoundPrimitive to_src;
    size_t src_bytes = 0;  // with bf16 (int8): the converted (quantized) A's bytes
    // INT8 with split weights (no VNNI): the matmul on the low halves, run
    // after `call`, adding onto it; and its own weights where the packed
    // ones did not fit.
    BoundPrimitive second;
    dnnl::memory own_weights_lo;
  };

  MatMulOnednn(const dnnl::engine& engine, MatMulOnednnOptions options)
      : engine_(engine), options_(std::move(options)) {}

  // Which matmuls a primitive computes: all of it, or with split INT8
  // weights the first (bias, accumulate) or second (activations) half.
  enum class Pass { kWhole, kFirst, kSecond };

  absl::Status PackWeights();
  // The packed weights `packed` reordered to `md` once (`packed` itself
  // where it has that layout).
  dnnl::memory WeightsIn(const dnnl::memory& packed, const dnnl::memory::desc& md) const;
  // The primitive for m rows on `packed` (own layout in *own where the
  // packed one has no optimized kernel).
  dnnl::matmul::primitive_desc PrimitiveFor(int64_t m, const dnnl::memory& packed, bool with_bias,
                                            Pass pass, dnnl::memory* own) const;
  // The entry for m, created if absent; valid until the next one is created.
  absl::StatusOr<PerM*> EntryFor(int64_t m);
  // A as the caller passes it (FP32, strided when src_transposed).
  // (In `type`: u8 for A quantized in place, with int8.)
  dnnl::memory::desc UserSrcDesc(int64_t m,
                                 dnnl::memory::data_type type = dnnl::memory::data_type::f32) const;
  // A as the primitive reads it: the caller's, or BF16 (u8) row-major with
  // bf16 (int8).
  dnnl::memory::desc SrcDesc(int64_t m) const;
  dnnl::memory::desc DstDesc(int64_t m) const;
  dnnl::primitive_attr Attr(Pass pass = Pass::kWhole) const;
  // With int8: binds the quantization's run-time arguments (src_scale_,
  // weight_scales_, src_zero_point_) into `call`; nothing otherwise.
  void BindQuantization(BoundPrimitive* call) const;

  dnnl::engine engine_;
  MatMulOnednnOptions options_;
  dnnl::memory packed_weights_;
  dnnl::memory packed_weights_lo_;  // the split INT8 weights' low halves
  dnnl::memory bias_;
  // With int8, oneDNN 3's run-time quantization arguments, shared by every
  // entry's primitives: the src scale (one f32), the weight scales (f32,
  // weight_scales x weights_scale: one per column n or one) and the src zero
  // point (one s32; none when it is 0). They own their buffers, which live
  // as long as any primitive's args hold them.
  dnnl::memory src_scale_, weight_scales_, src_zero_point_;
  // An entry's own_weights (a fallback layout) are bound to its primitive
  // alone and go with it.
  BoundedCache<int64_t, PerM> per_m_{kShapeCacheCapacity};
};

}  // namespace numaserve::kernels
