#include "tests/conformance/onnx_conformance.h"

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/ir/typed_tensor.h"
#include "engine/model.h"

namespace numaserve::conformance {
namespace {

namespace fs = std::filesystem;

bool ReadProto(const fs::path& path, google::protobuf::Message& message) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return false;
  std::stringstream bytes;
  bytes << file.rdbuf();
  return message.ParseFromString(bytes.str());
}

engine::DataType FromOnnxType(int32_t t) {
  switch (t) {
    case onnx::TensorProto::BOOL:
      return engine::DataType::kBool;
    case onnx::TensorProto::UINT8:
      return engine::DataType::kUint8;
    case onnx::TensorProto::INT8:
      return engine::DataType::kInt8;
    case onnx::TensorProto::UINT16:
      return engine::DataType::kUint16;
    case onnx::TensorProto::INT16:
      return engine::DataType::kInt16;
    case onnx::TensorProto::INT32:
      return engine::DataType::kInt32;
    case onnx::TensorProto::UINT32:
      return engine::DataType::kUint32;
    case onnx::TensorProto::INT64:
      return engine::DataType::kInt64;
    case onnx::TensorProto::UINT64:
      return engine::DataType::kUint64;
    case onnx::TensorProto::FLOAT16:
      return engine::DataType::kFloat16;
    case onnx::TensorProto::BFLOAT16:
      return engine::DataType::kBFloat16;
    case onnx::TensorProto::FLOAT:
      return engine::DataType::kFloat32;
    case onnx::TensorProto::DOUBLE:
      return engine::DataType::kFloat64;
    default:
      return engine::DataType::kUnknown;
  }
}

template <typename T, typename Repeated>
bool CopyField(const Repeated& field, int64_t count, std::vector<uint8_t>& out) {
  if (field.size() != count) return false;
  T* dst = reinterpret_cast<T*>(out.data());
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<T>(field.Get(i));
  return true;
}

// The tensor's elements as a typed tensor (raw_data or the typed field).
bool ReadTensor(const onnx::TensorProto& t, engine::TypedTensor& out) {
  const engine::DataType type = FromOnnxType(t.data_type());
  if (type == engine::DataType::kUnknown) return false;
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 30)) return false;
    count *= d;
    if (count > (int64_t{1} << 30)) return false;
  }
  out = engine::TypedTensor(type, engine::Shape(t.dims().begin(), t.dims().end()));
  if (!t.raw_data().empty()) {
    if (t.raw_data().size() != out.bytes.size()) return false;
    std::memcpy(out.bytes.data(), t.raw_data().data(), out.bytes.size());
    return true;
  }
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      return CopyField<float>(t.float_data(), count, out.bytes);
    case onnx::TensorProto::DOUBLE:
      return CopyField<double>(t.double_data(), count, out.bytes);
    case onnx::TensorProto::INT64:
      return CopyField<int64_t>(t.int64_data(), count, out.bytes);
    case onnx::TensorProto::UINT64:
      return CopyField<uint64_t>(t.uint64_data(), count, out.bytes);
    case onnx::TensorProto::UINT32:
      return CopyField<uint32_t>(t.uint64_data(), count, out.bytes);
    case onnx::TensorProto::INT32:
      return CopyField<int32_t>(t.int32_data(), count, out.bytes);
    case onnx::TensorProto::INT16:
      return CopyField<int16_t>(t.int32_data(), count, out.bytes);
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16:
      return CopyField<uint16_t>(t.int32_data(), count, out.bytes);
    case onnx::TensorProto::INT8:
      return CopyField<int8_t>(t.int32_data(), count, out.bytes);
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL:
      return CopyField<uint8_t>(t.int32_data(), count, out.bytes);
    default:
      return false;
  }
}

// The suite stores BFLOAT16 data as UINT16 tensors (the same bits, as
// numpy has no bfloat16): read them as the BFLOAT16 the graph declares.
void AdoptBFloat16(const onnx::ValueInfoProto& info, onnx::TensorProto& t) {
  if (t.data_type() == onnx::TensorProto::UINT16 && info.type().has_tensor_type() &&
      info.type().tensor_type().elem_type() == onnx::TensorProto::BFLOAT16) {
    t.set_data_type(onnx::TensorProto::BFLOAT16);
  }
}

