// A model as the server sees it: metadata to validate requests against
// (InspectModel, no kernels) and a compiled, runnable form (CompiledModel)
// built once per worker with its weights prepared in the kernels' layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/import/model_info.h"
#include "engine/ir/types.h"
#include "engine/profile/step_profile.h"

namespace numaserve::engine {

// The arithmetic a compiled model's convs and matmuls run in (a model's
// `precision` in config.pbtxt, `numaserve bench --precision`).
enum class Precision {
  kFp32,  // everything in FP32
  // Convs (ConvTranspose too) and Gemm/MatMul with constant weights in BF16
  // with FP32 accumulation, those doing enough work per input element
  // (CompileOptions::bf16_min_flops_per_input): their weights converted to
  // BF16 once at load, their inputs at each run; their outputs, and every
  // other op (norms, softmax, the fused attention, element-wise ops,
  // pooling), FP32. Only
  // where oneDNN has native BF16 kernels (kernels::GetBf16Support: AMX-BF16
  // or AVX512_BF16, not capped below); CompiledModel::Load refuses it
  // elsewhere with the reason.
  kBf16,
};
// "fp32", "bf16".
const char* PrecisionName(Precision precision);
// The names above; INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<Precision> PrecisionFromName(const std::string& name);
// "fp32", "bf16": the values PrecisionFromName accepts.
const std::vector<std::string>& PrecisionChoices();

struct CompileOptions {
  // Threads for the kernels; 0 = the OpenMP default (OMP_NUM_THREADS).
  int num_threads = 0;
  // Backend for Gemm/MatMul with constant weights (kernels/gemm): "onednn",
  // "blis", "openblas", "numaserve" (the own kernels), or "auto", which
  // times each available backend once per distinct shape at load and keeps
  // the fastest (logged on stderr and shown by DescribePlan). A named
  // backend that cannot run here fails the load with the reason.
  std::string gemm_backend = "onednn";
  // "auto" only: a file that remembers the choices across processes
  // (numaserve's --gemm-cache, NUMASERVE_GEMM_CACHE, else
  // DefaultGemmCacheFile); empty: remembered in this process only.
  std::string gemm_cache_file;
  // "auto" only: a choice timed while the timing thread was off its cpu
  // more than this share of the time (GemmChoice::contention: other work
  // on the cores, whose timings say little about the model's own) is used
  // and remembered in this process, but not written to gemm_cache_file: a
  // later process times it again. Infinity: always written.
  double gemm_cache_max_contention = 0.1;
  // Conv algorithm for 3x3 stride-1 convolutions: "winograd" (oneDNN's
  // Winograd F(2x2,3x3) or F(4x4,3x3) where it has one for the layer, on
  // AVX-512; numaserve's own F(4x4,3x3) on the AVX2 tier, where oneDNN has
  // none (kernels/cpu/winograd.h); direct elsewhere; results differ from
  // direct by ~1e-6 relative) or "direct". Why each default is what it is,
  // with the figures: docs/engine.md, "Why the defaults".
  std::string conv_algorithm = "winograd";
  // A conv or matmul whose residual (sum post-op) is read by no later step
  // writes into the residual's bytes instead of copying it into its own
  // output first. Off only to compare.
  bool in_place_residuals = true;
  // Steps too small to gain from a second thread run on the calling thread
  // alone: those with fewer FLOPs than this (conv, matmul), or, for steps
  // without counted FLOPs, reading fewer floats than serial_below_elements.
  // Waking sleeping OpenMP threads costs tens of microseconds per step on
  // VMs, more than such a step saves; threads still spinning cost far
  // less. 0: never; negative: DefaultSerialBelowFlops(threads), from the
  // fork-join cost measured at load.
  double serial_below_flops = -1;
  // 0: never; negative: DefaultSerialBelowElements(threads), from the same
  // measured fork-join cost.
  int64_t serial_below_elements = -1;
  // Batch splitting: a prefix of the row-wise steps (conv, pool, weight
  // matmul, layer norm, attention) runs the batch in slices of rows small
  // enough that a slice's activations stay in a cache of this many bytes
  // between one step and the next: the prefix saving the most memory
  // traffic (outputs that outgrow the cache at the run's batch, less the
  // weights every further slice reads again). 0: never; negative: the
  // last-level cache of the CPU running Compile (LastLevelCacheBytes).
  int64_t batch_split_cache_bytes = -1;
  // Batch sizes whose plan (shapes, activation offsets, prepared steps) is
  // kept: a new size beyond this drops the least recently run one, planned
  // again if it comes back (the kernels keep their per-shape primitives).
  // The activations of every plan share one arena, as large as the largest
  // plan kept, so memory follows the largest batch kept, not the number of
  // sizes seen. 0: no limit.
  int batch_plans = 64;
  // A batch size's plan not run in the last this many runs is dropped too,
  // so that a size seen once (one request of many rows to a model served
  // one request per run) does not keep its activations for good: when such
  // drops leave the largest plan kept needing at most half of the arena,
  // the arena is mapped again at that size and the rest goes back to the
  // system. (Plans dropped by batch_plans leave it as it is: sizes coming
  // and going would otherwise map it again at every new plan.) 0: plans
  // are dropped by batch_plans alone, and the arena never shrinks.
  int64_t batch_plan_idle_runs = 1024;
  // The activation bytes one run may need (the arena of the plan at its
  // batch size, what ActivationBytes says): a Run or ActivationBytes at a
  // batch size whose plan needs more fails with RESOURCE_EXHAUSTED, naming
  // both figures, before the arena grows or a step is prepared for it. The
  // server sets it per model (config.pbtxt max_activation_bytes, else
  // serve --max-activation-mb), so that no request can take a worker's
  // memory: a model whose dim 0 is dynamic runs a request of any number of
  // rows when it is served one request per run, and an op such as x * x^T
  // needs rows^2 activations. 0: no limit.
  int64_t max_activation_bytes = 0;
  // Scaled dot-product attention (MatMul, scalar Mul/Div, Softmax over the
  // last axis, MatMul) runs as one step on the own fused kernel, the scores
  // kept in cache. Off only to compare.
  bool fuse_attention = true;
  // kBf16: convs and weight matmuls in BF16 (see Precision). Needs
  // gemm_backend "onednn" or "auto" (which then means oneDNN, untimed).
  Precision precision = Precision::kFp32;
  // With kBf16, a conv or weight matmul runs in BF16 only where it does at
  // least this many FLOPs per element of its input (a conv: 2 x (M/group)
  // x kernel / strides; a matmul: 2N); the others stay FP32. BF16 halves
  // the arithmetic but its input is converted first, one more pass over
  // it, which a conv doing little per input element does not earn back.
  // 0: every conv and weight matmul in BF16 (tests).
  double bf16_min_flops_per_input = 256;
  // A QDQ model's Conv/MatMul/Gemm runs on an INT8 kernel only where it
  // does at least this many FLOPs per element of its input (counted as for
  // bf16_min_flops_per_input); the others run FP32 on the dequantized
  // weights after a fake-quantize step, which computes the same QDQ
  // meaning. An INT8 conv quantizes its input, a pass that a conv doing
  // little per input element does not earn back. 0: every one INT8 (tests).
  double int8_min_flops_per_input = 256;
  // Whether a QDQ model's Conv/MatMul/Gemm runs on oneDNN's INT8 kernels at
  // all. kAuto: where its u8 x s8 products are exact in one pass (VNNI:
  // AVX512_VNNI, AVX-VNNI, AMX; kernels::OnednnInt8ProductsExact). Without
  // VNNI they saturate in int16 pairs, so the weights split in two passes
  // (twice the work) on kernels that are slower than FP32 even in one, so
  // there every QDQ pair runs as a fake-quantize (fused into the conv
  // before it where it can be) and the op runs FP32 on its dequantized
  // weights: the same QDQ meaning, at FP32 speed. kAlways: INT8 kernels on
  // every CPU (split where needed; tests, comparisons). kNever: the FP32
  // path everywhere.
  enum class Int8Kernels { kAuto, kAlways, kNever };
  Int8Kernels int8_kernels = Int8Kernels::kAuto;
  // The layout of the activations that convs, pools and fake-quantize
  // steps pass between them (the rest read plain NC[D]HW). kAuto:
  // channels-last (nhwc) where at least one conv runs INT8, since oneDNN
  // 2.6's INT8 convs read and write only that layout with a jit kernel
  // (with channel-blocked activations each one reorders its input and
  // output), or where a model with convs runs BF16 on AMX, whose convs
  // (brgconv) oneDNN 2.6 has for nhwc only (channel-blocked ones run on the
  // slower AVX512_BF16 kernels); and the tier's channel-blocked layout
  // (nChw16c / nChw8c) otherwise, where oneDNN's FP32 direct and Winograd
  // kernels are fastest.
  enum class ActivationLayout { kAuto, kChannelBlocked, kChannelsLast };
  ActivationLayout activation_layout = ActivationLayout::kAuto;
  // Batch groups (engine/compiler/batch_groups.h): a batch of enough rows runs as
  // this many row ranges at once, each on its own copy of the model with
  // its share of num_threads (pinned to its share of the calling thread's
  // cpus). 1: off, one team for every batch (the default: no reliable gain
  // measured). Each group costs a copy of the weights.
  int batch_groups = 1;
  // The fewest rows a group runs; 0: MinRowsPerGroup(the model's FLOPs per
  // row). Tests set it to group small models.
  int64_t batch_group_min_rows = 0;
  // Every Run is profiled from the start and the per-step profile is logged
  // when the model is freed (numaserve's --profile-steps,
  // NUMASERVE_PROFILE_STEPS): to see where a whole run's time goes.
  bool profile_steps = false;
  // The NUMA node the weights are placed on (numaserve's serve
  // --weights-node: typically a memory-only node, CXL-attached memory or
  // HBM); -1: wherever the calling thread's memory policy puts them (a
  // worker's own node). Load imports and compiles under a memory policy
  // for that node on the calling thread and its OpenMP team of num_threads
  // (affinity::ScopedTeamMemoryPolicy), restored when the compile ends:
  // what the compile allocates and first writes (the imported
  // initializers, the weights reordered or packed for the kernels) lands
  // there; what runs allocate (the activation arena, plans, scratch), and
  // the threads of batch groups, which start after it, keep the caller's
  // policy. Weights a kernel packs lazily at a shape's first run (a conv's
  // layout for that shape) are allocated then, under the caller's policy;
  // the compile's other allocations (the plan, primitives, a library's
  // state set up at its first use) go to the node too. What the compile
  // freed is given back to the system after it (malloc_trim). A node the
  // machine lacks, or a policy the kernel refuses, fails the load, naming
  // the node.
  int weights_numa_node = -1;
  // With weights_numa_node: MPOL_BIND (the node only: an allocation it
  // cannot hold fails, no spill) rather than preferred.
  bool weights_numa_strict = false;
};

// The size of the last-level cache shared by the calling thread's core
// (affinity::OuterCacheBytes, from hwloc), or 32 MiB where it is unknown.
int64_t LastLevelCacheBytes();

// What one OpenMP fork-join of `threads` threads costs this process,
// seconds: the median of back-to-back empty parallel regions, as one step
// follows another in a run (idle threads still spinning where they spin,
// woken where they sleep at once: OMP_WAIT_POLICY, GOMP_SPINCOUNT). Measured
// once per thread count (~1 ms), on the calling thread's team.
double ForkJoinSeconds(int threads);

// CompileOptions::serial_below_flops for `threads` threads, from the
// measured cost of waking them: a step runs serially when its FLOPs at half
// a core's FP32 peak (small steps run well below peak) take less than
// kSerialForkJoins fork-joins on the spare threads' share, i.e. below
// kSerialForkJoins * ForkJoinSeconds * peak/2 * threads/(threads-1). On the
// 2-vCPU Zen 5 this gives ~1.7 MFLOP with threads spinning briefly (2.4 us
// per fork-join) and ~12 MFLOP with threads sleeping at once (17 us), where
// 2 and 10 MFLOP had measured best for MobileNetV2 at batch 1; on 16 cores
// the wake-up costs more and so does the threshold. 0 for one thread.
inline constexpr double kSerialForkJoins = 3;
double DefaultSerialBelowFlops(int threads);

// Floats one core runs through per second in a simple element-wise pass
// (y = a * x + b over 64K floats in cache, the engine's own loops' kind of
// work), measured once (~1 ms).
double ElementwiseFloatsPerSecond();

// CompileOptions::serial_below_elements for `threads` threads: a step
// without counted FLOPs runs serially when the floats it reads take less
// than kSerialForkJoins fork-joins at ElementwiseFloatsPerSecond on the
// spare threads' share. 0 for one thread.
int64_t DefaultSerialBelowElements(int threads);

// The backends CompileOptions::gemm_backend accepts: "onednn", "blis",
// "openblas", "numaserve", "auto".
const std::vector<std::string>& GemmBackendChoices();
// OK, or INVALID_ARGUMENT naming the accepted values.
absl::Status CheckGemmBackendChoice(const std::string& name);

// Where numaserve keeps "auto" choices when neither --gemm-cache nor
// NUMASERVE_GEMM_CACHE names a file (tools/numaserve decides, and hands
// the file to its workers): $XDG_CACHE_HOME/numaserve/gemm_choices.tsv,
// else ~/.cache/numaserve/gemm_choices.tsv ("" without a home).
std::string DefaultGemmCacheFile();

class CompiledModel {
 public:
  virtual ~CompiledModel() = default;

