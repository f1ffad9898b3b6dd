// A small MLP compiled on each GEMM backend (CompileOptions::gemm_backend)
// against the reference executor, over several batch sizes; the plan names
// the backend; "auto" remembers its choices, but not in the file those
// timed while another thread held the cpu; bad names are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/import/onnx_import.h"
#include "engine/model.h"
#include "engine/ops/shape_propagation.h"
#include "engine/reference/reference_executor.h"
#include "kernels/gemm/gemm_backend.h"
#include "tests/engine/compare_with_reference.h"
#include "tests/engine/onnx_model_builder.h"
#include "tests/prerequisites.h"

namespace numaserve::engine {
namespace {

using ::testing::HasSubstr;
using testing::NormalizedError;
using ::testing::Not;
using testing::OnnxModelBuilder;
using testing::RandomTensor;

// x[B,64] -> Gemm(transB, bias) -> Relu -> MatMul + bias -> erf-GELU
//   -> MatMul + residual Add -> Gemm(alpha, transA=0, C row) -> y[B,10]
std::string BuildMlp() {
  OnnxModelBuilder b(17);
  b.Input("x", {-1, 64}).Output("y", {-1, 10});
  b.Initializer("w1", RandomTensor({96, 64}, 11)).Initializer("b1", RandomTensor({96}, 12));
  b.Initializer("w2", RandomTensor({96, 48}, 13)).Initializer("b2", RandomTensor({48}, 14));
  b.Initializer("w3", RandomTensor({48, 48}, 15));
  b.Initializer("w4", RandomTensor({48, 10}, 16)).Initializer("c4", RandomTensor({1, 10}, 17));
  b.Initializer("sqrt2", kernels::Tensor({}, {1.41421356f}))
      .Initializer("one", kernels::Tensor({}, {1.0f}))
      .Initializer("half", kernels::Tensor({}, {0.5f}));
  auto& fc1 = b.Node("Gemm", {"x", "w1", "b1"}, {"h1"}, "fc1");
  OnnxModelBuilder::AttrInt(fc1, "transB", 1);
  b.Node("Relu", {"h1"}, {"r1"}, "relu1");
  b.Node("MatMul", {"r1", "w2"}, {"h2"}, "fc2");
  b.Node("Add", {"h2", "b2"}, {"h2b"}, "fc2_bias");
  b.Node("Div", {"h2b", "sqrt2"}, {"g0"}, "gelu_div");
  b.Node("Erf", {"g0"}, {"g1"});
  b.Node("Add", {"g1", "one"}, {"g2"});
  b.Node("Mul", {"h2b", "g2"}, {"g3"});
  b.Node("Mul", {"g3", "half"}, {"g4"}, "gelu_half");
  b.Node("MatMul", {"g4", "w3"}, {"h3"}, "fc3");
  b.Node("Add", {"h3", "g4"}, {"r3"}, "residual");
  auto& fc4 = b.Node("Gemm", {"r3", "w4", "c4"}, {"y"}, "fc4");
  OnnxModelBuilder::AttrFloat(fc4, "alpha", 0.5f);
  OnnxModelBuilder::AttrFloat(fc4, "beta", 2.0f);
  return b.Save("gemm_backend_mlp");
}

void ExpectMatchesReference(const std::string& path, const CompileOptions& options,
                            CompiledModel& model) {
  auto graph = ImportOnnxModel(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  uint32_t seed = 1;
  for (int64_t batch : {1, 3, 32, 1}) {
    SCOPED_TRACE(absl::StrCat("backend ", options.gemm_backend, ", batch ", batch));
    std::vector<kernels::Tensor> inputs;
    for (const Shape& s : InputShapesForBatch(*graph, batch)) {
      inputs.push_back(RandomTensor(s, seed++));
    }
    auto expected = RunReference(*graph, inputs);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const auto shapes = model.OutputShapes(batch);
    ASSERT_EQ(shapes.size(), 1u);
    std::vector<float> y(kernels::NumElements(shapes[0]), std::nanf(""));
    std::vector<const void*> in_ptrs = {inputs[0].data.data()};
    std::vector<void*> out_ptrs = {y.data()};
    for (int rep = 0; rep < 2; ++rep) {
      ASSERT_TRUE(model.Run(batch, in_ptrs, out_ptrs).ok());
      EXPECT_LT(NormalizedError((*expected)[0].data, y.data()), 1e-9);
    }
  }
}

class GemmBackendModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmBackendModelTest, MlpMatchesReference) {
  const std::string backend = GetParam();
  if (auto b = kernels::GemmBackendFromName(backend); b.has_value()) {
    if (absl::Status s = kernels::GemmBackendAvailable(*b); !s.ok()) {
      // The own GEMM runs on the AVX2 tier only (the machine's tier, not a
      // missing package); BLIS and OpenBLAS unavailable are missing packages.
      if (*b == kernels::GemmBackend::kNumaserve) GTEST_SKIP() << s.message();
      NUMASERVE_MISSING_PREREQUISITE() << s.message();
    }
  }
  const std::string path = BuildMlp();
  const CompileOptions options{.gemm_backend = backend};
  auto model = CompiledModel::Load(path, options);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectMatchesReference(path, options, **model);

