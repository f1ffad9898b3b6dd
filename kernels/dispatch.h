// The one dispatch table for numaserve's own kernels, filled once (on first
// use) from affinity's CPU features. Tiers in order of preference:
// avx512 (AVX-512F/BW/VL/DQ + FMA), avx2 (AVX2 + FMA), scalar. A cap
// (DispatchOptions::max_isa: avx2|avx512|amx) limits the tier and also
// oneDNN (dnnl::set_max_cpu_isa), so both run the same ISA. The chosen
// tier and why each better tier was skipped are logged once (base/log.h,
// component "dispatch").
//
// The cap is set by whoever owns the process, once, at its start
// (SetDispatchOptions): numaserve's main from `--max-isa` or
// NUMASERVE_MAX_ISA (docs/configuration.md), a test's or a benchmark's
// main from its own choice. The kernels read no environment variable for
// it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels {

enum class IsaTier { kScalar, kAvx2, kAvx512 };
const char* IsaTierName(IsaTier tier);

struct KernelTable {
  IsaTier tier = IsaTier::kScalar;
  void (*softmax_rows)(const float* x, float* y, int64_t rows, int64_t len);
  void (*layer_norm_rows)(const float* x, const float* scale, const float* bias, float eps,
                          float* y, int64_t rows, int64_t len);
  void (*add_row_broadcast)(const float* x, const float* v, float* y, int64_t rows, int64_t len);
  void (*mul_row_broadcast)(const float* x, const float* v, float* y, int64_t rows, int64_t len);
  void (*reduce_rows)(const float* x, float* out, int64_t rows, int64_t len, cpu::ReduceOp op);
  void (*transpose_2d)(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols);
  void (*attention_head)(const cpu::AttentionHead& h, float* scratch);
  void (*bias_activation_rows)(float* y, const float* bias, int64_t rows, int64_t len,
                               cpu::RowActivation act);
};

// The process's dispatch settings.
struct DispatchOptions {
  // The widest ISA the own kernels and oneDNN may use: "" (no cap), "avx2"
  // (oneDNN at AVX2), "avx512" (oneDNN at AVX512_CORE) or "amx" (no lower
  // than the CPU's). To compare tiers, or to run as an AVX2-only machine
  // does.
  std::string max_isa;
};

// OK for a DispatchOptions::max_isa value; INVALID_ARGUMENT naming the
// accepted ones otherwise ("'sse9' is not one of avx2, avx512, amx").
absl::Status CheckMaxIsa(const std::string& max_isa);

// Sets this process's options and applies the cap to oneDNN at once
// (dnnl::set_max_cpu_isa, which wins over DNNL_MAX_CPU_ISA), so that oneDNN
// is capped from its first use whatever touches it first. Call once, at the
// start of main, before any kernel runs: FAILED_PRECONDITION once the
// dispatch table exists (GetKernelTable) or when oneDNN refuses the cap;
// INVALID_ARGUMENT for an unknown max_isa. Without a call the process runs
// uncapped.
absl::Status SetDispatchOptions(const DispatchOptions& options);

struct DispatchDecision {
  IsaTier tier = IsaTier::kScalar;
  // The widest tier this process may run: the CPU's, lowered by the cap
  // (DispatchOptions::max_isa). The own kernels may still use a narrower
  // one (the start-up probe below); oneDNN and the BLAS libraries are
  // configured for this one.
  IsaTier max_tier = IsaTier::kScalar;
  std::string cap;                   // DispatchOptions::max_isa ("" for none)
  std::vector<std::string> skipped;  // "avx512: capped by --max-isa=avx2 (NUMASERVE_MAX_ISA)"
  std::string onednn_cap;            // the oneDNN ISA cap applied ("" for none)
  // Without a cap, when both AVX-512 and AVX2 are usable, both own-kernel
  // tiers are timed at start-up on the same work (softmax and layer norm
  // over 64 x 1024 floats) and the faster one is used: on CPUs whose
  // AVX-512 runs at a lower clock or with one FMA unit, AVX2 can win.
  double avx512_probe_us = 0, avx2_probe_us = 0;  // best of several runs; 0 = not measured
};

// How a cap is named in messages: "--max-isa=avx2 (NUMASERVE_MAX_ISA)",
// the flag and the variable that set it in numaserve.
std::string DescribeIsaCap(const std::string& cap);

// Pure: the tier for these CPU flags and cap (empty cap = none). Errors in
// the cap are reported in `skipped` and ignored.
DispatchDecision DecideTier(bool has_avx2_fma, bool has_avx512, bool has_amx,
                            const std::string& cap);

// Times `table` on the start-up probe work; microseconds, best of `reps`.
double ProbeMicroseconds(const KernelTable& table, int reps);

// The process-wide table (std::call_once), under the cap SetDispatchOptions
// set; once it exists the cap is fixed.
const KernelTable& GetKernelTable();
const DispatchDecision& GetDispatchDecision();

// The FP32 peak of one core at the widest width this process may run
// (affinity::GetPeakFlops, its AVX2 figure under the cap avx2):
// what fractions of peak are quoted against.
double Fp32PeakGflopsPerCore();

// "avx512" / "avx2" / "scalar" (max_tier) with oneDNN's ISA: "avx2,
// oneDNN avx2". For caches of measured choices, which hold for one ISA.
std::string IsaDescription();

// The table of a given tier, for tests and benchmarks; null when this CPU
// cannot run it.
const KernelTable* KernelTableFor(IsaTier tier);

// Whether BF16 compute (a model's precision "bf16": convs and matmuls on
// oneDNN with BF16 inputs and FP32 accumulation) has a native path in this
// process: AMX-BF16 or AVX512_BF16 on the CPU and OS, the AVX-512 tier
// (not capped to avx2), and oneDNN's ISA reaching its BF16 kernels
// (avx512_core_bf16 or AMX; not capped to avx512 / DNNL_MAX_CPU_ISA=
// AVX512_CORE, where oneDNN only emulates BF16, slower than FP32). Never
// emulated: a model asking for BF16 where it is not native is refused with
// `reason`.
struct Bf16Support {
  bool native = false;
  std::string path;  // "amx_bf16" or "avx512_bf16" when native
  // Why not, when not native ("capped by --max-isa=avx2 (NUMASERVE_MAX_ISA)
  // (no BF16 below AVX-512)").
  std::string reason;
};

// Pure: the decision for these CPU flags (CPUID and OS support), the
// process's widest tier and cap (DispatchDecision), and oneDNN's effective
// ISA: whether it includes avx512_core_bf16 and AMX.
Bf16Support DecideBf16(bool cpu_avx512_bf16, bool cpu_amx_bf16, IsaTier max_tier,
                       const std::string& cap, bool onednn_bf16, bool onednn_amx);

// The process's decision (after the dispatch table has applied any cap to
// oneDNN), computed once.
const Bf16Support& GetBf16Support();

}  // namespace numaserve::kernels
