// Post-training INT8 quantization (engine/quantize/quantize.h), calibration: the
// calibration model run over the batches, each activation's statistics
// (range, histogram) and its range by min-max, percentile or entropy, with
// its UINT8 parameters. The driver and the QDQ rewrite are in quantize.cc.
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/errno_text.h"
#include "engine/model.h"
#include "engine/quantize/quantize.h"
#include "engine/quantize/quantize_internal.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

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

namespace quantize_internal {
namespace {

// Bins of the histogram a percentile or the entropy range is read from
// (over each tensor's min-max range, found by a first pass).
constexpr int kHistogramBins = 4096;

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

// The model with every activation to calibrate that is neither a graph
// input nor a graph output added as an output, serialized.
absl::StatusOr<std::string> CalibrationModelBytes(const std::string& model_path,
                                                  const onnx::ModelProto& model,
                                                  const std::vector<std::string>& activations,
                                                  const std::vector<int>& input_of,
                                                  const std::set<std::string>& graph_outputs) {
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
  return serialized;
}

// One pass of the calibration model over the batches; `visit` sees each
// activation's values. Adds the rows run to report.calibration_rows.
absl::Status CalibrationPass(const std::string& model_path,
                             const std::vector<CalibrationBatch>& calibration,
                             const std::vector<std::string>& activations, CalibrationRun& run,
                             QuantizeReport& report,
                             const std::function<void(size_t, const float*, int64_t)>& visit) {
  const ModelInfo& cinfo = run.compiled->info();
  for (size_t b = 0; b < calibration.size(); ++b) {
    const CalibrationBatch& batch = calibration[b];
    if (batch.inputs.size() != cinfo.inputs.size() || batch.rows <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("calibration batch ", b, " has ",
                                                     batch.inputs.size(), " inputs, the model ",
                                                     cinfo.inputs.size()));
    }
    std::vector<const void*> in;
    for (size_t i = 0; i < cinfo.inputs.size(); ++i) {
      if (static_cast<int64_t>(batch.inputs[i].size()) != batch.rows * run.row_elements[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("calibration batch ", b, ": input '", cinfo.inputs[i].name, "' holds ",
                         batch.inputs[i].size(), " values, ", batch.rows, " rows of ",
                         run.row_elements[i], " expected"));
      }
      in.push_back(batch.inputs[i].data());
    }
    const std::vector<std::vector<int64_t>> shapes = run.compiled->OutputShapes(batch.rows);
    if (shapes.size() != cinfo.outputs.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": the model cannot run at ", batch.rows, " rows"));
    }
    std::vector<void*> out;
    for (size_t j = 0; j < shapes.size(); ++j) {
      absl::StatusOr<int64_t> n = kernels::NumElementsChecked(shapes[j]);
      if (!n.ok()) return n.status();
      // Room for any element type (at most 8 bytes each) in floats.
      run.outputs[j].resize(static_cast<size_t>(*n) * 2);
      out.push_back(run.outputs[j].data());
    }
    if (absl::Status s = run.compiled->Run(batch.rows, in, out); !s.ok()) {
      return PrefixWithPath(model_path, s);
    }
    for (size_t a = 0; a < activations.size(); ++a) {
      if (run.input_of[a] >= 0) {
        visit(a, batch.inputs[run.input_of[a]].data(),
              batch.rows * run.row_elements[run.input_of[a]]);
      } else {
        absl::StatusOr<int64_t> n = kernels::NumElementsChecked(shapes[run.output_of[a]]);
        visit(a, run.outputs[run.output_of[a]].data(), n.ok() ? *n : 0);
      }
    }
    report.calibration_rows += batch.rows;
  }
  return absl::OkStatus();
}

}  // namespace

void Stats::Range(const float* x, int64_t n) {
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
void Stats::Histogram(const float* x, int64_t n, bool skip_zeros) {
  if (histogram.empty()) histogram.assign(kHistogramBins, 0);
  const double width = static_cast<double>(max) - min;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || (skip_zeros && x[i] == 0.0f)) continue;
    int64_t bin =
        width > 0 ? static_cast<int64_t>((x[i] - static_cast<double>(min)) / width * kHistogramBins)
                  : 0;
    bin = std::clamp<int64_t>(bin, 0, kHistogramBins - 1);
    ++histogram[bin];
    ++count;
  }
}

