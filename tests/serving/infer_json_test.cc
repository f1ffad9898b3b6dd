#include "serving/http/infer_json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/ir/typed_tensor.h"
#include "serving/http/json_writer.h"
#include "triton_model_config.pb.h"

namespace numaserve::serving::http {
namespace {

constexpr size_t kLimit = size_t{64} << 20;

// The binary part is copied and kept by the request, as the server's body is.
JsonInferRequest Parse(const std::string& json, const std::string& binary = "") {
  auto held = std::make_shared<const std::string>(binary);
  std::vector<absl::string_view> pieces;
  if (!held->empty()) pieces.emplace_back(*held);
  absl::StatusOr<JsonInferRequest> parsed = ParseJsonInferRequest(json, pieces, held, kLimit);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << json.substr(0, 300);
  return parsed.ok() ? *std::move(parsed) : JsonInferRequest{};
}

// Input `i`'s bytes, its pieces joined.
std::string RawInput(const JsonInferRequest& r, int i) {
  if (r.inputs == nullptr || static_cast<size_t>(i) >= r.inputs->inputs.size()) return "<none>";
  std::string bytes;
  for (const auto& [data, size] : r.inputs->inputs[static_cast<size_t>(i)].pieces) {
    bytes.append(data, size);
  }
  return bytes;
}

size_t RawInputCount(const JsonInferRequest& r) {
  return r.inputs == nullptr ? 0 : r.inputs->inputs.size();
}

void ExpectInvalid(const std::string& json, const std::string& fragment,
                   const std::string& binary = "", size_t limit = kLimit) {
  absl::StatusOr<JsonInferRequest> parsed = ParseJsonInferRequest(json, binary, limit);
  ASSERT_FALSE(parsed.ok()) << "accepted: " << json.substr(0, 300);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find(fragment), absl::string_view::npos)
      << parsed.status() << "\nshould mention '" << fragment << "'";
}

template <typename T>
std::vector<T> Values(const std::string& raw) {
  std::vector<T> out(raw.size() / sizeof(T));
  memcpy(out.data(), raw.data(), out.size() * sizeof(T));
  return out;
}

std::string Input(const std::string& datatype, const std::string& shape, const std::string& data) {
  return R"({"inputs":[{"name":"x","datatype":")" + datatype + R"(","shape":)" + shape +
         R"(,"data":)" + data + "}]}";
}

TEST(InferJsonRequestTest, FlatAndNestedDataGiveTheSameBytes) {
  const JsonInferRequest flat = Parse(Input("FP32", "[2,3]", "[1,2,3,4,5,6.5]"));
  const JsonInferRequest nested = Parse(Input("FP32", "[2,3]", "[[1,2,3],[4,5,6.5]]"));
  ASSERT_EQ(flat.request.inputs_size(), 1);
  EXPECT_EQ(flat.request.inputs(0).name(), "x");
  EXPECT_EQ(flat.request.inputs(0).datatype(), "FP32");
  EXPECT_EQ(flat.request.inputs(0).shape_size(), 2);
  ASSERT_EQ(RawInputCount(flat), 1u);
  EXPECT_EQ(Values<float>(RawInput(flat, 0)), (std::vector<float>{1, 2, 3, 4, 5, 6.5f}));
  EXPECT_EQ(RawInput(flat, 0), RawInput(nested, 0));
}

TEST(InferJsonRequestTest, EveryDatatypeIsConverted) {
  EXPECT_EQ(RawInput(Parse(Input("BOOL", "[3]", "[true,false,true]")), 0),
            std::string("\x01\x00\x01", 3));
  EXPECT_EQ(Values<int8_t>(RawInput(Parse(Input("INT8", "[2]", "[-128,127]")), 0)),
            (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(Values<uint8_t>(RawInput(Parse(Input("UINT8", "[2]", "[0,255]")), 0)),
            (std::vector<uint8_t>{0, 255}));
  EXPECT_EQ(Values<int16_t>(RawInput(Parse(Input("INT16", "[2]", "[-32768,7]")), 0)),
            (std::vector<int16_t>{-32768, 7}));
  EXPECT_EQ(Values<uint16_t>(RawInput(Parse(Input("UINT16", "[1]", "[65535]")), 0)),
            (std::vector<uint16_t>{65535}));
  EXPECT_EQ(Values<int32_t>(RawInput(Parse(Input("INT32", "[2]", "[-5,2147483647]")), 0)),
            (std::vector<int32_t>{-5, 2147483647}));
  EXPECT_EQ(Values<uint32_t>(RawInput(Parse(Input("UINT32", "[1]", "[4294967295]")), 0)),
            (std::vector<uint32_t>{4294967295u}));
  EXPECT_EQ(Values<int64_t>(RawInput(
                Parse(Input("INT64", "[2]", "[-9223372036854775808,9223372036854775807]")), 0)),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(Values<uint64_t>(RawInput(Parse(Input("UINT64", "[1]", "[18446744073709551615]")), 0)),
            (std::vector<uint64_t>{std::numeric_limits<uint64_t>::max()}));
  EXPECT_EQ(Values<double>(RawInput(Parse(Input("FP64", "[2]", "[0.1,-3]")), 0)),
            (std::vector<double>{0.1, -3}));
  EXPECT_EQ(Values<uint16_t>(RawInput(Parse(Input("FP16", "[2]", "[1.5,-2]")), 0)),
            (std::vector<uint16_t>{engine::FloatToHalf(1.5f), engine::FloatToHalf(-2.0f)}));
  EXPECT_EQ(Values<uint16_t>(RawInput(Parse(Input("BF16", "[1]", "[3.25]")), 0)),
            (std::vector<uint16_t>{engine::FloatToBFloat16(3.25f)}));
  // BYTES: each element as its 4-byte little-endian length and its bytes.
  EXPECT_EQ(RawInput(Parse(Input("BYTES", "[2]", R"(["ab",""])")), 0),
            std::string("\x02\x00\x00\x00"
                        "ab\x00\x00\x00\x00",
                        10));
}

TEST(InferJsonRequestTest, NanAndInfinityAreFloats) {
  const std::vector<float> v =
      Values<float>(RawInput(Parse(Input("FP32", "[3]", "[NaN,Infinity,-Infinity]")), 0));
  ASSERT_EQ(v.size(), 3u);
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(v[2], -std::numeric_limits<float>::infinity());
}

// Numbers are converted by std::from_chars, not by RapidJSON 1.1.0 (whose
// full-precision path read past its table of cached powers for 9...9e308
// and called clz(0) for 0e308; the infer_json fuzz target's inputs in
// tests/fuzz/regressions/infer_json/).
TEST(InferJsonRequestTest, NumbersAreConvertedExactlyAtTheEdgesOfTheirRanges) {
  EXPECT_EQ(Values<double>(RawInput(Parse(Input("FP64", "[5]",
                                                "[0e308,1e308,1.7976931348623157e308,4.9e-324,"
                                                "0.30000000000000004]")),
                                    0)),
            (std::vector<double>{0.0, 1e308, std::numeric_limits<double>::max(),
                                 std::numeric_limits<double>::denorm_min(), 0.30000000000000004}));
  // Past uint64: a double, as RapidJSON's own events would give it.
  EXPECT_EQ(Values<double>(RawInput(
                Parse(Input("FP64", "[2]", "[18446744073709551616,-9223372036854775809]")), 0)),
            (std::vector<double>{18446744073709551616.0, -9223372036854775809.0}));
  ExpectInvalid(Input("UINT64", "[1]", "[18446744073709551616]"), "data[0]");
  ExpectInvalid(Input("FP64", "[1]", "[1e400]"), "");
  ExpectInvalid(Input("FP64", "[1]", "[99999999999999999999999999999999999999999e300]"), "");
}

TEST(InferJsonRequestTest, ValuesOfTheWrongTypeOrRangeAreRefusedNamingTheIndex) {
  ExpectInvalid(Input("INT8", "[2]", "[1,300]"), "data[1] = 300 is not an integer in INT8's range");
  ExpectInvalid(Input("UINT8", "[1]", "[-1]"), "UINT8's range [0, 255]");
  ExpectInvalid(Input("INT32", "[1]", "[1.5]"), "data[0] = 1.5 is not an integer");
  ExpectInvalid(Input("INT64", "[1]", "[18446744073709551615]"), "INT64's range");
  ExpectInvalid(Input("FP32", "[1]", R"(["1"])"), "data[0] is a string; FP32 values are numbers");
  ExpectInvalid(Input("FP32", "[1]", "[null]"), "data[0] is null");
  ExpectInvalid(Input("BOOL", "[1]", "[1]"), "BOOL values are true or false");
  ExpectInvalid(Input("BYTES", "[1]", "[1]"), "BYTES values are strings");
  ExpectInvalid(Input("FP32", "[1]", R"([{"a":1}])"), "'data' holds an object");
}

TEST(InferJsonRequestTest, ValueCountMustMatchTheShape) {
  ExpectInvalid(Input("FP32", "[2,3]", "[1,2,3,4]"), "shape [2,3] holds 6 values, 'data' has 4");
  ExpectInvalid(Input("FP32", "[2]", "[1,2,3]"), "shape [2] holds 2 values, 'data' has more");
  ExpectInvalid(Input("FP32", "[0]", "[1]"), "holds 0 values, 'data' has more");
}

TEST(InferJsonRequestTest, DeclaredShapesAreCheckedBeforeAnythingIsAllocated) {
  // 2^40 floats: refused from the shape, before a value is read.
  ExpectInvalid(Input("FP32", "[1099511627776]", "[1]"), "needs more than the 67108864-byte limit");
  ExpectInvalid(Input("FP32", "[65536,65536,65536,65536]", "[1]"), "more than the");
  ExpectInvalid(Input("INT64", "[9223372036854775807]", "[1]"), "more than the");
  ExpectInvalid(Input("FP32", "[1025]", "[]"), "more than the 4096-byte limit", "", 4096);
  ExpectInvalid(Input("FP32", "[2,-3]", "[1]"), "shape dim -3 is negative");
  ExpectInvalid(Input("FP32", "[2.5]", "[1]"), "shape dims are non-negative integers, got 2.5");
  ExpectInvalid(Input("FP32", "[18446744073709551615]", "[1]"), "non-negative integers");
  std::string deep_shape = "[";
  for (int i = 0; i < 65; ++i) deep_shape += i ? ",1" : "1";
  ExpectInvalid(Input("FP32", deep_shape + "]", "[1]"), "more than 64 dims");
}

TEST(InferJsonRequestTest, DataBeforeDatatypeAndShapeIsReadOnceTheyAreKnown) {
  const JsonInferRequest r =
      Parse(R"({"inputs":[{"data":[[1,2],[3,4]],"name":"x","shape":[2,2],"datatype":"INT32"},)"
            R"({"name":"y","datatype":"FP64","shape":[1],"data":[0.5]}]})");
  ASSERT_EQ(RawInputCount(r), 2u);
  EXPECT_EQ(Values<int32_t>(RawInput(r, 0)), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(Values<double>(RawInput(r, 1)), (std::vector<double>{0.5}));
  ExpectInvalid(R"({"inputs":[{"data":[1,2,3],"name":"x","shape":[2],"datatype":"INT32"}]})",
                "'data' has more");
  ExpectInvalid(R"({"inputs":[{"data":[1,300],"name":"x","shape":[2],"datatype":"INT8"}]})",
                "data[1] = 300");
}

TEST(InferJsonRequestTest, MalformedRequestsAreRefused) {
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,)",
                "not valid JSON");
  ExpectInvalid("", "not valid JSON");
  ExpectInvalid("[1,2]", "must be a JSON object");
  ExpectInvalid("7", "must be a JSON object");
  ExpectInvalid(R"({"inputs":[]} {"inputs":[]})", "not valid JSON");
  ExpectInvalid(R"({"id":"a"})", "has no 'inputs'");
  ExpectInvalid(R"({"inputs":[1]})", "each entry of 'inputs' must be an object");
  ExpectInvalid(R"({"inputs":[{"datatype":"FP32","shape":[1],"data":[1]}]})", "has no 'name'");
  ExpectInvalid(R"({"inputs":[{"name":"x","shape":[1],"data":[1]}]})", "has no 'datatype'");
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","data":[1]}]})", "has no 'shape'");
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1]}]})",
                "needs either 'data' or parameters.binary_data_size");
  ExpectInvalid(Input("FLOAT", "[1]", "[1]"), "unknown datatype 'FLOAT'");
  ExpectInvalid(R"({"inputs":[{"name":"x","name":"y","datatype":"FP32","shape":[1],"data":[1]}]})",
                "'name' is given twice");
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"data":[2]}]})",
                "'data' is given twice");
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"extra":1}]})",
                "unknown field 'extra'");
  ExpectInvalid(R"({"inputs":[],"model_name":"m"})", "unknown field 'model_name'");
  ExpectInvalid(R"({"inputs":[{"name":7,"datatype":"FP32","shape":[1],"data":[1]}]})",
                "'name' is a string");
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":1,"data":[1]}]})",
                "'shape' is an array");
  ExpectInvalid(R"({"id":5,"inputs":[]})", "'id' must be a string");
  ExpectInvalid(R"({"inputs":{}})", "'inputs' must not be an object");
}

