// A Chrome-trace timeline (chrome://tracing, Perfetto): spans of forward,
// backward, optimizer and each gradient bucket's all-reduce, per rank
// (pid = rank; tid 0 = compute, tid 1 = all-reduce in flight). Ranks send
// their spans to rank 0, which writes one JSON file.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace numaserve::training {

class Timeline {
 public:
  // Disabled timelines record nothing and cost one branch per span.
  explicit Timeline(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

  bool enabled() const { return enabled_; }
  // Microseconds since the timeline began.
  double Now() const;
  void Add(const std::string& name, int tid, double begin_us, double end_us);

  // Gathers every rank's spans on rank 0 and writes them to `path` there
  // (temporary file + rename). Collective: every rank of `comm` calls it.
  absl::Status Write(const std::string& path, MPI_Comm comm) const;

 private:
  struct Span {
    std::string name;
    int tid;
    double begin_us, end_us;
  };
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  std::vector<Span> spans_;
};

}  // namespace numaserve::training
