#include "serving/request/datatypes.h"

#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace numaserve::serving {
namespace {

template <typename T>
T Load(const char* data) {
  T value;
  memcpy(&value, data, sizeof value);
  return value;
}

}  // namespace

std::string ContentsFieldFor(const std::string& datatype) {
  static const std::map<std::string, std::string> kFields = {
      {"BOOL", "bool_contents"},   {"INT8", "int_contents"},    {"INT16", "int_contents"},
      {"INT32", "int_contents"},   {"INT64", "int64_contents"}, {"UINT8", "uint_contents"},
      {"UINT16", "uint_contents"}, {"UINT32", "uint_contents"}, {"UINT64", "uint64_contents"},
      {"FP32", "fp32_contents"},   {"FP64", "fp64_contents"},   {"BYTES", "bytes_contents"}};
  auto it = kFields.find(datatype);
  return it == kFields.end() ? "" : it->second;
}

inference::DataType TritonDataType(engine::DataType type) {
  inference::DataType out = inference::TYPE_INVALID;
  if (!inference::DataType_Parse(absl::StrCat("TYPE_", engine::DataTypeName(type)), &out)) {
    return inference::TYPE_INVALID;
  }
  return out;
}

std::string NpyDescrFor(const std::string& datatype) {
  static const std::map<std::string, std::string> kDescr = {
      {"BOOL", "|b1"},   {"INT8", "|i1"},  {"INT16", "<i2"},  {"INT32", "<i4"},
      {"INT64", "<i8"},  {"UINT8", "|u1"}, {"UINT16", "<u2"}, {"UINT32", "<u4"},
      {"UINT64", "<u8"}, {"FP16", "<f2"},  {"FP32", "<f4"},   {"FP64", "<f8"}};
  auto it = kDescr.find(datatype);
  return it == kDescr.end() ? "" : it->second;
}

double ElementAsDouble(const std::string& t, const char* p) {
  if (t == "FP32") return Load<float>(p);
  if (t == "FP64") return Load<double>(p);
  if (t == "FP16") return HalfToFloat(Load<uint16_t>(p));
  if (t == "BF16") return BFloat16ToFloat(Load<uint16_t>(p));
  if (t == "INT8") return Load<int8_t>(p);
  if (t == "INT16") return Load<int16_t>(p);
  if (t == "INT32") return Load<int32_t>(p);
  if (t == "INT64") return static_cast<double>(Load<int64_t>(p));
  if (t == "UINT8" || t == "BOOL") return Load<uint8_t>(p);
  if (t == "UINT16") return Load<uint16_t>(p);
  if (t == "UINT32") return Load<uint32_t>(p);
  if (t == "UINT64") return static_cast<double>(Load<uint64_t>(p));
  return 0;
}

std::string FormatElement(const std::string& t, const char* p, int float_digits) {
  if (t == "FP32" || t == "FP64" || t == "FP16" || t == "BF16") {
    return absl::StrFormat("%.*f", float_digits, ElementAsDouble(t, p));
  }
  if (t == "BOOL") return Load<uint8_t>(p) != 0 ? "true" : "false";
  if (t == "INT8") return absl::StrCat(Load<int8_t>(p));
  if (t == "INT16") return absl::StrCat(Load<int16_t>(p));
  if (t == "INT32") return absl::StrCat(Load<int32_t>(p));
  if (t == "INT64") return absl::StrCat(Load<int64_t>(p));
  if (t == "UINT8") return absl::StrCat(Load<uint8_t>(p));
  if (t == "UINT16") return absl::StrCat(Load<uint16_t>(p));
  if (t == "UINT32") return absl::StrCat(Load<uint32_t>(p));
  if (t == "UINT64") return absl::StrCat(Load<uint64_t>(p));
  return "?";
}

bool FillRandom(const std::string& datatype, int64_t elements, float low, float high,
                std::mt19937* rng, char* out) {
  const size_t size = engine::DataTypeSize(engine::DataTypeFromName(datatype));
  if (size == 0) return false;
  std::uniform_real_distribution<float> uniform(low, high);
  std::uniform_int_distribution<int> digit(0, 9), coin(0, 1);
  for (int64_t i = 0; i < elements; ++i) {
    char* p = out + i * size;
    auto put = [p](auto value) { memcpy(p, &value, sizeof value); };
    if (datatype == "FP32") {
      put(uniform(*rng));
    } else if (datatype == "FP64") {
      put(static_cast<double>(uniform(*rng)));
    } else if (datatype == "FP16") {
      put(FloatToHalf(uniform(*rng)));
    } else if (datatype == "BF16") {
      put(FloatToBFloat16(uniform(*rng)));
    } else if (datatype == "BOOL") {
      put(static_cast<uint8_t>(coin(*rng)));
    } else {  // an integer, little-endian: the low byte holds the value
      memset(p, 0, size);
      *p = static_cast<char>(digit(*rng));
    }
  }
  return true;
}

}  // namespace numaserve::serving
