// Tensors of any ONNX numeric element type the engine supports at runtime
// (DataType): a type, a shape and the elements' bytes, row-major. FP32 runs
// on kernels::Tensor and the compiled steps; everything that touches a
// value of another type runs on these, through the ops' typed references
// (engine/ops/typed_ops.cc). Also FP16/BF16 <-> float conversion (round to
// nearest even) and VisitType, which calls a template with the C++ element
// type of a DataType.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ir/types.h"
#include "kernels/tensor.h"

namespace numaserve::engine {

using kernels::Shape;

// IEEE half and bfloat16, stored as their bits.
struct Float16 {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);  // round to nearest even; overflow -> inf
inline float BFloat16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint16_t FloatToBFloat16(float value);  // round to nearest even; NaN stays NaN

// The C++ type holding one element of each supported DataType (BOOL is
// bool: one byte, 0 or 1).
template <DataType T>
struct ElementOf;
template <>
struct ElementOf<DataType::kBool> {
  using type = bool;
};
template <>
struct ElementOf<DataType::kUint8> {
  using type = uint8_t;
};
template <>
struct ElementOf<DataType::kInt8> {
  using type = int8_t;
};
template <>
struct ElementOf<DataType::kInt16> {
  using type = int16_t;
};
template <>
struct ElementOf<DataType::kUint16> {
  using type = uint16_t;
};
template <>
struct ElementOf<DataType::kInt32> {
  using type = int32_t;
};
template <>
struct ElementOf<DataType::kUint32> {
  using type = uint32_t;
};
template <>
struct ElementOf<DataType::kInt64> {
  using type = int64_t;
};
template <>
struct ElementOf<DataType::kUint64> {
  using type = uint64_t;
};
template <>
struct ElementOf<DataType::kFloat16> {
  using type = Float16;
};
template <>
struct ElementOf<DataType::kBFloat16> {
  using type = BFloat16;
};
template <>
struct ElementOf<DataType::kFloat32> {
  using type = float;
};
template <>
struct ElementOf<DataType::kFloat64> {
  using type = double;
};

// Passed to VisitType's callable: `typename decltype(tag)::type` is the
// element type.
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the element type of `type`; `fallback()` for
// kUnknown (and anything not listed).
template <typename F, typename G>
auto VisitType(DataType type, F&& f, G&& fallback) {
  switch (type) {
    case DataType::kBool:
      return f(TypeTag<bool>{});
    case DataType::kUint8:
      return f(TypeTag<uint8_t>{});
    case DataType::kInt8:
      return f(TypeTag<int8_t>{});
    case DataType::kInt16:
      return f(TypeTag<int16_t>{});
    case DataType::kUint16:
      return f(TypeTag<uint16_t>{});
    case DataType::kInt32:
      return f(TypeTag<int32_t>{});
    case DataType::kUint32:
      return f(TypeTag<uint32_t>{});
    case DataType::kInt64:
      return f(TypeTag<int64_t>{});
    case DataType::kUint64:
      return f(TypeTag<uint64_t>{});
    case DataType::kFloat16:
      return f(TypeTag<Float16>{});
    case DataType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    case DataType::kFloat32:
      return f(TypeTag<float>{});
    case DataType::kFloat64:
      return f(TypeTag<double>{});
    default:
      return fallback();
  }
}

// Arithmetic on FP16/BF16 happens in float; other types compute in their
// own type.
template <typename T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<Float16> {
  using type = float;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};
template <typename T>
using Compute = typename ComputeOf<T>::type;

template <typename T>
inline Compute<T> ToCompute(T v) {
  if constexpr (std::is_same_v<T, Float16>) {
    return HalfToFloat(v.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16ToFloat(v.bits);
  } else {
    return v;
  }
}
template <typename T>
inline T FromCompute(Compute<T> v) {
  if constexpr (std::is_same_v<T, Float16>) {
    return Float16{FloatToHalf(v)};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{FloatToBFloat16(v)};
  } else {
    return v;
  }
}

// Element conversion with ONNX Cast semantics: to BOOL is x != 0; float to
// integer truncates toward zero (out-of-range values saturate instead of
// being undefined behaviour; NaN becomes 0); integer to integer wraps as
// two's complement; anything to FP16/BF16 rounds to nearest even.
template <typename To, typename From>
inline To ConvertElement(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Float16> || std::is_same_v<From, BFloat16>) {
    return ConvertElement<To, float>(ToCompute(v));
  } else if constexpr (std::is_same_v<To, Float16> || std::is_same_v<To, BFloat16>) {
    // Through float (as ONNX Runtime does for DOUBLE -> FLOAT16).
    return FromCompute<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if (!(v == v)) return To(0);
    const long double t = static_cast<long double>(v);
    if (t <= static_cast<long double>(std::numeric_limits<To>::lowest())) {
      return std::numeric_limits<To>::lowest();
    }
    if (t >= static_cast<long double>(std::numeric_limits<To>::max())) {
      return std::numeric_limits<To>::max();
    }
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

struct TypedTensor {
  DataType type = DataType::kFloat32;
  Shape shape;
  std::vector<uint8_t> bytes;  // NumElements(shape) * DataTypeSize(type)
  // When set, the elements live there, not owned (a graph constant, a value
  // in a compiled model's buffers) and `bytes` is empty: read-only.
  const uint8_t* view = nullptr;

  TypedTensor() = default;
  // Zero-filled.
  TypedTensor(DataType t, Shape s);

  int64_t size() const { return kernels::NumElements(shape); }
  size_t element_size() const { return DataTypeSize(type); }
  // The elements, owned or viewed.
  const uint8_t* raw() const { return view != nullptr ? view : bytes.data(); }
  template <typename T>
  T* data() {  // owned tensors only
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(raw());
  }

  // Element i converted to double / int64 (Cast semantics).
  double GetDouble(int64_t i) const;
  int64_t GetInt64(int64_t i) const;

  static TypedTensor FromFloat(const kernels::Tensor& t);
  // A view of `data`, which must outlive it.
  static TypedTensor View(DataType type, Shape shape, const void* data);
  // An owning copy (of a view's elements too).
  TypedTensor Owned() const;
  // A copy of `count` elements of `type` at `data`.
  static TypedTensor FromBytes(DataType type, Shape shape, const void* data);
  template <typename T>
  static TypedTensor FromValues(DataType type, Shape shape, const std::vector<T>& values) {
    TypedTensor t(type, std::move(shape));
    // An empty shape (a zero dim) leaves both buffers empty and their data() null.
    const size_t n = std::min(t.bytes.size(), values.size() * sizeof(T));
    if (n > 0) std::memcpy(t.bytes.data(), values.data(), n);
    return t;
  }
  // Every element converted to FP32 (exact for FP32 itself).
  kernels::Tensor ToFloat() const;
  // The elements converted to `to` (ONNX Cast semantics).
  TypedTensor CastTo(DataType to) const;
};

bool IsIntegerType(DataType type);  // signed or unsigned integers, not BOOL
bool IsFloatType(DataType type);    // FP16, BF16, FP32, FP64

}  // namespace numaserve::engine
