// Internal to affinity/: the probe loops, written once over the vector type.
// Included only by the per-ISA files fma_probe_avx2.cc / fma_probe_avx512.cc,
// which instantiate it with their own flags; everything here has internal
// linkage so the linker never merges code built for different ISAs.
#pragma once

#include <chrono>
#include <cstdint>

namespace numaserve::affinity::internal {
namespace {

// Twelve accumulators: FMA latency is 4-5 cycles on current x86 cores and
// there are up to 2 FMA pipes, so 8-10 in flight keep both pipes busy. (The
// 16 ymm registers of AVX2 leave room for 12 plus the two operands.)
template <typename Vec, typename Ops>
double FmaThroughputGflops(int64_t iterations) {
  constexpr int kAccumulators = 12;
  const Vec a = Ops::Broadcast(0.999999f), b = Ops::Broadcast(1e-6f);
  // Distinct starting values: identical accumulators would let the compiler
  // fold them into one latency-bound chain.
  Vec x0 = Ops::Broadcast(1.00f), x1 = Ops::Broadcast(1.01f), x2 = Ops::Broadcast(1.02f),
      x3 = Ops::Broadcast(1.03f), x4 = Ops::Broadcast(1.04f), x5 = Ops::Broadcast(1.05f),
      x6 = Ops::Broadcast(1.06f), x7 = Ops::Broadcast(1.07f), x8 = Ops::Broadcast(1.08f),
      x9 = Ops::Broadcast(1.09f), x10 = Ops::Broadcast(1.10f), x11 = Ops::Broadcast(1.11f);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    x0 = Ops::Fma(x0, a, b), x1 = Ops::Fma(x1, a, b), x2 = Ops::Fma(x2, a, b);
    x3 = Ops::Fma(x3, a, b), x4 = Ops::Fma(x4, a, b), x5 = Ops::Fma(x5, a, b);
    x6 = Ops::Fma(x6, a, b), x7 = Ops::Fma(x7, a, b), x8 = Ops::Fma(x8, a, b);
    x9 = Ops::Fma(x9, a, b), x10 = Ops::Fma(x10, a, b), x11 = Ops::Fma(x11, a, b);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Vec sum = Ops::Add(Ops::Add(Ops::Add(Ops::Add(x0, x1), Ops::Add(x2, x3)),
                                    Ops::Add(Ops::Add(x4, x5), Ops::Add(x6, x7))),
                           Ops::Add(Ops::Add(x8, x9), Ops::Add(x10, x11)));
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
