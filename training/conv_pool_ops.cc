#include "training/conv_pool_ops.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/onednn/training_onednn.h"
#include "training/training_ops.h"

namespace numaserve::training::conv_pool {
namespace {

using engine::Node;

absl::Status NodeError(const Node& node, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": ", message));
}

std::vector<int64_t> Ints(const Node& node, const std::string& key, std::vector<int64_t> fallback) {
  auto it = node.attributes.find(key);
  if (it == node.attributes.end()) return fallback;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  return fallback;
}

// Geometry of a 2-D window op over NCHW.
using Window = kernels::training_onednn::Window2d;

// oneDNN until SetImplementation says otherwise (TrainOptions::reference_ops
// for a whole training run, tests for one op).
std::atomic<Implementation> implementation{Implementation::kOnednn};

bool UseOnednn() {
  return implementation.load(std::memory_order_relaxed) == Implementation::kOnednn;
}

// oneDNN could not make a primitive for this geometry: the reference runs.
std::atomic<int64_t> fallbacks{0};

bool FallBack(const absl::Status& s) {
  return kernels::training_onednn::ShapeRejected(s, fallbacks);
}

absl::StatusOr<Window> MakeWindow(const Node& node, const Tensor& x, int64_t kh, int64_t kw) {
  if (x.rank() != 4)
    return NodeError(node, absl::StrCat("training supports 2-D NCHW inputs, got ",
                                        kernels::ShapeToString(x.shape)));
  auto it = node.attributes.find("auto_pad");
  if (it != node.attributes.end()) {
    const std::string* mode = std::get_if<std::string>(&it->second);
    if (mode != nullptr && *mode != "NOTSET" && *mode != "VALID") {
      return NodeError(node, absl::StrCat("auto_pad ", *mode,
                                          " is not supported in training (use explicit pads)"));
    }
  }
  if (node.GetInt("ceil_mode", 0) != 0)
    return NodeError(node, "ceil_mode 1 is not supported in training");
  Window w{};
  w.n = x.shape[0], w.c = x.shape[1], w.h = x.shape[2], w.w = x.shape[3];
  w.kh = kh, w.kw = kw;
  const std::vector<int64_t> s = Ints(node, "strides", {1, 1});
  const std::vector<int64_t> p = Ints(node, "pads", {0, 0, 0, 0});
  const std::vector<int64_t> d = Ints(node, "dilations", {1, 1});
  if (s.size() != 2 || p.size() != 4 || d.size() != 2)
    return NodeError(node, "strides/pads/dilations must be 2-D");
  w.sh = s[0], w.sw = s[1];
  w.pt = p[0], w.pl = p[1], w.pb = p[2], w.pr = p[3];
  w.dh = d[0], w.dw = d[1];
  w.oh = (w.h + w.pt + w.pb - (w.dh * (w.kh - 1) + 1)) / w.sh + 1;
  w.ow = (w.w + w.pl + w.pr - (w.dw * (w.kw - 1) + 1)) / w.sw + 1;
  if (w.oh <= 0 || w.ow <= 0) return NodeError(node, "the window is larger than the padded input");
  return w;
}

// cols[(c, i, j), (n, oy, ox)] for channels [c0, c0 + cg).
void Im2Col(const Window& g, const float* x, int64_t c0, int64_t cg, float* cols) {
  const int64_t np = g.n * g.oh * g.ow;
  const int64_t rows = cg * g.kh * g.kw;
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = c0 + r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
    float* out = cols + r * np;
    for (int64_t n = 0; n < g.n; ++n) {
      const float* plane = x + (n * g.c + c) * g.h * g.w;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t y = oy * g.sh - g.pt + i * g.dh;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t xx = ox * g.sw - g.pl + j * g.dw;
          *out++ = (y >= 0 && y < g.h && xx >= 0 && xx < g.w) ? plane[y * g.w + xx] : 0.0f;
        }
      }
    }
  }
}

// dx += col2im(dcols); parallel over channels so no two threads add to the same element.
void Col2ImAdd(const Window& g, const float* dcols, int64_t c0, int64_t cg, float* dx) {
  const int64_t np = g.n * g.oh * g.ow;
#pragma omp parallel for
  for (int64_t cc = 0; cc < cg; ++cc) {
    const int64_t c = c0 + cc;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const float* in = dcols + ((cc * g.kh + i) * g.kw + j) * np;
        for (int64_t n = 0; n < g.n; ++n) {
          float* plane = dx + (n * g.c + c) * g.h * g.w;
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            const int64_t y = oy * g.sh - g.pt + i * g.dh;
            for (int64_t ox = 0; ox < g.ow; ++ox, ++in) {
              const int64_t xx = ox * g.sw - g.pl + j * g.dw;
              if (y >= 0 && y < g.h && xx >= 0 && xx < g.w) plane[y * g.w + xx] += *in;
            }
          }
        }
      }
    }
  }
}

