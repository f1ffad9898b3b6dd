#include "tools/numaserve/bench_command.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "affinity/cpu_features.h"
#include "base/args.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/onednn/onednn_common.h"
#include "tools/numaserve/model_runs.h"

namespace numaserve::cli {
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
                                     double peak_gflops, const IndexBounds& bounds) {
  const engine::ModelInfo& info = model.info();
  absl::StatusOr<RunBuffers> made = MakeRunBuffers(model, batch, bounds);
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
                          bool json, const IndexBounds& bounds) {
  auto measured = ProfileRuns(model, batch, seconds, 5, 0, bounds);
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
                       double serial_below_mflops, const IndexBounds& bounds) {
  absl::StatusOr<RunBuffers> buffers = MakeRunBuffers(model, batch, bounds);
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

// The flags of `numaserve bench`, with their defaults.
struct BenchOptions {
  std::string model_path, batches_text = "1,8,32", gemm = "auto", conv = "winograd";
  std::string attention = "fused", precision_name = "fp32", layout = "auto";
  std::string int8_kernels = "auto";
  int64_t threads = 0;
  double seconds = 3.0;
  bool json = false, plan = false, profile = false;
  // --index-bounds: integer inputs drawn below their table's rows.
  std::string index_bounds_text;
  IndexBounds index_bounds;
  int64_t top = 15;
  double serial_below_mflops = -1;
  double batch_split_mb = -1;
  double bf16_min_flops = -1;
  int64_t batch_groups = 1;
  serving::ProcessOptions process;  // --max-isa, --gemm-cache, ...
};

// What is run and what is printed: the model, batch sizes, time and output.
void AddRunFlags(base::ArgParser& parser, BenchOptions& o) {
  parser.AddString("model", &o.model_path, "ONNX model file (required)");
  parser.AddString("batch", &o.batches_text, "comma-separated batch sizes");
  parser.AddInt("threads", &o.threads, "kernel threads (0 = OMP_NUM_THREADS or all cores)");
  parser.AddDouble("seconds", &o.seconds, "measured time per batch size");
  parser.AddBool("json", &o.json, "one JSON object per line per batch size");
  parser.AddBool(
      "plan", &o.plan,
      "print the GEMM libraries and the compiled plan first: one line per kernel step with "
      "its layouts and the implementation it ran on at the first batch size, "
      "reference implementations flagged");
  parser.AddBool("profile", &o.profile,
                 "after each batch size's measured runs, time every compiled step for as long "
                 "again and print where the time goes: per step kind, the costliest steps (share "
                 "of the time in steps, GFLOP/s) and every layout boundary and residual reorder");
  parser.AddInt("top", &o.top, "--profile: the costliest steps listed (0 = all)");
  parser.AddString("index-bounds", &o.index_bounds_text,
                   "integer inputs drawn uniformly below a bound, as name=bound,... "
                   "(input_ids=30522,token_type_ids=2: ids within the rows of the table a "
                   "Gather reads them from); other integer inputs are 0..9");
}

// How the model is compiled (engine::CompileOptions).
void AddCompileFlags(base::ArgParser& parser, BenchOptions& o) {
  parser.AddString("conv", &o.conv,
                   "3x3 stride-1 conv algorithm: direct | winograd (oneDNN's on AVX-512, "
                   "numaserve's own F(4x4, 3x3) on the AVX2 tier, where the layer fits it)");
  parser.AddString("layout", &o.layout,
                   "activations between convs and pools: auto (channels-last where a conv runs "
                   "INT8 or a model with convs runs BF16 on AMX, the channel-blocked layout of "
                   "the tier otherwise) | blocked | nhwc");
  parser.AddString("attention", &o.attention,
                   "scaled dot-product attention (MatMul, scale, Softmax, MatMul): fused (one "
                   "step on the own kernel) | unfused (each op its own step)");
  parser.AddDouble("bf16-min-flops", &o.bf16_min_flops,
                   "--precision bf16: a conv or weight matmul runs BF16 only where it does at "
                   "least this many FLOPs per element of its input (-1 = the default, "
                   "CompileOptions::bf16_min_flops_per_input; 0 = all)");
  parser.AddString("precision", &o.precision_name,
                   "fp32 | bf16 (convs and weight matmuls in BF16 with FP32 accumulation, "
                   "weights converted at load; refused where the CPU has no native BF16)");
  parser.AddString("int8-kernels", &o.int8_kernels,
                   "a QDQ model's convs and matmuls: auto (oneDNN's INT8 kernels where the CPU "
                   "has VNNI or AMX, FP32 on the dequantized weights without: there the INT8 "
                   "products take two passes) | on (INT8 kernels on any CPU) | off (FP32)");
  parser.AddString("gemm", &o.gemm,
                   "GEMM backend: onednn | blis | openblas | numaserve (the own AVX2 kernel) | "
                   "auto (each timed once per shape at "
                   "load, the fastest kept)");
  parser.AddDouble("serial-below-mflops", &o.serial_below_mflops,
                   "run steps below this many MFLOP on one thread (-1 = derived from the cost of "
                   "an OpenMP fork-join measured at load; 0 = never)");
  parser.AddDouble(
      "batch-split-mb", &o.batch_split_mb,
      "run leading row-wise steps (conv, pool, matmul, layer norm, attention) in slices of "
      "the batch that stay in a cache of this many MiB, as far as that saves more memory "
      "traffic than re-reading their weights per slice costs (-1 = the last-level cache; "
      "0 = never)");
  parser.AddInt("batch-groups", &o.batch_groups,
                "run a batch of enough rows as this many row ranges at once, each on a copy of "
                "the model with its share of the threads (1 = off, the default)");
}

// Checks the flags' values and prints the first problem (false: exit 2);
// the batch sizes and the precision they name go to *batches, *precision.
bool CheckBenchFlags(const BenchOptions& o, std::vector<int64_t>* batches,
                     engine::Precision* precision) {
  if (o.model_path.empty()) {
    fprintf(stderr, "numaserve bench: --model is required\n");
    return false;
  }
  for (absl::string_view part : absl::StrSplit(o.batches_text, ',', absl::SkipEmpty())) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) {
      fprintf(stderr, "numaserve bench: --batch: '%s' is not a batch size >= 1\n",
              std::string(part).c_str());
      return false;
    }
    batches->push_back(b);
  }
  if (batches->empty()) {
    fprintf(stderr, "numaserve bench: --batch: no batch size in '%s'\n", o.batches_text.c_str());
    return false;
  }
  if (o.threads < 0 || o.seconds <= 0) {
    fprintf(stderr, "numaserve bench: --threads must be >= 0 and --seconds > 0\n");
    return false;
  }
  if (o.conv != "direct" && o.conv != "winograd") {
    fprintf(stderr, "numaserve bench: --conv: '%s' is not one of direct, winograd\n",
            o.conv.c_str());
    return false;
  }
  if (o.layout != "auto" && o.layout != "blocked" && o.layout != "nhwc") {
    fprintf(stderr, "numaserve bench: --layout: '%s' is not one of auto, blocked, nhwc\n",
            o.layout.c_str());
    return false;
  }
  if (o.attention != "fused" && o.attention != "unfused") {
    fprintf(stderr, "numaserve bench: --attention: '%s' is not one of fused, unfused\n",
            o.attention.c_str());
    return false;
  }
  if (o.int8_kernels != "auto" && o.int8_kernels != "on" && o.int8_kernels != "off") {
    fprintf(stderr, "numaserve bench: --int8-kernels: '%s' is not one of auto, on, off\n",
            o.int8_kernels.c_str());
    return false;
  }
  if (o.top < 0) {
    fprintf(stderr, "numaserve bench: --top must be >= 0\n");
    return false;
  }
  if (o.batch_groups < 1 || o.batch_groups > 1024) {
    fprintf(stderr, "numaserve bench: --batch-groups must be between 1 and 1024\n");
    return false;
  }
  if (absl::Status s = engine::CheckGemmBackendChoice(o.gemm); !s.ok()) {
    fprintf(stderr, "numaserve bench: --gemm: %s\n", std::string(s.message()).c_str());
    return false;
  }
  const absl::StatusOr<engine::Precision> parsed = engine::PrecisionFromName(o.precision_name);
  if (!parsed.ok()) {
    fprintf(stderr, "numaserve bench: --precision: %s\n",
            std::string(parsed.status().message()).c_str());
    return false;
  }
  *precision = *parsed;
  return true;
}

