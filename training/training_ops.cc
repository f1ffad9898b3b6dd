#include "training/training_ops.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops/op_registry.h"
#include "kernels/shape_ops.h"
#include "training/batch_norm_op.h"
#include "training/conv_pool_ops.h"
#include "training/layer_norm_op.h"

namespace numaserve::training {
namespace {

using engine::Graph;
using engine::Node;
using kernels::Shape;

absl::Status NodeError(const Node& node, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": ", message));
}

void Resize(Tensor* t, const Shape& shape) {
  t->shape = shape;
  t->data.resize(kernels::NumElements(shape));
}

// --- broadcasting -----------------------------------------------------------
// Strides of `in` read at each index of `out` (0 along broadcast dims).
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  const Shape padded = kernels::PadShapeLeft(in, out.size());
  std::vector<int64_t> strides = kernels::RowMajorStrides(padded);
  for (size_t i = 0; i < out.size(); ++i) {
    if (padded[i] == 1 && out[i] != 1) strides[i] = 0;
  }
  return strides;
}

// Calls f(out_index, in_offset) over every element of `out`.
template <typename F>
void ForEachBroadcast(const Shape& in, const Shape& out, F f) {
  const std::vector<int64_t> strides = BroadcastStrides(in, out);
  const int64_t n = kernels::NumElements(out);
  const int rank = static_cast<int>(out.size());
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, offset);
    for (int d = rank - 1; d >= 0; --d) {
      ++index[d];
      offset += strides[d];
      if (index[d] < out[d]) break;
      offset -= strides[d] * index[d];
      index[d] = 0;
    }
  }
}

// True when `in` broadcasts to `out` as one row repeated ([N] or [1,N] over [M,N]).
bool IsRowBroadcast(const Shape& in, const Shape& out) {
  if (out.empty() || kernels::NumElements(in) != out.back()) return false;
  for (size_t i = 0; i + 1 < in.size(); ++i) {
    if (in[i] != 1) return false;
  }
  return in.empty() ? out.back() == 1 : in.back() == out.back();
}

// grad_in += reduce_sum(scale * grad_out) over the broadcast dimensions.
void ReduceBroadcastGrad(const Tensor& grad_out, float scale, Tensor* grad_in) {
  if (grad_in->shape == grad_out.shape) {
    const int64_t n = grad_out.size();
    float* gi = grad_in->data.data();
    const float* go = grad_out.data.data();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) gi[i] += scale * go[i];
    return;
  }
  if (IsRowBroadcast(grad_in->shape, grad_out.shape)) {
    const int64_t cols = grad_out.shape.back(), rows = grad_out.size() / cols;
    float* gi = grad_in->data.data();
    for (int64_t r = 0; r < rows; ++r) {
      const float* go = &grad_out.data[r * cols];
      for (int64_t c = 0; c < cols; ++c) gi[c] += scale * go[c];
    }
    return;
  }
  ForEachBroadcast(grad_in->shape, grad_out.shape,
                   [&](int64_t i, int64_t off) { grad_in->data[off] += scale * grad_out.data[i]; });
}

// --- Gemm / MatMul ------------------------------------------------------------
struct GemmDims {
  int64_t m, n, k;
};

absl::Status GemmForward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                         std::vector<Tensor*>& out) {
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  const bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.0f), beta = node.GetFloat("beta", 1.0f);
  if (a.rank() != 2 || b.rank() != 2) return NodeError(node, "inputs must be 2-D");
  const int64_t m = ta ? a.shape[1] : a.shape[0], k = ta ? a.shape[0] : a.shape[1];
  const int64_t n = tb ? b.shape[0] : b.shape[1];
  if ((tb ? b.shape[1] : b.shape[0]) != k) {
    return NodeError(
        node, absl::StrCat("inner dimensions differ: A ", kernels::ShapeToString(a.shape), " B ",
                           kernels::ShapeToString(b.shape)));
  }
  Tensor& y = *out[0];
  Resize(&y, {m, n});
  float c_beta = 0.0f;
  if (in.size() > 2 && in[2] != nullptr) {
    if (IsRowBroadcast(in[2]->shape, y.shape)) {
      const float* c = in[2]->data.data();
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < n; ++j) y.data[r * n + j] = beta * c[j];
      }
    } else {
      ForEachBroadcast(in[2]->shape, y.shape,
                       [&](int64_t i, int64_t off) { y.data[i] = beta * in[2]->data[off]; });
    }
    c_beta = 1.0f;
  }
  Sgemm(ta, tb, m, n, k, alpha, a.data.data(), b.data.data(), c_beta, y.data.data());
  return absl::OkStatus();
}

