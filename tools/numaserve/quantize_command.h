// `numaserve quantize --model M.onnx --calibration DATA --out M_int8.onnx`:
// post-training INT8 quantization into the QDQ form (engine/quantize/quantize.h),
// calibrated on DATA, then checked: the quantized model runs here on the
// first calibration batch and its outputs are compared with FP32.
//
// DATA, one file per model input (NAME=FILE where the model has several),
// is read by its content:
//   - NumPy .npy: [rows, ...] in any numeric dtype, converted to FP32;
//   - numaserve's packed record format (NSREC001, `numaserve-dataset`) or
//     an IDX image file (gzipped or not, Fashion-MNIST's form): uint8
//     examples scaled to [0, 1], as training feeds them.
// Each row must hold as many values as one row of the model input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "serving/workers/process_options.h"

namespace numaserve::cli {

// `process`: the process settings main read from the environment, the
// defaults of their flags (--max-isa, ...).
int QuantizeCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process);

// Rows of one calibration file as FP32 (exposed for tests): at most
// `limit` rows (0: all), each of `row_elements` values; errors name the
// file and what does not match.
struct CalibrationRows {
  int64_t rows = 0;
  std::vector<float> values;
};
absl::StatusOr<CalibrationRows> ReadCalibrationFile(const std::string& path, int64_t row_elements,
                                                    int64_t limit);

}  // namespace numaserve::cli
