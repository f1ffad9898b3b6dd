#include "affinity/cpu_features.h"

#include <iostream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace numaserve::affinity {
namespace {

TEST(CpuFeaturesTest, Consistent) {
  const CpuFeatures& f = GetCpuFeatures();
  EXPECT_TRUE(f.vendor == "GenuineIntel" || f.vendor == "AuthenticAMD") << f.vendor;
  EXPECT_GT(f.family, 0);
  // Each wider tier needs the OS state and the narrower tier.
  if (f.avx2 || f.fma) {
    EXPECT_TRUE(f.os_avx);
  }
  if (f.avx512f) {
    EXPECT_TRUE(f.os_avx512);
    EXPECT_TRUE(f.avx2) << "every AVX-512 CPU has AVX2";
    EXPECT_TRUE(f.fma);
  }
  if (f.avx512bw || f.avx512vl || f.avx512dq || f.avx512_vnni || f.avx512_bf16) {
    EXPECT_TRUE(f.avx512f);
  }
  if (f.amx_bf16 || f.amx_int8) {
    EXPECT_TRUE(f.amx_tile);
  }
  if (f.amx_tile) {
    EXPECT_TRUE(f.os_amx);
  }
  // Same answer twice (probed once).
  EXPECT_EQ(&GetCpuFeatures(), &f);
  const std::string list = FeatureList(f);
  EXPECT_EQ(absl::StrContains(list, "avx512f"), f.avx512f) << list;
  EXPECT_EQ(absl::StrContains(list, "avx2"), f.avx2) << list;
  std::cout << f.vendor << " " << f.brand << " family " << f.family << " model " << f.model << ": "
            << list << "\n";
}

TEST(CpuFeaturesTest, PeakFlops) {
  const CpuFeatures& f = GetCpuFeatures();
  const PeakFlops& peak = GetPeakFlops();
  if (f.avx512f) {
    EXPECT_EQ(peak.vector_bits, 512);
  } else if (f.avx2 && f.fma) {
    EXPECT_EQ(peak.vector_bits, 256);
  }
  EXPECT_TRUE(peak.fma_units == 1 || peak.fma_units == 2) << peak.fma_units;
  EXPECT_GT(peak.scalar_ghz, 0.3);
  EXPECT_LT(peak.scalar_ghz, 8);
  EXPECT_GT(peak.probe_ghz, 0.3);
  EXPECT_GT(peak.peak_gflops_per_core, 0);
  if (f.avx2 && f.fma) {
    EXPECT_GT(peak.measured_gflops_per_core, 0);
    EXPECT_GT(peak.measured_avx2_gflops_per_core, 0);
    EXPECT_LE(peak.measured_gflops_per_core, 1.3 * peak.peak_gflops_per_core);
  }
  EXPECT_NEAR(peak.peak_gflops_per_core,
              peak.probe_ghz * (peak.vector_bits / 32) * 2 * peak.fma_units, 1e-6);
  EXPECT_EQ(&GetPeakFlops(), &peak);
  std::cout << "vector_bits " << peak.vector_bits << ", fma_units " << peak.fma_units
            << ", nominal " << peak.nominal_ghz << " GHz, scalar " << peak.scalar_ghz
            << " GHz, probe " << peak.probe_ghz << " GHz, peak " << peak.peak_gflops_per_core
            << " GFLOP/s, measured " << peak.measured_gflops_per_core << " (avx2 "
            << peak.measured_avx2_gflops_per_core << ") GFLOP/s per core\n";
}

}  // namespace
}  // namespace numaserve::affinity
