#include "kernels/dispatch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "affinity/cpu_features.h"
#include "base/log.h"
#include "base/mutex.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels {
namespace {

constexpr KernelTable kScalar = {IsaTier::kScalar,
                                 cpu::softmax_rows_scalar,
                                 cpu::layer_norm_rows_scalar,
                                 cpu::add_row_broadcast_scalar,
                                 cpu::mul_row_broadcast_scalar,
                                 cpu::reduce_rows_scalar,
                                 cpu::transpose_2d_scalar,
                                 cpu::attention_head_scalar,
                                 cpu::bias_activation_rows_scalar};
constexpr KernelTable kAvx2 = {IsaTier::kAvx2,
                               cpu::softmax_rows_avx2,
                               cpu::layer_norm_rows_avx2,
                               cpu::add_row_broadcast_avx2,
                               cpu::mul_row_broadcast_avx2,
                               cpu::reduce_rows_avx2,
                               cpu::transpose_2d_avx2,
                               cpu::attention_head_avx2,
                               cpu::bias_activation_rows_avx2};
constexpr KernelTable kAvx512 = {IsaTier::kAvx512,
                                 cpu::softmax_rows_avx512,
                                 cpu::layer_norm_rows_avx512,
                                 cpu::add_row_broadcast_avx512,
                                 cpu::mul_row_broadcast_avx512,
                                 cpu::reduce_rows_avx512,
                                 cpu::transpose_2d_avx512,
                                 cpu::attention_head_avx512,
                                 cpu::bias_activation_rows_avx512};

bool CpuHasAvx2() {
  const auto& f = affinity::GetCpuFeatures();
  return f.avx2 && f.fma;
}

bool CpuHasAvx512() {
  const auto& f = affinity::GetCpuFeatures();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma;
}

// oneDNN's cap for a max_isa: "avx2", "avx512_core", or "" for none.
std::string OnednnCapFor(const std::string& max_isa) {
  if (max_isa == "avx2") return "avx2";
  if (max_isa == "avx512") return "avx512_core";
  return "";
}

// SetDispatchOptions' options, read once by Init, which then refuses any
// later setting.
base::Mutex options_mu;
DispatchOptions options ABSL_GUARDED_BY(options_mu);
bool options_set ABSL_GUARDED_BY(options_mu) = false;
bool table_made ABSL_GUARDED_BY(options_mu) = false;

std::once_flag once;
DispatchDecision decision;
const KernelTable* table = &kScalar;

void Init() {
  const auto& f = affinity::GetCpuFeatures();
  std::string cap;
  {
    base::MutexLock lock(&options_mu);
    cap = options.max_isa;
    table_made = true;
  }
  decision = DecideTier(CpuHasAvx2(), CpuHasAvx512(), f.amx_bf16, cap);
  if (decision.tier == IsaTier::kAvx512 && decision.cap.empty() && CpuHasAvx2()) {
    decision.avx512_probe_us = ProbeMicroseconds(kAvx512, 7);
    decision.avx2_probe_us = ProbeMicroseconds(kAvx2, 7);
    if (decision.avx2_probe_us < decision.avx512_probe_us) {
      decision.tier = IsaTier::kAvx2;
      decision.skipped.push_back("avx512: slower than avx2 on this CPU at start-up");
    }
  }
  table = decision.tier == IsaTier::kAvx512 ? &kAvx512
          : decision.tier == IsaTier::kAvx2 ? &kAvx2
                                            : &kScalar;
  // SetDispatchOptions applied the oneDNN cap already.
  std::string line = std::string("kernels: ") + IsaTierName(decision.tier);
  if (!decision.onednn_cap.empty()) line += ", oneDNN capped at " + decision.onednn_cap;
  if (decision.avx512_probe_us > 0) {
    char probe[128];
    std::snprintf(probe, sizeof(probe), " (start-up probe: avx512 %.1f us, avx2 %.1f us)",
                  decision.avx512_probe_us, decision.avx2_probe_us);
    line += probe;
  }
  for (const std::string& s : decision.skipped) line += "; skipped " + s;
  std::vector<base::LogField> fields = {{"tier", IsaTierName(decision.tier)}};
  if (!decision.onednn_cap.empty()) fields.emplace_back("onednn_cap", decision.onednn_cap);
  if (decision.avx512_probe_us > 0) {
    fields.emplace_back("avx512_probe_us", decision.avx512_probe_us);
    fields.emplace_back("avx2_probe_us", decision.avx2_probe_us);
  }
  if (!decision.skipped.empty()) {
    std::string skipped;
    for (const std::string& s : decision.skipped) skipped += (skipped.empty() ? "" : "; ") + s;
    fields.emplace_back("skipped", skipped);
  }
  base::Log(base::LogLevel::kInfo, "dispatch", line, fields);
}

}  // namespace