  // Imports and compiles the model: fuses ops into oneDNN primitives and
  // reorders weights once into the layout the kernels prefer. Call it in the
  // worker after it is pinned, so the weights land in node-local memory.
  static absl::StatusOr<std::unique_ptr<CompiledModel>> Load(const std::string& path,
                                                             const CompileOptions& options);

  virtual const ModelInfo& info() const = 0;

  // Every input's concrete shape for one run, in info().inputs order: a
  // signature. A model whose only dynamic dims are dims 0 (the batch) runs
  // at a batch size alone, and the calls taking `batch` below are the
  // signature "dim 0 = batch, every other dim as declared"; a model with
  // other dynamic dims (a sequence length, an image's height and width)
  // runs at signatures only: the calls taking `batch` refuse it, naming
  // the input and dim.
  //
  // A signature is checked against the model before anything of its size
  // is allocated (engine/ops/shape_propagation.h, CheckSignature):
  // INVALID_ARGUMENT naming the input and dim for a rank that differs, a
  // fixed dim that differs, a dynamic dim below 1, two sizes for one named
  // dim (ONNX dim_param) or for the batch, or a tensor over the limit per
  // tensor; RESOURCE_EXHAUSTED where its plan needs more than
  // CompileOptions::max_activation_bytes. Each signature's plan (shapes,
  // arena offsets, the steps' primitives) is made at its first run and kept
  // in the bounded cache of CachedBatchPlans.
  using InputShapes = std::vector<std::vector<int64_t>>;