// The value below which `fraction` of the values lie (a bin's edge).
float Stats::Quantile(double fraction) const {
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

// Calibration: the model with every activation to calibrate as an output,
// compiled (graph inputs are read from the batches themselves), and its
// inputs and outputs checked against the activations and the batches.
absl::StatusOr<CalibrationRun> PrepareCalibration(const std::string& model_path,
                                                  const LoadedModel& loaded,
                                                  const GraphIndex& index,
                                                  const std::vector<std::string>& activations,
                                                  const std::vector<CalibrationBatch>& calibration,
                                                  const QuantizeOptions& options) {
  CalibrationRun run;
  run.input_of.assign(activations.size(), -1);
  run.output_of.assign(activations.size(), -1);
  for (size_t a = 0; a < activations.size(); ++a) {
    for (size_t i = 0; i < loaded.info.inputs.size(); ++i) {
      if (loaded.info.inputs[i].name == activations[a]) run.input_of[a] = static_cast<int>(i);
    }
  }
  absl::StatusOr<std::string> serialized = CalibrationModelBytes(
      model_path, loaded.proto, activations, run.input_of, index.graph_outputs);
  if (!serialized.ok()) return serialized.status();
  absl::StatusOr<std::string> temporary = WriteTemporary(*serialized);
  if (!temporary.ok()) return temporary.status();
  absl::StatusOr<std::unique_ptr<CompiledModel>> compiled =
      CompiledModel::Load(*temporary, options.compile);
  unlink(temporary->c_str());
  if (!compiled.ok()) {
    return absl::Status(compiled.status().code(),
                        absl::StrCat(model_path, ": compiling the calibration model: ",
                                     compiled.status().message()));
  }
  run.compiled = *std::move(compiled);
  const ModelInfo& cinfo = run.compiled->info();
  for (size_t a = 0; a < activations.size(); ++a) {
    for (size_t j = 0; j < cinfo.outputs.size() && run.input_of[a] < 0; ++j) {
      if (cinfo.outputs[j].name == activations[a]) run.output_of[a] = static_cast<int>(j);
    }
    if (run.input_of[a] < 0 && run.output_of[a] < 0) {
      return absl::InternalError(
          absl::StrCat("activation '", activations[a], "' is not an output"));
    }
    if (run.output_of[a] >= 0 && cinfo.outputs[run.output_of[a]].type != DataType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_path, ": the input of a quantized node, '", activations[a], "', is not FP32"));
    }
  }
  run.row_elements.assign(cinfo.inputs.size(), 1);
  for (size_t i = 0; i < cinfo.inputs.size(); ++i) {
    if (cinfo.inputs[i].type != DataType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_path, ": input '", cinfo.inputs[i].name, "' is not FP32"));
    }
    for (size_t d = 1; d < cinfo.inputs[i].shape.size(); ++d) {
      run.row_elements[i] *= cinfo.inputs[i].shape[d];
    }
  }
  if (calibration.empty()) {
    return absl::InvalidArgumentError("no calibration data (at least one row is needed)");
  }
  run.outputs.resize(cinfo.outputs.size());
  return run;
}

// Each activation's statistics over the calibration data: its range, and
// for kPercentile and kEntropy a histogram over it (a second pass).
absl::StatusOr<std::vector<Stats>> CollectStats(const std::string& model_path,
                                                const std::vector<CalibrationBatch>& calibration,
                                                const std::vector<std::string>& activations,
                                                const QuantizeOptions& options, CalibrationRun& run,
                                                QuantizeReport& report) {
  std::vector<Stats> stats(activations.size());
  // One pass over the batches; `visit` sees each activation's values.
  auto pass = [&](const std::function<void(size_t, const float*, int64_t)>& visit) {
    return CalibrationPass(model_path, calibration, activations, run, report, visit);
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
  return stats;
}

// Each activation's calibrated range by options.method and its UINT8
// parameters, by name; also added to report.activations, in order.
absl::StatusOr<std::map<std::string, ActivationRange>> ChooseRanges(
    const std::string& model_path, const std::vector<std::string>& activations,
    const std::vector<Stats>& stats, const QuantizeOptions& options, QuantizeReport& report) {
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
  return ranges;
}

}  // namespace quantize_internal
}  // namespace numaserve::engine
