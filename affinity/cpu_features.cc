// Compiled with no -m flags and no LTO (affinity/CMakeLists.txt): this file
// decides whether wider code may run, so it must itself be baseline x86-64.
#include "affinity/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
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

}  // namespace

CpuidLeaves ReadCpuidLeaves() {
  CpuidLeaves leaves;
  const Regs leaf0 = Cpuid(0);
  const unsigned max_leaf = leaf0.eax;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &leaf0.ebx, 4);
  std::memcpy(vendor + 4, &leaf0.edx, 4);
  std::memcpy(vendor + 8, &leaf0.ecx, 4);
  leaves.vendor = vendor;

  if (Cpuid(0x80000000).eax >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = Cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.eax, 4);
      std::memcpy(brand + 16 * i + 4, &r.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &r.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &r.edx, 4);
    }
    leaves.brand = std::string(absl::StripAsciiWhitespace(brand));
  }
  if (max_leaf >= 1) {
    const Regs leaf1 = Cpuid(1);
    leaves.leaf1_eax = leaf1.eax;
    leaves.leaf1_ecx = leaf1.ecx;
  }
  if (max_leaf >= 7) {
    const Regs leaf7 = Cpuid(7, 0);
    leaves.leaf7_ebx = leaf7.ebx;
    leaves.leaf7_ecx = leaf7.ecx;
    leaves.leaf7_edx = leaf7.edx;
    if (leaf7.eax >= 1) leaves.leaf7_1_eax = Cpuid(7, 1).eax;
  }
  if (Bit(leaves.leaf1_ecx, 27)) leaves.xcr0 = ReadXcr0();  // OSXSAVE: XGETBV is allowed
  return leaves;
}

