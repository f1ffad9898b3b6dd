// Einsums that are one matrix product, rewritten before lowering as
// Transpose -> MatMul -> Transpose, so that they run on the MatMul steps
// (oneDNN, the GEMM choice, transposes read through strides, the attention
// fusion) instead of the reference's loop over every label.
//
// An equation qualifies when it has two FP32 inputs, no label repeated
// within a term (no diagonals) and no label summed within one input alone,
// and its labels sort into
//   batch: in both inputs and the output,
//   m:     in the first input and the output,
//   n:     in the second input and the output (exactly one),
//   k:     in both inputs, not the output (exactly one, not an ellipsis's),
// with at least one m, and several m only without batch labels (the extra
// m then act as the first input's batch dims, which the second input's
// lack broadcasts over). The first input is permuted to [batch, m, k], the
// second to [batch, k, n], their product [batch, m, n] to the output's
// order: "bhid,bhjd->bhij", "bij,bjk->bik", "ij,jk->ik", "bnd,dh->bnh",
// "...ij,...jk->...ik". Every other equation keeps its Einsum node (the
// reference). Permutations that are the identity add no node; a constant
// input is permuted once, here.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/compiler/compiled_model_impl.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "kernels/ref/layout_ref.h"

namespace numaserve::engine::internal {
namespace {

struct MatMulForm {
  std::vector<int64_t> perm_a, perm_b, perm_out;
};

bool Has(const std::vector<int>& term, int label) {
  return std::find(term.begin(), term.end(), label) != term.end();
}

bool IsIdentity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// Where each of `order`'s labels sits in `term`.
std::vector<int64_t> PermutationTo(const std::vector<int>& term, const std::vector<int>& order) {
  std::vector<int64_t> perm;
  for (int label : order) {
    perm.push_back(std::find(term.begin(), term.end(), label) - term.begin());
  }
  return perm;
}

std::optional<MatMulForm> MatMulFormOf(const ops::EinsumSpec& spec) {
  if (spec.inputs.size() != 2) return std::nullopt;
  const std::vector<int>& a = spec.inputs[0];
  const std::vector<int>& b = spec.inputs[1];
  const std::vector<int>& out = spec.output;
  for (const std::vector<int>* term : {&a, &b}) {
    std::vector<int> sorted = *term;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return std::nullopt;
  }
  std::vector<int> batch, m, n, k;
  for (int label : out) {
    const bool in_a = Has(a, label), in_b = Has(b, label);
    (in_a && in_b ? batch : in_a ? m : n).push_back(label);
  }
  for (int label : a) {
    if (Has(out, label)) continue;
    if (!Has(b, label)) return std::nullopt;  // summed within the first input alone
    k.push_back(label);
  }
  for (int label : b) {
    if (!Has(out, label) && !Has(a, label)) return std::nullopt;
  }
  if (k.size() != 1 || k[0] >= spec.broadcast_from || n.size() != 1 || m.empty() ||
      (m.size() > 1 && !batch.empty())) {
    return std::nullopt;
  }
  std::vector<int> la = batch, lb = batch, product = batch;
  la.insert(la.end(), m.begin(), m.end());
  la.push_back(k[0]);
  lb.push_back(k[0]);
  lb.push_back(n[0]);
  product.insert(product.end(), m.begin(), m.end());
  product.push_back(n[0]);
  return MatMulForm{PermutationTo(a, la), PermutationTo(b, lb), PermutationTo(product, out)};
}

// A fresh value name starting with `stem`.
ValueId NewValue(Graph& graph, const std::string& stem) {
  std::string name = stem;
  for (int i = 1; graph.FindValue(name).has_value(); ++i) name = absl::StrCat(stem, "_", i);
  const ValueId id = graph.GetOrAddValue(name);
  graph.value(id).type = DataType::kFloat32;
  return id;
}

Node TransposeNode(const std::string& name, ValueId in, ValueId out,
                   const std::vector<int64_t>& perm) {
  Node t;
  t.name = name;
  t.op_type = "Transpose";
  t.inputs = {in};
  t.outputs = {out};
  t.attributes["perm"] = perm;
  return t;
}

// `v` permuted by `perm`: itself for the identity, a permuted copy for a
// constant, else a Transpose node's output (appended to `nodes`).
ValueId Permuted(Graph& graph, std::vector<Node>& nodes, const Node& einsum, ValueId v,
                 const std::vector<int64_t>& perm, const char* which) {
  if (IsIdentity(perm)) return v;
  const std::string stem = absl::StrCat(einsum.name, "/", which, "_permuted");
  const ValueId id = NewValue(graph, stem);
  if (const Constant* c = graph.FindConstant(v); c != nullptr) {
    Constant permuted;
    permuted.type = DataType::kFloat32;
    permuted.f32 = kernels::TransposeRef(c->f32, perm);
    permuted.shape = permuted.f32.shape;
    graph.value(id).shape = permuted.shape;
    graph.value(id).has_shape = true;
    graph.SetConstant(id, std::move(permuted));
    return id;
  }
  nodes.push_back(TransposeNode(stem, v, id, perm));
  return id;
}

}  // namespace

absl::Status RewriteEinsumsAsMatMuls(Graph& graph) {
  const auto is_einsum = [](const Node& node) { return node.op_type == "Einsum"; };
  if (std::none_of(graph.nodes().begin(), graph.nodes().end(), is_einsum)) {
    return absl::OkStatus();
  }
  // The ranks place each ellipsis; they are the same at every signature.
  auto shapes = PropagateShapes(graph, ProbeInputShapes(graph, 0));
  if (!shapes.ok()) return shapes.status();
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes().size());
  for (Node& node : graph.nodes()) {
    std::optional<MatMulForm> form;
    if (is_einsum(node) && node.inputs.size() == 2 && !NeedsTypedRun(graph, node) &&
        RuntimeType(graph, node.inputs[0]) == DataType::kFloat32 &&
        RuntimeType(graph, node.inputs[1]) == DataType::kFloat32) {
      auto spec =
          ops::EinsumLabelsOf(node, {&(*shapes)[node.inputs[0]], &(*shapes)[node.inputs[1]]});
      if (spec.ok()) form = MatMulFormOf(*spec);
    }
    if (!form.has_value()) {
      nodes.push_back(std::move(node));
      continue;
    }
    Node matmul;
    matmul.name = node.name;
    matmul.op_type = "MatMul";
    matmul.inputs = {Permuted(graph, nodes, node, node.inputs[0], form->perm_a, "a"),
                     Permuted(graph, nodes, node, node.inputs[1], form->perm_b, "b")};
    const ValueId y = node.outputs[0];
    if (IsIdentity(form->perm_out)) {
      matmul.outputs = {y};
      nodes.push_back(std::move(matmul));
      continue;
    }
    const ValueId product = NewValue(graph, absl::StrCat(node.name, "/product"));
    matmul.outputs = {product};
    nodes.push_back(std::move(matmul));
    nodes.push_back(
        TransposeNode(absl::StrCat(node.name, "/to_output"), product, y, form->perm_out));
  }
  graph.nodes() = std::move(nodes);
  return absl::OkStatus();
}

}  // namespace numaserve::engine::internal
