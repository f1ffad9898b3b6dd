// Optimizers and learning-rate schedules. State is per parameter, in the
// order of TrainingNet::parameters(), and is saved in checkpoints.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace numaserve::training {

struct OptimizerOptions {
  enum class Kind { kSgd, kAdamW };
  Kind kind = Kind::kSgd;
  // SGD: heavy-ball momentum (0 = none); Nesterov's look-ahead variant.
  float momentum = 0.9f;
  bool nesterov = false;
  // AdamW moments and epsilon.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  // SGD: L2 added to the gradient; AdamW: decoupled decay (w -= lr*wd*w).
  // Applied to tensors of rank >= 2 only (weights, not biases).
  float weight_decay = 0.0f;
};

class Optimizer {
 public:
  Optimizer(OptimizerOptions options, const std::vector<int64_t>& parameter_sizes);

  // One update of parameter `index` with learning rate `lr`; `step` counts
  // from 1 (AdamW's bias correction).
  void Update(int index, int64_t step, float lr, kernels::Tensor* weights,
              const kernels::Tensor& grad);

  // Flat state for checkpoints: every slot of every parameter.
  std::vector<std::vector<float>>& state() { return state_; }

 private:
  OptimizerOptions options_;
  // SGD: one velocity per parameter; AdamW: m then v (2 per parameter).
  std::vector<std::vector<float>> state_;
};

struct ScheduleOptions {
  enum class Decay { kConstant, kCosine, kStep };
  float peak_lr = 0.1f;
  Decay decay = Decay::kCosine;
  int64_t warmup_steps = 0;  // linear from peak/warmup to the peak
  int64_t total_steps = 1;   // cosine reaches min_lr here
  float min_lr = 0.0f;
  int64_t step_every = 0;  // step decay: multiply by gamma every this many steps
  float gamma = 0.1f;
};

// Learning rate at `step` (0-based).
float LearningRate(const ScheduleOptions& options, int64_t step);

}  // namespace numaserve::training
