#include "training/batch_norm_op.h"

#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/onednn/training_onednn.h"
#include "training/conv_pool_ops.h"
#include "training/training_ops.h"

namespace numaserve::training::batch_norm {
namespace {

using kernels::Tensor;

struct Layout {
  int64_t n, c, spatial;
};

absl::StatusOr<Layout> GetLayout(const engine::Node& node, const std::vector<const Tensor*>& in) {
  const Tensor& x = *in[0];
  if (in.size() < 5 || x.rank() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": needs X of rank >= 2 and 5 inputs"));
  }
  Layout l{x.shape[0], x.shape[1], x.size() / std::max<int64_t>(1, x.shape[0] * x.shape[1])};
  for (int i = 1; i < 5; ++i) {
    if (in[i] == nullptr || in[i]->size() != l.c) {
      return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": input ", i, " must have ",
                                                     l.c, " elements (the channels)"));
    }
  }
  return l;
}

// Per-channel mean and biased variance of x.
void BatchStats(const Tensor& x, const Layout& l, std::vector<double>* mean,
                std::vector<double>* var) {
  mean->assign(l.c, 0);
  var->assign(l.c, 0);
  const double count = static_cast<double>(l.n * l.spatial);
#pragma omp parallel for
  for (int64_t c = 0; c < l.c; ++c) {
    double s = 0, s2 = 0;
    for (int64_t n = 0; n < l.n; ++n) {
      const float* p = &x.data[(n * l.c + c) * l.spatial];
      for (int64_t i = 0; i < l.spatial; ++i) s += p[i];
    }
    const double m = s / count;
    for (int64_t n = 0; n < l.n; ++n) {
      const float* p = &x.data[(n * l.c + c) * l.spatial];
      for (int64_t i = 0; i < l.spatial; ++i) s2 += (p[i] - m) * (p[i] - m);
    }
    (*mean)[c] = m;
    (*var)[c] = s2 / count;
  }
}

bool UseOnednn() {
  return conv_pool::CurrentImplementation() == conv_pool::Implementation::kOnednn;
}

// oneDNN could not make a primitive for this shape: the reference runs.
// Never after an execution error (backward would add its gradients twice).
std::atomic<int64_t> fallbacks{0};

bool FallBack(const absl::Status& s) {
  return kernels::training_onednn::ShapeRejected(s, fallbacks);
}

kernels::training_onednn::BatchNormShape OnednnShape(const Layout& l, float eps) {
  return {.n = l.n, .c = l.c, .spatial = l.spatial, .epsilon = eps};
}

// running = momentum * running + (1 - momentum) * batch (ONNX's convention).
void UpdateRunning(float momentum, int64_t c, const float* batch, float* running) {
  for (int64_t i = 0; i < c; ++i) running[i] = momentum * running[i] + (1 - momentum) * batch[i];
}

}  // namespace

int64_t ReferenceFallbacks() { return fallbacks.load(); }

