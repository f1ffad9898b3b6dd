// CPU features from CPUID, confirmed by the OS (XGETBV for AVX / AVX-512
// state, arch_prctl for AMX tile data). cpu_features.cc is compiled without
// any -m flags so nothing of a wider ISA leaks into the probe.
#pragma once

#include <string>

namespace numaserve::affinity {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD"
  std::string brand;   // "Intel(R) Xeon(R) Platinum 8480+"
  int family = 0, model = 0, stepping = 0;
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // Each flag above is true only if the CPU has it AND the OS enabled its state.
  bool os_avx = false, os_avx512 = false, os_amx = false;  // what the OS allows, for reports
};

// Probed once, thread-safe. For AMX it requests tile-data permission from the
// kernel (ARCH_REQ_XCOMP_PERM); without that permission amx_* stay false.
const CpuFeatures& GetCpuFeatures();

// "avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_int8"
std::string FeatureList(const CpuFeatures& features);

// The machine's speed of light for FP32 on one core.
struct PeakFlops {
  int vector_bits = 0;                       // widest usable FP32 FMA vector: 512, 256 or 128
  int fma_units = 0;                         // FMA pipes per core, from the probe (1 or 2)
  double nominal_ghz = 0;                    // base clock from CPUID leaf 0x16 or /proc/cpuinfo
  double probe_ghz = 0;                      // clock measured while FMAs of the chosen width run
  double scalar_ghz = 0;                     // clock under scalar work only (a dependent add chain)
  double peak_gflops_per_core = 0;           // probe_ghz * (vector_bits/32) * 2 * fma_units
  double measured_gflops_per_core = 0;       // FMA-throughput probe at the widest width
  double measured_avx2_gflops_per_core = 0;  // the same with 256-bit vectors (0 without AVX2)
};

// Runs a short (~20 ms) FMA-throughput probe on the calling thread, once;
// later calls return the cached figures.
const PeakFlops& GetPeakFlops();

}  // namespace numaserve::affinity
