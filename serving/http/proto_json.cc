// WriteProto (json_writer.h): protobuf messages as JSON through protobuf's
// reflection.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "serving/http/json_writer.h"

namespace numaserve::serving::http {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One value of `field` (the index-th of a repeated field, or the singular
// value when index < 0).
void WriteValue(JsonWriter& writer, const Message& message, const FieldDescriptor* field,
                int index) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      writer.Int(repeated ? r->GetRepeatedInt32(message, field, index)
                          : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      writer.Int64(repeated ? r->GetRepeatedInt64(message, field, index)
                            : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      writer.Uint(repeated ? r->GetRepeatedUInt32(message, field, index)
                           : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      writer.Uint64(repeated ? r->GetRepeatedUInt64(message, field, index)
                             : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      writer.Double(repeated ? r->GetRepeatedDouble(message, field, index)
                             : r->GetDouble(message, field));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      writer.Double(repeated ? r->GetRepeatedFloat(message, field, index)
                             : r->GetFloat(message, field));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      writer.Bool(repeated ? r->GetRepeatedBool(message, field, index)
                           : r->GetBool(message, field));
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* value =
          repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field);
      WriteString(writer, value->name());
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& text = repeated
                                    ? r->GetRepeatedStringReference(message, field, index, &scratch)
                                    : r->GetStringReference(message, field, &scratch);
      WriteString(writer, text);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      WriteProto(writer, repeated ? r->GetRepeatedMessage(message, field, index)
                                  : r->GetMessage(message, field));
      break;
  }
}

// A map entry's key as text (JSON object keys are strings).
std::string MapKey(const Message& entry) {
  const FieldDescriptor* key = entry.GetDescriptor()->map_key();
  const Reflection* r = entry.GetReflection();
  switch (key->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(entry, key);
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(entry, key));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(entry, key));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(entry, key));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(entry, key));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, key) ? "true" : "false";
    default:
      return "";
  }
}

void WriteField(JsonWriter& writer, const Message& message, const FieldDescriptor* field) {
  const Reflection* r = message.GetReflection();
  WriteKey(writer, field->name());
  if (field->is_map()) {
    writer.StartObject();
    for (int i = 0; i < r->FieldSize(message, field); ++i) {
      const Message& entry = r->GetRepeatedMessage(message, field, i);
      WriteKey(writer, MapKey(entry));
      WriteValue(writer, entry, entry.GetDescriptor()->map_value(), -1);
    }
    writer.EndObject();
  } else if (field->is_repeated()) {
    writer.StartArray();
    for (int i = 0; i < r->FieldSize(message, field); ++i) WriteValue(writer, message, field, i);
    writer.EndArray();
  } else {
    WriteValue(writer, message, field, -1);
  }
}

}  // namespace

void WriteProto(JsonWriter& writer, const Message& message) {
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  writer.StartObject();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    const bool has_presence = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ||
                              field->containing_oneof() != nullptr;
    if (!field->is_repeated() && has_presence && !r->HasField(message, field)) continue;
    WriteField(writer, message, field);
  }
  writer.EndObject();
}

std::string ProtoToJson(const Message& message) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  WriteProto(writer, message);
  return std::string(buffer.GetString(), buffer.GetSize());
}

}  // namespace numaserve::serving::http