struct ConvGeometry {
  Window win;
  int64_t m, groups, cg, mg, ckk;
};

absl::StatusOr<ConvGeometry> MakeConv(const Node& node, const Tensor& x, const Tensor& w) {
  if (w.rank() != 4) return NodeError(node, "training supports 2-D convolutions (4-D weights)");
  ConvGeometry g;
  g.groups = node.GetInt("group", 1);
  absl::StatusOr<Window> win = MakeWindow(node, x, w.shape[2], w.shape[3]);
  if (!win.ok()) return win.status();
  g.win = *win;
  g.m = w.shape[0];
  if (g.groups < 1 || g.win.c % g.groups != 0 || g.m % g.groups != 0 ||
      w.shape[1] * g.groups != g.win.c) {
    return NodeError(
        node, absl::StrCat("input ", kernels::ShapeToString(x.shape), ", weights ",
                           kernels::ShapeToString(w.shape), " and group ", g.groups, " disagree"));
  }
  g.cg = g.win.c / g.groups;
  g.mg = g.m / g.groups;
  g.ckk = g.cg * g.win.kh * g.win.kw;
  return g;
}

// Per-thread scratch that keeps its pages between steps (a fresh 30 MB
// vector per call costs page faults comparable to the GEMM itself).
std::vector<float>& Scratch(int which, size_t size) {
  static thread_local std::vector<float> buffers[2];
  if (buffers[which].size() < size) buffers[which].resize(size);
  return buffers[which];
}

