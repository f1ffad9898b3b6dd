#include "kernels/gemm/blas_gemm.h"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "affinity/cpu_features.h"
#include "base/mutex.h"
#include "kernels/dispatch.h"

namespace numaserve::kernels::blas {
namespace {

// Debian's OpenMP builds first (the libraries' alternatives may point the
// plain sonames at another build), then whatever the loader finds.
const std::vector<std::string>& BlisPaths() {
  static const std::vector<std::string> kPaths = {
      "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "libblis.so.4"};
  return kPaths;
}
const std::vector<std::string>& OpenblasPaths() {
  static const std::vector<std::string> kPaths = {
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", "libopenblas.so.0"};
  return kPaths;
}

// BLIS 0.9 typed API (blis.h): dim_t and inc_t are int64_t; trans_t and
// conj_t are enums (BLIS_TRANS_BIT is 1 << 3).
constexpr int kBlisNoTranspose = 0, kBlisTranspose = 1 << 3, kBlisNoConjugate = 0;
using BliSgemm = void (*)(int transa, int transb, int64_t m, int64_t n, int64_t k,
                          const float* alpha, const float* a, int64_t rsa, int64_t csa,
                          const float* b, int64_t rsb, int64_t csb, const float* beta, float* c,
                          int64_t rsc, int64_t csc);
using BliSgemv = void (*)(int transa, int conjx, int64_t m, int64_t n, const float* alpha,
                          const float* a, int64_t rsa, int64_t csa, const float* x, int64_t incx,
                          const float* beta, float* y, int64_t incy);
using BliSetThreads = void (*)(int64_t);
using BliGetThreads = int64_t (*)();
using BliArchQueryId = int (*)();
using BliArchString = const char* (*)(int);
using BliVersion = const char* (*)();
using BliInit = void (*)();

// CBLAS (cblas.h): CBLAS_ORDER and CBLAS_TRANSPOSE values.
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;
using CblasSgemm = void (*)(int order, int transa, int transb, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);
using CblasSgemv = void (*)(int order, int trans, int m, int n, float alpha, const float* a,
                            int lda, const float* x, int incx, float beta, float* y, int incy);
using OpenblasSetThreads = void (*)(int);
using OpenblasGetThreads = int (*)();
using OpenblasString = char* (*)();

struct Opened {
  void* handle = nullptr;
  std::string path;
};

absl::StatusOr<Opened> Open(const char* backend, const std::vector<std::string>& paths) {
  std::vector<std::string> errors;
  for (const std::string& path : paths) {
    dlerror();
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND); h != nullptr) {
      return Opened{h, path};
    }
    const char* e = dlerror();
    errors.push_back(e != nullptr ? e : path + ": cannot load");
  }
  return absl::FailedPreconditionError(
      absl::StrCat(backend, " is unavailable: ", absl::StrJoin(errors, "; ")));
}

// Looks up entry points and names the missing ones.
class Binder {
 public:
  explicit Binder(void* handle) : handle_(handle) {}
  template <typename F>
  void Bind(const char* name, F* fn) {
    *fn = reinterpret_cast<F>(dlsym(handle_, name));
    if (*fn == nullptr) missing_.push_back(name);
  }
  absl::Status Check(const char* backend, const std::string& path) const {
    if (missing_.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(backend, " is unavailable: ", path, " lacks ", absl::StrJoin(missing_, ", ")));
  }

 private:
  void* handle_;
  std::vector<std::string> missing_;
};

// Sets an environment variable for the library's initialisation only. The
// libraries take these settings from the environment alone, and read them
// once: this runs once per process, in the function-local statics that
// load them (the static BlisApi / OpenblasApi pointers below), at the
// first GEMM created on that backend. A thread reading the environment at
// that moment could see it change.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): see above.
    if (!value.empty()) set_ = setenv(name, value.c_str(), 1) == 0;
  }
  ~ScopedEnv() {
    if (set_) unsetenv(name_);  // NOLINT(concurrency-mt-unsafe): see above.
  }

 private:
  const char* name_;
  bool set_ = false;
};

// AVX-512 usable and not capped away (the ISA cap avx2 makes the
// libraries run their AVX2 kernels, as it does oneDNN).
bool HasAvx512(const affinity::CpuFeatures& f) {
  return f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl &&
         GetDispatchDecision().max_tier == IsaTier::kAvx512;
}

