// ONNX Conv on oneDNN's convolution_forward with the constant weights
// reordered once into the layout the primitive prefers, an optional bias,
// and post-ops: a sum (a residual Add: dst holds the addend on entry) and
// element-wise activations (Relu, Clip, LeakyRelu, Sigmoid, Tanh, ...).
// Activations are plain NC[D]HW or channel-blocked nC[D]HW16c on AVX-512,
// nC[D]HW8c on AVX2 (ActivationDesc, ActivationChannelBlock),
// chosen by the caller per tensor; weights are "any".
// Primitives are created per input shape (batch) and cached, the
// kShapeCacheCapacity most recently run shapes kept; the packed weights are
// shared by every shape that prefers the same layout.
// Strided 3x3 convs between blocked activations may run channels-last
// (nhwc) on oneDNN's brgemm kernels instead, with the activations reordered
// at the boundary through a scratch buffer of the calling thread, shared by
// every conv that thread runs (see ConvChannelsLast).
// A reference implementation is never taken silently: where oneDNN offers
// only its reference kernel for the caller's layouts (a grouped conv whose
// groups are not whole channel blocks, a blocked input of 3 channels), the
// conv runs in the layouts oneDNN prefers for it, or plain (im2col + its
// GEMM), through the same reordering scratch, and says so on stderr.
// With options.bf16 the weights are packed as BF16 once and the input is
// converted to BF16 (in the conv's layout) through the same scratch before
// each run; the conv accumulates in FP32 and writes FP32 (bias, sum and
// eltwise post-ops in FP32), so the activations between steps stay FP32.
// With options.int8 (Int8Params) the weights are packed as s8 once and the
// FP32 input is quantized to u8 (QuantizeToU8: ONNX QuantizeLinear) into the
// same scratch, in the caller's layout, then reordered (u8 to u8) into the
// layout oneDNN's int8 conv prefers (nhwc on oneDNN 2.6 and 3.7: their
// plain-NCHW and channel-blocked u8 convs are references); the conv writes
// FP32 in the caller's layout where oneDNN has a jit kernel for it (reordered
// from its own otherwise). With options.blocked_layout channels-last (the
// engine's choice for a model with INT8 convs) neither reorder happens.
// Scaling: oneDNN 3 multiplies the int32 accumulator by src_scale *
// weight_scale[c] (run-time scale arguments), then adds the FP32 bias as it
// is; the sum (residual) and eltwise post-ops come after, in FP32. The source
// zero point is oneDNN's own (a run-time argument too; its jit kernels
// subtract it with padding compensation, so padded borders are exact;
// measured: a jit kernel with a zero point on AMX, AVX-512 VNNI and the AVX2
// cap). On an ISA without VNNI (the AVX2 cap) oneDNN's u8 x s8 products
// saturate in int16 pairs, so weights beyond [-64, 64] are split into two
// halves run as two convs into the same dst, the second adding onto the first
// (exact, twice the work; OnednnInt8ProductsExact). Refused with int8: bf16,
// a transposed conv (ConvTranspose) and a depthwise post-op (dw); winograd is
// ignored (direct), and so is channels_last (int8 picks its layouts).
#pragma once

#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/bounded_cache.h"
#include "kernels/cpu/winograd.h"
#include "kernels/onednn/int8_params.h"
#include "kernels/onednn/onednn_common.h"

namespace numaserve::kernels {

// The blocked layout `layout` for an [N, C, spatial...] tensor of rank 3 to
// 5 (channel-blocked: C padded to the block, 16 on AVX-512, 8 on AVX2;
// channels-last: nwc, nhwc, ndhwc); plain row-major when `blocked` is
// false. `type`: the elements' (BF16 for a conv's converted input).
dnnl::memory::desc ActivationDesc(const Shape& shape, bool blocked,
                                  dnnl::memory::data_type type = dnnl::memory::data_type::f32,
                                  BlockedLayout layout = BlockedLayout::kChannelBlocked);

// Bytes of an activation in that layout.
int64_t ActivationBytes(const Shape& shape, bool blocked,
                        BlockedLayout layout = BlockedLayout::kChannelBlocked);

// Copies an activation between layouts (plain <-> blocked, or a plain copy
// when both are the same), one reorder primitive per shape (the
// kShapeCacheCapacity most recent kept).
class ActivationReorder {
 public:
  explicit ActivationReorder(const dnnl::engine& engine,
                             BlockedLayout layout = BlockedLayout::kChannelBlocked)
      : engine_(engine), layout_(layout) {}
  absl::Status Execute(dnnl::stream& stream, const Shape& shape, const float* src, bool src_blocked,
                       float* dst, bool dst_blocked);
  // Shapes (with their layouts) whose reorder is kept.
  size_t cached_shapes() const { return per_shape_.size(); }

