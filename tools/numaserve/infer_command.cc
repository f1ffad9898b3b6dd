#include "tools/numaserve/infer_command.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/args.h"
#include "engine/model.h"
#include "grpc_service.grpc.pb.h"
#include "serving/request/datatypes.h"
#include "serving/request/infer_request.h"
#include "tools/numaserve/npy.h"

namespace numaserve::cli {

using engine::FloatToBFloat16;
using serving::ElementAsDouble;
using serving::FillRandom;
using serving::FormatElement;
using serving::NpyDescrFor;
using serving::ShapeString;

namespace {

int Fail(const std::string& message) {
  fprintf(stderr, "numaserve infer: %s\n", message.c_str());
  return 1;
}

struct InputSpec {
  std::vector<int64_t> shape;  // empty: from the model (dynamic dims = 1)
  std::string npy;             // a file, or empty for random values
};

// "image=1,1,28,28:random", "image=1x1x28x28:random", "image=batch.npy"
absl::StatusOr<std::pair<std::string, InputSpec>> ParseInputFlag(const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input '", text, "': expected NAME=SHAPE:random or NAME=FILE.npy"));
  }
  std::string name = text.substr(0, eq), value = text.substr(eq + 1);
  InputSpec spec;
  if (value.size() > 4 && value.compare(value.size() - 4, 4, ".npy") == 0) {
    spec.npy = value;
    return std::make_pair(name, spec);
  }
  std::string shape_text = value;
  if (size_t colon = value.rfind(':'); colon != std::string::npos) {
    if (value.substr(colon + 1) != "random") {
      return absl::InvalidArgumentError(
          absl::StrCat("--input '", text, "': only ':random' values or a .npy file are supported"));
    }
    shape_text = value.substr(0, colon);
  }
  for (absl::string_view dim : absl::StrSplit(shape_text, absl::ByAnyChar(",x"))) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(dim, &d) || d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input '", text, "': bad dimension '", dim, "' in the shape"));
    }
    spec.shape.push_back(d);
  }
  return std::make_pair(name, spec);
}

// The bytes of input `name` of `datatype` from a .npy file: NumPy's dtype
// for that datatype (see NpyDescrFor); BF16, which NumPy lacks, from a
// float32 array rounded to nearest even.
absl::Status NpyContents(const std::string& path, const std::string& name,
                         const std::string& datatype, NpyArray* array) {
  if (datatype == "BF16") {
    if (array->dtype != "<f4") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": dtype ", array->dtype, " but input '", name,
                       "' is BF16: save a float32 (<f4) array, it is rounded to BF16"));
    }
    std::string bf16(array->data.size() / 2, '\0');
    for (size_t i = 0; i < array->data.size() / 4; ++i) {
      float v;
      memcpy(&v, array->data.data() + 4 * i, 4);
      const uint16_t bits = FloatToBFloat16(v);
      memcpy(bf16.data() + 2 * i, &bits, 2);
    }
    array->data = std::move(bf16);
    return absl::OkStatus();
  }
  const std::string want = NpyDescrFor(datatype);
  if (want.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", name, "' is ", datatype, ", which a .npy file cannot hold"));
  }
  if (array->dtype != want) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": dtype ", array->dtype, " but input '",
                                                   name, "' is ", datatype, " (", want, ")"));
  }
  return absl::OkStatus();
}

void PrintOutput(const inference::ModelInferResponse::InferOutputTensor& out,
                 const std::string& raw) {
  std::vector<int64_t> shape(out.shape().begin(), out.shape().end());
  const std::string& type = out.datatype();
  printf("%s %s %s\n", out.name().c_str(), type.c_str(), ShapeString(shape).c_str());
  const size_t size = engine::DataTypeSize(engine::DataTypeFromName(type));
  if (size == 0 || raw.size() % size != 0) {
    printf("  (%zu bytes)\n", raw.size());
    return;
  }
  const bool floating = type == "FP32" || type == "FP64" || type == "FP16" || type == "BF16";
  const size_t n = raw.size() / size;
  const size_t cols = shape.empty() || shape.back() <= 0 ? n : static_cast<size_t>(shape.back());
  const size_t rows = cols == 0 ? 0 : n / cols;
  auto at = [&](size_t i) { return raw.data() + i * size; };
  for (size_t r = 0; r < std::min<size_t>(rows, 16); ++r) {
    std::string line;
    for (size_t c = 0; c < std::min<size_t>(cols, 10); ++c) {
      absl::StrAppend(&line, c ? " " : "", FormatElement(type, at(r * cols + c)));
    }
    if (cols > 10) absl::StrAppend(&line, " ...");
    if (floating) {
      size_t best = 0;
      for (size_t c = 1; c < cols; ++c) {
        if (ElementAsDouble(type, at(r * cols + c)) > ElementAsDouble(type, at(r * cols + best))) {
          best = c;
        }
      }
      absl::StrAppend(&line, "  argmax=", best);
    }
    printf("  [%zu] %s\n", r, line.c_str());
  }
  if (rows > 16) printf("  ... %zu rows\n", rows);
}

