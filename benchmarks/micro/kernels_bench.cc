// numaserve's own kernels per ISA tier (GB/s of input+output traffic),
// oneDNN SGEMM with prepacked weights, and every GEMM backend (oneDNN, BLIS,
// OpenBLAS) on SGEMM and model shapes (GFLOP/s and the fraction of this
// machine's FP32 peak for the threads used), and ResNet-50's stride-2 convs
// on ConvOnednn with the blocked layouts the compiled model gives them, on
// the direct blocked kernel and on the channels-last path. Compare paths
// only within one run, interleaved:
//   kernels_bench --benchmark_filter=ConvResNet50 --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
// (the least disturbed repetition: time in the "_min" row, GFLOP/s and
// peak_fraction in the "_max" row).
//   kernels_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "affinity/cpu_features.h"
#include "benchmarks/micro/bench_main.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/onednn/conv_onednn.h"
#include "kernels/onednn/matmul_onednn.h"

namespace {

using numaserve::kernels::IsaTier;

std::vector<float> Random(int64_t n) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// range(0): tier, range(1): rows, range(2): row length.
void RowKernel(benchmark::State& state, int which) {
  const auto* t = numaserve::kernels::KernelTableFor(static_cast<IsaTier>(state.range(0)));
  if (t == nullptr) {
    state.SkipWithError("this CPU lacks the tier");
    return;
  }
  const int64_t rows = state.range(1), len = state.range(2);
  std::vector<float> x = Random(rows * len), y(rows * len), v = Random(len), s(len, 1.0f);
  for (auto _ : state) {
    if (which == 0) t->softmax_rows(x.data(), y.data(), rows, len);
    if (which == 1) t->layer_norm_rows(x.data(), s.data(), v.data(), 1e-5f, y.data(), rows, len);
    if (which == 2) t->add_row_broadcast(x.data(), v.data(), y.data(), rows, len);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(numaserve::kernels::IsaTierName(t->tier));
  state.SetBytesProcessed(state.iterations() * rows * len * 2 * sizeof(float));
}

void BM_SoftmaxRows(benchmark::State& state) { RowKernel(state, 0); }
void BM_LayerNormRows(benchmark::State& state) { RowKernel(state, 1); }
void BM_AddRowBroadcast(benchmark::State& state) { RowKernel(state, 2); }

void RowArgs(benchmark::internal::Benchmark* b) {
  for (int tier : {0, 1, 2}) {
    b->Args({tier, 1024, 128});  // attention scores (seq 128)
    b->Args({tier, 1024, 768});  // BERT hidden rows
  }
}
BENCHMARK(BM_SoftmaxRows)->Apply(RowArgs);
BENCHMARK(BM_LayerNormRows)->Apply(RowArgs);
BENCHMARK(BM_AddRowBroadcast)->Apply(RowArgs);

// Row sums (max and min run the same loop with a different op):
// range(0): tier, range(1): rows, range(2): row length.
void BM_ReduceRowsSum(benchmark::State& state) {
  const auto* t = numaserve::kernels::KernelTableFor(static_cast<IsaTier>(state.range(0)));
  if (t == nullptr) {
    state.SkipWithError("this CPU lacks the tier");
    return;
  }
  const int64_t rows = state.range(1), len = state.range(2);
  std::vector<float> x = Random(rows * len), y(rows);
  for (auto _ : state) {
    t->reduce_rows(x.data(), y.data(), rows, len, numaserve::kernels::cpu::ReduceOp::kSum);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(numaserve::kernels::IsaTierName(t->tier));
  state.SetBytesProcessed(state.iterations() * rows * (len + 1) * sizeof(float));
}
BENCHMARK(BM_ReduceRowsSum)->Apply(RowArgs);

// A GEMM's bias + erf-GELU epilogue in place, on one thread: range(0):
// tier, range(1): rows, range(2): row length (128 x 3072: BERT-base's
// first FFN at 128 tokens), values in [-2, 2].
void BM_BiasGeluRows(benchmark::State& state) {
  const auto* t = numaserve::kernels::KernelTableFor(static_cast<IsaTier>(state.range(0)));
  if (t == nullptr) {
    state.SkipWithError("this CPU lacks the tier");
    return;
  }
  const int64_t rows = state.range(1), len = state.range(2);
  const std::vector<float> x = Random(rows * len), bias = Random(len);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    state.PauseTiming();
    y = x;  // GELU of GELU would drift to other values
    state.ResumeTiming();
    t->bias_activation_rows(y.data(), bias.data(), rows, len,
                            numaserve::kernels::cpu::RowActivation::kGeluErf);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(numaserve::kernels::IsaTierName(t->tier));
  state.SetItemsProcessed(state.iterations() * rows * len);
}
BENCHMARK(BM_BiasGeluRows)->Args({0, 128, 3072})->Args({1, 128, 3072})->Args({2, 128, 3072});

// range(0): tier, range(1): batch, range(2): rows, range(3): cols.
void BM_Transpose2d(benchmark::State& state) {
  const auto* t = numaserve::kernels::KernelTableFor(static_cast<IsaTier>(state.range(0)));
  if (t == nullptr) {
    state.SkipWithError("this CPU lacks the tier");
    return;
  }
  const int64_t batch = state.range(1), rows = state.range(2), cols = state.range(3);
  std::vector<float> x = Random(batch * rows * cols), y(x.size());
  for (auto _ : state) {
    t->transpose_2d(x.data(), y.data(), batch, rows, cols);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(numaserve::kernels::IsaTierName(t->tier));
  state.SetBytesProcessed(state.iterations() * batch * rows * cols * 2 * sizeof(float));
}
BENCHMARK(BM_Transpose2d)->Apply([](benchmark::internal::Benchmark* b) {
  for (int tier : {0, 1, 2}) {
    b->Args({tier, 12, 128, 64});  // attention K^T per head (seq 128, head 64)
    b->Args({tier, 1, 768, 768});  // a square weight-sized matrix
  }
});

// One attention head of a [S, 12, 64] tensor (BERT-base's), q, k and v read
// in place through the heads' strides, on one thread: GFLOP/s of the two
// products and the fraction of one core's FP32 peak.
void BM_AttentionHead(benchmark::State& state) {
  const auto* t = numaserve::kernels::KernelTableFor(static_cast<IsaTier>(state.range(0)));
  if (t == nullptr) {
    state.SkipWithError("this CPU lacks the tier");
    return;
  }
  const int64_t seq = state.range(1), heads = 12, d = 64;
  const std::vector<float> q = Random(seq * heads * d), k = Random(seq * heads * d),
                           v = Random(seq * heads * d);
  std::vector<float> out(seq * heads * d);
  std::vector<float> scratch(numaserve::kernels::cpu::AttentionScratchFloats(seq, d));
  numaserve::kernels::cpu::AttentionHead h;
  h.q = q.data();
  h.k = k.data();
  h.v = v.data();
  h.out = out.data();
  h.q_row = h.k_row = h.v_row = h.out_row = heads * d;
  h.sq = h.sk = seq;
  h.d = h.dv = d;
  h.alpha = 0.125f;
  for (auto _ : state) {
    t->attention_head(h, scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 4.0 * seq * seq * d;
  const double peak = numaserve::kernels::Fp32PeakGflopsPerCore() * 1e9;
  state.SetLabel(numaserve::kernels::IsaTierName(t->tier));
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["core_peak_fraction"] =
      benchmark::Counter(flops / peak, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionHead)->Apply([](benchmark::internal::Benchmark* b) {
  for (int tier : {0, 1, 2}) {
    for (int seq : {128, 512}) b->Args({tier, seq});
  }
});

// With other load on the cores, the least disturbed repetition counts: its
// time is the "_min" row's, its GFLOP/s the "_max" row's.
void AddMinMaxStatistics(benchmark::internal::Benchmark* b) {
  b->ComputeStatistics("min", [](const std::vector<double>& v) {
     return *std::min_element(v.begin(), v.end());
   })->ComputeStatistics("max", [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end());
  });
}

// GFLOP/s and the fraction of FP32 peak on all OpenMP threads, for
// `flops` per iteration.
void SetFlopCounters(benchmark::State& state, double flops) {
  const double peak = numaserve::kernels::Fp32PeakGflopsPerCore() * omp_get_max_threads() * 1e9;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_fraction"] =
      benchmark::Counter(flops / peak, benchmark::Counter::kIsIterationInvariantRate);
}

// The own SGEMM's 6 x 16 micro-kernel alone on one thread, A (6 x 256) and
// a B panel (256 x 16) in L1: the most the own GEMM and the Winograd conv's
// products can reach on this core, as GFLOP/s and the fraction of one
// core's FP32 peak. BM_Gemm/numaserve against it is what the blocking and
// the memory around the micro-kernel cost.
void BM_SgemmMicroKernel(benchmark::State& state) {
  if (numaserve::kernels::GetDispatchDecision().max_tier == IsaTier::kScalar) {
    state.SkipWithError("no AVX2 + FMA");
    return;
  }
  constexpr int64_t kc = 256;
  const std::vector<float> a = Random(6 * kc);
  std::vector<float> b(kc * 16 + 16), c(6 * 16);
  // The kernel reads B as 32-byte vectors; 64-byte alignment as the packed panels.
  float* panel = b.data() + (16 - reinterpret_cast<uintptr_t>(b.data()) / 4 % 16) % 16;
  const std::vector<float> values = Random(kc * 16);
  std::copy(values.begin(), values.end(), panel);
  for (auto _ : state) {
    numaserve::kernels::cpu::sgemm_micro_kernel_6x16_avx2(a.data(), kc, panel, kc, c.data(), 16);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * 6 * 16 * kc;
  const double peak = numaserve::kernels::Fp32PeakGflopsPerCore() * 1e9;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["core_peak_fraction"] =
      benchmark::Counter(flops / peak, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SgemmMicroKernel);

// Y[M,N] = X[M,K] W[K,N] on oneDNN with prepacked weights, all OpenMP threads.
void BM_SgemmOnednn(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<float> w = Random(k * n), x = Random(m * k), y(m * n);
  numaserve::kernels::MatMulOnednnOptions o;
  o.k = k;
  o.n = n;
  o.weights = w.data();
  auto mm = numaserve::kernels::MatMulOnednn::Create(engine, o);
  if (!mm.ok() || !(*mm)->Execute(stream, m, x.data(), y.data()).ok()) {
    state.SkipWithError("matmul failed");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize((*mm)->Execute(stream, m, x.data(), y.data()));
    stream.wait();
  }
  const double flops = 2.0 * m * k * n;
  SetFlopCounters(state, flops);
  state.SetLabel((*mm)->ImplementationName(m));
}
BENCHMARK(BM_SgemmOnednn)
    ->Args({1024, 1024, 1024})
    ->Args({1024, 768, 3072})
    ->Args({32, 1024, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Apply(AddMinMaxStatistics);

// The same Y = X W through each GEMM backend's kernel (kernels/gemm), as the
// engine runs it: weights prepared once, all OpenMP threads. The label names
// the library and its kernel configuration (BLIS sub-configuration,
// OpenBLAS core); NUMASERVE_BLIS_ARCH / NUMASERVE_OPENBLAS_CORE pick others
// (bench_main.h).
void BM_Gemm(benchmark::State& state, numaserve::kernels::GemmBackend backend) {
  using numaserve::kernels::GemmBackendDetails;
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  if (absl::Status s = numaserve::kernels::GemmBackendAvailable(backend); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  std::vector<float> w = Random(k * n), x = Random(m * k), y(m * n);
  numaserve::kernels::GemmOptions o;
  o.k = k;
  o.n = n;
  o.weights = w.data();
  auto kernel = numaserve::kernels::CreateGemmKernel(backend, o, engine);
  if (!kernel.ok() || !(*kernel)->Run(m, x.data(), y.data()).ok()) {
    state.SkipWithError("gemm failed");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize((*kernel)->Run(m, x.data(), y.data()));
  }
  const double flops = 2.0 * m * k * n;
  SetFlopCounters(state, flops);
  state.SetLabel(GemmBackendDetails(backend));
}

// SGEMM 1024^3; the default MLP's first layer (784 -> 256) at batch 1, 32
// and 256; the benchmark MLP's (784 -> 1024 -> 1024) at 1 and 2 rows; BERT-base's attention
// projection and both FFN matmuls at 128 tokens, and the FFN matmuls at 256 to 4096 rows.
void GemmArgs(benchmark::internal::Benchmark* b) {
  b->Args({1024, 1024, 1024});
  for (int64_t m : {1, 32, 256}) b->Args({m, 784, 256});
  // The benchmark MLP's layers at one and two rows (matrix-vector products).
  for (int64_t m : {1, 2}) {
    b->Args({m, 784, 1024});
    b->Args({m, 1024, 1024});
  }
  b->Args({128, 768, 768});
  b->Args({128, 768, 3072});
  b->Args({128, 3072, 768});
  for (int64_t m : {256, 1024, 4096}) {
    b->Args({m, 768, 3072});
    b->Args({m, 3072, 768});
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK_CAPTURE(BM_Gemm, onednn, numaserve::kernels::GemmBackend::kOnednn)->Apply(GemmArgs);
BENCHMARK_CAPTURE(BM_Gemm, blis, numaserve::kernels::GemmBackend::kBlis)->Apply(GemmArgs);
BENCHMARK_CAPTURE(BM_Gemm, openblas, numaserve::kernels::GemmBackend::kOpenblas)->Apply(GemmArgs);
BENCHMARK_CAPTURE(BM_Gemm, numaserve, numaserve::kernels::GemmBackend::kNumaserve)->Apply(GemmArgs);

}  // namespace

// Times `o` (a square 2D conv, its weights, bias and post-ops set here:
// random, bias + Relu) from src to a blocked dst; GFLOP/s at the direct
// conv's FLOPs, labelled with the implementation.
void TimeConv(benchmark::State& state, numaserve::kernels::ConvOnednnOptions o,
              const numaserve::kernels::Shape& src, const numaserve::kernels::Shape& dst,
              bool src_blocked) {
  const int64_t k = o.kernel[0];
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const std::vector<float> w = Random(o.out_channels * o.in_channels * k * k);
  o.weights = w.data();
  o.bias = Random(o.out_channels);
  o.eltwise.push_back({dnnl::algorithm::eltwise_relu, 0.0f, 0.0f});
  auto conv = numaserve::kernels::ConvOnednn::Create(engine, std::move(o));
  std::vector<float> x =
      Random(numaserve::kernels::ActivationBytes(src, src_blocked) / sizeof(float));
  std::vector<float> y(numaserve::kernels::ActivationBytes(dst, true) / sizeof(float));
  if (!conv.ok() || !(*conv)->Prepare(src, dst, src_blocked, true).ok() ||
      !(*conv)->Execute(stream, src, dst, x.data(), y.data()).ok()) {
    state.SkipWithError("conv failed");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize((*conv)->Execute(stream, src, dst, x.data(), y.data()));
    stream.wait();
  }
  SetFlopCounters(state, 2.0 * dst[0] * dst[1] * dst[2] * dst[3] * src[1] * k * k);
  state.SetLabel((*conv)->ImplementationName(src));
}

// ResNet-50 convs (bias + Relu, as after BatchNormalization folding):
// range(0): which (0: the 7x7 stride-2 stem, 3 -> 64 on 224x224, plain src;
// 1-3: the 3x3 stride-2 convs conv_108 (128 ch, 56x56), conv_215 (256 ch,
// 28x28), conv_372 (512 ch, 14x14), blocked src), range(1): batch,
// range(2): 0 = the blocked direct kernel (ConvChannelsLast::kNever), 1 =
// the default choice (kAuto), 2 = channels-last whenever possible (kAlways).
// dst is blocked. Includes the channels-last path's reorders.
void BM_ConvResNet50(benchmark::State& state) {
  struct ConvShape {
    int64_t c, m, hw, k, stride, pad;
  };
  static constexpr ConvShape kShapes[] = {{3, 64, 224, 7, 2, 3},
                                          {128, 128, 56, 3, 2, 1},
                                          {256, 256, 28, 3, 2, 1},
                                          {512, 512, 14, 3, 2, 1}};
  const ConvShape& c = kShapes[state.range(0)];
  const int64_t n = state.range(1);
  using numaserve::kernels::ConvChannelsLast;
  const ConvChannelsLast layout = state.range(2) == 0   ? ConvChannelsLast::kNever
                                  : state.range(2) == 1 ? ConvChannelsLast::kAuto
                                                        : ConvChannelsLast::kAlways;
  const int64_t out = (c.hw + 2 * c.pad - c.k) / c.stride + 1;
  const numaserve::kernels::Shape src{n, c.c, c.hw, c.hw}, dst{n, c.m, out, out};
  const bool src_blocked = c.c % 16 == 0;
  numaserve::kernels::ConvOnednnOptions o;
  o.in_channels = c.c;
  o.out_channels = c.m;
  o.kernel = {c.k, c.k};
  o.strides = {c.stride, c.stride};
  o.dilations = {1, 1};
  o.pads_begin = o.pads_end = {c.pad, c.pad};
  o.channels_last = layout;
  TimeConv(state, std::move(o), src, dst, src_blocked);
}
BENCHMARK(BM_ConvResNet50)
    ->ArgNames({"conv", "batch", "path"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 32}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Apply(AddMinMaxStatistics);

// ResNet-50's 3x3 stride-1 convs (bias + Relu, blocked src and dst):
// range(0): which (0: 64 ch on 56x56, 1: 128 on 28x28, 2: 256 on 14x14,
// 3: 512 on 7x7), range(1): batch, range(2): 0 = direct, 1 = Winograd
// (numaserve's own F(4x4, 3x3) on the AVX2 tier, oneDNN's on AVX-512).
// GFLOP/s count the direct conv's FLOPs for both (Winograd's effective).
void BM_ConvWinogradResNet50(benchmark::State& state) {
  static constexpr int64_t kChannels[] = {64, 128, 256, 512}, kSize[] = {56, 28, 14, 7};
  const int64_t c = kChannels[state.range(0)], hw = kSize[state.range(0)], n = state.range(1);
  numaserve::kernels::ConvOnednnOptions o;
  o.in_channels = o.out_channels = c;
  o.kernel = {3, 3};
  o.strides = o.dilations = {1, 1};
  o.pads_begin = o.pads_end = {1, 1};
  o.winograd = state.range(2) == 1;
  TimeConv(state, std::move(o), {n, c, hw, hw}, {n, c, hw, hw}, true);
}
BENCHMARK(BM_ConvWinogradResNet50)
    ->ArgNames({"conv", "batch", "winograd"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 32}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Apply(AddMinMaxStatistics);

int main(int argc, char** argv) { return numaserve::bench::Main(argc, argv); }
