// In-process throughput of a compiled model at several batch sizes, with
// achieved GFLOP/s and the fraction of this machine's FP32 peak.
//   engine_bench [--benchmark_filter=...]   (model: $NUMASERVE_BENCH_MODEL or the default)
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "affinity/cpu_features.h"
#include "benchmarks/micro/bench_main.h"
#include "engine/model.h"
#include "kernels/dispatch.h"

namespace {

const char* ModelPath() {
  const char* env = getenv("NUMASERVE_BENCH_MODEL");
  return env != nullptr ? env : NUMASERVE_DEFAULT_MODEL;
}

void BM_CompiledModelRun(benchmark::State& state) {
  const int64_t batch = state.range(0);
  auto model = numaserve::engine::CompiledModel::Load(ModelPath(), {});
  if (!model.ok()) {
    state.SkipWithError(std::string(model.status().message()).c_str());
    return;
  }
  const auto& info = (*model)->info();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<std::vector<float>> inputs, outputs;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (const auto& t : info.inputs) {
    int64_t n = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) n *= t.shape[d] < 0 ? batch : t.shape[d];
    inputs.emplace_back(n);
    for (float& v : inputs.back()) v = u(rng);
    in_ptrs.push_back(inputs.back().data());
  }
  for (const auto& shape : (*model)->OutputShapes(batch)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    outputs.emplace_back(n);
    out_ptrs.push_back(outputs.back().data());
  }
  if (!(*model)->Run(batch, in_ptrs, out_ptrs).ok()) {  // warm-up: primitives for this batch
    state.SkipWithError("Run failed");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize((*model)->Run(batch, in_ptrs, out_ptrs));
  }
  const double flops = info.flops_per_row * static_cast<double>(batch);
  const int threads = omp_get_max_threads();
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GFLOP/s"] = numaserve::kernels::Fp32PeakGflopsPerCore() * threads;
  state.counters["threads"] = threads;
}
BENCHMARK(BM_CompiledModelRun)->Arg(1)->Arg(8)->Arg(32)->Arg(256)->UseRealTime()->MinTime(1.0);

}  // namespace

int main(int argc, char** argv) { return numaserve::bench::Main(argc, argv); }
