// Post-training INT8 quantization (engine/quantize/quantize.h), the driver:
// QuantizeModel, choosing the Conv/MatMul/Gemm nodes, the weights' INT8
// form and the QDQ rewrite. Running the calibration model, its statistics
// and the range choices are in quantize_calibration.cc.
#include "engine/quantize/quantize.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/model.h"
#include "engine/quantize/quantize_internal.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

// What quantize_calibration.cc shares (quantize_internal.h).
using quantize_internal::AllReaderPairs;
using quantize_internal::CalibrationRun;
using quantize_internal::ChooseRanges;
using quantize_internal::CollectStats;
using quantize_internal::FloatElements;
using quantize_internal::FoldBatchNorms;
using quantize_internal::GraphIndex;
using quantize_internal::LoadedModel;
using quantize_internal::NameSource;
using quantize_internal::PrefixWithPath;
using quantize_internal::PrepareCalibration;
using quantize_internal::Stats;

namespace quantize_internal {

absl::Status PrefixWithPath(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

// An initializer's FP32 elements, its dims checked against the data it holds.
absl::StatusOr<std::vector<float>> FloatElements(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::FLOAT) {
    return absl::InvalidArgumentError(absl::StrCat("initializer '", t.name(), "' is not FLOAT"));
  }
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer '", t.name(), "' has external data (not supported)"));
  }
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  absl::StatusOr<int64_t> count = kernels::NumElementsChecked(dims);
  if (!count.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer '", t.name(), "': ", count.status().message()));
  }
  std::vector<float> out;
  if (!t.raw_data().empty()) {
    if (t.raw_data().size() != static_cast<uint64_t>(*count) * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("initializer '", t.name(), "' declares ",
                                                     *count, " elements but holds ",
                                                     t.raw_data().size(), " bytes"));
    }
    out.resize(*count);
    if (*count > 0) std::memcpy(out.data(), t.raw_data().data(), t.raw_data().size());
  } else {
    if (t.float_data_size() != *count) {
      return absl::InvalidArgumentError(absl::StrCat("initializer '", t.name(), "' declares ",
                                                     *count, " elements but holds ",
                                                     t.float_data_size()));
    }
    out.assign(t.float_data().begin(), t.float_data().end());
  }
  return out;
}

NameSource::NameSource(const onnx::GraphProto& g) {
  for (const auto& t : g.initializer()) used_.insert(t.name());
  for (const auto& v : g.input()) used_.insert(v.name());
  for (const auto& v : g.output()) used_.insert(v.name());
  for (const auto& n : g.node()) {
    used_.insert(n.name());
    for (const auto& o : n.output()) used_.insert(o);
  }
}

std::string NameSource::Fresh(const std::string& base) {
  std::string name = base;
  for (int i = 1; used_.count(name) != 0; ++i) name = absl::StrCat(base, "_", i);
  used_.insert(name);
  return name;
}

}  // namespace quantize_internal

namespace {

// A weight to quantize: an initializer and the axis of its output channels.
struct WeightUse {
  std::string initializer;
  int64_t axis = 0;
  bool operator<(const WeightUse& o) const {
    return std::tie(initializer, axis) < std::tie(o.initializer, o.axis);
  }
};

// A node to quantize, by index into graph.node.
struct Target {
  int node = 0;
  WeightUse weight;
};

onnx::TensorProto ScalarFloat(const std::string& name, float value) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_float_data(value);
  return t;
}

onnx::TensorProto ScalarUint8(const std::string& name, int32_t value) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::UINT8);
  t.add_int32_data(value);
  return t;
}

}  // namespace

Int8Weights QuantizeWeightsPerChannel(const std::vector<float>& weights,
                                      const std::vector<int64_t>& dims, int64_t axis) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
  for (size_t d = axis + 1; d < dims.size(); ++d) inner *= dims[d];
  const int64_t channels = dims[axis];
  Int8Weights q;
  q.scales.assign(channels, 0.0f);
  q.values.resize(weights.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const float* w = weights.data() + (o * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) q.scales[c] = std::max(q.scales[c], std::fabs(w[i]));
    }
  }
  for (float& s : q.scales) s = s > 0 ? s / 127.0f : 1.0f;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t base = (o * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        const double v = std::nearbyint(static_cast<double>(weights[base + i]) / q.scales[c]);
        q.values[base + i] = static_cast<int8_t>(std::clamp(v, -127.0, 127.0));
      }
    }
  }
  return q;
}

