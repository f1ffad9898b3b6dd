#include "engine/import/constant_folding.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/op_tables.h"
#include "engine/ops/op_util.h"
#include "engine/ops/shape_propagation.h"
#include "engine/ops/typed_exec.h"
#include "kernels/tensor.h"

namespace numaserve::engine {
namespace {

Constant MakeConstant(DataType type, kernels::Tensor t) {
  const DataType to = type == DataType::kUnknown ? DataType::kFloat32 : type;
  if (to == DataType::kFloat32) {
    Constant c;
    c.type = to;
    c.shape = t.shape;
    c.f32 = std::move(t);
    return c;
  }
  // An FP32 reference's result for a non-FP32 value (integers rounded).
  if (IsIntegerType(to) || to == DataType::kBool) {
    for (float& v : t.data) v = std::nearbyint(v);
  }
  return ConstantFromTyped(TypedTensor::FromFloat(t).CastTo(to));
}

// Shape arithmetic is tracked at kFoldSizes sizes of the dynamic dims,
// and folds where it is one value at all of them. The first two set every
// dynamic dim to 1, then 2; the others give each dim its own size (the
// batch one, each dim name one, each unnamed dim besides a dim 0 one), so
// that seq - batch or Equal(seq, past), one value wherever every dim has
// one size, is not folded. The last batch is a far one, so that a
// comparison of the batch with a threshold (Greater(batch, 5)) is not
// folded to its answer at small batches.
constexpr int kFoldSizes = 4;
constexpr int64_t kFarFoldBatch = 4099;

std::vector<Shape> FoldInputShapes(const Graph& graph, int which) {
  if (which < 2) return InputShapesForBatch(graph, which + 1);
  std::set<std::string> non_batch;  // names of dynamic dims besides a dim 0
  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    for (size_t d = 1; d < v.shape.size() && d < v.dim_names.size(); ++d) {
      if (v.shape[d] < 0 && !v.dim_names[d].empty()) non_batch.insert(v.dim_names[d]);
    }
  }
  std::map<std::string, int64_t> sizes;  // by dim class
  const int64_t first = which == 2 ? 40 : 57, step = which == 2 ? 7 : 5;
  std::vector<Shape> shapes;
  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    Shape s = v.shape;
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] >= 0) continue;
      const std::string name = d < v.dim_names.size() ? v.dim_names[d] : "";
      std::string key;
      if (d == 0 && (name.empty() || !non_batch.contains(name))) {
        key = "\n batch";
      } else if (!name.empty()) {
        key = name;
      } else {
        key = absl::StrCat("\n ", v.name, " ", d);
      }
      if (key == "\n batch") {
        s[d] = which == kFoldSizes - 1 ? kFarFoldBatch : which + 1;
        continue;
      }
      auto [it, added] = sizes.try_emplace(key, first + step * static_cast<int64_t>(sizes.size()));
      s[d] = it->second;
    }
    shapes.push_back(std::move(s));
  }
  return shapes;
}

// Shape arithmetic tracked at the fold sizes stays this small.
constexpr int64_t kMaxTrackedElements = 64;

// A folded output may hold this many elements (64 MiB of FP32), or as many
// as the node's constant inputs together (a transposed or scaled weight
// folds at any size). Bigger results (a ConstantOfShape, Expand or Tile
// blowing a few values up) stay nodes and run at run time, so a model
// cannot make the importer allocate what its file does not hold. What
// folds is bounded once more by the graph's budget (FoldBudget).
constexpr int64_t kMaxFoldedElements = int64_t{1} << 24;

// Whether shapes `out` may be folded under `cap` elements in all.
bool FoldableSize(const std::vector<Shape>& out, int64_t cap) {
  int64_t total = 0;
  for (const Shape& shape : out) {
    auto n = kernels::NumElementsChecked(shape);
    if (!n.ok() || __builtin_add_overflow(total, *n, &total) || total > cap) return false;
  }
  return true;
}

