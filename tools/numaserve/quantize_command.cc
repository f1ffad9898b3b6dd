#include "tools/numaserve/quantize_command.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/args.h"
#include "base/atomic_file.h"
#include "engine/model.h"
#include "engine/quantize/quantize.h"
#include "kernels/tensor.h"
#include "tools/numaserve/npy.h"
#include "training/idx_file.h"
#include "training/record_file.h"

namespace numaserve::cli {
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

namespace {

// The flags of `numaserve quantize`, with their defaults.
struct QuantizeOptions {
  std::string model_path, out_path, method_name = "minmax";
  std::vector<std::string> calibration_args;
  double percentile = 99.999;
  int64_t rows_limit = 1024, batch = 32, threads = 0;
  serving::ProcessOptions process;  // --max-isa, ...
};

// The model, its calibration data and method, and where the result goes.
void AddQuantizeFlags(base::ArgParser& parser, QuantizeOptions& o) {
  parser.AddString("model", &o.model_path, "the FP32 ONNX model (required)");
  parser.AddRepeated("calibration", &o.calibration_args,
                     "calibration data: FILE (a model with one input) or NAME=FILE per input; "
                     ".npy, a numaserve record file or an IDX image file (required)");
  parser.AddString("out", &o.out_path, "where to write the QDQ model (required)");
  parser.AddString("method", &o.method_name,
                   "activation ranges: minmax, percentile (of the values seen) or entropy "
                   "(the clipped range that loses the least information, by KL divergence)");
  parser.AddDouble("percentile", &o.percentile,
                   "--method percentile: the upper percentile kept (the lower is 100 minus it)");
  parser.AddInt("calibration-size", &o.rows_limit, "rows of calibration data used (0 = all)");
  parser.AddInt("batch", &o.batch, "rows per calibration run");
  parser.AddInt("threads", &o.threads, "kernel threads (0 = OMP_NUM_THREADS or all cores)");
}

// Checks the flags' values; the calibration method --method names.
absl::StatusOr<engine::CalibrationMethod> CheckQuantizeFlags(const QuantizeOptions& o) {
  if (o.model_path.empty()) return absl::InvalidArgumentError("--model FILE is required");
  if (o.out_path.empty()) return absl::InvalidArgumentError("--out FILE is required");
  if (o.calibration_args.empty()) {
    return absl::InvalidArgumentError("--calibration FILE is required");
  }
  if (o.batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch: expected a positive number, got ", o.batch));
  }
  if (o.rows_limit < 0) {
    return absl::InvalidArgumentError("--calibration-size: expected 0 (all) or a positive number");
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError("--threads: expected 0 or a positive number");
  }
  absl::StatusOr<engine::CalibrationMethod> method =
      engine::CalibrationMethodFromName(o.method_name);
  if (!method.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--method: ", method.status().message()));
  }
  if (o.out_path == o.model_path) {
    return absl::InvalidArgumentError("--out names the input model; write it elsewhere");
  }
  return method;
}

// Which file feeds which input (--calibration FILE or NAME=FILE), every
// name checked against the model's inputs.
absl::StatusOr<std::map<std::string, std::string>> CalibrationFiles(const QuantizeOptions& o,
                                                                    const engine::ModelInfo& info) {
  std::map<std::string, std::string> file_of;
  for (const std::string& a : o.calibration_args) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      if (info.inputs.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat("--calibration ", a, ": the model has ",
                                                       info.inputs.size(),
                                                       " inputs; give NAME=FILE for each"));
      }
      file_of[info.inputs[0].name] = a;
    } else {
      file_of[a.substr(0, eq)] = a.substr(eq + 1);
    }
  }
  for (const auto& [name, file] : file_of) {
    bool known = false;
    for (const engine::TensorInfo& in : info.inputs) known = known || in.name == name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("--calibration ", name, "=", file,
                                                     ": no input '", name, "' in ", o.model_path));
    }
  }
  return file_of;
}

// How the calibration data is read and cut into runs.
struct CalibrationPlan {
  std::map<std::string, std::string> file_of;  // input name -> file
  std::vector<int64_t> row_elements;           // per model input, in order
  int64_t batch = 0;                           // rows per calibration run
};