absl::Status ConvForwardReference(const Node& node, const std::vector<const Tensor*>& in,
                                  std::vector<Tensor*>& out) {
  absl::StatusOr<ConvGeometry> g = MakeConv(node, *in[0], *in[1]);
  if (!g.ok()) return g.status();
  const Window& w = g->win;
  const int64_t np = w.n * w.oh * w.ow, plane = w.oh * w.ow;
  Tensor& y = *out[0];
  y.shape = {w.n, g->m, w.oh, w.ow};
  y.data.resize(w.n * g->m * plane);
  std::vector<float>& cols = Scratch(0, g->ckk * np);
  std::vector<float>& yg = Scratch(1, g->mg * np);
  const float* bias = in.size() > 2 && in[2] != nullptr ? in[2]->data.data() : nullptr;
  for (int64_t gi = 0; gi < g->groups; ++gi) {
    Im2Col(w, in[0]->data.data(), gi * g->cg, g->cg, cols.data());
    Sgemm(false, false, g->mg, np, g->ckk, 1.0f, in[1]->data.data() + gi * g->mg * g->ckk,
          cols.data(), 0.0f, yg.data());
#pragma omp parallel for collapse(2)
    for (int64_t n = 0; n < w.n; ++n) {
      for (int64_t m = 0; m < g->mg; ++m) {
        const int64_t channel = gi * g->mg + m;
        const float b = bias != nullptr ? bias[channel] : 0.0f;
        const float* src = &yg[m * np + n * plane];
        float* dst = &y.data[(n * g->m + channel) * plane];
        for (int64_t p = 0; p < plane; ++p) dst[p] = src[p] + b;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ConvBackwardReference(const Node& node, const std::vector<const Tensor*>& in,
                                   const std::vector<const Tensor*>& gout,
                                   std::vector<Tensor*>& gin) {
  absl::StatusOr<ConvGeometry> g = MakeConv(node, *in[0], *in[1]);
  if (!g.ok()) return g.status();
  const Window& w = g->win;
  const int64_t np = w.n * w.oh * w.ow, plane = w.oh * w.ow;
  const Tensor& dy = *gout[0];
  std::vector<float>& cols = Scratch(0, g->ckk * np);
  std::vector<float>& dyg = Scratch(1, g->mg * np);
  for (int64_t gi = 0; gi < g->groups; ++gi) {
#pragma omp parallel for collapse(2)
    for (int64_t n = 0; n < w.n; ++n) {
      for (int64_t m = 0; m < g->mg; ++m) {
        const float* src = &dy.data[(n * g->m + gi * g->mg + m) * plane];
        std::copy(src, src + plane, &dyg[m * np + n * plane]);
      }
    }
    if (gin[1] != nullptr) {
      Im2Col(w, in[0]->data.data(), gi * g->cg, g->cg, cols.data());
      Sgemm(false, true, g->mg, g->ckk, np, 1.0f, dyg.data(), cols.data(), 1.0f,
            gin[1]->data.data() + gi * g->mg * g->ckk);
    }
    if (gin[0] != nullptr) {
      Sgemm(true, false, g->ckk, np, g->mg, 1.0f, in[1]->data.data() + gi * g->mg * g->ckk,
            dyg.data(), 0.0f, cols.data());
      Col2ImAdd(w, cols.data(), gi * g->cg, g->cg, gin[0]->data.data());
    }
  }
  if (in.size() > 2 && gin.size() > 2 && gin[2] != nullptr) {
    float* db = gin[2]->data.data();
#pragma omp parallel for
    for (int64_t m = 0; m < g->m; ++m) {
      double s = 0;
      for (int64_t n = 0; n < w.n; ++n) {
        const float* src = &dy.data[(n * g->m + m) * plane];
        for (int64_t p = 0; p < plane; ++p) s += src[p];
      }
      db[m] += static_cast<float>(s);
    }
  }
  return absl::OkStatus();
}

const float* BiasOf(const std::vector<const Tensor*>& in) {
  return in.size() > 2 && in[2] != nullptr ? in[2]->data.data() : nullptr;
}

absl::StatusOr<kernels::training_onednn::ConvShape> OnednnConvShape(
    const Node& node, const std::vector<const Tensor*>& in) {
  absl::StatusOr<ConvGeometry> g = MakeConv(node, *in[0], *in[1]);
  if (!g.ok()) return g.status();
  const bool bias = BiasOf(in) != nullptr;
  if (bias && in[2]->size() != g->m)
    return NodeError(node, absl::StrCat("the bias must have ", g->m, " elements"));
  return kernels::training_onednn::ConvShape{.win = g->win,
                                             .m = g->m,
                                             .groups = g->groups,
                                             .bias = bias,
                                             .bf16 = CurrentTrainingContext().bf16};
}

}  // namespace

void SetImplementation(Implementation impl) { implementation.store(impl); }
Implementation CurrentImplementation() { return implementation.load(); }
int64_t ReferenceFallbacks() { return fallbacks.load(); }

absl::Status ConvForward(const engine::Graph&, const Node& node,
                         const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<kernels::training_onednn::ConvShape> shape = OnednnConvShape(node, in);
  if (!shape.ok()) return shape.status();
  if (UseOnednn()) {
    const Window& w = shape->win;
    Tensor& y = *out[0];
    y.shape = {w.n, shape->m, w.oh, w.ow};
    y.data.resize(w.n * shape->m * w.oh * w.ow);
    absl::Status s =
        kernels::training_onednn::ConvForward(&node, *shape, in[0]->data.data(), in[1]->data.data(),
                                              BiasOf(in), y.data.data(), InTrainingMode());
    if (!FallBack(s)) return s;
  }
  return ConvForwardReference(node, in, out);
}

absl::Status ConvBackward(const engine::Graph&, const Node& node,
                          const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                          const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  absl::StatusOr<kernels::training_onednn::ConvShape> shape = OnednnConvShape(node, in);
  if (!shape.ok()) return shape.status();
  if (UseOnednn()) {
    float* db = shape->bias && gin.size() > 2 && gin[2] != nullptr ? gin[2]->data.data() : nullptr;
    absl::Status s = kernels::training_onednn::ConvBackward(
        &node, *shape, in[0]->data.data(), in[1]->data.data(), gout[0]->data.data(),
        gin[0] != nullptr ? gin[0]->data.data() : nullptr,
        gin[1] != nullptr ? gin[1]->data.data() : nullptr, db);
    if (!FallBack(s)) return s;
  }
  return ConvBackwardReference(node, in, gout, gin);
}

namespace {

absl::StatusOr<Window> PoolWindow(const Node& node, const Tensor& x) {
  const std::vector<int64_t> k = Ints(node, "kernel_shape", {});
  if (k.size() != 2) return NodeError(node, "kernel_shape must have 2 values");
  return MakeWindow(node, x, k[0], k[1]);
}

// Index (in the input plane) of the maximum of output position (oy, ox); -1 if all padding.
int64_t ArgMax(const Window& w, const float* plane, int64_t oy, int64_t ox) {
  const int64_t y0 = oy * w.sh - w.pt, x0 = ox * w.sw - w.pl;
  if (y0 >= 0 && x0 >= 0 && y0 + (w.kh - 1) * w.dh < w.h && x0 + (w.kw - 1) * w.dw < w.w) {
    // Window fully inside: no bounds checks.
    int64_t best = y0 * w.w + x0;
    for (int64_t i = 0; i < w.kh; ++i) {
      const int64_t row = (y0 + i * w.dh) * w.w + x0;
      for (int64_t j = 0; j < w.kw; ++j) {
        if (plane[row + j * w.dw] > plane[best]) best = row + j * w.dw;
      }
    }
    return best;
  }
  int64_t best = -1;
  float best_value = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < w.kh; ++i) {
    const int64_t y = oy * w.sh - w.pt + i * w.dh;
    if (y < 0 || y >= w.h) continue;
    for (int64_t j = 0; j < w.kw; ++j) {
      const int64_t x = ox * w.sw - w.pl + j * w.dw;
      if (x < 0 || x >= w.w) continue;
      if (best < 0 || plane[y * w.w + x] > best_value) {
        best = y * w.w + x;
        best_value = plane[best];
      }
    }
  }
  return best;
}

// oneDNN pools when no window lies wholly in the padding (the reference
// gives such a window 0).
bool OnednnPools(const Window& w) {
  const int64_t eh = (w.kh - 1) * w.dh + 1, ew = (w.kw - 1) * w.dw + 1;
  return UseOnednn() && w.pt < eh && w.pb < eh && w.pl < ew && w.pr < ew;
}

kernels::training_onednn::PoolKind AverageKind(const Node& node) {
  return node.GetInt("count_include_pad", 0) != 0
             ? kernels::training_onednn::PoolKind::kAverageIncludePad
             : kernels::training_onednn::PoolKind::kAverageExcludePad;
}

}  // namespace

absl::Status MaxPoolForward(const engine::Graph&, const Node& node,
                            const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<Window> w = PoolWindow(node, *in[0]);
  if (!w.ok()) return w.status();
  if (out.size() > 1) return NodeError(node, "the Indices output is not supported in training");
  Tensor& y = *out[0];
  y.shape = {w->n, w->c, w->oh, w->ow};
  y.data.resize(w->n * w->c * w->oh * w->ow);
  if (OnednnPools(*w)) {
    absl::Status s =
        kernels::training_onednn::PoolForward(&node, kernels::training_onednn::PoolKind::kMax, *w,
                                              in[0]->data.data(), y.data.data(), InTrainingMode());
    if (!FallBack(s)) return s;
  }
#pragma omp parallel for
  for (int64_t nc = 0; nc < w->n * w->c; ++nc) {
    const float* plane = &in[0]->data[nc * w->h * w->w];
    float* dst = &y.data[nc * w->oh * w->ow];
    for (int64_t oy = 0; oy < w->oh; ++oy) {
      for (int64_t ox = 0; ox < w->ow; ++ox) {
        const int64_t a = ArgMax(*w, plane, oy, ox);
        dst[oy * w->ow + ox] = a >= 0 ? plane[a] : 0.0f;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MaxPoolBackward(const engine::Graph&, const Node& node,
                             const std::vector<const Tensor*>& in,
                             const std::vector<const Tensor*>& out,
                             const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  absl::StatusOr<Window> w = PoolWindow(node, *in[0]);
  if (!w.ok()) return w.status();
  if (OnednnPools(*w)) {
    absl::Status s = kernels::training_onednn::PoolBackward(
        &node, kernels::training_onednn::PoolKind::kMax, *w, in[0]->data.data(),
        out[0]->data.data(), gout[0]->data.data(), gin[0]->data.data());
    if (!FallBack(s)) return s;
  }
#pragma omp parallel for
  for (int64_t nc = 0; nc < w->n * w->c; ++nc) {
    const float* plane = &in[0]->data[nc * w->h * w->w];
    const float* dy = &gout[0]->data[nc * w->oh * w->ow];
    float* dx = &gin[0]->data[nc * w->h * w->w];
    for (int64_t oy = 0; oy < w->oh; ++oy) {
      for (int64_t ox = 0; ox < w->ow; ++ox) {
        const int64_t a = ArgMax(*w, plane, oy, ox);
        if (a >= 0) dx[a] += dy[oy * w->ow + ox];
      }
    }
  }
  return absl::OkStatus();
}

namespace {
// Calls f(input index, 1/count) for each input element of output (oy, ox).
template <typename F>
void ForWindow(const Window& w, bool count_pad, int64_t oy, int64_t ox, F f) {
  int64_t count = 0;
  for (int64_t i = 0; i < w.kh; ++i) {
    const int64_t y = oy * w.sh - w.pt + i * w.dh;
    for (int64_t j = 0; j < w.kw; ++j) {
      const int64_t x = ox * w.sw - w.pl + j * w.dw;
      const bool inside = y >= 0 && y < w.h && x >= 0 && x < w.w;
      if (inside || (count_pad && y < w.h + w.pb && x < w.w + w.pr)) ++count;
    }
  }
  const float scale = count > 0 ? 1.0f / count : 0.0f;
  for (int64_t i = 0; i < w.kh; ++i) {
    const int64_t y = oy * w.sh - w.pt + i * w.dh;
    for (int64_t j = 0; j < w.kw; ++j) {
      const int64_t x = ox * w.sw - w.pl + j * w.dw;
      if (y >= 0 && y < w.h && x >= 0 && x < w.w) f(y * w.w + x, scale);
    }
  }
}
}  // namespace

absl::Status AveragePoolForward(const engine::Graph&, const Node& node,
                                const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<Window> w = PoolWindow(node, *in[0]);
  if (!w.ok()) return w.status();
  const bool count_pad = node.GetInt("count_include_pad", 0) != 0;
  Tensor& y = *out[0];
  y.shape = {w->n, w->c, w->oh, w->ow};
  y.data.resize(w->n * w->c * w->oh * w->ow);
  if (OnednnPools(*w)) {
    absl::Status s = kernels::training_onednn::PoolForward(
        &node, AverageKind(node), *w, in[0]->data.data(), y.data.data(), InTrainingMode());
    if (!FallBack(s)) return s;
  }
#pragma omp parallel for
  for (int64_t nc = 0; nc < w->n * w->c; ++nc) {
    const float* plane = &in[0]->data[nc * w->h * w->w];
    float* dst = &y.data[nc * w->oh * w->ow];
    for (int64_t oy = 0; oy < w->oh; ++oy) {
      for (int64_t ox = 0; ox < w->ow; ++ox) {
        float s = 0;
        ForWindow(*w, count_pad, oy, ox, [&](int64_t a, float scale) { s += plane[a] * scale; });
        dst[oy * w->ow + ox] = s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AveragePoolBackward(const engine::Graph&, const Node& node,
                                 const std::vector<const Tensor*>& in,
                                 const std::vector<const Tensor*>& out,
                                 const std::vector<const Tensor*>& gout,
                                 std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  absl::StatusOr<Window> w = PoolWindow(node, *in[0]);
  if (!w.ok()) return w.status();
  if (OnednnPools(*w)) {
    absl::Status s = kernels::training_onednn::PoolBackward(
        &node, AverageKind(node), *w, in[0]->data.data(), out[0]->data.data(), gout[0]->data.data(),
        gin[0]->data.data());
    if (!FallBack(s)) return s;
  }
  const bool count_pad = node.GetInt("count_include_pad", 0) != 0;
#pragma omp parallel for
  for (int64_t nc = 0; nc < w->n * w->c; ++nc) {
    const float* dy = &gout[0]->data[nc * w->oh * w->ow];
    float* dx = &gin[0]->data[nc * w->h * w->w];
    for (int64_t oy = 0; oy < w->oh; ++oy) {
      for (int64_t ox = 0; ox < w->ow; ++ox) {
        const float g = dy[oy * w->ow + ox];
        ForWindow(*w, count_pad, oy, ox, [&](int64_t a, float scale) { dx[a] += g * scale; });
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GlobalAveragePoolForward(const engine::Graph&, const Node& node,
                                      const std::vector<const Tensor*>& in,
                                      std::vector<Tensor*>& out) {
  const Tensor& x = *in[0];
  if (x.rank() < 3) return NodeError(node, "input must be N x C x spatial");
  const int64_t nc = x.shape[0] * x.shape[1], plane = x.size() / nc;
  Tensor& y = *out[0];
  y.shape = x.shape;
  for (size_t d = 2; d < y.shape.size(); ++d) y.shape[d] = 1;
  y.data.resize(nc);
  for (int64_t i = 0; i < nc; ++i) {
    double s = 0;
    for (int64_t p = 0; p < plane; ++p) s += x.data[i * plane + p];
    y.data[i] = static_cast<float>(s / plane);
  }
  return absl::OkStatus();
}

absl::Status GlobalAveragePoolBackward(const engine::Graph&, const Node&,
                                       const std::vector<const Tensor*>& in,
                                       const std::vector<const Tensor*>&,
                                       const std::vector<const Tensor*>& gout,
                                       std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  const Tensor& x = *in[0];
  const int64_t nc = x.shape[0] * x.shape[1], plane = x.size() / nc;
  for (int64_t i = 0; i < nc; ++i) {
    const float g = gout[0]->data[i] / plane;
    for (int64_t p = 0; p < plane; ++p) gin[0]->data[i * plane + p] += g;
  }
  return absl::OkStatus();
}

}  // namespace numaserve::training::conv_pool