// Bytes a folded constant of TYPE holds per element (ConstantFromTyped,
// MakeConstant): its FP32 copy, and for other types its exact elements,
// plus int64 values for integers and BOOL. kUnknown: the most of any type.
int64_t HeldBytesPerElement(DataType type) {
  if (type == DataType::kFloat32) return sizeof(float);
  if (type == DataType::kUnknown) return sizeof(float) + 2 * sizeof(int64_t);
  int64_t bytes = sizeof(float) + static_cast<int64_t>(DataTypeSize(type));
  if (IsIntegerType(type) || type == DataType::kBool) bytes += sizeof(int64_t);
  return bytes;
}

// The most the node's outputs of shapes OUT hold once folded, or nullopt
// when that count is not valid. FP32_REFERENCE: the outputs come from the
// FP32 reference, where an output of unknown type becomes FP32.
std::optional<int64_t> FoldedBytesBound(const Graph& graph, const Node& node,
                                        const std::vector<Shape>& out, bool fp32_reference) {
  int64_t total = 0;
  for (size_t j = 0; j < out.size(); ++j) {
    auto n = kernels::NumElementsChecked(out[j]);
    if (!n.ok()) return std::nullopt;
    DataType type =
        j < node.outputs.size() ? graph.value(node.outputs[j]).type : DataType::kUnknown;
    if (fp32_reference && type == DataType::kUnknown) type = DataType::kFloat32;
    int64_t per_element = HeldBytesPerElement(type);
    // A folded DequantizeLinear also keeps its INT8 values (Int8OriginOf).
    if (node.op_type == "DequantizeLinear") per_element += sizeof(int8_t);
    int64_t bytes = 0;
    if (__builtin_mul_overflow(*n, per_element, &bytes) ||
        __builtin_add_overflow(total, bytes, &total)) {
      return std::nullopt;
    }
  }
  if (node.op_type == "DequantizeLinear" && node.inputs.size() > 1) {
    // ... and a copy of its scales.
    if (const Constant* scale = graph.FindConstant(node.inputs[1]); scale != nullptr) {
      auto n = kernels::NumElementsChecked(scale->shape);
      if (!n.ok() || __builtin_add_overflow(total, *n * int64_t{sizeof(float)}, &total)) {
        return std::nullopt;
      }
    }
  }
  return total;
}

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// What the graph's folded constants hold against its budget: checked
// before each fold allocates, from the output shapes inferred first.
struct FoldBudget {
  int64_t limit = 0;           // FoldOptions::budget_bytes, or the default
  bool by_default = true;      // the limit is DefaultFoldBudgetBytes
  int64_t constant_bytes = 0;  // what the model's own constants hold
  int64_t held = 0;            // what every constant folded so far holds

  bool Fits(int64_t more) const {
    int64_t total = 0;
    return !__builtin_add_overflow(held, more, &total) && total <= limit;
  }

  absl::Status Exceeded(const Node& node, int64_t more) const {
    int64_t total = 0;
    const std::string would =
        __builtin_add_overflow(held, more, &total) ? "more than 8 EiB" : MiB(total);
    const std::string why =
        by_default ? absl::StrCat("the larger of ", MiB(kMinFoldBudgetBytes), " and ",
                                  kFoldBudgetPerConstantByte, " times the ", MiB(constant_bytes),
                                  " the model's own constants hold")
                   : "set by the import options";
    return absl::ResourceExhaustedError(absl::StrCat(
        node.Describe(), ": folding it at load would bring the model's folded constants to ", would,
        " (", MiB(held), " folded before it, ", MiB(more),
        " for its outputs), above the constant folding budget of ", MiB(limit), " (", limit,
        " bytes: ", why, "); the model computes far more from its constants than it holds"));
  }
};

bool ValidShapes(const std::vector<Shape>& shapes) {
  for (const Shape& shape : shapes) {
    if (!kernels::NumElementsChecked(shape).ok()) return false;
  }
  return true;
}

