// What each tensor datatype is called where the server meets the outside:
// the KServe v2 `contents` field that carries it, Triton's TYPE_* enum, the
// NumPy .npy descr, and how one element prints. Keyed by the KServe name
// ("INT64"); sizes come from engine::DataTypeSize.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "engine/ir/typed_tensor.h"
#include "engine/ir/types.h"
#include "triton_model_config.pb.h"

namespace numaserve::serving {

// The InferTensorContents field that carries `datatype` in KServe v2
// ("int_contents" for INT8/INT16/INT32, "uint_contents" for
// UINT8/UINT16/UINT32, "int64_contents", "uint64_contents",
// "bool_contents", "fp32_contents", "fp64_contents", "bytes_contents" for
// BYTES), or "" for FP16 and BF16, which travel only in raw contents.
std::string ContentsFieldFor(const std::string& datatype);

// Triton's TYPE_* for an engine type ("FP32" -> TYPE_FP32); TYPE_INVALID
// when Triton has no such type.
inference::DataType TritonDataType(engine::DataType type);

// The .npy descr NumPy writes for `datatype` ("<f4" for FP32, "|b1" for
// BOOL, "<f2" for FP16), or "" when NumPy has none (BF16).
std::string NpyDescrFor(const std::string& datatype);

// One element at `data` (little-endian, `datatype` bytes wide) as text:
// floats with `float_digits` decimals (FP16 and BF16 widened exactly),
// integers in full, BOOL as true/false. "?" for a datatype it cannot read.
std::string FormatElement(const std::string& datatype, const char* data, int float_digits = 4);

// The element as a double (FP16/BF16 widened, integers converted), for
// argmax and comparisons; 0 for BOOL false / unknown types, 1 for true.
double ElementAsDouble(const std::string& datatype, const char* data);

// Fills `elements` values of `datatype` at `out` (DataTypeSize bytes each):
// floats uniform in [low, high), integers uniform in 0..9 (valid indices and
// ids for most models), BOOL 0 or 1. False (nothing written) for a datatype
// it cannot fill.
bool FillRandom(const std::string& datatype, int64_t elements, float low, float high,
                std::mt19937* rng, char* out);

// IEEE half and bfloat16 bit patterns <-> float: the engine's conversions
// (round to nearest even; NaN stays NaN, overflow becomes infinity).
using engine::BFloat16ToFloat;
using engine::FloatToBFloat16;
using engine::FloatToHalf;
using engine::HalfToFloat;

}  // namespace numaserve::serving
