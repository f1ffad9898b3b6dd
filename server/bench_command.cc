#include "server/bench_command.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "affinity/cpu_features.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/onednn/onednn_common.h"
#include "server/args.h"
#include "server/model_runs.h"

namespace numaserve::server {
namespace {

struct BatchResult {
  int64_t batch = 0;
  int64_t iterations = 0;
  double inferences_per_second = 0;
  double p50_ms = 0, p99_ms = 0;
  double gflops = 0, peak_fraction = 0;
  // Some convs ran as Winograd: GFLOP/s and peak_fraction count them at
  // their direct FLOPs (~2.25x what they do), so both are effective figures.
  bool effective = false;
  int64_t activation_bytes = 0;
};

// Whether a step of the plan at `batch` ran a Winograd convolution.
bool RanWinograd(const engine::CompiledModel& model, int64_t batch) {
  auto plan = model.PlanAt(batch);
  if (!plan.ok()) return false;
  for (const engine::PlannedStep& step : *plan) {
    if (step.implementation.find("wino") != std::string::npos) return true;
  }
  return false;
}

absl::StatusOr<BatchResult> RunBatch(engine::CompiledModel& model, int64_t batch, double seconds,
                                     double peak_gflops) {
  const engine::ModelInfo& info = model.info();
  absl::StatusOr<RunBuffers> made = MakeRunBuffers(model, batch);
  if (!made.ok()) return made.status();
  const RunBuffers& buffers = *made;
  const auto& in_ptrs = buffers.in_ptrs;
  const auto& out_ptrs = buffers.out_ptrs;
  using Clock = std::chrono::steady_clock;
  // Warm-up: primitive creation, weight layouts, page faults.
  for (int i = 0; i < 2; ++i) {
    if (absl::Status s = model.Run(batch, in_ptrs, out_ptrs); !s.ok()) return s;
  }
  std::vector<double> latencies_ms;
  const auto start = Clock::now();
  auto now = start;
  while (latencies_ms.size() < 5 || std::chrono::duration<double>(now - start).count() < seconds) {
    const auto t0 = Clock::now();
    if (absl::Status s = model.Run(batch, in_ptrs, out_ptrs); !s.ok()) return s;
    now = Clock::now();
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(now - t0).count());
  }
  const double total_s = std::chrono::duration<double>(now - start).count();
  BatchResult r;
  r.batch = batch;
  r.iterations = static_cast<int64_t>(latencies_ms.size());
  r.inferences_per_second = batch * r.iterations / total_s;
  r.p50_ms = Percentile(latencies_ms, 0.5);
  r.p99_ms = Percentile(latencies_ms, 0.99);
  r.gflops = info.flops_per_row * r.inferences_per_second / 1e9;
  r.peak_fraction = peak_gflops > 0 ? r.gflops / peak_gflops : 0;
  r.effective = RanWinograd(model, batch);
  if (auto bytes = model.ActivationBytes(batch); bytes.ok()) r.activation_bytes = *bytes;
  return r;
}

// Runs `batch` rows for `seconds` (at least 5 runs) with every step timed,
// after the measured runs (whose figures the timing does not touch), and
// prints the step profile.
absl::Status ProfileBatch(engine::CompiledModel& model, int64_t batch, double seconds, int top,
                          bool json) {
  auto measured = ProfileRuns(model, batch, seconds);
  if (!measured.ok()) return measured.status();
  const int64_t runs = measured->runs;
  const double wall = measured->wall_seconds;
  const std::vector<engine::StepProfile>& profile = measured->steps;
  if (json) {
    printf("{\"model\": \"%s\", \"batch\": %lld, \"profile\": %s}\n", model.info().path.c_str(),
           static_cast<long long>(batch), engine::StepProfileJson(profile, runs, wall).c_str());
  } else {
    printf("profile at batch %lld:\n%s", static_cast<long long>(batch),
           engine::FormatStepProfile(profile, runs, top, wall).c_str());
  }
  return absl::OkStatus();
}

// Runs `batch` rows once and prints every step with the layouts and the
// implementation it ran on (oneDNN creates some primitives at their first
// run); reference implementations are flagged.
// `threads`: the model's; serial_below_mflops: the option (-1: measured).
absl::Status PrintPlan(engine::CompiledModel& model, int64_t batch, int threads,
                       double serial_below_mflops) {
  absl::StatusOr<RunBuffers> buffers = MakeRunBuffers(model, batch);
  if (!buffers.ok()) return buffers.status();
  if (absl::Status s = model.Run(batch, buffers->in_ptrs, buffers->out_ptrs); !s.ok()) return s;
  auto steps = model.PlanAt(batch);
  if (!steps.ok()) return steps.status();
  int references = 0;
  printf("plan at batch %lld (%s; kernels %s, layouts %s):\n", static_cast<long long>(batch),
         kernels::IsaDescription().c_str(), kernels::IsaTierName(kernels::GetKernelTable().tier),
         model.ActivationLayoutName().c_str());
  if (const std::string groups = model.DescribeBatchGroups(); !groups.empty()) {
    printf("  (batch groups: %s; a grouped batch shows group 0's plan)\n", groups.c_str());
  }
  if (serial_below_mflops < 0 && threads > 1) {
    printf(
        "  (steps below %.2f MFLOP, or without FLOPs reading below %lld floats, run on 1 "
        "thread: a fork-join of %d threads measured %.1f us)\n",
        engine::DefaultSerialBelowFlops(threads) / 1e6,
        static_cast<long long>(engine::DefaultSerialBelowElements(threads)), threads,
        engine::ForkJoinSeconds(threads) * 1e6);
  }
  for (const engine::PlannedStep& step : *steps) {
    std::string note = step.layouts;
    if (!step.implementation.empty()) {
      note += (note.empty() ? "" : ", ") + step.implementation;
    }
    if (step.serial) note += ", 1 thread";
    if (step.slice_rows > 0) note += ", slices of " + std::to_string(step.slice_rows) + " rows";
    printf("  #%-4d %s [%s]%s\n", step.index, step.description.c_str(), note.c_str(),
           step.reference ? "  <- REFERENCE implementation" : "");
    references += step.reference ? 1 : 0;
  }
  if (references > 0) {
    printf("%d step(s) on a reference implementation\n", references);
  }
  return absl::OkStatus();
}

}  // namespace