namespace {

// Checks the model (through the engine's own import) and the options, then
// reads the model's protobuf.
absl::StatusOr<LoadedModel> LoadModel(const std::string& model_path,
                                      const QuantizeOptions& options) {
  // The engine's own import checks the file first (a hostile model fails
  // there with the reason); only then is the protobuf taken apart here.
  absl::StatusOr<ModelInfo> info = InspectModel(model_path);
  if (!info.ok()) return info.status();
  if (info->opset < 13) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": opset ", info->opset,
        ": per-channel DequantizeLinear needs opset 13 or later (re-export the model)"));
  }
  if (options.method == CalibrationMethod::kPercentile &&
      !(options.percentile > 50 && options.percentile <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("percentile ", options.percentile, " is not in (50, 100]"));
  }
  LoadedModel loaded;
  {
    std::ifstream file(model_path, std::ios::binary);
    std::stringstream bytes;
    bytes << file.rdbuf();
    if (!file || !loaded.proto.ParseFromString(bytes.str())) {
      return absl::InvalidArgumentError(absl::StrCat(model_path, ": cannot read it again"));
    }
  }
  loaded.info = *std::move(info);
  return loaded;
}

// Indexes `graph`'s initializers, inputs and outputs by name.
GraphIndex IndexGraph(const onnx::GraphProto& graph) {
  GraphIndex index;
  for (int i = 0; i < graph.initializer_size(); ++i)
    index.initializer_index[graph.initializer(i).name()] = i;
  for (const auto& v : graph.input()) index.graph_inputs.insert(v.name());
  for (const auto& v : graph.output()) index.graph_outputs.insert(v.name());
  return index;
}

// Whether node `i` is quantized: its Target (its label added to
// report.quantized), or none (for a Conv, MatMul or Gemm, why in report.skipped).
std::optional<Target> ChooseTarget(const onnx::GraphProto& graph, const GraphIndex& index, int i,
                                   QuantizeReport& report) {
  const onnx::NodeProto& node = graph.node(i);
  const std::string& op = node.op_type();
  if (!node.domain().empty() || (op != "Conv" && op != "MatMul" && op != "Gemm")) {
    return std::nullopt;
  }
  const std::string label =
      absl::StrCat(node.name().empty() ? "(unnamed)" : node.name(), " (", op, ")");
  if (node.input_size() < 2) return std::nullopt;
  auto w = index.initializer_index.find(node.input(1));
  if (w == index.initializer_index.end() || index.graph_inputs.count(node.input(1)) != 0) {
    report.skipped.push_back(absl::StrCat(label, ": its weights are not an initializer"));
    return std::nullopt;
  }
  const onnx::TensorProto& wt = graph.initializer(w->second);
  if (wt.data_type() != onnx::TensorProto::FLOAT) {
    report.skipped.push_back(absl::StrCat(label, ": its weights are not FLOAT"));
    return std::nullopt;
  }
  if (index.initializer_index.count(node.input(0)) != 0) {
    report.skipped.push_back(absl::StrCat(label, ": its input is a constant"));
    return std::nullopt;
  }
  Target t;
  t.node = i;
  t.weight.initializer = wt.name();
  if (op == "Conv") {
    if (wt.dims_size() < 3) {
      report.skipped.push_back(absl::StrCat(label, ": weights of rank ", wt.dims_size()));
      return std::nullopt;
    }
    t.weight.axis = 0;
  } else {
    if (wt.dims_size() != 2) {
      report.skipped.push_back(
          absl::StrCat(label, ": weights of rank ", wt.dims_size(), " (2 is quantized)"));
      return std::nullopt;
    }
    int64_t trans_b = 0;
    for (const auto& a : node.attribute()) {
      if (a.name() == "transB") trans_b = a.i();
    }
    t.weight.axis = op == "Gemm" && trans_b != 0 ? 0 : 1;
  }
  report.quantized.push_back(label);
  return t;
}

