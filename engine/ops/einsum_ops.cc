// Op table row for Einsum: any equation of letters and ellipses
// ("bij,bjk->bik", "bhqd,bhkd->bhqk", "ij->ji", "i,i->", "bij->bi", "ii->i",
// "...ij,...jk->...ik"), explicit ("->" and the output's labels) or
// implicit (the ellipsis's dims, then the labels that appear once, in
// alphabetical order). A label repeated within one input takes that input's
// diagonal; every letter has one extent across the inputs, and the dims an
// ellipsis stands for broadcast as NumPy's do. The typed reference sums the
// products over the labels that are not in the output, any numeric element
// type (FP32 sums in double, integers wrap as two's complement). Anything
// else in an equation is refused at load, naming the node and the equation.
#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <type_traits>
#include <utility>
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
// Einsum needs more is refused, at load or for the batch that exceeds it,
// rather than left to run for hours; 1e10 is above attention scores at
// batch 8, 12 heads, 512 tokens).
constexpr double kMaxEinsumWork = 1e10;

// In a parsed term, the place of its ellipsis.
constexpr int kEllipsis = -1;

absl::Status EquationError(const Node& node, const std::string& equation, absl::string_view why) {
  return NodeUnsupported(node, absl::StrCat("equation '", equation, "': ", why));
}

// The labels of TERM (kEllipsis for "..."), ids given in order of first
// appearance; COUNT counts each letter's uses.
absl::StatusOr<std::vector<int>> ParseTerm(const Node& node, const std::string& equation,
                                           absl::string_view term, bool output,
                                           std::array<int, 128>& id, std::array<int, 128>& count,
                                           int& labels) {
  std::vector<int> out;
  bool ellipsis = false;
  for (size_t pos = 0; pos < term.size(); ++pos) {
    if (term.substr(pos, 3) == "...") {
      if (ellipsis) return EquationError(node, equation, "a term has two ellipses");
      ellipsis = true;
      out.push_back(kEllipsis);
      pos += 2;
      continue;
    }
    const unsigned char u = static_cast<unsigned char>(term[pos]);
    if (u >= 128 || !std::isalpha(u)) {
      return EquationError(node, equation,
                           absl::StrCat("'", std::string(1, term[pos]), "' is not a letter"));
    }
    if (output) {
      if (id[u] < 0 || std::find(out.begin(), out.end(), id[u]) != out.end()) {
        return EquationError(node, equation,
                             absl::StrCat("output label '", std::string(1, term[pos]),
                                          "' is not an input label, or is repeated"));
      }
    } else if (id[u] < 0) {
      id[u] = labels++;
    }
    ++count[u];
    out.push_back(id[u]);
  }
  return out;
}

// The equation's terms, an ellipsis kept as kEllipsis (ExpandEllipsis
// replaces it once the ranks are known).
absl::StatusOr<EinsumSpec> ParseEquation(const Node& node) {
  std::string equation;
  for (char c : node.GetString("equation", "")) {
    if (c != ' ') equation.push_back(c);
  }
  if (equation.empty()) return NodeError(node, "equation is required");
  const size_t arrow = equation.find("->");
  std::array<int, 128> id;
  id.fill(-1);
  std::array<int, 128> count{};
  EinsumSpec spec;
  bool any_ellipsis = false;
  for (absl::string_view term : absl::StrSplit(equation.substr(0, arrow), ',')) {
    auto labels = ParseTerm(node, equation, term, false, id, count, spec.labels);
    if (!labels.ok()) return labels.status();
    any_ellipsis |= std::find(labels->begin(), labels->end(), kEllipsis) != labels->end();
    spec.inputs.push_back(*std::move(labels));
  }
  if (spec.inputs.size() != node.inputs.size()) {
    return EquationError(
        node, equation,
        absl::StrCat("it has ", spec.inputs.size(), " terms for ", node.inputs.size(), " inputs"));
  }
  if (arrow == std::string::npos) {
    // The ellipsis's dims, then the labels used once, alphabetically
    // (upper case first, as ASCII orders them).
    if (any_ellipsis) spec.output.push_back(kEllipsis);
    for (int c = 0; c < 128; ++c) {
      if (count[c] == 1) spec.output.push_back(id[c]);
    }
    return spec;
  }
  std::array<int, 128> output_count{};
  auto output =
      ParseTerm(node, equation, equation.substr(arrow + 2), true, id, output_count, spec.labels);
  if (!output.ok()) return output.status();
  spec.output = *std::move(output);
  return spec;
}

absl::Status EinsumValidate(const Graph&, const Node& node) {
  if (absl::Status s = CheckArity(node, 1, 64); !s.ok()) return s;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!HasInput(node, i)) return NodeError(node, "inputs may not be omitted");
  }
  return ParseEquation(node).status();
}

