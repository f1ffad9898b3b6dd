// Triton-style cumulative statistics per model version (the ModelStatistics
// RPC): request successes and failures with their durations, queue and
// compute phases, and per batch size the compute phases of each execution.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "grpc_service.pb.h"

namespace numaserve::serving {

class ModelStatistics {
 public:
  // A version that starts serving: listed (with zeros) from now on.
  void Register(const std::string& model, int64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  // One request answered successfully.
  void RecordSuccess(const std::string& model, int64_t version, int64_t rows, double total_s,
                     double queue_s, double input_s, double infer_s, double output_s)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One request of a resolved model version that failed.
  void RecordFailure(const std::string& model, int64_t version, double total_s)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One batch of `rows` rows computed.
  void RecordExecution(const std::string& model, int64_t version, int64_t rows, double input_s,
                       double infer_s, double output_s) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends the statistics of `model` (every model if empty) and `version`
  // (every version if 0), in name and version order.
  void Fill(const std::string& model, int64_t version,
            inference::ModelStatisticsResponse* response) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Duration {
    uint64_t count = 0;
    uint64_t ns = 0;
    void Add(double seconds);
  };
  struct BatchStats {
    Duration input, infer, output;
  };
  struct Stats {
    uint64_t last_inference_ms = 0;
    uint64_t inference_count = 0;
    uint64_t execution_count = 0;
    Duration success, fail, queue, input, infer, output;
    std::map<int64_t, BatchStats> batches;
  };

  mutable base::Mutex mu_;
  std::map<std::pair<std::string, int64_t>, Stats> stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace numaserve::serving