// The nodes to quantize and the activations to calibrate.
struct Selection {
  std::vector<Target> targets;
  std::vector<std::string> activations;  // distinct, in order of first use
  // The activations whose every reader reads the dequantized tensor
  // (AllReaderPairs); the others' only the quantized nodes.
  std::set<std::string> all_readers;
};

// Chooses the nodes to quantize, in graph order, and the activations they
// read; INVALID_ARGUMENT when there is none.
absl::StatusOr<Selection> SelectTargets(const std::string& model_path,
                                        const onnx::GraphProto& graph, const GraphIndex& index,
                                        QuantizeReport& report) {
  Selection selection;
  std::map<std::string, size_t> activation_index;
  for (int i = 0; i < graph.node_size(); ++i) {
    std::optional<Target> t = ChooseTarget(graph, index, i, report);
    if (!t.has_value()) continue;
    selection.targets.push_back(*t);
    const std::string& input = graph.node(i).input(0);
    if (activation_index.emplace(input, selection.activations.size()).second) {
      selection.activations.push_back(input);
    }
  }
  if (selection.targets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": no Conv, MatMul or Gemm with FP32 initializer weights to quantize"));
  }
  std::vector<int> nodes;
  for (const Target& t : selection.targets) nodes.push_back(t.node);
  selection.all_readers = AllReaderPairs(graph, index, nodes, selection.activations);
  return selection;
}

// What the QDQ graph adds: the weights' DequantizeLinear nodes, each
// activation's QuantizeLinear -> DequantizeLinear, their initializers, and
// the dequantized tensors the quantized nodes read instead.
struct QdqParts {
  std::map<WeightUse, std::string> dequantized_weight;
  std::vector<onnx::NodeProto> weight_nodes;
  std::vector<onnx::TensorProto> new_initializers;
  std::map<std::string, std::vector<onnx::NodeProto>> qdq_after;  // by the activation
  std::map<std::string, std::string> dequantized_activation;
};

// Adds the initializer `wt` as INT8 per channel along `axis` behind a
// DequantizeLinear to `parts`; the name of the dequantized tensor.
absl::StatusOr<std::string> DequantizeWeight(const std::string& model_path,
                                             const onnx::TensorProto& wt, int64_t weight_axis,
                                             NameSource& names, QdqParts& parts) {
  absl::StatusOr<std::vector<float>> w = FloatElements(wt);
  if (!w.ok()) return PrefixWithPath(model_path, w.status());
  std::vector<int64_t> dims(wt.dims().begin(), wt.dims().end());
  for (float v : *w) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": initializer '", wt.name(), "' holds NaN or infinite values"));
    }
  }
  Int8Weights q = QuantizeWeightsPerChannel(*w, dims, weight_axis);
  const std::string& base = wt.name();
  onnx::TensorProto values;
  values.set_name(names.Fresh(base + "_quantized"));
  values.set_data_type(onnx::TensorProto::INT8);
  for (int64_t d : dims) values.add_dims(d);
  values.set_raw_data(std::string(reinterpret_cast<const char*>(q.values.data()), q.values.size()));
  onnx::TensorProto scales;
  scales.set_name(names.Fresh(base + "_scale"));
  scales.set_data_type(onnx::TensorProto::FLOAT);
  scales.add_dims(static_cast<int64_t>(q.scales.size()));
  for (float s : q.scales) scales.add_float_data(s);
  onnx::TensorProto zero_points;
  zero_points.set_name(names.Fresh(base + "_zero_point"));
  zero_points.set_data_type(onnx::TensorProto::INT8);
  zero_points.add_dims(static_cast<int64_t>(q.scales.size()));
  for (size_t c = 0; c < q.scales.size(); ++c) zero_points.add_int32_data(0);
  onnx::NodeProto dq;
  dq.set_op_type("DequantizeLinear");
  dq.set_name(names.Fresh(base + "_DequantizeLinear"));
  dq.add_input(values.name());
  dq.add_input(scales.name());
  dq.add_input(zero_points.name());
  std::string out = names.Fresh(base + "_dequantized");
  dq.add_output(out);
  onnx::AttributeProto* axis = dq.add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(weight_axis);
  parts.weight_nodes.push_back(std::move(dq));
  parts.new_initializers.push_back(std::move(values));
  parts.new_initializers.push_back(std::move(scales));
  parts.new_initializers.push_back(std::move(zero_points));
  return out;
}