absl::Status GemmBackward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                          const std::vector<const Tensor*>& out,
                          const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  const Tensor& dy = *gout[0];
  const bool ta = node.GetInt("transA", 0) != 0, tb = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.0f), beta = node.GetFloat("beta", 1.0f);
  const int64_t m = dy.shape[0], n = dy.shape[1];
  const int64_t k = ta ? a.shape[0] : a.shape[1];
  if (gin[0] != nullptr) {
    if (!ta) {
      Sgemm(false, !tb, m, k, n, alpha, dy.data.data(), b.data.data(), 1.0f, gin[0]->data.data());
    } else {
      Sgemm(tb, true, k, m, n, alpha, b.data.data(), dy.data.data(), 1.0f, gin[0]->data.data());
    }
  }
  if (gin[1] != nullptr) {
    if (!tb) {
      Sgemm(!ta, false, k, n, m, alpha, a.data.data(), dy.data.data(), 1.0f, gin[1]->data.data());
    } else {
      Sgemm(true, ta, n, k, m, alpha, dy.data.data(), a.data.data(), 1.0f, gin[1]->data.data());
    }
  }
  if (in.size() > 2 && gin.size() > 2 && gin[2] != nullptr) ReduceBroadcastGrad(dy, beta, gin[2]);
  return absl::OkStatus();
}

// MatMul with a 2-D right operand; the left one's leading dims are rows.
absl::StatusOr<GemmDims> MatMulDims(const Node& node, const Tensor& a, const Tensor& b) {
  if (b.rank() != 2 || a.rank() < 2) {
    return NodeError(node, absl::StrCat("training supports A of rank >= 2 times a 2-D B; got ",
                                        kernels::ShapeToString(a.shape), " x ",
                                        kernels::ShapeToString(b.shape)));
  }
  const int64_t k = a.shape.back();
  if (b.shape[0] != k) {
    return NodeError(
        node, absl::StrCat("inner dimensions differ: A ", kernels::ShapeToString(a.shape), " B ",
                           kernels::ShapeToString(b.shape)));
  }
  return GemmDims{a.size() / k, b.shape[1], k};
}

absl::Status MatMulForward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                           std::vector<Tensor*>& out) {
  absl::StatusOr<GemmDims> d = MatMulDims(node, *in[0], *in[1]);
  if (!d.ok()) return d.status();
  Shape shape = in[0]->shape;
  shape.back() = d->n;
  Resize(out[0], shape);
  Sgemm(false, false, d->m, d->n, d->k, 1.0f, in[0]->data.data(), in[1]->data.data(), 0.0f,
        out[0]->data.data());
  return absl::OkStatus();
}

absl::Status MatMulBackward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                            const std::vector<const Tensor*>&,
                            const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  absl::StatusOr<GemmDims> d = MatMulDims(node, *in[0], *in[1]);
  if (!d.ok()) return d.status();
  const float* dy = gout[0]->data.data();
  if (gin[0] != nullptr) {
    Sgemm(false, true, d->m, d->k, d->n, 1.0f, dy, in[1]->data.data(), 1.0f, gin[0]->data.data());
  }
  if (gin[1] != nullptr) {
    Sgemm(true, false, d->k, d->n, d->m, 1.0f, in[0]->data.data(), dy, 1.0f, gin[1]->data.data());
  }
  return absl::OkStatus();
}

// --- Sub, Mul, Div (broadcasting) ------------------------------------------------
// Calls f(out_index, a_offset, b_offset) over every element of `out`.
template <typename F>
void ForEachBroadcast2(const Shape& a, const Shape& b, const Shape& out, F f) {
  const std::vector<int64_t> sa = BroadcastStrides(a, out), sb = BroadcastStrides(b, out);
  const int64_t n = kernels::NumElements(out);
  const int rank = static_cast<int>(out.size());
  std::vector<int64_t> index(rank, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, oa, ob);
    for (int d = rank - 1; d >= 0; --d) {
      ++index[d];
      oa += sa[d];
      ob += sb[d];
      if (index[d] < out[d]) break;
      oa -= sa[d] * index[d];
      ob -= sb[d] * index[d];
      index[d] = 0;
    }
  }
}