absl::Status Forward(const engine::Graph&, const engine::Node& node,
                     const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<Layout> l = GetLayout(node, in);
  if (!l.ok()) return l.status();
  const float eps = node.GetFloat("epsilon", 1e-5f), momentum = node.GetFloat("momentum", 0.9f);
  const Tensor& x = *in[0];
  if (UseOnednn()) {
    Tensor& y = *out[0];
    y.shape = x.shape;
    y.data.resize(x.data.size());
    // The running statistics are net-owned state, updated in place.
    float* running_mean = const_cast<float*>(in[3]->data.data());
    float* running_var = const_cast<float*>(in[4]->data.data());
    const bool training = InTrainingMode();
    std::vector<float> mean(training ? l->c : 0), var(training ? l->c : 0);
    absl::Status s = kernels::training_onednn::BatchNormForward(
        &node, OnednnShape(*l, eps), x.data.data(), in[1]->data.data(), in[2]->data.data(),
        training ? mean.data() : running_mean, training ? var.data() : running_var, y.data.data(),
        training);
    if (s.ok() && training) {
      UpdateRunning(momentum, l->c, mean.data(), running_mean);
      UpdateRunning(momentum, l->c, var.data(), running_var);
    }
    if (!FallBack(s)) return s;
  }
  std::vector<double> mean(l->c), var(l->c);
  if (InTrainingMode()) {
    BatchStats(x, *l, &mean, &var);
    // The running statistics are net-owned state, updated in place.
    float* running_mean = const_cast<float*>(in[3]->data.data());
    float* running_var = const_cast<float*>(in[4]->data.data());
    const std::vector<float> batch_mean(mean.begin(), mean.end());
    const std::vector<float> batch_var(var.begin(), var.end());
    UpdateRunning(momentum, l->c, batch_mean.data(), running_mean);
    UpdateRunning(momentum, l->c, batch_var.data(), running_var);
  } else {
    for (int64_t c = 0; c < l->c; ++c) {
      mean[c] = in[3]->data[c];
      var[c] = in[4]->data[c];
    }
  }
  Tensor& y = *out[0];
  y.shape = x.shape;
  y.data.resize(x.data.size());
#pragma omp parallel for collapse(2)
  for (int64_t n = 0; n < l->n; ++n) {
    for (int64_t c = 0; c < l->c; ++c) {
      const float a = in[1]->data[c] / std::sqrt(static_cast<float>(var[c]) + eps);
      const float b = in[2]->data[c] - a * static_cast<float>(mean[c]);
      const int64_t off = (n * l->c + c) * l->spatial;
      for (int64_t i = 0; i < l->spatial; ++i) y.data[off + i] = a * x.data[off + i] + b;
    }
  }
  return absl::OkStatus();
}

absl::Status Backward(const engine::Graph&, const engine::Node& node,
                      const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                      const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  absl::StatusOr<Layout> l = GetLayout(node, in);
  if (!l.ok()) return l.status();
  const float eps = node.GetFloat("epsilon", 1e-5f);
  const Tensor& x = *in[0];
  const Tensor& dy = *gout[0];
  if (UseOnednn()) {
    auto data = [&](int i) { return gin[i] != nullptr ? gin[i]->data.data() : nullptr; };
    absl::Status s = kernels::training_onednn::BatchNormBackward(
        &node, OnednnShape(*l, eps), x.data.data(), in[1]->data.data(), in[2]->data.data(),
        dy.data.data(), data(0), data(1), data(2));
    if (!FallBack(s)) return s;
  }
  std::vector<double> mean, var;
  BatchStats(x, *l, &mean, &var);
  const double count = static_cast<double>(l->n * l->spatial);
#pragma omp parallel for
  for (int64_t c = 0; c < l->c; ++c) {
    const double inv_std = 1.0 / std::sqrt(var[c] + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < l->n; ++n) {
      const int64_t off = (n * l->c + c) * l->spatial;
      for (int64_t i = 0; i < l->spatial; ++i) {
        sum_dy += dy.data[off + i];
        sum_dy_xhat += dy.data[off + i] * (x.data[off + i] - mean[c]) * inv_std;
      }
    }
    if (gin[1] != nullptr) gin[1]->data[c] += static_cast<float>(sum_dy_xhat);
    if (gin[2] != nullptr) gin[2]->data[c] += static_cast<float>(sum_dy);
    if (gin[0] != nullptr) {
      const double k = in[1]->data[c] * inv_std / count;
      for (int64_t n = 0; n < l->n; ++n) {
        const int64_t off = (n * l->c + c) * l->spatial;
        for (int64_t i = 0; i < l->spatial; ++i) {
          const double xhat = (x.data[off + i] - mean[c]) * inv_std;
          gin[0]->data[off + i] +=
              static_cast<float>(k * (count * dy.data[off + i] - sum_dy - xhat * sum_dy_xhat));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace numaserve::training::batch_norm