TEST(InferJsonRequestTest, TextThatIsNotUtf8IsRefused) {
  ExpectInvalid(
      "{\"inputs\":[{\"name\":\"x\xff\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}",
      "not valid JSON");
  ExpectInvalid("{\"id\":\"\xc0\xaf\",\"inputs\":[]}", "not valid JSON");
}

TEST(InferJsonRequestTest, NestingIsBounded) {
  std::string deep = std::string(100, '[') + "1" + std::string(100, ']');
  ExpectInvalid(Input("FP32", "[1]", deep), "nests deeper than 32 levels");
  // Deep nesting anywhere else is refused at the first level that does not fit.
  std::string deep_parameter = R"({"parameters":{"p":)" + std::string(100000, '[') + "}";
  ExpectInvalid(deep_parameter, "must not be an array here");
}

TEST(InferJsonRequestTest, ParametersAndOutputs) {
  const JsonInferRequest r = Parse(
      R"({"id":"req-1","parameters":{"profile":true,"binary_data_output":true,"n":-3,"big":18446744073709551615,"s":"v","d":0.5},)"
      R"("inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"parameters":{"tag":"t"}}],)"
      R"("outputs":[{"name":"a","parameters":{"binary_data":false}},{"name":"b"}]})");
  EXPECT_EQ(r.request.id(), "req-1");
  EXPECT_TRUE(r.binary_outputs);
  const auto& p = r.request.parameters();
  EXPECT_TRUE(p.at("profile").bool_param());
  EXPECT_EQ(p.count("binary_data_output"), 0u);
  EXPECT_EQ(p.at("n").int64_param(), -3);
  EXPECT_EQ(p.at("big").uint64_param(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(p.at("s").string_param(), "v");
  EXPECT_EQ(p.at("d").double_param(), 0.5);
  EXPECT_EQ(r.request.inputs(0).parameters().at("tag").string_param(), "t");
  ASSERT_EQ(r.request.outputs_size(), 2);
  EXPECT_EQ(r.request.outputs(0).name(), "a");
  EXPECT_EQ(r.request.outputs(1).name(), "b");
  EXPECT_FALSE(r.output_binary.at("a"));
  EXPECT_EQ(r.output_binary.count("b"), 0u);
  ExpectInvalid(R"({"inputs":[],"outputs":[{"name":"a","parameters":{"classification":2}}]})",
                "classification extension is not supported");
  ExpectInvalid(R"({"inputs":[],"outputs":[{"parameters":{}}]})", "an output has no 'name'");
  ExpectInvalid(R"({"inputs":[],"parameters":{"binary_data_output":1}})", "is a bool");
  ExpectInvalid(R"({"inputs":[],"parameters":{"p":null}})", "parameter 'p' is null");
  ExpectInvalid(R"({"inputs":[],"parameters":{"p":1,"p":2}})", "parameter 'p' given twice");
}

std::string BinaryInput(const std::string& name, const std::string& datatype,
                        const std::string& shape, const std::string& size) {
  return R"({"name":")" + name + R"(","datatype":")" + datatype + R"(","shape":)" + shape +
         R"(,"parameters":{"binary_data_size":)" + size + "}}";
}

TEST(InferJsonRequestTest, BinaryDataFollowsTheJsonInInputOrder) {
  const float a[2] = {1.5f, -2.0f};
  const int64_t b[1] = {42};
  std::string binary(reinterpret_cast<const char*>(a), sizeof a);
  binary.append(reinterpret_cast<const char*>(b), sizeof b);
  const JsonInferRequest r =
      Parse(R"({"inputs":[)" + BinaryInput("a", "FP32", "[2]", "8") + "," +
                R"({"name":"j","datatype":"INT32","shape":[1],"data":[7]},)" +
                BinaryInput("b", "INT64", "[1]", "8") + "]}",
            binary);
  ASSERT_EQ(RawInputCount(r), 3u);
  EXPECT_EQ(Values<float>(RawInput(r, 0)), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(Values<int32_t>(RawInput(r, 1)), (std::vector<int32_t>{7}));
  EXPECT_EQ(Values<int64_t>(RawInput(r, 2)), (std::vector<int64_t>{42}));
  EXPECT_EQ(r.request.inputs(2).parameters().count("binary_data_size"), 0u);
}

TEST(InferJsonRequestTest, BinaryPartsAreReadWhereTheyLie) {
  // Two FP32 inputs in three pieces of a body: a's 8 bytes across the
  // first two, b's 4 in the last two.
  const std::string p0("\x00\x00\xc0\x3f\x00", 5), p1("\x00\x00\xc0\x00", 4), p2("\x00\x80\x3f", 3);
  const std::vector<absl::string_view> pieces = {p0, p1, p2};
  auto parsed = ParseJsonInferRequest(R"({"inputs":[)" + BinaryInput("a", "FP32", "[2]", "8") +
                                          "," + BinaryInput("b", "FP32", "[1]", "4") + "]}",
                                      pieces, nullptr, kLimit);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto& a = parsed->inputs->inputs[0];
  const auto& b = parsed->inputs->inputs[1];
  ASSERT_EQ(a.pieces.size(), 2u);
  EXPECT_EQ(a.pieces[0], (ByteSpan{p0.data(), 5}));
  EXPECT_EQ(a.pieces[1], (ByteSpan{p1.data(), 3}));
  ASSERT_EQ(b.pieces.size(), 2u);
  EXPECT_EQ(b.pieces[0], (ByteSpan{p1.data() + 3, 1}));
  EXPECT_EQ(b.pieces[1], (ByteSpan{p2.data(), 3}));
  EXPECT_EQ(Values<float>(RawInput(*parsed, 0)), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(Values<float>(RawInput(*parsed, 1)), (std::vector<float>{1.0f}));
  EXPECT_EQ(parsed->request.raw_input_contents_size(), 0);
}

TEST(InferJsonRequestTest, BinaryDataSizesMustAccountForTheBinaryPart) {
  const std::string eight(8, '\0');
  ExpectInvalid(R"({"inputs":[)" + BinaryInput("a", "FP32", "[4]", "16") + "]}",
                "binary_data_size 16 runs past the end of the body (8 bytes", eight);
  ExpectInvalid(R"({"inputs":[)" + BinaryInput("a", "FP32", "[1]", "4") + "]}",
                "8 bytes of binary data follow the JSON", eight);
  ExpectInvalid(R"({"inputs":[)" + BinaryInput("a", "FP32", "[1]", "8") + "]}",
                "shape [1] of FP32 needs 4 bytes, binary_data_size is 8", eight);
  ExpectInvalid(R"({"inputs":[)" + BinaryInput("a", "FP32", "[1]", "-8") + "]}",
                "binary_data_size must be a non-negative integer, got -8", eight);
  ExpectInvalid(R"({"inputs":[)" + BinaryInput("a", "FP32", "[1]", "\"8\"") + "]}",
                "binary_data_size must be a non-negative integer", eight);
  ExpectInvalid(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],)"
                R"("parameters":{"binary_data_size":4}}]})",
                "either 'data' or parameters.binary_data_size", std::string(4, '\0'));
  ExpectInvalid(Input("FP32", "[1]", "[1]"), "1 bytes of binary data follow", "x");
  // A huge declared shape is refused before its size is compared.
  ExpectInvalid(R"({"inputs":[)" + BinaryInput("a", "FP32", "[1099511627776]", "8") + "]}",
                "more than the", eight);
}

inference::ModelInferResponse Response() {
  inference::ModelInferResponse r;
  r.set_model_name("m");
  r.set_model_version("2");
  r.set_id("req-1");
  auto* out = r.add_outputs();
  out->set_name("y");
  out->set_datatype("FP32");
  out->add_shape(1);
  out->add_shape(4);
  const float values[4] = {0.1f, -2.0f, std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity()};
  r.add_raw_output_contents()->assign(reinterpret_cast<const char*>(values), sizeof values);
  auto* flag = r.add_outputs();
  flag->set_name("ok");
  flag->set_datatype("BOOL");
  flag->add_shape(2);
  r.add_raw_output_contents()->assign("\x01\x00", 2);
  return r;
}

TEST(InferJsonResponseTest, OutputsAsJsonNumbers) {
  const JsonInferReply reply = FormatJsonInferResponse(Response(), JsonInferRequest{});
  EXPECT_EQ(reply.json,
            R"({"model_name":"m","model_version":"2","id":"req-1","outputs":[)"
            R"({"name":"y","datatype":"FP32","shape":[1,4],"data":[0.1,-2,NaN,Infinity]},)"
            R"({"name":"ok","datatype":"BOOL","shape":[2],"data":[true,false]}]})");
  EXPECT_TRUE(reply.binary.empty());
}

TEST(InferJsonResponseTest, IntegersAndHalfFloats) {
  inference::ModelInferResponse r;
  auto add = [&r](const std::string& datatype, const std::string& raw, int64_t n) {
    auto* out = r.add_outputs();
    out->set_name(datatype);
    out->set_datatype(datatype);
    out->add_shape(n);
    r.add_raw_output_contents(raw);
  };
  const int64_t big[1] = {std::numeric_limits<int64_t>::min()};
  add("INT64", std::string(reinterpret_cast<const char*>(big), 8), 1);
  add("UINT8", "\xff", 1);
  add("INT8", "\x80", 1);
  const uint16_t half[1] = {engine::FloatToHalf(0.5f)};
  add("FP16", std::string(reinterpret_cast<const char*>(half), 2), 1);
  const JsonInferReply reply = FormatJsonInferResponse(r, JsonInferRequest{});
  EXPECT_NE(reply.json.find(R"("data":[-9223372036854775808])"), std::string::npos) << reply.json;
  EXPECT_NE(reply.json.find(R"("data":[255])"), std::string::npos) << reply.json;
  EXPECT_NE(reply.json.find(R"("data":[-128])"), std::string::npos) << reply.json;
  EXPECT_NE(reply.json.find(R"("data":[0.5])"), std::string::npos) << reply.json;
}

TEST(InferJsonResponseTest, BinaryOutputsFollowTheJson) {
  JsonInferRequest request;
  request.binary_outputs = true;
  request.output_binary["ok"] = false;
  const inference::ModelInferResponse response = Response();
  const JsonInferReply reply = FormatJsonInferResponse(response, request);
  EXPECT_NE(
      reply.json.find(
          R"({"name":"y","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}})"),
      std::string::npos)
      << reply.json;
  EXPECT_NE(reply.json.find(R"("data":[true,false])"), std::string::npos) << reply.json;
  ASSERT_EQ(reply.binary.size(), 1u);
  EXPECT_EQ(reply.binary[0].data(), response.raw_output_contents(0).data());  // not copied
  EXPECT_EQ(reply.binary[0].size(), 16u);
}