  // Concrete output shapes for `batch` rows (the inputs' dynamic dim 0):
  // the shapes Run writes. Empty when the model cannot run at `batch`.
  virtual std::vector<std::vector<int64_t>> OutputShapes(int64_t batch) const = 0;
  // At a signature; INVALID_ARGUMENT naming why it cannot run there.
  virtual absl::StatusOr<std::vector<std::vector<int64_t>>> OutputShapes(
      const InputShapes& input_shapes) const;

  // Runs `batch` rows (the inputs' dynamic dim 0; 1 for a model without
  // one). inputs[i] holds info().inputs[i] for all rows, contiguous and
  // row-major; outputs[i] has room for OutputShapes(batch)[i].
  // Not thread-safe: one Run at a time per CompiledModel.
  virtual absl::Status Run(int64_t batch, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs) = 0;
  // Runs at a signature: inputs[i] holds input_shapes[i], outputs[j] has
  // room for OutputShapes(input_shapes)[j].
  virtual absl::Status Run(const InputShapes& input_shapes, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs);

  // OK when buffers of exactly these sizes are what Run at `batch` reads and
  // writes: input_bytes[i] for info().inputs[i], output_bytes[j] for output j
  // (OutputShapes(batch) in the type Run writes). INVALID_ARGUMENT naming the
  // first tensor that differs (or the batch the model cannot run at)
  // otherwise. For callers whose buffers were sized elsewhere (a worker, by
  // the server): check here, then Run.
  virtual absl::Status CheckBufferSizes(int64_t batch, const std::vector<size_t>& input_bytes,
                                        const std::vector<size_t>& output_bytes) const = 0;
  // The same at a signature.
  virtual absl::Status CheckBufferSizes(const InputShapes& input_shapes,
                                        const std::vector<size_t>& input_bytes,
                                        const std::vector<size_t>& output_bytes) const;