// SetOptions' options, read by each library's load, after which an option
// that configures it is no longer changed.
base::Mutex options_mu;
GemmBackendOptions options ABSL_GUARDED_BY(options_mu);
bool blis_loaded ABSL_GUARDED_BY(options_mu) = false;
bool openblas_loaded ABSL_GUARDED_BY(options_mu) = false;

// The option a library's load reads, marking it loaded.
std::string TakeOption(std::string GemmBackendOptions::* field, bool* loaded)
    ABSL_LOCKS_EXCLUDED(options_mu) {
  base::MutexLock lock(&options_mu);
  *loaded = true;
  return options.*field;
}

// ---- thread counts ----

// A library thread count that is one per process (OpenBLAS's, BLIS 0.9's),
// shared by calls from threads with OpenMP teams of different sizes (the
// instances of models in one worker): a call sets it to its own team's
// size and computes while no call of another size does. Calls of one size
// run together; a call of another size waits until they have finished,
// and calls that come after it wait behind it, so each size gets its turn.
class SharedThreadCount {
 public:
  explicit SharedThreadCount(std::function<void(int)> set) : set_(std::move(set)) {}

  // Waits for the caller's turn, sets the count to `threads` if it differs,
  // and counts the call in.
  void Enter(int threads) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    const uint64_t ticket = next_ticket_++;
    queue_.push_back(ticket);
    while (queue_.front() != ticket || (running_ > 0 && count_ != threads)) cv_.Wait(&mu_);
    queue_.pop_front();
    if (count_ != threads) {
      set_(threads);
      count_ = threads;
    }
    ++running_;
    cv_.SignalAll();  // the next in line may have the same count
  }

  void Exit() ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    if (--running_ == 0) cv_.SignalAll();
  }

 private:
  const std::function<void(int)> set_;
  base::Mutex mu_;
  base::CondVar cv_;
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // tickets of the calls waiting, in order
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  int count_ ABSL_GUARDED_BY(mu_) = 0;    // the count last set; 0 before the first call
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // calls computing with count_
};

// One call's thread count, held until the call returns: its turn of a
// SharedThreadCount, or nothing where the count was set for the calling
// thread alone.
class ThreadCountTurn {
 public:
  ThreadCountTurn(SharedThreadCount* shared, int threads) : shared_(shared) {
    if (shared_ != nullptr) shared_->Enter(threads);
  }
  ~ThreadCountTurn() {
    if (shared_ != nullptr) shared_->Exit();
  }
  ThreadCountTurn(const ThreadCountTurn&) = delete;
  ThreadCountTurn& operator=(const ThreadCountTurn&) = delete;

 private:
  SharedThreadCount* const shared_;
};

// ---- BLIS ----

struct BlisApi {
  absl::Status status;
  std::string details;
  BliSgemm sgemm = nullptr;
  BliSgemv sgemv = nullptr;
  BliSetThreads set_threads = nullptr;
  BliGetThreads get_threads = nullptr;
  BliArchQueryId arch_query_id = nullptr;
  BliArchString arch_string = nullptr;
  BliVersion version = nullptr;
  BliInit init = nullptr;
  // Set at load where bli_thread_set_num_threads sets the process's count
  // (BLIS 0.9, or a build without thread-local storage); null where it sets
  // the calling thread's own (BLIS 1.x with thread-local storage, as
  // Debian 13 builds it).
  std::unique_ptr<SharedThreadCount> shared_threads;

  // The count for a call of `n` threads from the calling thread.
  ThreadCountTurn ThreadsFor(int n) {
    if (shared_threads != nullptr) return ThreadCountTurn(shared_threads.get(), n);
    static thread_local int set_here = 0;  // what this thread last set
    if (set_here != n) {
      set_threads(n);
      set_here = n;
    }
    return ThreadCountTurn(nullptr, n);
  }
};

absl::Status BindBlis(void* handle, const std::string& path, BlisApi* api) {
  Binder b(handle);
  b.Bind("bli_sgemm", &api->sgemm);
  b.Bind("bli_sgemv", &api->sgemv);
  b.Bind("bli_thread_set_num_threads", &api->set_threads);
  b.Bind("bli_thread_get_num_threads", &api->get_threads);
  b.Bind("bli_arch_query_id", &api->arch_query_id);
  b.Bind("bli_arch_string", &api->arch_string);
  b.Bind("bli_info_get_version_str", &api->version);
  b.Bind("bli_init", &api->init);
  return b.Check("blis", path);
}