TEST(InferJsonResponseTest, ParametersAreWritten) {
  inference::ModelInferResponse r;
  r.set_model_name("m");
  (*r.mutable_parameters())["profile"].set_string_param("{\"batch\": 1}");
  const JsonInferReply reply = FormatJsonInferResponse(r, JsonInferRequest{});
  EXPECT_NE(reply.json.find(R"("parameters":{"profile":"{\"batch\": 1}"})"), std::string::npos)
      << reply.json;
}

TEST(ProtoJsonTest, FieldNamesNumbersEnumsAndMaps) {
  inference::ModelConfig config;
  config.set_name("m");
  config.set_max_batch_size(0);
  auto* input = config.add_input();
  input->set_name("x");
  input->set_data_type(inference::TYPE_FP32);
  input->add_dims(-1);
  input->add_dims(int64_t{1} << 40);
  config.mutable_version_policy()->mutable_latest()->set_num_versions(1);
  (*config.mutable_parameters())["precision"].set_string_value("fp32");
  const std::string json = ProtoToJson(config);
  EXPECT_NE(json.find(R"("name":"m")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("max_batch_size":0)"), std::string::npos) << json;  // a default, written
  EXPECT_NE(json.find(R"("data_type":"TYPE_FP32")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("dims":[-1,1099511627776])"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("version_policy":{"latest":{"num_versions":1}})"), std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("parameters":{"precision":{"string_value":"fp32"}})"), std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("output":[])"), std::string::npos) << json;    // repeated, empty
  EXPECT_EQ(json.find("dynamic_batching"), std::string::npos) << json;  // unset message
}

}  // namespace
}  // namespace numaserve::serving::http
