#include "server/infer_request.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace numaserve::server {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Bytes of the typed `contents` field for `type`, or nullptr when that
// datatype has no typed field numaserve reads.
std::pair<const char*, size_t> TypedContents(engine::DataType type,
                                             const inference::InferTensorContents& c) {
  switch (type) {
    case engine::DataType::kFloat32:
      return {reinterpret_cast<const char*>(c.fp32_contents().data()),
              c.fp32_contents_size() * sizeof(float)};
    case engine::DataType::kFloat64:
      return {reinterpret_cast<const char*>(c.fp64_contents().data()),
              c.fp64_contents_size() * sizeof(double)};
    case engine::DataType::kInt64:
      return {reinterpret_cast<const char*>(c.int64_contents().data()),
              c.int64_contents_size() * sizeof(int64_t)};
    case engine::DataType::kInt32:
      return {reinterpret_cast<const char*>(c.int_contents().data()),
              c.int_contents_size() * sizeof(int32_t)};
    default:
      return {nullptr, 0};
  }
}

int64_t TypedCount(const inference::InferTensorContents& c) {
  return c.bool_contents_size() + c.int_contents_size() + c.int64_contents_size() +
         c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

}  // namespace

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::StatusOr<ParsedRequest> ParseInferRequest(const engine::ModelInfo& model,
                                                const inference::ModelInferRequest& request,
                                                size_t max_bytes) {
  ParsedRequest parsed;
  parsed.inputs.assign(model.inputs.size(), {nullptr, 0});
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return Invalid(absl::StrFormat(
        "raw_input_contents has %d entries but the request names %d inputs; send one per input",
        request.raw_input_contents_size(), request.inputs_size()));
  }
  int64_t rows = -1;
  std::string rows_from;
  std::vector<bool> seen(model.inputs.size(), false);
  for (int r = 0; r < request.inputs_size(); ++r) {
    const auto& in = request.inputs(r);
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
    if (seen[index]) return Invalid(absl::StrFormat("input '%s' is given twice", in.name()));
    seen[index] = true;
    const engine::TensorInfo& expected = model.inputs[index];
    const std::string want_type = engine::DataTypeName(expected.type);
    if (in.datatype() != want_type) {
      return Invalid(absl::StrFormat("input '%s' has datatype '%s'; the model expects %s",
                                     in.name(), in.datatype(), want_type));
    }
    std::vector<int64_t> shape(in.shape().begin(), in.shape().end());
    if (shape.size() != expected.shape.size()) {
      return Invalid(absl::StrFormat("input '%s' has shape %s; the model expects %s (rank %d)",
                                     in.name(), ShapeString(shape), ShapeString(expected.shape),
                                     expected.shape.size()));
    }
    int64_t elements = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      bool dynamic = expected.shape[d] < 0;
      if (shape[d] < 1 || (!dynamic && shape[d] != expected.shape[d])) {
        return Invalid(absl::StrFormat("input '%s' has shape %s; the model expects %s", in.name(),
                                       ShapeString(shape), ShapeString(expected.shape)));
      }
      if (elements > (int64_t{1} << 40) / shape[d]) {
        return Invalid(
            absl::StrFormat("input '%s' shape %s is too large", in.name(), ShapeString(shape)));
      }
      elements *= shape[d];
    }
    if (model.batched) {
      if (rows >= 0 && shape[0] != rows) {
        return Invalid(absl::StrFormat(
            "input '%s' has %d rows but input '%s' has %d: the batch dimension must agree",
            in.name(), shape[0], rows_from, rows));
      }
      rows = shape[0];
      rows_from = in.name();
    }
    const size_t want_bytes = static_cast<size_t>(elements) * engine::DataTypeSize(expected.type);
    if (max_bytes > 0 && want_bytes > max_bytes) {
      return Invalid(absl::StrFormat(
          "input '%s' shape %s of %s needs %d bytes, more than the %d-byte message limit",
          in.name(), ShapeString(shape), want_type, want_bytes, max_bytes));
    }
    std::pair<const char*, size_t> data;
    if (raw) {
      if (TypedCount(in.contents()) > 0) {
        return Invalid(absl::StrFormat(
            "input '%s' has typed contents but the request also uses raw_input_contents",
            in.name()));
      }
      const std::string& bytes = request.raw_input_contents(r);
      data = {bytes.data(), bytes.size()};
    } else {
      data = TypedContents(expected.type, in.contents());
      if (data.first == nullptr) {
        return Invalid(absl::StrFormat("input '%s' (%s): send it in raw_input_contents", in.name(),
                                       want_type));
      }
      if (TypedCount(in.contents()) * static_cast<int64_t>(engine::DataTypeSize(expected.type)) !=
          static_cast<int64_t>(data.second)) {
        return Invalid(absl::StrFormat("input '%s' (%s) has contents of another datatype",
                                       in.name(), want_type));
      }
    }
    if (data.second != want_bytes) {
      return Invalid(absl::StrFormat("input '%s': shape %s of %s needs %d bytes, got %d", in.name(),
                                     ShapeString(shape), want_type, want_bytes, data.second));
    }
    parsed.inputs[index] = data;
  }
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    if (!seen[i]) {
      return Invalid(absl::StrFormat("missing input '%s' (%s %s)", model.inputs[i].name,
                                     engine::DataTypeName(model.inputs[i].type),
                                     ShapeString(model.inputs[i].shape)));
    }
  }
  parsed.rows = model.batched ? rows : 1;

  if (request.outputs_size() == 0) {
    for (size_t i = 0; i < model.outputs.size(); ++i) parsed.outputs.push_back(static_cast<int>(i));
  }
  for (const auto& out : request.outputs()) {
    int index = -1;
    for (size_t i = 0; i < model.outputs.size(); ++i) {
      if (model.outputs[i].name == out.name()) index = static_cast<int>(i);
    }
    if (index < 0) {
      return Invalid(absl::StrFormat("unknown output '%s' requested", out.name()));
    }
    parsed.outputs.push_back(index);
  }
  for (const auto& out : model.outputs) {
    std::vector<int64_t> shape = out.shape;
    int64_t elements = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < 0) shape[d] = (d == 0 && model.batched) ? parsed.rows : 1;
      elements *= shape[d];
    }
    parsed.output_shapes.push_back(shape);
    parsed.output_bytes.push_back(static_cast<size_t>(elements) * engine::DataTypeSize(out.type));
  }
  return parsed;
}

void FillInferResponse(const engine::ModelInfo& model, const ParsedRequest& parsed,
                       const std::vector<const char*>& outputs,
                       inference::ModelInferResponse* response) {
  for (int index : parsed.outputs) {
    const engine::TensorInfo& info = model.outputs[index];
    auto* out = response->add_outputs();
    out->set_name(info.name);
    out->set_datatype(engine::DataTypeName(info.type));
    for (int64_t d : parsed.output_shapes[index]) out->add_shape(d);
    response->add_raw_output_contents()->assign(outputs[index], parsed.output_bytes[index]);
  }
}

}  // namespace numaserve::server
