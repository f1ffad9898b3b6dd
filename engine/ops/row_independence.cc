// CheckRowIndependence and DescribeBatching (shape_propagation.h): may
// requests be computed together in one run and their rows scattered back?
#include <algorithm>
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
#include "engine/ops/shape_propagation.h"
#include "kernels/shape_ops.h"

namespace numaserve::engine {
namespace {

// What a value holds, as far as the rows of a batch go.
enum class RowKind {
  kConstant,  // computed from constants alone
  kCount,     // follows the number of rows, not their values (Shape, Size)
  // One axis (`axis`) is the rows, `scale` elements each, one row after
  // another, the whole run of rows `outer` times over: element i along it
  // comes from row (i / scale) % rows alone. A scale or outer above 1 is
  // rows flattened into one axis with other dims ([rows * seq, hidden], or
  // [seq * rows, hidden] from [seq, rows, hidden]). A scale
  // above 1 is rows flattened into one axis with other dims ([rows * seq,
  // hidden] before a Gemm); a Reshape may split them out again.
  kRows,
  kMixed,  // anything else (`why` says where rows met)
  // Index arithmetic as exporters write a padding mask's lookup: along
  // `axis` (of the row count's size) element i is i * `scale` + c, where c
  // does not depend on the rows (Range up to the row count, times a
  // constant, plus constants). To any other op, a count.
  kRowIndex,
};

struct RowState {
  RowKind kind = RowKind::kConstant;
  int axis = -1;
  std::string why;    // kMixed; kRows flattened: "by" the node that flattened them
  int64_t scale = 1;  // kRows, kRowIndex
  int64_t outer = 1;  // kRows
};

// How an op moves rows, for an op with at least one input of kind kRows.
enum class RowRule {
  kElementwise,  // broadcasting element-wise (incl. Expand, Concat, Split, Pad, Tile)
  // Moves elements without combining them along the row axis (Transpose;
  // Reduce*, where reducing the row axis leaves no row axis).
  kPositional,
  kView,       // reinterprets the shape (Reshape, Flatten, Squeeze, Unsqueeze)
  kSoftmax,    // Softmax, LogSoftmax: combines along its axis (and after it, before opset 13)
  kLayerNorm,  // combines along [axis, rank)
  kMatMul,
  kGemm,
  kGather,
  kSlice,
  kPerSample,  // [N, C, ...] ops computing each N apart (Conv, pooling, BatchNormalization, ...)
  kCount,      // Shape, Size
  // Combines or reorders elements along one axis (ArgMax, ArgMin, TopK,
  // CumSum, GatherElements, ScatterElements): rows on that axis meet.
  kAlongAxis,
  kLastTwoAxes,  // Trilu: an element's place in the last two axes decides it
  // Addresses elements by index tuples or contracts any axes (GatherND,
  // ScatterND, Einsum), or carries state along a sequence with the batch
  // on another axis (LSTM, GRU): taken to combine rows.
  kAnyAxes,
};

const std::map<std::string, RowRule>& RowRules() {
  static const auto* rules = [] {
    auto* r = new std::map<std::string, RowRule>();
    const std::pair<const char*, RowRule> kRows[] = {
        {"Abs Acos Acosh Add And Asin Asinh Atan Atanh Cast CastLike Ceil Celu Clip Concat Cos "
         "Cosh Div Dropout Elu Equal Erf Exp Expand Floor Gelu Greater GreaterOrEqual HardSigmoid "
         "HardSwish Identity LeakyRelu Less LessOrEqual Log Max Mean Min Mod Mul Neg Not Or Pad "
         "Pow PRelu Reciprocal Relu Round Selu Sigmoid Sign Sin Sinh Softplus Softsign Split Sqrt "
         "Sub Sum Tan Tanh ThresholdedRelu Tile Where Xor "
         // A per-axis scale along the rows' axis cannot match every row
         // count, so such a model's shapes fail before any rule applies.
         "QuantizeLinear DequantizeLinear",
         RowRule::kElementwise},
        {"Transpose ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
         "ReduceProd ReduceSum ReduceSumSquare ConstantOfShape",
         RowRule::kPositional},
        {"Reshape Flatten Squeeze Unsqueeze", RowRule::kView},
        {"Softmax LogSoftmax", RowRule::kSoftmax},
        {"LayerNormalization", RowRule::kLayerNorm},
        {"MatMul", RowRule::kMatMul},
        {"Gemm", RowRule::kGemm},
        {"Gather", RowRule::kGather},
        {"Slice", RowRule::kSlice},
        {"Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool "
         "BatchNormalization DepthToSpace SpaceToDepth GroupNormalization Resize Upsample",
         RowRule::kPerSample},
        {"Shape Size", RowRule::kCount},
        {"ArgMax ArgMin TopK CumSum GatherElements ScatterElements", RowRule::kAlongAxis},
        {"OneHot Range", RowRule::kPositional},
        {"Trilu", RowRule::kLastTwoAxes},
        {"GatherND ScatterND Einsum LSTM GRU NonZero RoiAlign If Loop", RowRule::kAnyAxes},
    };
    for (const auto& [ops, rule] : kRows) {
      for (absl::string_view op : absl::StrSplit(ops, ' ')) (*r)[std::string(op)] = rule;
    }
    return r;
  }();
  return *rules;
}

// The row counts the shapes are propagated at: an axis is a value's row
// axis when its size is the row count at every one of them.
constexpr int64_t kRowCounts[] = {1, 2, 3};
constexpr size_t kNumCounts = std::size(kRowCounts);
// Shape values are also computed at this many rows: one the same at 1, 2,
// 3 and here is taken not to depend on the rows (a comparison of the count
// with a threshold between would be missed; past this it is not). Where
// the shapes at this count cannot be computed, no value is taken as such.
constexpr int64_t kFarRowCount = 4099;

std::string DescribeShape(const Shape& shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) absl::StrAppend(&out, d ? "," : "", shape[d]);
  return out + "]";
}

int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t d = begin; d < end && d < shape.size(); ++d) p *= shape[d];
  return p;
}

