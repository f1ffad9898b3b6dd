#include "training/dataset.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "training/idx_file.h"

namespace numaserve::training {

int64_t Dataset::example_elements() const { return kernels::NumElements(example_dims); }

absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path, int64_t limit) {
  absl::StatusOr<IdxArray> images = ReadIdxFile(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxArray> labels = ReadIdxFile(labels_path);
  if (!labels.ok()) return labels.status();
  if (images->dims.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        images_path, ": images need rank >= 2 (count, dims...), got rank ", images->dims.size()));
  }
  if (labels->dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels_path, ": labels need rank 1, got rank ", labels->dims.size()));
  }
  if (labels->dims[0] != images->dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": ", labels->dims[0],
                                                   " labels for ", images->dims[0], " images in ",
                                                   images_path));
  }
  Dataset data;
  data.size = images->dims[0];
  data.example_dims.assign(images->dims.begin() + 1, images->dims.end());
  if (limit > 0 && limit < data.size) data.size = limit;
  const int64_t per = data.example_elements();
  images->data.resize(data.size * per);
  labels->data.resize(data.size);
  data.images = std::move(images->data);
  data.labels = std::move(labels->data);
  return data;
}

namespace {
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed ^ (0xa0761d6478bd642fULL * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

void GatherBatch(const Dataset& data, const int64_t* indices, int64_t count, kernels::Tensor* batch,
                 std::vector<uint8_t>* labels) {
  const int64_t per = data.example_elements();
  batch->shape = {count, 1};
  batch->shape.insert(batch->shape.end(), data.example_dims.begin(), data.example_dims.end());
  batch->data.resize(count * per);
  labels->resize(count);
  constexpr float kScale = 1.0f / 255.0f;
  for (int64_t r = 0; r < count; ++r) {
    // Pointer arithmetic, not &v[i]: examples of 0 elements leave both empty.
    const uint8_t* src = data.images.data() + indices[r] * per;
    float* dst = batch->data.data() + r * per;
    for (int64_t i = 0; i < per; ++i) dst[i] = src[i] * kScale;
    (*labels)[r] = data.labels[indices[r]];
  }
}

absl::Status InMemorySource::Gather(const int64_t* indices, int64_t count, kernels::Tensor* batch,
                                    std::vector<uint8_t>* labels) {
  GatherBatch(*data_, indices, count, batch, labels);
  return absl::OkStatus();
}

}  // namespace numaserve::training
