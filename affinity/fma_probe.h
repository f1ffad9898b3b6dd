// Internal to affinity/: the per-ISA halves of GetPeakFlops(). Each function
// lives in a file compiled with that ISA's flags; call one only after
// GetCpuFeatures() says the ISA is usable.
#pragma once

#include <cstdint>

namespace numaserve::affinity::internal {

// FP32 FMA throughput of one core, GFLOP/s: `iterations` rounds of one FMA on
// each of many independent accumulators (enough to hide latency x pipes: 12
// ymm for AVX2, 16 zmm for AVX-512).
double F32FmaGflopsAvx2Fma(int64_t iterations);
double F32FmaGflopsAvx512f(int64_t iterations);

// The core clock, GHz, while FMAs of that width keep running: a chain of
// dependent register adds (one per cycle on every x86 core) is the critical
// path, with independent FMAs interleaved so the core stays at the clock it
// grants that vector width (Intel lowers it for heavy 512-bit work).
double ClockGhzUnderFmaAvx2Fma(int64_t iterations);
double ClockGhzUnderFmaAvx512f(int64_t iterations);

}  // namespace numaserve::affinity::internal
