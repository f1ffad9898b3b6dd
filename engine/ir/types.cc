// DataType names and sizes (engine/ir/types.h).
#include "engine/ir/types.h"

#include <array>

namespace numaserve::engine {
namespace {

struct TypeRow {
  DataType type;
  const char* name;
  size_t size;
};

constexpr std::array<TypeRow, 13> kTypes = {{
    {DataType::kBool, "BOOL", 1},
    {DataType::kUint8, "UINT8", 1},
    {DataType::kInt8, "INT8", 1},
    {DataType::kInt16, "INT16", 2},
    {DataType::kUint16, "UINT16", 2},
    {DataType::kInt32, "INT32", 4},
    {DataType::kUint32, "UINT32", 4},
    {DataType::kInt64, "INT64", 8},
    {DataType::kUint64, "UINT64", 8},
    {DataType::kFloat16, "FP16", 2},
    {DataType::kBFloat16, "BF16", 2},
    {DataType::kFloat32, "FP32", 4},
    {DataType::kFloat64, "FP64", 8},
}};

}  // namespace

const char* DataTypeName(DataType type) {
  for (const TypeRow& row : kTypes) {
    if (row.type == type) return row.name;
  }
  return "UNKNOWN";
}

DataType DataTypeFromName(const std::string& name) {
  for (const TypeRow& row : kTypes) {
    if (name == row.name) return row.type;
  }
  return DataType::kUnknown;
}

size_t DataTypeSize(DataType type) {
  for (const TypeRow& row : kTypes) {
    if (row.type == type) return row.size;
  }
  return 0;
}

}  // namespace numaserve::engine
