#include "serving/request/infer_request.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "serving/request/datatypes.h"

namespace numaserve::serving {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

using Bytes = ByteSpan;

template <typename T>
Bytes BytesOf(const google::protobuf::RepeatedField<T>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)};
}

// The values of a typed field narrowed to `To` (INT8/INT16 from int32,
// UINT8/UINT16 from uint32), kept in parsed->converted; a value outside
// `To`'s range is refused naming the input, the field and the index.
template <typename To, typename From>
absl::StatusOr<Bytes> Narrow(const google::protobuf::RepeatedField<From>& values,
                             const std::string& input, const std::string& datatype,
                             const std::string& field, ParsedRequest* parsed) {
  auto bytes = std::make_shared<std::string>(values.size() * sizeof(To), '\0');
  char* out = bytes->data();
  for (int i = 0; i < values.size(); ++i) {
    const From v = values[i];
    if (!std::in_range<To>(v)) {
      return Invalid(absl::StrFormat("input '%s' (%s): %s[%d] = %d is outside %s's range [%d, %d]",
                                     input, datatype, field, i, v, datatype,
                                     int64_t{std::numeric_limits<To>::min()},
                                     int64_t{std::numeric_limits<To>::max()}));
    }
    const To narrowed = static_cast<To>(v);
    memcpy(out + i * sizeof(To), &narrowed, sizeof(To));
  }
  parsed->converted.push_back(bytes);
  return Bytes{bytes->data(), bytes->size()};
}

// Every typed field of `c` with its name and number of values.
std::vector<std::pair<std::string, int64_t>> TypedFields(const inference::InferTensorContents& c) {
  return {
      {"bool_contents", c.bool_contents_size()},     {"int_contents", c.int_contents_size()},
      {"int64_contents", c.int64_contents_size()},   {"uint_contents", c.uint_contents_size()},
      {"uint64_contents", c.uint64_contents_size()}, {"fp32_contents", c.fp32_contents_size()},
      {"fp64_contents", c.fp64_contents_size()},     {"bytes_contents", c.bytes_contents_size()}};
}

int64_t TypedCount(const inference::InferTensorContents& c) {
  int64_t n = 0;
  for (const auto& [field, count] : TypedFields(c)) n += count;
  return n;
}

// The bytes of input `name` of `datatype` from its typed contents (KServe
// v2: one field per datatype, see ParseInferRequest), `elements` values.
absl::StatusOr<Bytes> ReadTypedContents(const std::string& name, const std::string& datatype,
                                        const std::vector<int64_t>& shape, int64_t elements,
                                        const inference::InferTensorContents& c,
                                        ParsedRequest* parsed) {
  const std::string field = ContentsFieldFor(datatype);
  if (field.empty()) {
    return Invalid(absl::StrFormat(
        "input '%s' (%s): %s has no typed contents field; send it in raw_input_contents", name,
        datatype, datatype));
  }
  int64_t count = 0;
  for (const auto& [other, n] : TypedFields(c)) {
    if (other == field) {
      count = n;
    } else if (n > 0) {
      return Invalid(absl::StrFormat("input '%s' (%s) has values in %s; %s values go in %s", name,
                                     datatype, other, datatype, field));
    }
  }
  if (count != elements) {
    return Invalid(absl::StrFormat("input '%s': shape %s of %s needs %d values in %s, got %d", name,
                                   ShapeString(shape), datatype, elements, field, count));
  }
  static_assert(sizeof(bool) == 1, "bool_contents is read as BOOL bytes");
  if (datatype == "BOOL") return BytesOf(c.bool_contents());
  if (datatype == "INT8") return Narrow<int8_t>(c.int_contents(), name, datatype, field, parsed);
  if (datatype == "INT16") return Narrow<int16_t>(c.int_contents(), name, datatype, field, parsed);
  if (datatype == "INT32") return BytesOf(c.int_contents());
  if (datatype == "INT64") return BytesOf(c.int64_contents());
  if (datatype == "UINT8") return Narrow<uint8_t>(c.uint_contents(), name, datatype, field, parsed);
  if (datatype == "UINT16") {
    return Narrow<uint16_t>(c.uint_contents(), name, datatype, field, parsed);
  }
  if (datatype == "UINT32") return BytesOf(c.uint_contents());
  if (datatype == "UINT64") return BytesOf(c.uint64_contents());
  if (datatype == "FP32") return BytesOf(c.fp32_contents());
  if (datatype == "FP64") return BytesOf(c.fp64_contents());
  return Invalid(absl::StrFormat("input '%s': %s tensors are not supported", name, datatype));
}

