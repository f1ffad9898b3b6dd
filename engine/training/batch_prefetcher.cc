#include "engine/training/batch_prefetcher.h"

namespace numaserve::training {

BatchPrefetcher::BatchPrefetcher(const Dataset* data, BatchPrefetcherOptions options)
    : data_(data),
      options_(options),
      local_batch_(options.global_batch / options.ranks),
      steps_per_epoch_(std::max<int64_t>(1, data->size / options.global_batch)) {}

BatchPrefetcher::~BatchPrefetcher() {
  if (next_.valid()) next_.wait();
}

std::future<BatchPrefetcher::Batch> BatchPrefetcher::Start(int64_t step) {
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != order_epoch_) {
    order_ =
        std::make_shared<const std::vector<int64_t>>(EpochOrder(data_->size, options_.seed, epoch));
    order_epoch_ = epoch;
  }
  const int64_t offset =
      (step % steps_per_epoch_) * options_.global_batch + options_.rank * local_batch_;
  return std::async(std::launch::async, [this, step, offset, order = order_] {
    Batch b;
    b.step = step;
    GatherBatch(*data_, order->data() + offset, local_batch_, &b.images, &b.labels);
    return b;
  });
}

void BatchPrefetcher::Get(int64_t step, kernels::Tensor* batch, std::vector<uint8_t>* labels) {
  Batch b;
  if (next_.valid()) b = next_.get();
  if (b.step != step) b = Start(step).get();  // first call, or a jump
  next_ = Start(step + 1);
  *batch = std::move(b.images);
  *labels = std::move(b.labels);
}

}  // namespace numaserve::training