// The flags of `numaserve infer`, with their defaults.
struct InferOptions {
  std::string url = "127.0.0.1:8001", model, version;
  std::vector<std::string> input_flags;
  int64_t seed = 1, timeout_ms = 30000;
};

// The server, the model and its inputs, and the request's seed and deadline.
void AddInferFlags(base::ArgParser& parser, InferOptions& o) {
  parser.AddString("url", &o.url, "server address HOST:PORT");
  parser.AddString("model", &o.model, "model name");
  parser.AddString("version", &o.version, "model version (empty: the served one)");
  parser.AddRepeated("input", &o.input_flags,
                     "NAME=SHAPE:random (e.g. image=4,1,28,28:random) or NAME=FILE.npy "
                     "(NumPy's dtype for the input's datatype; float32 for BF16); inputs not "
                     "given get random values (floats in [0,1), integers 0..9, booleans) with the "
                     "batch of the inputs given, 1 if none");
  parser.AddInt("seed", &o.seed, "seed for random inputs");
  parser.AddInt("timeout-ms", &o.timeout_ms, "deadline of the request");
}

// Checks the flags; the --input specs by input name.
absl::StatusOr<std::map<std::string, InputSpec>> CheckInferFlags(const InferOptions& o) {
  if (o.model.empty()) {
    return absl::InvalidArgumentError("--model is required (see numaserve infer --help)");
  }
  std::map<std::string, InputSpec> specs;
  for (const auto& f : o.input_flags) {
    auto parsed = ParseInputFlag(f);
    if (!parsed.ok()) return parsed.status();
    specs[parsed->first] = parsed->second;
  }
  return specs;
}

// The model's metadata (its inputs' names, datatypes and shapes).
absl::Status FetchMetadata(inference::GRPCInferenceService::Stub& stub, const InferOptions& o,
                           std::chrono::system_clock::time_point deadline,
                           inference::ModelMetadataResponse* meta) {
  inference::ModelMetadataRequest meta_request;
  meta_request.set_name(o.model);
  meta_request.set_version(o.version);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  grpc::Status s = stub.ModelMetadata(&ctx, meta_request, meta);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("ModelMetadata(", o.model, ") at ", o.url, ": ", s.error_message()));
  }
  return absl::OkStatus();
}

// Reads the .npy inputs into *files; their batch (dim 0 where the model's is
// dynamic), or a NAME=SHAPE input's, is the random inputs' (*batch; 1 if none).
absl::Status ReadInputFiles(const inference::ModelMetadataResponse& meta,
                            const std::map<std::string, InputSpec>& specs,
                            std::map<std::string, NpyArray>* files, int64_t* batch) {
  for (const auto& t : meta.inputs()) {
    auto it = specs.find(t.name());
    if (it == specs.end()) continue;
    const bool dynamic_batch = t.shape_size() > 0 && t.shape(0) < 0;
    if (!it->second.npy.empty()) {
      auto array = ReadNpy(it->second.npy);
      if (!array.ok()) return array.status();
      if (absl::Status st = NpyContents(it->second.npy, t.name(), t.datatype(), &*array);
          !st.ok()) {
        return st;
      }
      if (dynamic_batch && !array->shape.empty()) *batch = array->shape[0];
      (*files)[t.name()] = *std::move(array);
    } else if (dynamic_batch && !it->second.shape.empty()) {
      *batch = it->second.shape[0];
    }
  }
  return absl::OkStatus();
}