// BOOL bytes must be 0 or 1 (NumPy's and ONNX's encoding).
absl::Status CheckBoolBytes(const std::string& name, const InputBytes& data) {
  size_t at = 0;
  for (const auto& [bytes, size] : data.pieces) {
    for (size_t i = 0; i < size; ++i, ++at) {
      const auto b = static_cast<unsigned char>(bytes[i]);
      if (b > 1) {
        return Invalid(absl::StrFormat(
            "input '%s' (BOOL): raw_input_contents byte %d is %d; BOOL bytes must be 0 or 1", name,
            at, b));
      }
    }
  }
  return absl::OkStatus();
}

// What ParseInferRequest tracks across the request's inputs.
struct InputScan {
  bool raw = false;  // the request sends its inputs in raw_input_contents
  // Where the raw bytes are in the transport's buffers instead (or null).
  const TransportInputs* transport = nullptr;
  std::vector<bool> seen;  // per model input: given in the request
  int64_t rows = -1;       // the dynamic dim 0 the inputs agree on so far (-1: none yet)
  std::string rows_from;   // the input that set `rows`
};

// The model input that request input `in` names; refuses an unknown name
// and one given twice (marking it seen).
absl::StatusOr<int> FindInput(const engine::ModelInfo& model,
                              const inference::ModelInferRequest::InferInputTensor& in,
                              InputScan* scan) {
  int index = -1;
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    if (model.inputs[i].name == in.name()) index = static_cast<int>(i);
  }
  if (index < 0) {
    std::vector<std::string> names;
    for (const auto& t : model.inputs) names.push_back(t.name);
    return Invalid(absl::StrFormat("unknown input '%s': the model's inputs are %s", in.name(),
                                   absl::StrJoin(names, ", ")));
  }
  if (scan->seen[index]) return Invalid(absl::StrFormat("input '%s' is given twice", in.name()));
  scan->seen[index] = true;
  return index;
}

// "dim 1 ('seq')" where dim `d` of `t` has a name, "dim 1" otherwise.
std::string DimLabel(const engine::TensorInfo& t, size_t d) {
  if (d < t.dim_names.size() && !t.dim_names[d].empty()) {
    return absl::StrFormat("dim %d ('%s')", d, t.dim_names[d]);
  }
  return absl::StrFormat("dim %d", d);
}

// The element count of input `t` of `shape`, checked against the model's
// shape dim by dim (naming the dim that differs) and capped at 2^40
// elements.
absl::StatusOr<int64_t> InputElements(const engine::TensorInfo& t,
                                      const std::vector<int64_t>& shape) {
  const std::string& name = t.name;
  const std::vector<int64_t>& expected = t.shape;
  if (shape.size() != expected.size()) {
    return Invalid(absl::StrFormat("input '%s' has shape %s; the model expects %s (rank %d)", name,
                                   ShapeString(shape), ShapeString(expected), expected.size()));
  }
  int64_t elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool dynamic = expected[d] < 0;
    if (shape[d] < 1 || (!dynamic && shape[d] != expected[d])) {
      const std::string why =
          dynamic
              ? absl::StrFormat("%s is dynamic: it must be >= 1, got %d", DimLabel(t, d), shape[d])
              : absl::StrFormat("%s is fixed at %d, got %d", DimLabel(t, d), expected[d], shape[d]);
      return Invalid(absl::StrFormat("input '%s' has shape %s; the model expects %s: %s", name,
                                     ShapeString(shape), ShapeString(expected), why));
    }
    if (elements > (int64_t{1} << 40) / shape[d]) {
      return Invalid(absl::StrFormat("input '%s' shape %s is too large", name, ShapeString(shape)));
    }
    elements *= shape[d];
  }
  return elements;
}