// The node's output shapes, computed from inputs of these shapes, when
// they are small enough to fold (above). Nothing also when the shapes do
// not infer: validation then reports the node.
std::optional<std::vector<Shape>> FoldableOutputs(const Graph& graph, const Node& node,
                                                  const OpSchema& schema,
                                                  const std::vector<const Shape*>& inputs) {
  int64_t cap = kMaxFoldedElements;
  for (const Shape* s : inputs) {
    if (s == nullptr) continue;
    auto n = kernels::NumElementsChecked(*s);
    if (!n.ok()) return std::nullopt;
    cap += *n;  // each at most 2^31: no overflow for any realistic input count
  }
  auto out = schema.infer_shapes(graph, node, inputs);
  if (!out.ok() || !FoldableSize(*out, cap)) return std::nullopt;
  return *std::move(out);
}

// True when the node's constants or outputs are not all FP32: folded
// through the typed reference when the op has one for those types.
bool FoldTyped(const Graph& graph, const Node& node) {
  for (ValueId v : node.inputs) {
    if (v == kNoValue) continue;
    const Constant* c = graph.FindConstant(v);
    if (c != nullptr && c->type != DataType::kFloat32) return true;
  }
  for (ValueId v : node.outputs) {
    if (RuntimeType(graph, v) != DataType::kFloat32) return true;
  }
  return false;
}

// The most that running the node on tracked values (at batch 1 and 2) and
// folding one result holds, or nothing when either run's outputs exceed
// kMaxFoldedElements: from the inferred shapes when they infer without
// constant values, else, for ConstantOfShape (the one op whose typed
// reference sizes its output by its input's values), from those values.
// Any other op whose shapes do not infer fails to run as well (its
// reference reads those values as graph constants): not run.
std::optional<int64_t> TrackedRunBytes(
    const Graph& graph, const Node& node, const OpSchema& schema,
    const std::array<std::vector<const TypedTensor*>, kFoldSizes>& inputs) {
  int64_t most = 0;
  for (const std::vector<const TypedTensor*>& at : inputs) {
    const std::vector<const TypedTensor*>* in = &at;
    std::vector<const Shape*> shapes;
    for (const TypedTensor* t : *in) shapes.push_back(t == nullptr ? nullptr : &t->shape);
    std::vector<Shape> out;
    if (auto inferred = schema.infer_shapes(graph, node, shapes); inferred.ok()) {
      out = *std::move(inferred);
    } else if (node.op_type == "ConstantOfShape" && !in->empty() && (*in)[0] != nullptr) {
      const TypedTensor& dims = *(*in)[0];
      if (!IsIntegerType(dims.type)) return std::nullopt;
      Shape shape;
      for (int64_t i = 0; i < dims.size(); ++i) shape.push_back(dims.GetInt64(i));
      out.push_back(std::move(shape));
    } else {
      return std::nullopt;
    }
    if (!FoldableSize(out, kMaxFoldedElements)) return std::nullopt;
    auto bytes = FoldedBytesBound(graph, node, out, /*fp32_reference=*/false);
    if (!bytes.has_value()) return std::nullopt;
    most = std::max(most, *bytes);
  }
  return most;
}

