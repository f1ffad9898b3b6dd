#include "training/optimizer.h"

#include <algorithm>
#include <cmath>

namespace numaserve::training {

Optimizer::Optimizer(OptimizerOptions options, const std::vector<int64_t>& parameter_sizes)
    : options_(options) {
  const int slots = options_.kind == OptimizerOptions::Kind::kAdamW ? 2 : 1;
  for (int64_t size : parameter_sizes) {
    for (int s = 0; s < slots; ++s) state_.emplace_back(size, 0.0f);
  }
}

void Optimizer::Update(int index, int64_t step, float lr, kernels::Tensor* weights,
                       const kernels::Tensor& grad) {
  const int64_t n = weights->size();
  float* w = weights->data.data();
  const float* g = grad.data.data();
  const float wd = weights->rank() >= 2 ? options_.weight_decay : 0.0f;
  if (options_.kind == OptimizerOptions::Kind::kSgd) {
    float* v = state_[index].data();
    const float mu = options_.momentum;
    const bool nesterov = options_.nesterov;
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * w[i];
      v[i] = mu * v[i] + d;
      w[i] -= lr * (nesterov ? d + mu * v[i] : v[i]);
    }
    return;
  }
  float* m = state_[2 * index].data();
  float* v = state_[2 * index + 1].data();
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.epsilon;
  const float c1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float c2 = 1.0f - std::pow(b2, static_cast<float>(step));
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    const float m_hat = m[i] / c1, v_hat = v[i] / c2;
    w[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * w[i]);
  }
}

float LearningRate(const ScheduleOptions& o, int64_t step) {
  if (step < o.warmup_steps) {
    return o.peak_lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup_steps);
  }
  switch (o.decay) {
    case ScheduleOptions::Decay::kConstant:
      return o.peak_lr;
    case ScheduleOptions::Decay::kCosine: {
      const int64_t span = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
      const double t = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
      return o.min_lr +
             0.5f * (o.peak_lr - o.min_lr) * static_cast<float>(1.0 + std::cos(M_PI * t));
    }
    case ScheduleOptions::Decay::kStep: {
      if (o.step_every <= 0) return o.peak_lr;
      const int64_t k = (step - o.warmup_steps) / o.step_every;
      return o.peak_lr * std::pow(o.gamma, static_cast<float>(k));
    }
  }
  return o.peak_lr;
}

}  // namespace numaserve::training