// y = F(a, b); da += dy * dF/da, db += dy * dF/db, each summed over its
// broadcast dimensions.
template <float (*F)(float, float), float (*DA)(float, float), float (*DB)(float, float)>
struct Binary {
  static absl::Status Forward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                              std::vector<Tensor*>& out) {
    absl::StatusOr<Shape> shape = kernels::BroadcastShapes(in[0]->shape, in[1]->shape);
    if (!shape.ok()) return NodeError(node, shape.status().message());
    Resize(out[0], *shape);
    const float* a = in[0]->data.data();
    const float* b = in[1]->data.data();
    float* y = out[0]->data.data();
    ForEachBroadcast2(in[0]->shape, in[1]->shape, *shape,
                      [&](int64_t i, int64_t ia, int64_t ib) { y[i] = F(a[ia], b[ib]); });
    return absl::OkStatus();
  }
  static absl::Status Backward(const Graph&, const Node&, const std::vector<const Tensor*>& in,
                               const std::vector<const Tensor*>& out,
                               const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
    const float* a = in[0]->data.data();
    const float* b = in[1]->data.data();
    const float* dy = gout[0]->data.data();
    float* da = gin[0] != nullptr ? gin[0]->data.data() : nullptr;
    float* db = gin[1] != nullptr ? gin[1]->data.data() : nullptr;
    ForEachBroadcast2(in[0]->shape, in[1]->shape, out[0]->shape,
                      [&](int64_t i, int64_t ia, int64_t ib) {
                        if (da != nullptr) da[ia] += dy[i] * DA(a[ia], b[ib]);
                        if (db != nullptr) db[ib] += dy[i] * DB(a[ia], b[ib]);
                      });
    return absl::OkStatus();
  }
};

float SubF(float a, float b) { return a - b; }
float SubDA(float, float) { return 1.0f; }
float SubDB(float, float) { return -1.0f; }
float MulF(float a, float b) { return a * b; }
float MulDA(float, float b) { return b; }
float MulDB(float a, float) { return a; }
float DivF(float a, float b) { return a / b; }
float DivDA(float, float b) { return 1.0f / b; }
float DivDB(float a, float b) { return -a / (b * b); }

// --- Add ----------------------------------------------------------------------
absl::Status AddForward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                        std::vector<Tensor*>& out) {
  absl::StatusOr<Shape> shape = kernels::BroadcastShapes(in[0]->shape, in[1]->shape);
  if (!shape.ok()) return NodeError(node, shape.status().message());
  Tensor& y = *out[0];
  Resize(&y, *shape);
  for (int k = 0; k < 2; ++k) {
    // The common bias case: a full tensor plus one broadcast row.
    const Tensor& full = *in[k];
    const Tensor& row = *in[1 - k];
    if (full.shape == y.shape && IsRowBroadcast(row.shape, y.shape)) {
      const int64_t cols = y.shape.back(), rows = y.size() / cols;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c)
          y.data[r * cols + c] = full.data[r * cols + c] + row.data[c];
      }
      return absl::OkStatus();
    }
  }
  ForEachBroadcast(in[0]->shape, y.shape,
                   [&](int64_t i, int64_t off) { y.data[i] = in[0]->data[off]; });
  ForEachBroadcast(in[1]->shape, y.shape,
                   [&](int64_t i, int64_t off) { y.data[i] += in[1]->data[off]; });
  return absl::OkStatus();
}

absl::Status AddBackward(const Graph&, const Node&, const std::vector<const Tensor*>&,
                         const std::vector<const Tensor*>&, const std::vector<const Tensor*>& gout,
                         std::vector<Tensor*>& gin) {
  for (int i = 0; i < 2; ++i) {
    if (gin[i] != nullptr) ReduceBroadcastGrad(*gout[0], 1.0f, gin[i]);
  }
  return absl::OkStatus();
}

