// Op table rows for LogSoftmax, LayerNormalization, GroupNormalization and
// the Reduce* family.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "kernels/ref/norm_ref.h"
#include "kernels/ref/softmax_ref.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

// --- LogSoftmax -----------------------------------------------------------------

absl::Status LogSoftmaxValidate(const Graph&, const Node& node) { return CheckArity(node, 1, 1); }

ShapesOr LogSoftmaxShapes(const Graph& graph, const Node& node,
                          const std::vector<const Shape*>& in) {
  const int64_t rank = std::max<int64_t>(static_cast<int64_t>(in[0]->size()), 1);
  auto axis = kernels::NormalizeAxis(GetSoftmaxSemantics(graph, node).axis, rank);
  if (!axis.ok()) return NodeError(node, axis.status().message());
  return std::vector<Shape>{*in[0]};
}

TensorsOr LogSoftmaxReference(const Graph& graph, const Node& node,
                              const std::vector<const Tensor*>& in) {
  const SoftmaxSemantics sm = GetSoftmaxSemantics(graph, node);
  return One(kernels::LogSoftmaxRef(*in[0], sm.axis, sm.flatten_to_2d));
}

// --- LayerNormalization -----------------------------------------------------------

absl::Status LayerNormValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 2, 3, 1, 3); !s.ok()) return s;
  if (node.GetInt("stash_type", 1) != 1) {
    return NodeUnsupported(node, "only stash_type=1 (FP32 statistics) is supported");
  }
  return absl::OkStatus();
}

ShapesOr LayerNormShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  auto axis = kernels::NormalizeAxis(node.GetInt("axis", -1), static_cast<int64_t>(x.size()));
  if (!axis.ok()) return NodeError(node, axis.status().message());
  const Shape norm(x.begin() + *axis, x.end());
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i] == nullptr) continue;
    auto b = kernels::BroadcastShapes(*in[i], norm);
    if (!b.ok() || *b != norm) {
      return NodeError(node, absl::StrCat("scale/bias ", kernels::ShapeToString(*in[i]),
                                          " must broadcast to ", kernels::ShapeToString(norm)));
    }
  }
  Shape stat = x;
  for (size_t d = *axis; d < stat.size(); ++d) stat[d] = 1;
  std::vector<Shape> out = {x};
  for (size_t i = 1; i < node.outputs.size(); ++i) out.push_back(stat);
  return out;
}

TensorsOr LayerNormReference(const Graph&, const Node& node, const std::vector<const Tensor*>& in) {
  kernels::Tensor mean, inv;
  auto y =
      kernels::LayerNormRef(*in[0], *in[1], in.size() > 2 ? in[2] : nullptr,
                            node.GetInt("axis", -1), node.GetFloat("epsilon", 1e-5f), &mean, &inv);
  if (!y.ok()) return NodeError(node, y.status().message());
  std::vector<Tensor> out;
  out.push_back(*std::move(y));
  if (node.outputs.size() > 1) out.push_back(std::move(mean));
  if (node.outputs.size() > 2) out.push_back(std::move(inv));
  return out;
}

// --- GroupNormalization ------------------------------------------------------------
// x [N, C, ...]: the C channels in num_groups groups of C / num_groups,
// each group of each sample normalised over its channels and spatial
// positions, then scaled and shifted: per group at opset 18 (scale and
// bias [num_groups]), per channel from opset 21 ([C]).

absl::Status GroupNormValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 3, 3); !s.ok()) return s;
  if (node.GetInt("num_groups", 0) < 1) {
    return NodeError(node, "num_groups is required and must be at least 1");
  }
  if (node.GetInt("stash_type", 1) != 1) {
    return NodeUnsupported(node, "only stash_type=1 (FP32 statistics) is supported");
  }
  return absl::OkStatus();
}

// The extent scale and bias have: num_groups before opset 21, C from it.
int64_t GroupNormParams(const Graph& graph, const Node& node, int64_t channels) {
  return graph.opset() >= 21 ? channels : node.GetInt("num_groups", 1);
}

ShapesOr GroupNormShapes(const Graph& graph, const Node& node,
                         const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  if (x.size() < 2) return NodeError(node, "x must be [N, C, ...]");
  const int64_t groups = node.GetInt("num_groups", 1);
  if (x[1] % groups != 0) {
    return NodeError(node, absl::StrCat(x[1], " channels do not split into ", groups, " groups"));
  }
  const int64_t params = GroupNormParams(graph, node, x[1]);
  for (size_t i = 1; i <= 2; ++i) {
    if (*in[i] != Shape{params}) {
      return NodeError(node,
                       absl::StrCat(i == 1 ? "scale " : "bias ", kernels::ShapeToString(*in[i]),
                                    " must be [", params, "] at opset ", graph.opset()));
    }
  }
  return std::vector<Shape>{x};
}

