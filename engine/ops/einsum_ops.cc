// Op table row for Einsum: any equation of letters without an ellipsis
// ("bij,bjk->bik", "bhqd,bhkd->bhqk", "ij->ji", "i,i->", "bij->bi", "ii->i"),
// explicit ("->" and the output's labels) or implicit (the labels that
// appear once, in alphabetical order). A label repeated within one input
// takes that input's diagonal; every label has one extent across the
// inputs (no broadcasting). The typed reference sums the products over the
// labels that are not in the output, any numeric element type (FP32 sums
// in double, integers wrap as two's complement). An equation with an
// ellipsis or anything else is refused at load, naming the node and the
// equation.
#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/typed_util.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {
namespace {

// The most multiply-adds the reference does for one node (a model whose
// Einsum needs more is refused rather than left to run for hours).
constexpr double kMaxEinsumWork = 1e12;

struct EinsumSpec {
  std::vector<std::vector<int>> inputs;  // each input's labels, in order
  std::vector<int> output;
  int labels = 0;  // labels are 0..labels-1
};

absl::Status EquationError(const Node& node, const std::string& equation, absl::string_view why) {
  return NodeUnsupported(node, absl::StrCat("equation '", equation, "': ", why));
}

absl::StatusOr<EinsumSpec> ParseEquation(const Node& node) {
  std::string equation;
  for (char c : node.GetString("equation", "")) {
    if (c != ' ') equation.push_back(c);
  }
  if (equation.empty()) return NodeError(node, "equation is required");
  if (equation.find('.') != std::string::npos) {
    return EquationError(node, equation, "an ellipsis (...) is not supported");
  }
  const size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  std::array<int, 128> id;
  id.fill(-1);
  std::array<int, 128> count{};
  EinsumSpec spec;
  for (absl::string_view term : absl::StrSplit(lhs, ',')) {
    std::vector<int>& labels = spec.inputs.emplace_back();
    for (char c : term) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u >= 128 || !std::isalpha(u)) {
        return EquationError(node, equation,
                             absl::StrCat("'", std::string(1, c), "' is not a letter"));
      }
      if (id[u] < 0) id[u] = spec.labels++;
      ++count[u];
      labels.push_back(id[u]);
    }
  }
  if (spec.inputs.size() != node.inputs.size()) {
    return EquationError(
        node, equation,
        absl::StrCat("it has ", spec.inputs.size(), " terms for ", node.inputs.size(), " inputs"));
  }
  if (arrow == std::string::npos) {
    for (int c = 0; c < 128; ++c) {  // alphabetical: upper case first, as ASCII orders them
      if (count[c] == 1) spec.output.push_back(id[c]);
    }
    return spec;
  }
  std::vector<bool> seen(spec.labels, false);
  for (char c : equation.substr(arrow + 2)) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 128 || id[u] < 0 || seen[id[u]]) {
      return EquationError(node, equation,
                           absl::StrCat("output label '", std::string(1, c),
                                        "' is not an input label, or is repeated"));
    }
    seen[id[u]] = true;
    spec.output.push_back(id[u]);
  }
  return spec;
}

absl::Status EinsumValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 64); !s.ok()) return s;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!HasInput(node, i)) return NodeError(node, "inputs may not be omitted");
  }
  return ParseEquation(node).status();
}

// Each label's extent from the inputs' shapes (every occurrence agreeing).
absl::StatusOr<std::vector<int64_t>> LabelSizes(const Node& node, const EinsumSpec& spec,
                                                const std::vector<const Shape*>& in) {
  std::vector<int64_t> size(spec.labels, -1);
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (in[i]->size() != spec.inputs[i].size()) {
      return NodeError(node, absl::StrCat("input ", i, " is ", kernels::ShapeToString(*in[i]),
                                          "; its term has ", spec.inputs[i].size(), " labels"));
    }
    for (size_t d = 0; d < in[i]->size(); ++d) {
      int64_t& s = size[spec.inputs[i][d]];
      if (s >= 0 && s != (*in[i])[d]) {
        return NodeError(node, absl::StrCat("a label has extents ", s, " and ", (*in[i])[d],
                                            " (dim ", d, " of input ", i, ")"));
      }
      s = (*in[i])[d];
    }
  }
  return size;
}

ShapesOr EinsumShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto spec = ParseEquation(node);
  if (!spec.ok()) return spec.status();
  auto size = LabelSizes(node, *spec, in);
  if (!size.ok()) return size.status();
  double work = 1;
  for (int64_t s : *size) work *= static_cast<double>(s);
  if (work > kMaxEinsumWork) {
    return NodeUnsupported(
        node, absl::StrCat("the contraction takes ", work,
                           " multiply-adds, more than the reference's ", kMaxEinsumWork));
  }
  Shape out;
  for (int label : spec->output) out.push_back((*size)[label]);
  return std::vector<Shape>{out};
}

