// Internal to affinity/: the probe loops, written once over the vector type.
// Included only by the per-ISA files fma_probe_avx2.cc / fma_probe_avx512.cc,
// which instantiate it with their own flags; everything here has internal
// linkage so the linker never merges code built for different ISAs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace numaserve::affinity::internal {
namespace {

// Enough independent accumulators to keep every FMA pipe busy: FMA latency
// is 4-5 cycles on current x86 cores and there are up to 2 pipes, so at least
// 10 must be in flight. Ops::kAccumulators says how many: 12 for AVX2 (16 ymm
// registers leave room for 12 plus the two operands), 16 for AVX-512 (32 zmm).
// The loop over them is fully unrolled, so each lives in its own register.
template <typename Vec, typename Ops, size_t... kIndex>
inline void FmaRound(Vec (&x)[sizeof...(kIndex)], Vec a, Vec b, std::index_sequence<kIndex...>) {
  ((x[kIndex] = Ops::Fma(x[kIndex], a, b)), ...);
}

template <typename Vec, typename Ops>
double FmaThroughputGflops(int64_t iterations) {
  constexpr int kAccumulators = Ops::kAccumulators;
  const Vec a = Ops::Broadcast(0.999999f), b = Ops::Broadcast(1e-6f);
  // Distinct starting values: identical accumulators would let the compiler
  // fold them into one latency-bound chain.
  Vec x[kAccumulators];
  for (int j = 0; j < kAccumulators; ++j) x[j] = Ops::Broadcast(1.0f + 0.01f * j);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    FmaRound<Vec, Ops>(x, a, b, std::make_index_sequence<kAccumulators>());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Vec sum = x[0];
  for (int j = 1; j < kAccumulators; ++j) sum = Ops::Add(sum, x[j]);
  volatile float sink = Ops::First(sum);  // keeps the loop alive
  (void)sink;
  const double flops = static_cast<double>(iterations) * kAccumulators * Ops::kLanes * 2;
  return seconds > 0 ? flops / seconds * 1e-9 : 0;
}

#define NUMASERVE_ADD "add %[step], %[chain]\n\t"
#define NUMASERVE_ADD4 NUMASERVE_ADD NUMASERVE_ADD NUMASERVE_ADD NUMASERVE_ADD

// 32 dependent adds (32 cycles) per round beside 8 independent FMAs (4 cycles
// of FMA work on 2 pipes), so the adds set the pace. The step is a register,
// not an immediate, so no core can fold the chain at rename.
template <typename Vec, typename Ops>
double ClockGhzUnderFma(int64_t iterations) {
  constexpr int kAddsPerRound = 32;
  const Vec a = Ops::Broadcast(0.999999f), b = Ops::Broadcast(1e-6f);
  Vec x0 = Ops::Broadcast(1), x1 = x0, x2 = x0, x3 = x0, x4 = x0, x5 = x0, x6 = x0, x7 = x0;
  uint64_t chain = 0, step = 1;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    asm volatile("vfmadd231ps %[a], %[b], %[x0]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x1]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x2]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x3]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x4]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x5]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x6]\n\t" NUMASERVE_ADD4
                 "vfmadd231ps %[a], %[b], %[x7]\n\t" NUMASERVE_ADD4
                 : [chain] "+r"(chain), [x0] "+v"(x0), [x1] "+v"(x1), [x2] "+v"(x2), [x3] "+v"(x3),
                   [x4] "+v"(x4), [x5] "+v"(x5), [x6] "+v"(x6), [x7] "+v"(x7)
                 : [a] "v"(a), [b] "v"(b), [step] "r"(step));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile uint64_t sink = chain;
  (void)sink;
  return seconds > 0 ? static_cast<double>(iterations) * kAddsPerRound / seconds * 1e-9 : 0;
}

#undef NUMASERVE_ADD4
#undef NUMASERVE_ADD

}  // namespace
}  // namespace numaserve::affinity::internal