// Inputs the engine needs as constants (shapes, axes, pads, slice bounds,
// resize parameters, ...), by op: the input indices. A graph input used in
// such a slot is frozen into an initializer (the test data are fixed).
bool IsParameterSlot(const std::string& op, int index) {
  if (index == 0) return op == "ConstantOfShape";
  if (op == "Reshape" || op == "Expand" || op == "Tile" || op == "Split" || op == "Squeeze" ||
      op == "Unsqueeze" || op == "TopK" || op == "Upsample" || op == "Resize" || op == "Slice" ||
      op == "OneHot" || op == "CumSum" || op == "Range") {
    return true;
  }
  if (op == "Pad") return index == 1 || index == 3;
  if (op == "Dropout") return true;  // ratio, training_mode
  if (op.rfind("Reduce", 0) == 0) return index == 1;
  return false;
}

// True when some use of graph input `name` is a parameter slot.
bool ParameterInput(const onnx::GraphProto& graph, const std::string& name) {
  for (const auto& node : graph.node()) {
    for (int i = 0; i < node.input_size(); ++i) {
      if (node.input(i) == name && IsParameterSlot(node.op_type(), i)) return true;
    }
  }
  return false;
}

std::vector<fs::path> Sorted(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) out.push_back(entry.path());
  }
  // input_10 after input_9: order by the number after the prefix.
  std::sort(out.begin(), out.end(), [&](const fs::path& a, const fs::path& b) {
    const std::string sa = a.filename().string().substr(prefix.size());
    const std::string sb = b.filename().string().substr(prefix.size());
    return std::atoi(sa.c_str()) < std::atoi(sb.c_str());
  });
  return out;
}

CaseResult Result(const std::string& name, Outcome outcome, std::string detail) {
  return {name, outcome, std::move(detail)};
}

// A data set's inputs and expected outputs, the graph with its parameter
// inputs frozen into initializers.
struct DataSet {
  onnx::ModelProto model;
  std::vector<fs::path> input_files;
  std::vector<engine::TypedTensor> inputs;
  std::vector<onnx::TensorProto> expected;
};

// Reads the data set's input files: parameter inputs become initializers
// of `set->model` (and leave its input list), the others `set->inputs`.
// An error result when the data do not fit the graph.
std::optional<CaseResult> ReadInputs(const std::string& name, const fs::path& data_dir,
                                     DataSet* set) {
  onnx::ModelProto& model = set->model;
  onnx::GraphProto& graph = *model.mutable_graph();
  std::vector<std::string> initializer_names;
  for (const auto& t : graph.initializer()) initializer_names.push_back(t.name());
  std::vector<int> runtime_inputs;  // indices into graph.input()
  for (int i = 0; i < graph.input_size(); ++i) {
    if (std::find(initializer_names.begin(), initializer_names.end(), graph.input(i).name()) ==
        initializer_names.end()) {
      runtime_inputs.push_back(i);
    }
  }
  set->input_files = Sorted(data_dir, "input_");
  const std::vector<fs::path>& input_files = set->input_files;
  if (input_files.size() != runtime_inputs.size()) {
    return Result(name, Outcome::kUnsupported,
                  absl::StrCat(input_files.size(), " input files for ", runtime_inputs.size(),
                               " graph inputs (optional inputs)"));
  }
  std::vector<int> frozen;
  for (size_t i = 0; i < input_files.size(); ++i) {
    onnx::TensorProto t;
    if (!graph.input(runtime_inputs[i]).type().has_tensor_type()) {
      return Result(
          name, Outcome::kUnsupported,
          absl::StrCat("input '", graph.input(runtime_inputs[i]).name(), "' is not a tensor"));
    }
    if (!ReadProto(input_files[i], t)) {
      return Result(name, Outcome::kUnsupported,
                    absl::StrCat(input_files[i].string(), " is not a TensorProto"));
    }
    const onnx::ValueInfoProto& info = graph.input(runtime_inputs[i]);
    AdoptBFloat16(info, t);
    if (FromOnnxType(t.data_type()) == engine::DataType::kUnknown) {
      return Result(name, Outcome::kUnsupported,
                    absl::StrCat("input '", info.name(), "' has element type ", t.data_type()));
    }
    if (ParameterInput(graph, info.name())) {
      t.set_name(info.name());
      *graph.add_initializer() = t;
      frozen.push_back(runtime_inputs[i]);
      continue;
    }
    engine::TypedTensor data;
    if (!ReadTensor(t, data)) return Result(name, Outcome::kFailed, "bad input data");
    set->inputs.push_back(std::move(data));
  }
  // Drop frozen inputs from the graph's input list (from IR version 4,
  // initializers need not be listed as inputs; before, they must be).
  for (auto it = frozen.rbegin(); model.ir_version() >= 4 && it != frozen.rend(); ++it) {
    graph.mutable_input()->DeleteSubrange(*it, 1);
  }
  return std::nullopt;
}