absl::Status CheckMaxIsa(const std::string& max_isa) {
  if (max_isa.empty() || max_isa == "avx2" || max_isa == "avx512" || max_isa == "amx") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", max_isa, "' is not one of avx2, avx512, amx"));
}

absl::Status SetDispatchOptions(const DispatchOptions& new_options) {
  if (absl::Status s = CheckMaxIsa(new_options.max_isa); !s.ok()) return s;
  base::MutexLock lock(&options_mu);
  if (new_options.max_isa == options.max_isa) {  // nothing changes
    options_set = true;
    return absl::OkStatus();
  }
  if (table_made || options_set) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ISA cap is set once, at the start of the process, before any kernel runs; it is ",
        options.max_isa.empty() ? "none" : options.max_isa, " already"));
  }
  // Applied before anything in this process touches oneDNN.
  const std::string onednn_cap = OnednnCapFor(new_options.max_isa);
  if (!onednn_cap.empty()) {
    const dnnl::cpu_isa isa =
        onednn_cap == "avx2" ? dnnl::cpu_isa::avx2 : dnnl::cpu_isa::avx512_core;
    try {
      dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error& e) {
      return absl::FailedPreconditionError(absl::StrCat("oneDNN refused the ISA cap ", onednn_cap,
                                                        " (", e.what(),
                                                        "): set it before anything uses oneDNN"));
    }
  }
  options = new_options;
  options_set = true;
  return absl::OkStatus();
}

std::string DescribeIsaCap(const std::string& cap) {
  return absl::StrCat("--max-isa=", cap, " (NUMASERVE_MAX_ISA)");
}

double ProbeMicroseconds(const KernelTable& table, int reps) {
  constexpr int64_t kRows = 64, kLen = 1024;
  std::vector<float> x(kRows * kLen), y(kRows * kLen), scale(kLen, 1.0f), bias(kLen, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) * 0.01f;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    table.softmax_rows(x.data(), y.data(), kRows, kLen);
    table.layer_norm_rows(x.data(), scale.data(), bias.data(), 1e-5f, y.data(), kRows, kLen);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, us);
  }
  return best;
}

const char* IsaTierName(IsaTier tier) {
  switch (tier) {
    case IsaTier::kScalar:
      return "scalar";
    case IsaTier::kAvx2:
      return "avx2";
    case IsaTier::kAvx512:
      return "avx512";
  }
  return "?";
}

DispatchDecision DecideTier(bool has_avx2_fma, bool has_avx512, bool has_amx,
                            const std::string& cap) {
  DispatchDecision d;
  d.cap = cap;
  int max_rank = 3;  // 0 scalar, 1 avx2, 2 avx512, 3 amx (no own AMX kernels yet)
  d.onednn_cap = OnednnCapFor(cap);
  if (cap == "avx2") {
    max_rank = 1;
  } else if (cap == "avx512") {
    max_rank = 2;
  } else if (!cap.empty() && cap != "amx") {
    d.skipped.push_back("the cap: " + DescribeIsaCap(cap) +
                        " is not one of avx2, avx512, amx (ignored)");
  }
  if (!has_amx && max_rank >= 3) {
    d.skipped.push_back("amx: not supported by this CPU/OS (own kernels have no AMX tier)");
  }
  if (!has_avx512) {
    d.skipped.push_back("avx512: the CPU/OS lacks AVX-512F/BW/VL/DQ");
  } else if (max_rank < 2) {
    d.skipped.push_back("avx512: capped by " + DescribeIsaCap(cap));
  } else {
    d.tier = d.max_tier = IsaTier::kAvx512;
    return d;
  }
  if (!has_avx2_fma) {
    d.skipped.push_back("avx2: the CPU/OS lacks AVX2+FMA");
  } else {
    d.tier = d.max_tier = IsaTier::kAvx2;
  }
  return d;
}

