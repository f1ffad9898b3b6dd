// Every GEMM backend (oneDNN, BLIS, OpenBLAS) against the scalar reference
// over shapes, transposes and epilogues; a backend whose library is missing
// is skipped with the reason. Plus library loading errors, the "auto"
// chooser and its cache.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "affinity/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_autotune.h"
#include "kernels/gemm/gemm_backend.h"
#include "kernels/ref/add_ref.h"
#include "kernels/ref/gemm_ref.h"
#include "tests/kernels/test_util.h"
#include "tests/prerequisites.h"

namespace numaserve::kernels {
namespace {

using testing::NormalizedError;
using testing::RandomTensor;

struct GemmCase {
  int64_t m, k, n;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  bool bias = false;
  bool relu = false;
  bool gelu = false;
  float beta_accumulate = 0.0f;  // != 0: Y += beta * C (full [M,N] C)

  std::string Name() const {
    return absl::StrCat("M", m, "_K", k, "_N", n, trans_a ? "_tA" : "", trans_b ? "_tB" : "",
                        "_alpha", static_cast<int>(alpha * 100), bias ? "_bias" : "",
                        relu ? "_relu" : "", gelu ? "_gelu" : "", "_beta",
                        static_cast<int>(beta_accumulate * 100) + 1000);
  }
};

std::vector<GemmCase> Cases() {
  std::vector<GemmCase> cases;
  for (int64_t m : {1, 2, 7, 32, 100}) {
    cases.push_back({.m = m, .k = 784, .n = 256, .trans_b = true, .bias = true, .relu = true});
    cases.push_back({.m = m, .k = 64, .n = 10});
  }
  cases.push_back({.m = 1, .k = 33, .n = 17, .trans_a = true, .bias = true});
  cases.push_back({.m = 5, .k = 33, .n = 17, .trans_a = true, .trans_b = true, .alpha = 0.5f});
  cases.push_back({.m = 16, .k = 48, .n = 96, .bias = true, .gelu = true});
  cases.push_back({.m = 1, .k = 48, .n = 96, .bias = true, .gelu = true});
  cases.push_back({.m = 9, .k = 20, .n = 30, .bias = true, .relu = true, .beta_accumulate = 0.7f});
  cases.push_back({.m = 1, .k = 20, .n = 30, .beta_accumulate = 1.0f});
  cases.push_back({.m = 300, .k = 128, .n = 300, .bias = true, .relu = true});  // parallel epilogue
  return cases;
}

// The reference: alpha*op(A)op(B) + bias + beta*acc, then relu, then GELU.
std::vector<float> Expected(const GemmCase& c, const Tensor& a, const Tensor& b, const Tensor& bias,
                            const Tensor& acc) {
  auto y = GemmRef(a, b, c.bias ? &bias : nullptr,
                   {.alpha = c.alpha, .beta = 1.0f, .trans_a = c.trans_a, .trans_b = c.trans_b});
  EXPECT_TRUE(y.ok()) << y.status();
  for (int64_t i = 0; i < c.m * c.n; ++i) y->data[i] += c.beta_accumulate * acc.data[i];
  if (c.relu) *y = ReluRef(*y);
  if (c.gelu) {
    for (float& v : y->data) v = 0.5f * v * (1.0f + std::erf(v / std::sqrt(2.0f)));
  }
  return y->data;
}

class GemmBackendTest : public ::testing::TestWithParam<std::tuple<GemmBackend, GemmCase>> {
 protected:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
};

TEST_P(GemmBackendTest, MatchesReference) {
  const auto [backend, c] = GetParam();
  if (absl::Status s = GemmBackendAvailable(backend); !s.ok()) {
    // The own GEMM runs on the AVX2 tier only: a machine's tier, not a
    // missing package. BLIS and OpenBLAS unavailable are missing packages.
    if (backend == GemmBackend::kNumaserve) GTEST_SKIP() << s.message();
    NUMASERVE_MISSING_PREREQUISITE() << s.message();
  }
  const Tensor a = RandomTensor(c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, 1);
  const Tensor b = RandomTensor(c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, 2);
  const Tensor bias = RandomTensor({c.n}, 3);
  const Tensor acc = RandomTensor({c.m, c.n}, 4);
  const std::vector<float> expected = Expected(c, a, b, bias, acc);

  GemmOptions options{.k = c.k,
                      .n = c.n,
                      .weights = b.data.data(),
                      .weights_transposed = c.trans_b,
                      .weights_scale = c.alpha,
                      .bias = c.bias ? bias.data : std::vector<float>{},
                      .src_transposed = c.trans_a,
                      .accumulate = c.beta_accumulate != 0.0f,
                      .sum_scale = c.beta_accumulate,
                      .relu = c.relu,
                      .gelu_erf = c.gelu};
  auto kernel = CreateGemmKernel(backend, options, engine_);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->backend(), backend);
  EXPECT_EQ((*kernel)->k(), c.k);
  EXPECT_EQ((*kernel)->n(), c.n);
  EXPECT_GE((*kernel)->weight_bytes(), c.k * c.n * static_cast<int64_t>(sizeof(float)));
  // Twice: nothing may depend on state left by the first call. Without
  // accumulation dst starts as NaNs, which must never leak through.
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<float> y =
        c.beta_accumulate != 0.0f ? acc.data : std::vector<float>(c.m * c.n, std::nanf(""));
    ASSERT_TRUE((*kernel)->Run(c.m, a.data.data(), y.data()).ok());
    EXPECT_LT(NormalizedError(expected.data(), y.data(), c.m * c.n), 1e-10)
        << GemmBackendName(backend) << " " << c.Name();
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmBackendTest,
                         ::testing::Combine(::testing::ValuesIn(kAllGemmBackends),
                                            ::testing::ValuesIn(Cases())),
                         [](const auto& info) {
                           return absl::StrCat(GemmBackendName(std::get<0>(info.param)), "_",
                                               std::get<1>(info.param).Name());
                         });

// Two callers of one BLAS backend with OpenMP teams of different sizes, as
// two instances of a model in one worker are: each call must run with its
// own caller's team, whatever the other caller sets meanwhile. The hook
// runs inside each call, where the library computes.
struct CallProbe {
  std::atomic<std::thread::id> slow{};  // its call waits inside for the other
  std::atomic<bool> slow_in_call{false};
  std::atomic<bool> other_started{false};
  std::atomic<int> slow_threads{-2};   // the library's count inside the slow call
  std::atomic<int> other_threads{-2};  // and inside the last other call
};
CallProbe probe;

void ProbeHook(GemmBackend backend) {
  if (std::this_thread::get_id() != probe.slow.load()) {
    probe.other_threads = GemmLibraryThreads(backend);
    return;
  }
  probe.slow_in_call = true;
  // The other caller starts its call now; give it time to set its count.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!probe.other_started && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  probe.slow_threads = GemmLibraryThreads(backend);
}

class GemmBackendThreadsTest : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void TearDown() override { SetGemmCallHookForTesting(nullptr); }
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
};

