#include "kernels/gemm/gemm_autotune.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/atomic_file.h"
#include "base/log.h"
#include "base/mutex.h"

namespace numaserve::kernels {
namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the calling thread, in seconds.
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Times one run of each kernel on m rows per round, round after round, and
// keeps each kernel's fastest run: load from other processes then falls on
// every backend alike instead of on whichever was being timed. A kernel
// that fails gets its status in `failed` and is left out of later rounds.
void TimeKernels(const std::vector<GemmKernel*>& kernels, int64_t m, const GemmTuneOptions& tune,
                 std::vector<double>* best, std::vector<absl::Status>* failed) {
  const int64_t k = kernels.front()->k(), n = kernels.front()->n();
  std::vector<float> src(m * k), dst(m * n, 0.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.01f * static_cast<float>(i % 7);
  best->assign(kernels.size(), 1e30);
  auto run = [&](size_t i) {
    if (!(*failed)[i].ok()) return 0.0;
    const auto t0 = Clock::now();
    if (absl::Status s = kernels[i]->Run(m, src.data(), dst.data()); !s.ok()) (*failed)[i] = s;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (size_t i = 0; i < kernels.size(); ++i) {
    if ((*failed)[i].ok()) (*failed)[i] = kernels[i]->Prepare(m);
    run(i);  // warm-up: primitive creation, packing buffers, first touch
  }
  double spent = 0;
  for (int round = 0; round < tune.max_runs && (round < tune.min_runs || spent < tune.min_seconds);
       ++round) {
    for (size_t i = 0; i < kernels.size(); ++i) {
      const double t = run(i);
      (*best)[i] = std::min((*best)[i], t);
      spent += t;
    }
  }
}

std::string KeyText(const GemmChoiceCache::Key& key) {
  return absl::StrJoin(
      {key.model, absl::StrCat(key.k), absl::StrCat(key.n),
       std::string(key.src_transposed ? "1" : "0"), absl::StrCat(key.threads), key.cpu},
      "\t");
}

constexpr char kFileHeader[] = "# numaserve gemm choices v1";

// Reads the cache file into key text -> backend name. A missing file is
// empty; one that does not parse is reported and treated as empty.
std::map<std::string, std::string> ReadCacheFile(const std::string& file) {
  std::map<std::string, std::string> entries;
  std::ifstream in(file);
  if (!in) return entries;
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line_number == 1 && line == kFileHeader) continue;
    const std::vector<std::string> fields = absl::StrSplit(line, '\t');
    int64_t number = 0;
    const bool ok =
        line_number > 1 && fields.size() == 7 && absl::SimpleAtoi(fields[1], &number) &&
        absl::SimpleAtoi(fields[2], &number) && (fields[3] == "0" || fields[3] == "1") &&
        absl::SimpleAtoi(fields[4], &number) && GemmBackendFromName(fields[6]).has_value();
    if (!ok) {
      base::Log(base::LogLevel::kWarning, "gemm",
                absl::StrFormat("gemm choice cache %s is corrupt at line %d; ignoring it", file,
                                line_number),
                {{"path", file}, {"line", line_number}});
      return {};
    }
    entries[absl::StrJoin(fields.begin(), fields.begin() + 6, "\t")] = fields[6];
  }
  return entries;
}

bool Storable(const std::string& text) { return text.find_first_of("\t\n\r") == std::string::npos; }

}  // namespace

double GemmTiming::total() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

std::string GemmChoice::Summary() const {
  if (!cached_from.empty()) {
    return absl::StrCat(GemmBackendName(backend), " (cached in ", cached_from, ")");
  }
  std::vector<std::string> parts;
  for (const GemmTiming& t : timings) {
    if (!t.status.ok()) {
      parts.push_back(absl::StrCat(GemmBackendName(t.backend), " n/a"));
      continue;
    }
    std::vector<std::string> us;
    for (double s : t.seconds) us.push_back(absl::StrCat(std::llround(s * 1e6)));
    parts.push_back(absl::StrCat(GemmBackendName(t.backend), " ", absl::StrJoin(us, "+"), "us"));
  }
  return absl::StrCat(absl::StrJoin(parts, ", "), " (M=", absl::StrJoin(rows, "+"), ") -> ",
                      GemmBackendName(backend));
}

