// Data-parallel gradient exchange: parameters are grouped, in the order
// backward finishes them, into buckets of about `fusion_threshold_bytes`
// (Horovod's fusion buffer). As soon as a bucket's last gradient is final
// its sum over all ranks starts with a non-blocking MPI_Iallreduce, so the
// exchange overlaps the rest of backward. With one rank nothing is sent.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "training/timeline.h"
#include "training/training_net.h"

namespace numaserve::training {

class GradientAllReduce {
 public:
  // `parameters` in TrainingNet order; backward finishes them roughly in
  // reverse, so buckets are filled from the last parameter to the first.
  GradientAllReduce(MPI_Comm comm, std::vector<Parameter>* parameters,
                    int64_t fusion_threshold_bytes);
  ~GradientAllReduce();

  // Parameter `index`'s gradient is final (TrainingNet::Backward's callback).
  void OnGradientReady(int index);
  // Waits for every bucket and copies the sums back into the gradients.
  void Finish();

  // Records each bucket's all-reduce (from start to observed completion).
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<int> parameters;   // indices into *parameters_
    std::vector<int64_t> offsets;  // of each parameter in `buffer`
    std::vector<float> buffer;
    int pending = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    double started_us = 0;
  };
  void Completed(const Bucket& bucket);
  MPI_Comm comm_;
  int size_ = 1;
  std::vector<Parameter>* parameters_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per parameter
  std::vector<int> slot_of_;
  Timeline* timeline_ = nullptr;  // position within its bucket
};

}  // namespace numaserve::training
