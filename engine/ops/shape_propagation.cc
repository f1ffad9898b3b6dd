#include "engine/ops/shape_propagation.h"

#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/op_util.h"
#include "engine/ops/shape_values.h"
#include "engine/ops/typed_exec.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine {

std::vector<Shape> InputShapesForBatch(const Graph& graph, int64_t batch) {
  std::vector<Shape> shapes;
  for (ValueId id : graph.inputs()) {
    Shape s = graph.value(id).shape;
    for (int64_t& d : s) {
      if (d < 0) d = batch;
    }
    shapes.push_back(std::move(s));
  }
  return shapes;
}

bool HasDynamicNonBatchDims(const Graph& graph) {
  for (ValueId id : graph.inputs()) {
    const Shape& s = graph.value(id).shape;
    for (size_t d = 1; d < s.size(); ++d) {
      if (s[d] < 0) return true;
    }
  }
  return false;
}

std::set<std::string> NonBatchDimNames(const Graph& graph) {
  std::set<std::string> names;
  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    for (size_t d = 1; d < v.dim_names.size() && d < v.shape.size(); ++d) {
      if (v.shape[d] < 0 && !v.dim_names[d].empty()) names.insert(v.dim_names[d]);
    }
  }
  return names;
}

bool IsBatchDim(const Value& v, size_t d, const std::set<std::string>& non_batch_names) {
  if (d != 0) return false;
  return d >= v.dim_names.size() || v.dim_names[d].empty() ||
         !non_batch_names.contains(v.dim_names[d]);
}

namespace {

absl::Status PropagateInto(const Graph& graph, const std::vector<Shape>& input_shapes,
                           ShapeValues& values, std::vector<Shape>& shapes, bool lenient);

// Where an output names a dim as an input's dynamic dim (a decoder's
// attention mask [batch, total_sequence] and its present keys [batch,
// heads, total_sequence, head_dim]) the two are one size in every run, and
// the graph may compute the output's from other dims (past + sequence):
// SHAPES' dims of that name take the size the graph computes, until the
// probe is one the model can run (at most kRounds propagations).
void AlignDimsNamedByOutputs(const Graph& graph, const std::set<std::string>& non_batch,
                             std::vector<Shape>& shapes) {
  constexpr int kRounds = 4;
  std::vector<std::pair<ValueId, size_t>> named;  // outputs' dims of an input's dim name
  for (ValueId id : graph.outputs()) {
    const Value& v = graph.value(id);
    for (size_t d = 0; d < v.dim_names.size(); ++d) {
      if (non_batch.contains(v.dim_names[d])) named.emplace_back(id, d);
    }
  }
  if (named.empty()) return;
  for (int round = 0; round < kRounds; ++round) {
    // Lenient: where the probe is not yet one the model runs (the mask's
    // Mul with the attention scores fails), present's size still computes.
    ShapeValues values;
    std::vector<Shape> computed;
    if (!PropagateInto(graph, shapes, values, computed, /*lenient=*/true).ok()) return;
    std::map<std::string, int64_t> sizes;
    for (const auto& [id, d] : named) {
      const Shape& out = computed[id];
      if (d < out.size() && out[d] > 0) sizes.emplace(graph.value(id).dim_names[d], out[d]);
    }
    bool changed = false;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Value& v = graph.value(graph.inputs()[i]);
      for (size_t d = 0; d < shapes[i].size() && d < v.dim_names.size(); ++d) {
        const auto it = sizes.find(v.dim_names[d]);
        if (v.shape[d] >= 0 || it == sizes.end() || shapes[i][d] == it->second) continue;
        shapes[i][d] = it->second;
        changed = true;
      }
    }
    if (!changed) return;
  }
}

}  // namespace

std::vector<Shape> ProbeInputShapesAtRows(const Graph& graph, int which, int64_t rows) {
  const std::set<std::string> non_batch = NonBatchDimNames(graph);
  std::vector<Shape> shapes;
  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    Shape s = v.shape;
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] < 0) s[d] = IsBatchDim(v, d, non_batch) ? rows : kProbeDims[which];
    }
    shapes.push_back(std::move(s));
  }
  AlignDimsNamedByOutputs(graph, non_batch, shapes);
  return shapes;
}