int BenchCommand(const std::vector<std::string>& args) {
  std::string model_path, batches_text = "1,8,32", gemm = "auto", conv = "winograd";
  std::string attention = "fused", precision_name = "fp32", layout = "auto";
  std::string int8_kernels = "auto";
  int64_t threads = 0;
  double seconds = 3.0;
  bool json = false, plan = false, profile = false;
  int64_t top = 15;
  double serial_below_mflops = -1;
  double batch_split_mb = -1;
  double bf16_min_flops = -1;
  int64_t batch_groups = 1;
  ArgParser parser(
      "bench",
      "run a model in process per batch size: inferences/s, p50/p99 latency, "
      "GFLOP/s and the fraction of peak (FP32, BF16 with --precision bf16, INT8 for a QDQ "
      "model on INT8 kernels)");
  parser.AddString("model", &model_path, "ONNX model file (required)");
  parser.AddString("batch", &batches_text, "comma-separated batch sizes");
  parser.AddInt("threads", &threads, "kernel threads (0 = OMP_NUM_THREADS or all cores)");
  parser.AddDouble("seconds", &seconds, "measured time per batch size");
  parser.AddBool("json", &json, "one JSON object per line per batch size");
  parser.AddBool(
      "plan", &plan,
      "print the GEMM libraries and the compiled plan first: one line per kernel step with "
      "its layouts and the implementation it ran on at the first batch size, "
      "reference implementations flagged");
  parser.AddBool("profile", &profile,
                 "after each batch size's measured runs, time every compiled step for as long "
                 "again and print where the time goes: per step kind, the costliest steps (share "
                 "of the time in steps, GFLOP/s) and every layout boundary and residual reorder");
  parser.AddInt("top", &top, "--profile: the costliest steps listed (0 = all)");
  parser.AddString("conv", &conv,
                   "3x3 stride-1 conv algorithm: direct | winograd (oneDNN's on AVX-512, "
                   "numaserve's own F(4x4, 3x3) on the AVX2 tier, where the layer fits it)");
  parser.AddString("layout", &layout,
                   "activations between convs and pools: auto (channels-last where a conv runs "
                   "INT8 or a model with convs runs BF16 on AMX, the channel-blocked layout of "
                   "the tier otherwise) | blocked | nhwc");
  parser.AddString("attention", &attention,
                   "scaled dot-product attention (MatMul, scale, Softmax, MatMul): fused (one "
                   "step on the own kernel) | unfused (each op its own step)");
  parser.AddDouble("bf16-min-flops", &bf16_min_flops,
                   "--precision bf16: a conv or weight matmul runs BF16 only where it does at "
                   "least this many FLOPs per element of its input (-1 = the default, "
                   "CompileOptions::bf16_min_flops_per_input; 0 = all)");
  parser.AddString("precision", &precision_name,
                   "fp32 | bf16 (convs and weight matmuls in BF16 with FP32 accumulation, "
                   "weights converted at load; refused where the CPU has no native BF16)");
  parser.AddString("int8-kernels", &int8_kernels,
                   "a QDQ model's convs and matmuls: auto (oneDNN's INT8 kernels where the CPU "
                   "has VNNI or AMX, FP32 on the dequantized weights without: there the INT8 "
                   "products take two passes) | on (INT8 kernels on any CPU) | off (FP32)");
  parser.AddString("gemm", &gemm,
                   "GEMM backend: onednn | blis | openblas | numaserve (the own AVX2 kernel) | "
                   "auto (each timed once per shape at "
                   "load, the fastest kept)");
  parser.AddDouble("serial-below-mflops", &serial_below_mflops,
                   "run steps below this many MFLOP on one thread (-1 = derived from the cost of "
                   "an OpenMP fork-join measured at load; 0 = never)");
  parser.AddDouble(
      "batch-split-mb", &batch_split_mb,
      "run leading row-wise steps (conv, pool, matmul, layer norm, attention) in slices of "
      "the batch that stay in a cache of this many MiB, as far as that saves more memory "
      "traffic than re-reading their weights per slice costs (-1 = the last-level cache; "
      "0 = never)");
  parser.AddInt("batch-groups", &batch_groups,
                "run a batch of enough rows as this many row ranges at once, each on a copy of "
                "the model with its share of the threads (1 = off, the default)");
  if (absl::Status s = parser.Parse(args); !s.ok()) {
    fprintf(stderr, "numaserve bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (model_path.empty()) {
    fprintf(stderr, "numaserve bench: --model is required\n");
    return 2;
  }
  std::vector<int64_t> batches;
  for (absl::string_view part : absl::StrSplit(batches_text, ',', absl::SkipEmpty())) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) {
      fprintf(stderr, "numaserve bench: --batch: '%s' is not a batch size >= 1\n",
              std::string(part).c_str());
      return 2;
    }
    batches.push_back(b);
  }
  if (threads < 0 || seconds <= 0) {
    fprintf(stderr, "numaserve bench: --threads must be >= 0 and --seconds > 0\n");
    return 2;
  }
  if (conv != "direct" && conv != "winograd") {
    fprintf(stderr, "numaserve bench: --conv: '%s' is not one of direct, winograd\n", conv.c_str());
    return 2;
  }
  if (layout != "auto" && layout != "blocked" && layout != "nhwc") {
    fprintf(stderr, "numaserve bench: --layout: '%s' is not one of auto, blocked, nhwc\n",
            layout.c_str());
    return 2;
  }
  if (attention != "fused" && attention != "unfused") {
    fprintf(stderr, "numaserve bench: --attention: '%s' is not one of fused, unfused\n",
            attention.c_str());
    return 2;
  }
  if (int8_kernels != "auto" && int8_kernels != "on" && int8_kernels != "off") {
    fprintf(stderr, "numaserve bench: --int8-kernels: '%s' is not one of auto, on, off\n",
            int8_kernels.c_str());
    return 2;
  }
  if (top < 0) {
    fprintf(stderr, "numaserve bench: --top must be >= 0\n");
    return 2;
  }
  if (batch_groups < 1 || batch_groups > 1024) {
    fprintf(stderr, "numaserve bench: --batch-groups must be between 1 and 1024\n");
    return 2;
  }
  if (absl::Status s = engine::CheckGemmBackendChoice(gemm); !s.ok()) {
    fprintf(stderr, "numaserve bench: --gemm: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const absl::StatusOr<engine::Precision> precision = engine::PrecisionFromName(precision_name);
  if (!precision.ok()) {
    fprintf(stderr, "numaserve bench: --precision: %s\n",
            std::string(precision.status().message()).c_str());
    return 2;
  }
  engine::CompileOptions options{.num_threads = static_cast<int>(threads),
                                 .gemm_backend = gemm,
                                 .gemm_cache_file = engine::DefaultGemmCacheFile(),
                                 .conv_algorithm = conv};
  options.fuse_attention = attention == "fused";
  using Layout = engine::CompileOptions::ActivationLayout;
  options.activation_layout = layout == "blocked" ? Layout::kChannelBlocked
                              : layout == "nhwc"  ? Layout::kChannelsLast
                                                  : Layout::kAuto;
  options.precision = *precision;
  using Int8Kernels = engine::CompileOptions::Int8Kernels;
  options.int8_kernels = int8_kernels == "on"    ? Int8Kernels::kAlways
                         : int8_kernels == "off" ? Int8Kernels::kNever
                                                 : Int8Kernels::kAuto;
  options.batch_groups = static_cast<int>(batch_groups);
  if (bf16_min_flops >= 0) options.bf16_min_flops_per_input = bf16_min_flops;
  if (serial_below_mflops >= 0) options.serial_below_flops = serial_below_mflops * 1e6;
  if (batch_split_mb >= 0) {
    options.batch_split_cache_bytes = static_cast<int64_t>(batch_split_mb * (1 << 20));
  }
  auto model = engine::CompiledModel::Load(model_path, options);
  if (!model.ok()) {
    fprintf(stderr, "numaserve bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  if (const std::string note = (*model)->DescribeInt8Kernels(); !note.empty()) {
    fprintf(stderr, "numaserve: %s: %s\n", model_path.c_str(), note.c_str());
  }
  if (plan) {
    for (kernels::GemmBackend b : kernels::kAllGemmBackends) {
      printf("gemm %s: %s\n", kernels::GemmBackendName(b), kernels::GemmBackendDetails(b).c_str());
    }
    const int model_threads = threads > 0 ? static_cast<int>(threads) : omp_get_max_threads();
    if (absl::Status s = PrintPlan(**model, batches.front(), model_threads, serial_below_mflops);
        !s.ok()) {
      fprintf(stderr, "numaserve bench: --plan: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  const int used_threads = threads > 0 ? static_cast<int>(threads) : omp_get_max_threads();
  // BF16: fractions of the BF16 peak (AMX tiles or AVX512_BF16 dot
  // products), which the convs and matmuls run at.
  const bool bf16 = *precision == engine::Precision::kBf16;
  // A QDQ model whose convs and matmuls run on INT8 kernels: fractions of
  // the INT8 peak (VNNI dot products: 4x FP32's operations per cycle; AMX
  // tiles), told from the plan after one run.
  bool int8 = false;
  if (affinity::GetPeakFlops().peak_int8_gops_per_core > 0 &&
      ((*model)->info().batched || batches.front() == 1)) {
    absl::StatusOr<RunBuffers> warm = MakeRunBuffers(**model, batches.front());
    if (warm.ok() && (*model)->Run(batches.front(), warm->in_ptrs, warm->out_ptrs).ok()) {
      if (auto plan = (*model)->PlanAt(batches.front()); plan.ok()) {
        for (const engine::PlannedStep& step : *plan) {
          int8 = int8 || step.implementation.find("int8") != std::string::npos;
        }
      }
    }
  }
  const char* peak_of = int8 ? "INT8" : bf16 ? "BF16" : "FP32";
  const double peak = (int8   ? affinity::GetPeakFlops().peak_int8_gops_per_core
                       : bf16 ? affinity::GetPeakFlops().peak_bf16_gflops_per_core
                              : kernels::Fp32PeakGflopsPerCore()) *
                      used_threads;
  if (!json) {
    printf("%s: %.2f GFLOP per row, %d threads, %s peak %.0f G%s/s\n", model_path.c_str(),
           (*model)->info().flops_per_row / 1e9, used_threads, peak_of, peak, int8 ? "OP" : "FLOP");
    printf("%6s %12s %10s %10s %10s %8s %10s\n", "batch", "infer/s", "p50_ms", "p99_ms", "GFLOP/s",
           "peak", "act_MB");
  }
  bool noted_effective = false;
  for (int64_t batch : batches) {
    if (!(*model)->info().batched && batch != 1) {
      fprintf(stderr, "numaserve bench: %s is not batched; skipping batch %lld\n",
              model_path.c_str(), static_cast<long long>(batch));
      continue;
    }
    auto r = RunBatch(**model, batch, seconds, peak);
    if (!r.ok()) {
      fprintf(stderr, "numaserve bench: batch %lld: %s\n", static_cast<long long>(batch),
              std::string(r.status().message()).c_str());
      return 1;
    }
    if (json) {
      printf(
          "{\"model\": \"%s\", \"precision\": \"%s\", \"batch\": %lld, \"threads\": %d, "
          "\"iterations\": %lld, "
          "\"inferences_per_second\": %.3f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
          "\"gflops\": %.3f, \"peak_fraction\": %.4f, \"peak_fraction_kind\": \"%s\", "
          "\"peak_of\": \"%s\", \"activation_bytes\": %lld}\n",
          model_path.c_str(), engine::PrecisionName(*precision), static_cast<long long>(r->batch),
          used_threads, static_cast<long long>(r->iterations), r->inferences_per_second, r->p50_ms,
          r->p99_ms, r->gflops, r->peak_fraction, r->effective ? "effective" : "actual", peak_of,
          static_cast<long long>(r->activation_bytes));
    } else {
      printf("%6lld %12.1f %10.3f %10.3f %10.1f %7.3f%s %10.1f\n", static_cast<long long>(r->batch),
             r->inferences_per_second, r->p50_ms, r->p99_ms, r->gflops, r->peak_fraction,
             r->effective ? "e" : " ", r->activation_bytes / 1e6);
      if (r->effective && !noted_effective) {
        printf("       (e: effective: Winograd convs counted at their direct FLOPs)\n");
        noted_effective = true;
      }
    }
    if (profile) {
      if (absl::Status s = ProfileBatch(**model, batch, seconds, static_cast<int>(top), json);
          !s.ok()) {
        fprintf(stderr, "numaserve bench: profiling batch %lld: %s\n",
                static_cast<long long>(batch), std::string(s.message()).c_str());
        return 1;
      }
    }
    fflush(stdout);
  }
  return 0;
}

}  // namespace numaserve::server
