// REST inference bodies: ParseJsonInferRequest over the JSON part and the
// binary part of a body (the input's bytes up to its first NUL are the
// JSON, the rest the binary part, as Inference-Header-Content-Length would
// split them; no NUL: all JSON, no binary part), then, for a body it
// accepts, FormatJsonInferResponse over a response that sends every input
// back as an output. An accepted request must describe exactly the bytes
// its raw contents hold, within the tensor byte limit, and a response must
// hand out exactly the bytes of its binary outputs.
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "engine/ir/types.h"
#include "grpc_service.pb.h"
#include "serving/http/infer_json.h"
#include "tests/fuzz/fuzz_target.h"

namespace numaserve::fuzz {
namespace {

constexpr size_t kMaxTensorBytes = 1 << 20;
constexpr size_t kSmallLimit = 64;

// The bytes a tensor of `datatype` and `shape` holds, or -1 where its size
// is not fixed by them (BYTES) or the datatype is unknown.
int64_t FixedBytes(const std::string& datatype,
                   const google::protobuf::RepeatedField<int64_t>& shape) {
  const engine::DataType type = engine::DataTypeFromName(datatype);
  if (type == engine::DataType::kUnknown) return -1;
  int64_t elements = 1;
  for (int64_t d : shape) {
    FUZZ_CHECK(d >= 0);
    elements *= d;
  }
  return elements * static_cast<int64_t>(engine::DataTypeSize(type));
}

// Input `i`'s bytes, its pieces joined.
std::string RawInput(const serving::http::JsonInferRequest& parsed, int i) {
  std::string bytes;
  for (const auto& [data, size] : parsed.inputs->inputs[static_cast<size_t>(i)].pieces) {
    bytes.append(data, size);
  }
  return bytes;
}

void CheckAccepted(const serving::http::JsonInferRequest& parsed) {
  const inference::ModelInferRequest& request = parsed.request;
  FUZZ_CHECK(request.raw_input_contents_size() == 0);
  FUZZ_CHECK(parsed.inputs != nullptr);
  FUZZ_CHECK(parsed.inputs->inputs.size() == static_cast<size_t>(request.inputs_size()));
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    FUZZ_CHECK(!input.name().empty());
    const std::string raw = RawInput(parsed, i);
    FUZZ_CHECK(raw.size() == parsed.inputs->inputs[static_cast<size_t>(i)].size);
    FUZZ_CHECK(raw.size() <= kMaxTensorBytes);
    const int64_t bytes = FixedBytes(input.datatype(), input.shape());
    if (input.datatype() != "BYTES") {
      FUZZ_CHECK(bytes >= 0);
      FUZZ_CHECK(static_cast<size_t>(bytes) == raw.size());
    }
    if (input.datatype() == "BOOL") {
      for (char c : raw) FUZZ_CHECK(static_cast<unsigned char>(c) <= 1);
    }
  }
}

// Every input back as an output of the same name, datatype and shape.
void CheckResponse(const serving::http::JsonInferRequest& parsed) {
  inference::ModelInferResponse response;
  response.set_model_name("m");
  response.set_id(parsed.request.id());
  for (int i = 0; i < parsed.request.inputs_size(); ++i) {
    const auto& input = parsed.request.inputs(i);
    auto* output = response.add_outputs();
    output->set_name(input.name());
    output->set_datatype(input.datatype());
    *output->mutable_shape() = input.shape();
    response.add_raw_output_contents(RawInput(parsed, i));
  }
  const serving::http::JsonInferReply reply =
      serving::http::FormatJsonInferResponse(response, parsed);
  FUZZ_CHECK(!reply.json.empty() && reply.json.front() == '{' && reply.json.back() == '}');
  size_t binary = 0;
  for (absl::string_view part : reply.binary) binary += part.size();
  size_t raw = 0;
  for (const std::string& r : response.raw_output_contents()) raw += r.size();
  FUZZ_CHECK(binary <= raw);
}

}  // namespace

int FuzzOne(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  const size_t split = body.find('\0');
  const absl::string_view json = body.substr(0, split);
  const absl::string_view binary =
      split == absl::string_view::npos ? absl::string_view() : body.substr(split + 1);

  auto parsed = serving::http::ParseJsonInferRequest(json, binary, kMaxTensorBytes);
  if (parsed.ok()) {
    CheckAccepted(*parsed);
    CheckResponse(*parsed);
  }
  // The binary part in the pieces a body arrives in (every 1-8 bytes, as
  // the JSON's length says): the same answer, the same bytes.
  std::vector<absl::string_view> pieces;
  const size_t every = 1 + json.size() % 8;
  for (size_t at = 0; at < binary.size(); at += every) pieces.push_back(binary.substr(at, every));
  auto in_pieces = serving::http::ParseJsonInferRequest(json, pieces, nullptr, kMaxTensorBytes);
  FUZZ_CHECK(in_pieces.ok() == parsed.ok());
  FUZZ_CHECK(in_pieces.status().message() == parsed.status().message());
  if (in_pieces.ok()) {
    CheckAccepted(*in_pieces);
    for (int i = 0; i < parsed->request.inputs_size(); ++i) {
      FUZZ_CHECK(RawInput(*in_pieces, i) == RawInput(*parsed, i));
    }
  }
  // A byte limit only ever refuses more: what passes under it passes without.
  auto limited = serving::http::ParseJsonInferRequest(json, binary, kSmallLimit);
  if (limited.ok()) {
    for (const auto& input : limited->inputs->inputs) FUZZ_CHECK(input.size <= kSmallLimit);
    FUZZ_CHECK(parsed.ok());
  }
  return 0;
}

}  // namespace numaserve::fuzz