class RowAnalysis {
 public:
  RowAnalysis(const Graph& graph, std::vector<std::vector<Shape>> shapes,
              std::vector<ShapeValues> values)
      : graph_(graph),
        shapes_(std::move(shapes)),
        values_(std::move(values)),
        state_(graph.num_values()) {}

  RowIndependence Run() {
    RowIndependence result;
    bool any_dynamic = false;
    for (ValueId v : graph_.inputs()) {
      const Value& value = graph_.value(v);
      if (!value.shape.empty() && value.shape[0] < 0) {
        any_dynamic = true;
        state_[v] = {RowKind::kRows, 0, ""};
      } else {
        state_[v] = Mixed(absl::StrCat("input '", value.name,
                                       "' has a fixed dim 0, so it cannot be split by rows"));
      }
    }
    if (!any_dynamic) {
      result.reason = "no input has a dynamic dim 0 (the rows)";
      return result;
    }
    for (const Node& node : graph_.nodes()) Visit(node);
    for (ValueId v : graph_.outputs()) {
      const std::string what = absl::StrCat("output '", graph_.value(v).name, "' is ",
                                            DescribeShape(shapes_[kNumCounts - 1][v]), " at ",
                                            kRowCounts[kNumCounts - 1], " rows");
      const RowState& s = state_[v];
      switch (s.kind) {
        case RowKind::kConstant:
          result.reason = absl::StrCat(what, ": it does not depend on the inputs");
          return result;
        case RowKind::kCount:
          result.reason = absl::StrCat(what, ": it depends on the number of rows");
          return result;
        case RowKind::kMixed:
          result.reason = absl::StrCat(what, ": ", s.why);
          return result;
        case RowKind::kRowIndex:
          result.reason = absl::StrCat(what, ": it depends on each row's place in the batch");
          return result;
        case RowKind::kRows:
          break;
      }
      if (s.scale != 1 || s.outer != 1) {
        result.reason = absl::StrCat(what, ": its rows are flattened into axis ", s.axis, " (",
                                     s.scale, " elements each, ", s.outer, " times over) ", s.why);
        return result;
      }
      if (s.axis != 0) {
        result.reason = absl::StrCat(what, ": its rows are on axis ", s.axis, ", not 0");
        return result;
      }
      for (size_t d = 1; d < shapes_[0][v].size(); ++d) {
        for (size_t k = 1; k < kNumCounts; ++k) {
          if (shapes_[k][v][d] != shapes_[0][v][d]) {
            result.reason = absl::StrCat(what, ": its dim ", d, " changes with the rows");
            return result;
          }
        }
      }
    }
    result.independent = true;
    return result;
  }