// The files, each input's elements per row and the rows per run (--batch,
// or 1 for a model with a static dim 0), checked against the model.
absl::StatusOr<CalibrationPlan> PlanCalibration(const QuantizeOptions& o,
                                                const engine::ModelInfo& info) {
  absl::StatusOr<std::map<std::string, std::string>> file_of = CalibrationFiles(o, info);
  if (!file_of.ok()) return file_of.status();
  CalibrationPlan plan;
  plan.file_of = *std::move(file_of);
  plan.batch = o.batch;
  // A static dim 0 is part of the row: those models run one row at a time.
  bool static_rows = false;
  for (const engine::TensorInfo& in : info.inputs) {
    if (plan.file_of.count(in.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("no --calibration data for input '", in.name, "'"));
    }
    if (in.shape.empty() || in.shape[0] != -1) static_rows = true;
    int64_t n = 1;
    for (size_t d = 1; d < in.shape.size(); ++d) n *= in.shape[d];
    plan.row_elements.push_back(n);
  }
  if (static_rows) {
    for (const engine::TensorInfo& in : info.inputs) {
      if (!in.shape.empty() && in.shape[0] != -1 && in.shape[0] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(o.model_path, ": input '", in.name, "' has a fixed first dim of ",
                         in.shape[0], "; only 1 or a dynamic one can be calibrated"));
      }
    }
    plan.batch = 1;
  }
  return plan;
}