// The compile options the (checked) flags ask for.
engine::CompileOptions BenchCompileOptions(const BenchOptions& o, engine::Precision precision) {
  engine::CompileOptions options{.num_threads = static_cast<int>(o.threads),
                                 .gemm_backend = o.gemm,
                                 .gemm_cache_file = o.process.gemm_cache,
                                 .conv_algorithm = o.conv};
  options.profile_steps = o.process.profile_steps;
  options.fuse_attention = o.attention == "fused";
  using Layout = engine::CompileOptions::ActivationLayout;
  options.activation_layout = o.layout == "blocked" ? Layout::kChannelBlocked
                              : o.layout == "nhwc"  ? Layout::kChannelsLast
                                                    : Layout::kAuto;
  options.precision = precision;
  using Int8Kernels = engine::CompileOptions::Int8Kernels;
  options.int8_kernels = o.int8_kernels == "on"    ? Int8Kernels::kAlways
                         : o.int8_kernels == "off" ? Int8Kernels::kNever
                                                   : Int8Kernels::kAuto;
  options.batch_groups = static_cast<int>(o.batch_groups);
  if (o.bf16_min_flops >= 0) options.bf16_min_flops_per_input = o.bf16_min_flops;
  if (o.serial_below_mflops >= 0) options.serial_below_flops = o.serial_below_mflops * 1e6;
  if (o.batch_split_mb >= 0) {
    options.batch_split_cache_bytes = static_cast<int64_t>(o.batch_split_mb * (1 << 20));
  }
  return options;
}