// Where a folded DequantizeLinear's FP32 result came from, when that is
// INT8 values with an FP32 scale and no or all-zero zero points (the
// result is then exactly values * scale, per tensor or per axis); nullopt
// otherwise.
std::optional<Constant::Int8Origin> Int8OriginOf(const Graph& graph, const Node& node,
                                                 const Constant& folded) {
  if (node.op_type != "DequantizeLinear" || folded.type != DataType::kFloat32) return std::nullopt;
  const Constant* x = graph.FindConstant(node.inputs[0]);
  const Constant* scale = graph.FindConstant(node.inputs[1]);
  if (x == nullptr || scale == nullptr || x->type != DataType::kInt8 ||
      scale->type != DataType::kFloat32) {
    return std::nullopt;
  }
  if (ops::HasInput(node, 2)) {
    const Constant* zp = graph.FindConstant(node.inputs[2]);
    if (zp == nullptr || zp->type != DataType::kInt8 ||
        static_cast<int64_t>(zp->bytes.size()) != kernels::NumElements(zp->shape)) {
      return std::nullopt;
    }
    for (uint8_t v : zp->bytes) {
      if (v != 0) return std::nullopt;
    }
  }
  auto axis = ops::QuantizeAxisOf(node, x->shape, scale->shape);
  if (!axis.ok()) return std::nullopt;
  const int64_t count = kernels::NumElements(x->shape);
  const size_t scales = *axis < 0 ? 1 : static_cast<size_t>(x->shape[*axis]);
  if (x->shape != folded.shape || static_cast<int64_t>(x->bytes.size()) != count ||
      scale->f32.data.size() != scales) {
    return std::nullopt;
  }
  Constant::Int8Origin origin;
  const auto* values = reinterpret_cast<const int8_t*>(x->bytes.data());
  origin.values.assign(values, values + count);
  origin.scales = scale->f32.data;
  origin.axis = *axis;
  return origin;
}

// What FoldConstants knows of the values while it walks the nodes.
struct FoldState {
  // Concrete shapes at the kFoldSizes sizes of the dynamic dims
  // (FoldInputShapes): a value whose shape is the same at all of them does
  // not depend on those dims.
  std::array<std::vector<std::optional<Shape>>, kFoldSizes> at;
  // Small non-FP32 values computed from shapes, at each of those sizes.
  std::vector<std::optional<std::array<TypedTensor, kFoldSizes>>> tracked;

  bool ShapeKnown(ValueId v) const {
    for (const auto& shapes : at) {
      if (!shapes[v].has_value()) return false;
    }
    return true;
  }
};

// Whether the outputs OUT of one node, run at every fold size, are one
// value (then it folds), and each of one output.
bool AllOne(const std::array<absl::StatusOr<std::vector<TypedTensor>>, kFoldSizes>& out) {
  for (const auto& o : out) {
    if (!o.ok() || o->size() != 1) return false;
  }
  return true;
}
bool AllEqual(const std::array<absl::StatusOr<std::vector<TypedTensor>>, kFoldSizes>& out) {
  for (const auto& o : out) {
    if ((*o)[0].shape != (*out[0])[0].shape || (*o)[0].bytes != (*out[0])[0].bytes) return false;
  }
  return true;
}

// The one output of each run, moved into a tracked value.
std::array<TypedTensor, kFoldSizes> Tracked(
    std::array<absl::StatusOr<std::vector<TypedTensor>>, kFoldSizes>& out) {
  std::array<TypedTensor, kFoldSizes> t;
  for (int k = 0; k < kFoldSizes; ++k) t[k] = std::move((*out[k])[0]);
  return t;
}

// A node whose inputs are all constants, run on them: through its typed
// reference when TYPED (exact: integer constants never go through FP32
// here), else its FP32 reference. Nothing when it cannot run.
std::optional<std::vector<Constant>> FoldAllConstant(const Graph& graph, const Node& node,
                                                     const OpSchema& schema, bool typed) {
  std::optional<std::vector<Constant>> result;
  if (typed) {
    std::vector<TypedTensor> held;
    held.reserve(node.inputs.size());
    std::vector<const TypedTensor*> in;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) {
        in.push_back(nullptr);
        continue;
      }
      auto t = ConstantAsTyped(*graph.FindConstant(v));
      if (!t.ok()) return result;
      held.push_back(*std::move(t));
      in.push_back(&held.back());
    }
    if (auto out = RunTypedNode(graph, node, in); out.ok()) {
      result.emplace();
      for (TypedTensor& t : *out) result->push_back(ConstantFromTyped(std::move(t)));
      if (result->size() == 1) {
        (*result)[0].int8_origin = Int8OriginOf(graph, node, (*result)[0]);
      }
    }
    return result;
  }
  std::vector<const kernels::Tensor*> in;
  for (ValueId v : node.inputs) {
    in.push_back(v == kNoValue ? nullptr : &graph.FindConstant(v)->f32);
  }
  if (auto out = schema.reference(graph, node, in); out.ok()) {
    result.emplace();
    for (size_t j = 0; j < out->size() && j < node.outputs.size(); ++j) {
      result->push_back(MakeConstant(graph.value(node.outputs[j]).type, std::move((*out)[j])));
    }
  }
  return result;
}