 private:
  dnnl::engine engine_;
  BlockedLayout layout_;
  BoundedCache<std::tuple<Shape, bool, bool>, BoundPrimitive> per_shape_{kShapeCacheCapacity};
};

struct EltwisePostOp {
  dnnl::algorithm algorithm = dnnl::algorithm::eltwise_relu;
  float alpha = 0.0f;
  float beta = 0.0f;
};

// Whether `next` may follow `chain` in one conv's post-ops. oneDNN 2.6's
// jit convolutions run every eltwise post-op of one algorithm with the
// parameters of the first (seen on jit_1x1:avx512_core: clip_v2(-2, 2)
// then clip_v2(-1, 1) clipped to [-2, 2] twice; linear(1/s) then
// linear(s) scaled by 1/s twice), so an algorithm may repeat only with the
// same alpha and beta. (oneDNN 3.7's jit_1x1:avx512_core was seen running
// both chains right; the restriction stays, as it costs little.)
bool CanAppendEltwise(const std::vector<EltwisePostOp>& chain, const EltwisePostOp& next);

// A depthwise 3x3 conv (pad 1) fused after a 1x1 conv as oneDNN's
// depthwise post-op: the 1x1 output stays in cache and only the depthwise
// output is written.
struct DepthwisePostOp {
  std::vector<float> weights;          // [C, 1, 3, 3] row-major
  std::vector<float> bias;             // C values
  int64_t stride = 1;                  // 1 or 2 (both spatial dims)
  std::vector<EltwisePostOp> eltwise;  // after the depthwise conv, in order
};

// When a conv whose caller asked for blocked src and dst runs channels-last
// (src reordered to nhwc, oneDNN's brgemm conv, dst reordered back). On
// AVX-512 oneDNN's brgemm convs take only nhwc activations, and for 3x3
// stride-2 convs they beat the blocked direct kernel by more than the two
// reorders cost where the output is small or the batch large (ResNet-50's
// three at batch 32: 1.1-1.6x; the 7x7-output one at batch 1: 1.15x); at
// batch 1 on larger outputs both are even. 1x1 stride-2 convs lose (the
// blocked 1x1 kernel is as fast). The brgemm kernel must exist for the
// shape, else the blocked one runs.
enum class ConvChannelsLast {
  kAuto,    // 2D 3x3, stride 2, group 1, no sum or depthwise post-op, blocked
            // src and dst, and an output of at most 8x8, at most 14x14 at
            // batch >= 2, or batch x output pixels >= 16384
  kNever,   // always the layouts the caller gave
  kAlways,  // whenever the conv is 2D, group 1, no sum or depthwise post-op,
            // with blocked src and dst (tests, benchmarks)
};

struct ConvOnednnOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t group = 1;
  std::vector<int64_t> kernel;      // spatial extents (1 to 3 dims)
  std::vector<int64_t> strides;     // per spatial dim
  std::vector<int64_t> dilations;   // ONNX convention (1 = dense)
  std::vector<int64_t> pads_begin;  // per spatial dim
  std::vector<int64_t> pads_end;    // per spatial dim
  // [M, C/group, k...] row-major ([C, M/group, k...] when transposed); read
  // only during Create.
  const float* weights = nullptr;
  // ConvTranspose on oneDNN's deconvolution: pads_begin/pads_end are the
  // crops of the output (the caller derives pads_end from the output shape).
  bool transposed = false;
  std::vector<float> bias;  // empty or M values
  bool sum = false;         // dst += conv (dst holds the addend on entry)
  // Winograd F(4x4, 3x3) for 3x3, stride-1, undilated, ungrouped convs
  // between blocked activations: oneDNN's convolution_winograd where it
  // has it (2.6 had it on AVX-512; 3.7 has no CPU Winograd, so there the
  // AVX-512 tier runs direct); on the AVX2 tier numaserve's own
  // (kernels/cpu/winograd.h) where the channels are multiples of 8, the
  // post-ops are none, ReLU and/or a fake-quantize (linear(1/s), round,
  // clip, pow(s, 1): a folded QDQ pair) and there are enough tiles
  // (OwnWinogradFits); direct convolution otherwise. 2.25-4x fewer FLOPs
  // for those layers, slightly different rounding.
  bool winograd = false;
  std::vector<EltwisePostOp> eltwise;  // applied after the sum, in order
  // With a 1x1, stride 1, unpadded 2D conv only: the depthwise conv that
  // follows (Prepare/Execute then take the depthwise output's shape).
  std::optional<DepthwisePostOp> dw;
  ConvChannelsLast channels_last = ConvChannelsLast::kAuto;
  // What the caller's blocked src and dst are (channels-last: the
  // channels_last choice above has nothing left to do).
  BlockedLayout blocked_layout = BlockedLayout::kChannelBlocked;
  // BF16 compute with FP32 accumulation (a model's precision "bf16"): BF16
  // weights and input, FP32 output; where kernels::GetBf16Support() says
  // oneDNN has native BF16 kernels. Winograd has no BF16 kernel (direct
  // runs); with a depthwise post-op the 1x1 output (kept in cache) is BF16
  // too, and so are the depthwise weights.
  bool bf16 = false;
  // INT8 compute (u8 input, s8 weights, int32 accumulation, FP32 output;
  // see the header comment): int8->weights in the layout of `weights`,
  // weight_scales per output channel M or one. Kept for the life of the
  // conv (moved out of options(): empty there after Create). Not with bf16,
  // transposed or dw.
  std::optional<Int8Params> int8 = std::nullopt;
  // For messages: the graph nodes the conv stands for ("conv_2+bn_7").
  std::string name = "conv";
  // Say on stderr when oneDNN offers only a reference kernel (off for
  // trial convs whose plan is dropped when it does).
  bool log_reference = true;
};

