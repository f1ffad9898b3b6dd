#include "tests/conformance/onnx_conformance.h"

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
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

bool IsFrozenType(int32_t t) {
  return t == onnx::TensorProto::INT64 || t == onnx::TensorProto::INT32 ||
         t == onnx::TensorProto::BOOL;
}

// FP32 elements of a FLOAT tensor proto.
bool FloatData(const onnx::TensorProto& t, std::vector<float>& out) {
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > (int64_t{1} << 30)) return false;
    count *= d;
    if (count > (int64_t{1} << 30)) return false;
  }
  out.resize(count);
  if (!t.raw_data().empty()) {
    if (t.raw_data().size() != static_cast<size_t>(count) * sizeof(float)) return false;
    std::memcpy(out.data(), t.raw_data().data(), t.raw_data().size());
    return true;
  }
  if (t.float_data_size() != count) return false;
  std::copy(t.float_data().begin(), t.float_data().end(), out.begin());
  return true;
}

// True when every use of graph input `name` is a parameter the engine needs
// as a constant (Resize/Upsample's roi, scales, sizes): frozen like integer
// inputs, since the test data are fixed.
bool OnlyParameterInput(const onnx::GraphProto& graph, const std::string& name) {
  bool used = false;
  for (const auto& node : graph.node()) {
    for (int i = 0; i < node.input_size(); ++i) {
      if (node.input(i) != name) continue;
      used = true;
      const bool parameter = (node.op_type() == "Resize" || node.op_type() == "Upsample") && i >= 1;
      if (!parameter) return false;
    }
  }
  return used;
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

// One data set against the model (frozen inputs are per data set).
CaseResult RunDataSet(const std::string& name, const onnx::ModelProto& original,
                      const fs::path& data_dir, const Options& options) {
  onnx::ModelProto model = original;
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
  const std::vector<fs::path> input_files = Sorted(data_dir, "input_");
  const std::vector<fs::path> output_files = Sorted(data_dir, "output_");
  if (input_files.size() != runtime_inputs.size()) {
    return Result(name, Outcome::kUnsupported,
                  absl::StrCat(input_files.size(), " input files for ", runtime_inputs.size(),
                               " graph inputs (optional inputs)"));
  }
  std::vector<std::vector<float>> inputs;
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
    if (t.data_type() == onnx::TensorProto::FLOAT && !OnlyParameterInput(graph, info.name())) {
      std::vector<float> data;
      if (!FloatData(t, data)) return Result(name, Outcome::kFailed, "bad FP32 input data");
      if (data.empty()) data.push_back(0.0f);  // a valid pointer for an empty tensor
      inputs.push_back(std::move(data));
    } else if (IsFrozenType(t.data_type()) || t.data_type() == onnx::TensorProto::FLOAT) {
      t.set_name(info.name());
      *graph.add_initializer() = t;
      frozen.push_back(runtime_inputs[i]);
    } else {
      return Result(name, Outcome::kUnsupported,
                    absl::StrCat("input '", info.name(), "' has element type ", t.data_type()));
    }
  }
  // Drop frozen inputs from the graph's input list (from IR version 4,
  // initializers need not be listed as inputs; before, they must be).
  for (auto it = frozen.rbegin(); model.ir_version() >= 4 && it != frozen.rend(); ++it) {
    graph.mutable_input()->DeleteSubrange(*it, 1);
  }
  std::vector<onnx::TensorProto> expected(output_files.size());
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
    if (expected[j].data_type() != onnx::TensorProto::FLOAT) {
      return Result(name, Outcome::kUnsupported,
                    absl::StrCat("output ", j, " has element type ", expected[j].data_type()));
    }
  }
  const std::string path =
      absl::StrCat(options.scratch_dir, "/numaserve_conformance_", getpid(), "_", name, ".onnx");
  {
    std::ofstream out(path, std::ios::binary);
    model.SerializeToOstream(&out);
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
  if (m.info().outputs.size() != expected.size()) {
    return Result(
        name, Outcome::kFailed,
        absl::StrCat("model has ", m.info().outputs.size(), " outputs, data ", expected.size()));
  }
  int64_t batch = 1;
  if (m.info().batched && !m.info().inputs.empty()) {
    onnx::TensorProto t;
    ReadProto(input_files[0], t);
    batch = t.dims_size() > 0 ? t.dims(0) : 1;
  }
  const auto shapes = m.OutputShapes(batch);
  std::vector<std::vector<float>> outputs(expected.size());
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (const auto& v : inputs) in_ptrs.push_back(v.data());
  for (size_t j = 0; j < expected.size(); ++j) {
    std::vector<int64_t> want_shape(expected[j].dims().begin(), expected[j].dims().end());
    if (j >= shapes.size() || shapes[j] != want_shape) {
      return Result(name, Outcome::kFailed, absl::StrCat("output ", j, " shape differs"));
    }
    int64_t count = 1;
    for (int64_t d : want_shape) count *= d;
    outputs[j].assign(std::max<int64_t>(count, 1), 0.0f);
    out_ptrs.push_back(outputs[j].data());
  }
  if (absl::Status s = m.Run(batch, in_ptrs, out_ptrs); !s.ok()) {
    return Result(
        name,
        s.code() == absl::StatusCode::kUnimplemented ? Outcome::kUnsupported : Outcome::kFailed,
        std::string(s.message()));
  }
  for (size_t j = 0; j < expected.size(); ++j) {
    std::vector<float> want;
    if (!FloatData(expected[j], want)) return Result(name, Outcome::kFailed, "bad output data");
    for (size_t i = 0; i < want.size(); ++i) {
      const float got = outputs[j][i], w = want[i];
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