// Adds activation `a`'s QuantizeLinear -> DequantizeLinear with the UINT8
// parameters of `r` to `parts`.
void QuantizeActivation(const std::string& a, const ActivationRange& r, NameSource& names,
                        QdqParts& parts) {
  const std::string scale = names.Fresh(a + "_scale");
  const std::string zero_point = names.Fresh(a + "_zero_point");
  parts.new_initializers.push_back(ScalarFloat(scale, r.scale));
  parts.new_initializers.push_back(ScalarUint8(zero_point, r.zero_point));
  onnx::NodeProto q;
  q.set_op_type("QuantizeLinear");
  q.set_name(names.Fresh(a + "_QuantizeLinear"));
  q.add_input(a);
  q.add_input(scale);
  q.add_input(zero_point);
  const std::string quantized = names.Fresh(a + "_quantized");
  q.add_output(quantized);
  onnx::NodeProto dq;
  dq.set_op_type("DequantizeLinear");
  dq.set_name(names.Fresh(a + "_DequantizeLinear"));
  dq.add_input(quantized);
  dq.add_input(scale);
  dq.add_input(zero_point);
  const std::string dequantized = names.Fresh(a + "_dequantized");
  dq.add_output(dequantized);
  parts.qdq_after[a] = {std::move(q), std::move(dq)};
  parts.dequantized_activation[a] = dequantized;
}

// The QDQ graph's new nodes and initializers: one DequantizeLinear per
// distinct weight and axis, then Q -> DQ for each activation.
absl::StatusOr<QdqParts> BuildQdqParts(const std::string& model_path, const onnx::GraphProto& graph,
                                       const GraphIndex& index, const Selection& selection,
                                       const std::map<std::string, ActivationRange>& ranges) {
  NameSource names(graph);
  QdqParts parts;
  for (const Target& t : selection.targets) {
    if (parts.dequantized_weight.count(t.weight) != 0) continue;
    const onnx::TensorProto& wt =
        graph.initializer(index.initializer_index.at(t.weight.initializer));
    absl::StatusOr<std::string> out = DequantizeWeight(model_path, wt, t.weight.axis, names, parts);
    if (!out.ok()) return out.status();
    parts.dequantized_weight[t.weight] = *out;
  }
  // Q -> DQ for each activation.
  for (const std::string& a : selection.activations) {
    QuantizeActivation(a, ranges.at(a), names, parts);
  }
  return parts;
}

// The QDQ graph's nodes, in the order QuantizeModel's comment gives, the
// quantized nodes reading the dequantized tensors.
std::vector<onnx::NodeProto> OrderNodes(const onnx::GraphProto& graph, const GraphIndex& index,
                                        const Selection& selection, const QdqParts& parts) {
  std::map<int, const Target*> target_of;
  for (const Target& t : selection.targets) target_of[t.node] = &t;
  std::vector<onnx::NodeProto> nodes = parts.weight_nodes;
  for (const auto& [a, qdq] : parts.qdq_after) {
    if (index.graph_inputs.count(a) != 0 || index.initializer_index.count(a) != 0) {
      nodes.insert(nodes.end(), qdq.begin(), qdq.end());
    }
  }
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto node = graph.node(i);
    for (int k = 0; k < node.input_size(); ++k) {
      if (selection.all_readers.count(node.input(k)) != 0) {
        node.set_input(k, parts.dequantized_activation.at(node.input(k)));
      }
    }
    if (auto t = target_of.find(i); t != target_of.end()) {
      node.set_input(0, parts.dequantized_activation.at(graph.node(i).input(0)));
      node.set_input(1, parts.dequantized_weight.at(t->second->weight));
    }
    nodes.push_back(node);
    for (const std::string& o : graph.node(i).output()) {
      if (auto q = parts.qdq_after.find(o); q != parts.qdq_after.end()) {
        nodes.insert(nodes.end(), q->second.begin(), q->second.end());
      }
    }
  }
  return nodes;
}