// Shape or Size of a value whose shape is known at both batch sizes: only
// the shape is read (Size reads the element count). A result that depends
// on the batch is kept at both batch sizes in STATE, so that shape
// arithmetic picking batch-independent dims still folds. Left to run at
// run time when its result (a dim each) would not fit the BUDGET.
std::optional<std::vector<Constant>> FoldShapeRead(const Graph& graph, const Node& node,
                                                   const FoldBudget& budget, FoldState& state) {
  // Views without data: Shape and Size read the shape alone, so a huge
  // shape costs nothing here.
  static const uint8_t kNoData = 0;
  std::array<const Shape*, kFoldSizes> in{};
  for (int k = 0; k < kFoldSizes; ++k) {
    const std::optional<Shape>& shape = state.at[k][node.inputs[0]];
    if (!shape.has_value()) return std::nullopt;
    in[k] = &*shape;
  }
  const Shape out = node.op_type == "Size" ? Shape{} : Shape{static_cast<int64_t>(in[0]->size())};
  auto bytes = FoldedBytesBound(graph, node, {out}, /*fp32_reference=*/false);
  if (!bytes.has_value() || !budget.Fits(*bytes)) return std::nullopt;
  std::array<absl::StatusOr<std::vector<TypedTensor>>, kFoldSizes> runs;
  for (int k = 0; k < kFoldSizes; ++k) {
    const TypedTensor p = TypedTensor::View(DataType::kBool, *in[k], &kNoData);
    runs[k] = RunTypedNode(graph, node, {&p});
  }
  std::optional<std::vector<Constant>> result;
  if (!AllOne(runs)) return result;
  if (AllEqual(runs)) {
    result.emplace();
    result->push_back(ConstantFromTyped(std::move((*runs[0])[0])));
  } else {
    state.tracked[node.outputs[0]] = Tracked(runs);
  }
  return result;
}

// A typed node of one output whose inputs are constants or known at both
// batch sizes (a Shape's output and what is computed from it): the same
// result at both batch sizes folds; a small different one is tracked.
// Left to run at run time when its result would not fit the BUDGET (the
// value may depend on the batch: nothing here says the model is wrong).
std::optional<std::vector<Constant>> FoldTracked(const Graph& graph, const Node& node,
                                                 const OpSchema& schema, const FoldBudget& budget,
                                                 FoldState& state) {
  std::optional<std::vector<Constant>> result;
  std::array<std::vector<const TypedTensor*>, kFoldSizes> in;
  std::vector<TypedTensor> held;
  held.reserve(node.inputs.size());
  bool known = false;  // some input tracked, every other one constant
  for (ValueId v : node.inputs) {
    if (v == kNoValue || graph.IsConstant(v)) continue;
    known = state.tracked[v].has_value();
    if (!known) break;
  }
  if (!known) return result;
  for (ValueId v : node.inputs) {
    if (v == kNoValue) {
      for (auto& at : in) at.push_back(nullptr);
    } else if (const auto& all = state.tracked[v]; all.has_value()) {
      for (int k = 0; k < kFoldSizes; ++k) in[k].push_back(&(*all)[k]);
    } else if (const Constant* c = graph.FindConstant(v); c != nullptr) {
      auto t = ConstantAsTyped(*c);
      if (!t.ok()) return result;
      held.push_back(*std::move(t));
      for (auto& at : in) at.push_back(&held.back());
    } else {
      return result;
    }
  }
  auto bytes = TrackedRunBytes(graph, node, schema, in);
  if (!bytes.has_value() || !budget.Fits(*bytes)) return result;
  std::array<absl::StatusOr<std::vector<TypedTensor>>, kFoldSizes> runs;
  for (int k = 0; k < kFoldSizes; ++k) runs[k] = RunTypedNode(graph, node, in[k]);
  if (!AllOne(runs)) return result;
  if (AllEqual(runs)) {
    result.emplace();
    result->push_back(ConstantFromTyped(std::move((*runs[0])[0])));
  } else if ((*runs[0])[0].size() <= kMaxTrackedElements) {
    state.tracked[node.outputs[0]] = Tracked(runs);
  }
  return result;
}