 private:
  static RowState Mixed(std::string why) { return {RowKind::kMixed, -1, std::move(why)}; }

  // The axes of `v` whose size is the row count times `scale` and
  // `outer` at every count.
  std::vector<int> RowAxes(ValueId v, int64_t scale = 1, int64_t outer = 1) const {
    std::vector<int> axes;
    const size_t rank = shapes_[0][v].size();
    for (size_t d = 0; d < rank; ++d) {
      bool rows = true;
      for (size_t k = 0; k < kNumCounts && rows; ++k) {
        rows = shapes_[k][v].size() == rank && shapes_[k][v][d] == kRowCounts[k] * scale * outer;
      }
      if (rows) axes.push_back(static_cast<int>(d));
    }
    return axes;
  }

  int Rank(ValueId v) const { return static_cast<int>(shapes_[0][v].size()); }

  void Visit(const Node& node) {
    for (ValueId v : node.inputs) {
      if (v != kNoValue && state_[v].kind == RowKind::kMixed) {
        for (ValueId out : node.outputs) state_[out] = state_[v];
        return;
      }
    }
    if (node.outputs.size() == 1) {
      if (std::optional<RowState> s = IndexState(node)) {
        state_[node.outputs[0]] = *std::move(s);
        return;
      }
    }
    bool rows = false, count = false;
    for (ValueId v : node.inputs) {
      if (v == kNoValue) continue;
      const RowState& s = state_[v];
      rows |= s.kind == RowKind::kRows;
      count |= s.kind == RowKind::kCount || s.kind == RowKind::kRowIndex;
    }
    auto it = RowRules().find(node.op_type);
    const bool is_count = it != RowRules().end() && it->second == RowRule::kCount;
    if (is_count || !rows) {
      for (ValueId out : node.outputs) {
        // Shape of rows: a count, unless its elements are the same at
        // every count (a dim other than the rows).
        if ((!rows && !count) || SameAtEveryCount(out)) {
          state_[out] = {RowKind::kConstant, -1, ""};
        } else if (BroadcastsToRows(node) && CountsOnlyShape(node) && RowAxes(out).size() == 1) {
          // Constants broadcast to the rows: every row alike.
          state_[out] = {RowKind::kRows, RowAxes(out)[0], ""};
        } else {
          state_[out] = {RowKind::kCount, -1, ""};
        }
      }
      return;
    }
    if (count && !CountsOnlyShape(node)) {
      for (ValueId out : node.outputs) {
        state_[out] = Mixed(absl::StrCat(node.Describe(),
                                         " combines the number of rows with "
                                         "their values"));
      }
      return;
    }
    if (it == RowRules().end()) {
      for (ValueId out : node.outputs) {
        state_[out] = Mixed(absl::StrCat(node.Describe(),
                                         " has no rule for rows here, so it is taken to combine "
                                         "them"));
      }
      return;
    }
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      state_[node.outputs[j]] = OutputState(node, it->second, j);
    }
  }

  // --- A padding mask looked up by flat index -------------------------------
  // transformers' masks exported by torch.onnx: mask [rows, seq] is
  // flattened to [rows * seq, 1] and gathered at row * seq + position,
  // for the rows 0..rows-1 (Range up to the row count): each row reads its
  // own elements. Shapes and index values are checked at every count.

  // The state of `node`'s one output where it takes part in that pattern.
  std::optional<RowState> IndexState(const Node& node) const {
    const std::string& op = node.op_type;
    const ValueId out = node.outputs[0];
    const std::vector<int> out_axes = RowAxes(out);
    auto kind_of = [&](size_t i) {
      return i < node.inputs.size() && node.inputs[i] != kNoValue ? state_[node.inputs[i]].kind
                                                                  : RowKind::kConstant;
    };
    if (op == "Range" && node.inputs.size() == 3 && ScalarOf(node.inputs[0]) == 0 &&
        ScalarOf(node.inputs[2]) == 1 && IsRowCount(node.inputs[1])) {
      return RowState{RowKind::kRowIndex, 0, "", 1};
    }
    if (node.inputs.empty() || node.inputs[0] == kNoValue) return std::nullopt;
    const ValueId in = node.inputs[0];
    const RowState& first = state_[in];
    if (first.kind == RowKind::kRowIndex && out_axes.size() == 1 &&
        (op == "Unsqueeze" || op == "Reshape" || op == "Squeeze" || op == "Flatten") &&
        CountsOnlyShape(node, /*from=*/1)) {
      // The index's rows, one element each, to one element each again.
      const std::optional<RowState> viewed = ViewedRows(in, first.axis, 1, out);
      if (viewed.has_value() && viewed->scale == 1 && viewed->outer == 1) {
        return RowState{RowKind::kRowIndex, viewed->axis, "", first.scale};
      }
      return std::nullopt;
    }
    if (first.kind == RowKind::kRowIndex && out_axes.size() == 1 && op == "Cast" &&
        IsIndexType(graph_.value(out).type)) {
      return RowState{RowKind::kRowIndex, out_axes[0], "", first.scale};
    }
    if ((op == "Add" || op == "Mul") && node.inputs.size() == 2 && out_axes.size() == 1) {
      const size_t index = kind_of(0) == RowKind::kRowIndex ? 0 : 1;
      const ValueId a = node.inputs[index], b = node.inputs[1 - index];
      if (state_[a].kind != RowKind::kRowIndex || state_[b].kind != RowKind::kConstant ||
          state_[a].axis + (Rank(out) - Rank(a)) != out_axes[0]) {
        return std::nullopt;
      }
      if (op == "Add") return RowState{RowKind::kRowIndex, out_axes[0], "", state_[a].scale};
      const std::optional<int64_t> factor = UniformOf(b);
      if (!factor.has_value() || *factor <= 0) return std::nullopt;
      return RowState{RowKind::kRowIndex, out_axes[0], "", state_[a].scale * *factor};
    }
    if (op == "Gather" && first.kind == RowKind::kRows && first.scale > 1 && first.outer == 1 &&
        kind_of(1) == RowKind::kRowIndex) {
      const RowState& index = state_[node.inputs[1]];
      auto axis = kernels::NormalizeAxis(node.GetInt("axis", 0), Rank(in));
      const int row_axis = first.axis + index.axis;
      if (!axis.ok() || *axis != first.axis || index.scale != first.scale ||
          !IndexWithin(node.inputs[1], first.scale) ||
          std::find(out_axes.begin(), out_axes.end(), row_axis) == out_axes.end()) {
        return std::nullopt;
      }
      return RowState{RowKind::kRows, row_axis, "", 1};
    }
    return std::nullopt;
  }

  // Where a view (Reshape, Flatten, Squeeze, Unsqueeze) puts `in`'s rows
  // (on `axis`, `scale` elements each, `outer` times over). A view keeps
  // the elements' row-major order, in which a row's elements come in runs
  // of `chunk` (scale times the elements after `axis`), the rows in turn.
  // On an axis of `out` with `after` elements after it, where chunk =
  // R * after and the axis holds O * rows * R for one R and O at every
  // count, element i along it is from row (i / R) % rows: the rows are
  // there, R elements each, O times over.
  std::optional<RowState> ViewedRows(ValueId in, int axis, int64_t scale, ValueId out) const {
    for (int a = 0; a < Rank(out); ++a) {
      int64_t r = 0, outer = 0;  // as found at one row
      bool found = true;
      for (size_t k = 0; k < kNumCounts && found; ++k) {
        const Shape& i = shapes_[k][in];
        const Shape& o = shapes_[k][out];
        const int64_t chunk = scale * Product(i, axis + 1, i.size());
        const int64_t after = Product(o, a + 1, o.size());
        const int64_t rows = kRowCounts[k];
        found =
            chunk > 0 && after > 0 && chunk % after == 0 && o[a] % (rows * (chunk / after)) == 0;
        if (!found) break;
        if (k == 0) {
          r = chunk / after;
          outer = o[a] / (rows * r);
        }
        found = outer >= 1 && r == chunk / after && outer == o[a] / (rows * r);
      }
      if (found) return RowState{RowKind::kRows, a, "", r, outer};
    }
    return std::nullopt;
  }

  // Whether `v`'s elements at one row (its c) are all in [0, scale): the
  // index then stays within its own row's elements.
  bool IndexWithin(ValueId v, int64_t scale) const {
    auto it = values_[0].find(v);
    if (it == values_[0].end() || it->second.i64.empty()) return false;
    for (int64_t e : it->second.i64) {
      if (e < 0 || e >= scale) return false;
    }
    return true;
  }

  // Whether `v` is a scalar (or one element) equal to the row count at
  // every count, the far one included.
  bool IsRowCount(ValueId v) const {
    for (size_t k = 0; k < values_.size(); ++k) {
      const int64_t rows = k < kNumCounts ? kRowCounts[k] : kFarRowCount;
      auto it = values_[k].find(v);
      if (it == values_[k].end() || it->second.i64.size() != 1 || it->second.i64[0] != rows) {
        return false;
      }
    }
    return true;
  }

  // The integer every element of the constant `v` holds, if one does.
  std::optional<int64_t> UniformOf(ValueId v) const {
    const Constant* c = graph_.FindConstant(v);
    if (c == nullptr) {
      auto it = values_[0].find(v);
      if (it == values_[0].end()) return std::nullopt;
      c = &it->second;
    }
    if (c->i64.empty() || !IsIndexType(c->type)) return std::nullopt;
    for (int64_t e : c->i64) {
      if (e != c->i64[0]) return std::nullopt;
    }
    return c->i64[0];
  }
  std::optional<int64_t> ScalarOf(ValueId v) const {
    if (v == kNoValue || state_[v].kind != RowKind::kConstant) return std::nullopt;
    const Constant* c = graph_.FindConstant(v);
    if (c != nullptr && c->i64.size() != 1) return std::nullopt;
    return UniformOf(v);
  }
  static bool IsIndexType(DataType t) { return t == DataType::kInt64 || t == DataType::kInt32; }

  // Whether every input of `node` that follows the number of rows only
  // gives its output's shape: Reshape's target, Expand's and
  // ConstantOfShape's shape, Tile's repeats, Pad's pads, Resize's scales
  // and sizes, the axes of Squeeze and Unsqueeze. The rules then see the
  // shapes at each count. (Not Slice's bounds or Gather's indices, nor
  // Range: they pick or make elements by the count.) Inputs before `from`
  // are not looked at.
  bool CountsOnlyShape(const Node& node, size_t from = 0) const {
    static const auto* shape_inputs = new std::map<std::string, std::set<size_t>>{
        {"Reshape", {1}}, {"Expand", {1}},    {"ConstantOfShape", {0}}, {"Tile", {1}},
        {"Pad", {1}},     {"Resize", {2, 3}}, {"Squeeze", {1}},         {"Unsqueeze", {1}}};
    auto it = shape_inputs->find(node.op_type);
    for (size_t i = from; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      if (v == kNoValue ||
          (state_[v].kind != RowKind::kCount && state_[v].kind != RowKind::kRowIndex)) {
        continue;
      }
      if (it == shape_inputs->end() || !it->second.contains(i)) return false;
    }
    return true;
  }

  // ConstantOfShape, Expand and Tile of constants: where they make an
  // axis of the row count's size, each element along it is the same (a
  // size-1 dim broadcast or repeated). Not Pad or Resize: a constant padded
  // or stretched to the row count differs from row to row.
  static bool BroadcastsToRows(const Node& node) {
    return node.op_type == "ConstantOfShape" || node.op_type == "Expand" || node.op_type == "Tile";
  }

  // The axis a kAlongAxis op works along on a rank-`rank` input: its
  // `axis` attribute (TopK's default -1, the others' 0), CumSum's constant
  // second input.
  absl::StatusOr<int> AxisOf(const Node& node, int rank) const {
    int64_t a = node.GetInt("axis", node.op_type == "TopK" ? -1 : 0);
    if (node.op_type == "CumSum") {
      auto given = ops::ConstInts(graph_, node, 1, "axis");
      if (!given.ok()) return given.status();
      const std::optional<std::vector<int64_t>>& values = *given;
      if (!values.has_value() || values->size() != 1) {
        return absl::InvalidArgumentError("sums along an axis given at run time");
      }
      a = (*values)[0];
    }
    auto normalized = kernels::NormalizeAxis(a, rank);
    if (!normalized.ok()) return normalized.status();
    return static_cast<int>(*normalized);
  }

  // A Slice of rows on axis `axis` of its rank-`rank` input: why that
  // combines rows (a step other than 1 on the row axis reorders them), or "".
  std::string SliceCombinesRows(const Node& node, int axis, int rank) const {
    // Starts, axes and steps the graph computes from shapes (half a head,
    // from the head's size) are read as they are at one row, where they are
    // the same at every count.
    ShapeValues same;
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      if (v != kNoValue && !graph_.IsGraphConstant(v) && SameAtEveryCount(v)) {
        same.emplace(v, values_[0].at(v));
      }
    }
    const ScopedShapeValues scope(&graph_, &same);
    auto starts = ops::IntsFromAttrOrInput(graph_, node, "starts", 1);
    auto axes = ops::IntsFromAttrOrInput(graph_, node, "axes", 3);
    auto steps = ops::ConstInts(graph_, node, 4, "steps");
    if (!starts.ok() || !axes.ok() || !steps.ok() || !starts->has_value()) {
      return "slices by runtime values";
    }
    const auto& given_starts = *starts;
    const auto& given_axes = *axes;
    const auto& given_steps = *steps;
    const size_t n = given_starts.has_value() ? given_starts->size() : 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t a = given_axes.has_value() && i < given_axes->size() ? (*given_axes)[i]
                                                                         : static_cast<int64_t>(i);
      auto normalized = kernels::NormalizeAxis(a, rank);
      const int64_t step =
          given_steps.has_value() && i < given_steps->size() ? (*given_steps)[i] : 1;
      if (normalized.ok() && *normalized == axis && step != 1) return "reorders the rows";
    }
    return "";
  }

  // The row input `index` of `node` when its row axis is `axis`: why that
  // combines rows under `rule`, or "" when it does not.
  std::string CombinesRows(const Node& node, RowRule rule, size_t index, int axis, ValueId out,
                           int out_axis) const {
    const ValueId in = node.inputs[index];
    const int rank = Rank(in);
    switch (rule) {
      case RowRule::kElementwise:
        // Broadcasting aligns dims from the right.
        if (axis + (Rank(out) - rank) != out_axis) return "moves the rows to another axis";
        return "";
      case RowRule::kPositional:
      case RowRule::kCount:
      case RowRule::kView:  // OutputState: ViewedRows
        return "";
      case RowRule::kSoftmax: {
        const SoftmaxSemantics sm = GetSoftmaxSemantics(graph_, node);
        auto a = kernels::NormalizeAxis(sm.axis, rank);
        if (!a.ok()) return std::string(a.status().message());
        if (sm.flatten_to_2d ? axis >= *a : axis == *a) return "normalizes over the rows";
        return "";
      }
      case RowRule::kLayerNorm: {
        if (index > 0) {
          return axis + (Rank(out) - rank) != out_axis ? "moves the rows to another axis" : "";
        }
        auto a = kernels::NormalizeAxis(node.GetInt("axis", -1), rank);
        if (!a.ok()) return std::string(a.status().message());
        return axis >= *a ? "normalizes over the rows" : "";
      }
      case RowRule::kMatMul:
        // A [..., M, K] x B [..., K, N]: K is summed over.
        if (index == 0 && (rank == 1 || axis == rank - 1)) return "sums over the rows";
        if (index == 1 && (rank == 1 || axis == rank - 2)) return "sums over the rows";
        return "";
      case RowRule::kGemm:
        if (index == 0 && axis == (node.GetInt("transA", 0) ? 0 : 1)) return "sums over the rows";
        if (index == 1 && axis == (node.GetInt("transB", 0) ? 1 : 0)) return "sums over the rows";
        return "";
      case RowRule::kGather: {
        if (index != 0) return "";
        if (state_[node.inputs[1]].kind == RowKind::kRows) return "picks rows by row values";
        auto a = kernels::NormalizeAxis(node.GetInt("axis", 0), rank);
        if (!a.ok()) return std::string(a.status().message());
        return axis == *a ? "picks among the rows" : "";
      }
      case RowRule::kSlice:
        return index != 0 ? "slices by row values" : SliceCombinesRows(node, axis, rank);
      case RowRule::kAlongAxis: {
        auto a = AxisOf(node, rank);
        if (!a.ok()) return std::string(a.status().message());
        return axis == *a ? "works along the rows' axis" : "";
      }
      case RowRule::kLastTwoAxes:
        return axis >= rank - 2 ? "decides by place within the last two axes, the rows' among them"
                                : "";
      case RowRule::kAnyAxes:
        return "addresses or contracts elements across axes (not analysed for rows)";
      case RowRule::kPerSample:
        if (index != 0) return "takes per-row parameters";
        if (axis != 0 || out_axis != 0) return "computes across the rows of an axis other than N";
        if (node.op_type == "BatchNormalization" && node.GetInt("training_mode", 0) != 0) {
          return "normalizes with statistics over the rows (training mode)";
        }
        return "";
    }
    return "";
  }

  RowState OutputState(const Node& node, RowRule rule, size_t output) const {
    const ValueId out = node.outputs[output];
    if (node.op_type == "MaxPool" && output == 1) {
      return Mixed(absl::StrCat(node.Describe(), " numbers its indices across the rows"));
    }
    // Every input's rows hold as many elements; a view may regroup them.
    int64_t scale = 0, outer = 0;
    std::string flattened;  // by which node, where flattened
    for (ValueId in : node.inputs) {
      if (in == kNoValue || state_[in].kind != RowKind::kRows) continue;
      if (scale != 0 && (state_[in].scale != scale || state_[in].outer != outer)) {
        return Mixed(absl::StrCat(node.Describe(), " pairs rows flattened differently"));
      }
      scale = state_[in].scale;
      outer = state_[in].outer;
      flattened = state_[in].why;
    }
    if (rule == RowRule::kView) {
      const ValueId in = node.inputs[0];
      if (state_[in].kind != RowKind::kRows) {
        return Mixed(absl::StrCat(node.Describe(), " takes its shape from the rows' values"));
      }
      std::optional<RowState> viewed = ViewedRows(in, state_[in].axis, scale, out);
      if (viewed.has_value() && (viewed->scale != 1 || viewed->outer != 1)) {
        viewed->why = viewed->scale == scale && viewed->outer == outer
                          ? flattened
                          : absl::StrCat("by ", node.Describe());
      }
      if (viewed.has_value()) return *viewed;
      return Mixed(absl::StrCat(node.Describe(), " reshapes ", DescribeShape(shapes_[0][in]),
                                " to ", DescribeShape(shapes_[0][out]), " across rows"));
    }
    const std::vector<int> axes = RowAxes(out, scale, outer);
    if (axes.size() != 1) {
      return Mixed(absl::StrCat(node.Describe(),
                                axes.empty() ? " combines the rows" : " pairs rows with rows"));
    }
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId in = node.inputs[i];
      if (in == kNoValue || state_[in].kind != RowKind::kRows) continue;
      std::string why = CombinesRows(node, rule, i, state_[in].axis, out, axes[0]);
      if (!why.empty()) return Mixed(absl::StrCat(node.Describe(), " ", why));
    }
    return {RowKind::kRows, axes[0], flattened, scale, outer};
  }

  // Whether `v` is a shape value with the same elements at every row count
  // (a sequence length read from an input's shape, the positions
  // 0..seq-1): a constant as far as rows go.
  bool SameAtEveryCount(ValueId v) const {
    const Constant* first = nullptr;
    for (const ShapeValues& values : values_) {
      auto it = values.find(v);
      if (it == values.end()) return false;
      if (first == nullptr) {
        first = &it->second;
      } else if (!SameElements(*first, it->second)) {
        return false;
      }
    }
    return first != nullptr;
  }

  static bool SameElements(const Constant& a, const Constant& b) {
    return a.type == b.type && a.shape == b.shape && a.i64 == b.i64 && a.bytes == b.bytes &&
           a.f32.data == b.f32.data;  // NaN != NaN: taken to differ
  }

  const Graph& graph_;
  const std::vector<std::vector<Shape>> shapes_;  // by row count, then ValueId
  // By row count, then kFarRowCount.
  const std::vector<ShapeValues> values_;
  std::vector<RowState> state_;  // by ValueId
};

