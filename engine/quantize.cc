#include "engine/quantize.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/errno_text.h"
#include "kernels/tensor.h"

namespace numaserve::engine {
namespace {

// Bins of the histogram a percentile or the entropy range is read from
// (over each tensor's min-max range, found by a first pass).
constexpr int kHistogramBins = 4096;

absl::Status Prefix(const std::string& path, const absl::Status& s) {
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

// Names not yet used in the graph.
class NameSource {
 public:
  explicit NameSource(const onnx::GraphProto& g) {
    for (const auto& t : g.initializer()) used_.insert(t.name());
    for (const auto& v : g.input()) used_.insert(v.name());
    for (const auto& v : g.output()) used_.insert(v.name());
    for (const auto& n : g.node()) {
      used_.insert(n.name());
      for (const auto& o : n.output()) used_.insert(o);
    }
  }
  std::string Fresh(const std::string& base) {
    std::string name = base;
    for (int i = 1; used_.count(name) != 0; ++i) name = absl::StrCat(base, "_", i);
    used_.insert(name);
    return name;
  }

 private:
  std::set<std::string> used_;
};

// Writes `bytes` to a new private temporary file; its path.
absl::StatusOr<std::string> WriteTemporary(const std::string& bytes) {
  const char* dir = std::getenv("TMPDIR");
  std::string path =
      absl::StrCat(dir != nullptr && *dir != '\0' ? dir : "/tmp", "/numaserve-calibration-XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary file for the calibration model in ",
                     dir != nullptr ? dir : "/tmp", ": ", base::ErrnoText(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      unlink(path.c_str());
      return absl::InternalError(absl::StrCat("writing ", path, ": ", base::ErrnoText(err)));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return path;
}

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

// Per-tensor statistics over the calibration runs.
struct Stats {
  float min = std::numeric_limits<float>::infinity();
  float max = -std::numeric_limits<float>::infinity();
  bool finite = true;
  std::vector<int64_t> histogram;  // kPercentile's and kEntropy's second pass
  int64_t count = 0;

  void Range(const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[i])) {
        finite = false;
        continue;
      }
      min = std::min(min, x[i]);
      max = std::max(max, x[i]);
    }
  }
  // `skip_zeros`: exact zeros are left out (the entropy method's
  // histogram: 0 is exact on every UINT8 grid, whatever the range, so a
  // ReLU's spike of zeros must not pull the range in).
  void Histogram(const float* x, int64_t n, bool skip_zeros) {
    if (histogram.empty()) histogram.assign(kHistogramBins, 0);
    const double width = static_cast<double>(max) - min;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[i]) || (skip_zeros && x[i] == 0.0f)) continue;
      int64_t bin =
          width > 0
              ? static_cast<int64_t>((x[i] - static_cast<double>(min)) / width * kHistogramBins)
              : 0;
      bin = std::clamp<int64_t>(bin, 0, kHistogramBins - 1);
      ++histogram[bin];
      ++count;
    }
  }
  // The value below which `fraction` of the values lie (a bin's edge).
  float Quantile(double fraction) const {
    const double width = static_cast<double>(max) - min;
    if (count == 0 || width <= 0) return fraction < 0.5 ? min : max;
    const double target = fraction * static_cast<double>(count);
    double seen = 0;
    for (int b = 0; b < kHistogramBins; ++b) {
      seen += static_cast<double>(histogram[b]);
      if (seen >= target) {
        // Lower quantiles take the bin's lower edge, upper ones its upper edge.
        const int edge = fraction < 0.5 ? b : b + 1;
        return static_cast<float>(min + width * edge / kHistogramBins);
      }
    }
    return max;
  }
};

}  // namespace

absl::StatusOr<CalibrationMethod> CalibrationMethodFromName(const std::string& name) {
  if (name == "minmax") return CalibrationMethod::kMinMax;
  if (name == "percentile") return CalibrationMethod::kPercentile;
  if (name == "entropy") return CalibrationMethod::kEntropy;
  return absl::InvalidArgumentError(absl::StrCat("unknown calibration method '", name,
                                                 "' (expected minmax, percentile or entropy)"));
}

