// Prefetching reader: while step s computes, a background thread gathers
// (reads, decodes and scales) this rank's slice of step s+1's global batch.
// The order of every epoch comes from EpochOrder(seed, epoch), so the
// batches are the same with or without prefetching, on any number of ranks
// and after a resume. With a RecordFileReader as the source, a rank reads
// from disk only the records of its own slices, one step ahead.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "training/dataset.h"

namespace numaserve::training {

struct BatchPrefetcherOptions {
  uint64_t seed = 0;
  int64_t global_batch = 1;
  int rank = 0;
  int ranks = 1;
  // Steps in the run: nothing is prefetched past the last (0 = no end).
  int64_t total_steps = 0;
};

class BatchPrefetcher {
 public:
  // `source` must outlive the prefetcher.
  BatchPrefetcher(ExampleSource* source, BatchPrefetcherOptions options);
  // A Dataset in memory (it must outlive the prefetcher).
  BatchPrefetcher(const Dataset* data, BatchPrefetcherOptions options);
  ~BatchPrefetcher();

  // This rank's examples of global step `step` (0-based; steps wrap into
  // epochs of size / global_batch). Blocks until they are ready, then
  // starts on step + 1. Errors are the source's (a record file that cannot
  // be read, with its name and offset).
  absl::Status Get(int64_t step, kernels::Tensor* batch, std::vector<uint8_t>* labels);

  // The example indices of this rank's slice of `step`, in batch order.
  std::vector<int64_t> Indices(int64_t step);

 private:
  struct Batch {
    int64_t step = -1;
    absl::Status status;
    kernels::Tensor images;
    std::vector<uint8_t> labels;
  };
  std::future<Batch> Start(int64_t step);
  const int64_t* Slice(int64_t step);  // updates order_ for step's epoch

  std::unique_ptr<InMemorySource> owned_;
  ExampleSource* source_;
  BatchPrefetcherOptions options_;
  int64_t local_batch_;
  int64_t steps_per_epoch_;
  std::shared_ptr<const std::vector<int64_t>> order_;  // of order_epoch_
  int64_t order_epoch_ = -1;
  std::future<Batch> next_;
};

}  // namespace numaserve::training