// --plan: the GEMM libraries, then the compiled plan at `batch` (the first
// batch size). False, with the error printed, if the plan cannot be shown.
bool PrintLibrariesAndPlan(engine::CompiledModel& model, const BenchOptions& o, int64_t batch) {
  for (kernels::GemmBackend b : kernels::kAllGemmBackends) {
    printf("gemm %s: %s\n", kernels::GemmBackendName(b), kernels::GemmBackendDetails(b).c_str());
  }
  const int model_threads = o.threads > 0 ? static_cast<int>(o.threads) : omp_get_max_threads();
  if (absl::Status s =
          PrintPlan(model, batch, model_threads, o.serial_below_mflops, o.index_bounds);
      !s.ok()) {
    fprintf(stderr, "numaserve bench: --plan: %s\n", std::string(s.message()).c_str());
    return false;
  }
  return true;
}

// The peak the batches' GFLOP/s are held against, for all threads.
struct BenchPeak {
  bool int8 = false;         // INT8 kernels ran: the figures are GOP/s
  const char* of = nullptr;  // "INT8", "BF16" or "FP32"
  double gflops = 0;
};

// The peak, on `used_threads` cores, of the precision the convs and matmuls
// run at; INT8 is told from the plan after one run at `first_batch`.
BenchPeak PeakFor(engine::CompiledModel& model, int64_t first_batch, engine::Precision precision,
                  int used_threads, const IndexBounds& bounds) {
  // BF16: fractions of the BF16 peak (AMX tiles or AVX512_BF16 dot
  // products), which the convs and matmuls run at.
  const bool bf16 = precision == engine::Precision::kBf16;
  // A QDQ model whose convs and matmuls run on INT8 kernels: fractions of
  // the INT8 peak (VNNI dot products: 4x FP32's operations per cycle; AMX
  // tiles), told from the plan after one run.
  bool int8 = false;
  if (affinity::GetPeakFlops().peak_int8_gops_per_core > 0 &&
      (model.info().batched || first_batch == 1)) {
    absl::StatusOr<RunBuffers> warm = MakeRunBuffers(model, first_batch, bounds);
    if (warm.ok() && model.Run(first_batch, warm->in_ptrs, warm->out_ptrs).ok()) {
      if (auto plan = model.PlanAt(first_batch); plan.ok()) {
        for (const engine::PlannedStep& step : *plan) {
          int8 = int8 || step.implementation.find("int8") != std::string::npos;
        }
      }
    }
  }
  BenchPeak peak;
  peak.int8 = int8;
  peak.of = int8 ? "INT8" : bf16 ? "BF16" : "FP32";
  peak.gflops = (int8   ? affinity::GetPeakFlops().peak_int8_gops_per_core
                 : bf16 ? affinity::GetPeakFlops().peak_bf16_gflops_per_core
                        : kernels::Fp32PeakGflopsPerCore()) *
                used_threads;
  return peak;
}

// One batch size's figures: a JSON line, or a table row (and, under the
// first effective row, the note on what "e" means).
void PrintBatchResult(const BenchOptions& o, engine::Precision precision, int used_threads,
                      const BenchPeak& peak, const BatchResult& r, bool* noted_effective) {
  if (o.json) {
    printf(
        "{\"model\": \"%s\", \"precision\": \"%s\", \"batch\": %lld, \"threads\": %d, "
        "\"iterations\": %lld, "
        "\"inferences_per_second\": %.3f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
        "\"gflops\": %.3f, \"peak_fraction\": %.4f, \"peak_fraction_kind\": \"%s\", "
        "\"peak_of\": \"%s\", \"activation_bytes\": %lld}\n",
        o.model_path.c_str(), engine::PrecisionName(precision), static_cast<long long>(r.batch),
        used_threads, static_cast<long long>(r.iterations), r.inferences_per_second, r.p50_ms,
        r.p99_ms, r.gflops, r.peak_fraction, r.effective ? "effective" : "actual", peak.of,
        static_cast<long long>(r.activation_bytes));
  } else {
    printf("%6lld %12.1f %10.3f %10.3f %10.1f %7.3f%s %10.1f\n", static_cast<long long>(r.batch),
           r.inferences_per_second, r.p50_ms, r.p99_ms, r.gflops, r.peak_fraction,
           r.effective ? "e" : " ", r.activation_bytes / 1e6);
    if (r.effective && !*noted_effective) {
      printf("       (e: effective: Winograd convs counted at their direct FLOPs)\n");
      *noted_effective = true;
    }
  }
}