TEST_P(GemmBackendThreadsTest, EachCallRunsWithItsCallersTeam) {
  const GemmBackend backend = GetParam();
  if (absl::Status s = GemmBackendAvailable(backend); !s.ok()) {
    NUMASERVE_MISSING_PREREQUISITE() << s.message();
  }
  constexpr int64_t kM = 8, kK = 64, kN = 64;
  const Tensor a = RandomTensor({kM, kK}, 1);
  const Tensor b = RandomTensor({kK, kN}, 2);
  auto kernel = CreateGemmKernel(backend, {.k = kK, .n = kN, .weights = b.data.data()}, engine_);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  // Each caller runs a kernel of its own, as each instance has its copy.
  auto other_kernel =
      CreateGemmKernel(backend, {.k = kK, .n = kN, .weights = b.data.data()}, engine_);
  ASSERT_TRUE(other_kernel.ok()) << other_kernel.status();
  auto run = [&](GemmKernel* k, int threads) {
    omp_set_num_threads(threads);
    std::vector<float> y(kM * kN);
    return k->Run(kM, a.data.data(), y.data()).ok();
  };
  probe.slow_in_call = false;
  probe.other_started = false;
  probe.slow_threads = -2;
  probe.other_threads = -2;
  SetGemmCallHookForTesting(ProbeHook);
  bool slow_ok = false, other_ok = false;
  std::thread slow([&] {
    probe.slow = std::this_thread::get_id();
    slow_ok = run(kernel->get(), 3);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!probe.slow_in_call && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::thread other([&] {
    probe.other_started = true;
    other_ok = run(other_kernel->get(), 2);
  });
  slow.join();
  other.join();
  EXPECT_TRUE(slow_ok && other_ok);
  EXPECT_EQ(probe.slow_threads, 3)
      << GemmBackendName(backend) << ": the other caller's count replaced this call's";
  EXPECT_EQ(probe.other_threads, 2) << GemmBackendName(backend);
  // A third caller with the count the last call set: its own call runs
  // with it too (a count set on another thread says nothing of this one's).
  probe.other_threads = -2;
  bool third_ok = false;
  std::thread third([&] { third_ok = run(other_kernel->get(), 2); });
  third.join();
  EXPECT_TRUE(third_ok);
  EXPECT_EQ(probe.other_threads, 2) << GemmBackendName(backend) << ": a new caller's call";
}

INSTANTIATE_TEST_SUITE_P(Concurrent, GemmBackendThreadsTest,
                         ::testing::Values(GemmBackend::kBlis, GemmBackend::kOpenblas),
                         [](const auto& info) { return GemmBackendName(info.param); });

TEST(GemmBackendNamesTest, RoundTrip) {
  for (GemmBackend b : kAllGemmBackends) EXPECT_EQ(GemmBackendFromName(GemmBackendName(b)), b);
  EXPECT_FALSE(GemmBackendFromName("auto").has_value());
  EXPECT_FALSE(GemmBackendFromName("cublas").has_value());
}

TEST(GemmBackendLibraryTest, MissingLibraryIsAReasonNotACrash) {
  for (GemmBackend b : {GemmBackend::kBlis, GemmBackend::kOpenblas}) {
    absl::Status s = CheckGemmLibrary(b, "/nonexistent/libnothing.so.1");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("/nonexistent/libnothing.so.1"), std::string::npos) << s;
    EXPECT_NE(s.message().find(GemmBackendName(b)), std::string::npos) << s;
  }
}

TEST(GemmBackendLibraryTest, LibraryWithoutTheEntryPointsIsNamed) {
  // libm loads but has no BLAS.
  absl::Status s = CheckGemmLibrary(GemmBackend::kBlis, "libm.so.6");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("lacks bli_sgemm"), std::string::npos) << s;
  s = CheckGemmLibrary(GemmBackend::kOpenblas, "libm.so.6");
  EXPECT_NE(s.message().find("lacks cblas_sgemm"), std::string::npos) << s;
}