std::pair<float, float> EntropyRange(const std::vector<int64_t>& histogram, float min, float max) {
  constexpr int64_t kLevels = 255;  // steps of a UINT8 grid
  const int64_t bins = static_cast<int64_t>(histogram.size());
  int64_t total = 0;
  for (int64_t c : histogram) total += c;
  if (bins <= kLevels || total == 0 || !(max > min)) return {min, max};
  const double width = static_cast<double>(max) - min;
  // The bin edge nearest to 0 (0 when all values are positive, `bins` when
  // all are negative): every candidate keeps it inside.
  const int64_t zero = std::clamp<int64_t>(
      static_cast<int64_t>(std::llround(-static_cast<double>(min) / width * bins)), 0, bins);
  double best_kl = std::numeric_limits<double>::infinity();
  int64_t best_a = 0, best_b = bins;
  std::vector<double> p(static_cast<size_t>(bins)), q(static_cast<size_t>(bins));
  // Candidates: f = kept / bins for kept = bins, bins - 16, ..., down to 255.
  for (int64_t kept = bins; kept >= kLevels; kept -= 16) {
    const double f = static_cast<double>(kept) / bins;
    const int64_t a = zero - static_cast<int64_t>(std::llround(zero * f));
    const int64_t b = zero + static_cast<int64_t>(std::llround((bins - zero) * f));
    const int64_t n = b - a;
    if (n < kLevels) continue;
    // Q: the kept bins as they are, each of the 255 steps' count spread
    // evenly over its nonzero bins: what quantizing them keeps.
    for (int64_t level = 0; level < kLevels; ++level) {
      const int64_t lo = level * n / kLevels, hi = (level + 1) * n / kLevels;
      double sum = 0;
      int64_t nonzero = 0;
      for (int64_t i = lo; i < hi; ++i) {
        const auto c = static_cast<double>(histogram[a + i]);
        sum += c;
        nonzero += c > 0 ? 1 : 0;
      }
      for (int64_t i = lo; i < hi; ++i) {
        q[i] = histogram[a + i] > 0 ? sum / static_cast<double>(nonzero) : 0;
      }
    }
    // P: the kept bins with the values outside folded into the edge bins
    // (where clipping puts them); Q lacks those, which is what clipping costs.
    double q_total = 0;
    for (int64_t i = 0; i < n; ++i) {
      p[i] = static_cast<double>(histogram[a + i]);
      q_total += q[i];
    }
    for (int64_t i = 0; i < a; ++i) p[0] += static_cast<double>(histogram[i]);
    for (int64_t i = b; i < bins; ++i) p[n - 1] += static_cast<double>(histogram[i]);
    // KL(P || Q) of the normalized distributions; a bin P has and Q lacks
    // (an edge bin holding only clipped values) counts as if Q held a
    // millionth of a value there.
    if (q_total <= 0) continue;
    const double floor = 1e-6 / static_cast<double>(total);
    double kl = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (p[i] <= 0) continue;
      const double pn = p[i] / static_cast<double>(total);
      const double qn = std::max(q[i] / q_total, floor);
      kl += pn * std::log(pn / qn);
    }
    if (kl < best_kl - 1e-12) {
      best_kl = kl;
      best_a = a;
      best_b = b;
    }
  }
  const float lo = best_a == 0 ? min : static_cast<float>(min + width * best_a / bins);
  const float hi = best_b == bins ? max : static_cast<float>(min + width * best_b / bins);
  return {lo, hi};
}

absl::StatusOr<ActivationRange> Uint8Range(float min, float max) {
  if (!std::isfinite(min) || !std::isfinite(max) || min > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("range [", min, ", ", max, "] is not a finite interval"));
  }
  ActivationRange r;
  r.min = min;
  r.max = max;
  const double lo = std::min(0.0, static_cast<double>(min));
  const double hi = std::max(0.0, static_cast<double>(max));
  if (hi - lo <= 0 || static_cast<float>((hi - lo) / 255.0) <= 0) {
    r.scale = 1.0f;
    r.zero_point = 0;
    return r;
  }
  r.scale = static_cast<float>((hi - lo) / 255.0);
  r.zero_point = static_cast<int32_t>(
      std::clamp(std::nearbyint(-lo / static_cast<double>(r.scale)), 0.0, 255.0));
  return r;
}

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

