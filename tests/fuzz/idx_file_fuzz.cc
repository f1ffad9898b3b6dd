// IDX files (MNIST family), plain or gzipped: ReadIdxFile on arbitrary
// bytes, with the default size limit and with a small one; an accepted file
// holds exactly product(dims) bytes. Images that parse are then loaded as a
// dataset (LoadIdxDataset) with a matching label file and gathered into a
// batch.
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"
#include "training/dataset.h"
#include "training/idx_file.h"

namespace numaserve::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  const std::string path = MemoryFile(0, AsText(data, size));
  absl::StatusOr<training::IdxArray> images;
  for (uint64_t limit : {training::kDefaultMaxIdxBytes, uint64_t{64}}) {
    absl::StatusOr<training::IdxArray> array = training::ReadIdxFile(path, limit);
    if (!array.ok()) continue;
    uint64_t count = 1;
    for (int64_t d : array->dims) {
      FUZZ_CHECK(d >= 0);
      count *= static_cast<uint64_t>(d);
    }
    FUZZ_CHECK(array->data.size() == count);
    FUZZ_CHECK(count <= limit);
    if (limit == training::kDefaultMaxIdxBytes) images = std::move(array);
  }
  if (!images.ok() || images->dims.size() < 2 || images->dims[0] > (1 << 16)) return 0;

  // A label file of as many labels as there are images.
  const int64_t n = images->dims[0];
  std::string labels = {0, 0, 0x08, 1};
  for (int shift = 24; shift >= 0; shift -= 8) labels.push_back(static_cast<char>(n >> shift));
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<char>(i % 10));
  const std::string labels_path = MemoryFile(1, labels);
  for (int64_t limit : {int64_t{0}, int64_t{1}}) {
    absl::StatusOr<training::Dataset> dataset = training::LoadIdxDataset(path, labels_path, limit);
    FUZZ_CHECK(dataset.ok());
    FUZZ_CHECK(dataset->size == (limit > 0 && limit < n ? limit : n));
    FUZZ_CHECK(dataset->images.size() ==
               static_cast<size_t>(dataset->size * dataset->example_elements()));
    FUZZ_CHECK(dataset->labels.size() == static_cast<size_t>(dataset->size));
    if (dataset->size == 0) continue;
    const std::vector<int64_t> indices = {0, dataset->size - 1, dataset->size / 2, 0};
    kernels::Tensor batch;
    std::vector<uint8_t> batch_labels;
    training::GatherBatch(*dataset, indices.data(), static_cast<int64_t>(indices.size()), &batch,
                          &batch_labels);
    FUZZ_CHECK(batch_labels.size() == indices.size());
    FUZZ_CHECK(batch.data.size() == indices.size() * dataset->example_elements());
  }
  return 0;
}

}  // namespace numaserve::fuzz