// Reads the data set's expected outputs into `set->expected`; an error
// result when they do not fit the graph.
std::optional<CaseResult> ReadExpected(const std::string& name, const fs::path& data_dir,
                                       DataSet* set) {
  const onnx::GraphProto& graph = set->model.graph();
  const std::vector<fs::path> output_files = Sorted(data_dir, "output_");
  std::vector<onnx::TensorProto>& expected = set->expected;
  expected.resize(output_files.size());
  for (const auto& output : graph.output()) {
    if (!output.type().has_tensor_type()) {
      return Result(name, Outcome::kUnsupported,
                    absl::StrCat("output '", output.name(), "' is not a tensor"));
    }
  }
  for (size_t j = 0; j < output_files.size(); ++j) {
    if (!ReadProto(output_files[j], expected[j])) {
      return Result(name, Outcome::kUnsupported, "unreadable output file");
    }
    if (j < static_cast<size_t>(graph.output_size())) AdoptBFloat16(graph.output(j), expected[j]);
    if (FromOnnxType(expected[j].data_type()) == engine::DataType::kUnknown) {
      return Result(name, Outcome::kUnsupported,
                    absl::StrCat("output ", j, " has element type ", expected[j].data_type()));
    }
  }
  return std::nullopt;
}

// The compiled model's inputs and outputs against the data set's: counts,
// element types, and the output shapes at `batch`. Allocates `outputs`.
std::optional<CaseResult> CheckSignature(const std::string& name, engine::CompiledModel& m,
                                         const DataSet& set, int64_t batch,
                                         std::vector<engine::TypedTensor>* outputs) {
  const std::vector<engine::TypedTensor>& inputs = set.inputs;
  const std::vector<onnx::TensorProto>& expected = set.expected;
  if (m.info().inputs.size() != inputs.size()) {
    return Result(
        name, Outcome::kFailed,
        absl::StrCat("model has ", m.info().inputs.size(), " inputs, data ", inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (m.info().inputs[i].type != inputs[i].type) {
      return Result(
          name, Outcome::kFailed,
          absl::StrCat("input ", i, " is ", engine::DataTypeName(inputs[i].type),
                       ", the model expects ", engine::DataTypeName(m.info().inputs[i].type)));
    }
  }
  const auto shapes = m.OutputShapes(batch);
  for (size_t j = 0; j < expected.size(); ++j) {
    std::vector<int64_t> want_shape(expected[j].dims().begin(), expected[j].dims().end());
    if (j >= shapes.size() || shapes[j] != want_shape) {
      return Result(name, Outcome::kFailed, absl::StrCat("output ", j, " shape differs"));
    }
    const engine::DataType want_type = FromOnnxType(expected[j].data_type());
    if (m.info().outputs[j].type != want_type) {
      return Result(
          name, Outcome::kFailed,
          absl::StrCat("output ", j, " is ", engine::DataTypeName(m.info().outputs[j].type),
                       ", the data ", engine::DataTypeName(want_type)));
    }
    outputs->emplace_back(want_type, want_shape);
  }
  return std::nullopt;
}

// The outputs against the expected ones: integers and BOOL bit-equal,
// floats within atol + rtol * |want| (NaN matches NaN, inf its sign).
CaseResult Compare(const std::string& name, const std::vector<engine::TypedTensor>& outputs,
                   const std::vector<onnx::TensorProto>& expected, const Options& options) {
  for (size_t j = 0; j < expected.size(); ++j) {
    engine::TypedTensor want;
    if (!ReadTensor(expected[j], want)) return Result(name, Outcome::kFailed, "bad output data");
    const bool exact = !engine::IsFloatType(want.type);
    for (int64_t i = 0; i < want.size(); ++i) {
      if (exact) {
        // Integers and BOOL: the same bits.
        const size_t es = want.element_size();
        if (std::memcmp(outputs[j].bytes.data() + i * es, want.bytes.data() + i * es, es) != 0) {
          return Result(name, Outcome::kFailed,
                        absl::StrCat("output ", j, " element ", i, ": got ", outputs[j].GetInt64(i),
                                     ", want ", want.GetInt64(i)));
        }
        continue;
      }
      const double got = outputs[j].GetDouble(i), w = want.GetDouble(i);
      const bool both_nan = std::isnan(got) && std::isnan(w);
      const bool same_inf = std::isinf(got) && std::isinf(w) && (got > 0) == (w > 0);
      if (both_nan || same_inf) continue;
      if (!(std::fabs(got - w) <= options.atol + options.rtol * std::fabs(w))) {
        return Result(name, Outcome::kFailed,
                      absl::StrCat("output ", j, " element ", i, ": got ", got, ", want ", w));
      }
    }
  }
  return Result(name, Outcome::kPassed, "");
}

// One data set against the model (frozen inputs are per data set).
CaseResult RunDataSet(const std::string& name, const onnx::ModelProto& original,
                      const fs::path& data_dir, const Options& options) {
  DataSet set;
  set.model = original;
  if (auto error = ReadInputs(name, data_dir, &set)) return *std::move(error);
  if (auto error = ReadExpected(name, data_dir, &set)) return *std::move(error);
  const std::string path =
      absl::StrCat(options.scratch_dir, "/numaserve_conformance_", getpid(), "_", name, ".onnx");
  {
    std::ofstream out(path, std::ios::binary);
    set.model.SerializeToOstream(&out);
  }
  auto compiled = engine::CompiledModel::Load(path, {});
  std::remove(path.c_str());
  if (!compiled.ok()) {
    const Outcome outcome = compiled.status().code() == absl::StatusCode::kUnimplemented
                                ? Outcome::kUnsupported
                                : Outcome::kFailed;
    return Result(name, outcome, std::string(compiled.status().message()));
  }
  engine::CompiledModel& m = **compiled;
  const std::vector<engine::TypedTensor>& inputs = set.inputs;
  const std::vector<onnx::TensorProto>& expected = set.expected;
  if (m.info().outputs.size() != expected.size()) {
    return Result(
        name, Outcome::kFailed,
        absl::StrCat("model has ", m.info().outputs.size(), " outputs, data ", expected.size()));
  }
  int64_t batch = 1;
  if (m.info().batched && !m.info().inputs.empty()) {
    onnx::TensorProto t;
    ReadProto(set.input_files[0], t);
    batch = t.dims_size() > 0 ? t.dims(0) : 1;
  }
  std::vector<engine::TypedTensor> outputs;
  if (auto error = CheckSignature(name, m, set, batch, &outputs)) return *std::move(error);
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  std::vector<std::vector<uint8_t>> empty(inputs.size() + expected.size(),
                                          std::vector<uint8_t>(8));  // for empty tensors
  for (size_t i = 0; i < inputs.size(); ++i) {
    in_ptrs.push_back(inputs[i].bytes.empty() ? empty[i].data() : inputs[i].bytes.data());
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    out_ptrs.push_back(outputs[j].bytes.empty() ? empty[inputs.size() + j].data()
                                                : outputs[j].bytes.data());
  }
  if (absl::Status s = m.Run(batch, in_ptrs, out_ptrs); !s.ok()) {
    return Result(
        name,
        s.code() == absl::StatusCode::kUnimplemented ? Outcome::kUnsupported : Outcome::kFailed,
        std::string(s.message()));
  }
  return Compare(name, outputs, expected, options);
}

}  // namespace

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPassed:
      return "passed";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kUnsupported:
      return "unsupported";
  }
  return "?";
}

