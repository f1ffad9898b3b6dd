// main() of the micro benchmarks: Google Benchmark's, after the ISA cap and
// the BLAS libraries' kernels the run asks for are set. The kernels read no
// environment; this main reads NUMASERVE_MAX_ISA, NUMASERVE_BLIS_ARCH and
// NUMASERVE_OPENBLAS_CORE itself, as numaserve's main does for --max-isa,
// --blis-arch and --openblas-core (docs/configuration.md).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"

namespace numaserve::bench {

inline std::string Variable(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): one thread
  return value == nullptr ? "" : value;
}

inline int Main(int argc, char** argv) {
  if (absl::Status s = kernels::SetDispatchOptions({.max_isa = Variable("NUMASERVE_MAX_ISA")});
      !s.ok()) {
    std::fprintf(stderr, "NUMASERVE_MAX_ISA: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s =
          kernels::SetGemmBackendOptions({.blis_arch = Variable("NUMASERVE_BLIS_ARCH"),
                                          .openblas_core = Variable("NUMASERVE_OPENBLAS_CORE")});
      !s.ok()) {
    std::fprintf(stderr, "NUMASERVE_BLIS_ARCH / NUMASERVE_OPENBLAS_CORE: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace numaserve::bench
