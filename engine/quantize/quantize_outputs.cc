// Post-training INT8 quantization (engine/quantize/quantize.h), the graph
// rewrites around the quantized nodes' outputs: BatchNormalization folded
// into the conv before it, and the outputs that get QDQ pairs of their own
// (full QDQ, quantize_internal.h).
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/quantize/quantize_internal.h"

namespace numaserve::engine::quantize_internal {
namespace {

bool IsOnnxOp(const onnx::NodeProto& node, const char* op) {
  return (node.domain().empty() || node.domain() == "ai.onnx") && node.op_type() == op;
}

// The nodes reading each tensor (by index into graph.node; a node reading
// a tensor twice is listed twice).
std::map<std::string, std::vector<int>> Readers(const onnx::GraphProto& graph) {
  std::map<std::string, std::vector<int>> readers;
  for (int i = 0; i < graph.node_size(); ++i) {
    for (const std::string& in : graph.node(i).input()) {
      if (!in.empty()) readers[in].push_back(i);
    }
  }
  return readers;
}

// The FP32 initializer named `name` that is not also a graph input (which
// a caller could override), or null.
const onnx::TensorProto* ConstantFloat(const onnx::GraphProto& graph, const std::string& name) {
  for (const auto& v : graph.input()) {
    if (v.name() == name) return nullptr;
  }
  for (const auto& t : graph.initializer()) {
    if (t.name() == name) return t.data_type() == onnx::TensorProto::FLOAT ? &t : nullptr;
  }
  return nullptr;
}

onnx::TensorProto FloatTensor(const std::string& name, const std::vector<int64_t>& dims,
                              const std::vector<float>& values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return t;
}

// The folded weights and bias of conv `conv` and normalization `bn`, or
// nothing where a parameter is missing, of the wrong size or not finite.
struct Folded {
  std::vector<int64_t> weight_dims;
  std::vector<float> weights, bias;
};
absl::StatusOr<Folded> FoldedParams(const onnx::GraphProto& graph, const onnx::NodeProto& conv,
                                    const onnx::NodeProto& bn) {
  const onnx::TensorProto* w = ConstantFloat(graph, conv.input(1));
  if (w == nullptr || w->dims_size() < 3 || w->dims(0) <= 0) {
    return absl::InvalidArgumentError("weights");
  }
  const int64_t m = w->dims(0);
  std::vector<std::vector<float>> p;  // gamma, beta, mean, var
  for (int k = 1; k <= 4; ++k) {
    const onnx::TensorProto* t = ConstantFloat(graph, bn.input(k));
    if (t == nullptr) return absl::InvalidArgumentError("parameter");
    absl::StatusOr<std::vector<float>> v = FloatElements(*t);
    if (!v.ok() || static_cast<int64_t>(v->size()) != m) return absl::InvalidArgumentError("size");
    p.push_back(*std::move(v));
  }
  Folded f;
  absl::StatusOr<std::vector<float>> weights = FloatElements(*w);
  if (!weights.ok()) return weights.status();
  f.weights = *std::move(weights);
  f.weight_dims.assign(w->dims().begin(), w->dims().end());
  f.bias.assign(m, 0.0f);
  if (conv.input_size() > 2 && !conv.input(2).empty()) {
    const onnx::TensorProto* b = ConstantFloat(graph, conv.input(2));
    if (b == nullptr) return absl::InvalidArgumentError("bias");
    absl::StatusOr<std::vector<float>> bias = FloatElements(*b);
    if (!bias.ok() || static_cast<int64_t>(bias->size()) != m) {
      return absl::InvalidArgumentError("bias");
    }
    f.bias = *std::move(bias);
  }
  float epsilon = 1e-5f;
  for (const auto& a : bn.attribute()) {
    if (a.name() == "epsilon") epsilon = a.f();
    if (a.name() == "training_mode" && a.i() != 0) return absl::InvalidArgumentError("training");
  }
  const int64_t per_channel = static_cast<int64_t>(f.weights.size()) / m;
  for (int64_t c = 0; c < m; ++c) {
    const double s = static_cast<double>(p[0][c]) /
                     std::sqrt(static_cast<double>(p[3][c]) + static_cast<double>(epsilon));
    if (!std::isfinite(s)) return absl::InvalidArgumentError("scale");
    for (int64_t i = 0; i < per_channel; ++i) {
      float& v = f.weights[c * per_channel + i];
      v = static_cast<float>(v * s);
    }
    f.bias[c] = static_cast<float>((static_cast<double>(f.bias[c]) - p[2][c]) * s + p[1][c]);
    if (!std::isfinite(f.bias[c])) return absl::InvalidArgumentError("bias");
  }
  for (float v : f.weights) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("weights");
  }
  return f;
}

// The normalization at node `j` folded into the conv that writes its input
// (the conv's node rewritten, the normalization's node emptied); false
// where it does not fold.
bool FoldOne(onnx::GraphProto& graph, int j, const std::map<std::string, int>& producer,
             const std::map<std::string, std::vector<int>>& readers,
             const std::set<std::string>& outputs, NameSource& names) {
  const onnx::NodeProto& bn = graph.node(j);
  if (!IsOnnxOp(bn, "BatchNormalization") || bn.input_size() != 5 || bn.output_size() < 1) {
    return false;
  }
  for (int k = 1; k < bn.output_size(); ++k) {
    if (!bn.output(k).empty()) return false;  // training outputs
  }
  const std::string& x = bn.input(0);
  auto p = producer.find(x);
  auto r = readers.find(x);
  if (p == producer.end() || r == readers.end() || r->second.size() != 1 || outputs.count(x)) {
    return false;
  }
  onnx::NodeProto& conv = *graph.mutable_node(p->second);
  if (!IsOnnxOp(conv, "Conv") || conv.input_size() < 2 || conv.output_size() != 1) return false;
  absl::StatusOr<Folded> f = FoldedParams(graph, conv, bn);
  if (!f.ok()) return false;
  const int64_t m = f->weight_dims[0];
  const std::string w_name = names.Fresh(conv.input(1) + "_folded");
  const std::string b_name = names.Fresh(absl::StrCat(bn.name().empty() ? x : bn.name(), "_bias"));
  *graph.add_initializer() = FloatTensor(w_name, f->weight_dims, f->weights);
  *graph.add_initializer() = FloatTensor(b_name, {m}, f->bias);
  conv.set_input(1, w_name);
  if (conv.input_size() > 2) {
    conv.set_input(2, b_name);
  } else {
    conv.add_input(b_name);
  }
  conv.set_output(0, bn.output(0));
  return true;
}

}  // namespace