// Whether dim 0 of model input `index` is the batch: dynamic, and unnamed
// or of a name that no dynamic dim besides a dim 0 has (pos [seq, hidden]
// beside x [batch, seq, hidden]: pos's dim 0 is 'seq', not the batch). As
// the engine decides it (engine/ops/shape_propagation.h, ProbeInputShapes).
bool Dim0IsBatch(const engine::ModelInfo& model, size_t index) {
  const engine::TensorInfo& t = model.inputs[index];
  if (t.shape.empty() || t.shape[0] >= 0) return false;
  if (t.dim_names.empty() || t.dim_names[0].empty()) return true;
  for (const engine::TensorInfo& other : model.inputs) {
    for (size_t d = 1; d < other.shape.size() && d < other.dim_names.size(); ++d) {
      if (other.dim_names[d] == t.dim_names[0]) return false;
    }
  }
  return true;
}

// The bytes of request input `r`: its raw_input_contents entry (or the
// transport's), or its typed contents read as `want_type` (a mix of the two
// is refused).
absl::StatusOr<InputBytes> ReadInputBytes(const inference::ModelInferRequest& request, int r,
                                          const InputScan& scan, const std::string& want_type,
                                          const std::vector<int64_t>& shape, int64_t elements,
                                          ParsedRequest* parsed) {
  const auto& in = request.inputs(r);
  InputBytes out;
  if (scan.raw) {
    if (TypedCount(in.contents()) > 0) {
      return Invalid(absl::StrFormat(
          "input '%s' has typed contents but the request also uses raw_input_contents", in.name()));
    }
    if (scan.transport != nullptr) return scan.transport->inputs[r];
    const std::string& bytes = request.raw_input_contents(r);
    out.Add({bytes.data(), bytes.size()});
    return out;
  }
  absl::StatusOr<Bytes> typed =
      ReadTypedContents(in.name(), want_type, shape, elements, in.contents(), parsed);
  if (!typed.ok()) return typed.status();
  out.Add(*typed);
  return out;
}

// Checks request input `r` against the model's input of the same name and
// points parsed->inputs at its bytes; the first problem found is returned.
absl::Status ParseInput(const engine::ModelInfo& model, const inference::ModelInferRequest& request,
                        int r, size_t max_bytes, InputScan* scan, ParsedRequest* parsed) {
  const auto& in = request.inputs(r);
  absl::StatusOr<int> found = FindInput(model, in, scan);
  if (!found.ok()) return found.status();
  const int index = *found;
  const engine::TensorInfo& expected = model.inputs[index];
  const std::string want_type = engine::DataTypeName(expected.type);
  if (in.datatype() != want_type) {
    return Invalid(absl::StrFormat("input '%s' has datatype '%s'; the model expects %s", in.name(),
                                   in.datatype(), want_type));
  }
  std::vector<int64_t> shape(in.shape().begin(), in.shape().end());
  absl::StatusOr<int64_t> counted = InputElements(expected, shape);
  if (!counted.ok()) return counted.status();
  const int64_t elements = *counted;
  // The engine runs every batch dim at one row count, batched or not.
  if (Dim0IsBatch(model, static_cast<size_t>(index))) {
    if (scan->rows >= 0 && shape[0] != scan->rows) {
      return Invalid(absl::StrFormat(
          "input '%s' has %d rows but input '%s' has %d: the batch dimension must agree", in.name(),
          shape[0], scan->rows_from, scan->rows));
    }
    scan->rows = shape[0];
    scan->rows_from = in.name();
  }
  const size_t want_bytes = static_cast<size_t>(elements) * engine::DataTypeSize(expected.type);
  if (max_bytes > 0 && want_bytes > max_bytes) {
    return Invalid(absl::StrFormat(
        "input '%s' shape %s of %s needs %d bytes, more than the %d-byte message limit", in.name(),
        ShapeString(shape), want_type, want_bytes, max_bytes));
  }
  absl::StatusOr<InputBytes> read =
      ReadInputBytes(request, r, *scan, want_type, shape, elements, parsed);
  if (!read.ok()) return read.status();
  InputBytes& data = *read;
  if (data.size != want_bytes) {
    return Invalid(absl::StrFormat("input '%s': shape %s of %s needs %d bytes, got %d", in.name(),
                                   ShapeString(shape), want_type, want_bytes, data.size));
  }
  if (expected.type == engine::DataType::kBool) {
    if (absl::Status s = CheckBoolBytes(in.name(), data); !s.ok()) return s;
  }
  parsed->inputs[index] = std::move(data);
  parsed->input_shapes[index] = std::move(shape);
  return absl::OkStatus();
}

