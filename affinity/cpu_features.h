// CPU features from CPUID, confirmed by the OS (XGETBV for AVX / AVX-512
// state, arch_prctl for AMX tile data), and a model of what one core can
// compute: microarchitecture, FP32 FMA pipes and their width, FLOP per cycle
// for FP32, BF16 and INT8. The model is a pure function of the CPUID values
// (a table by family/model/stepping, the brand string where one core design
// was sold with one or two 512-bit FMA units); a short timing probe checks it
// and decides only where the table cannot tell. cpu_features.cc is compiled
// without any -m flags so nothing of a wider ISA leaks into the probe.
#pragma once

#include <cstdint>
#include <string>

namespace numaserve::affinity {

// The raw values the features and the model are decoded from, as `cpuid -1`
// prints them (registers of subleaf 0 unless named). ReadCpuidLeaves() fills
// them on this machine; tests fill them from recorded machines.
struct CpuidLeaves {
  std::string vendor;        // leaf 0 EBX:EDX:ECX, "GenuineIntel", "AuthenticAMD"
  std::string brand;         // leaves 0x80000002-4, trimmed; "" when absent
  uint32_t leaf1_eax = 0;    // stepping [3:0], model [7:4], family [11:8], ext. model, ext. family
  uint32_t leaf1_ecx = 0;    // FMA (12), OSXSAVE (27), AVX (28)
  uint32_t leaf7_ebx = 0;    // AVX2 (5), AVX512F (16), DQ (17), BW (30), VL (31)
  uint32_t leaf7_ecx = 0;    // AVX512_VNNI (11)
  uint32_t leaf7_edx = 0;    // hybrid (15), AMX-BF16 (22), AMX-TILE (24), AMX-INT8 (25)
  uint32_t leaf7_1_eax = 0;  // leaf 7 subleaf 1: AVX-VNNI (4), AVX512_BF16 (5)
  uint64_t xcr0 = 0;         // XGETBV(0): the register state the OS saves; 0 without OSXSAVE
};

// This machine's leaves (zeros for leaves the CPU does not report).
CpuidLeaves ReadCpuidLeaves();

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD"
  std::string brand;   // "Intel(R) Xeon(R) Platinum 8480+"
  int family = 0, model = 0, stepping = 0;
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false;
  bool avx_vnni = false;  // VEX-encoded vpdpbusd on 256-bit vectors (Alder Lake, Zen 5)
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // Each flag above is true only if the CPU has it AND the OS enabled its state.
  bool os_avx = false, os_avx512 = false, os_amx = false;  // what the OS allows, for reports
  bool hybrid = false;  // performance and efficiency cores in one package (leaf 7 EDX[15])
};

// Pure: the features `leaves` describe. `amx_permitted`: whether the kernel
// granted this process AMX tile data (ARCH_REQ_XCOMP_PERM), which no CPUID
// value says.
CpuFeatures DecodeCpuid(const CpuidLeaves& leaves, bool amx_permitted);

// Probed once, thread-safe. For AMX it requests tile-data permission from the
// kernel (ARCH_REQ_XCOMP_PERM); without that permission amx_* stay false.
const CpuFeatures& GetCpuFeatures();

// "avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_int8"
std::string FeatureList(const CpuFeatures& features);

// Where a model's FMA pipe count came from.
enum class ModelSource {
  kCpuidTable,   // family/model/stepping name a core design with one configuration
  kBrandString,  // the design was sold with 1 or 2 512-bit FMA units; the brand names the SKU
  kProbe,        // the table cannot tell; the FMA-throughput probe chose
  kAssumed,      // the table cannot tell and no probe was given: the likelier configuration
};

// "cpuid table", "brand string", "probe", "assumed".
const char* ModelSourceName(ModelSource source);

// The FP32 FMA pipes that vectors of one width use.
struct FmaPipes {
  int count = 0;  // pipes per core
  int bits = 0;   // each pipe's native width; narrower than the vector where one
                  // operation runs as two halves (Zen 4: 512-bit FMAs on 256-bit pipes)
};

// FP32 FLOP per cycle of `pipes` running FMAs on `vector_bits`-wide vectors.
int FlopsPerCycle(const FmaPipes& pipes, int vector_bits);