std::vector<std::string> FoldBatchNorms(onnx::GraphProto& graph) {
  std::vector<std::string> folded;
  std::map<std::string, int> producer;
  for (int i = 0; i < graph.node_size(); ++i) {
    for (const std::string& o : graph.node(i).output()) producer[o] = i;
  }
  const std::map<std::string, std::vector<int>> readers = Readers(graph);
  std::set<std::string> outputs;
  for (const auto& v : graph.output()) outputs.insert(v.name());
  NameSource names(graph);
  std::vector<bool> removed(graph.node_size(), false);
  for (int j = 0; j < graph.node_size(); ++j) {
    const std::string label =
        absl::StrCat(graph.node(j).name().empty() ? "(unnamed)" : graph.node(j).name(),
                     " (BatchNormalization) into ");
    if (!FoldOne(graph, j, producer, readers, outputs, names)) continue;
    const onnx::NodeProto& conv = graph.node(producer.at(graph.node(j).input(0)));
    folded.push_back(absl::StrCat(label, conv.name().empty() ? "(unnamed)" : conv.name()));
    removed[j] = true;
  }
  if (folded.empty()) return folded;
  onnx::GraphProto kept_nodes;
  for (int i = 0; i < graph.node_size(); ++i) {
    if (!removed[i]) *kept_nodes.add_node() = std::move(*graph.mutable_node(i));
  }
  graph.mutable_node()->Swap(kept_nodes.mutable_node());
  return folded;
}

std::set<std::string> AllReaderPairs(const onnx::GraphProto& graph, const GraphIndex& index,
                                     const std::vector<int>& targets,
                                     const std::vector<std::string>& activations) {
  const std::map<std::string, std::vector<int>> readers = Readers(graph);
  const std::set<std::string> paired(activations.begin(), activations.end());
  std::set<std::string> out;
  for (int t : targets) {
    const onnx::NodeProto& node = graph.node(t);
    // Only after convs: numaserve folds a pair into a conv's post-ops, and
    // would run one after a matmul as a step of its own (ONNX Runtime runs
    // a DequantizeLinear -> MatMul without a QuantizeLinear after it in
    // integer already: MatMulIntegerToFloat).
    if (!IsOnnxOp(node, "Conv") || node.output_size() < 1) continue;
    // Through the Relu or Clip that alone reads it (ONNX Runtime fuses
    // Relu -> QuantizeLinear and Clip -> QuantizeLinear where the pair's
    // range lies within theirs, as a calibrated one does).
    std::string value = node.output(0);
    for (;;) {
      auto r = readers.find(value);
      if (index.graph_outputs.count(value) != 0 || r == readers.end() || r->second.size() != 1) {
        break;
      }
      const onnx::NodeProto& next = graph.node(r->second[0]);
      if ((!IsOnnxOp(next, "Relu") && !IsOnnxOp(next, "Clip")) || next.output_size() != 1 ||
          next.input(0) != value) {
        break;
      }
      value = next.output(0);
    }
    // A model output stays FP32. A conv's output that no quantized node
    // reads gets no pair: numaserve runs a conv's residual Add as the
    // conv's sum post-op, which a pair between them would split into a
    // step of its own.
    if (index.graph_outputs.count(value) == 0 && paired.count(value) != 0) {
      out.insert(value);
    }
  }
  return out;
}

}  // namespace numaserve::engine::quantize_internal