class ConvOnednn {
 public:
  static absl::StatusOr<std::unique_ptr<ConvOnednn>> Create(const dnnl::engine& engine,
                                                            ConvOnednnOptions options);

  // Creates (once per input shape) the primitive; dst_shape is the ONNX
  // output shape. *_blocked selects the blocked layout instead of plain NC[D]HW.
  absl::Status Prepare(const Shape& src_shape, const Shape& dst_shape, bool src_blocked = false,
                       bool dst_blocked = false);
  // Runs in the layouts the shape was prepared in. A shape not prepared, or
  // dropped since (only the kShapeCacheCapacity most recently run are
  // kept), is prepared first in the layouts of the latest Prepare (plain
  // before any): a conv's layouts are chosen once for all its shapes.
  absl::Status Execute(dnnl::stream& stream, const Shape& src_shape, const Shape& dst_shape,
                       const float* src, float* dst);

  // oneDNN's implementation for the input shape ("" if not prepared or
  // dropped), with " bf16" (" int8") after it for a BF16 (INT8) conv whose
  // name does not say so already.
  std::string ImplementationName(const Shape& src_shape) const;
  // Input shapes whose primitive is kept (at most kShapeCacheCapacity).
  size_t cached_shapes() const { return per_shape_.size(); }
  // The options (weights no longer readable: null after Create).
  const ConvOnednnOptions& options() const { return options_; }

 private:
  struct PerShape {
    BoundPrimitive call;
    std::string impl;
    // src reordered (channels-last, away from a reference kernel) or
    // converted (BF16) into the thread's scratch (ThreadScratch, from offset
    // 0) before the conv.
    bool src_via_scratch = false;
    // The conv writes its own layout into the scratch at dst_offset
    // (holding the residual first, with a sum post-op), reordered into dst.
    bool dst_via_scratch = false;
    BoundPrimitive to_conv_src, to_conv_dst, from_conv_dst;
    // INT8 with the padding done here (see PrepareInt8): the src buffer's
    // bytes, set to this value (the zero point) before to_conv_src writes
    // its interior; -1: oneDNN pads.
    int src_pad_fill = -1;
    size_t src_pad_bytes = 0;
    // INT8 with split weights (no VNNI): the conv on the low halves, run
    // after `call` on the same src and dst, adding onto it.
    BoundPrimitive second;
    // numaserve's own AVX2 Winograd instead of a primitive (no scratch).
    bool own_winograd = false;
    cpu::WinogradConvShape winograd_shape;
    size_t dst_offset = 0;     // bytes, 64-byte aligned
    size_t scratch_bytes = 0;  // src and dst together (and the quantized input)
    // With int8: the input quantized in the caller's layout, at the
    // scratch's start; the reordered src and dst above follow it (their
    // offsets count from its end).
    size_t quantized_bytes = 0;
    int64_t quantized_count = 0;  // elements (a blocked layout's padding too)
  };
  ConvOnednn(const dnnl::engine& engine, ConvOnednnOptions options)
      : engine_(engine), options_(std::move(options)) {}