CaseResult RunCase(const std::string& case_dir, const Options& options) {
  const std::string name = fs::path(case_dir).filename().string();
  onnx::ModelProto model;
  if (!ReadProto(fs::path(case_dir) / "model.onnx", model)) {
    return Result(name, Outcome::kUnsupported, "no readable model.onnx");
  }
  const std::vector<fs::path> sets = Sorted(case_dir, "test_data_set_");
  if (sets.empty()) return Result(name, Outcome::kUnsupported, "no test data sets");
  CaseResult last;
  for (const fs::path& set : sets) {
    last = RunDataSet(name, model, set, options);
    if (last.outcome != Outcome::kPassed) return last;
  }
  return last;
}

std::vector<CaseResult> RunSuite(const std::string& suite_dir, const Options& options) {
  std::vector<std::string> cases;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(suite_dir, ec)) {
    if (entry.is_directory()) cases.push_back(entry.path().string());
  }
  std::sort(cases.begin(), cases.end());
  std::vector<CaseResult> results;
  for (const std::string& c : cases) results.push_back(RunCase(c, options));
  return results;
}

Tally Count(const std::vector<CaseResult>& results) {
  Tally t;
  for (const CaseResult& r : results) {
    (r.outcome == Outcome::kPassed   ? t.passed
     : r.outcome == Outcome::kFailed ? t.failed
                                     : t.unsupported)++;
  }
  return t;
}

}  // namespace numaserve::conformance