// --- element-wise activations -------------------------------------------------
// y = f(x); dx += dy * f'(x, y). `alpha` is the node's attribute of that
// name (LeakyRelu's), read once per call rather than once per element.
template <float (*F)(float alpha, float), float (*DF)(float alpha, float x, float y)>
struct Eltwise {
  static absl::Status Forward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                              std::vector<Tensor*>& out) {
    Resize(out[0], in[0]->shape);
    const int64_t n = in[0]->size();
    const float* x = in[0]->data.data();
    float* y = out[0]->data.data();
    const float alpha = node.GetFloat("alpha", 0.01f);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = F(alpha, x[i]);
    return absl::OkStatus();
  }
  static absl::Status Backward(const Graph&, const Node& node, const std::vector<const Tensor*>& in,
                               const std::vector<const Tensor*>& out,
                               const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
    if (gin[0] == nullptr) return absl::OkStatus();
    const int64_t n = in[0]->size();
    const float* x = in[0]->data.data();
    const float* y = out[0]->data.data();
    const float* dy = gout[0]->data.data();
    float* dx = gin[0]->data.data();
    const float alpha = node.GetFloat("alpha", 0.01f);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) dx[i] += dy[i] * DF(alpha, x[i], y[i]);
    return absl::OkStatus();
  }
};

// Relu on its own: the generic backward's dy * f'(x) compiles to a branch
// per element (mispredicted half the time), several times slower than this
// select, which vectorizes because both operands are loaded unconditionally.
absl::Status ReluForward(const Graph&, const Node&, const std::vector<const Tensor*>& in,
                         std::vector<Tensor*>& out) {
  Resize(out[0], in[0]->shape);
  const int64_t n = in[0]->size();
  const float* __restrict x = in[0]->data.data();
  float* __restrict y = out[0]->data.data();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return absl::OkStatus();
}

absl::Status ReluBackward(const Graph&, const Node&, const std::vector<const Tensor*>& in,
                          const std::vector<const Tensor*>&, const std::vector<const Tensor*>& gout,
                          std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  const int64_t n = in[0]->size();
  const float* __restrict x = in[0]->data.data();
  const float* __restrict dy = gout[0]->data.data();
  float* __restrict dx = gin[0]->data.data();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dx[i] = dx[i] + (x[i] > 0.0f ? g : 0.0f);
  }
  return absl::OkStatus();
}

float LeakyReluF(float alpha, float x) { return x >= 0 ? x : alpha * x; }
float LeakyReluD(float alpha, float x, float) { return x >= 0 ? 1.0f : alpha; }
float SigmoidF(float, float x) { return 1.0f / (1.0f + std::exp(-x)); }
float SigmoidD(float, float, float y) { return y * (1.0f - y); }
float TanhF(float, float x) { return std::tanh(x); }
float TanhD(float, float, float y) { return 1.0f - y * y; }
float ErfF(float, float x) { return std::erf(x); }
float ErfD(float, float x, float) { return 1.1283791670955126f * std::exp(-x * x); }  // 2/sqrt(pi)

// --- shape-only ops -------------------------------------------------------------
absl::Status ViewForward(const Graph& graph, const Node& node, const std::vector<const Tensor*>& in,
                         std::vector<Tensor*>& out) {
  Shape shape = in[0]->shape;
  if (node.op_type != "Identity") {
    const engine::OpSchema* schema = engine::FindOpSchema(node.op_type);
    std::vector<const Shape*> shapes = {&in[0]->shape};
    if (node.inputs.size() > 1) shapes.push_back(nullptr);
    absl::StatusOr<std::vector<Shape>> inferred = schema->infer_shapes(graph, node, shapes);
    if (!inferred.ok()) return inferred.status();
    shape = (*inferred)[0];
  }
  out[0]->shape = shape;
  out[0]->data = in[0]->data;
  return absl::OkStatus();
}

absl::Status ViewBackward(const Graph&, const Node&, const std::vector<const Tensor*>&,
                          const std::vector<const Tensor*>&, const std::vector<const Tensor*>& gout,
                          std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  const int64_t n = gout[0]->size();
  for (int64_t i = 0; i < n; ++i) gin[0]->data[i] += gout[0]->data[i];
  return absl::OkStatus();
}

// --- Softmax (not the final one, which is fused with the loss) -------------------
absl::StatusOr<int64_t> SoftmaxRows(const Graph& graph, const Node& node, const Tensor& x) {
  absl::StatusOr<int64_t> axis =
      kernels::NormalizeAxis(engine::GetSoftmaxSemantics(graph, node).axis, x.rank());
  if (!axis.ok()) return NodeError(node, axis.status().message());
  if (*axis != x.rank() - 1) return NodeError(node, "training supports Softmax over the last axis");
  return x.shape.back();
}

