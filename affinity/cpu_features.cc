// Compiled with no -m flags and no LTO (affinity/CMakeLists.txt): this file
// decides whether wider code may run, so it must itself be baseline x86-64.
#include "affinity/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "affinity/fma_probe.h"

namespace numaserve::affinity {
namespace {

struct Regs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs Cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return Regs{};
  return r;
}

bool Bit(unsigned value, int bit) { return (value >> bit) & 1u; }

// XCR0: which register states the OS saves on context switch. Only valid
// when CPUID says OSXSAVE. Written as asm so no -mxsave is needed.
uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  asm volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux keeps AMX tile data off until a process asks (kernel >= 5.16).
bool RequestAmxPermission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures Probe() {
  CpuFeatures f;
  const Regs leaf0 = Cpuid(0);
  const unsigned max_leaf = leaf0.eax;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &leaf0.ebx, 4);
  std::memcpy(vendor + 4, &leaf0.edx, 4);
  std::memcpy(vendor + 8, &leaf0.ecx, 4);
  f.vendor = vendor;

  if (Cpuid(0x80000000).eax >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = Cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.eax, 4);
      std::memcpy(brand + 16 * i + 4, &r.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &r.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &r.edx, 4);
    }
    f.brand = std::string(absl::StripAsciiWhitespace(brand));
  }

  const Regs leaf1 = max_leaf >= 1 ? Cpuid(1) : Regs{};
  const int base_family = (leaf1.eax >> 8) & 0xf;
  const int base_model = (leaf1.eax >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + ((leaf1.eax >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? base_model | (((leaf1.eax >> 16) & 0xf) << 4)
                : base_model;
  f.stepping = leaf1.eax & 0xf;

  const bool osxsave = Bit(leaf1.ecx, 27);
  const uint64_t xcr0 = osxsave ? ReadXcr0() : 0;
  f.os_avx = Bit(leaf1.ecx, 28) && (xcr0 & 0x6) == 0x6;  // SSE + AVX state
  f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;       // opmask, ZMM_Hi256, Hi16_ZMM
  const bool xcr0_amx = (xcr0 & 0x60000) == 0x60000;     // XTILECFG, XTILEDATA

  const Regs leaf7 = max_leaf >= 7 ? Cpuid(7, 0) : Regs{};
  const Regs leaf7_1 = (max_leaf >= 7 && leaf7.eax >= 1) ? Cpuid(7, 1) : Regs{};

  f.fma = f.os_avx && Bit(leaf1.ecx, 12);
  f.avx2 = f.os_avx && Bit(leaf7.ebx, 5);
  f.avx512f = f.os_avx512 && Bit(leaf7.ebx, 16);
  f.avx512dq = f.avx512f && Bit(leaf7.ebx, 17);
  f.avx512bw = f.avx512f && Bit(leaf7.ebx, 30);
  f.avx512vl = f.avx512f && Bit(leaf7.ebx, 31);
  f.avx512_vnni = f.avx512f && Bit(leaf7.ecx, 11);
  f.avx512_bf16 = f.avx512f && Bit(leaf7_1.eax, 5);

  const bool cpu_amx = Bit(leaf7.edx, 24);
  f.os_amx = cpu_amx && xcr0_amx && RequestAmxPermission();
  f.amx_tile = f.os_amx;
  f.amx_bf16 = f.os_amx && Bit(leaf7.edx, 22);
  f.amx_int8 = f.os_amx && Bit(leaf7.edx, 25);
  return f;
}

// Base clock: CPUID leaf 0x16 (Intel, often zero under hypervisors), else
// the "@ 2.00GHz" of the brand string, else the kernel's "cpu MHz".
double NominalGhz(const CpuFeatures& features) {
  if (Cpuid(0).eax >= 0x16) {
    const unsigned mhz = Cpuid(0x16).eax & 0xffff;
    if (mhz > 0) return mhz / 1000.0;
  }
  if (size_t at = features.brand.rfind('@'); at != std::string::npos) {
    absl::string_view text =
        absl::StripAsciiWhitespace(absl::string_view(features.brand).substr(at + 1));
    double ghz = 0;
    if (absl::ConsumeSuffix(&text, "GHz") && absl::SimpleAtod(text, &ghz) && ghz > 0) return ghz;
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (!absl::StartsWith(line, "cpu MHz")) continue;
    const size_t colon = line.find(':');
    double mhz = 0;
    if (colon != std::string::npos &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(colon + 1)), &mhz)) {
      return mhz / 1000.0;
    }
  }
  return 0;
}

