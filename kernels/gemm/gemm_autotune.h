// The "auto" GEMM backend: each available backend is timed once on a GEMM's
// real weights and epilogue, and the fastest kernel is kept. Choices are
// remembered per (model, shape, threads, CPU): always in process, and in a
// small text file across processes when one is given.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "kernels/gemm/gemm_backend.h"

namespace numaserve::kernels {

struct GemmTuneOptions {
  // Row counts (M) timed; a backend's score is the sum of its fastest times
  // over them. M=1 is the latency case (a matrix-vector product, bound by
  // reading the weights); M=32 a typical dynamic batch, where packing and
  // the micro-kernel dominate. The two favour different libraries, and both
  // are what a serving worker runs.
  std::vector<int64_t> rows = {1, 32};
  // Per M, each backend runs once to warm up, then the backends take turns,
  // one run each per round, until min_runs rounds and min_seconds (all
  // backends together) have passed, at most max_runs rounds. Each backend's
  // fastest run counts: the one least disturbed by other load, which taking
  // turns spreads over all backends alike.
  int min_runs = 5;
  int max_runs = 100;
  double min_seconds = 0.02;
};

struct GemmTiming {
  GemmBackend backend = GemmBackend::kOnednn;
  absl::Status status;          // OK, or why the backend was not timed
  std::vector<double> seconds;  // fastest run per GemmTuneOptions::rows
  double total() const;
};

struct GemmChoice {
  GemmBackend backend = GemmBackend::kOnednn;
  std::vector<int64_t> rows;
  std::vector<GemmTiming> timings;  // empty when the choice came from a cache
  std::string cached_from;          // "", "this process" or the cache file
  // The share of the timing's wall time the calling thread (the GEMMs'
  // first OpenMP thread, busy throughout) was off its cpu: waiting while
  // another thread held it, or for OpenMP workers that were. Near 0 on
  // cores left to the process, about 0.5 where a busy thread shares its
  // cpu. Negative for a choice from a cache.
  double contention = -1;
  // "onednn 16+105us, blis 25+90us, openblas 30+120us (M=1+32) -> blis",
  // or "blis (cached in FILE)".
  std::string Summary() const;
};

// Creates the kernel on every available backend, times each, and returns
// the fastest; `choice` receives the timings. Fails only if no backend can
// create the kernel (the first error).
absl::StatusOr<std::unique_ptr<GemmKernel>> CreateFastestGemmKernel(const GemmOptions& options,
                                                                    const dnnl::engine& engine,
                                                                    const GemmTuneOptions& tune,
                                                                    GemmChoice* choice);

// Remembered "auto" choices. The file (optional) is plain text, one choice
// a line, tab-separated: model, K, N, transA, threads, CPU, backend. It is
// replaced atomically (written to a fresh temporary file beside it under a
// random name, base/atomic_file.h, then renamed), dropping the entries of
// model files that no longer exist; a file that does not parse is ignored
// with a warning and rewritten on the next Store.
class GemmChoiceCache {
 public:
  struct Key {
    std::string model;  // the model file's path
    int64_t k = 0, n = 0;
    bool src_transposed = false;
    int threads = 0;
    std::string cpu;  // brand string and ISA (IsaDescription): a file may be shared
                      // between machines, and a capped process runs other kernels
  };

  static GemmChoiceCache& Global();

  // The remembered backend, looked up in process first, then in `file`
  // ("" for none); `where` says which.
  std::optional<GemmBackend> Find(const Key& key, const std::string& file, std::string* where)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Remembers in process, and in `file` unless it is "". A file that cannot
  // be written is a warning in the log, not an error.
  void Store(const Key& key, GemmBackend backend, const std::string& file) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  base::Mutex mu_;
  std::map<std::string, GemmBackend> in_process_ ABSL_GUARDED_BY(mu_);
};

}  // namespace numaserve::kernels
