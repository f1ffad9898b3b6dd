#include "engine/ir/typed_tensor.h"

#include <cmath>

namespace numaserve::engine {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      // Subnormal: mant * 2^-24, exact in float.
      const float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&u, &f, sizeof(u));
      u |= sign;
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal or zero, in units
    // of 2^-24, rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    const float scaled = a * 16777216.0f;  // exact (power of two)
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: drop 13 mantissa bits with round to nearest even.
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

uint16_t FloatToBFloat16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

TypedTensor::TypedTensor(DataType t, Shape s)
    : type(t), shape(std::move(s)), bytes(kernels::NumElements(shape) * DataTypeSize(t), 0) {}

double TypedTensor::GetDouble(int64_t i) const {
  return VisitType(
      type,
      [&](auto tag) { return ConvertElement<double>(data<typename decltype(tag)::type>()[i]); },
      [] { return 0.0; });
}

int64_t TypedTensor::GetInt64(int64_t i) const {
  return VisitType(
      type,
      [&](auto tag) { return ConvertElement<int64_t>(data<typename decltype(tag)::type>()[i]); },
      [] { return int64_t{0}; });
}

TypedTensor TypedTensor::FromFloat(const kernels::Tensor& t) {
  return FromBytes(DataType::kFloat32, t.shape, t.data.data());
}

TypedTensor TypedTensor::View(DataType type, Shape shape, const void* data) {
  TypedTensor t;
  t.type = type;
  t.shape = std::move(shape);
  t.view = static_cast<const uint8_t*>(data);
  return t;
}

TypedTensor TypedTensor::Owned() const {
  if (view == nullptr) return *this;
  return FromBytes(type, shape, view);
}

TypedTensor TypedTensor::FromBytes(DataType type, Shape shape, const void* data) {
  TypedTensor t(type, std::move(shape));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

kernels::Tensor TypedTensor::ToFloat() const {
  kernels::Tensor out(shape);
  VisitType(
      type,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* src = data<T>();
        for (int64_t i = 0; i < out.size(); ++i) out.data[i] = ConvertElement<float>(src[i]);
      },
      [] {});
  return out;
}

TypedTensor TypedTensor::CastTo(DataType to) const {
  TypedTensor out(to, shape);
  VisitType(
      type,
      [&](auto from_tag) {
        using From = typename decltype(from_tag)::type;
        VisitType(
            to,
            [&](auto to_tag) {
              using To = typename decltype(to_tag)::type;
              const From* src = data<From>();
              To* dst = out.data<To>();
              const int64_t n = size();
              for (int64_t i = 0; i < n; ++i) dst[i] = ConvertElement<To>(src[i]);
            },
            [] {});
      },
      [] {});
  return out;
}

bool IsIntegerType(DataType type) {
  switch (type) {
    case DataType::kUint8:
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kUint16:
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kInt64:
    case DataType::kUint64:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(DataType type) {
  return type == DataType::kFloat16 || type == DataType::kBFloat16 || type == DataType::kFloat32 ||
         type == DataType::kFloat64;
}

}  // namespace numaserve::engine