TEST(GemmBackendLibraryTest, InstalledLibrariesPass) {
  std::string missing;
  for (GemmBackend b : {GemmBackend::kBlis, GemmBackend::kOpenblas}) {
    if (absl::Status s = GemmBackendAvailable(b); !s.ok()) {
      missing += std::string(GemmBackendName(b)) + ": " + std::string(s.message()) + "; ";
      continue;
    }
    EXPECT_FALSE(GemmBackendDetails(b).empty()) << GemmBackendName(b);
  }
  if (!missing.empty()) NUMASERVE_MISSING_PREREQUISITE() << missing;
}

TEST(GemmBackendLibraryTest, BlisRunsAVectorSubConfiguration) {
  if (absl::Status s = GemmBackendAvailable(GemmBackend::kBlis); !s.ok()) {
    NUMASERVE_MISSING_PREREQUISITE() << s.message();
  }
  const affinity::CpuFeatures& f = affinity::GetCpuFeatures();
  if (!f.avx2 || std::getenv("BLIS_ARCH_TYPE") != nullptr) {
    GTEST_SKIP() << "no AVX2, or BLIS_ARCH_TYPE forces the configuration";
  }
  // BLIS 0.9.0's own CPUID table takes a Zen 5 for 'generic' (scalar C).
  const std::string details = GemmBackendDetails(GemmBackend::kBlis);
  EXPECT_EQ(details.find("sub-configuration generic"), std::string::npos) << details;
  // AVX-512 where the process may run it (not under the ISA cap avx2).
  if (f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl &&
      GetDispatchDecision().max_tier == IsaTier::kAvx512) {
    EXPECT_NE(details.find("sub-configuration skx"), std::string::npos) << details;
  } else {
    EXPECT_EQ(details.find("sub-configuration skx"), std::string::npos) << details;
  }
}