// Input `t` of random values in `shape` (empty: the model's, with dim 0
// `batch` and other dynamic dims 1): its shape into `in`, values into `raw`.
absl::Status AddRandomInput(const inference::ModelMetadataResponse::TensorMetadata& t,
                            std::vector<int64_t> shape, int64_t batch, std::mt19937* rng,
                            inference::ModelInferRequest::InferInputTensor* in, std::string* raw) {
  if (shape.empty()) {
    for (int i = 0; i < t.shape_size(); ++i) {
      shape.push_back(t.shape(i) >= 0 ? t.shape(i) : i == 0 ? batch : 1);
    }
  }
  int64_t elements = 1;
  for (int64_t d : shape) {
    in->add_shape(d);
    if (elements > (int64_t{1} << 30) / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", t.name(), "' shape ", ShapeString(shape), " is too large for random values"));
    }
    elements *= d;
  }
  raw->resize(static_cast<size_t>(elements) *
              engine::DataTypeSize(engine::DataTypeFromName(t.datatype())));
  if (!FillRandom(t.datatype(), elements, 0.0f, 1.0f, rng, raw->data())) {
    return absl::InvalidArgumentError(absl::StrCat("input '", t.name(), "' is ", t.datatype(),
                                                   ": no random values for it; pass a .npy file"));
  }
  return absl::OkStatus();
}

// The request: every input of the model, from its .npy file or random
// values; an --input the model does not have is an error.
absl::Status BuildRequest(const InferOptions& o, const inference::ModelMetadataResponse& meta,
                          std::map<std::string, InputSpec> specs,
                          inference::ModelInferRequest* request) {
  request->set_model_name(o.model);
  request->set_model_version(o.version);
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::map<std::string, NpyArray> files;
  int64_t batch = 1;
  if (absl::Status s = ReadInputFiles(meta, specs, &files, &batch); !s.ok()) return s;
  for (const auto& t : meta.inputs()) {
    auto* in = request->add_inputs();
    in->set_name(t.name());
    in->set_datatype(t.datatype());
    InputSpec spec = specs.count(t.name()) ? specs[t.name()] : InputSpec{};
    specs.erase(t.name());
    std::string* raw = request->add_raw_input_contents();
    if (!spec.npy.empty()) {
      NpyArray& array = files[t.name()];
      for (int64_t d : array.shape) in->add_shape(d);
      *raw = std::move(array.data);
      continue;
    }
    if (absl::Status s = AddRandomInput(t, spec.shape, batch, &rng, in, raw); !s.ok()) return s;
  }
  if (!specs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", o.model, "' has no input '", specs.begin()->first, "'"));
  }
  return absl::OkStatus();
}

// Sends the request and prints the answer's outputs. Returns the exit code.
int InferAndPrint(inference::GRPCInferenceService::Stub& stub,
                  const inference::ModelInferRequest& request,
                  std::chrono::system_clock::time_point deadline) {
  inference::ModelInferResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  auto start = std::chrono::steady_clock::now();
  grpc::Status s = stub.ModelInfer(&ctx, request, &response);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!s.ok()) {
    return Fail(absl::StrCat("ModelInfer: ", s.error_code(), " ", s.error_message()));
  }
  printf("model %s version %s (%.2f ms)\n", response.model_name().c_str(),
         response.model_version().c_str(), ms);
  for (int i = 0; i < response.outputs_size(); ++i) {
    PrintOutput(response.outputs(i),
                i < response.raw_output_contents_size() ? response.raw_output_contents(i) : "");
  }
  return 0;
}

}  // namespace

int InferCommand(const std::vector<std::string>& args) {
  InferOptions o;
  base::ArgParser parser("infer",
                         "Send one inference request to a running server and print the outputs.");
  AddInferFlags(parser, o);
  if (absl::Status s = parser.Parse(args); !s.ok()) return Fail(std::string(s.message()));
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  absl::StatusOr<std::map<std::string, InputSpec>> specs = CheckInferFlags(o);
  if (!specs.ok()) return Fail(std::string(specs.status().message()));

  auto channel = grpc::CreateChannel(o.url, grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms);
  inference::ModelMetadataResponse meta;
  if (absl::Status s = FetchMetadata(*stub, o, deadline, &meta); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  inference::ModelInferRequest request;
  if (absl::Status s = BuildRequest(o, meta, *std::move(specs), &request); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  return InferAndPrint(*stub, request, deadline);
}

}  // namespace numaserve::cli
