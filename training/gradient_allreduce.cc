#include "training/gradient_allreduce.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace numaserve::training {

GradientAllReduce::GradientAllReduce(MPI_Comm comm, std::vector<Parameter>* parameters,
                                     int64_t fusion_threshold_bytes)
    : comm_(comm), parameters_(parameters) {
  MPI_Comm_size(comm_, &size_);
  const int n = static_cast<int>(parameters_->size());
  bucket_of_.assign(n, -1);
  slot_of_.assign(n, -1);
  int64_t bytes = 0;
  for (int p = n - 1; p >= 0; --p) {
    if (buckets_.empty() || bytes >= fusion_threshold_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    bucket_of_[p] = static_cast<int>(buckets_.size()) - 1;
    slot_of_[p] = static_cast<int>(b.parameters.size());
    b.parameters.push_back(p);
    const int64_t offset = b.buffer.size();
    b.offsets.push_back(offset);
    b.buffer.resize(offset + (*parameters_)[p].data->size());
    bytes += (*parameters_)[p].data->size() * static_cast<int64_t>(sizeof(float));
  }
}

GradientAllReduce::~GradientAllReduce() {
  for (Bucket& b : buckets_) {
    if (b.request != MPI_REQUEST_NULL) MPI_Wait(&b.request, MPI_STATUS_IGNORE);
  }
}

void GradientAllReduce::OnGradientReady(int index) {
  if (size_ == 1) return;
  Bucket& b = buckets_[bucket_of_[index]];
  if (b.pending == 0) b.pending = static_cast<int>(b.parameters.size());
  const Tensor& g = *(*parameters_)[index].grad;
  memcpy(b.buffer.data() + b.offsets[slot_of_[index]], g.data.data(),
         g.data.size() * sizeof(float));
  if (--b.pending == 0) {
    MPI_Iallreduce(MPI_IN_PLACE, b.buffer.data(), static_cast<int>(b.buffer.size()), MPI_FLOAT,
                   MPI_SUM, comm_, &b.request);
    if (timeline_ != nullptr) b.started_us = timeline_->Now();
  }
  // Give the MPI library a chance to progress earlier buckets.
  for (Bucket& other : buckets_) {
    if (other.request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&other.request, &done, MPI_STATUS_IGNORE);
      if (done) Completed(other);
    }
  }
}

void GradientAllReduce::Completed(const Bucket& b) {
  if (timeline_ == nullptr) return;
  timeline_->Add(absl::StrCat("all-reduce ", b.buffer.size() * sizeof(float) / 1024, " KiB"), 1,
                 b.started_us, timeline_->Now());
}

void GradientAllReduce::Finish() {
  if (size_ == 1) return;
  for (Bucket& b : buckets_) {
    if (b.request != MPI_REQUEST_NULL) {
      MPI_Wait(&b.request, MPI_STATUS_IGNORE);
      Completed(b);
    }
    for (size_t i = 0; i < b.parameters.size(); ++i) {
      Tensor& g = *(*parameters_)[b.parameters[i]].grad;
      memcpy(g.data.data(), b.buffer.data() + b.offsets[i], g.data.size() * sizeof(float));
    }
    b.pending = 0;
  }
}

}  // namespace numaserve::training