// The node's outputs become the constants RESULT.
void SetFolded(Graph& graph, const Node& node, std::vector<Constant>& result, FoldState& state) {
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    const ValueId out = node.outputs[j];
    Value& value = graph.value(out);
    value.shape = result[j].shape;
    value.has_shape = true;
    for (auto& at : state.at) at[out] = value.shape;
    graph.SetConstant(out, std::move(result[j]));
    if (value.type == DataType::kUnknown) value.type = graph.FindConstant(out)->type;
  }
}

// The output shapes at every fold size of a node that did not fold.
void PropagateShapes(const Graph& graph, const Node& node, const OpSchema& schema,
                     FoldState& state) {
  for (auto& at : state.at) {
    std::vector<const Shape*> in;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) {
        in.push_back(nullptr);
        continue;
      }
      const std::optional<Shape>& shape = at[v];
      if (!shape.has_value()) return;  // the caller checks: never
      in.push_back(&*shape);
    }
    auto out = schema.infer_shapes(graph, node, in);
    // Shapes that are not valid tensor shapes stay unknown here;
    // validation reports them, naming the node.
    if (!out.ok() || !ValidShapes(*out)) continue;
    for (size_t j = 0; j < node.outputs.size() && j < out->size(); ++j) {
      at[node.outputs[j]] = (*out)[j];
    }
  }
}

// Shape arithmetic whose every use folded (a Shape read only for its
// batch-independent dims) is dead: marked in FOLDED, last first. Returns
// how many.
int DropDeadShapeArithmetic(const Graph& graph, const FoldState& state, std::vector<bool>& folded) {
  std::vector<int> readers(graph.num_values(), 0);
  for (ValueId v : graph.outputs()) ++readers[v];
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    if (folded[i]) continue;
    for (ValueId v : graph.nodes()[i].inputs) {
      if (v != kNoValue) ++readers[v];
    }
  }
  int count = 0;
  for (size_t i = graph.nodes().size(); i-- > 0;) {
    const Node& node = graph.nodes()[i];
    if (folded[i]) continue;
    bool dead = true;
    for (ValueId v : node.outputs) dead = dead && readers[v] == 0 && state.tracked[v].has_value();
    if (!dead) continue;
    folded[i] = true;
    ++count;
    for (ValueId v : node.inputs) {
      if (v != kNoValue) --readers[v];
    }
  }
  return count;
}

}  // namespace

int64_t HeldBytes(const Constant& c) {
  int64_t bytes = static_cast<int64_t>(c.f32.data.size() * sizeof(float) +
                                       c.i64.size() * sizeof(int64_t) + c.bytes.size());
  if (c.int8_origin.has_value()) {
    bytes += static_cast<int64_t>(c.int8_origin->values.size() +
                                  c.int8_origin->scales.size() * sizeof(float));
  }
  return bytes;
}

int64_t DefaultFoldBudgetBytes(int64_t constant_bytes) {
  int64_t scaled = 0;
  if (__builtin_mul_overflow(constant_bytes, kFoldBudgetPerConstantByte, &scaled)) {
    scaled = std::numeric_limits<int64_t>::max();
  }
  return std::max(kMinFoldBudgetBytes, scaled);
}