absl::Status SoftmaxForward(const Graph& graph, const Node& node,
                            const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<int64_t> c = SoftmaxRows(graph, node, *in[0]);
  if (!c.ok()) return c.status();
  Resize(out[0], in[0]->shape);
  const int64_t rows = in[0]->size() / *c;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = &in[0]->data[r * *c];
    float* y = &out[0]->data[r * *c];
    const float mx = *std::max_element(x, x + *c);
    float sum = 0;
    for (int64_t j = 0; j < *c; ++j) sum += (y[j] = std::exp(x[j] - mx));
    for (int64_t j = 0; j < *c; ++j) y[j] /= sum;
  }
  return absl::OkStatus();
}

absl::Status SoftmaxBackward(const Graph& graph, const Node& node,
                             const std::vector<const Tensor*>& in,
                             const std::vector<const Tensor*>& out,
                             const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  absl::StatusOr<int64_t> c = SoftmaxRows(graph, node, *in[0]);
  if (!c.ok()) return c.status();
  const int64_t rows = in[0]->size() / *c;
  for (int64_t r = 0; r < rows; ++r) {
    const float* y = &out[0]->data[r * *c];
    const float* dy = &gout[0]->data[r * *c];
    float* dx = &gin[0]->data[r * *c];
    float dot = 0;
    for (int64_t j = 0; j < *c; ++j) dot += dy[j] * y[j];
    for (int64_t j = 0; j < *c; ++j) dx[j] += y[j] * (dy[j] - dot);
  }
  return absl::OkStatus();
}

// --- Dropout -------------------------------------------------------------------
// Keep element i of this rank's batch iff hash(seed, step, global index) is
// at least ratio * 2^64; kept elements are scaled by 1 / (1 - ratio).
absl::StatusOr<float> DropoutRatio(const Graph& graph, const Node& node) {
  float ratio = node.GetFloat("ratio", 0.5f);
  if (node.inputs.size() > 1 && node.inputs[1] != engine::kNoValue) {
    const engine::Constant* c = graph.FindConstant(node.inputs[1]);
    if (c == nullptr || c->type != engine::DataType::kFloat32 || c->f32.size() != 1) {
      return NodeError(node, "the ratio must be a constant FP32 scalar (an initializer)");
    }
    ratio = c->f32.data[0];
  }
  if (node.outputs.size() > 1 && node.outputs[1] != engine::kNoValue) {
    return NodeError(node, "the mask output is not supported in training");
  }
  if (ratio < 0 || ratio >= 1)
    return NodeError(node, absl::StrCat("ratio ", ratio, " is not in [0, 1)"));
  return ratio;
}

bool DropoutKeeps(uint64_t seed, int64_t step, int64_t index, float ratio) {
  uint64_t z = seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(step + 1)) ^
               (0xbf58476d1ce4e5b9ULL * static_cast<uint64_t>(index + 1));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 >= ratio;
}

// Applies (or back-propagates through) the mask: out[i] (+)= in[i] * keep / (1 - ratio).
void ApplyDropout(const Tensor& in, float ratio, bool accumulate, Tensor* out) {
  const TrainingContext& ctx = CurrentTrainingContext();
  const int64_t n = in.size();
  const int64_t row = in.rank() > 0 && in.shape[0] > 0 ? n / in.shape[0] : n;
  const int64_t base = ctx.row_offset * row;
  const float scale = 1.0f / (1.0f - ratio);
  const float* x = in.data.data();
  float* y = out->data.data();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float v = DropoutKeeps(ctx.seed, ctx.step, base + i, ratio) ? x[i] * scale : 0.0f;
    y[i] = accumulate ? y[i] + v : v;
  }
}

absl::Status DropoutForward(const Graph& graph, const Node& node,
                            const std::vector<const Tensor*>& in, std::vector<Tensor*>& out) {
  absl::StatusOr<float> ratio = DropoutRatio(graph, node);
  if (!ratio.ok()) return ratio.status();
  if (!InTrainingMode() || *ratio == 0.0f) {
    *out[0] = *in[0];
    return absl::OkStatus();
  }
  Resize(out[0], in[0]->shape);
  ApplyDropout(*in[0], *ratio, false, out[0]);
  return absl::OkStatus();
}

absl::Status DropoutBackward(const Graph& graph, const Node& node,
                             const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                             const std::vector<const Tensor*>& gout, std::vector<Tensor*>& gin) {
  if (gin[0] == nullptr) return absl::OkStatus();
  absl::StatusOr<float> ratio = DropoutRatio(graph, node);
  if (!ratio.ok()) return ratio.status();
  if (*ratio == 0.0f) return ViewBackward(graph, node, {}, {}, gout, gin);
  ApplyDropout(*gout[0], *ratio, true, gin[0]);
  return absl::OkStatus();
}

