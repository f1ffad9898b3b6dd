// Prefetching reader: while step s computes, a background thread gathers
// (decodes and scales) this rank's slice of step s+1's global batch. The
// order of every epoch comes from EpochOrder(seed, epoch), so the batches
// are the same with or without prefetching, on any number of ranks and
// after a resume.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "engine/training/dataset.h"

namespace numaserve::training {

struct BatchPrefetcherOptions {
  uint64_t seed = 0;
  int64_t global_batch = 1;
  int rank = 0;
  int ranks = 1;
};

class BatchPrefetcher {
 public:
  // `data` must outlive the prefetcher.
  BatchPrefetcher(const Dataset* data, BatchPrefetcherOptions options);
  ~BatchPrefetcher();

  // This rank's examples of global step `step` (0-based; steps wrap into
  // epochs of size / global_batch). Blocks until they are ready, then
  // starts on step + 1.
  void Get(int64_t step, kernels::Tensor* batch, std::vector<uint8_t>* labels);

 private:
  struct Batch {
    int64_t step = -1;
    kernels::Tensor images;
    std::vector<uint8_t> labels;
  };
  std::future<Batch> Start(int64_t step);

  const Dataset* data_;
  BatchPrefetcherOptions options_;
  int64_t local_batch_;
  int64_t steps_per_epoch_;
  std::shared_ptr<const std::vector<int64_t>> order_;  // of order_epoch_
  int64_t order_epoch_ = -1;
  std::future<Batch> next_;
};

}  // namespace numaserve::training