// Keeps shapes and small constants: shape functions read Reshape's target,
// Slice's starts and the like, never a weight's elements.
constexpr int64_t kShapeConstantElements = 1024;

}  // namespace

bool HasRowRule(const std::string& op_type) { return RowRules().contains(op_type); }

std::vector<std::string> RowRuleOps() {
  std::vector<std::string> ops;
  for (const auto& [op, rule] : RowRules()) ops.push_back(op);
  return ops;
}

absl::StatusOr<RowIndependence> CheckRowIndependence(const Graph& graph) {
  // A shape-polymorphic model is analysed at both probes' other dims (a
  // sequence length of 64, then 96): its rows must stay apart at each.
  const int probes = HasDynamicNonBatchDims(graph) ? 2 : 1;
  RowIndependence result;
  for (int which = 0; which < probes; ++which) {
    std::vector<std::vector<Shape>> shapes;
    const auto inputs_at = [&](int64_t rows) {
      return probes == 1 ? InputShapesForBatch(graph, rows)
                         : ProbeInputShapesAtRows(graph, which, rows);
    };
    std::vector<ShapeValues> values(kNumCounts + 1);
    if (!PropagateShapesAndValues(graph, inputs_at(kFarRowCount), values[kNumCounts]).ok()) {
      values[kNumCounts].clear();
    }
    for (size_t k = 0; k < kNumCounts; ++k) {
      const int64_t rows = kRowCounts[k];
      auto s = PropagateShapesAndValues(graph, inputs_at(rows), values[k]);
      if (!s.ok()) {
        result.independent = false;
        result.reason = absl::StrCat("its shapes cannot be computed at ", rows,
                                     " rows: ", s.status().message());
        return result;
      }
      shapes.push_back(*std::move(s));
    }
    RowIndependence analysed = RowAnalysis(graph, std::move(shapes), std::move(values)).Run();
    if (!analysed.independent) return analysed;
    result = std::move(analysed);
  }
  return result;
}