  // How many signatures (batch sizes, for a model whose only dynamic dims
  // are dims 0) have a plan now (at most CompileOptions::batch_plans) and
  // the bytes of the activation arena they share (the largest plan's,
  // rounded up): the per-signature state.
  struct BatchPlanCache {
    int64_t plans = 0;
    int64_t arena_bytes = 0;
  };
  virtual BatchPlanCache CachedBatchPlans() const { return {}; }

  // Peak activation bytes at `batch` rows: the size of the activation
  // arena, whose buffers are reused between values that are not alive at
  // the same time (graph inputs, outputs and weights not included).
  // RESOURCE_EXHAUSTED above CompileOptions::max_activation_bytes.
  virtual absl::StatusOr<int64_t> ActivationBytes(int64_t batch) { return int64_t{0}; }
  // At a signature (planning it if new).
  virtual absl::StatusOr<int64_t> ActivationBytes(const InputShapes& input_shapes);

  // The layout chosen for the activations between convs and pools
  // (CompileOptions::activation_layout): "nChw16c", "nChw8c" or "nhwc".
  virtual std::string ActivationLayoutName() const { return ""; }

  // Where a QDQ model's INT8-capable convs and matmuls run FP32 instead
  // (CompileOptions::int8_kernels): why, and how many ("INT8 kernels off:
  // ..."); empty where they run INT8 or the model has none.
  virtual std::string DescribeInt8Kernels() const { return ""; }

