// What the two halves of post-training quantization (engine/quantize/quantize.h)
// share. Internal to engine/: nothing outside includes it.
//   quantize.cc              QuantizeModel (the driver), loading the model,
//                            choosing the Conv/MatMul/Gemm nodes, the
//                            weights' INT8 form, the QDQ rewrite
//   quantize_calibration.cc  the calibration model and its runs, each
//                            activation's statistics, the range choices
//                            (min-max, percentile, entropy), Uint8Range
//   quantize_outputs.cc      BatchNormalization folded into the conv before
//                            it, and the quantized convs' outputs whose
//                            pairs all their readers read (full QDQ)
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/quantize/quantize.h"

namespace numaserve::engine::quantize_internal {

// `s` with `path` and ": " in front of its message, its code kept.
absl::Status PrefixWithPath(const std::string& path, const absl::Status& s);

// An initializer's FP32 elements, its dims checked against the data it
// holds (INVALID_ARGUMENT naming it otherwise).
absl::StatusOr<std::vector<float>> FloatElements(const onnx::TensorProto& t);

// Names not yet used in a graph.
class NameSource {
 public:
  explicit NameSource(const onnx::GraphProto& g);
  // `base`, or `base`_1, _2, ...: the first not yet used (now used).
  std::string Fresh(const std::string& base);

 private:
  std::set<std::string> used_;
};

// The model to quantize: the engine's view of it and its protobuf.
struct LoadedModel {
  ModelInfo info;
  onnx::ModelProto proto;
};

// The graph's initializers, inputs and outputs by name, for the phases
// that follow.
struct GraphIndex {
  std::map<std::string, int> initializer_index;  // into graph.initializer
  std::set<std::string> graph_inputs, graph_outputs;
};

// Folds each BatchNormalization (inference mode) that alone reads a Conv's
// output into that conv's weights and bias, where the conv's weights and
// bias and the normalization's four parameters are FP32 initializers:
// W'[m] = W[m] * s[m], B'[m] = (B[m] - mean[m]) * s[m] + beta[m], s =
// gamma / sqrt(var + epsilon), in new initializers (the old ones leave the
// file if nothing else reads them). The conv then writes the
// normalization's output. ONNX Runtime folds a BatchNormalization only into
// a conv whose weights are a plain initializer, not a DequantizeLinear, so
// a QDQ file must carry it folded for the conv to match its QLinearConv
// pattern. Returns "bn (BatchNormalization) into conv" per fold.
std::vector<std::string> FoldBatchNorms(onnx::GraphProto& graph);

// Full QDQ: the outputs of quantized convs (taken after the Relu or Clip
// that alone reads one, which ONNX Runtime fuses into the QuantizeLinear
// after it) that quantized nodes read, and so have a QuantizeLinear ->
// DequantizeLinear pair already (`activations`), and are not model
// outputs: every reader of these reads the dequantized tensor, so that
// ONNX Runtime sees DequantizeLinear -> Conv -> QuantizeLinear with the
// QuantizeLinear the conv's only reader, and runs the conv in integer
// (QLinearConv). `targets`: the quantized nodes, by index into graph.node.
std::set<std::string> AllReaderPairs(const onnx::GraphProto& graph, const GraphIndex& index,
                                     const std::vector<int>& targets,
                                     const std::vector<std::string>& activations);

// Per-tensor statistics over the calibration runs.
struct Stats {
  float min = std::numeric_limits<float>::infinity();
  float max = -std::numeric_limits<float>::infinity();
  bool finite = true;
  std::vector<int64_t> histogram;  // kPercentile's and kEntropy's second pass
  int64_t count = 0;

  // Widens [min, max] to the `n` values at `x`; a NaN or infinite one
  // clears `finite` and is left out.
  void Range(const float* x, int64_t n);
  // Adds the `n` values at `x` to the histogram over [min, max] (its bins
  // made on the first call; `count` counts what went in). `skip_zeros`:
  // exact zeros are left out (the entropy method's histogram: 0 is exact
  // on every UINT8 grid, whatever the range, so a ReLU's spike of zeros
  // must not pull the range in).
  void Histogram(const float* x, int64_t n, bool skip_zeros);
  // The value below which `fraction` of the values lie (a bin's edge).
  float Quantile(double fraction) const;
};

// The calibration model compiled, and where a run of it gives each
// activation's values.
struct CalibrationRun {
  std::unique_ptr<CompiledModel> compiled;
  // Per activation: the model input it is, or the calibration model's
  // output that holds it (-1: neither).
  std::vector<int> input_of, output_of;
  std::vector<int64_t> row_elements;        // per input: the values in one row
  std::vector<std::vector<float>> outputs;  // per output: Run's buffer, reused by each pass
};

// Calibration: the model with every activation to calibrate as an output,
// compiled (graph inputs are read from the batches themselves), and its
// inputs and outputs checked against the activations and the batches.
absl::StatusOr<CalibrationRun> PrepareCalibration(const std::string& model_path,
                                                  const LoadedModel& loaded,
                                                  const GraphIndex& index,
                                                  const std::vector<std::string>& activations,
                                                  const std::vector<CalibrationBatch>& calibration,
                                                  const QuantizeOptions& options);

// Each activation's statistics over the calibration data: its range, and
// for kPercentile and kEntropy a histogram over it (a second pass).
// Adds the rows of one pass to report.calibration_rows.
absl::StatusOr<std::vector<Stats>> CollectStats(const std::string& model_path,
                                                const std::vector<CalibrationBatch>& calibration,
                                                const std::vector<std::string>& activations,
                                                const QuantizeOptions& options, CalibrationRun& run,
                                                QuantizeReport& report);

// Each activation's calibrated range by options.method and its UINT8
// parameters, by name; also added to report.activations, in order.
absl::StatusOr<std::map<std::string, ActivationRange>> ChooseRanges(
    const std::string& model_path, const std::vector<std::string>& activations,
    const std::vector<Stats>& stats, const QuantizeOptions& options, QuantizeReport& report);

}  // namespace numaserve::engine::quantize_internal
