// Request decoding: a ModelInferRequest (protobuf wire bytes, as gRPC hands
// them over) parsed against the metadata of one of a few models, picked by
// the request's model_name ("fp32", "mixed", "static", "reshape", "typed";
// any other name: "fp32"). An accepted request must describe exactly the
// bytes the engine reads, and its response must be buildable from output
// buffers of exactly the sizes it names. The bytes are also read as the
// server reads them, from gRPC slices (raw_infer.h, cut every 1-64 bytes
// as the first byte says): what that reader accepts, protobuf accepts and
// reads alike, and the request it makes parses to the same bytes; it
// refuses nothing protobuf accepts but groups.
#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/model.h"
#include "grpc_service.pb.h"
#include "serving/frontend/raw_infer.h"
#include "serving/request/infer_request.h"
#include "tests/fuzz/fuzz_target.h"

namespace numaserve::fuzz {
namespace {

using engine::DataType;

struct NamedModel {
  std::string name;
  engine::ModelInfo info;
};

std::vector<NamedModel> MakeModels() {
  std::vector<NamedModel> models(5);
  // Batched FP32 rows, the common case.
  models[0].name = "fp32";
  models[0].info.inputs = {{"x", DataType::kFloat32, {-1, 4}}};
  models[0].info.outputs = {{"y", DataType::kFloat32, {-1, 2}}, {"z", DataType::kInt64, {-1}}};
  models[0].info.batched = true;
  // Two inputs whose rows must agree, narrowed and boolean types.
  models[1].name = "mixed";
  models[1].info.inputs = {{"a", DataType::kInt8, {-1, 3}}, {"b", DataType::kBool, {-1, 2}}};
  models[1].info.outputs = {{"o", DataType::kUint16, {-1, 1}}};
  models[1].info.batched = true;
  // No dynamic dim at all: one run of exactly these shapes.
  models[2].name = "static";
  models[2].info.inputs = {{"s", DataType::kFloat16, {2, 2}}, {"t", DataType::kUint8, {3}}};
  models[2].info.outputs = {{"u", DataType::kFloat64, {2, 2}}};
  // Not batched, outputs from the model's shape function ([n,2] -> [1,2n]),
  // refusing more than 1000 rows.
  models[3].name = "reshape";
  models[3].info.inputs = {{"x", DataType::kFloat32, {-1, 2}}};
  models[3].info.outputs = {{"y", DataType::kFloat32, {1, -1}}};
  models[3].info.output_shapes_at =
      [](int64_t rows) -> absl::StatusOr<std::vector<std::vector<int64_t>>> {
    if (rows > 1000) return absl::InvalidArgumentError("more than 1000 rows");
    return std::vector<std::vector<int64_t>>{{1, 2 * rows}};
  };
  // One input per typed contents field, and the raw-only types.
  models[4].name = "typed";
  models[4].info.inputs = {{"i16", DataType::kInt16, {-1}},   {"u16", DataType::kUint16, {-1}},
                           {"i32", DataType::kInt32, {-1}},   {"u32", DataType::kUint32, {-1}},
                           {"i64", DataType::kInt64, {-1}},   {"u64", DataType::kUint64, {-1}},
                           {"f64", DataType::kFloat64, {-1}}, {"bf16", DataType::kBFloat16, {-1}}};
  models[4].info.outputs = {{"sum", DataType::kFloat64, {-1}}};
  models[4].info.batched = true;
  return models;
}

const engine::ModelInfo& ModelFor(const std::string& name) {
  static const std::vector<NamedModel> models = MakeModels();
  for (const NamedModel& m : models) {
    if (m.name == name) return m.info;
  }
  return models[0].info;
}

// The bytes input `t` takes at `rows` rows.
size_t InputBytes(const engine::TensorInfo& t, int64_t rows) {
  size_t bytes = engine::DataTypeSize(t.type);
  for (int64_t d : t.shape) bytes *= static_cast<size_t>(d < 0 ? rows : d);
  return bytes;
}

void CheckAccepted(const engine::ModelInfo& model, const serving::ParsedRequest& parsed) {
  FUZZ_CHECK(parsed.rows >= 1);
  FUZZ_CHECK(parsed.inputs.size() == model.inputs.size());
  // Every input is there, of the size the engine reads, and readable (the
  // sanitizers see a pointer into freed or foreign memory here).
  unsigned checksum = 0;
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    const serving::InputBytes& input = parsed.inputs[i];
    FUZZ_CHECK(input.size == InputBytes(model.inputs[i], parsed.rows));
    size_t total = 0;
    for (const auto& [bytes, length] : input.pieces) {
      FUZZ_CHECK(length == 0 || bytes != nullptr);
      total += length;
      for (size_t b = 0; b < length; ++b) checksum += static_cast<unsigned char>(bytes[b]);
      if (model.inputs[i].type == DataType::kBool) {
        for (size_t b = 0; b < length; ++b) FUZZ_CHECK(static_cast<unsigned char>(bytes[b]) <= 1);
      }
    }
    FUZZ_CHECK(total == input.size);
  }
  FUZZ_CHECK(parsed.output_bytes.size() == model.outputs.size());
  FUZZ_CHECK(parsed.output_shapes.size() == model.outputs.size());
  for (int index : parsed.outputs) {
    FUZZ_CHECK(index >= 0 && static_cast<size_t>(index) < model.outputs.size());
  }
  // The response from buffers of exactly output_bytes (bounded: the rows
  // are bounded by the request's size).
  std::vector<std::string> buffers;
  std::vector<const char*> outputs;
  for (size_t i = 0; i < model.outputs.size(); ++i) {
    size_t bytes = engine::DataTypeSize(model.outputs[i].type);
    for (int64_t d : parsed.output_shapes[i]) {
      FUZZ_CHECK(d >= 0);
      bytes *= static_cast<size_t>(d);
    }
    FUZZ_CHECK(bytes == parsed.output_bytes[i]);
    if (bytes > (size_t{64} << 20)) return;
    buffers.emplace_back(bytes, static_cast<char>(checksum));
  }
  for (const std::string& b : buffers) outputs.push_back(b.data());
  inference::ModelInferResponse response;
  serving::FillInferResponse(model, parsed, outputs, &response);
  FUZZ_CHECK(response.outputs_size() == static_cast<int>(parsed.outputs.size()));
  for (int k = 0; k < response.outputs_size(); ++k) {
    FUZZ_CHECK(response.raw_output_contents(k).size() == parsed.output_bytes[parsed.outputs[k]]);
  }
}

std::string Joined(const serving::InputBytes& bytes) {
  std::string out;
  for (const auto& [data, size] : bytes.pieces) out.append(data, size);
  return out;
}

// The server's reader against protobuf's; the raw request on success.
absl::StatusOr<serving::RawInferRequest> ReadAsTheServerDoes(
    const uint8_t* data, size_t size, bool parses, const inference::ModelInferRequest& request) {
  const size_t every = size > 0 ? 1 + data[0] % 64 : 1;
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < size; at += every) {
    slices.emplace_back(data + at, std::min(every, size - at));
  }
  absl::StatusOr<serving::RawInferRequest> raw =
      serving::ReadRawInferRequest(grpc::ByteBuffer(slices.data(), slices.size()));
  if (!raw.ok()) {
    FUZZ_CHECK(raw.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!parses || raw.status().message().find("group") != std::string::npos);
    return raw;
  }
  FUZZ_CHECK(parses);
  inference::ModelInferRequest without = request;
  without.clear_raw_input_contents();
  // NaN in typed contents equals itself here: the same bytes were read.
  google::protobuf::util::DefaultFieldComparator nan_equal;
  nan_equal.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&nan_equal);
  FUZZ_CHECK(differencer.Compare(raw->message, without));
  FUZZ_CHECK(raw->transport->inputs.size() ==
             static_cast<size_t>(request.raw_input_contents_size()));
  for (int i = 0; i < request.raw_input_contents_size(); ++i) {
    FUZZ_CHECK(Joined(raw->transport->inputs[i]) == request.raw_input_contents(i));
  }
  return raw;
}

}  // namespace