// The sub-configuration for this CPU: BLIS 0.9's own table knows neither
// Zen 4/5 nor every hypervisor's CPUID, and falls back to 'generic'.
// Measured on a 2-vCPU AMD Zen 5 (KVM), SGEMM 1024^3 on 2 threads:
// benchmarks/results/2026-11-21-gemm-zen5.md.
std::pair<std::string, std::string> ChooseBlisArch(const std::string& forced) {
  if (!forced.empty()) return {forced, "--blis-arch (NUMASERVE_BLIS_ARCH)"};
  const affinity::CpuFeatures& f = affinity::GetCpuFeatures();
  if (HasAvx512(f)) return {"skx", "the CPU's AVX-512"};
  if (f.avx2 && f.fma) {
    return {f.vendor == "AuthenticAMD" ? "zen3" : "haswell", "the CPU's AVX2 and FMA"};
  }
  return {"", ""};
}

// BLIS_ARCH_TYPE takes arch_t's value. The ids below are BLIS 0.9's enum
// (blis.h); BLIS 1.1's (Debian 13) has the same up to zen, and generic at
// 32 (ARM, Power and RISC-V entries added before it). Each is confirmed
// against the library's own name for it.
int BlisArchId(const BlisApi& api, const std::string& name) {
  static constexpr std::pair<const char*, int> kIds[] = {
      {"skx", 0},    {"knl", 1},  {"haswell", 3}, {"sandybridge", 4},
      {"penryn", 5}, {"zen3", 6}, {"zen2", 7},    {"zen", 8}};
  int generic = -1;
  if (absl::StartsWith(api.version(), "0.9")) generic = 25;
  if (absl::StartsWith(api.version(), "1.1")) generic = 32;
  if (generic < 0) return -1;
  if (name == "generic") return name == api.arch_string(generic) ? generic : -1;
  for (const auto& [n, id] : kIds) {
    if (name == n && name == api.arch_string(id)) return id;
  }
  return -1;
}

// Whether bli_thread_set_num_threads sets the calling thread's count alone:
// a count set on another thread leaves this one's as it was.
bool BlisThreadCountIsPerThread(const BlisApi& api) {
  const int64_t here = api.get_threads();
  const int64_t other = here == 2 ? 3 : 2;
  std::thread([&api, other] { api.set_threads(other); }).join();
  return api.get_threads() != other;
}

BlisApi* LoadBlis() {
  auto* api = new BlisApi;
  auto opened = Open("blis", BlisPaths());
  if (!opened.ok()) {
    api->status = opened.status();
    return api;
  }
  api->status = BindBlis(opened->handle, opened->path, api);
  if (!api->status.ok()) return api;
  const std::string forced = TakeOption(&GemmBackendOptions::blis_arch, &blis_loaded);
  std::string why;
  std::string arch_env;
  if (const char* user = std::getenv("BLIS_ARCH_TYPE"); user != nullptr) {
    why = absl::StrCat("BLIS_ARCH_TYPE=", user, " from the environment");
  } else if (auto [name, reason] = ChooseBlisArch(forced); !name.empty()) {
    if (const int id = BlisArchId(*api, name); id >= 0) {
      arch_env = absl::StrCat(id);
      why = absl::StrCat("chosen from ", reason);
    } else {
      why = absl::StrCat("'", name, "' is not a sub-configuration of this BLIS; its own choice");
    }
  }
  {
    // BLIS reads BLIS_ARCH_TYPE once, when it initialises.
    ScopedEnv env("BLIS_ARCH_TYPE", arch_env);
    api->init();
    api->arch_query_id();
  }
  if (!BlisThreadCountIsPerThread(*api)) {
    api->shared_threads =
        std::make_unique<SharedThreadCount>([api](int n) { api->set_threads(n); });
  }
  api->details = absl::StrCat(
      "BLIS ", api->version(), " (", opened->path, "), sub-configuration ",
      api->arch_string(api->arch_query_id()), why.empty() ? "" : absl::StrCat(" (", why, ")"),
      api->shared_threads != nullptr ? ", one thread count per process" : "");
  return api;
}