OutputShapeFn MakeOutputShapeFn(const Graph& graph) {
  auto copy = std::make_shared<Graph>(graph);
  std::vector<ValueId> large;
  for (const auto& [id, c] : copy->constants()) {
    if (kernels::NumElements(c.shape) > kShapeConstantElements) large.push_back(id);
  }
  for (ValueId id : large) {
    const Constant& weights = *copy->FindConstant(id);
    Constant shape_only;
    shape_only.type = weights.type;
    shape_only.shape = weights.shape;
    shape_only.f32.shape = weights.f32.shape;
    copy->SetConstant(id, std::move(shape_only));
  }
  std::shared_ptr<const Graph> shapes_only = std::move(copy);
  return [shapes_only](int64_t rows) -> absl::StatusOr<std::vector<std::vector<int64_t>>> {
    auto shapes = PropagateShapes(*shapes_only, InputShapesForBatch(*shapes_only, rows));
    if (!shapes.ok()) return shapes.status();
    std::vector<std::vector<int64_t>> out;
    for (ValueId v : shapes_only->outputs()) out.push_back((*shapes)[v]);
    return out;
  };
}

absl::Status DescribeBatching(const Graph& graph, ModelInfo* info) {
  // A shape-polymorphic model's requests batch together where their rows
  // stay apart at both probes (CheckRowIndependence); the server stacks
  // only requests whose other dims are equal. Its output shapes follow the
  // whole signature, not a row count.
  const bool polymorphic = HasDynamicNonBatchDims(graph);
  info->output_shapes_at = nullptr;
  auto rows = CheckRowIndependence(graph);
  if (!rows.ok()) return rows.status();
  // Rows of several requests stack only where every input has them: a
  // scalar input, one of fixed first dim, or one whose dim 0 is another
  // named dim (pos [seq, hidden]) has no rows to stack.
  const std::set<std::string> non_batch = NonBatchDimNames(graph);
  bool dynamic = false;
  std::string rowless;
  for (ValueId id : graph.inputs()) {
    const Value& v = graph.value(id);
    const bool rows_dim = !v.shape.empty() && v.shape[0] < 0 && IsBatchDim(v, 0, non_batch);
    dynamic |= rows_dim;
    if (rows_dim || !rowless.empty()) continue;
    rowless = v.shape.empty() || v.shape[0] >= 0
                  ? absl::StrCat("input '", v.name, "' has no dynamic first dim")
                  : absl::StrCat("input '", v.name, "' has no batch dim (its dim 0 is '",
                                 v.dim_names[0], "', a dim other inputs have besides dim 0)");
  }
  info->batched = rows->independent && !info->inputs.empty() && rowless.empty();
  info->unbatched_reason = info->batched || !dynamic ? ""
                           : !rowless.empty()        ? rowless
                                                     : rows->reason;
  bool follows_rows = false;
  for (const TensorInfo& t : info->outputs) {
    for (int64_t d : t.shape) follows_rows |= d < 0;
  }
  info->output_shapes_at = nullptr;
  if (!info->batched && follows_rows && !polymorphic) {
    info->output_shapes_at = MakeOutputShapeFn(graph);
  }
  return absl::OkStatus();
}

}  // namespace numaserve::engine