// Reads every input's calibration file (up to `rows_limit` rows, 0: all)
// and cuts the rows all files have into runs of plan.batch rows.
absl::StatusOr<std::vector<engine::CalibrationBatch>> ReadCalibrationBatches(
    const CalibrationPlan& plan, const engine::ModelInfo& info, int64_t rows_limit) {
  const std::vector<int64_t>& row_elements = plan.row_elements;
  std::vector<CalibrationRows> data;
  int64_t rows = -1;
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    absl::StatusOr<CalibrationRows> r =
        ReadCalibrationFile(plan.file_of.at(info.inputs[i].name), row_elements[i], rows_limit);
    if (!r.ok()) return r.status();
    rows = rows < 0 ? r->rows : std::min(rows, r->rows);
    data.push_back(*std::move(r));
  }
  std::vector<engine::CalibrationBatch> batches;
  for (int64_t begin = 0; begin < rows; begin += plan.batch) {
    engine::CalibrationBatch b;
    b.rows = std::min(plan.batch, rows - begin);
    for (size_t i = 0; i < data.size(); ++i) {
      const float* first = data[i].values.data() + begin * row_elements[i];
      b.inputs.emplace_back(first, first + b.rows * row_elements[i]);
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

// What the quantization did: the rows and method, the nodes quantized and
// left FP32, and each activation's range; the BatchNormalizations folded
// into the convs before them first.
void PrintReport(const QuantizeOptions& o, engine::CalibrationMethod method,
                 const engine::QuantizeReport& report) {
  printf("calibrated on %lld rows (%s%s)\n", static_cast<long long>(report.calibration_rows),
         o.method_name.c_str(),
         method == engine::CalibrationMethod::kPercentile
             ? absl::StrFormat(" %g", o.percentile).c_str()
             : "");
  for (const std::string& f : report.folded) printf("folded %s\n", f.c_str());
  printf("quantized %zu nodes to INT8:", report.quantized.size());
  for (const std::string& n : report.quantized) printf(" %s", n.c_str());
  printf("\n");
  for (const std::string& s : report.skipped) printf("left FP32: %s\n", s.c_str());
  for (const engine::ActivationRange& r : report.activations) {
    printf("  %-40s range [%g, %g] scale %g zero point %d\n", r.tensor.c_str(), r.min, r.max,
           r.scale, r.zero_point);
  }
}

// Prints how far output `name` of the INT8 model (`b`) is from the FP32
// model's (`a`), and for a [rows, cols] output how often the argmax agrees.
void PrintOutputAgreement(const std::string& name, int64_t rows, const std::vector<int64_t>& shape,
                          const std::vector<float>& a, const std::vector<float>& b) {
  const int64_t n = *kernels::NumElementsChecked(shape);
  double largest = 0, error = 0;
  for (int64_t i = 0; i < n; ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(a[i])));
    error = std::max(error, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  std::string agree;
  const int64_t cols = shape.size() == 2 ? shape[1] : 0;
  if (cols > 1) {
    int64_t same = 0;
    for (int64_t r = 0; r < shape[0]; ++r) {
      const float* fa = a.data() + r * cols;
      const float* fb = b.data() + r * cols;
      same += std::max_element(fa, fa + cols) - fa == std::max_element(fb, fb + cols) - fb;
    }
    agree = absl::StrFormat(", same argmax in %lld of %lld rows", static_cast<long long>(same),
                            static_cast<long long>(shape[0]));
  }
  printf(
      "output %s on %lld calibration rows: largest |INT8 - FP32| %.4g = %.4f of the "
      "largest |FP32|%s\n",
      name.c_str(), static_cast<long long>(rows), error, largest > 0 ? error / largest : 0.0,
      agree.c_str());
}

// The check: both models on the first calibration batch, and how far
// each FP32 output of the quantized one is from the original's.
absl::Status CompareModels(const QuantizeOptions& o, const engine::CompileOptions& compile,
                           const engine::ModelInfo& info, const engine::CalibrationBatch& first) {
  auto fp32 = engine::CompiledModel::Load(o.model_path, compile);
  auto int8 = engine::CompiledModel::Load(o.out_path, compile);
  if (!fp32.ok()) return fp32.status();
  if (!int8.ok()) {
    return absl::Status(int8.status().code(),
                        absl::StrCat("the quantized model was written but does not load: ",
                                     int8.status().message()));
  }
  std::vector<const void*> in;
  for (const auto& v : first.inputs) in.push_back(v.data());
  const auto shapes = (*fp32)->OutputShapes(first.rows);
  std::vector<std::vector<float>> a(shapes.size()), b(shapes.size());
  std::vector<void*> out_a, out_b;
  for (size_t j = 0; j < shapes.size(); ++j) {
    auto n = kernels::NumElementsChecked(shapes[j]);
    if (!n.ok()) return n.status();
    a[j].resize(*n * 2);
    b[j].resize(*n * 2);
    out_a.push_back(a[j].data());
    out_b.push_back(b[j].data());
  }
  if (auto s = (*fp32)->Run(first.rows, in, out_a); !s.ok()) return s;
  if (auto s = (*int8)->Run(first.rows, in, out_b); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the quantized model does not run: ", s.message()));
  }
  for (size_t j = 0; j < shapes.size(); ++j) {
    if (info.outputs[j].type != engine::DataType::kFloat32) continue;
    PrintOutputAgreement(info.outputs[j].name, first.rows, shapes[j], a[j], b[j]);
  }
  return absl::OkStatus();
}

}  // namespace

int QuantizeCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process) {
  QuantizeOptions o;
  o.process = process;
  base::ArgParser parser(
      "quantize",
      "Quantize an FP32 ONNX model to INT8 (QDQ: per-channel INT8 weights, UINT8 "
      "activations calibrated on data) for Conv, MatMul and Gemm.");
  AddQuantizeFlags(parser, o);
  serving::AddProcessFlags(parser, o.process, serving::kKernelFlags);
  if (absl::Status s = parser.Parse(args); !s.ok()) return Fail(std::string(s.message()));
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (absl::Status s = serving::ApplyProcessOptions(o.process); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  absl::StatusOr<engine::CalibrationMethod> method = CheckQuantizeFlags(o);
  if (!method.ok()) return Fail(std::string(method.status().message()));

  absl::StatusOr<engine::ModelInfo> info = engine::InspectModel(o.model_path);
  if (!info.ok()) return Fail(std::string(info.status().message()));
  absl::StatusOr<CalibrationPlan> plan = PlanCalibration(o, *info);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));
  absl::StatusOr<std::vector<engine::CalibrationBatch>> batches =
      ReadCalibrationBatches(*plan, *info, o.rows_limit);
  if (!batches.ok()) return Fail(std::string(batches.status().message()));

  engine::QuantizeOptions options;
  options.method = *method;
  options.percentile = o.percentile;
  options.compile.num_threads = static_cast<int>(o.threads);
  absl::StatusOr<engine::QuantizedModel> q = engine::QuantizeModel(o.model_path, *batches, options);
  if (!q.ok()) return Fail(std::string(q.status().message()));
  if (absl::Status s = base::WriteFileAtomically(o.out_path, q->onnx); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  PrintReport(o, *method, q->report);

  if (absl::Status s = CompareModels(o, options.compile, *info, batches->front()); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  printf("wrote %s\n", o.out_path.c_str());
  return 0;
}

}  // namespace numaserve::cli