CpuFeatures DecodeCpuid(const CpuidLeaves& leaves, bool amx_permitted) {
  CpuFeatures f;
  f.vendor = leaves.vendor;
  f.brand = leaves.brand;
  const uint32_t eax1 = leaves.leaf1_eax;
  const int base_family = (eax1 >> 8) & 0xf;
  const int base_model = (eax1 >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + static_cast<int>((eax1 >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? base_model | static_cast<int>(((eax1 >> 16) & 0xf) << 4)
                : base_model;
  f.stepping = eax1 & 0xf;

  const uint64_t xcr0 = Bit(leaves.leaf1_ecx, 27) ? leaves.xcr0 : 0;  // OSXSAVE
  f.os_avx = Bit(leaves.leaf1_ecx, 28) && (xcr0 & 0x6) == 0x6;        // SSE + AVX state
  f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;                    // opmask, ZMM_Hi256, Hi16_ZMM
  const bool xcr0_amx = (xcr0 & 0x60000) == 0x60000;                  // XTILECFG, XTILEDATA

  f.fma = f.os_avx && Bit(leaves.leaf1_ecx, 12);
  f.avx2 = f.os_avx && Bit(leaves.leaf7_ebx, 5);
  f.avx512f = f.os_avx512 && Bit(leaves.leaf7_ebx, 16);
  f.avx512dq = f.avx512f && Bit(leaves.leaf7_ebx, 17);
  f.avx512bw = f.avx512f && Bit(leaves.leaf7_ebx, 30);
  f.avx512vl = f.avx512f && Bit(leaves.leaf7_ebx, 31);
  f.avx512_vnni = f.avx512f && Bit(leaves.leaf7_ecx, 11);
  f.avx512_bf16 = f.avx512f && Bit(leaves.leaf7_1_eax, 5);
  f.avx_vnni = f.avx2 && Bit(leaves.leaf7_1_eax, 4);
  f.hybrid = Bit(leaves.leaf7_edx, 15);

  const bool cpu_amx = Bit(leaves.leaf7_edx, 24);
  f.os_amx = cpu_amx && xcr0_amx && amx_permitted;
  f.amx_tile = f.os_amx;
  f.amx_bf16 = f.os_amx && Bit(leaves.leaf7_edx, 22);
  f.amx_int8 = f.os_amx && Bit(leaves.leaf7_edx, 25);
  return f;
}

namespace {

// Asks the kernel for AMX tile data only where the CPU has AMX and the OS
// saves its state, so other machines make no syscall.
CpuFeatures Probe() {
  const CpuidLeaves leaves = ReadCpuidLeaves();
  const bool amx_offered =
      Bit(leaves.leaf7_edx, 24) && Bit(leaves.leaf1_ecx, 27) && (leaves.xcr0 & 0x60000) == 0x60000;
  return DecodeCpuid(leaves, amx_offered && RequestAmxPermission());
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

struct ThroughputAndClock {
  double gflops = 0;  // best FMA throughput
  double ghz = 0;     // best clock under FMAs of the same width
};

// Best of `runs` of each, alternating, so that a spell of load hits the
// throughput and the clock runs alike rather than one of them alone.
template <typename Fma, typename Clock>
ThroughputAndClock BestOfAlternating(int runs, Fma&& fma, Clock&& clock) {
  ThroughputAndClock best;
  for (int i = 0; i < runs; ++i) {
    best.gflops = std::max(best.gflops, fma());
    best.ghz = std::max(best.ghz, clock());
  }
  return best;
}

// ---- The model: core designs by vendor, family, model (and brand) ----

constexpr FmaPipes k2x128{2, 128};
constexpr FmaPipes k2x256{2, 256};
constexpr FmaPipes k1x512{1, 512};
constexpr FmaPipes k2x512{2, 512};

// One core design: the FMA pipes 256-bit and 512-bit vectors use. A second
// configuration (`*_other.count > 0`) marks a width where the design was
// built both ways and nothing in CPUID says which this one is.
struct Design {
  std::string name;
  FmaPipes avx2 = k2x256;
  FmaPipes avx2_other = {};
  FmaPipes avx512 = {};
  FmaPipes avx512_other = {};
  ModelSource source = ModelSource::kCpuidTable;
};

Design Undecided(std::string name) {
  return {.name = std::move(name),
          .avx2 = k2x256,
          .avx2_other = k2x128,
          .avx512 = k2x512,
          .avx512_other = k1x512};
}

Design UnknownDesign(const CpuFeatures& f) {
  return Undecided(absl::StrFormat("unknown %s family %d model 0x%02x",
                                   f.vendor.empty() ? "vendor" : f.vendor, f.family, f.model));
}

// Xeon Scalable of the Skylake-SP and Cascade Lake generations: every core
// fuses ports 0 and 1 into one 512-bit FMA unit; Platinum, Gold 6xxx and the
// Gold 5122 / 5222 also enable the second unit on port 5, Gold 5xxx, Silver
// and Bronze do not. 0 when the brand names no such SKU (Xeon W, Core i9,
// a hypervisor's "Intel Xeon Processor (Cascadelake)").
int Avx512UnitsFromBrand(absl::string_view brand) {
  if (absl::StrContains(brand, "Platinum")) return 2;
  if (absl::StrContains(brand, "Silver") || absl::StrContains(brand, "Bronze")) return 1;
  const size_t gold = brand.find("Gold");
  if (gold == absl::string_view::npos) return 0;
  const absl::string_view sku = absl::StripLeadingAsciiWhitespace(brand.substr(gold + 4));
  if (sku.size() < 4 || !std::all_of(sku.begin(), sku.begin() + 4, absl::ascii_isdigit)) return 0;
  if (sku[0] == '6' || absl::StartsWith(sku, "5122") || absl::StartsWith(sku, "5222")) return 2;
  return sku[0] == '5' ? 1 : 0;
}

// Intel family 6 model numbers as the SDM and Linux's intel-family.h list
// them; steppings split model 0x55.
Design IntelDesign(const CpuFeatures& f) {
  if (f.family == 6) {
    switch (f.model) {
      case 0x55: {
        // Cooper Lake adds AVX512_BF16 (steppings 10, 11), Cascade Lake
        // AVX512_VNNI (steppings 5-7); the bits decide where a hypervisor
        // reports another stepping.
        if (f.avx512_bf16 || f.stepping >= 10) return {.name = "Cooper Lake", .avx512 = k2x512};
        std::string name = f.avx512_vnni || f.stepping >= 5 ? "Cascade Lake" : "Skylake-SP";
        const int units = Avx512UnitsFromBrand(f.brand);
        if (units == 0) {
          return {.name = std::move(name), .avx512 = k2x512, .avx512_other = k1x512};
        }
        return {
            .name = std::move(name), .avx512 = {units, 512}, .source = ModelSource::kBrandString};
      }
      case 0x6a:
        return {.name = "Ice Lake-SP", .avx512 = k2x512};
      case 0x6c:
        return {.name = "Ice Lake-D", .avx512 = k2x512};
      case 0x8f:
        return {.name = "Sapphire Rapids", .avx512 = k2x512};
      case 0xcf:
        return {.name = "Emerald Rapids", .avx512 = k2x512};
      case 0xad:
        return {.name = "Granite Rapids", .avx512 = k2x512};
      case 0xae:
        return {.name = "Granite Rapids-D", .avx512 = k2x512};
      case 0x66:  // Cannon Lake
      case 0x7d:  // Ice Lake (client)
      case 0x7e:
      case 0x8c:  // Tiger Lake
      case 0x8d:
      case 0xa7:  // Rocket Lake
        // No client core has AMX: a client model number beside it is a
        // hypervisor's mask over a server core (seen: a Sapphire Rapids
        // guest reported as model 0xa7). Server cores have one or two
        // 512-bit FMA units: the probe decides.
        if (f.amx_tile) {
          return {.name = "Intel server AVX-512 core (model number masked)",
                  .avx512 = k2x512,
                  .avx512_other = k1x512};
        }
        // Client AVX-512: ports 0+1 fused into one 512-bit unit, no port 5 FMA.
        return {.name = "Intel client AVX-512 core", .avx512 = k1x512};
      case 0xaf:  // Sierra Forest
      case 0xb6:  // Grand Ridge
      case 0xbe:  // Alder Lake-N
      case 0xdd:  // Clearwater Forest
        // Efficiency cores: 128-bit FMA pipes up to Crestmont, wider since.
        return {.name = "Intel E-core", .avx2 = k2x128, .avx2_other = k2x256};
      default:
        break;
    }
  }
  if (f.hybrid) {
    // The probe runs on a performance or an efficiency core: it decides.
    return {.name = "Intel hybrid (P- and E-cores)", .avx2 = k2x256, .avx2_other = k2x128};
  }
  // Haswell onwards, client and server: two 256-bit FMA pipes.
  if (f.family == 6 && !f.avx512f) {
    return {.name = f.avx2 && f.fma ? "Intel AVX2 core" : "Intel core without AVX2/FMA"};
  }
  return UnknownDesign(f);
}

bool InRange(int model, int first, int last) { return model >= first && model <= last; }

// AMD family/model ranges as Linux's arch/x86/kernel/cpu/amd.c assigns Zen
// generations; the split of Zen 5 by segment follows AMD's PPRs (models
// 00h-0Fh and 10h-1Fh are EPYC, 40h-4Fh desktop).
Design AmdDesign(const CpuFeatures& f) {
  const int m = f.model;
  switch (f.family) {
    case 0x17:
      if (InRange(m, 0x00, 0x2f) || InRange(m, 0x50, 0x5f)) {
        return {.name = "Zen / Zen+", .avx2 = k2x128};  // 2 x 128-bit FMA: 256-bit ops in halves
      }
      if (InRange(m, 0x30, 0x4f) || InRange(m, 0x60, 0x7f) || InRange(m, 0x90, 0x91) ||
          InRange(m, 0xa0, 0xaf)) {
        return {.name = "Zen 2"};
      }
      break;
    case 0x19:
      if (InRange(m, 0x00, 0x0f) || InRange(m, 0x20, 0x5f)) return {.name = "Zen 3"};
      if (InRange(m, 0x10, 0x1f) || InRange(m, 0x60, 0xaf)) {
        return {.name = "Zen 4", .avx512 = k2x256};  // AVX-512 as two 256-bit halves
      }
      break;
    case 0x1a:
      if (InRange(m, 0x00, 0x1f) || InRange(m, 0x40, 0x4f)) {
        return {.name = "Zen 5", .avx512 = k2x512};
      }
      if (InRange(m, 0x20, 0x2f) || InRange(m, 0x60, 0x7f)) {
        // Mobile parts: Strix Point and Krackan Point keep 256-bit datapaths,
        // Strix Halo the full 512-bit ones; CPUID does not tell them apart.
        return {.name = "Zen 5 (mobile)", .avx512 = k2x256, .avx512_other = k2x512};
      }
      break;
    default:
      break;
  }
  return UnknownDesign(f);
}

// Method (a core's FP32 speed of light without knowing its clock):
//  1. The model: the FMA pipes from DescribeCpu's table (by CPUID, or the
//     brand string where one design was sold both ways).
//  2. Clock at each width: a dependent add chain (1 add per cycle) run beside
//     FMAs of that width, timed -> probe_ghz. Intel cores lower their clock
//     for heavy 512-bit work; measuring under the same kind of load includes
//     that.
//  3. Throughput: FMAs on 12 (AVX2) or 16 (AVX-512) independent accumulators,
//     timed -> measured GFLOP/s. It checks the model (probe_agrees) and picks
//     the pipes only where the table cannot tell; there it runs twice as
//     often, since a decision rests on it.
//  4. Peak = probe_ghz * the model's FLOP per cycle.
// Each timed run is short (~0.25 ms at 3.5 GHz), shorter than a timer tick:
// a run of a millisecond or more nearly always contains an interrupt or a
// hypervisor exit, which best-of cannot filter out, and read the clock ~4%
// low on a KVM guest; short runs often fit between them, also under load.
// The total is ~20 ms (~35 ms where the probe decides).
PeakFlops MeasurePeak(const CpuFeatures& features) {
  constexpr int64_t kFma512Rounds = 100'000;  // x16 FMAs: 8 cycles a round on 2 pipes
  constexpr int64_t kFma256Rounds = 130'000;  // x12 FMAs: 6 cycles a round on 2 pipes
  constexpr int64_t kClockRounds = 25'000;    // x32 cycles
  constexpr int kWarmUpRuns = 4;              // ~1 ms of FMAs before timing a width
  constexpr double kAgreeLow = 0.6, kAgreeHigh = 1.15;

  const CpuModel table = DescribeCpu(features);
  const int runs = table.ambiguous ? 31 : 15;

  PeakFlops peak;
  peak.nominal_ghz = NominalGhz(features);
  peak.scalar_ghz = BestOf(9, [] { return ScalarClockGhz(kClockRounds); });

  const bool avx2 = features.avx2 && features.fma;
  if (avx2) {
    internal::F32FmaGflopsAvx2Fma(kWarmUpRuns * kFma256Rounds);  // let the clock settle
    const ThroughputAndClock best = BestOfAlternating(
        runs, [] { return internal::F32FmaGflopsAvx2Fma(kFma256Rounds); },
        [] { return internal::ClockGhzUnderFmaAvx2Fma(kClockRounds); });
    peak.measured_avx2_gflops_per_core = best.gflops;
    peak.probe_avx2_ghz = best.ghz;
  }
  if (features.avx512f) {
    internal::F32FmaGflopsAvx512f(kWarmUpRuns * kFma512Rounds);  // the 512-bit clock
    const ThroughputAndClock best = BestOfAlternating(
        runs, [] { return internal::F32FmaGflopsAvx512f(kFma512Rounds); },
        [] { return internal::ClockGhzUnderFmaAvx512f(kClockRounds); });
    peak.measured_gflops_per_core = best.gflops;
    peak.probe_ghz = best.ghz;
  } else if (avx2) {
    peak.measured_gflops_per_core = peak.measured_avx2_gflops_per_core;
    peak.probe_ghz = peak.probe_avx2_ghz;
  } else {
    peak.probe_ghz = peak.scalar_ghz;  // no FMA: not probed
  }

  const double measured_per_cycle =
      avx2 && peak.probe_ghz > 0 ? peak.measured_gflops_per_core / peak.probe_ghz : 0;
  peak.model = DescribeCpu(features, measured_per_cycle);
  peak.vector_bits = peak.model.vector_bits;
  peak.fma_units = peak.model.pipes.count;
  peak.peak_gflops_per_core = peak.probe_ghz * peak.model.fp32_flops_per_cycle;
  peak.peak_avx2_gflops_per_core = peak.probe_avx2_ghz * peak.model.fp32_flops_per_cycle_256;
  peak.peak_bf16_gflops_per_core = peak.probe_ghz * peak.model.bf16_flops_per_cycle;
  peak.peak_int8_gops_per_core = peak.probe_ghz * peak.model.int8_ops_per_cycle;
  if (avx2 && peak.peak_gflops_per_core > 0) {
    const double ratio = peak.measured_gflops_per_core / peak.peak_gflops_per_core;
    peak.probe_agrees = ratio >= kAgreeLow && ratio <= kAgreeHigh;
  }
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
      {f.avx_vnni, "avx_vnni"},
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

const char* ModelSourceName(ModelSource source) {
  switch (source) {
    case ModelSource::kCpuidTable:
      return "cpuid table";
    case ModelSource::kBrandString:
      return "brand string";
    case ModelSource::kProbe:
      return "probe";
    case ModelSource::kAssumed:
      return "assumed";
  }
  return "?";
}

int FlopsPerCycle(const FmaPipes& pipes, int vector_bits) {
  return pipes.count * std::min(pipes.bits, vector_bits) / 32 * 2;
}

CpuModel DescribeCpu(const CpuFeatures& f, double measured_flops_per_cycle) {
  const Design design = f.vendor == "GenuineIntel"   ? IntelDesign(f)
                        : f.vendor == "AuthenticAMD" ? AmdDesign(f)
                                                     : UnknownDesign(f);
  CpuModel m;
  m.microarchitecture = design.name;
  m.source = design.source;
  if (!(f.avx2 && f.fma)) {
    // No usable FMA: the SSE width, one multiply and one add pipe counted as
    // one FMA unit. Nothing to probe.
    m.vector_bits = 128;
    m.pipes = {1, 128};
    m.fp32_flops_per_cycle = FlopsPerCycle(m.pipes, 128);
    m.source = ModelSource::kCpuidTable;
    return m;
  }
  FmaPipes avx2 = design.avx2, avx512 = design.avx512;
  m.vector_bits = f.avx512f ? 512 : 256;
  FmaPipes& widest = f.avx512f ? avx512 : avx2;
  const FmaPipes& other = f.avx512f ? design.avx512_other : design.avx2_other;
  if (other.count > 0) {
    m.ambiguous = true;
    if (measured_flops_per_cycle > 0) {
      const bool widest_larger =
          FlopsPerCycle(widest, m.vector_bits) >= FlopsPerCycle(other, m.vector_bits);
      const FmaPipes larger = widest_larger ? widest : other;
      const FmaPipes smaller = widest_larger ? other : widest;
      widest =
          measured_flops_per_cycle >= kProbeTwoUnitThreshold * FlopsPerCycle(larger, m.vector_bits)
              ? larger
              : smaller;
      m.source = ModelSource::kProbe;
    } else {
      m.source = ModelSource::kAssumed;
    }
  }
  m.pipes = widest;
  m.avx2_pipes = avx2;
  m.fp32_flops_per_cycle_256 = FlopsPerCycle(avx2, 256);
  m.fp32_flops_per_cycle_512 = f.avx512f ? FlopsPerCycle(avx512, 512) : 0;
  m.fp32_flops_per_cycle = f.avx512f ? m.fp32_flops_per_cycle_512 : m.fp32_flops_per_cycle_256;

  // Dot products at the FMA pipes' rate: vdpbf16ps does two BF16 multiply-adds
  // per FP32 lane, vpdpbusd four INT8 ones. AMX is a separate unit per core:
  // 1024 BF16 or 2048 INT8 multiply-adds per cycle.
  if (f.amx_bf16) {
    m.bf16_flops_per_cycle = 2048;
  } else if (f.avx512_bf16) {
    m.bf16_flops_per_cycle = 2 * m.fp32_flops_per_cycle_512;
  }
  if (f.amx_int8) {
    m.int8_ops_per_cycle = 4096;
  } else if (f.avx512_vnni) {
    m.int8_ops_per_cycle = 4 * m.fp32_flops_per_cycle_512;
  } else if (f.avx_vnni) {
    m.int8_ops_per_cycle = 4 * m.fp32_flops_per_cycle_256;
  }
  return m;
}

std::string FormatCpuModel(const CpuModel& m) {
  if (m.vector_bits == 128) {
    return absl::StrFormat("%s: no usable FMA (SSE multiply + add)", m.microarchitecture);
  }
  return absl::StrFormat("%s: %d x %d-bit FMA per core (%s)", m.microarchitecture, m.pipes.count,
                         m.pipes.bits, ModelSourceName(m.source));
}

const PeakFlops& GetPeakFlops() {
  static const PeakFlops peak = MeasurePeak(GetCpuFeatures());
  return peak;
}

}  // namespace numaserve::affinity