absl::StatusOr<FoldResult> FoldConstants(Graph& graph, const FoldOptions& options) {
  FoldBudget budget;
  for (const auto& [id, c] : graph.constants()) {
    if (__builtin_add_overflow(budget.constant_bytes, HeldBytes(c), &budget.constant_bytes)) {
      budget.constant_bytes = std::numeric_limits<int64_t>::max();
    }
  }
  budget.by_default = options.budget_bytes <= 0;
  budget.limit =
      budget.by_default ? DefaultFoldBudgetBytes(budget.constant_bytes) : options.budget_bytes;
  const int n = graph.num_values();
  FoldState state;
  state.tracked.resize(n);
  for (int k = 0; k < kFoldSizes; ++k) {
    state.at[k].resize(n);
    const std::vector<Shape> in = FoldInputShapes(graph, k);
    for (size_t i = 0; i < graph.inputs().size(); ++i) state.at[k][graph.inputs()[i]] = in[i];
    for (const auto& [id, c] : graph.constants()) state.at[k][id] = c.shape;
  }
  std::vector<bool> folded(graph.nodes().size(), false);
  int count = 0;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node& node = graph.nodes()[i];
    const OpSchema* schema = FindOpSchema(node.op_type);
    if (schema == nullptr) continue;
    bool all_const = true, shapes_known = true;
    std::vector<const Shape*> const_shapes;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) continue;
      all_const = all_const && graph.IsConstant(v);
      shapes_known = shapes_known && state.ShapeKnown(v);
    }
    if (all_const) {
      for (ValueId v : node.inputs) {
        const_shapes.push_back(v == kNoValue ? nullptr : &graph.FindConstant(v)->shape);
      }
    }
    const bool typed = FoldTyped(graph, node) && schema->typed_reference != nullptr &&
                       CheckTypedNode(graph, node).ok();
    std::optional<std::vector<Constant>> result;
    std::optional<int64_t> fold_bytes;  // set where the node's inputs are all constants
    if (all_const && !node.inputs.empty() && schema->validate(graph, node).ok()) {
      if (auto out = FoldableOutputs(graph, node, *schema, const_shapes); out.has_value()) {
        fold_bytes = FoldedBytesBound(graph, node, *out, /*fp32_reference=*/!typed);
      }
    }
    if (fold_bytes.has_value()) {
      // Its outputs are fixed by the file and within the cap per node (of
      // the order of what its inputs hold): they fold within the budget or
      // the model is refused. Left to run at run time, the same bytes
      // would be taken in every worker, on every request.
      if (!budget.Fits(*fold_bytes)) return budget.Exceeded(node, *fold_bytes);
      result = FoldAllConstant(graph, node, *schema, typed);
    } else if ((node.op_type == "Shape" || node.op_type == "Size") && shapes_known) {
      result = FoldShapeRead(graph, node, budget, state);
    } else if (typed && node.outputs.size() == 1 && schema->validate(graph, node).ok()) {
      result = FoldTracked(graph, node, *schema, budget, state);
    }
    if (result.has_value() && result->size() == node.outputs.size()) {
      for (const Constant& c : *result) budget.held += HeldBytes(c);  // at most the bound checked
      SetFolded(graph, node, *result, state);
      folded[i] = true;
      ++count;
      continue;
    }
    if (shapes_known) PropagateShapes(graph, node, *schema, state);
  }
  count += DropDeadShapeArithmetic(graph, state, folded);
  if (count > 0) {
    std::vector<Node> kept;
    for (size_t i = 0; i < graph.nodes().size(); ++i) {
      if (!folded[i]) kept.push_back(std::move(graph.nodes()[i]));
    }
    graph.nodes() = std::move(kept);
  }
  return FoldResult{.folded_nodes = count,
                    .folded_bytes = budget.held,
                    .constant_bytes = budget.constant_bytes,
                    .budget_bytes = budget.limit};
}

}  // namespace numaserve::engine