  // Four matmul steps, each naming its backend (nothing for the default).
  const std::string plan = (*model)->DescribePlan();
  EXPECT_THAT(plan, HasSubstr("matmul: fc1+relu1"));
  EXPECT_THAT(plan, HasSubstr("matmul: fc2+fc2_bias+gelu(gelu_div..gelu_half)"));
  EXPECT_THAT(plan, HasSubstr("matmul: fc3+residual"));
  EXPECT_THAT(plan, HasSubstr("matmul: fc4"));
  EXPECT_EQ(std::count(plan.begin(), plan.end(), '\n'), 4) << plan;
  if (backend == "onednn") {
    EXPECT_THAT(plan, Not(HasSubstr("[")));
  } else if (backend == "auto") {
    EXPECT_THAT(plan, HasSubstr("matmul: fc1+relu1 [auto: "));
    EXPECT_THAT(plan, HasSubstr("(M=1+32) -> "));
  } else {
    EXPECT_THAT(plan, HasSubstr(absl::StrCat("matmul: fc4 [", backend, "]")));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GemmBackendModelTest,
                         ::testing::Values("onednn", "blis", "openblas", "numaserve", "auto"),
                         [](const auto& info) { return info.param; });

TEST(GemmBackendModelTest, UnknownBackendIsRefusedWithTheChoices) {
  auto model = CompiledModel::Load(BuildMlp(), {.gemm_backend = "cublas"});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr("gemm backend 'cublas' is not one of onednn, blis, openblas, "
                        "numaserve, auto"));
}

TEST(GemmBackendModelTest, AutoRemembersItsChoicesInProcessAndInTheFile) {
  const std::string path = BuildMlp();
  const std::string file =
      absl::StrCat(::testing::TempDir(), "/numaserve_gemm_choices_", getpid(), ".tsv");
  std::filesystem::remove(file);
  // Written however busy the cores are (ctest runs other tests beside).
  const CompileOptions options{
      .gemm_backend = "auto", .gemm_cache_file = file, .gemm_cache_max_contention = INFINITY};
  auto first = CompiledModel::Load(path, options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT((*first)->DescribePlan(), Not(HasSubstr("cached")));
  // One line per distinct (K, N): fc1 64x96, fc2 96x48, fc3 48x48, fc4 48x10.
  std::ifstream in(file);
  std::stringstream stream;
  stream << in.rdbuf();
  const std::string text = stream.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1 + 4) << text;
  // Keyed by the model's canonical path.
  const std::string canonical = std::filesystem::weakly_canonical(path).string();
  EXPECT_THAT(text, HasSubstr(absl::StrCat(canonical, "\t64\t96\t0\t")));

  auto second = CompiledModel::Load(path, options);
  ASSERT_TRUE(second.ok()) << second.status();
  const std::string plan = (*second)->DescribePlan();
  EXPECT_EQ(std::count(plan.begin(), plan.end(), '\n'), 4) << plan;
  for (const char* layer : {"fc1", "fc2", "fc3", "fc4"}) {
    EXPECT_THAT(plan, HasSubstr(absl::StrCat("matmul: ", layer)));
  }
  EXPECT_EQ(std::count(plan.begin(), plan.end(), ']'), 4) << plan;
  EXPECT_THAT(plan, HasSubstr(", cached]"));
  ExpectMatchesReference(path, options, **second);
  std::filesystem::remove(file);
}

// A busy thread pinned to the cpu the load runs on, for the life of the
// object; the calling thread is pinned there too (both restored after).
class CpuHog {
 public:
  CpuHog() {
    pthread_getaffinity_np(pthread_self(), sizeof(saved_), &saved_);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &saved_)) ++cpu;
    CPU_ZERO(&one_);
    CPU_SET(cpu, &one_);
    pthread_setaffinity_np(pthread_self(), sizeof(one_), &one_);
    hog_ = std::thread([this] {
      pthread_setaffinity_np(pthread_self(), sizeof(one_), &one_);
      volatile uint64_t spins = 0;
      while (!stop_.load(std::memory_order_relaxed)) spins = spins + 1;
    });
  }
  ~CpuHog() {
    stop_ = true;
    hog_.join();
    pthread_setaffinity_np(pthread_self(), sizeof(saved_), &saved_);
  }

