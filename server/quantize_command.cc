#include "server/quantize_command.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model.h"
#include "engine/quantize.h"
#include "engine/training/checkpoint.h"
#include "engine/training/idx_file.h"
#include "engine/training/record_file.h"
#include "kernels/tensor.h"
#include "server/args.h"
#include "server/npy.h"

namespace numaserve::server {
namespace {

int Fail(const std::string& message) {
  fprintf(stderr, "numaserve quantize: %s\n", message.c_str());
  return 1;
}

template <typename T>
void Widen(const std::string& bytes, std::vector<float>* out) {
  const size_t n = bytes.size() / sizeof(T);
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    (*out)[i] = static_cast<float>(v);
  }
}

absl::StatusOr<std::vector<float>> NpyToFloat(const std::string& path, const NpyArray& a) {
  std::vector<float> out;
  const std::string& d = a.dtype;
  if (d == "<f4") {
    Widen<float>(a.data, &out);
  } else if (d == "<f8") {
    Widen<double>(a.data, &out);
  } else if (d == "|i1") {
    Widen<int8_t>(a.data, &out);
  } else if (d == "|u1" || d == "|b1") {
    Widen<uint8_t>(a.data, &out);
  } else if (d == "<i2") {
    Widen<int16_t>(a.data, &out);
  } else if (d == "<u2") {
    Widen<uint16_t>(a.data, &out);
  } else if (d == "<i4") {
    Widen<int32_t>(a.data, &out);
  } else if (d == "<u4") {
    Widen<uint32_t>(a.data, &out);
  } else if (d == "<i8") {
    Widen<int64_t>(a.data, &out);
  } else if (d == "<u8") {
    Widen<uint64_t>(a.data, &out);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": dtype ", d, " is not supported for calibration (use float32)"));
  }
  return out;
}

// Bytes 0..7 of the file ("" if shorter or unreadable).
std::string Magic(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char buf[8] = {};
  if (!f.read(buf, sizeof(buf))) return "";
  return std::string(buf, sizeof(buf));
}

absl::Status RowMismatch(const std::string& path, int64_t file_row, int64_t model_row) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": a row holds ", file_row,
                                                 " values, a row of the model input ", model_row));
}

}  // namespace

