#include "kernels/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "affinity/cpu_features.h"
#include "kernels/cpu/row_kernels.h"

namespace numaserve::kernels {
namespace {

constexpr KernelTable kScalar = {IsaTier::kScalar, cpu::softmax_rows__scalar,
                                 cpu::layer_norm_rows__scalar, cpu::add_row_broadcast__scalar,
                                 cpu::mul_row_broadcast__scalar};
constexpr KernelTable kAvx2 = {IsaTier::kAvx2, cpu::softmax_rows__avx2, cpu::layer_norm_rows__avx2,
                               cpu::add_row_broadcast__avx2, cpu::mul_row_broadcast__avx2};
constexpr KernelTable kAvx512 = {IsaTier::kAvx512, cpu::softmax_rows__avx512,
                                 cpu::layer_norm_rows__avx512, cpu::add_row_broadcast__avx512,
                                 cpu::mul_row_broadcast__avx512};

bool CpuHasAvx2() {
  const auto& f = affinity::GetCpuFeatures();
  return f.avx2 && f.fma;
}

bool CpuHasAvx512() {
  const auto& f = affinity::GetCpuFeatures();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma;
}

std::once_flag once;
DispatchDecision decision;
const KernelTable* table = &kScalar;

void Init() {
  const auto& f = affinity::GetCpuFeatures();
  const char* cap = std::getenv("NUMASERVE_MAX_ISA");
  decision = DecideTier(CpuHasAvx2(), CpuHasAvx512(), f.amx_bf16, cap != nullptr ? cap : "");
  table = decision.tier == IsaTier::kAvx512 ? &kAvx512
          : decision.tier == IsaTier::kAvx2 ? &kAvx2
                                            : &kScalar;
  if (!decision.onednn_cap.empty()) {
    const dnnl::cpu_isa isa = decision.onednn_cap == "avx2"          ? dnnl::cpu_isa::avx2
                              : decision.onednn_cap == "avx512_core" ? dnnl::cpu_isa::avx512_core
                                                                     : dnnl::cpu_isa::all;
    try {
      dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error& e) {
      decision.skipped.push_back(std::string("oneDNN cap not applied: ") + e.what());
    }
  }
  std::string line = std::string("numaserve: kernels: ") + IsaTierName(decision.tier);
  if (!decision.onednn_cap.empty()) line += ", oneDNN capped at " + decision.onednn_cap;
  for (const std::string& s : decision.skipped) line += "; skipped " + s;
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

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
  if (cap == "avx2") {
    max_rank = 1;
    d.onednn_cap = "avx2";
  } else if (cap == "avx512") {
    max_rank = 2;
    d.onednn_cap = "avx512_core";
  } else if (!cap.empty() && cap != "amx") {
    d.skipped.push_back("the cap: NUMASERVE_MAX_ISA=" + cap +
                        " is not one of avx2, avx512, amx (ignored)");
  }
  if (!has_amx && max_rank >= 3) {
    d.skipped.push_back("amx: not supported by this CPU/OS (own kernels have no AMX tier)");
  }
  if (!has_avx512) {
    d.skipped.push_back("avx512: the CPU/OS lacks AVX-512F/BW/VL/DQ");
  } else if (max_rank < 2) {
    d.skipped.push_back("avx512: capped by NUMASERVE_MAX_ISA=" + cap);
  } else {
    d.tier = IsaTier::kAvx512;
    return d;
  }
  if (!has_avx2_fma) {
    d.skipped.push_back("avx2: the CPU/OS lacks AVX2+FMA");
  } else {
    d.tier = IsaTier::kAvx2;
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