std::vector<Shape> ProbeInputShapes(const Graph& graph, int which) {
  return ProbeInputShapesAtRows(graph, which, which + 1);
}

namespace {

// "dim 1 ('seq')", "dim 1", "dim 0 (the batch)".
std::string DimLabel(const Value& v, size_t d) {
  const bool named = d < v.dim_names.size() && !v.dim_names[d].empty();
  if (named) return absl::StrCat("dim ", d, " ('", v.dim_names[d], "')");
  return d == 0 ? std::string("dim 0 (the batch)") : absl::StrCat("dim ", d);
}

}  // namespace

std::string DimNameSuffix(const TensorInfo& t, size_t d) {
  return d < t.dim_names.size() && !t.dim_names[d].empty()
             ? absl::StrCat(" ('", t.dim_names[d], "')")
             : std::string();
}

std::string DescribeSignature(const Graph& graph, const std::vector<Shape>& input_shapes) {
  std::string out;
  for (size_t i = 0; i < input_shapes.size() && i < graph.inputs().size(); ++i) {
    absl::StrAppend(&out, i > 0 ? ", " : "", "'", graph.value(graph.inputs()[i]).name, "' ",
                    kernels::ShapeToString(input_shapes[i]));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> CheckSignature(const Graph& graph,
                                                    const std::vector<Shape>& input_shapes) {
  if (input_shapes.size() != graph.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", graph.inputs().size(),
                                                   " input shapes, got ", input_shapes.size()));
  }
  const std::set<std::string> non_batch = NonBatchDimNames(graph);
  std::vector<int64_t> key{-1};
  std::string batch_from;                                        // the input that set key[0]
  std::map<std::string, std::pair<int64_t, std::string>> named;  // name -> size, where set
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    const Value& v = graph.value(graph.inputs()[i]);
    const Shape& want = v.shape;
    const Shape& got = input_shapes[i];
    const std::string input = absl::StrCat("input '", v.name, "'");
    if (got.size() != want.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(input, " has rank ", want.size(), " (", kernels::ShapeToString(want),
                       "), got rank ", got.size(), " (", kernels::ShapeToString(got), ")"));
    }
    for (size_t d = 0; d < want.size(); ++d) {
      const std::string dim = absl::StrCat(input, " ", DimLabel(v, d));
      if (want[d] >= 0) {
        if (got[d] != want[d]) {
          return absl::InvalidArgumentError(
              absl::StrCat(dim, " is fixed at ", want[d], ", got ", got[d]));
        }
        continue;
      }
      if (got[d] < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(dim, " is dynamic: it must be >= 1, got ", got[d]));
      }
      if (got[d] > kernels::kMaxTensorElements) {
        return absl::InvalidArgumentError(absl::StrCat(dim, " is ", got[d], ", above the limit of ",
                                                       kernels::kMaxTensorElements,
                                                       " elements per tensor"));
      }
      if (d < v.dim_names.size() && !v.dim_names[d].empty()) {
        auto [it, inserted] = named.try_emplace(v.dim_names[d], got[d], dim);
        if (!inserted && it->second.first != got[d]) {
          return absl::InvalidArgumentError(absl::StrCat(
              dim, " is ", got[d], " but ", it->second.second, " is ", it->second.first));
        }
      }
      if (IsBatchDim(v, d, non_batch)) {
        if (key[0] >= 0 && key[0] != got[0]) {
          return absl::InvalidArgumentError(
              absl::StrCat(dim, " is ", got[0], " but ", batch_from, " is ", key[0]));
        }
        key[0] = got[0];
        batch_from = dim;
      } else {
        key.push_back(got[d]);
      }
    }
    if (auto n = kernels::NumElementsChecked(got); !n.ok()) {
      // Named by its largest dynamic dim, the one a caller chose.
      size_t largest = 0;
      for (size_t d = 0; d < want.size(); ++d) {
        if (want[d] < 0 && (want[largest] >= 0 || got[d] > got[largest])) largest = d;
      }
      return absl::InvalidArgumentError(absl::StrCat(input, " ", kernels::ShapeToString(got), " (",
                                                     DimLabel(v, largest), " = ", got[largest],
                                                     "): ", n.status().message()));
    }
  }
  if (key[0] < 0) key[0] = 1;
  return key;
}