// The model outputs the request asks for, in its order (all when it names
// none), into parsed->outputs; an unknown name is refused.
absl::Status SelectOutputs(const engine::ModelInfo& model,
                           const inference::ModelInferRequest& request, ParsedRequest* parsed) {
  if (request.outputs_size() == 0) {
    for (size_t i = 0; i < model.outputs.size(); ++i)
      parsed->outputs.push_back(static_cast<int>(i));
  }
  for (const auto& out : request.outputs()) {
    int index = -1;
    for (size_t i = 0; i < model.outputs.size(); ++i) {
      if (model.outputs[i].name == out.name()) index = static_cast<int>(i);
    }
    if (index < 0) {
      return Invalid(absl::StrFormat("unknown output '%s' requested", out.name()));
    }
    parsed->outputs.push_back(index);
  }
  return absl::OkStatus();
}

// The shape and byte size of every model output at parsed->rows, or at
// parsed->input_shapes where the model runs at a signature; an output too
// large to size is refused.
absl::Status SizeOutputs(const engine::ModelInfo& model, const SignatureShapesFn& signature_shapes,
                         ParsedRequest* parsed) {
  auto shapes = signature_shapes ? signature_shapes(parsed->input_shapes)
                                 : OutputShapesFor(model, parsed->rows);
  if (!shapes.ok()) return shapes.status();
  if (shapes->size() != model.outputs.size()) {
    return absl::InternalError(absl::StrFormat("the model computes %d outputs, its metadata has %d",
                                               shapes->size(), model.outputs.size()));
  }
  parsed->output_shapes = *std::move(shapes);
  for (size_t i = 0; i < model.outputs.size(); ++i) {
    const auto& shape = parsed->output_shapes[i];
    // Within a message-sized range, so no product below can overflow.
    constexpr int64_t kMaxBytes = int64_t{1} << 50;
    int64_t bytes = static_cast<int64_t>(engine::DataTypeSize(model.outputs[i].type));
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && bytes > kMaxBytes / d)) {
        return Invalid(absl::StrFormat("output '%s' would be %s at %d rows: too large",
                                       model.outputs[i].name, ShapeString(shape), parsed->rows));
      }
      bytes *= d;
    }
    parsed->output_bytes.push_back(static_cast<size_t>(bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> RequestsProfile(const inference::ModelInferRequest& request) {
  auto it = request.parameters().find(kProfileParameter);
  if (it == request.parameters().end()) return false;
  const inference::InferParameter& p = it->second;
  if (p.parameter_choice_case() == inference::InferParameter::kBoolParam) return p.bool_param();
  if (p.parameter_choice_case() == inference::InferParameter::kStringParam &&
      (p.string_param() == "true" || p.string_param() == "false")) {
    return p.string_param() == "true";
  }
  std::string given = "no value";
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      given = absl::StrCat("int64 ", p.int64_param());
      break;
    case inference::InferParameter::kUint64Param:
      given = absl::StrCat("uint64 ", p.uint64_param());
      break;
    case inference::InferParameter::kDoubleParam:
      given = absl::StrCat("double ", p.double_param());
      break;
    case inference::InferParameter::kStringParam:
      given = absl::StrCat("string \"", p.string_param().substr(0, 64), "\"");
      break;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("request parameter '", kProfileParameter,
                                                 "' must be bool true or false (or ",
                                                 "the string \"true\" or \"false\"); got ", given));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<ParsedRequest> ParseInferRequest(const engine::ModelInfo& model,
                                                const inference::ModelInferRequest& request,
                                                size_t max_bytes,
                                                const SignatureShapesFn& signature_shapes,
                                                const TransportInputs* transport) {
  ParsedRequest parsed;
  parsed.inputs.resize(model.inputs.size());
  parsed.input_shapes.resize(model.inputs.size());
  InputScan scan;
  int raw_entries = request.raw_input_contents_size();
  if (transport != nullptr) {
    if (raw_entries > 0) {
      return absl::InternalError("raw_input_contents both in the message and in transport buffers");
    }
    scan.transport = transport;
    raw_entries = static_cast<int>(transport->inputs.size());
    parsed.transport = transport->owner;
  }
  scan.raw = raw_entries > 0;
  if (scan.raw && raw_entries != request.inputs_size()) {
    return Invalid(absl::StrFormat(
        "raw_input_contents has %d entries but the request names %d inputs; send one per input",
        raw_entries, request.inputs_size()));
  }
  scan.seen.assign(model.inputs.size(), false);
  for (int r = 0; r < request.inputs_size(); ++r) {
    if (absl::Status s = ParseInput(model, request, r, max_bytes, &scan, &parsed); !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    if (!scan.seen[i]) {
      return Invalid(absl::StrFormat("missing input '%s' (%s %s)", model.inputs[i].name,
                                     engine::DataTypeName(model.inputs[i].type),
                                     ShapeString(model.inputs[i].shape)));
    }
  }
  parsed.rows = scan.rows >= 0 ? scan.rows : 1;
  if (absl::Status s = SelectOutputs(model, request, &parsed); !s.ok()) return s;
  if (absl::Status s = SizeOutputs(model, signature_shapes, &parsed); !s.ok()) return s;
  return parsed;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> OutputShapesFor(const engine::ModelInfo& model,
                                                                  int64_t rows) {
  if (model.output_shapes_at) {
    auto shapes = model.output_shapes_at(rows);
    if (!shapes.ok()) {
      return Invalid(
          absl::StrFormat("the model cannot run at %d rows: %s", rows, shapes.status().message()));
    }
    if (shapes->size() != model.outputs.size()) {
      return absl::InternalError(
          absl::StrFormat("the model computes %d outputs, its metadata has %d", shapes->size(),
                          model.outputs.size()));
    }
    return shapes;
  }
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& out : model.outputs) {
    std::vector<int64_t> shape = out.shape;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] >= 0) continue;
      // Without the model's shape function only [rows, static...] is known.
      if (d != 0) {
        return absl::InternalError(
            absl::StrFormat("output '%s' is %s: its size at %d rows is not known", out.name,
                            ShapeString(out.shape), rows));
      }
      shape[d] = rows;
    }
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

void FillInferResponse(const engine::ModelInfo& model, const ParsedRequest& parsed,
                       const std::vector<const char*>& outputs,
                       inference::ModelInferResponse* response, const OutputSink& sink) {
  for (int index : parsed.outputs) {
    const engine::TensorInfo& info = model.outputs[index];
    auto* out = response->add_outputs();
    out->set_name(info.name);
    out->set_datatype(engine::DataTypeName(info.type));
    for (int64_t d : parsed.output_shapes[index]) out->add_shape(d);
    if (sink) {
      sink(outputs[index], parsed.output_bytes[index]);
    } else {
      response->add_raw_output_contents()->assign(outputs[index], parsed.output_bytes[index]);
    }
  }
}

}  // namespace numaserve::serving
