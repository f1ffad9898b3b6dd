// A labelled image dataset and the order training reads it in: a
// permutation per epoch derived from (seed, epoch) alone, so a resumed run
// and every rank see the same order, and each rank takes its slice of every
// global batch (its shard). Examples come from an ExampleSource: a Dataset
// in memory (IDX files), or a packed record file read on demand
// (record_file.h), where a rank reads only the examples of its shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace numaserve::training {

struct Dataset {
  int64_t size = 0;                   // examples
  std::vector<int64_t> example_dims;  // e.g. {28, 28}
  std::vector<uint8_t> images;        // size x product(example_dims)
  std::vector<uint8_t> labels;        // size
  int64_t example_elements() const;
};

// Reads an IDX image file and its label file; keeps the first `limit`
// examples when limit > 0. Errors name the file: counts that differ,
// labels out of [0, 255] are impossible, so only count/rank mismatches.
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path, int64_t limit);

// The order of epoch `epoch`: a Fisher-Yates permutation of [0, n) from a
// SplitMix64 stream seeded by (seed, epoch). Same on every platform.
std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch);

// Gathers examples `indices` into a float batch [count, 1, ...dims] scaled
// to [0, 1] (the model input layout: channels first) and their labels.
void GatherBatch(const Dataset& data, const int64_t* indices, int64_t count, kernels::Tensor* batch,
                 std::vector<uint8_t>* labels);

// Where a rank's batches come from. Gather is called by one thread at a
// time (the prefetcher's), not necessarily the same one.
class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  virtual int64_t size() const = 0;
  virtual const std::vector<int64_t>& example_dims() const = 0;
  // As GatherBatch; errors (a read that fails) name the file and offset.
  virtual absl::Status Gather(const int64_t* indices, int64_t count, kernels::Tensor* batch,
                              std::vector<uint8_t>* labels) = 0;
};

// A Dataset already in memory (it must outlive the source).
class InMemorySource final : public ExampleSource {
 public:
  explicit InMemorySource(const Dataset* data) : data_(data) {}
  int64_t size() const override { return data_->size; }
  const std::vector<int64_t>& example_dims() const override { return data_->example_dims; }
  absl::Status Gather(const int64_t* indices, int64_t count, kernels::Tensor* batch,
                      std::vector<uint8_t>* labels) override;

 private:
  const Dataset* data_;
};

}  // namespace numaserve::training
