// FormatJsonInferResponse (infer_json.h): outputs as JSON numbers (the
// shortest text that reads back to the same value) or as binary data.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/ir/typed_tensor.h"
#include "engine/ir/types.h"
#include "serving/http/infer_json.h"
#include "serving/http/json_writer.h"

namespace numaserve::serving::http {
namespace {

template <typename T>
T Load(const char* p) {
  T value;
  memcpy(&value, p, sizeof value);
  return value;
}

// A floating-point value: the shortest text that reads back as the same
// float (or double), NaN and infinities as NaN, Infinity, -Infinity.
template <typename T>
void WriteFloat(JsonWriter& writer, T value) {
  if (std::isnan(value)) {
    writer.RawValue("NaN", 3, rapidjson::kNumberType);
  } else if (std::isinf(value)) {
    if (value > 0) {
      writer.RawValue("Infinity", 8, rapidjson::kNumberType);
    } else {
      writer.RawValue("-Infinity", 9, rapidjson::kNumberType);
    }
  } else {
    char text[64];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
    writer.RawValue(text, static_cast<size_t>(end - text), rapidjson::kNumberType);
  }
}

// `count` elements of `datatype` at `data`, as a flat JSON array.
void WriteData(JsonWriter& writer, engine::DataType type, const std::string& data, int64_t count) {
  using engine::DataType;
  const size_t size = engine::DataTypeSize(type);
  writer.StartArray();
  for (int64_t i = 0; i < count; ++i) {
    const char* p = data.data() + static_cast<size_t>(i) * size;
    switch (type) {
      case DataType::kBool:
        writer.Bool(*p != 0);
        break;
      case DataType::kUint8:
        writer.Uint(Load<uint8_t>(p));
        break;
      case DataType::kInt8:
        writer.Int(Load<int8_t>(p));
        break;
      case DataType::kInt16:
        writer.Int(Load<int16_t>(p));
        break;
      case DataType::kUint16:
        writer.Uint(Load<uint16_t>(p));
        break;
      case DataType::kInt32:
        writer.Int(Load<int32_t>(p));
        break;
      case DataType::kUint32:
        writer.Uint(Load<uint32_t>(p));
        break;
      case DataType::kInt64:
        writer.Int64(Load<int64_t>(p));
        break;
      case DataType::kUint64:
        writer.Uint64(Load<uint64_t>(p));
        break;
      case DataType::kFloat16:
        WriteFloat(writer, engine::HalfToFloat(Load<uint16_t>(p)));
        break;
      case DataType::kBFloat16:
        WriteFloat(writer, engine::BFloat16ToFloat(Load<uint16_t>(p)));
        break;
      case DataType::kFloat32:
        WriteFloat(writer, Load<float>(p));
        break;
      case DataType::kFloat64:
        WriteFloat(writer, Load<double>(p));
        break;
      case DataType::kUnknown:
        writer.Null();
        break;
    }
  }
  writer.EndArray();
}

void WriteParameters(JsonWriter& writer,
                     const google::protobuf::Map<std::string, inference::InferParameter>& params) {
  writer.StartObject();
  for (const auto& [name, p] : params) {
    WriteKey(writer, name);
    switch (p.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        writer.Bool(p.bool_param());
        break;
      case inference::InferParameter::kInt64Param:
        writer.Int64(p.int64_param());
        break;
      case inference::InferParameter::kUint64Param:
        writer.Uint64(p.uint64_param());
        break;
      case inference::InferParameter::kDoubleParam:
        WriteFloat(writer, p.double_param());
        break;
      case inference::InferParameter::kStringParam:
        WriteString(writer, p.string_param());
        break;
      default:
        writer.Null();
        break;
    }
  }
  writer.EndObject();
}

// Whether output `name` goes back as binary data.
bool IsBinary(const JsonInferRequest& request, const std::string& name) {
  auto it = request.output_binary.find(name);
  return it != request.output_binary.end() ? it->second : request.binary_outputs;
}

}  // namespace

JsonInferReply FormatJsonInferResponse(const inference::ModelInferResponse& response,
                                       const JsonInferRequest& request) {
  JsonInferReply reply;
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  WriteKey(writer, "model_name");
  WriteString(writer, response.model_name());
  WriteKey(writer, "model_version");
  WriteString(writer, response.model_version());
  if (!response.id().empty()) {
    WriteKey(writer, "id");
    WriteString(writer, response.id());
  }
  if (!response.parameters().empty()) {
    WriteKey(writer, "parameters");
    WriteParameters(writer, response.parameters());
  }
  WriteKey(writer, "outputs");
  writer.StartArray();
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& out = response.outputs(i);
    static const std::string kNoBytes;
    const std::string& raw =
        i < response.raw_output_contents_size() ? response.raw_output_contents(i) : kNoBytes;
    writer.StartObject();
    WriteKey(writer, "name");
    WriteString(writer, out.name());
    WriteKey(writer, "datatype");
    WriteString(writer, out.datatype());
    WriteKey(writer, "shape");
    writer.StartArray();
    int64_t count = 1;
    for (int64_t d : out.shape()) {
      writer.Int64(d);
      count *= d;
    }
    writer.EndArray();
    if (IsBinary(request, out.name())) {
      WriteKey(writer, "parameters");
      writer.StartObject();
      WriteKey(writer, "binary_data_size");
      writer.Uint64(raw.size());
      writer.EndObject();
      reply.binary.emplace_back(raw);
    } else {
      const engine::DataType type = engine::DataTypeFromName(out.datatype());
      const size_t size = engine::DataTypeSize(type);
      // The engine wrote count elements; never read past what is there.
      if (size == 0 || raw.size() / size < static_cast<size_t>(count)) {
        count = size == 0 ? 0 : static_cast<int64_t>(raw.size() / size);
      }
      WriteKey(writer, "data");
      WriteData(writer, type, raw, count);
    }
    writer.EndObject();
  }
  writer.EndArray();
  writer.EndObject();
  reply.json.assign(buffer.GetString(), buffer.GetSize());
  return reply;
}

}  // namespace numaserve::serving::http