template <typename T>
void EinsumOf(const EinsumSpec& spec, const std::vector<int64_t>& size, const TypedIn& in,
              TypedTensor& y) {
  using C = Compute<T>;
  using Acc = std::conditional_t<std::is_floating_point_v<C>, double, C>;
  // Each input's stride per label (repeated labels add: the diagonal).
  std::vector<std::vector<int64_t>> strides(in.size(), std::vector<int64_t>(spec.labels, 0));
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t stride = 1;
    for (size_t d = spec.inputs[i].size(); d-- > 0;) {
      strides[i][spec.inputs[i][d]] += stride;
      stride *= in[i]->shape[d];
    }
  }
  // The labels in loop order: the output's, then those summed over.
  std::vector<int> order = spec.output;
  for (int l = 0; l < spec.labels; ++l) {
    if (std::find(order.begin(), order.end(), l) == order.end()) order.push_back(l);
  }
  int64_t summed = 1;
  for (size_t k = spec.output.size(); k < order.size(); ++k) summed *= size[order[k]];
  std::vector<int64_t> idx(spec.labels, 0);
  std::vector<int64_t> at(in.size(), 0);
  for (int64_t o = 0; o < y.size(); ++o) {
    Acc acc{};
    for (int64_t s = 0; s < summed; ++s) {
      C p = C(1);
      for (size_t i = 0; i < in.size(); ++i) {
        int64_t offset = 0;
        for (int l = 0; l < spec.labels; ++l) offset += idx[l] * strides[i][l];
        const C v = ToCompute(in[i]->data<T>()[offset]);
        if constexpr (std::is_integral_v<C>) {
          using U = std::make_unsigned_t<C>;
          p = static_cast<C>(static_cast<U>(p) * static_cast<U>(v));
        } else {
          p = p * v;
        }
      }
      if constexpr (std::is_integral_v<C>) {
        using U = std::make_unsigned_t<C>;
        acc = static_cast<C>(static_cast<U>(acc) + static_cast<U>(p));
      } else {
        acc += static_cast<Acc>(p);
      }
      // Next summed index (the last summed label fastest).
      for (size_t k = order.size(); k-- > spec.output.size();) {
        if (++idx[order[k]] < size[order[k]]) break;
        idx[order[k]] = 0;
      }
    }
    y.data<T>()[o] = FromCompute<T>(static_cast<C>(acc));
    for (size_t k = spec.output.size(); k-- > 0;) {
      if (++idx[order[k]] < size[order[k]]) break;
      idx[order[k]] = 0;
    }
  }
}

TypedOr EinsumTyped(const Graph& graph, const Node& node, const TypedIn& in) {
  std::vector<const Shape*> shapes;
  for (const TypedTensor* t : in) {
    if (t == nullptr || t->type != in[0]->type) {
      return NodeError(node, "the inputs must all be present and of one type");
    }
    shapes.push_back(&t->shape);
  }
  auto out = EinsumShapes(graph, node, shapes);
  if (!out.ok()) return out.status();
  const EinsumSpec spec = *ParseEquation(node);
  const std::vector<int64_t> size = *LabelSizes(node, spec, shapes);
  TypedTensor y(in[0]->type, (*out)[0]);
  if (y.size() == 0) return OneT(std::move(y));
  for (const TypedTensor* t : in) {
    if (t->size() == 0) return OneT(std::move(y));  // empty sums: zeros
  }
  VisitType(
      in[0]->type,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (!std::is_same_v<T, bool>) EinsumOf<T>(spec, size, in, y);
      },
      [] {});
  return OneT(std::move(y));
}

TensorsOr EinsumReference(const Graph& graph, const Node& node,
                          const std::vector<const Tensor*>& in) {
  return FloatThroughTyped(graph, node, in, EinsumTyped);
}

double EinsumFlops(const Node& node, const std::vector<const Shape*>& in) {
  auto spec = ParseEquation(node);
  if (!spec.ok()) return 0.0;
  auto size = LabelSizes(node, *spec, in);
  if (!size.ok()) return 0.0;
  double work = 2.0;
  for (int64_t s : *size) work *= static_cast<double>(s);
  return work;
}

absl::Status EinsumAccepts(const Node& node, const Types& in, const Types& out) {
  if (absl::Status s = AllKnown(node, in, out); !s.ok()) return s;
  for (DataType t : in) {
    if (!Numeric(t) || t != in[0]) return Refuse(node, t, "an input (not numeric, or mixed)");
  }
  if (out[0] != in[0]) return Refuse(node, out[0], "the output");
  return absl::OkStatus();
}

const TypedRow kEinsumTypedRows[] = {{"Einsum", EinsumTyped, EinsumAccepts}};

}  // namespace

void AddEinsumOps(std::vector<OpSchema>& table) {
  table.push_back({"Einsum", EinsumValidate, EinsumShapes, EinsumReference, EinsumFlops});
  SetTypedRows(table, kEinsumTypedRows);
}

}  // namespace numaserve::engine::ops
