// Post-training INT8 quantization (`numaserve quantize`): an FP32 ONNX
// model in, the same model in ONNX's standard QDQ form out.
//
// Every Conv, MatMul and Gemm whose weights are an FP32 initializer gets
//   - its weights as INT8, symmetric, one scale per output channel (Conv:
//     axis 0 of [M, C/group, k...]; MatMul: axis 1 of B[K, N]; Gemm: the N
//     axis of B, 0 with transB), behind a DequantizeLinear;
//   - its input (A, X) through QuantizeLinear -> DequantizeLinear to UINT8,
//     asymmetric, the scale and zero point from the range the input took on
//     calibration data (min-max, or the given percentiles of its values);
//   - its bias and everything else left FP32.
// A Conv's output (after the Relu or Clip that alone reads it) that
// quantized nodes read is read through its pair by every reader (full
// QDQ: ONNX Runtime runs a conv in integer only when a QuantizeLinear
// alone reads its output), and a BatchNormalization after a conv is
// folded into the conv's weights first.
// The file means exactly what ONNX says QDQ means (dequantize, then run the
// FP32 op), so any runtime that reads QDQ models (ONNX Runtime included)
// runs it; numaserve's engine runs those convs and matmuls on INT8 kernels
// (u8 x s8, VNNI/AMX where the CPU has them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace numaserve::engine {

enum class CalibrationMethod {
  kMinMax,      // the smallest and largest value seen
  kPercentile,  // the (100 - p)th and pth percentiles of the values seen
  kEntropy,     // the clipped range whose 255-step quantization loses the
                // least information (KL divergence; EntropyRange)
};

// "minmax", "percentile", "entropy"; INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<CalibrationMethod> CalibrationMethodFromName(const std::string& name);

// Rows of calibration input: inputs[i] holds `rows` rows of the model's
// input i (its shape without dim 0), FP32, row-major.
struct CalibrationBatch {
  int64_t rows = 0;
  std::vector<std::vector<float>> inputs;
};

struct QuantizeOptions {
  CalibrationMethod method = CalibrationMethod::kMinMax;
  // kPercentile: the upper percentile (the lower is 100 - percentile),
  // in (50, 100].
  double percentile = 99.999;
  // How the calibration runs compile the model (threads, gemm backend).
  CompileOptions compile;
};

// An activation's calibrated range and the UINT8 parameters chosen for it:
//   x ~ (q - zero_point) * scale, q in 0..255.
struct ActivationRange {
  std::string tensor;
  float min = 0;  // as calibrated (min-max or percentile), before widening to include 0
  float max = 0;
  float scale = 1;
  int32_t zero_point = 0;
};

// The UINT8 scale and zero point for values in [min, max]: the range is
// widened to include 0 (so 0 is exact, as padding needs), scale =
// (max - min) / 255, zero_point = round(-min / scale); a range of width 0
// gets scale 1. NaN or infinite bounds are an error (the caller names the
// tensor).
absl::StatusOr<ActivationRange> Uint8Range(float min, float max);

// The entropy method's choice for one tensor, from `histogram` (equal bins
// over [min, max] of the values seen, exact zeros left out: 0 is exact on
// every grid, and a ReLU's spike of zeros would otherwise decide the
// range): each candidate keeps the bins
// within a fraction f of the range on both sides of 0 (0 stays inside,
// values beyond fold into the edge bins), its distribution P is
// quantized onto 255 equal steps (each step's count spread over its
// nonzero bins: Q), and the candidate with the smallest KL(P || Q) wins;
// at least 255 bins are kept. Returns {lo, hi} within [min, max]; min and
// max themselves where the histogram is empty or too narrow to clip.
std::pair<float, float> EntropyRange(const std::vector<int64_t>& histogram, float min, float max);

// Symmetric INT8 per-channel quantization of `weights` (row-major,
// `dims`) along `axis`: scales[c] = max|w| over channel c / 127 (1 where
// the channel is all zeros), q = round_half_even(w / scale) in -127..127.
struct Int8Weights {
  std::vector<int8_t> values;
  std::vector<float> scales;
};
Int8Weights QuantizeWeightsPerChannel(const std::vector<float>& weights,
                                      const std::vector<int64_t>& dims, int64_t axis);

struct QuantizeReport {
  // "bn1 (BatchNormalization) into conv1": folded into the conv's weights
  // and bias before quantizing them.
  std::vector<std::string> folded;
  std::vector<std::string> quantized;  // "conv1 (Conv)", in graph order
  std::vector<std::string> skipped;    // "mm (MatMul): B is not an initializer"
  std::vector<ActivationRange> activations;
  int64_t calibration_rows = 0;
};

struct QuantizedModel {
  std::string onnx;  // the serialized QDQ ModelProto
  QuantizeReport report;
};

// Calibrates `model_path` on `calibration` (each batch's inputs in the
// order of InspectModel's inputs) and returns the QDQ model. Errors name
// the file: a model that does not import, an opset below 13 (per-channel
// DequantizeLinear), no Conv/MatMul/Gemm with FP32 initializer weights,
// calibration batches that do not match the inputs, an activation that
// is NaN or infinite.
absl::StatusOr<QuantizedModel> QuantizeModel(const std::string& model_path,
                                             const std::vector<CalibrationBatch>& calibration,
                                             const QuantizeOptions& options);

}  // namespace numaserve::engine