  // Which convs a primitive computes: all of it, or with split INT8
  // weights the first (bias, residual) or second (activations) half.
  enum class Pass { kWhole, kFirst, kSecond };

  // The user weights' layout, of `type` (s8 for int8).
  dnnl::memory::desc UserWeightsDesc(
      dnnl::memory::data_type type = dnnl::memory::data_type::f32) const;
  dnnl::primitive_attr Attr(Pass pass = Pass::kWhole) const;
  // The INT8 conv in the layouts oneDNN prefers for it (src always
  // quantized through the scratch), dst in the caller's layout where a jit
  // kernel takes it.
  absl::Status PrepareInt8(const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                           bool dst_blocked, PerShape* entry);
  // An INT8 conv's src extents and padding: oneDNN's, or (see
  // ResolveInt8Padding) none for oneDNN, the input placed at pad_offsets in
  // a buffer padded here.
  struct Int8Padding {
    dnnl::memory::dims src_dims;              // the src the conv reads (padded here or not)
    dnnl::memory::dims pads_begin, pads_end;  // oneDNN's (zeros when padded here)
    dnnl::memory::dims pad_offsets;           // empty unless padded here
    bool explicit_pad = false;                // padded here
  };
  // PrepareInt8's padding for `src_shape` (split: the weights are split).
  Int8Padding ResolveInt8Padding(const Shape& src_shape, bool split) const;
  // After BindReordered for the INT8 `pd`: the explicit padding's fill, and
  // what runs around the kernel (padding, int8, reorders) in entry->impl.
  void AnnotateInt8Entry(const dnnl::convolution_forward::primitive_desc& pd,
                         const Shape& src_shape, bool src_blocked, const Int8Padding& pad,
                         int32_t src_zero_point, PerShape* entry) const;
  // Binds `pd2`, the second pass of split INT8 weights, into entry->second.
  absl::Status BindSecondPass(const dnnl::convolution_forward::primitive_desc& pd2,
                              PerShape* entry);
  // With int8: makes the quantization's run-time arguments (src_scale_,
  // weight_scales_, src_zero_point_) from options_.int8.
  absl::Status CreateQuantizationArgs();
  // With int8: binds those arguments into `call` (an INT8 conv primitive).
  void BindQuantization(BoundPrimitive* call) const;
  bool WinogradCandidate() const;
  // The eltwise post-ops as the own Winograd's epilogue computes them:
  // ReLU, a fake-quantize, or both (OwnWinogradPostOpsOf; nullopt where
  // that epilogue cannot compute the chain).
  struct OwnWinogradPostOps {
    bool relu = false;
    std::optional<cpu::WinogradFakeQuantize> fake_quantize;
  };
  static std::optional<OwnWinogradPostOps> OwnWinogradPostOpsOf(
      const std::vector<EltwisePostOp>& ops);
  // Whether the shape runs on the own AVX2 Winograd (see
  // ConvOnednnOptions::winograd); fills *shape when it does.
  bool OwnWinogradFits(const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                       bool dst_blocked, cpu::WinogradConvShape* shape) const;
  bool ChannelsLastCandidate(const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                             bool dst_blocked) const;
  // The nhwc brgemm conv, its reorders and its scratch; false when oneDNN
  // has no brgemm kernel for the shape (the blocked path is used then).
  absl::StatusOr<bool> PrepareChannelsLast(const Shape& src_shape, const Shape& dst_shape,
                                           bool src_blocked, bool dst_blocked, PerShape* entry);
  // The conv in the caller's layouts (the deconvolution, Winograd and the
  // depthwise post-op included).
  absl::Status PrepareDirect(const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                             bool dst_blocked, PerShape* entry);
  // PrepareDirect's (non-transposed) conv: Winograd where WinogradCandidate
  // and oneDNN has it for these descriptors, direct otherwise.
  dnnl::convolution_forward::primitive_desc DirectConvPd(const dnnl::memory::desc& src_md,
                                                         const dnnl::memory::desc& any_w,
                                                         const dnnl::memory::desc& bias_md,
                                                         const dnnl::memory::desc& dst_md) const;
  // PrepareDirect's depthwise post-op: its weights packed into
  // `dw_weights_md`, its bias, and dst through the scratch where oneDNN
  // writes a layout other than `final_dst_md`.
  absl::Status BindDepthwise(const Shape& dst_shape, const dnnl::memory::desc& dst_desc,
                             const dnnl::memory::desc& final_dst_md,
                             const dnnl::memory::desc& dw_weights_md, PerShape* entry);
  // Where PrepareDirect found only a reference kernel: the first of oneDNN's
  // preferred layouts ("any"), plain, and channels-last that has another,
  // reordered; false when every one is a reference.
  absl::StatusOr<bool> PrepareAwayFromReference(const Shape& src_shape, const Shape& dst_shape,
                                                bool src_blocked, bool dst_blocked,
                                                PerShape* entry);
  // Binds `pd` (whose src/dst layouts or types may differ from the
  // caller's) with the reorders between them and the scratch, where they
  // differ. With `src_pad_offsets`, pd's src is padded here (PrepareInt8):
  // the caller's input goes into its interior at these offsets.
  absl::Status BindReordered(const dnnl::convolution_forward::primitive_desc& pd,
                             const Shape& src_shape, const Shape& dst_shape, bool src_blocked,
                             bool dst_blocked, PerShape* entry,
                             const dnnl::memory::dims& src_pad_offsets = {});
  // The src reorder/conversion and the scratch for a primitive reading
  // `conv_src` where the caller passes `src_md` (nothing when they match;
  // with int8, `src_md` is the caller's layout in u8), into conv_src's
  // interior at `pad_offsets` when given.
  void BindSrc(const dnnl::memory::desc& src_md, const dnnl::memory::desc& conv_src,
               PerShape* entry, const dnnl::memory::dims& pad_offsets = {});
  // ActivationDesc in options.blocked_layout.
  dnnl::memory::desc Act(const Shape& shape, bool blocked,
                         dnnl::memory::data_type type = dnnl::memory::data_type::f32) const;
  // The conv's input and weights element type: BF16 with options.bf16.
  dnnl::memory::data_type ComputeType() const;
  // The weights in layout `md`, reordered once from the user copy (with
  // split INT8 weights: the half `pass` runs on).
  absl::StatusOr<dnnl::memory> WeightsFor(const dnnl::memory::desc& md, Pass pass = Pass::kWhole);
  // The entry for src_shape, prepared if absent; valid until the next one
  // is prepared.
  absl::StatusOr<PerShape*> EntryFor(const Shape& src_shape, const Shape& dst_shape,
                                     bool src_blocked, bool dst_blocked);