// The clock with no vector work: 32 dependent register adds per round, one
// per cycle on every x86 core.
double ScalarClockGhz(int64_t iterations) {
  uint64_t chain = 0, step = 1;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
#define NUMASERVE_ADD4                                                                       \
  "add %[step], %[chain]\n\tadd %[step], %[chain]\n\tadd %[step], %[chain]\n\tadd %[step], " \
  "%[chain]\n\t"
    asm volatile(NUMASERVE_ADD4 NUMASERVE_ADD4 NUMASERVE_ADD4 NUMASERVE_ADD4 NUMASERVE_ADD4
                     NUMASERVE_ADD4 NUMASERVE_ADD4 NUMASERVE_ADD4
                 : [chain] "+r"(chain)
                 : [step] "r"(step));
#undef NUMASERVE_ADD4
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile uint64_t sink = chain;
  (void)sink;
  return seconds > 0 ? static_cast<double>(iterations) * 32 / seconds * 1e-9 : 0;
}

// The best of a few short runs: a shared or virtualised core loses time to
// neighbours and interrupts, never gains it, so the maximum is the estimate.
template <typename Fn>
double BestOf(int runs, Fn&& run) {
  double best = 0;
  for (int i = 0; i < runs; ++i) best = std::max(best, run());
  return best;
}

// Method (a core's FP32 speed of light without knowing its clock):
//  1. Throughput: FMAs on 12 independent accumulators at the widest usable
//     width, timed -> measured GFLOP/s.
//  2. Clock at that width: a dependent add chain (1 add per cycle) run
//     beside FMAs of the same width, timed -> probe_ghz. Intel cores lower
//     their clock for heavy 512-bit work; measuring under the same kind of
//     load includes that.
//  3. FMA pipes: units = round(measured / (probe_ghz * lanes * 2)), clamped
//     to 1..2, since a loop can reach but not exceed the pipes' rate.
//  4. Peak = probe_ghz * lanes * 2 * units.
// Each timed run is ~2-5 ms on a current core; the total is ~20-40 ms.
PeakFlops MeasurePeak(const CpuFeatures& features) {
  constexpr int64_t kFmaRounds = 400'000;    // x12 FMAs: ~2.5 ms at 2 pipes, 2.5 GHz
  constexpr int64_t kClockRounds = 200'000;  // x32 cycles: ~2.5 ms at 2.5 GHz
  constexpr int kRuns = 3;

  PeakFlops peak;
  peak.nominal_ghz = NominalGhz(features);
  peak.scalar_ghz = BestOf(kRuns, [] { return ScalarClockGhz(kClockRounds); });

  const bool avx2 = features.avx2 && features.fma;
  if (avx2) {
    peak.measured_avx2_gflops_per_core =
        BestOf(kRuns, [] { return internal::F32FmaGflopsAvx2Fma(kFmaRounds); });
  }
  if (features.avx512f) {
    peak.vector_bits = 512;
    internal::F32FmaGflopsAvx512f(kFmaRounds / 4);  // warm-up: let the clock settle
    peak.measured_gflops_per_core =
        BestOf(kRuns, [] { return internal::F32FmaGflopsAvx512f(kFmaRounds); });
    peak.probe_ghz = BestOf(kRuns, [] { return internal::ClockGhzUnderFmaAvx512f(kClockRounds); });
  } else if (avx2) {
    peak.vector_bits = 256;
    peak.measured_gflops_per_core = peak.measured_avx2_gflops_per_core;
    peak.probe_ghz = BestOf(kRuns, [] { return internal::ClockGhzUnderFmaAvx2Fma(kClockRounds); });
  } else {
    // No FMA: not probed. Report the SSE width at the scalar clock with one
    // multiply and one add pipe counted as one FMA unit.
    peak.vector_bits = 128;
    peak.probe_ghz = peak.scalar_ghz;
    peak.fma_units = 1;
    peak.peak_gflops_per_core = peak.probe_ghz * 4 * 2;
    return peak;
  }
  const int lanes = peak.vector_bits / 32;
  const double per_unit = peak.probe_ghz * lanes * 2;
  peak.fma_units =
      per_unit > 0
          ? std::clamp(static_cast<int>(std::lround(peak.measured_gflops_per_core / per_unit)), 1,
                       2)
          : 1;
  peak.peak_gflops_per_core = per_unit * peak.fma_units;
  return peak;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Probe();
  return features;
}

std::string FeatureList(const CpuFeatures& f) {
  std::vector<const char*> names;
  const std::pair<bool, const char*> all[] = {
      {f.avx2, "avx2"},
      {f.fma, "fma"},
      {f.avx512f, "avx512f"},
      {f.avx512bw, "avx512bw"},
      {f.avx512vl, "avx512vl"},
      {f.avx512dq, "avx512dq"},
      {f.avx512_vnni, "avx512_vnni"},
      {f.avx512_bf16, "avx512_bf16"},
      {f.amx_tile, "amx_tile"},
      {f.amx_bf16, "amx_bf16"},
      {f.amx_int8, "amx_int8"},
  };
  for (const auto& [present, name] : all) {
    if (present) names.push_back(name);
  }
  return absl::StrJoin(names, " ");
}

const PeakFlops& GetPeakFlops() {
  static const PeakFlops peak = MeasurePeak(GetCpuFeatures());
  return peak;
}

}  // namespace numaserve::affinity
