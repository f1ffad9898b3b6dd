// The dispatch decision (a pure function of CPU flags and the cap) and the
// process-wide table's consistency with the CPU.
#include "kernels/dispatch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "affinity/cpu_features.h"

namespace numaserve::kernels {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

TEST(DispatchTest, PicksTheBestTierTheCpuHas) {
  EXPECT_EQ(DecideTier(true, true, false, "").tier, IsaTier::kAvx512);
  EXPECT_EQ(DecideTier(true, false, false, "").tier, IsaTier::kAvx2);
  EXPECT_EQ(DecideTier(false, false, false, "").tier, IsaTier::kScalar);
}

TEST(DispatchTest, CapLimitsOwnKernelsAndOnednn) {
  const DispatchDecision d = DecideTier(true, true, false, "avx2");
  EXPECT_EQ(d.tier, IsaTier::kAvx2);
  EXPECT_EQ(d.onednn_cap, "avx2");
  EXPECT_THAT(d.skipped,
              Contains(HasSubstr("avx512: capped by --max-isa=avx2 (NUMASERVE_MAX_ISA)")));
  EXPECT_EQ(DecideTier(true, true, false, "avx512").onednn_cap, "avx512_core");
  EXPECT_EQ(DecideTier(true, true, false, "amx").tier, IsaTier::kAvx512);
}

TEST(DispatchTest, SkippedTiersSayWhy) {
  const DispatchDecision d = DecideTier(true, false, false, "");
  EXPECT_THAT(d.skipped, Contains(HasSubstr("amx: not supported")));
  EXPECT_THAT(d.skipped, Contains(HasSubstr("avx512: the CPU/OS lacks")));
  const DispatchDecision bad = DecideTier(true, true, false, "sse9");
  EXPECT_EQ(bad.tier, IsaTier::kAvx512);
  EXPECT_THAT(bad.skipped, Contains(HasSubstr("--max-isa=sse9")));
}

TEST(DispatchTest, ProcessTableMatchesTheCpu) {
  const auto& f = affinity::GetCpuFeatures();
  const KernelTable& t = GetKernelTable();
  if (t.tier == IsaTier::kAvx512) {
    EXPECT_TRUE(f.avx512f);
  }
  if (t.tier == IsaTier::kAvx2) {
    EXPECT_TRUE(f.avx2 && f.fma);
  }
  EXPECT_EQ(t.tier, GetDispatchDecision().tier);
  EXPECT_NE(KernelTableFor(t.tier), nullptr);
}

TEST(DispatchTest, StartupProbeTimesEachUsableTier) {
  for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512}) {
    const KernelTable* t = KernelTableFor(tier);
    if (t == nullptr) continue;
    const double us = ProbeMicroseconds(*t, 2);
    EXPECT_GT(us, 0.0) << IsaTierName(tier);
    EXPECT_LT(us, 1e6) << IsaTierName(tier);
  }
  const DispatchDecision& d = GetDispatchDecision();
  if (d.avx512_probe_us > 0) {
    // The faster measured tier was chosen.
    EXPECT_EQ(d.tier, d.avx2_probe_us < d.avx512_probe_us ? IsaTier::kAvx2 : IsaTier::kAvx512);
  }
}

}  // namespace
}  // namespace numaserve::kernels
