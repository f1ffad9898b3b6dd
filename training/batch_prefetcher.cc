#include "training/batch_prefetcher.h"

namespace numaserve::training {

BatchPrefetcher::BatchPrefetcher(ExampleSource* source, BatchPrefetcherOptions options)
    : source_(source),
      options_(options),
      local_batch_(options.global_batch / options.ranks),
      steps_per_epoch_(std::max<int64_t>(1, source->size() / options.global_batch)) {}

BatchPrefetcher::BatchPrefetcher(const Dataset* data, BatchPrefetcherOptions options)
    : BatchPrefetcher(new InMemorySource(data), options) {
  owned_.reset(static_cast<InMemorySource*>(source_));
}

BatchPrefetcher::~BatchPrefetcher() {
  if (next_.valid()) next_.wait();
}

const int64_t* BatchPrefetcher::Slice(int64_t step) {
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != order_epoch_) {
    order_ = std::make_shared<const std::vector<int64_t>>(
        EpochOrder(source_->size(), options_.seed, epoch));
    order_epoch_ = epoch;
  }
  return order_->data() + (step % steps_per_epoch_) * options_.global_batch +
         options_.rank * local_batch_;
}

std::vector<int64_t> BatchPrefetcher::Indices(int64_t step) {
  const int64_t* first = Slice(step);
  return std::vector<int64_t>(first, first + local_batch_);
}

std::future<BatchPrefetcher::Batch> BatchPrefetcher::Start(int64_t step) {
  const int64_t* first = Slice(step);
  return std::async(std::launch::async, [this, step, first, order = order_] {
    Batch b;
    b.step = step;
    b.status = source_->Gather(first, local_batch_, &b.images, &b.labels);
    return b;
  });
}

absl::Status BatchPrefetcher::Get(int64_t step, kernels::Tensor* batch,
                                  std::vector<uint8_t>* labels) {
  Batch b;
  if (next_.valid()) b = next_.get();
  if (b.step != step) b = Start(step).get();  // first call, or a jump
  if (!b.status.ok()) return b.status;
  if (options_.total_steps <= 0 || step + 1 < options_.total_steps) next_ = Start(step + 1);
  *batch = std::move(b.images);
  *labels = std::move(b.labels);
  return absl::OkStatus();
}

}  // namespace numaserve::training
