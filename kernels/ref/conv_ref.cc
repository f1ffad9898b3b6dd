#include "kernels/ref/conv_ref.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace numaserve::kernels {
namespace {

// Spatial extents padded to 3 dims (leading 1s) so one loop nest serves
// 1-D, 2-D and 3-D.
struct Dims3 {
  int64_t d[3] = {1, 1, 1};
};

Dims3 Pad3(const std::vector<int64_t>& v, int64_t fill) {
  Dims3 out;
  for (int i = 0; i < 3; ++i) out.d[i] = fill;
  const size_t off = 3 - v.size();
  for (size_t i = 0; i < v.size(); ++i) out.d[off + i] = v[i];
  return out;
}

Dims3 Spatial(const Shape& s) { return Pad3(std::vector<int64_t>(s.begin() + 2, s.end()), 1); }

absl::Status CheckRank(const Tensor& x, const WindowParams& p) {
  const size_t spatial = x.shape.size() >= 2 ? x.shape.size() - 2 : 0;
  if (x.shape.size() < 3 || spatial > 3 || p.kernel.size() != spatial ||
      p.strides.size() != spatial || p.dilations.size() != spatial ||
      p.pads_begin.size() != spatial || p.pads_end.size() != spatial) {
    return absl::InvalidArgumentError(absl::StrCat("windowed op: input ", ShapeToString(x.shape),
                                                   " needs 1-3 spatial dims and per-dim params"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> ConvRef(const Tensor& x, const Tensor& w, const Tensor* bias,
                               const WindowParams& p, int64_t group, const Shape& out_shape) {
  if (absl::Status s = CheckRank(x, p); !s.ok()) return s;
  const int64_t n_batch = x.shape[0], c_in = x.shape[1], m_out = out_shape[1];
  const int64_t cg = c_in / group, mg = m_out / group;
  const Dims3 is = Spatial(x.shape), os = Spatial(out_shape), k = Pad3(p.kernel, 1),
              st = Pad3(p.strides, 1), dl = Pad3(p.dilations, 1), pb = Pad3(p.pads_begin, 0);
  const int64_t in_sp = is.d[0] * is.d[1] * is.d[2], out_sp = os.d[0] * os.d[1] * os.d[2];
  const int64_t k_sp = k.d[0] * k.d[1] * k.d[2];
  Tensor y(out_shape);
  for (int64_t n = 0; n < n_batch; ++n) {
    for (int64_t m = 0; m < m_out; ++m) {
      const int64_t g = m / mg;
      for (int64_t o0 = 0; o0 < os.d[0]; ++o0) {
        for (int64_t o1 = 0; o1 < os.d[1]; ++o1) {
          for (int64_t o2 = 0; o2 < os.d[2]; ++o2) {
            double acc = bias != nullptr ? bias->data[m] : 0.0;
            for (int64_t c = 0; c < cg; ++c) {
              const float* xc = x.data.data() + (n * c_in + g * cg + c) * in_sp;
              const float* wc = w.data.data() + (m * cg + c) * k_sp;
              for (int64_t k0 = 0; k0 < k.d[0]; ++k0) {
                const int64_t i0 = o0 * st.d[0] - pb.d[0] + k0 * dl.d[0];
                if (i0 < 0 || i0 >= is.d[0]) continue;
                for (int64_t k1 = 0; k1 < k.d[1]; ++k1) {
                  const int64_t i1 = o1 * st.d[1] - pb.d[1] + k1 * dl.d[1];
                  if (i1 < 0 || i1 >= is.d[1]) continue;
                  for (int64_t k2 = 0; k2 < k.d[2]; ++k2) {
                    const int64_t i2 = o2 * st.d[2] - pb.d[2] + k2 * dl.d[2];
                    if (i2 < 0 || i2 >= is.d[2]) continue;
                    acc += static_cast<double>(xc[(i0 * is.d[1] + i1) * is.d[2] + i2]) *
                           wc[(k0 * k.d[1] + k1) * k.d[2] + k2];
                  }
                }
              }
            }
            y.data[(n * m_out + m) * out_sp + (o0 * os.d[1] + o1) * os.d[2] + o2] =
                static_cast<float>(acc);
          }
        }
      }
    }
  }
  return y;
}

absl::StatusOr<Tensor> ConvTransposeRef(const Tensor& x, const Tensor& w, const Tensor* bias,
                                        const WindowParams& p, int64_t group,
                                        const Shape& out_shape) {
  if (absl::Status s = CheckRank(x, p); !s.ok()) return s;
  const int64_t n_batch = x.shape[0], c_in = x.shape[1], m_out = out_shape[1];
  const int64_t cg = c_in / group, mg = m_out / group;
  const Dims3 is = Spatial(x.shape), os = Spatial(out_shape), k = Pad3(p.kernel, 1),
              st = Pad3(p.strides, 1), dl = Pad3(p.dilations, 1), pb = Pad3(p.pads_begin, 0);
  const int64_t in_sp = is.d[0] * is.d[1] * is.d[2], out_sp = os.d[0] * os.d[1] * os.d[2];
  const int64_t k_sp = k.d[0] * k.d[1] * k.d[2];
  std::vector<double> acc(NumElements(out_shape), 0.0);
  for (int64_t n = 0; n < n_batch; ++n) {
    for (int64_t c = 0; c < c_in; ++c) {
      const int64_t g = c / cg;
      const float* xc = x.data.data() + (n * c_in + c) * in_sp;
      for (int64_t mm = 0; mm < mg; ++mm) {
        const int64_t m = g * mg + mm;
        const float* wc = w.data.data() + (c * mg + mm) * k_sp;
        double* yc = acc.data() + (n * m_out + m) * out_sp;
        for (int64_t i0 = 0; i0 < is.d[0]; ++i0) {
          for (int64_t i1 = 0; i1 < is.d[1]; ++i1) {
            for (int64_t i2 = 0; i2 < is.d[2]; ++i2) {
              const double xv = xc[(i0 * is.d[1] + i1) * is.d[2] + i2];
              for (int64_t k0 = 0; k0 < k.d[0]; ++k0) {
                const int64_t o0 = i0 * st.d[0] + k0 * dl.d[0] - pb.d[0];
                if (o0 < 0 || o0 >= os.d[0]) continue;
                for (int64_t k1 = 0; k1 < k.d[1]; ++k1) {
                  const int64_t o1 = i1 * st.d[1] + k1 * dl.d[1] - pb.d[1];
                  if (o1 < 0 || o1 >= os.d[1]) continue;
                  for (int64_t k2 = 0; k2 < k.d[2]; ++k2) {
                    const int64_t o2 = i2 * st.d[2] + k2 * dl.d[2] - pb.d[2];
                    if (o2 < 0 || o2 >= os.d[2]) continue;
                    yc[(o0 * os.d[1] + o1) * os.d[2] + o2] +=
                        xv * wc[(k0 * k.d[1] + k1) * k.d[2] + k2];
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  Tensor y(out_shape);
  for (int64_t i = 0; i < y.size(); ++i) {
    const int64_t m = (i / out_sp) % m_out;
    y.data[i] = static_cast<float>(acc[i] + (bias != nullptr ? bias->data[m] : 0.0));
  }
  return y;
}

absl::StatusOr<Tensor> PoolRef(PoolKind kind, const Tensor& x, const WindowParams& p,
                               bool count_include_pad, const Shape& out_shape) {
  if (absl::Status s = CheckRank(x, p); !s.ok()) return s;
  const int64_t planes = x.shape[0] * x.shape[1];
  const Dims3 is = Spatial(x.shape), os = Spatial(out_shape), k = Pad3(p.kernel, 1),
              st = Pad3(p.strides, 1), dl = Pad3(p.dilations, 1), pb = Pad3(p.pads_begin, 0),
              pe = Pad3(p.pads_end, 0);
  const int64_t in_sp = is.d[0] * is.d[1] * is.d[2], out_sp = os.d[0] * os.d[1] * os.d[2];
  Tensor y(out_shape);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x.data.data() + pl * in_sp;
    for (int64_t o0 = 0; o0 < os.d[0]; ++o0) {
      for (int64_t o1 = 0; o1 < os.d[1]; ++o1) {
        for (int64_t o2 = 0; o2 < os.d[2]; ++o2) {
          const int64_t o[3] = {o0, o1, o2};
          double acc = kind == PoolKind::kMax ? -INFINITY : 0.0;
          int64_t counted = 1;  // padded-window cells (count_include_pad)
          int64_t valid = 0;
          for (int d = 0; d < 3; ++d) {
            const int64_t start = o[d] * st.d[d] - pb.d[d];
            const int64_t end = std::min(start + (k.d[d] - 1) * dl.d[d] + 1, is.d[d] + pe.d[d]);
            counted *= (end - start + dl.d[d] - 1) / dl.d[d];
          }
          for (int64_t k0 = 0; k0 < k.d[0]; ++k0) {
            const int64_t i0 = o0 * st.d[0] - pb.d[0] + k0 * dl.d[0];
            if (i0 < 0 || i0 >= is.d[0]) continue;
            for (int64_t k1 = 0; k1 < k.d[1]; ++k1) {
              const int64_t i1 = o1 * st.d[1] - pb.d[1] + k1 * dl.d[1];
              if (i1 < 0 || i1 >= is.d[1]) continue;
              for (int64_t k2 = 0; k2 < k.d[2]; ++k2) {
                const int64_t i2 = o2 * st.d[2] - pb.d[2] + k2 * dl.d[2];
                if (i2 < 0 || i2 >= is.d[2]) continue;
                const float v = xp[(i0 * is.d[1] + i1) * is.d[2] + i2];
                acc = kind == PoolKind::kMax ? std::max<double>(acc, v) : acc + v;
                ++valid;
              }
            }
          }
          if (kind == PoolKind::kAverage) {
            const int64_t div = count_include_pad ? counted : valid;
            acc = div > 0 ? acc / div : 0.0;
          }
          y.data[pl * out_sp + (o0 * os.d[1] + o1) * os.d[2] + o2] = static_cast<float>(acc);
        }
      }
    }
  }
  return y;
}

}  // namespace numaserve::kernels