 private:
  cpu_set_t saved_{}, one_{};
  std::atomic<bool> stop_{false};
  std::thread hog_;
};

TEST(GemmBackendModelTest, AChoiceTimedWhileAnotherThreadHeldTheCpuIsNotWritten) {
  // One layer large enough that its timing lasts tens of milliseconds,
  // many of the scheduler's slices: a tiny layer may be timed between two
  // of the busy thread's turns, undisturbed (and is then rightly written).
  OnnxModelBuilder b(17);
  b.Input("x", {-1, 512}).Output("y", {-1, 512});
  b.Initializer("w", RandomTensor({512, 512}, 21));
  b.Node("MatMul", {"x", "w"}, {"y"}, "wide");
  const std::string path = b.Save("gemm_contended");
  const std::string file =
      absl::StrCat(::testing::TempDir(), "/numaserve_gemm_contended_", getpid(), ".tsv");
  std::filesystem::remove(file);
  // One thread, sharing its cpu with a busy one: about half of the timing
  // waiting for the cpu, far above the default 0.1.
  // (The GEMMs are timed on the OpenMP threads of the load; one thread
  // makes no workers, whose affinity would be the pinned one's.)
  const CompileOptions options{.num_threads = 1, .gemm_backend = "auto", .gemm_cache_file = file};
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  {
    CpuHog hog;
    auto model = CompiledModel::Load(path, options);
    omp_set_num_threads(saved_threads);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_THAT((*model)->DescribePlan(), Not(HasSubstr("cached")));
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), Not(HasSubstr(std::filesystem::weakly_canonical(path).string())))
      << "choices timed under contention were written";
  // Remembered in the process all the same (the key has the thread count).
  omp_set_num_threads(1);
  auto again = CompiledModel::Load(path, options);
  omp_set_num_threads(saved_threads);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT((*again)->DescribePlan(), HasSubstr(", cached]"));
  std::filesystem::remove(file);
}

TEST(GemmBackendModelTest, GemmBackendChoicesAndDefaultCacheFile) {
  EXPECT_TRUE(CheckGemmBackendChoice("auto").ok());
  EXPECT_TRUE(CheckGemmBackendChoice("openblas").ok());
  EXPECT_FALSE(CheckGemmBackendChoice("").ok());
  EXPECT_FALSE(CheckGemmBackendChoice("BLIS").ok());
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(DefaultGemmCacheFile(), "/xdg/numaserve/gemm_choices.tsv");
  // NUMASERVE_GEMM_CACHE is numaserve's main's to read (--gemm-cache), not
  // the engine's.
  setenv("NUMASERVE_GEMM_CACHE", "/tmp/x/choices.tsv", 1);
  EXPECT_EQ(DefaultGemmCacheFile(), "/xdg/numaserve/gemm_choices.tsv");
  unsetenv("NUMASERVE_GEMM_CACHE");
  unsetenv("XDG_CACHE_HOME");
}

}  // namespace
}  // namespace numaserve::engine