// SPEC with each ellipsis replaced by labels of its own: as many as the
// most dims any input's ellipsis covers, right-aligned (NumPy's
// broadcasting). Without an ellipsis in an explicit output, those dims are
// summed (as NumPy sums them).
absl::StatusOr<EinsumSpec> ExpandEllipsis(const Node& node, EinsumSpec spec,
                                          const std::vector<const Shape*>& in) {
  std::vector<int64_t> covers(spec.inputs.size(), 0);
  int64_t most = 0;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const auto& t = spec.inputs[i];
    const bool has = std::find(t.begin(), t.end(), kEllipsis) != t.end();
    const int64_t letters = static_cast<int64_t>(t.size()) - (has ? 1 : 0);
    const int64_t rank = static_cast<int64_t>(in[i]->size());
    if (has ? rank < letters : rank != letters) {
      return NodeError(
          node, absl::StrCat("input ", i, " is ", kernels::ShapeToString(*in[i]), "; its term has ",
                             letters, " labels", has ? " and an ellipsis" : ""));
    }
    covers[i] = rank - letters;
    most = std::max(most, covers[i]);
  }
  spec.broadcast_from = spec.labels;
  auto expand = [&](std::vector<int>& term, int64_t n) {
    auto at = std::find(term.begin(), term.end(), kEllipsis);
    if (at == term.end()) return;
    std::vector<int> dims;
    for (int64_t j = most - n; j < most; ++j) dims.push_back(spec.broadcast_from + j);
    at = term.erase(at);
    term.insert(at, dims.begin(), dims.end());
  };
  for (size_t i = 0; i < spec.inputs.size(); ++i) expand(spec.inputs[i], covers[i]);
  expand(spec.output, most);
  spec.labels += static_cast<int>(most);
  return spec;
}

// Each label's extent from the inputs' shapes (every occurrence agreeing;
// an ellipsis's extent 1 broadcasts).
absl::StatusOr<std::vector<int64_t>> LabelSizes(const Node& node, const EinsumSpec& spec,
                                                const std::vector<const Shape*>& in) {
  std::vector<int64_t> size(spec.labels, -1);
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    for (size_t d = 0; d < in[i]->size(); ++d) {
      const int label = spec.inputs[i][d];
      const int64_t dim = (*in[i])[d];
      int64_t& s = size[label];
      const bool broadcast = label >= spec.broadcast_from && (s == 1 || dim == 1);
      if (s >= 0 && s != dim && !broadcast) {
        return NodeError(node, absl::StrCat("a label has extents ", s, " and ", dim, " (dim ", d,
                                            " of input ", i, ")"));
      }
      if (s < 0 || s == 1) s = dim;
    }
  }
  return size;
}

// The equation with the ellipsis expanded for these input shapes, and each
// label's extent.
absl::StatusOr<std::pair<EinsumSpec, std::vector<int64_t>>> Resolve(
    const Node& node, const std::vector<const Shape*>& in) {
  auto parsed = ParseEquation(node);
  if (!parsed.ok()) return parsed.status();
  auto spec = ExpandEllipsis(node, *std::move(parsed), in);
  if (!spec.ok()) return spec.status();
  auto size = LabelSizes(node, *spec, in);
  if (!size.ok()) return size.status();
  return std::make_pair(*std::move(spec), *std::move(size));
}

ShapesOr EinsumShapes(const Graph&, const Node& node, const std::vector<const Shape*>& in) {
  auto resolved = Resolve(node, in);
  if (!resolved.ok()) return resolved.status();
  const auto& [spec, size] = *resolved;
  double work = 1;
  for (int64_t s : size) work *= static_cast<double>(s);
  if (work > kMaxEinsumWork) {
    return NodeUnsupported(
        node, absl::StrCat("the contraction takes ", work,
                           " multiply-adds, more than the reference's ", kMaxEinsumWork));
  }
  Shape out;
  for (int label : spec.output) out.push_back(size[label]);
  if (absl::Status s = CheckShape(node, out, "the output"); !s.ok()) return s;
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
      // An ellipsis's dim of extent 1 broadcasts: stride 0.
      if (in[i]->shape[d] == size[spec.inputs[i][d]]) strides[i][spec.inputs[i][d]] += stride;
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
  const auto resolved = *Resolve(node, shapes);
  const EinsumSpec& spec = resolved.first;
  const std::vector<int64_t>& size = resolved.second;
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
  auto resolved = Resolve(node, in);
  if (!resolved.ok()) return 0.0;
  double work = 2.0;
  for (int64_t s : resolved->second) work *= static_cast<double>(s);
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

absl::StatusOr<EinsumSpec> EinsumLabelsOf(const Node& node, const std::vector<const Shape*>& in) {
  auto parsed = ParseEquation(node);
  if (!parsed.ok()) return parsed.status();
  return ExpandEllipsis(node, *std::move(parsed), in);
}

void AddEinsumOps(std::vector<OpSchema>& table) {
  table.push_back({"Einsum", EinsumValidate, EinsumShapes, EinsumReference, EinsumFlops});
  SetTypedRows(table, kEinsumTypedRows);
}

}  // namespace numaserve::engine::ops