  // The compiled plan, one line per kernel step with the graph nodes it
  // stands for ("matmul: fc1+relu1"), for logs and tests.
  virtual std::string DescribePlan() const { return ""; }

  // How a large batch splits into groups (CompileOptions::batch_groups):
  // "2 x 8 threads on cpus 0-7 | 8-15, batches of 8+ rows (...)"; empty
  // where every batch runs on one team.
  virtual std::string DescribeBatchGroups() const { return ""; }

  // The plan as it ran at `batch`, with each step's implementation
  // (oneDNN creates some primitives at their first run, so this asks for a
  // Run at `batch` first: FAILED_PRECONDITION otherwise).
  virtual absl::StatusOr<std::vector<PlannedStep>> PlanAt(int64_t batch) const {
    return absl::UnimplementedError("no plan");
  }
  // The plan as it ran at a signature (FAILED_PRECONDITION before a Run
  // there, or after its plan was dropped from the cache).
  virtual absl::StatusOr<std::vector<PlannedStep>> PlanAt(const InputShapes& input_shapes) const {
    return absl::UnimplementedError("no plan");
  }

  // Starts (true: from zero) or stops timing every step of Run. Off by
  // default; when off, Run pays nothing for it.
  virtual void SetProfiling(bool on) {}
  // The timings collected since profiling last started, one row per step
  // in plan order (a conv's residual reorder follows its step).
  virtual std::vector<StepProfile> Profile() const { return {}; }
  // While profiling, also keep each step call's start and duration, up to
  // about `max_events` (a Run that would go past it, and every later one,
  // is timed but not kept); 0, the default, keeps none. Takes effect at
  // the next SetProfiling(true), which clears what was kept.
  virtual void SetStepEventLimit(int64_t max_events) {}
  // The events kept since profiling last started, in the order they ran.
  virtual std::vector<StepEvent> StepEvents() const { return {}; }
};

}  // namespace numaserve::engine