const KernelTable& GetKernelTable() {
  std::call_once(once, Init);
  return *table;
}

const DispatchDecision& GetDispatchDecision() {
  std::call_once(once, Init);
  return decision;
}

double Fp32PeakGflopsPerCore() {
  const affinity::PeakFlops& peak = affinity::GetPeakFlops();
  switch (GetDispatchDecision().max_tier) {
    case IsaTier::kAvx512:
      return peak.peak_gflops_per_core;
    case IsaTier::kAvx2:
      return peak.peak_avx2_gflops_per_core;
    case IsaTier::kScalar:
      break;
  }
  return peak.vector_bits <= 128 ? peak.peak_gflops_per_core : 0;
}

std::string IsaDescription() {
  const DispatchDecision& d = GetDispatchDecision();
  const char* onednn = "?";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      onednn = "sse41";
      break;
    case dnnl::cpu_isa::avx:
      onednn = "avx";
      break;
    case dnnl::cpu_isa::avx2:
      onednn = "avx2";
      break;
    case dnnl::cpu_isa::avx2_vnni:
      onednn = "avx2_vnni";
      break;
    case dnnl::cpu_isa::avx512_core:
      onednn = "avx512_core";
      break;
    case dnnl::cpu_isa::avx512_core_vnni:
      onednn = "avx512_core_vnni";
      break;
    case dnnl::cpu_isa::avx512_core_bf16:
      onednn = "avx512_core_bf16";
      break;
    case dnnl::cpu_isa::avx512_core_amx:
      onednn = "avx512_core_amx";
      break;
    default:
      break;
  }
  return std::string(IsaTierName(d.max_tier)) + ", oneDNN " + onednn;
}

Bf16Support DecideBf16(bool cpu_avx512_bf16, bool cpu_amx_bf16, IsaTier max_tier,
                       const std::string& cap, bool onednn_bf16, bool onednn_amx) {
  Bf16Support s;
  if (!cpu_avx512_bf16 && !cpu_amx_bf16) {
    s.reason = "this CPU/OS has neither AVX512_BF16 nor AMX-BF16";
  } else if (max_tier != IsaTier::kAvx512) {
    s.reason = cap.empty() ? std::string("the AVX-512 tier is not usable here")
                           : "capped by " + DescribeIsaCap(cap) + " (no BF16 below AVX-512)";
  } else if (!onednn_bf16) {
    s.reason = std::string("oneDNN is capped below its BF16 kernels") +
               (cap.empty() ? " (DNNL_MAX_CPU_ISA)" : " by " + DescribeIsaCap(cap)) +
               ", where it only emulates BF16";
  } else {
    s.native = true;
    s.path = cpu_amx_bf16 && onednn_amx ? "amx_bf16" : "avx512_bf16";
  }
  return s;
}

const Bf16Support& GetBf16Support() {
  static const Bf16Support support = [] {
    const DispatchDecision& d = GetDispatchDecision();  // no cap is set after this
    const auto& f = affinity::GetCpuFeatures();
    const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto has = [isa](dnnl::cpu_isa want) {
      const unsigned w = static_cast<unsigned>(want);
      return (isa & w) == w;
    };
    return DecideBf16(f.avx512_bf16, f.amx_bf16, d.max_tier, d.cap,
                      has(dnnl::cpu_isa::avx512_core_bf16), has(dnnl::cpu_isa::avx512_core_amx));
  }();
  return support;
}

const KernelTable* KernelTableFor(IsaTier tier) {
  switch (tier) {
    case IsaTier::kScalar:
      return &kScalar;
    case IsaTier::kAvx2:
      return CpuHasAvx2() ? &kAvx2 : nullptr;
    case IsaTier::kAvx512:
      return CpuHasAvx512() ? &kAvx512 : nullptr;
  }
  return nullptr;
}

}  // namespace numaserve::kernels