absl::StatusOr<CalibrationRows> ReadCalibrationFile(const std::string& path, int64_t row_elements,
                                                    int64_t limit) {
  const std::string magic = Magic(path);
  if (magic.empty()) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot open the calibration file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": too short for any calibration format"));
  }
  CalibrationRows out;
  if (magic.compare(0, 6, "\x93NUMPY") == 0) {
    absl::StatusOr<NpyArray> a = ReadNpy(path);
    if (!a.ok()) return a.status();
    if (a->shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a scalar; calibration data is [rows, ...]"));
    }
    int64_t row = 1;
    for (size_t d = 1; d < a->shape.size(); ++d) row *= a->shape[d];
    if (row != row_elements) return RowMismatch(path, row, row_elements);
    absl::StatusOr<std::vector<float>> v = NpyToFloat(path, *a);
    if (!v.ok()) return v.status();
    out.rows = a->shape[0];
    out.values = *std::move(v);
  } else if (magic == "NSREC001") {
    absl::StatusOr<training::Dataset> data = training::ReadRecordFile(path, limit);
    if (!data.ok()) return data.status();
    if (data->example_elements() != row_elements) {
      return RowMismatch(path, data->example_elements(), row_elements);
    }
    out.rows = data->size;
    out.values.resize(data->images.size());
    for (size_t i = 0; i < data->images.size(); ++i) out.values[i] = data->images[i] / 255.0f;
  } else if ((magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08) ||
             (static_cast<uint8_t>(magic[0]) == 0x1f && static_cast<uint8_t>(magic[1]) == 0x8b)) {
    absl::StatusOr<training::IdxArray> idx = training::ReadIdxFile(path);
    if (!idx.ok()) return idx.status();
    if (idx->dims.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no rows"));
    int64_t row = 1;
    for (size_t d = 1; d < idx->dims.size(); ++d) row *= idx->dims[d];
    if (row != row_elements) return RowMismatch(path, row, row_elements);
    out.rows = idx->dims[0];
    out.values.resize(idx->data.size());
    for (size_t i = 0; i < idx->data.size(); ++i) out.values[i] = idx->data[i] / 255.0f;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a calibration file (.npy, a numaserve record file or an IDX image file)"));
  }
  if (limit > 0 && out.rows > limit) {
    out.rows = limit;
    out.values.resize(static_cast<size_t>(limit * row_elements));
  }
  if (out.rows <= 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no rows"));
  return out;
}

int QuantizeCommand(const std::vector<std::string>& args) {
  std::string model_path, out_path, method_name = "minmax";
  std::vector<std::string> calibration_args;
  double percentile = 99.999;
  int64_t rows_limit = 1024, batch = 32, threads = 0;
  ArgParser parser("quantize",
                   "Quantize an FP32 ONNX model to INT8 (QDQ: per-channel INT8 weights, UINT8 "
                   "activations calibrated on data) for Conv, MatMul and Gemm.");
  parser.AddString("model", &model_path, "the FP32 ONNX model (required)");
  parser.AddRepeated("calibration", &calibration_args,
                     "calibration data: FILE (a model with one input) or NAME=FILE per input; "
                     ".npy, a numaserve record file or an IDX image file (required)");
  parser.AddString("out", &out_path, "where to write the QDQ model (required)");
  parser.AddString("method", &method_name,
                   "activation ranges: minmax, percentile (of the values seen) or entropy "
                   "(the clipped range that loses the least information, by KL divergence)");
  parser.AddDouble("percentile", &percentile,
                   "--method percentile: the upper percentile kept (the lower is 100 minus it)");
  parser.AddInt("calibration-size", &rows_limit, "rows of calibration data used (0 = all)");
  parser.AddInt("batch", &batch, "rows per calibration run");
  parser.AddInt("threads", &threads, "kernel threads (0 = OMP_NUM_THREADS or all cores)");
  if (absl::Status s = parser.Parse(args); !s.ok()) return Fail(std::string(s.message()));
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (model_path.empty()) return Fail("--model FILE is required");
  if (out_path.empty()) return Fail("--out FILE is required");
  if (calibration_args.empty()) return Fail("--calibration FILE is required");
  if (batch <= 0) return Fail(absl::StrCat("--batch: expected a positive number, got ", batch));
  if (rows_limit < 0) return Fail("--calibration-size: expected 0 (all) or a positive number");
  if (threads < 0) return Fail("--threads: expected 0 or a positive number");
  absl::StatusOr<engine::CalibrationMethod> method = engine::CalibrationMethodFromName(method_name);
  if (!method.ok()) return Fail(absl::StrCat("--method: ", method.status().message()));
  if (out_path == model_path) return Fail("--out names the input model; write it elsewhere");

  absl::StatusOr<engine::ModelInfo> info = engine::InspectModel(model_path);
  if (!info.ok()) return Fail(std::string(info.status().message()));
  // Which file feeds which input.
  std::map<std::string, std::string> file_of;
  for (const std::string& a : calibration_args) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      if (info->inputs.size() != 1) {
        return Fail(absl::StrCat("--calibration ", a, ": the model has ", info->inputs.size(),
                                 " inputs; give NAME=FILE for each"));
      }
      file_of[info->inputs[0].name] = a;
    } else {
      file_of[a.substr(0, eq)] = a.substr(eq + 1);
    }
  }
  for (const auto& [name, file] : file_of) {
    bool known = false;
    for (const engine::TensorInfo& in : info->inputs) known = known || in.name == name;
    if (!known) {
      return Fail(absl::StrCat("--calibration ", name, "=", file, ": no input '", name, "' in ",
                               model_path));
    }
  }
  // A static dim 0 is part of the row: those models run one row at a time.
  bool static_rows = false;
  std::vector<int64_t> row_elements;
  for (const engine::TensorInfo& in : info->inputs) {
    if (file_of.count(in.name) == 0) {
      return Fail(absl::StrCat("no --calibration data for input '", in.name, "'"));
    }
    if (in.shape.empty() || in.shape[0] != -1) static_rows = true;
    int64_t n = 1;
    for (size_t d = 1; d < in.shape.size(); ++d) n *= in.shape[d];
    row_elements.push_back(n);
  }
  if (static_rows) {
    for (const engine::TensorInfo& in : info->inputs) {
      if (!in.shape.empty() && in.shape[0] != -1 && in.shape[0] != 1) {
        return Fail(absl::StrCat(model_path, ": input '", in.name, "' has a fixed first dim of ",
                                 in.shape[0], "; only 1 or a dynamic one can be calibrated"));
      }
    }
    batch = 1;
  }
  std::vector<CalibrationRows> data;
  int64_t rows = -1;
  for (size_t i = 0; i < info->inputs.size(); ++i) {
    absl::StatusOr<CalibrationRows> r =
        ReadCalibrationFile(file_of[info->inputs[i].name], row_elements[i], rows_limit);
    if (!r.ok()) return Fail(std::string(r.status().message()));
    rows = rows < 0 ? r->rows : std::min(rows, r->rows);
    data.push_back(*std::move(r));
  }
  std::vector<engine::CalibrationBatch> batches;
  for (int64_t begin = 0; begin < rows; begin += batch) {
    engine::CalibrationBatch b;
    b.rows = std::min(batch, rows - begin);
    for (size_t i = 0; i < data.size(); ++i) {
      const float* first = data[i].values.data() + begin * row_elements[i];
      b.inputs.emplace_back(first, first + b.rows * row_elements[i]);
    }
    batches.push_back(std::move(b));
  }
  data.clear();

  engine::QuantizeOptions options;
  options.method = *method;
  options.percentile = percentile;
  options.compile.num_threads = static_cast<int>(threads);
  absl::StatusOr<engine::QuantizedModel> q = engine::QuantizeModel(model_path, batches, options);
  if (!q.ok()) return Fail(std::string(q.status().message()));
  if (absl::Status s = training::WriteFileAtomically(out_path, q->onnx); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  const engine::QuantizeReport& report = q->report;
  printf("calibrated on %lld rows (%s%s)\n", static_cast<long long>(report.calibration_rows),
         method_name.c_str(),
         *method == engine::CalibrationMethod::kPercentile
             ? absl::StrFormat(" %g", percentile).c_str()
             : "");
  printf("quantized %zu nodes to INT8:", report.quantized.size());
  for (const std::string& n : report.quantized) printf(" %s", n.c_str());
  printf("\n");
  for (const std::string& s : report.skipped) printf("left FP32: %s\n", s.c_str());
  for (const engine::ActivationRange& r : report.activations) {
    printf("  %-40s range [%g, %g] scale %g zero point %d\n", r.tensor.c_str(), r.min, r.max,
           r.scale, r.zero_point);
  }

  // The check: both models on the first calibration batch.
  engine::CompileOptions compile = options.compile;
  auto fp32 = engine::CompiledModel::Load(model_path, compile);
  auto int8 = engine::CompiledModel::Load(out_path, compile);
  if (!fp32.ok()) return Fail(std::string(fp32.status().message()));
  if (!int8.ok()) {
    return Fail(absl::StrCat("the quantized model was written but does not load: ",
                             int8.status().message()));
  }
  const engine::CalibrationBatch& first = batches.front();
  std::vector<const void*> in;
  for (const auto& v : first.inputs) in.push_back(v.data());
  const auto shapes = (*fp32)->OutputShapes(first.rows);
  std::vector<std::vector<float>> a(shapes.size()), b(shapes.size());
  std::vector<void*> out_a, out_b;
  for (size_t j = 0; j < shapes.size(); ++j) {
    auto n = kernels::NumElementsChecked(shapes[j]);
    if (!n.ok()) return Fail(std::string(n.status().message()));
    a[j].resize(*n * 2);
    b[j].resize(*n * 2);
    out_a.push_back(a[j].data());
    out_b.push_back(b[j].data());
  }
  if (auto s = (*fp32)->Run(first.rows, in, out_a); !s.ok()) return Fail(std::string(s.message()));
  if (auto s = (*int8)->Run(first.rows, in, out_b); !s.ok()) {
    return Fail(absl::StrCat("the quantized model does not run: ", s.message()));
  }
  for (size_t j = 0; j < shapes.size(); ++j) {
    if (info->outputs[j].type != engine::DataType::kFloat32) continue;
    const int64_t n = *kernels::NumElementsChecked(shapes[j]);
    double largest = 0, error = 0;
    for (int64_t i = 0; i < n; ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(a[j][i])));
      error = std::max(error, std::fabs(static_cast<double>(a[j][i]) - b[j][i]));
    }
    std::string agree;
    const int64_t cols = shapes[j].size() == 2 ? shapes[j][1] : 0;
    if (cols > 1) {
      int64_t same = 0;
      for (int64_t r = 0; r < shapes[j][0]; ++r) {
        const float* fa = a[j].data() + r * cols;
        const float* fb = b[j].data() + r * cols;
        same += std::max_element(fa, fa + cols) - fa == std::max_element(fb, fb + cols) - fb;
      }
      agree = absl::StrFormat(", same argmax in %lld of %lld rows", static_cast<long long>(same),
                              static_cast<long long>(shapes[j][0]));
    }
    printf(
        "output %s on %lld calibration rows: largest |INT8 - FP32| %.4g = %.4f of the "
        "largest |FP32|%s\n",
        info->outputs[j].name.c_str(), static_cast<long long>(first.rows), error,
        largest > 0 ? error / largest : 0.0, agree.c_str());
  }
  printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace numaserve::server
