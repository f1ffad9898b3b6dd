#include "serving/request/datatypes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace numaserve::serving {
namespace {

// KServe v2 name, Triton enum, typed field, .npy descr.
struct Row {
  std::string name;
  inference::DataType triton;
  std::string field, npy;
};

const std::vector<Row>& Rows() {
  static const std::vector<Row> kRows = {
      {"BOOL", inference::TYPE_BOOL, "bool_contents", "|b1"},
      {"UINT8", inference::TYPE_UINT8, "uint_contents", "|u1"},
      {"UINT16", inference::TYPE_UINT16, "uint_contents", "<u2"},
      {"UINT32", inference::TYPE_UINT32, "uint_contents", "<u4"},
      {"UINT64", inference::TYPE_UINT64, "uint64_contents", "<u8"},
      {"INT8", inference::TYPE_INT8, "int_contents", "|i1"},
      {"INT16", inference::TYPE_INT16, "int_contents", "<i2"},
      {"INT32", inference::TYPE_INT32, "int_contents", "<i4"},
      {"INT64", inference::TYPE_INT64, "int64_contents", "<i8"},
      {"FP16", inference::TYPE_FP16, "", "<f2"},
      {"BF16", inference::TYPE_BF16, "", ""},
      {"FP32", inference::TYPE_FP32, "fp32_contents", "<f4"},
      {"FP64", inference::TYPE_FP64, "fp64_contents", "<f8"},
  };
  return kRows;
}

TEST(DatatypesTest, EveryTypeHasItsFieldTritonTypeAndNpyDescr) {
  int named_by_engine = 0;
  for (const Row& row : Rows()) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(ContentsFieldFor(row.name), row.field);
    EXPECT_EQ(NpyDescrFor(row.name), row.npy);
    engine::DataType type = engine::DataTypeFromName(row.name);
    if (type == engine::DataType::kUnknown) continue;  // not in engine::DataType yet
    ++named_by_engine;
    EXPECT_EQ(TritonDataType(type), row.triton);
  }
  EXPECT_GE(named_by_engine, 9);
  EXPECT_EQ(TritonDataType(engine::DataType::kUnknown), inference::TYPE_INVALID);
  EXPECT_EQ(ContentsFieldFor("COMPLEX64"), "");
  EXPECT_EQ(NpyDescrFor("COMPLEX64"), "");
}

TEST(DatatypesTest, HalfRoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), bits) << std::hex << bits << " -> " << f;
  }
}

TEST(DatatypesTest, HalfKnownValuesAndRounding) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // ties to even: infinity
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // halfway to it: ties to even (0)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: ties to even (2)
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  // 1 + 2^-11 is halfway between 1 and the next half: to even (1.0);
  // 1 + 3 * 2^-11 is halfway between two odd/even neighbours: up.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
}

TEST(DatatypesTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie: up to even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -7)), 0x3f81);      // exact
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBFloat16(f), bits) << std::hex << bits;
    }
  }
}

template <typename T>
std::string Bytes(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

TEST(DatatypesTest, FormatsEachElementType) {
  EXPECT_EQ(FormatElement("FP32", Bytes(0.5f).data()), "0.5000");
  EXPECT_EQ(FormatElement("FP64", Bytes(-1.25).data(), 2), "-1.25");
  EXPECT_EQ(FormatElement("FP16", Bytes(uint16_t{0x3c00}).data()), "1.0000");
  EXPECT_EQ(FormatElement("BF16", Bytes(uint16_t{0xc000}).data()), "-2.0000");
  EXPECT_EQ(FormatElement("INT8", Bytes(int8_t{-5}).data()), "-5");
  EXPECT_EQ(FormatElement("UINT8", Bytes(uint8_t{250}).data()), "250");
  EXPECT_EQ(FormatElement("INT16", Bytes(int16_t{-300}).data()), "-300");
  EXPECT_EQ(FormatElement("UINT16", Bytes(uint16_t{65535}).data()), "65535");
  EXPECT_EQ(FormatElement("INT32", Bytes(int32_t{-70000}).data()), "-70000");
  EXPECT_EQ(FormatElement("UINT32", Bytes(uint32_t{4000000000u}).data()), "4000000000");
  EXPECT_EQ(FormatElement("INT64", Bytes(int64_t{-9000000000}).data()), "-9000000000");
  EXPECT_EQ(FormatElement("UINT64", Bytes(uint64_t{18000000000000000000u}).data()),
            "18000000000000000000");
  EXPECT_EQ(FormatElement("BOOL", Bytes(uint8_t{1}).data()), "true");
  EXPECT_EQ(FormatElement("BOOL", Bytes(uint8_t{0}).data()), "false");
  EXPECT_EQ(FormatElement("BYTES", "abcd"), "?");
  EXPECT_EQ(ElementAsDouble("INT64", Bytes(int64_t{-7}).data()), -7.0);
  EXPECT_EQ(ElementAsDouble("FP16", Bytes(uint16_t{0x3800}).data()), 0.5);
}

TEST(DatatypesTest, FillRandomGivesSmallIntegersBooleansAndFloatsInRange) {
  std::mt19937 rng(1);
  for (const Row& row : Rows()) {
    const size_t size = engine::DataTypeSize(engine::DataTypeFromName(row.name));
    if (size == 0) continue;
    SCOPED_TRACE(row.name);
    std::string out(1000 * size, '\x7f');
    ASSERT_TRUE(FillRandom(row.name, 1000, -1.0f, 1.0f, &rng, out.data()));
    double low = 1e9, high = -1e9;
    for (int i = 0; i < 1000; ++i) {
      const double v = ElementAsDouble(row.name, out.data() + i * size);
      low = std::min(low, v);
      high = std::max(high, v);
    }
    if (row.name == "BOOL") {
      EXPECT_EQ(low, 0);
      EXPECT_EQ(high, 1);
    } else if (row.name[0] == 'F' || row.name == "BF16") {
      EXPECT_GE(low, -1.0);
      EXPECT_LE(high, 1.0);
      EXPECT_LT(low, -0.9);
      EXPECT_GT(high, 0.9);
    } else {
      EXPECT_EQ(low, 0);  // every byte above the low one written as 0
      EXPECT_EQ(high, 9);
    }
  }
  std::string untouched = "abcd";
  EXPECT_FALSE(FillRandom("BYTES", 1, 0, 1, &rng, untouched.data()));
  EXPECT_EQ(untouched, "abcd");
}

}  // namespace
}  // namespace numaserve::serving