absl::StatusOr<std::unique_ptr<GemmKernel>> CreateFastestGemmKernel(const GemmOptions& options,
                                                                    const dnnl::engine& engine,
                                                                    const GemmTuneOptions& tune,
                                                                    GemmChoice* choice) {
  *choice = GemmChoice{};
  choice->rows = tune.rows;
  std::vector<std::unique_ptr<GemmKernel>> kernels;  // by timing, null if not created
  for (GemmBackend backend : kAllGemmBackends) {
    GemmTiming timing;
    timing.backend = backend;
    timing.status = GemmBackendAvailable(backend);
    std::unique_ptr<GemmKernel> kernel;
    if (timing.status.ok()) {
      auto created = CreateGemmKernel(backend, options, engine);
      if (created.ok()) {
        kernel = *std::move(created);
      } else {
        timing.status = created.status();
      }
    }
    choice->timings.push_back(std::move(timing));
    kernels.push_back(std::move(kernel));
  }
  const double cpu0 = ThreadCpuSeconds();
  const auto start = Clock::now();
  std::vector<GemmKernel*> timed;
  std::vector<size_t> index;  // into choice->timings
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (kernels[i] != nullptr) {
      timed.push_back(kernels[i].get());
      index.push_back(i);
    }
  }
  for (int64_t m : tune.rows) {
    if (timed.empty()) break;
    std::vector<double> best;
    std::vector<absl::Status> failed(timed.size());
    for (size_t j = 0; j < timed.size(); ++j) failed[j] = choice->timings[index[j]].status;
    TimeKernels(timed, m, tune, &best, &failed);
    for (size_t j = 0; j < timed.size(); ++j) {
      GemmTiming& t = choice->timings[index[j]];
      t.status = failed[j];
      if (t.status.ok()) t.seconds.push_back(best[j]);
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  if (wall > 0) choice->contention = std::max(0.0, 1.0 - (ThreadCpuSeconds() - cpu0) / wall);
  std::unique_ptr<GemmKernel> fastest;
  double fastest_total = 0;
  absl::Status first_error;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const GemmTiming& t = choice->timings[i];
    if (t.status.ok() && (fastest == nullptr || t.total() < fastest_total)) {
      fastest = std::move(kernels[i]);
      fastest_total = t.total();
      choice->backend = t.backend;
    }
    if (!t.status.ok() && first_error.ok() &&
        t.status.code() != absl::StatusCode::kFailedPrecondition) {
      first_error = t.status;
    }
  }
  if (fastest == nullptr) {
    return first_error.ok() ? choice->timings.front().status : first_error;
  }
  return fastest;
}

GemmChoiceCache& GemmChoiceCache::Global() {
  static GemmChoiceCache* cache = new GemmChoiceCache;
  return *cache;
}

std::optional<GemmBackend> GemmChoiceCache::Find(const Key& key, const std::string& file,
                                                 std::string* where) {
  const std::string text = KeyText(key);
  base::MutexLock lock(&mu_);
  if (auto it = in_process_.find(text); it != in_process_.end()) {
    *where = "this process";
    return it->second;
  }
  if (file.empty()) return std::nullopt;
  const auto entries = ReadCacheFile(file);
  auto it = entries.find(text);
  if (it == entries.end()) return std::nullopt;
  const std::optional<GemmBackend> backend = GemmBackendFromName(it->second);
  if (backend.has_value()) {
    in_process_[text] = *backend;
    *where = file;
  }
  return backend;
}

void GemmChoiceCache::Store(const Key& key, GemmBackend backend, const std::string& file) {
  const std::string text = KeyText(key);
  base::MutexLock lock(&mu_);
  in_process_[text] = backend;
  if (file.empty() || !Storable(key.model) || !Storable(key.cpu)) return;
  // Merge with what other processes wrote since, less the entries of model
  // files that are gone (temporary models must not grow the file forever),
  // then replace atomically.
  auto entries = ReadCacheFile(file);
  std::error_code ec;
  for (auto it = entries.begin(); it != entries.end();) {
    const std::string model = it->first.substr(0, it->first.find('\t'));
    it = std::filesystem::exists(model, ec) ? std::next(it) : entries.erase(it);
  }
  entries[text] = GemmBackendName(backend);
  const std::filesystem::path path(file);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::string contents = absl::StrCat(kFileHeader, "\n");
  for (const auto& [k, v] : entries) absl::StrAppend(&contents, k, "\t", v, "\n");
  // Through a fresh temporary file under a random name (O_EXCL), never one
  // through a link planted at a name another user could predict.
  if (absl::Status s = base::WriteFileAtomically(file, contents); !s.ok()) {
    base::Log(base::LogLevel::kWarning, "gemm",
              absl::StrCat("cannot replace the gemm choice cache ", file, ": ", s.message()),
              {{"path", file}, {"error", s.message()}});
  }
}

}  // namespace numaserve::kernels
