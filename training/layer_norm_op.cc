#include "training/layer_norm_op.h"

#include <atomic>
#include <cmath>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/onednn/training_onednn.h"
#include "kernels/shape_ops.h"
#include "training/conv_pool_ops.h"
#include "training/training_ops.h"

namespace numaserve::training::layer_norm {
namespace {

using kernels::Tensor;

struct Rows {
  int64_t rows, inner;
};

absl::StatusOr<Rows> GetRows(const engine::Node& node, const std::vector<const Tensor*>& in,
                             size_t outputs) {
  const Tensor& x = *in[0];
  absl::StatusOr<int64_t> axis = kernels::NormalizeAxis(node.GetInt("axis", -1), x.rank());
  if (!axis.ok())
    return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": ", axis.status().message()));
  if (outputs > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": only the Y output is supported in training"));
  }
  Rows r{1, 1};
  for (int64_t d = 0; d < x.rank(); ++d) (d < *axis ? r.rows : r.inner) *= x.shape[d];
  for (size_t i = 1; i < in.size() && i < 3; ++i) {
    if (in[i] != nullptr && in[i]->size() != r.inner) {
      return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": input ", i, " must have ",
                                                     r.inner, " elements (the normalized dims)"));
    }
  }
  return r;
}

// Mean and 1/sqrt(var + eps) of row r.
std::pair<double, double> RowStats(const float* x, int64_t n, float eps) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const double mean = s / n;
  for (int64_t i = 0; i < n; ++i) s2 += (x[i] - mean) * (x[i] - mean);
  return {mean, 1.0 / std::sqrt(s2 / n + eps)};
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

const float* Bias(const std::vector<const Tensor*>& in) {
  return in.size() > 2 && in[2] != nullptr ? in[2]->data.data() : nullptr;
}

kernels::training_onednn::LayerNormShape OnednnShape(const Rows& r, float eps, const float* bias) {
  return {.rows = r.rows, .inner = r.inner, .epsilon = eps, .shift = bias != nullptr};
}

}  // namespace

int64_t ReferenceFallbacks() { return fallbacks.load(); }

absl::Status Forward(const engine::Graph&, const engine::Node& node,
                     const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<Rows> r = GetRows(node, in, out.size());
  if (!r.ok()) return r.status();
  const float eps = node.GetFloat("epsilon", 1e-5f);
  const Tensor& x = *in[0];
  const float* scale = in[1]->data.data();
  const float* bias = Bias(in);
  Tensor& y = *out[0];
  y.shape = x.shape;
  y.data.resize(x.data.size());
  if (UseOnednn()) {
    absl::Status s =
        kernels::training_onednn::LayerNormForward(&node, OnednnShape(*r, eps, bias), x.data.data(),
                                                   scale, bias, y.data.data(), InTrainingMode());
    if (!FallBack(s)) return s;
  }
#pragma omp parallel for
  for (int64_t row = 0; row < r->rows; ++row) {
    const float* xr = &x.data[row * r->inner];
    float* yr = &y.data[row * r->inner];
    const auto [mean, inv] = RowStats(xr, r->inner, eps);
    for (int64_t i = 0; i < r->inner; ++i) {
      yr[i] =
          static_cast<float>((xr[i] - mean) * inv) * scale[i] + (bias != nullptr ? bias[i] : 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status Backward(const engine::Graph&, const engine::Node& node,
                      const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& out,
                      const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  absl::StatusOr<Rows> r = GetRows(node, in, out.size());
  if (!r.ok()) return r.status();
  const float eps = node.GetFloat("epsilon", 1e-5f);
  const Tensor& x = *in[0];
  const Tensor& dy = *gout[0];
  const float* scale = in[1]->data.data();
  if (UseOnednn()) {
    const float* bias = Bias(in);
    float* dx = gin[0] != nullptr ? gin[0]->data.data() : nullptr;
    float* dscale = gin[1] != nullptr ? gin[1]->data.data() : nullptr;
    float* dbias = gin.size() > 2 && gin[2] != nullptr ? gin[2]->data.data() : nullptr;
    absl::Status s = kernels::training_onednn::LayerNormBackward(&node, OnednnShape(*r, eps, bias),
                                                                 x.data.data(), scale, bias,
                                                                 dy.data.data(), dx, dscale, dbias);
    if (!FallBack(s)) return s;
  }
  const int64_t n = r->inner;
  std::vector<double> xhat(n);
  for (int64_t row = 0; row < r->rows; ++row) {
    const float* xr = &x.data[row * n];
    const float* dyr = &dy.data[row * n];
    const auto [mean, inv] = RowStats(xr, n, eps);
    double sum_g = 0, sum_g_xhat = 0;
    for (int64_t i = 0; i < n; ++i) {
      xhat[i] = (xr[i] - mean) * inv;
      const double g = static_cast<double>(dyr[i]) * scale[i];
      sum_g += g;
      sum_g_xhat += g * xhat[i];
      if (gin[1] != nullptr) gin[1]->data[i] += static_cast<float>(dyr[i] * xhat[i]);
      if (gin.size() > 2 && gin[2] != nullptr) gin[2]->data[i] += dyr[i];
    }
    if (gin[0] != nullptr) {
      float* dx = &gin[0]->data[row * n];
      for (int64_t i = 0; i < n; ++i) {
        const double g = static_cast<double>(dyr[i]) * scale[i];
        dx[i] += static_cast<float>(inv / n * (n * g - sum_g - xhat[i] * sum_g_xhat));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace numaserve::training::layer_norm