BlisApi& Blis() {
  static BlisApi* api = LoadBlis();  // never freed: the library stays loaded
  return *api;
}

// ---- OpenBLAS ----

struct OpenblasApi {
  absl::Status status;
  std::string details;
  CblasSgemm sgemm = nullptr;
  CblasSgemv sgemv = nullptr;
  OpenblasSetThreads set_threads = nullptr;
  OpenblasGetThreads get_threads = nullptr;
  OpenblasString corename = nullptr;
  OpenblasString config = nullptr;
  // openblas_set_num_threads sets the process's count (in the OpenMP build,
  // the calling thread's OpenMP count too).
  SharedThreadCount shared_threads{[this](int n) { set_threads(n); }};

  // The count for a call of `n` threads from the calling thread.
  ThreadCountTurn ThreadsFor(int n) { return ThreadCountTurn(&shared_threads, n); }
};

absl::Status BindOpenblas(void* handle, const std::string& path, OpenblasApi* api) {
  Binder b(handle);
  b.Bind("cblas_sgemm", &api->sgemm);
  b.Bind("cblas_sgemv", &api->sgemv);
  b.Bind("openblas_set_num_threads", &api->set_threads);
  b.Bind("openblas_get_num_threads", &api->get_threads);
  b.Bind("openblas_get_corename", &api->corename);
  b.Bind("openblas_get_config", &api->config);
  return b.Check("openblas", path);
}

// OpenBLAS 0.3.21 (DYNAMIC_ARCH) takes an AMD Zen 5 for 'Haswell'.
std::pair<std::string, std::string> ChooseOpenblasCore(const std::string& forced) {
  if (!forced.empty()) return {forced, "--openblas-core (NUMASERVE_OPENBLAS_CORE)"};
  const affinity::CpuFeatures& f = affinity::GetCpuFeatures();
  if (HasAvx512(f)) return {"SkylakeX", "the CPU's AVX-512"};
  if (f.avx2 && f.fma) {
    return {f.vendor == "AuthenticAMD" ? "Zen" : "Haswell", "the CPU's AVX2 and FMA"};
  }
  return {"", ""};
}

OpenblasApi* LoadOpenblas() {
  auto* api = new OpenblasApi;
  const std::string forced = TakeOption(&GemmBackendOptions::openblas_core, &openblas_loaded);
  std::string why, core_env;
  if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user != nullptr) {
    why = absl::StrCat("OPENBLAS_CORETYPE=", user, " from the environment");
  } else if (auto [name, reason] = ChooseOpenblasCore(forced); !name.empty()) {
    core_env = name;
    why = absl::StrCat("chosen from ", reason);
  }
  absl::StatusOr<Opened> opened;
  {
    // OpenBLAS reads OPENBLAS_CORETYPE in its constructor, at dlopen.
    ScopedEnv env("OPENBLAS_CORETYPE", core_env);
    opened = Open("openblas", OpenblasPaths());
  }
  if (!opened.ok()) {
    api->status = opened.status();
    return api;
  }
  api->status = BindOpenblas(opened->handle, opened->path, api);
  if (!api->status.ok()) return api;
  std::string config = api->config();
  if (const size_t space = config.find(' ', config.find(' ') + 1); space != std::string::npos) {
    config.resize(space);  // "OpenBLAS 0.3.21"
  }
  api->details = absl::StrCat(config, " (", opened->path, "), core ", api->corename(),
                              why.empty() ? "" : absl::StrCat(" (", why, ")"));
  return api;
}

OpenblasApi& Openblas() {
  static OpenblasApi* api = LoadOpenblas();  // never freed: the library stays loaded
  return *api;
}

// ---- the kernel ----

std::atomic<GemmCallHook> call_hook{nullptr};

