#include "engine/ops/op_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine::ops {

absl::Status NodeError(const Node& node, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(node.Describe(), ": ", message));
}

absl::Status NodeUnsupported(const Node& node, absl::string_view message) {
  return absl::UnimplementedError(absl::StrCat(node.Describe(), ": ", message));
}

absl::Status CheckArity(const Node& node, size_t min_in, size_t max_in, size_t min_out,
                        size_t max_out) {
  if (node.inputs.size() < min_in || node.inputs.size() > max_in ||
      (min_in > 0 && node.inputs[0] == kNoValue)) {
    return NodeError(
        node, absl::StrCat("expects ", min_in, "..", max_in, " inputs, has ", node.inputs.size()));
  }
  if (node.outputs.size() < min_out || node.outputs.size() > max_out) {
    return NodeUnsupported(node, absl::StrCat("supports ", min_out, "..", max_out, " outputs, has ",
                                              node.outputs.size()));
  }
  return absl::OkStatus();
}

TensorsOr One(absl::StatusOr<Tensor> t) {
  if (!t.ok()) return t.status();
  std::vector<Tensor> out;
  out.push_back(*std::move(t));
  return out;
}

TensorsOr One(Tensor t) {
  std::vector<Tensor> out;
  out.push_back(std::move(t));
  return out;
}

double NoFlops(const Node&, const std::vector<const Shape*>&) { return 0.0; }

ShapesOr SameShape(const Graph&, const Node&, const std::vector<const Shape*>& in) {
  return std::vector<Shape>{*in[0]};
}

bool HasInput(const Node& node, size_t index) {
  return node.inputs.size() > index && node.inputs[index] != kNoValue;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> ConstInts(const Graph& graph, const Node& node,
                                                              size_t index,
                                                              absl::string_view what) {
  if (!HasInput(node, index)) return std::nullopt;
  const Constant* c = graph.FindConstant(node.inputs[index]);
  if (c == nullptr) {
    return NodeUnsupported(node, absl::StrCat(what, " (input ", index,
                                              ") must be a constant; runtime values are not "
                                              "supported"));
  }
  if (c->type == DataType::kFloat32) {
    std::vector<int64_t> v;
    for (float f : c->f32.data) v.push_back(static_cast<int64_t>(f));
    return v;
  }
  if (static_cast<int64_t>(c->i64.size()) != kernels::NumElements(c->shape)) {
    return NodeUnsupported(node, absl::StrCat(what, " has an unsupported element type"));
  }
  return c->i64;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> IntsFromAttrOrInput(const Graph& graph,
                                                                        const Node& node,
                                                                        const std::string& attr,
                                                                        size_t index) {
  if (node.HasAttribute(attr)) return node.GetInts(attr, {});
  return ConstInts(graph, node, index, attr);
}

absl::StatusOr<std::optional<std::vector<float>>> ConstFloats(const Graph& graph, const Node& node,
                                                              size_t index,
                                                              absl::string_view what) {
  if (!HasInput(node, index)) return std::nullopt;
  const Constant* c = graph.FindConstant(node.inputs[index]);
  if (c == nullptr) {
    return NodeUnsupported(node, absl::StrCat(what, " (input ", index, ") must be a constant"));
  }
  return c->f32.data;
}

absl::Status CheckShape(const Node& node, const Shape& shape, absl::string_view what) {
  if (auto n = kernels::NumElementsChecked(shape); !n.ok()) {
    return NodeError(node, absl::StrCat(what, ": ", n.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> NodeAdd(const Node& node, int64_t a, int64_t b, absl::string_view what) {
  auto sum = kernels::CheckedAdd(a, b);
  if (!sum.ok()) return NodeError(node, absl::StrCat(what, ": ", sum.status().message()));
  return sum;
}

absl::StatusOr<int64_t> NodeMul(const Node& node, int64_t a, int64_t b, absl::string_view what) {
  auto product = kernels::CheckedMul(a, b);
  if (!product.ok()) return NodeError(node, absl::StrCat(what, ": ", product.status().message()));
  return product;
}

absl::StatusOr<std::vector<int64_t>> NormalizeAxes(const Node& node, std::vector<int64_t> axes,
                                                   int64_t rank) {
  for (int64_t& a : axes) {
    auto n = kernels::NormalizeAxis(a, rank);
    if (!n.ok()) return NodeError(node, n.status().message());
    a = *n;
  }
  return axes;
}

}  // namespace numaserve::engine::ops