  dnnl::engine engine_;
  ConvOnednnOptions options_;
  // Kept for the life of the conv: a shape dropped from per_shape_ is
  // prepared again from it.
  std::vector<float> user_weights_;
  // With int8: the s8 weights (the high halves when split), and the low
  // halves when split (empty otherwise).
  std::vector<int8_t> user_weights_s8_, user_weights_s8_lo_;
  // One per distinct preferred layout (a few at most), shared by the
  // entries: dropping an entry only drops its handle on them. An entry's
  // depthwise post-op weights are its own and go with it.
  std::vector<dnnl::memory> packed_;
  std::vector<dnnl::memory> packed_lo_;  // the split INT8 weights' low halves
  dnnl::memory bias_;
  dnnl::memory dw_bias_;
  // With int8, oneDNN 3's run-time quantization arguments, shared by every
  // entry's primitives (BindQuantization): the src scale (one f32), the
  // weight scales (f32, one per output channel or one) and the src zero
  // point (one s32; none when it is 0). They own their buffers, which live
  // as long as any primitive's args hold them.
  dnnl::memory src_scale_, weight_scales_, src_zero_point_;
  // The own Winograd's transformed weights, made on its first shape.
  std::shared_ptr<const cpu::WinogradF4x3Weights> winograd_weights_;
  // OwnWinogradPostOpsOf(options_.eltwise), parsed once in Create.
  std::optional<OwnWinogradPostOps> winograd_post_ops_;
  // The layouts of the latest Prepare: those a shape Execute meets
  // unprepared is prepared in.
  bool src_blocked_ = false, dst_blocked_ = false;
  BoundedCache<Shape, PerShape> per_shape_{kShapeCacheCapacity};
};

}  // namespace numaserve::kernels