void CallHook(GemmBackend backend) {
  if (GemmCallHook hook = call_hook.load(std::memory_order_acquire)) hook(backend);
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Output elements above which the epilogue runs on all threads.
constexpr int64_t kParallelEpilogueElements = int64_t{1} << 15;

class BlasKernel final : public GemmKernel {
 public:
  BlasKernel(GemmBackend backend, GemmOptions options, std::unique_ptr<float, FreeDeleter> weights)
      : backend_(backend), options_(std::move(options)), weights_(std::move(weights)) {
    options_.weights = nullptr;  // only read at creation
  }
  GemmBackend backend() const override { return backend_; }
  const GemmOptions& options() const override { return options_; }
  int64_t weight_bytes() const override {
    return options_.k * options_.n * static_cast<int64_t>(sizeof(float));
  }
  absl::Status Run(int64_t m, const float* src, float* dst) override;
  std::string ImplementationName(int64_t m) const override;

 private:
  GemmBackend backend_;
  GemmOptions options_;
  std::unique_ptr<float, FreeDeleter> weights_;  // [K, N] row-major, scaled
};

std::string BlasKernel::ImplementationName(int64_t m) const {
  if (backend_ == GemmBackend::kBlis) {
    BlisApi& api = Blis();
    return absl::StrCat(m == 1 ? "blis sgemv, " : "blis sgemm, ",
                        api.arch_string(api.arch_query_id()));
  }
  return absl::StrCat(m == 1 ? "openblas sgemv, " : "openblas sgemm, ", Openblas().corename());
}

absl::Status BlasKernel::Run(int64_t m, const float* src, float* dst) {
  if (m <= 0 || m > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(GemmBackendName(backend_), " gemm: M = ", m));
  }
  const int64_t k = options_.k, n = options_.n;
  const float one = 1.0f;
  const float beta = options_.accumulate ? options_.sum_scale : 0.0f;
  const float* w = weights_.get();
  const int threads = omp_get_max_threads();
  if (m == 1 && beta == 0.0f) std::memset(dst, 0, n * sizeof(float));  // never read stale NaNs
  if (backend_ == GemmBackend::kBlis && m == 1) {
    // One row as y = W^T x: BLIS 0.9's sgemm packs for M=1 and runs 4-5x
    // slower than its (single-threaded) sgemv; [K,1] and [1,K] are the
    // same bytes.
    Blis().sgemv(kBlisTranspose, kBlisNoConjugate, k, n, &one, w, n, 1, src, 1, &beta, dst, 1);
  } else if (backend_ == GemmBackend::kBlis) {
    BlisApi& api = Blis();
    const ThreadCountTurn turn = api.ThreadsFor(threads);
    CallHook(backend_);
    // op(A) through strides: [M,K] rows, or [K,M] read column by column.
    const int64_t rsa = options_.src_transposed ? 1 : k;
    const int64_t csa = options_.src_transposed ? m : 1;
    api.sgemm(kBlisNoTranspose, kBlisNoTranspose, m, n, k, &one, src, rsa, csa, w, n, 1, &beta, dst,
              n, 1);
  } else {
    OpenblasApi& api = Openblas();
    const ThreadCountTurn turn = api.ThreadsFor(threads);
    CallHook(backend_);
    const int mi = static_cast<int>(m), ki = static_cast<int>(k), ni = static_cast<int>(n);
    if (m == 1) {
      // One row is a matrix-vector product; [K,1] and [1,K] are the same bytes.
      api.sgemv(kCblasRowMajor, kCblasTrans, ki, ni, 1.0f, w, ni, src, 1, beta, dst, 1);
    } else {
      api.sgemm(kCblasRowMajor, options_.src_transposed ? kCblasTrans : kCblasNoTrans,
                kCblasNoTrans, mi, ni, ki, 1.0f, src, options_.src_transposed ? mi : ki, w, ni,
                beta, dst, ni);
    }
  }
  ApplyEpilogue(options_, m, dst);
  return absl::OkStatus();
}

// W (scaled) into [K, N] row-major, transposing [N, K] in tiles.
void CopyWeights(const GemmOptions& o, float* out) {
  const int64_t k = o.k, n = o.n;
  const float s = o.weights_scale;
  if (!o.weights_transposed) {
    for (int64_t i = 0; i < k * n; ++i) out[i] = o.weights[i] * s;
    return;
  }
  constexpr int64_t kTile = 32;
  for (int64_t j0 = 0; j0 < n; j0 += kTile) {
    for (int64_t i0 = 0; i0 < k; i0 += kTile) {
      for (int64_t j = j0; j < std::min(n, j0 + kTile); ++j) {
        for (int64_t i = i0; i < std::min(k, i0 + kTile); ++i) {
          out[i * n + j] = o.weights[j * k + i] * s;
        }
      }
    }
  }
}

}  // namespace

