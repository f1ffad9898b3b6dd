// How the HTTP/REST front end writes JSON: rapidjson's Writer into a
// string buffer, NaN and infinities written as NaN, Infinity and -Infinity
// (what Python's json module and JavaScript's JSON5 read; JSON itself has
// no spelling for them), and protobuf messages written field by field.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "serving/http/rapidjson.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace numaserve::serving::http {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                     rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;

inline void WriteString(JsonWriter& writer, absl::string_view text) {
  writer.String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
}

inline void WriteKey(JsonWriter& writer, absl::string_view key) {
  writer.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
}

// `message` as one JSON object, as Triton's HTTP API writes its protobuf
// answers: the .proto field names; every singular scalar field (its default
// value too), every repeated field (empty ones as []), sub-messages and
// oneof members only when set; 64-bit integers as JSON numbers, enums by
// name, bytes as text, map fields as objects keyed by the map's keys.
void WriteProto(JsonWriter& writer, const google::protobuf::Message& message);

// WriteProto into a string.
std::string ProtoToJson(const google::protobuf::Message& message);

}  // namespace numaserve::serving::http