absl::StatusOr<QuantizedModel> QuantizeModel(const std::string& model_path,
                                             const std::vector<CalibrationBatch>& calibration,
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
  onnx::ModelProto model;
  {
    std::ifstream file(model_path, std::ios::binary);
    std::stringstream bytes;
    bytes << file.rdbuf();
    if (!file || !model.ParseFromString(bytes.str())) {
      return absl::InvalidArgumentError(absl::StrCat(model_path, ": cannot read it again"));
    }
  }
  onnx::GraphProto& graph = *model.mutable_graph();
  std::map<std::string, int> initializer_index;
  for (int i = 0; i < graph.initializer_size(); ++i)
    initializer_index[graph.initializer(i).name()] = i;
  std::set<std::string> graph_inputs, graph_outputs;
  for (const auto& v : graph.input()) graph_inputs.insert(v.name());
  for (const auto& v : graph.output()) graph_outputs.insert(v.name());

  // The nodes to quantize and the activations to calibrate.
  QuantizedModel result;
  QuantizeReport& report = result.report;
  std::vector<Target> targets;
  std::vector<std::string> activations;  // distinct, in order of first use
  std::map<std::string, size_t> activation_index;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    const std::string& op = node.op_type();
    if (!node.domain().empty() || (op != "Conv" && op != "MatMul" && op != "Gemm")) continue;
    const std::string label =
        absl::StrCat(node.name().empty() ? "(unnamed)" : node.name(), " (", op, ")");
    if (node.input_size() < 2) continue;
    auto w = initializer_index.find(node.input(1));
    if (w == initializer_index.end() || graph_inputs.count(node.input(1)) != 0) {
      report.skipped.push_back(absl::StrCat(label, ": its weights are not an initializer"));
      continue;
    }
    const onnx::TensorProto& wt = graph.initializer(w->second);
    if (wt.data_type() != onnx::TensorProto::FLOAT) {
      report.skipped.push_back(absl::StrCat(label, ": its weights are not FLOAT"));
      continue;
    }
    if (initializer_index.count(node.input(0)) != 0) {
      report.skipped.push_back(absl::StrCat(label, ": its input is a constant"));
      continue;
    }
    Target t;
    t.node = i;
    t.weight.initializer = wt.name();
    if (op == "Conv") {
      if (wt.dims_size() < 3) {
        report.skipped.push_back(absl::StrCat(label, ": weights of rank ", wt.dims_size()));
        continue;
      }
      t.weight.axis = 0;
    } else {
      if (wt.dims_size() != 2) {
        report.skipped.push_back(
            absl::StrCat(label, ": weights of rank ", wt.dims_size(), " (2 is quantized)"));
        continue;
      }
      int64_t trans_b = 0;
      for (const auto& a : node.attribute()) {
        if (a.name() == "transB") trans_b = a.i();
      }
      t.weight.axis = op == "Gemm" && trans_b != 0 ? 0 : 1;
    }
    targets.push_back(t);
    report.quantized.push_back(label);
    if (activation_index.emplace(node.input(0), activations.size()).second) {
      activations.push_back(node.input(0));
    }
  }
  if (targets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": no Conv, MatMul or Gemm with FP32 initializer weights to quantize"));
  }

  // Calibration: the model with every activation to calibrate as an
  // output, compiled and run on the batches (graph inputs are read from the
  // batches themselves).
  std::vector<int> input_of(activations.size(), -1), output_of(activations.size(), -1);
  for (size_t a = 0; a < activations.size(); ++a) {
    for (size_t i = 0; i < info->inputs.size(); ++i) {
      if (info->inputs[i].name == activations[a]) input_of[a] = static_cast<int>(i);
    }
  }
  // Graph outputs need a type with a shape: ONNX's shape inference gives it.
  onnx::ModelProto calibration_model = model;
  try {
    onnx::shape_inference::InferShapes(calibration_model);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": shape inference failed: ", e.what()));
  }
  std::map<std::string, const onnx::ValueInfoProto*> inferred;
  for (const auto& v : calibration_model.graph().value_info()) inferred[v.name()] = &v;
  std::vector<onnx::ValueInfoProto> extra_outputs;
  for (size_t a = 0; a < activations.size(); ++a) {
    if (input_of[a] >= 0 || graph_outputs.count(activations[a]) != 0) continue;
    auto v = inferred.find(activations[a]);
    if (v == inferred.end() || !v->second->type().tensor_type().has_shape()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": the shape of '", activations[a],
                       "' (the input of a quantized node) does not infer"));
    }
    extra_outputs.push_back(*v->second);
  }
  for (onnx::ValueInfoProto& v : extra_outputs) {
    *calibration_model.mutable_graph()->add_output() = std::move(v);
  }
  std::string serialized;
  if (!calibration_model.SerializeToString(&serialized)) {
    return absl::InternalError("cannot serialize the calibration model");
  }
  absl::StatusOr<std::string> temporary = WriteTemporary(serialized);
  if (!temporary.ok()) return temporary.status();
  absl::StatusOr<std::unique_ptr<CompiledModel>> compiled =
      CompiledModel::Load(*temporary, options.compile);
  unlink(temporary->c_str());
  if (!compiled.ok()) {
    return absl::Status(compiled.status().code(),
                        absl::StrCat(model_path, ": compiling the calibration model: ",
                                     compiled.status().message()));
  }
  const ModelInfo& cinfo = (*compiled)->info();
  for (size_t a = 0; a < activations.size(); ++a) {
    for (size_t j = 0; j < cinfo.outputs.size() && input_of[a] < 0; ++j) {
      if (cinfo.outputs[j].name == activations[a]) output_of[a] = static_cast<int>(j);
    }
    if (input_of[a] < 0 && output_of[a] < 0) {
      return absl::InternalError(
          absl::StrCat("activation '", activations[a], "' is not an output"));
    }
    if (output_of[a] >= 0 && cinfo.outputs[output_of[a]].type != DataType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_path, ": the input of a quantized node, '", activations[a], "', is not FP32"));
    }
  }
  std::vector<int64_t> row_elements(cinfo.inputs.size(), 1);
  for (size_t i = 0; i < cinfo.inputs.size(); ++i) {
    if (cinfo.inputs[i].type != DataType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": input '", cinfo.inputs[i].name, "' is not FP32"));
    }
    for (size_t d = 1; d < cinfo.inputs[i].shape.size(); ++d) {
      row_elements[i] *= cinfo.inputs[i].shape[d];
    }
  }
  if (calibration.empty()) {
    return absl::InvalidArgumentError("no calibration data (at least one row is needed)");
  }
  std::vector<Stats> stats(activations.size());
  std::vector<std::vector<float>> outputs(cinfo.outputs.size());
  // One pass over the batches; `visit` sees each activation's values.
  auto pass = [&](const std::function<void(size_t, const float*, int64_t)>& visit) -> absl::Status {
    for (size_t b = 0; b < calibration.size(); ++b) {
      const CalibrationBatch& batch = calibration[b];
      if (batch.inputs.size() != cinfo.inputs.size() || batch.rows <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("calibration batch ", b, " has ",
                                                       batch.inputs.size(), " inputs, the model ",
                                                       cinfo.inputs.size()));
      }
      std::vector<const void*> in;
      for (size_t i = 0; i < cinfo.inputs.size(); ++i) {
        if (static_cast<int64_t>(batch.inputs[i].size()) != batch.rows * row_elements[i]) {
          return absl::InvalidArgumentError(
              absl::StrCat("calibration batch ", b, ": input '", cinfo.inputs[i].name, "' holds ",
                           batch.inputs[i].size(), " values, ", batch.rows, " rows of ",
                           row_elements[i], " expected"));
        }
        in.push_back(batch.inputs[i].data());
      }
      const std::vector<std::vector<int64_t>> shapes = (*compiled)->OutputShapes(batch.rows);
      if (shapes.size() != cinfo.outputs.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(model_path, ": the model cannot run at ", batch.rows, " rows"));
      }
      std::vector<void*> out;
      for (size_t j = 0; j < shapes.size(); ++j) {
        absl::StatusOr<int64_t> n = kernels::NumElementsChecked(shapes[j]);
        if (!n.ok()) return n.status();
        // Room for any element type (at most 8 bytes each) in floats.
        outputs[j].resize(static_cast<size_t>(*n) * 2);
        out.push_back(outputs[j].data());
      }
      if (absl::Status s = (*compiled)->Run(batch.rows, in, out); !s.ok()) {
        return Prefix(model_path, s);
      }
      for (size_t a = 0; a < activations.size(); ++a) {
        if (input_of[a] >= 0) {
          visit(a, batch.inputs[input_of[a]].data(), batch.rows * row_elements[input_of[a]]);
        } else {
          absl::StatusOr<int64_t> n = kernels::NumElementsChecked(shapes[output_of[a]]);
          visit(a, outputs[output_of[a]].data(), n.ok() ? *n : 0);
        }
      }
      report.calibration_rows += batch.rows;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = pass([&](size_t a, const float* x, int64_t n) { stats[a].Range(x, n); });
      !s.ok()) {
    return s;
  }
  const int64_t rows = report.calibration_rows;
  const bool entropy = options.method == CalibrationMethod::kEntropy;
  if (options.method == CalibrationMethod::kPercentile || entropy) {
    if (absl::Status s =
            pass([&](size_t a, const float* x, int64_t n) { stats[a].Histogram(x, n, entropy); });
        !s.ok()) {
      return s;
    }
  }
  report.calibration_rows = rows;
  std::map<std::string, ActivationRange> ranges;
  for (size_t a = 0; a < activations.size(); ++a) {
    const Stats& s = stats[a];
    if (!s.finite) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": activation '", activations[a],
                       "' was NaN or infinite on the calibration data; it cannot be quantized"));
    }
    float lo = s.min, hi = s.max;
    if (options.method == CalibrationMethod::kPercentile) {
      lo = s.Quantile(1.0 - options.percentile / 100.0);
      hi = s.Quantile(options.percentile / 100.0);
    } else if (options.method == CalibrationMethod::kEntropy) {
      std::tie(lo, hi) = EntropyRange(s.histogram, s.min, s.max);
    }
    absl::StatusOr<ActivationRange> r = Uint8Range(lo, hi);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": activation '", activations[a], "': ", r.status().message()));
    }
    r->tensor = activations[a];
    ranges[activations[a]] = *r;
    report.activations.push_back(*r);
  }

  // The QDQ graph: the weights' DequantizeLinear first, each calibrated
  // activation's QuantizeLinear -> DequantizeLinear right after the node
  // that produces it (or first, for a graph input), and the quantized
  // nodes reading the dequantized tensors.
  NameSource names(graph);
  std::map<WeightUse, std::string> dequantized_weight;
  std::vector<onnx::NodeProto> weight_nodes;
  std::vector<onnx::TensorProto> new_initializers;
  for (const Target& t : targets) {
    if (dequantized_weight.count(t.weight) != 0) continue;
    const onnx::TensorProto& wt = graph.initializer(initializer_index[t.weight.initializer]);
    absl::StatusOr<std::vector<float>> w = FloatElements(wt);
    if (!w.ok()) return Prefix(model_path, w.status());
    std::vector<int64_t> dims(wt.dims().begin(), wt.dims().end());
    for (float v : *w) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(model_path, ": initializer '", wt.name(),
                                                       "' holds NaN or infinite values"));
      }
    }
    Int8Weights q = QuantizeWeightsPerChannel(*w, dims, t.weight.axis);
    const std::string base = wt.name();
    onnx::TensorProto values;
    values.set_name(names.Fresh(base + "_quantized"));
    values.set_data_type(onnx::TensorProto::INT8);
    for (int64_t d : dims) values.add_dims(d);
    values.set_raw_data(
        std::string(reinterpret_cast<const char*>(q.values.data()), q.values.size()));
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
    const std::string out = names.Fresh(base + "_dequantized");
    dq.add_output(out);
    onnx::AttributeProto* axis = dq.add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(t.weight.axis);
    weight_nodes.push_back(std::move(dq));
    new_initializers.push_back(std::move(values));
    new_initializers.push_back(std::move(scales));
    new_initializers.push_back(std::move(zero_points));
    dequantized_weight[t.weight] = out;
  }
  // Q -> DQ for each activation.
  std::map<std::string, std::vector<onnx::NodeProto>> qdq_after;  // by the activation
  std::map<std::string, std::string> dequantized_activation;
  for (const std::string& a : activations) {
    const ActivationRange& r = ranges[a];
    const std::string scale = names.Fresh(a + "_scale");
    const std::string zero_point = names.Fresh(a + "_zero_point");
    new_initializers.push_back(ScalarFloat(scale, r.scale));
    new_initializers.push_back(ScalarUint8(zero_point, r.zero_point));
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
    qdq_after[a] = {std::move(q), std::move(dq)};
    dequantized_activation[a] = dequantized;
  }
  std::map<int, const Target*> target_of;
  for (const Target& t : targets) target_of[t.node] = &t;
  std::vector<onnx::NodeProto> nodes = weight_nodes;
  for (const auto& [a, qdq] : qdq_after) {
    if (graph_inputs.count(a) != 0 || initializer_index.count(a) != 0) {
      nodes.insert(nodes.end(), qdq.begin(), qdq.end());
    }
  }
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto node = graph.node(i);
    if (auto t = target_of.find(i); t != target_of.end()) {
      node.set_input(0, dequantized_activation[node.input(0)]);
      node.set_input(1, dequantized_weight[t->second->weight]);
    }
    nodes.push_back(node);
    for (const std::string& o : graph.node(i).output()) {
      if (auto q = qdq_after.find(o); q != qdq_after.end()) {
        nodes.insert(nodes.end(), q->second.begin(), q->second.end());
      }
    }
  }
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
    if (initializer_index.count(v.name()) == 0 || still_read.count(v.name()) != 0) {
      *rebuilt.add_input() = v;
    }
  }
  // Shapes of the FP32 weights that left are stale: drop all value_info
  // (shape inference at load recomputes them).
  rebuilt.clear_value_info();
  *model.mutable_graph() = std::move(rebuilt);
  model.set_producer_name("numaserve quantize");
  if (!model.SerializeToString(&result.onnx)) {
    return absl::InternalError("cannot serialize the quantized model");
  }
  return result;
}

}  // namespace numaserve::engine