// Prints the header (text output), then measures, prints and (--profile)
// profiles each batch size the model can run. Returns the exit code.
int RunBatches(engine::CompiledModel& model, const BenchOptions& o,
               const std::vector<int64_t>& batches, engine::Precision precision, int used_threads,
               const BenchPeak& peak) {
  if (!o.json) {
    printf("%s: %.2f GFLOP per row, %d threads, %s peak %.0f G%s/s\n", o.model_path.c_str(),
           model.info().flops_per_row / 1e9, used_threads, peak.of, peak.gflops,
           peak.int8 ? "OP" : "FLOP");
    printf("%6s %12s %10s %10s %10s %8s %10s\n", "batch", "infer/s", "p50_ms", "p99_ms", "GFLOP/s",
           "peak", "act_MB");
  }
  bool noted_effective = false;
  // A model that is not batched (its rows are not independent, or an
  // output's shape does not follow them) still runs a batch of rows as
  // one request where an input's dim 0 is dynamic; without one it runs
  // batch 1 alone.
  bool takes_rows = false;
  for (const engine::TensorInfo& t : model.info().inputs) {
    takes_rows = takes_rows || (!t.shape.empty() && t.shape[0] < 0);
  }
  if (!model.info().batched && takes_rows && (batches.size() > 1 || batches.front() != 1)) {
    fprintf(stderr, "numaserve bench: %s is not batched (%s): a batch runs as one request\n",
            o.model_path.c_str(), model.info().unbatched_reason.c_str());
  }
  for (int64_t batch : batches) {
    if (!model.info().batched && !takes_rows && batch != 1) {
      fprintf(stderr, "numaserve bench: %s has no dynamic dim 0; skipping batch %lld\n",
              o.model_path.c_str(), static_cast<long long>(batch));
      continue;
    }
    auto r = RunBatch(model, batch, o.seconds, peak.gflops, o.index_bounds);
    if (!r.ok()) {
      fprintf(stderr, "numaserve bench: batch %lld: %s\n", static_cast<long long>(batch),
              std::string(r.status().message()).c_str());
      return 1;
    }
    PrintBatchResult(o, precision, used_threads, peak, *r, &noted_effective);
    if (o.profile) {
      if (absl::Status s = ProfileBatch(model, batch, o.seconds, static_cast<int>(o.top), o.json,
                                        o.index_bounds);
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

}  // namespace

int BenchCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process) {
  BenchOptions o;
  o.process = process;
  base::ArgParser parser(
      "bench",
      "run a model in process per batch size: inferences/s, p50/p99 latency, "
      "GFLOP/s and the fraction of peak (FP32, BF16 with --precision bf16, INT8 for a QDQ "
      "model on INT8 kernels)");
  AddRunFlags(parser, o);
  AddCompileFlags(parser, o);
  serving::AddProcessFlags(parser, o.process, serving::kKernelFlags | serving::kModelFlags);
  if (absl::Status s = parser.Parse(args); !s.ok()) {
    fprintf(stderr, "numaserve bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (absl::Status s = serving::ApplyProcessOptions(o.process); !s.ok()) {
    fprintf(stderr, "numaserve bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  std::vector<int64_t> batches;
  engine::Precision precision = engine::Precision::kFp32;
  if (!CheckBenchFlags(o, &batches, &precision)) return 2;
  auto bounds = ParseIndexBounds(o.index_bounds_text);
  if (!bounds.ok()) {
    fprintf(stderr, "numaserve bench: --index-bounds: %s\n",
            std::string(bounds.status().message()).c_str());
    return 2;
  }
  o.index_bounds = *std::move(bounds);
  auto model = engine::CompiledModel::Load(o.model_path, BenchCompileOptions(o, precision));
  if (!model.ok()) {
    fprintf(stderr, "numaserve bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  if (const std::string note = (*model)->DescribeInt8Kernels(); !note.empty()) {
    fprintf(stderr, "numaserve: %s: %s\n", o.model_path.c_str(), note.c_str());
  }
  if (o.plan && !PrintLibrariesAndPlan(**model, o, batches.front())) return 1;
  const int used_threads = o.threads > 0 ? static_cast<int>(o.threads) : omp_get_max_threads();
  const BenchPeak peak = PeakFor(**model, batches.front(), precision, used_threads, o.index_bounds);
  return RunBatches(**model, o, batches, precision, used_threads, peak);
}

}  // namespace numaserve::cli