int FuzzOne(const uint8_t* data, size_t size) {
  inference::ModelInferRequest request;
  const bool parses = request.ParseFromArray(data, static_cast<int>(size));
  absl::StatusOr<serving::RawInferRequest> raw = ReadAsTheServerDoes(data, size, parses, request);
  if (!parses) return 0;
  const engine::ModelInfo& model = ModelFor(request.model_name());

  absl::StatusOr<serving::ParsedRequest> parsed = serving::ParseInferRequest(model, request);
  if (raw.ok()) {
    // The same request read in place: the same answer, the same bytes.
    absl::StatusOr<serving::ParsedRequest> in_place =
        serving::ParseInferRequest(model, raw->message, 0, nullptr, raw->transport.get());
    FUZZ_CHECK(in_place.ok() == parsed.ok());
    FUZZ_CHECK(in_place.status().message() == parsed.status().message());
    if (in_place.ok()) {
      CheckAccepted(model, *in_place);
      for (size_t i = 0; i < model.inputs.size(); ++i) {
        FUZZ_CHECK(Joined(in_place->inputs[i]) == Joined(parsed->inputs[i]));
      }
    }
  }
  if (parsed.ok()) {
    CheckAccepted(model, *parsed);
    // A copy points to the same live bytes (converted inputs are shared).
    serving::ParsedRequest copy = *parsed;
    parsed = absl::InvalidArgumentError("dropped");
    CheckAccepted(model, copy);
  }
  // A byte limit only ever refuses more: what passes under it passes without.
  constexpr size_t kLimit = 256;
  absl::StatusOr<serving::ParsedRequest> limited =
      serving::ParseInferRequest(model, request, kLimit);
  if (limited.ok()) {
    for (const auto& input : limited->inputs) FUZZ_CHECK(input.size <= kLimit);
    FUZZ_CHECK(serving::ParseInferRequest(model, request).ok());
  }
  return 0;
}

}  // namespace numaserve::fuzz