absl::StatusOr<std::vector<Shape>> PropagateShapes(const Graph& graph,
                                                   const std::vector<Shape>& input_shapes) {
  ShapeValues values;
  return PropagateShapesAndValues(graph, input_shapes, values);
}

namespace {

// PropagateShapesAndValues into SHAPES (by ValueId; empty where not
// computed). LENIENT: a node that cannot be computed (its inputs unknown,
// its shapes refused) is skipped and its outputs stay unknown, so that what
// does not depend on it is still computed; its status is not returned.
absl::Status PropagateInto(const Graph& graph, const std::vector<Shape>& input_shapes,
                           ShapeValues& values, std::vector<Shape>& shapes, bool lenient) {
  values.clear();
  int64_t total = 0;  // elements of VALUES
  const ScopedShapeValues scope(&graph, &values);
  if (input_shapes.size() != graph.inputs().size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", graph.inputs().size(),
                                                   " input shapes, got ", input_shapes.size()));
  }
  shapes.assign(graph.num_values(), Shape());
  std::vector<bool> known(graph.num_values(), false);
  // Every shape is checked (no negative dim, at most kMaxTensorElements
  // elements), so the shape functions' arithmetic on them never overflows
  // and a model claiming a huge tensor is refused, naming the value.
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    if (auto n = kernels::NumElementsChecked(input_shapes[i]); !n.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("input '", graph.value(graph.inputs()[i]).name,
                                                     "': ", n.status().message()));
    }
    shapes[graph.inputs()[i]] = input_shapes[i];
    known[graph.inputs()[i]] = true;
  }
  for (const auto& [id, constant] : graph.constants()) {
    if (auto n = kernels::NumElementsChecked(constant.shape); !n.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("constant '", graph.value(id).name, "': ", n.status().message()));
    }
    shapes[id] = constant.shape;
    known[id] = true;
  }
  for (const Node& node : graph.nodes()) {
    absl::Status failed = absl::OkStatus();
    const OpSchema* schema = FindOpSchema(node.op_type);
    if (schema == nullptr) {
      return absl::UnimplementedError(absl::StrCat(node.Describe(), " is not supported"));
    }
    std::vector<const Shape*> in;
    for (ValueId v : node.inputs) {
      if (v != kNoValue && !known[v] && failed.ok()) {
        failed = absl::InvalidArgumentError(
            absl::StrCat(node.Describe(), ": input '", graph.value(v).name, "' is never computed"));
      }
      in.push_back(v == kNoValue ? nullptr : &shapes[v]);
    }
    if (failed.ok() && ReadsShapeValue(node, values)) failed = schema->validate(graph, node);
    absl::StatusOr<std::vector<Shape>> out = failed.ok()
                                                 ? schema->infer_shapes(graph, node, in)
                                                 : absl::StatusOr<std::vector<Shape>>(failed);
    for (size_t i = 0; out.ok() && i < node.outputs.size() && i < out->size(); ++i) {
      if (auto n = kernels::NumElementsChecked((*out)[i]); !n.ok()) {
        out = absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": output '",
                                                      graph.value(node.outputs[i]).name,
                                                      "': ", n.status().message()));
      }
    }
    if (!out.ok()) {
      if (lenient) continue;
      return out.status();
    }
    for (size_t i = 0; i < node.outputs.size() && i < out->size(); ++i) {
      shapes[node.outputs[i]] = (*out)[i];
      known[node.outputs[i]] = true;
    }
    if (auto computed = ShapeValuesOf(graph, node, *schema, in, *out, values, &total);
        computed.has_value()) {
      for (size_t j = 0; j < node.outputs.size(); ++j) {
        if (graph.IsGraphConstant(node.outputs[j])) continue;
        values.emplace(node.outputs[j], ConstantFromTyped(std::move((*computed)[j])));
      }
    }
  }
  for (ValueId id : graph.outputs()) {
    if (!known[id] && !lenient) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", graph.value(id).name, "' is never computed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Shape>> PropagateShapesAndValues(const Graph& graph,
                                                            const std::vector<Shape>& input_shapes,
                                                            ShapeValues& values) {
  std::vector<Shape> shapes;
  if (absl::Status s = PropagateInto(graph, input_shapes, values, shapes, /*lenient=*/false);
      !s.ok()) {
    return s;
  }
  return shapes;
}

}  // namespace numaserve::engine