const TrainingOp kOps[] = {
    {"Gemm", GemmForward, GemmBackward},
    {"MatMul", MatMulForward, MatMulBackward},
    {"Add", AddForward, AddBackward},
    {"Relu", ReluForward, ReluBackward},
    {"LeakyRelu", Eltwise<LeakyReluF, LeakyReluD>::Forward,
     Eltwise<LeakyReluF, LeakyReluD>::Backward},
    {"Sigmoid", Eltwise<SigmoidF, SigmoidD>::Forward, Eltwise<SigmoidF, SigmoidD>::Backward},
    {"Tanh", Eltwise<TanhF, TanhD>::Forward, Eltwise<TanhF, TanhD>::Backward},
    {"Erf", Eltwise<ErfF, ErfD>::Forward, Eltwise<ErfF, ErfD>::Backward},
    {"Sub", Binary<SubF, SubDA, SubDB>::Forward, Binary<SubF, SubDA, SubDB>::Backward},
    {"Mul", Binary<MulF, MulDA, MulDB>::Forward, Binary<MulF, MulDA, MulDB>::Backward},
    {"Div", Binary<DivF, DivDA, DivDB>::Forward, Binary<DivF, DivDA, DivDB>::Backward},
    {"Dropout", DropoutForward, DropoutBackward},
    {"Flatten", ViewForward, ViewBackward},
    {"Reshape", ViewForward, ViewBackward},
    {"Identity", ViewForward, ViewBackward},
    {"Softmax", SoftmaxForward, SoftmaxBackward},
    {"Conv", conv_pool::ConvForward, conv_pool::ConvBackward},
    {"BatchNormalization", batch_norm::Forward, batch_norm::Backward},
    {"LayerNormalization", layer_norm::Forward, layer_norm::Backward},
    {"MaxPool", conv_pool::MaxPoolForward, conv_pool::MaxPoolBackward},
    {"AveragePool", conv_pool::AveragePoolForward, conv_pool::AveragePoolBackward},
    {"GlobalAveragePool", conv_pool::GlobalAveragePoolForward,
     conv_pool::GlobalAveragePoolBackward},
};

}  // namespace

namespace {
thread_local TrainingContext current_context;
}  // namespace

const TrainingContext& CurrentTrainingContext() { return current_context; }
ScopedTrainingContext::ScopedTrainingContext(const TrainingContext& context)
    : previous_(current_context) {
  current_context = context;
}
ScopedTrainingContext::~ScopedTrainingContext() { current_context = previous_; }

const TrainingOp* FindTrainingOp(absl::string_view op_type) {
  for (const TrainingOp& op : kOps) {
    if (op.op_type == op_type) return &op;
  }
  return nullptr;
}

std::string TrainableOpsList() {
  std::vector<std::string> names;
  for (const TrainingOp& op : kOps) names.emplace_back(op.op_type);
  return absl::StrJoin(names, ", ");
}

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           const float* b, float beta, float* c) {
  dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, trans_a ? m : k, b,
             trans_b ? k : n, beta, c, n);
}

LossResult SoftmaxCrossEntropy(const Tensor& logits, const uint8_t* labels, float grad_scale,
                               Tensor* logits_grad) {
  const int64_t rows = logits.shape[0];
  const int64_t c = logits.size() / rows;
  if (logits_grad != nullptr) Resize(logits_grad, logits.shape);
  LossResult result;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = &logits.data[r * c];
    const int64_t best = std::max_element(x, x + c) - x;
    const float mx = x[best];
    double sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(x[j] - mx));
    const double log_sum = std::log(sum);
    result.loss_sum += log_sum - (x[labels[r]] - mx);
    result.correct += best == labels[r] ? 1 : 0;
    if (logits_grad != nullptr) {
      float* g = &logits_grad->data[r * c];
      for (int64_t j = 0; j < c; ++j) {
        const double p = std::exp(static_cast<double>(x[j] - mx) - log_sum);
        g[j] = grad_scale * static_cast<float>(p - (j == labels[r] ? 1.0 : 0.0));
      }
    }
  }
  return result;
}

}  // namespace numaserve::training