TEST(GemmBackendLibraryTest, OneDnnRejectsALibraryPath) {
  EXPECT_EQ(CheckGemmLibrary(GemmBackend::kOnednn, "x.so").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GemmBackendCreateTest, RejectsBadOptions) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  std::vector<float> w(6, 1.0f);
  for (GemmBackend b : kAllGemmBackends) {
    if (!GemmBackendAvailable(b).ok()) continue;
    GemmOptions o;
    o.k = 2;
    o.n = 3;
    EXPECT_FALSE(CreateGemmKernel(b, o, engine).ok()) << GemmBackendName(b);  // no weights
    o.weights = w.data();
    o.bias = {1.0f, 2.0f};
    EXPECT_FALSE(CreateGemmKernel(b, o, engine).ok()) << GemmBackendName(b);  // bias of 2, N=3
    o.bias.clear();
    auto kernel = CreateGemmKernel(b, o, engine);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    std::vector<float> x(2), y(3);
    EXPECT_FALSE((*kernel)->Run(0, x.data(), y.data()).ok()) << GemmBackendName(b);
  }
}

TEST(GemmAutotuneTest, KeepsTheFastestTimedKernelAndItIsCorrect) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const GemmCase c{.m = 8, .k = 96, .n = 64, .bias = true, .relu = true};
  const Tensor a = RandomTensor({c.m, c.k}, 1);
  const Tensor b = RandomTensor({c.k, c.n}, 2);
  const Tensor bias = RandomTensor({c.n}, 3);
  const Tensor acc = RandomTensor({c.m, c.n}, 4);
  GemmOptions options{
      .k = c.k, .n = c.n, .weights = b.data.data(), .bias = bias.data, .relu = true};
  GemmChoice choice;
  auto kernel = CreateFastestGemmKernel(options, engine, {.rows = {1, 8}, .min_runs = 2}, &choice);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->backend(), choice.backend);
  ASSERT_EQ(choice.timings.size(), std::size(kAllGemmBackends));
  double best = 1e30;
  for (const GemmTiming& t : choice.timings) {
    EXPECT_EQ(t.status.ok(), GemmBackendAvailable(t.backend).ok()) << t.status;
    if (!t.status.ok()) continue;
    ASSERT_EQ(t.seconds.size(), 2u);
    for (double s : t.seconds) EXPECT_GT(s, 0.0);
    best = std::min(best, t.total());
  }
  for (const GemmTiming& t : choice.timings) {
    if (t.backend == choice.backend) {
      EXPECT_EQ(t.total(), best);
    }
  }
  EXPECT_NE(choice.Summary().find(absl::StrCat("-> ", GemmBackendName(choice.backend))),
            std::string::npos)
      << choice.Summary();
  std::vector<float> y(c.m * c.n);
  ASSERT_TRUE((*kernel)->Run(c.m, a.data.data(), y.data()).ok());
  EXPECT_LT(NormalizedError(Expected(c, a, b, bias, acc).data(), y.data(), c.m * c.n), 1e-10);
}

class GemmChoiceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("gemm_cache_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    file_ = (dir_ / "sub" / "choices.tsv").string();
    // Entries of models that no longer exist are dropped: give it a file.
    std::filesystem::create_directories(dir_);
    key_.model = (dir_ / "model.onnx").string();
    std::ofstream(key_.model) << "onnx";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string file_;
  GemmChoiceCache::Key key_{.model = "", .k = 784, .n = 1024, .threads = 2, .cpu = "AMD EPYC"};
};