void ApplyEpilogue(const GemmOptions& o, int64_t m, float* dst) {
  const bool bias = !o.bias.empty();
  if (!bias && !o.relu && !o.gelu_erf) return;
  const int64_t n = o.n;
  const float* b = bias ? o.bias.data() : nullptr;
  // The CPU's own vector kernel (a scalar std::erf took 16 ns per value on
  // a Zen 1 core: 10% of BERT-base's time, in its FFN GELUs).
  const auto rows = GetKernelTable().bias_activation_rows;
  using cpu::RowActivation;
#pragma omp parallel for schedule(static) if (m > 1 && m * n >= kParallelEpilogueElements)
  for (int64_t i = 0; i < m; ++i) {
    float* row = dst + i * n;
    if (o.relu && o.gelu_erf) {
      rows(row, b, 1, n, RowActivation::kRelu);
      rows(row, nullptr, 1, n, RowActivation::kGeluErf);
    } else {
      rows(row, b, 1, n,
           o.gelu_erf ? RowActivation::kGeluErf
           : o.relu   ? RowActivation::kRelu
                      : RowActivation::kNone);
    }
  }
}

absl::Status SetOptions(const GemmBackendOptions& new_options) {
  base::MutexLock lock(&options_mu);
  const bool blis_changes = new_options.blis_arch != options.blis_arch;
  const bool openblas_changes = new_options.openblas_core != options.openblas_core;
  if ((blis_changes && blis_loaded) || (openblas_changes && openblas_loaded)) {
    return absl::FailedPreconditionError(
        absl::StrCat(blis_changes && blis_loaded ? "BLIS" : "OpenBLAS",
                     " is loaded already: its configuration is set at the start of the process"));
  }
  options = new_options;
  return absl::OkStatus();
}

absl::Status Available(GemmBackend backend) {
  return backend == GemmBackend::kBlis ? Blis().status : Openblas().status;
}

std::string Details(GemmBackend backend) {
  if (absl::Status s = Available(backend); !s.ok()) return std::string(s.message());
  return backend == GemmBackend::kBlis ? Blis().details : Openblas().details;
}

absl::StatusOr<std::unique_ptr<GemmKernel>> CreateKernel(GemmBackend backend,
                                                         const GemmOptions& options) {
  if (absl::Status s = Available(backend); !s.ok()) return s;
  const char* name = GemmBackendName(backend);
  if (options.bf16 || options.int8.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has no ", options.bf16 ? "BF16" : "INT8", " GEMM: it runs on onednn"));
  }
  if (options.k <= 0 || options.n <= 0 || options.weights == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, " gemm: K, N and weights are required"));
  }
  if (options.k > INT_MAX || options.n > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " gemm: K=", options.k, " N=", options.n, " exceed the BLAS int"));
  }
  if (!options.bias.empty() && static_cast<int64_t>(options.bias.size()) != options.n) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " gemm: bias has ", options.bias.size(), " values, N is ", options.n));
  }
  constexpr size_t kAlign = 64;
  const size_t bytes = (options.k * options.n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  std::unique_ptr<float, FreeDeleter> weights(
      static_cast<float*>(std::aligned_alloc(kAlign, bytes)));
  if (weights == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, " gemm: cannot allocate ", bytes, " bytes of weights"));
  }
  CopyWeights(options, weights.get());
  return std::unique_ptr<GemmKernel>(new BlasKernel(backend, options, std::move(weights)));
}

int LibraryThreads(GemmBackend backend) {
  if (!Available(backend).ok()) return -1;
  if (backend == GemmBackend::kBlis) return static_cast<int>(Blis().get_threads());
  return Openblas().get_threads();
}

void SetCallHook(GemmCallHook hook) { call_hook.store(hook, std::memory_order_release); }

absl::Status CheckLibrary(GemmBackend backend, const std::string& path) {
  const bool blis = backend == GemmBackend::kBlis;
  auto opened = Open(GemmBackendName(backend), {path});
  if (!opened.ok()) return opened.status();
  absl::Status s;
  if (blis) {
    BlisApi api;
    s = BindBlis(opened->handle, path, &api);
  } else {
    OpenblasApi api;
    s = BindOpenblas(opened->handle, path, &api);
  }
  dlclose(opened->handle);
  return s;
}

}  // namespace numaserve::kernels::blas