TensorsOr GroupNormReference(const Graph& graph, const Node& node,
                             const std::vector<const Tensor*>& in) {
  const Tensor& x = *in[0];
  const int64_t n = x.shape[0], c = x.shape[1];
  const int64_t groups = node.GetInt("num_groups", 1);
  const bool per_channel = GroupNormParams(graph, node, c) == c;
  const double epsilon = node.GetFloat("epsilon", 1e-5f);
  const int64_t spatial = n * c == 0 ? 0 : x.size() / (n * c);
  const int64_t per_group = c / groups * spatial;
  Tensor y(x.shape);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x.data.data() + (s * groups + g) * per_group;
      float* dst = y.data.data() + (s * groups + g) * per_group;
      double sum = 0, squares = 0;
      for (int64_t i = 0; i < per_group; ++i) sum += src[i];
      const double mean = per_group > 0 ? sum / static_cast<double>(per_group) : 0.0;
      for (int64_t i = 0; i < per_group; ++i) squares += (src[i] - mean) * (src[i] - mean);
      const double var = per_group > 0 ? squares / static_cast<double>(per_group) : 0.0;
      const double inv = 1.0 / std::sqrt(var + epsilon);
      for (int64_t i = 0; i < per_group; ++i) {
        const int64_t p = per_channel ? g * (c / groups) + i / spatial : g;
        dst[i] = static_cast<float>((src[i] - mean) * inv * in[1]->data[p] + in[2]->data[p]);
      }
    }
  }
  return One(std::move(y));
}

// --- Reduce* -------------------------------------------------------------------------

struct ReduceRow {
  absl::string_view op;
  kernels::ReduceKind kind;
};

constexpr ReduceRow kReduce[] = {
    {"ReduceSum", kernels::ReduceKind::kSum},
    {"ReduceMean", kernels::ReduceKind::kMean},
    {"ReduceMax", kernels::ReduceKind::kMax},
    {"ReduceMin", kernels::ReduceKind::kMin},
    {"ReduceProd", kernels::ReduceKind::kProd},
    {"ReduceL1", kernels::ReduceKind::kL1},
    {"ReduceL2", kernels::ReduceKind::kL2},
    {"ReduceSumSquare", kernels::ReduceKind::kSumSquare},
    {"ReduceLogSum", kernels::ReduceKind::kLogSum},
    {"ReduceLogSumExp", kernels::ReduceKind::kLogSumExp},
};

struct ReduceSpec {
  std::vector<int64_t> axes;  // normalised; empty = all
  bool noop = false;          // empty axes with noop_with_empty_axes
};

absl::StatusOr<ReduceSpec> ReduceSpecOf(const Graph& graph, const Node& node, int64_t rank) {
  auto axes = IntsFromAttrOrInput(graph, node, "axes", 1);
  if (!axes.ok()) return axes.status();
  ReduceSpec spec;
  const auto& given = *axes;  // no axes, or the axes given
  if (given.has_value() && !given->empty()) {
    auto n = NormalizeAxes(node, *given, rank);
    if (!n.ok()) return n.status();
    spec.axes = *std::move(n);
  } else {
    spec.noop = node.GetInt("noop_with_empty_axes", 0) != 0;
  }
  return spec;
}

absl::Status ReduceValidate(const Graph& graph, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 2); !s.ok()) return s;
  return IntsFromAttrOrInput(graph, node, "axes", 1).status();
}

ShapesOr ReduceShapes(const Graph& graph, const Node& node, const std::vector<const Shape*>& in) {
  const Shape& x = *in[0];
  auto spec = ReduceSpecOf(graph, node, static_cast<int64_t>(x.size()));
  if (!spec.ok()) return spec.status();
  if (spec->noop) return std::vector<Shape>{x};
  const bool keepdims = node.GetInt("keepdims", 1) != 0;
  std::vector<bool> reduced(x.size(), spec->axes.empty());
  for (int64_t a : spec->axes) reduced[a] = true;
  Shape out;
  for (size_t d = 0; d < x.size(); ++d) {
    if (!reduced[d]) {
      out.push_back(x[d]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  return std::vector<Shape>{out};
}

TensorsOr ReduceReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  auto spec = ReduceSpecOf(graph, node, in[0]->rank());
  if (!spec.ok()) return spec.status();
  if (spec->noop) return One(*in[0]);
  kernels::ReduceKind kind = kernels::ReduceKind::kSum;
  for (const ReduceRow& row : kReduce) {
    if (row.op == node.op_type) kind = row.kind;
  }
  return One(kernels::ReduceRef(kind, *in[0], spec->axes, node.GetInt("keepdims", 1) != 0));
}

}  // namespace

void AddNormOps(std::vector<OpSchema>& table) {
  table.push_back(
      {"LogSoftmax", LogSoftmaxValidate, LogSoftmaxShapes, LogSoftmaxReference, NoFlops});
  table.push_back(
      {"LayerNormalization", LayerNormValidate, LayerNormShapes, LayerNormReference, NoFlops});
  table.push_back(
      {"GroupNormalization", GroupNormValidate, GroupNormShapes, GroupNormReference, NoFlops});
  for (const ReduceRow& row : kReduce) {
    table.push_back({row.op, ReduceValidate, ReduceShapes, ReduceReference, NoFlops});
  }
}

}  // namespace numaserve::engine::ops