// What one core can compute, per cycle.
struct CpuModel {
  std::string microarchitecture;     // "Zen 4", "Sapphire Rapids", "Intel AVX2 core", "unknown ..."
  int vector_bits = 0;               // widest usable FP32 FMA vector: 512, 256 or 128 (no FMA)
  FmaPipes pipes;                    // the FMA pipes vectors of that width use ("2 x 512-bit")
  FmaPipes avx2_pipes;               // those 256-bit FMAs use ({} without AVX2+FMA); Skylake-SP
                                     // Silver: 2 x 256 here, 1 x 512 at 512 bits
  int fp32_flops_per_cycle = 0;      // at vector_bits: the figure peaks are quoted against
  int fp32_flops_per_cycle_256 = 0;  // with AVX2 FMAs (a process capped to AVX2); 0 without
  int fp32_flops_per_cycle_512 = 0;  // with AVX-512 FMAs; 0 without usable AVX-512
  int bf16_flops_per_cycle = 0;      // AMX-BF16: 1024 multiply-adds = 2048; else AVX512_BF16 dot
                                     // products: 2x FP32 at 512 bits; else 0
  int int8_ops_per_cycle = 0;  // AMX-INT8: 4096; else VNNI vpdpbusd: 4x FP32 at its width; else 0
  ModelSource source = ModelSource::kCpuidTable;  // where `pipes` came from
  // True where the table cannot tell the pipes at vector_bits apart (unknown
  // CPU, a Skylake-SP / Cascade Lake brand that names no SKU, Zen 5 mobile):
  // then `source` is kProbe or kAssumed.
  bool ambiguous = false;
};

// The probe picks the larger of two candidate configurations when it
// measures at least this fraction of the larger's FLOP per cycle: the
// geometric midpoint between one unit at full speed (0.5 of two) and two, so
// a clock misread by load errs equally far either way before it flips.
inline constexpr double kProbeTwoUnitThreshold = 0.7;

// Pure: the model of a core with these features. `measured_flops_per_cycle`:
// the FMA probe's FP32 FLOP per cycle at the widest width (measured GFLOP/s /
// probe GHz), or 0 when not measured; it is used only where the table cannot
// tell (CpuModel::ambiguous).
CpuModel DescribeCpu(const CpuFeatures& features, double measured_flops_per_cycle = 0);

// "Zen 4: 2 x 256-bit FMA per core (cpuid table)"
std::string FormatCpuModel(const CpuModel& model);

// The machine's speed of light on one core: the model's FLOP per cycle at
// the clock measured under FMA load.
struct PeakFlops {
  int vector_bits = 0;              // widest usable FP32 FMA vector: 512, 256 or 128
  int fma_units = 0;                // FMA pipes per core at that width (model.pipes.count: 1 or 2)
  double nominal_ghz = 0;           // base clock from CPUID leaf 0x16 or /proc/cpuinfo
  double probe_ghz = 0;             // clock measured while FMAs of the widest width run
  double probe_avx2_ghz = 0;        // the same with 256-bit FMAs (Intel clocks AVX2 higher)
  double scalar_ghz = 0;            // clock under scalar work only (a dependent add chain)
  double peak_gflops_per_core = 0;  // probe_ghz * model.fp32_flops_per_cycle
  double peak_avx2_gflops_per_core = 0;      // probe_avx2_ghz * model.fp32_flops_per_cycle_256
  double peak_bf16_gflops_per_core = 0;      // probe_ghz * model.bf16_flops_per_cycle (0: none)
  double peak_int8_gops_per_core = 0;        // probe_ghz * model.int8_ops_per_cycle (0: none)
  double measured_gflops_per_core = 0;       // FMA-throughput probe at the widest width
  double measured_avx2_gflops_per_core = 0;  // the same with 256-bit vectors (0 without AVX2)
  // The probe measured 0.6..1.15 of peak_gflops_per_core: the model and the
  // clock fit this machine. False under heavy load, or where the table is wrong.
  bool probe_agrees = false;
  CpuModel model;  // microarchitecture, pipes, FLOP per cycle, and their source
};

// Runs a short (~20 ms; ~35 where the table cannot tell) FMA-throughput and clock probe on the
// calling thread, once; later calls return the cached figures.
const PeakFlops& GetPeakFlops();

}  // namespace numaserve::affinity