// `graph` with `nodes` in place of its own and the new initializers added,
// less what no node reads any more and all value_info.
onnx::GraphProto RebuildGraph(const onnx::GraphProto& graph, const GraphIndex& index,
                              std::vector<onnx::NodeProto> nodes,
                              std::vector<onnx::TensorProto> new_initializers) {
  // FP32 weights no node reads any more leave the file.
  std::set<std::string> still_read;
  for (const onnx::NodeProto& n : nodes) {
    for (const std::string& in : n.input()) still_read.insert(in);
  }
  for (const auto& v : graph.output()) still_read.insert(v.name());
  onnx::GraphProto rebuilt = graph;
  rebuilt.clear_node();
  for (onnx::NodeProto& n : nodes) *rebuilt.add_node() = std::move(n);
  rebuilt.clear_initializer();
  for (const onnx::TensorProto& t : graph.initializer()) {
    if (still_read.count(t.name()) != 0) *rebuilt.add_initializer() = t;
  }
  for (onnx::TensorProto& t : new_initializers) *rebuilt.add_initializer() = std::move(t);
  rebuilt.clear_input();
  for (const auto& v : graph.input()) {
    if (index.initializer_index.count(v.name()) == 0 || still_read.count(v.name()) != 0) {
      *rebuilt.add_input() = v;
    }
  }
  // Shapes of the FP32 weights that left are stale: drop all value_info
  // (shape inference at load recomputes them).
  rebuilt.clear_value_info();
  return rebuilt;
}

}  // namespace

absl::StatusOr<QuantizedModel> QuantizeModel(const std::string& model_path,
                                             const std::vector<CalibrationBatch>& calibration,
                                             const QuantizeOptions& options) {
  absl::StatusOr<LoadedModel> loaded = LoadModel(model_path, options);
  if (!loaded.ok()) return loaded.status();
  onnx::ModelProto& model = loaded->proto;
  QuantizedModel result;
  QuantizeReport& report = result.report;
  // Normalizations folded into the convs before them (calibration runs
  // the folded model: the same function).
  report.folded = FoldBatchNorms(*model.mutable_graph());
  const onnx::GraphProto& graph = model.graph();
  const GraphIndex index = IndexGraph(graph);

  // The nodes to quantize and the activations to calibrate.
  absl::StatusOr<Selection> selection = SelectTargets(model_path, graph, index, report);
  if (!selection.ok()) return selection.status();

  // Calibration: the activations' ranges over the batches.
  absl::StatusOr<CalibrationRun> run =
      PrepareCalibration(model_path, *loaded, index, selection->activations, calibration, options);
  if (!run.ok()) return run.status();
  absl::StatusOr<std::vector<Stats>> stats =
      CollectStats(model_path, calibration, selection->activations, options, *run, report);
  if (!stats.ok()) return stats.status();
  absl::StatusOr<std::map<std::string, ActivationRange>> ranges =
      ChooseRanges(model_path, selection->activations, *stats, options, report);
  if (!ranges.ok()) return ranges.status();

  // The QDQ graph: the weights' DequantizeLinear first, each calibrated
  // activation's QuantizeLinear -> DequantizeLinear right after the node
  // that produces it (or first, for a graph input), and the quantized
  // nodes reading the dequantized tensors.
  absl::StatusOr<QdqParts> parts = BuildQdqParts(model_path, graph, index, *selection, *ranges);
  if (!parts.ok()) return parts.status();
  std::vector<onnx::NodeProto> nodes = OrderNodes(graph, index, *selection, *parts);
  onnx::GraphProto rebuilt =
      RebuildGraph(graph, index, std::move(nodes), std::move(parts->new_initializers));
  *model.mutable_graph() = std::move(rebuilt);
  model.set_producer_name("numaserve quantize");
  if (!model.SerializeToString(&result.onnx)) {
    return absl::InternalError("cannot serialize the quantized model");
  }
  return result;
}

}  // namespace numaserve::engine