TEST_F(GemmChoiceCacheTest, RemembersInProcessAndAcrossProcessesThroughTheFile) {
  GemmChoiceCache writer;
  std::string where;
  EXPECT_FALSE(writer.Find(key_, file_, &where).has_value());
  writer.Store(key_, GemmBackend::kOpenblas, file_);
  EXPECT_EQ(writer.Find(key_, file_, &where), GemmBackend::kOpenblas);
  EXPECT_EQ(where, "this process");

  GemmChoiceCache reader;  // another process: only the file
  EXPECT_EQ(reader.Find(key_, file_, &where), GemmBackend::kOpenblas);
  EXPECT_EQ(where, file_);
  // Another shape, thread count or CPU is another entry.
  GemmChoiceCache::Key other = key_;
  other.threads = 4;
  EXPECT_FALSE(reader.Find(other, file_, &where).has_value());
  other = key_;
  other.src_transposed = true;
  EXPECT_FALSE(reader.Find(other, file_, &where).has_value());
  // Writers merge: a second entry keeps the first.
  reader.Store(other, GemmBackend::kBlis, file_);
  GemmChoiceCache third;
  EXPECT_EQ(third.Find(key_, file_, &where), GemmBackend::kOpenblas);
  EXPECT_EQ(third.Find(other, file_, &where), GemmBackend::kBlis);
  // Nothing left behind but the file itself.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "sub")) {
    ++files;
    EXPECT_EQ(e.path().string(), file_);
  }
  EXPECT_EQ(files, 1);
  // Once the model file is gone, the next Store drops its entries.
  GemmChoiceCache::Key kept = key_;
  kept.model = file_;  // a file that exists
  std::filesystem::remove(key_.model);
  third.Store(kept, GemmBackend::kOnednn, file_);
  GemmChoiceCache fourth;
  EXPECT_FALSE(fourth.Find(key_, file_, &where).has_value());
  EXPECT_FALSE(fourth.Find(other, file_, &where).has_value());
  EXPECT_EQ(fourth.Find(kept, file_, &where), GemmBackend::kOnednn);
}

TEST_F(GemmChoiceCacheTest, CorruptFileIsIgnoredAndReplaced) {
  std::filesystem::create_directories(dir_ / "sub");
  {
    std::ofstream out(file_);
    out << "# numaserve gemm choices v1\n/m/model.onnx\t784\tgarbage\n";
  }
  GemmChoiceCache cache;
  std::string where;
  EXPECT_FALSE(cache.Find(key_, file_, &where).has_value());
  cache.Store(key_, GemmBackend::kBlis, file_);
  GemmChoiceCache reader;
  EXPECT_EQ(reader.Find(key_, file_, &where), GemmBackend::kBlis);
  // An unknown backend name is corruption too.
  {
    std::ofstream out(file_);
    out << "# numaserve gemm choices v1\n" << key_.model << "\t784\t1024\t0\t2\tAMD EPYC\tcublas\n";
  }
  GemmChoiceCache again;
  EXPECT_FALSE(again.Find(key_, file_, &where).has_value());
}

// The cache file was written through "FILE.tmp.<pid>.<n>", a name another
// user of a shared directory could predict: a symbolic link planted at
// every such name is not followed. The file it points to keeps its
// contents, FILE is a regular file holding the choice, and the links are
// left as they were.
TEST_F(GemmChoiceCacheTest, LinksPlantedAtPredictableTemporaryNamesAreNotFollowed) {
  std::filesystem::create_directories(dir_ / "sub");
  const std::filesystem::path target = dir_ / "target";
  std::ofstream(target) << "precious";
  // The counter was process-wide: cover the stores other tests made.
  for (int n = 0; n < 64; ++n) {
    std::filesystem::create_symlink(target, absl::StrCat(file_, ".tmp.", getpid(), ".", n));
  }
  GemmChoiceCache cache;
  cache.Store(key_, GemmBackend::kBlis, file_);
  std::ifstream in(target);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(file_)));
  GemmChoiceCache reader;
  std::string where;
  EXPECT_EQ(reader.Find(key_, file_, &where), GemmBackend::kBlis);
  EXPECT_EQ(where, file_);
  int links = 0, others = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "sub")) {
    if (std::filesystem::is_symlink(e.symlink_status())) {
      ++links;
    } else if (e.path().string() != file_) {
      ++others;  // a temporary file left behind
    }
  }
  EXPECT_EQ(links, 64);
  EXPECT_EQ(others, 0);
}

TEST_F(GemmChoiceCacheTest, UnwritableFileIsAWarningNotAnError) {
  GemmChoiceCache cache;
  cache.Store(key_, GemmBackend::kBlis, "/proc/no/such/dir/choices.tsv");
  std::string where;
  EXPECT_EQ(cache.Find(key_, "/proc/no/such/dir/choices.tsv", &where), GemmBackend::kBlis);
  EXPECT_EQ(where, "this process");
}

}  // namespace
}  // namespace numaserve::kernels
