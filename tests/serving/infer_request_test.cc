#include "serving/request/infer_request.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace numaserve::serving {
namespace {

engine::ModelInfo Classifier() {
  engine::ModelInfo m;
  m.inputs = {{"image", engine::DataType::kFloat32, {-1, 1, 28, 28}}};
  m.outputs = {{"probabilities", engine::DataType::kFloat32, {-1, 10}},
               {"logits", engine::DataType::kFloat32, {-1, 10}}};
  m.batched = true;
  return m;
}

inference::ModelInferRequest Request(int64_t rows, bool raw = true) {
  inference::ModelInferRequest r;
  r.set_model_name("m");
  auto* in = r.add_inputs();
  in->set_name("image");
  in->set_datatype("FP32");
  for (int64_t d : {rows, int64_t{1}, int64_t{28}, int64_t{28}}) in->add_shape(d);
  if (raw) {
    r.add_raw_input_contents()->assign(rows * 784 * 4, '\0');
  } else {
    for (int64_t i = 0; i < rows * 784; ++i) in->mutable_contents()->add_fp32_contents(0.5f);
  }
  return r;
}

void ExpectInvalid(const inference::ModelInferRequest& r, const std::string& fragment) {
  auto parsed = ParseInferRequest(Classifier(), r);
  ASSERT_FALSE(parsed.ok()) << "accepted: " << r.ShortDebugString().substr(0, 200);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find(fragment), absl::string_view::npos)
      << parsed.status() << " should mention '" << fragment << "'";
}

TEST(InferRequestTest, AcceptsRawAndTypedContents) {
  for (bool raw : {true, false}) {
    auto parsed = ParseInferRequest(Classifier(), Request(5, raw));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->rows, 5);
    EXPECT_EQ(parsed->inputs[0].size, 5u * 784 * 4);
    EXPECT_EQ(parsed->outputs, (std::vector<int>{0, 1}));
    EXPECT_EQ(parsed->output_bytes, (std::vector<size_t>{200, 200}));
    EXPECT_EQ(parsed->output_shapes[0], (std::vector<int64_t>{5, 10}));
  }
}

TEST(InferRequestTest, DeclaredShapeOverTheMessageLimitIsRefusedFromTheShapeAlone) {
  // Declares a million images but carries one: refused for its size, before
  // the contents are compared with the shape.
  auto r = Request(1);
  r.mutable_inputs(0)->set_shape(0, 1000000);
  auto parsed = ParseInferRequest(Classifier(), r, /*max_bytes=*/size_t{64} << 20);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("message limit"), absl::string_view::npos)
      << parsed.status();
  // Within the limit the usual checks apply.
  EXPECT_TRUE(ParseInferRequest(Classifier(), Request(4), 4 * 784 * 4).ok());
  EXPECT_FALSE(ParseInferRequest(Classifier(), Request(4), 4 * 784 * 4 - 1).ok());
}

TEST(InferRequestTest, SelectsRequestedOutputs) {
  auto r = Request(1);
  r.add_outputs()->set_name("logits");
  auto parsed = ParseInferRequest(Classifier(), r);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->outputs, (std::vector<int>{1}));
  r.add_outputs()->set_name("nope");
  ExpectInvalid(r, "nope");
}

TEST(InferRequestTest, RejectsBadInputsNamingTheTensor) {
  auto r = Request(2);
  r.mutable_inputs(0)->set_datatype("FP64");
  ExpectInvalid(r, "image");

  r = Request(2);
  r.mutable_inputs(0)->set_shape(3, 27);
  ExpectInvalid(r, "[2,1,28,27]");

  r = Request(2);
  r.mutable_inputs(0)->mutable_shape()->RemoveLast();
  ExpectInvalid(r, "rank");

  r = Request(2);
  r.mutable_raw_input_contents(0)->resize(100);
  ExpectInvalid(r, "100");

  r = Request(2);
  r.mutable_inputs(0)->set_name("img");
  ExpectInvalid(r, "img");

  r = Request(2);
  r.clear_inputs();
  r.clear_raw_input_contents();
  ExpectInvalid(r, "missing input 'image'");

  r = Request(2);
  *r.add_inputs() = r.inputs(0);
  r.add_raw_input_contents();
  ExpectInvalid(r, "twice");

  r = Request(2);
  r.mutable_inputs(0)->set_shape(0, 0);
  ExpectInvalid(r, "image");

  r = Request(2, /*raw=*/false);
  r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.0f);
  ExpectInvalid(r, "needs 1568 values in fp32_contents, got 1569");

  r = Request(2);
  r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1.0f);
  ExpectInvalid(r, "raw_input_contents");

  r = Request(2, /*raw=*/false);
  r.mutable_inputs(0)->mutable_contents()->clear_fp32_contents();
  r.mutable_inputs(0)->mutable_contents()->add_int_contents(1);
  ExpectInvalid(r, "image");
}

TEST(InferRequestTest, UnbatchedModelNeedsTheExactShape) {
  engine::ModelInfo m = Classifier();
  m.batched = false;
  m.inputs[0].shape = {1, 1, 28, 28};
  m.outputs = {{"probabilities", engine::DataType::kFloat32, {1, 10}}};
  auto ok = ParseInferRequest(m, Request(1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rows, 1);
  EXPECT_FALSE(ParseInferRequest(m, Request(2)).ok());
}

// x [n,64] -> Reshape [1,-1]: not batched, its output [1,64n] at n rows.
engine::ModelInfo OneRow() {
  engine::ModelInfo m;
  m.inputs = {{"x", engine::DataType::kFloat32, {-1, 64}}};
  m.outputs = {{"y", engine::DataType::kFloat32, {1, -1}}};
  m.batched = false;
  m.output_shapes_at = [](int64_t rows) -> absl::StatusOr<std::vector<std::vector<int64_t>>> {
    if (rows > 1000) return absl::InvalidArgumentError("no room for that many");
    return std::vector<std::vector<int64_t>>{{1, 64 * rows}};
  };
  return m;
}

inference::ModelInferRequest RowsOf64(int64_t rows) {
  inference::ModelInferRequest r;
  auto* in = r.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(rows);
  in->add_shape(64);
  r.add_raw_input_contents()->assign(rows * 64 * 4, '\0');
  return r;
}

TEST(InferRequestTest, UnbatchedModelRunsAtTheRequestsRowsWithItsRealOutputShape) {
  auto parsed = ParseInferRequest(OneRow(), RowsOf64(5));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rows, 5);
  EXPECT_EQ(parsed->output_shapes[0], (std::vector<int64_t>{1, 320}));
  EXPECT_EQ(parsed->output_bytes[0], 320u * 4);
}

TEST(InferRequestTest, RowsTheModelCannotRunAtAreRefused) {
  auto parsed = ParseInferRequest(OneRow(), RowsOf64(1001));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("cannot run at 1001 rows"), absl::string_view::npos)
      << parsed.status();
}

TEST(InferRequestTest, OutputOfUnknownSizeIsNeverGuessed) {
  // Metadata alone says [1,-1]: without the model's shape function the size
  // at 5 rows is not known, and is not taken to be 1.
  engine::ModelInfo m = OneRow();
  m.output_shapes_at = nullptr;
  auto parsed = ParseInferRequest(m, RowsOf64(5));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(parsed.status().message().find("output 'y'"), absl::string_view::npos)
      << parsed.status();
}

TEST(InferRequestTest, DynamicInputsOfAnUnbatchedModelAgreeOnTheRows) {
  // The engine runs every dynamic dim 0 at one count.
  engine::ModelInfo m = OneRow();
  m.inputs.push_back({"z", engine::DataType::kFloat32, {-1, 64}});
  auto r = RowsOf64(2);
  auto* z = r.add_inputs();
  z->set_name("z");
  z->set_datatype("FP32");
  z->add_shape(3);
  z->add_shape(64);
  r.add_raw_input_contents()->assign(3 * 64 * 4, '\0');
  auto parsed = ParseInferRequest(m, r);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("must agree"), absl::string_view::npos)
      << parsed.status();
}

TEST(InferRequestTest, FillsResponseFromOutputs) {
  auto parsed = ParseInferRequest(Classifier(), Request(1));
  ASSERT_TRUE(parsed.ok());
  std::vector<float> probs(10, 0.1f), logits(10, 2.0f);
  inference::ModelInferResponse response;
  FillInferResponse(
      Classifier(), *parsed,
      {reinterpret_cast<const char*>(probs.data()), reinterpret_cast<const char*>(logits.data())},
      &response);
  ASSERT_EQ(response.outputs_size(), 2);
  EXPECT_EQ(response.outputs(1).name(), "logits");
  EXPECT_EQ(response.outputs(1).datatype(), "FP32");
  EXPECT_EQ(response.outputs(1).shape_size(), 2);
  ASSERT_EQ(response.raw_output_contents(1).size(), 40u);
  float first = 0;
  memcpy(&first, response.raw_output_contents(1).data(), 4);
  EXPECT_EQ(first, 2.0f);
}

// --- Every datatype -----------------------------------------------------------

// The KServe v2 datatypes numeric tensors use. Those the engine does not
// name yet (DataTypeFromName gives kUnknown) are skipped.
const std::vector<std::string>& AllTypes() {
  static const std::vector<std::string> kTypes = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64",
                                                  "INT8", "INT16", "INT32",  "INT64",  "FP16",
                                                  "BF16", "FP32",  "FP64"};
  return kTypes;
}

bool Known(const std::string& type) {
  return engine::DataTypeFromName(type) != engine::DataType::kUnknown;
}

// x [batch, 3] of `type` -> y [batch, 3] of `type`.
engine::ModelInfo OneTensor(const std::string& type) {
  engine::ModelInfo m;
  m.inputs = {{"x", engine::DataTypeFromName(type), {-1, 3}}};
  m.outputs = {{"y", engine::DataTypeFromName(type), {-1, 3}}};
  m.batched = true;
  return m;
}

inference::ModelInferRequest TwoRows(const std::string& type) {
  inference::ModelInferRequest r;
  auto* in = r.add_inputs();
  in->set_name("x");
  in->set_datatype(type);
  in->add_shape(2);
  in->add_shape(3);
  return r;
}

// `values` as little-endian bytes of `type`.
std::string Encode(const std::string& type, const std::vector<int64_t>& values) {
  std::string out;
  auto put = [&out](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  for (int64_t v : values) {
    if (type == "BOOL" || type == "UINT8") put(static_cast<uint8_t>(v));
    if (type == "INT8") put(static_cast<int8_t>(v));
    if (type == "INT16") put(static_cast<int16_t>(v));
    if (type == "UINT16") put(static_cast<uint16_t>(v));
    if (type == "INT32") put(static_cast<int32_t>(v));
    if (type == "UINT32") put(static_cast<uint32_t>(v));
    if (type == "INT64") put(v);
    if (type == "UINT64") put(static_cast<uint64_t>(v));
    if (type == "FP32") put(static_cast<float>(v));
    if (type == "FP64") put(static_cast<double>(v));
  }
  return out;
}

// Puts `values` in the typed field KServe v2 gives `type`.
void AddTyped(const std::string& type, const std::vector<int64_t>& values,
              inference::InferTensorContents* c) {
  for (int64_t v : values) {
    if (type == "BOOL") c->add_bool_contents(v != 0);
    if (type == "INT8" || type == "INT16" || type == "INT32") {
      c->add_int_contents(static_cast<int32_t>(v));
    }
    if (type == "INT64") c->add_int64_contents(v);
    if (type == "UINT8" || type == "UINT16" || type == "UINT32") {
      c->add_uint_contents(static_cast<uint32_t>(v));
    }
    if (type == "UINT64") c->add_uint64_contents(static_cast<uint64_t>(v));
    if (type == "FP32") c->add_fp32_contents(static_cast<float>(v));
    if (type == "FP64") c->add_fp64_contents(static_cast<double>(v));
  }
}

std::string InputBytes(const ParsedRequest& parsed, int i = 0) {
  std::string bytes;
  for (const auto& [data, size] : parsed.inputs[i].pieces) bytes.append(data, size);
  return bytes;
}

void ExpectInvalidFor(const engine::ModelInfo& m, const inference::ModelInferRequest& r,
                      const std::vector<std::string>& fragments) {
  auto parsed = ParseInferRequest(m, r);
  ASSERT_FALSE(parsed.ok()) << "accepted: " << r.ShortDebugString().substr(0, 200);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  for (const auto& fragment : fragments) {
    EXPECT_NE(parsed.status().message().find(fragment), absl::string_view::npos)
        << parsed.status() << " should mention '" << fragment << "'";
  }
}

TEST(InferRequestTypesTest, EveryDatatypeTravelsRawInAndOut) {
  int tested = 0;
  for (const std::string& type : AllTypes()) {
    if (!Known(type)) continue;
    SCOPED_TRACE(type);
    ++tested;
    const size_t size = engine::DataTypeSize(engine::DataTypeFromName(type));
    ASSERT_GT(size, 0u);
    auto r = TwoRows(type);
    std::string bytes(6 * size, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i % 2);
    r.add_raw_input_contents(bytes);
    engine::ModelInfo m = OneTensor(type);
    auto parsed = ParseInferRequest(m, r);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ASSERT_EQ(parsed->inputs[0].pieces.size(), 1u);
    EXPECT_EQ(parsed->inputs[0].pieces[0].first, r.raw_input_contents(0).data())
        << "raw bytes are copied";
    EXPECT_EQ(InputBytes(*parsed), bytes);
    EXPECT_EQ(parsed->output_bytes, (std::vector<size_t>{6 * size}));

    std::string out(6 * size, '\x01');
    inference::ModelInferResponse response;
    FillInferResponse(m, *parsed, {out.data()}, &response);
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).datatype(), type);
    EXPECT_EQ(response.raw_output_contents(0), out);
  }
  EXPECT_GE(tested, 9);  // the types the engine has always named
}

TEST(InferRequestTypesTest, EveryTypedFieldCarriesItsDatatypes) {
  for (const std::string& type : AllTypes()) {
    if (!Known(type) || type == "FP16" || type == "BF16") continue;
    SCOPED_TRACE(type);
    const std::vector<int64_t> values = type == "BOOL"
                                            ? std::vector<int64_t>{1, 0, 0, 1, 1, 0}
                                            : std::vector<int64_t>{0, 1, 7, 100, 127, 42};
    auto r = TwoRows(type);
    AddTyped(type, values, r.mutable_inputs(0)->mutable_contents());
    auto parsed = ParseInferRequest(OneTensor(type), r);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(InputBytes(*parsed), Encode(type, values));
    EXPECT_EQ(parsed->rows, 2);
  }
}

TEST(InferRequestTypesTest, NarrowingKeepsTheRangeEndsAndRefusesBeyond) {
  struct Case {
    std::string type;
    int64_t low, high;
  };
  for (const Case& c : {Case{"INT8", -128, 127}, Case{"INT16", -32768, 32767},
                        Case{"UINT8", 0, 255}, Case{"UINT16", 0, 65535}}) {
    if (!Known(c.type)) continue;
    SCOPED_TRACE(c.type);
    const std::vector<int64_t> ends = {c.low, c.high, c.low, 0, 1, c.high};
    auto r = TwoRows(c.type);
    AddTyped(c.type, ends, r.mutable_inputs(0)->mutable_contents());
    auto parsed = ParseInferRequest(OneTensor(c.type), r);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(InputBytes(*parsed), Encode(c.type, ends));
    // A copy of the request's parse points at the same live narrowed bytes.
    ParsedRequest copy = *parsed;
    parsed = absl::InvalidArgumentError("dropped");
    EXPECT_EQ(InputBytes(copy), Encode(c.type, ends));

    const bool is_signed = c.type[0] == 'I';
    auto above = TwoRows(c.type);
    AddTyped(c.type, {0, 0, 0, 0, c.high + 1, 0}, above.mutable_inputs(0)->mutable_contents());
    const std::string field = is_signed ? "int_contents" : "uint_contents";
    ExpectInvalidFor(OneTensor(c.type), above,
                     {"'x'", c.type, field + "[4] = " + std::to_string(c.high + 1), "range"});
    if (is_signed) {
      auto below = TwoRows(c.type);
      AddTyped(c.type, {c.low - 1, 0, 0, 0, 0, 0}, below.mutable_inputs(0)->mutable_contents());
      ExpectInvalidFor(OneTensor(c.type), below,
                       {"'x'", field + "[0] = " + std::to_string(c.low - 1), "range"});
    }
  }
  // A negative number a client put in uint_contents arrives wrapped: refused, not truncated.
  auto negative = TwoRows("UINT8");
  for (int i = 0; i < 6; ++i)
    negative.mutable_inputs(0)->mutable_contents()->add_uint_contents(i == 2 ? 0xffffffffu : 1u);
  ExpectInvalidFor(OneTensor("UINT8"), negative, {"uint_contents[2] = 4294967295"});
}

TEST(InferRequestTypesTest, ValuesInAnotherDatatypesFieldAreRefused) {
  struct Case {
    std::string type, wrong_type, wrong_field, field;
  };
  for (const Case& c : {Case{"INT64", "INT32", "int_contents", "int64_contents"},
                        Case{"FP32", "FP64", "fp64_contents", "fp32_contents"},
                        Case{"UINT8", "INT32", "int_contents", "uint_contents"},
                        Case{"BOOL", "UINT8", "uint_contents", "bool_contents"},
                        Case{"INT32", "INT64", "int64_contents", "int_contents"},
                        Case{"FP64", "FP32", "fp32_contents", "fp64_contents"},
                        Case{"UINT64", "INT64", "int64_contents", "uint64_contents"}}) {
    if (!Known(c.type)) continue;
    SCOPED_TRACE(c.type);
    auto r = TwoRows(c.type);
    AddTyped(c.wrong_type, {1, 2, 3, 4, 5, 6}, r.mutable_inputs(0)->mutable_contents());
    ExpectInvalidFor(OneTensor(c.type), r, {"'x'", c.type, c.wrong_field, c.field});
  }
}

TEST(InferRequestTypesTest, HalfAndBFloat16TravelRawOnly) {
  for (const std::string type : {"FP16", "BF16"}) {
    auto r = TwoRows(type);
    AddTyped("FP32", {1, 2, 3, 4, 5, 6}, r.mutable_inputs(0)->mutable_contents());
    ExpectInvalidFor(OneTensor(type), r, {"'x'", type, "raw_input_contents"});
  }
}

TEST(InferRequestTypesTest, TypedValueCountMustMatchTheShape) {
  auto r = TwoRows("INT64");
  AddTyped("INT64", {1, 2, 3, 4, 5}, r.mutable_inputs(0)->mutable_contents());
  ExpectInvalidFor(OneTensor("INT64"), r, {"'x'", "[2,3]", "needs 6 values", "got 5"});
  auto none = TwoRows("INT64");
  ExpectInvalidFor(OneTensor("INT64"), none, {"'x'", "int64_contents", "got 0"});
}

TEST(InferRequestTypesTest, WrongDatatypeNamesTheInputTheGivenAndTheExpectedType) {
  for (const std::string& want : AllTypes()) {
    if (!Known(want)) continue;
    for (const std::string& given : AllTypes()) {
      if (given == want) continue;
      SCOPED_TRACE(want + " given " + given);
      auto r = TwoRows(given);
      r.add_raw_input_contents(std::string(6 * 8, '\0'));
      ExpectInvalidFor(OneTensor(want), r, {"'x'", "'" + given + "'", "expects " + want});
    }
  }
  auto lower = TwoRows("int64");
  lower.add_raw_input_contents(std::string(48, '\0'));
  ExpectInvalidFor(OneTensor("INT64"), lower, {"'int64'", "expects INT64"});
}

TEST(InferRequestTypesTest, RawBoolBytesAreZeroOrOne) {
  auto r = TwoRows("BOOL");
  r.add_raw_input_contents(std::string("\x01\x00\x01\x02\x00\x01", 6));
  ExpectInvalidFor(OneTensor("BOOL"), r, {"'x'", "byte 3 is 2", "0 or 1"});
  r.set_raw_input_contents(0, std::string("\x01\x00\x01\x01\x00\x01", 6));
  EXPECT_TRUE(ParseInferRequest(OneTensor("BOOL"), r).ok());
}

TEST(InferRequestTypesTest, OutputBytesFollowEachOutputsOwnType) {
  engine::ModelInfo m;
  m.inputs = {{"ids", engine::DataType::kInt64, {-1, 8}},
              {"mask", engine::DataType::kBool, {-1, 8}}};
  m.outputs = {{"keep", engine::DataType::kBool, {-1, 4}},
               {"next", engine::DataType::kInt64, {-1, 2}},
               {"half", engine::DataType::kFloat16, {-1, 3}},
               {"score", engine::DataType::kFloat64, {-1}},
               {"small", engine::DataType::kInt8, {-1, 5}}};
  m.batched = true;
  inference::ModelInferRequest r;
  auto* ids = r.add_inputs();
  ids->set_name("ids");
  ids->set_datatype("INT64");
  ids->add_shape(3);
  ids->add_shape(8);
  for (int i = 0; i < 24; ++i) ids->mutable_contents()->add_int64_contents(i);
  auto* mask = r.add_inputs();
  mask->set_name("mask");
  mask->set_datatype("BOOL");
  mask->add_shape(3);
  mask->add_shape(8);
  for (int i = 0; i < 24; ++i) mask->mutable_contents()->add_bool_contents(i % 3 == 0);
  auto parsed = ParseInferRequest(m, r);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rows, 3);
  EXPECT_EQ(parsed->inputs[0].size, 3u * 8 * 8);
  EXPECT_EQ(parsed->inputs[1].size, 3u * 8);
  EXPECT_EQ(parsed->output_bytes, (std::vector<size_t>{3 * 4, 3 * 2 * 8, 3 * 3 * 2, 3 * 8, 3 * 5}));
  EXPECT_EQ(parsed->output_shapes[3], (std::vector<int64_t>{3}));

  std::vector<std::string> outs;
  for (size_t i = 0; i < m.outputs.size(); ++i)
    outs.push_back(std::string(parsed->output_bytes[i], static_cast<char>('a' + i)));
  inference::ModelInferResponse response;
  FillInferResponse(
      m, *parsed, {outs[0].data(), outs[1].data(), outs[2].data(), outs[3].data(), outs[4].data()},
      &response);
  ASSERT_EQ(response.outputs_size(), 5);
  const std::vector<std::string> names = {"BOOL", "INT64", "FP16", "FP64", "INT8"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(response.outputs(i).datatype(), names[i]);
    EXPECT_EQ(response.raw_output_contents(i), outs[i]);
  }
}

TEST(InferRequestTest, ProfileParameterIsBoolOrTheStringTrueOrFalse) {
  auto r = Request(1);
  auto asks = RequestsProfile(r);
  ASSERT_TRUE(asks.ok()) << asks.status();
  EXPECT_FALSE(*asks) << "absent: not asked";
  auto& parameters = *r.mutable_parameters();
  for (bool value : {true, false}) {
    parameters["profile"].set_bool_param(value);
    asks = RequestsProfile(r);
    ASSERT_TRUE(asks.ok()) << asks.status();
    EXPECT_EQ(*asks, value);
  }
  parameters["profile"].set_string_param("true");
  EXPECT_EQ(RequestsProfile(r).value_or(false), true);
  parameters["profile"].set_string_param("false");
  EXPECT_EQ(RequestsProfile(r).value_or(true), false);
  auto expect_invalid = [&](const std::string& fragment) {
    auto bad = RequestsProfile(r);
    ASSERT_FALSE(bad.ok()) << r.ShortDebugString();
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("'profile'"), absl::string_view::npos) << bad.status();
    EXPECT_NE(bad.status().message().find(fragment), absl::string_view::npos) << bad.status();
  };
  parameters["profile"].set_int64_param(5);
  expect_invalid("int64 5");
  parameters["profile"].set_string_param("yes");
  expect_invalid("string \"yes\"");
  parameters["profile"].set_double_param(1.0);
  expect_invalid("double 1");
  parameters["profile"].Clear();
  expect_invalid("no value");
}

// x [batch, seq, 8] and pos [seq, 8]: pos's dim 0 is 'seq', not the batch.
engine::ModelInfo Encoder() {
  engine::ModelInfo m;
  m.inputs = {{"x", engine::DataType::kFloat32, {-1, -1, 8}, {"batch", "seq", ""}},
              {"pos", engine::DataType::kFloat32, {-1, 8}, {"seq", ""}}};
  m.outputs = {{"y", engine::DataType::kFloat32, {-1, -1, 8}, {"batch", "seq", ""}}};
  return m;
}

inference::ModelInferRequest EncoderRequest(int64_t rows, int64_t seq, int64_t pos_seq,
                                            int64_t hidden = 8) {
  inference::ModelInferRequest r;
  auto add = [&](const std::string& name, const std::vector<int64_t>& shape) {
    auto* in = r.add_inputs();
    in->set_name(name);
    in->set_datatype("FP32");
    int64_t n = 4;
    for (int64_t d : shape) {
      in->add_shape(d);
      n *= d;
    }
    r.add_raw_input_contents()->assign(static_cast<size_t>(n), '\0');
  };
  add("x", {rows, seq, hidden});
  add("pos", {pos_seq, 8});
  return r;
}

// What the server's SignatureShapesFn does, reduced: 'seq' must agree.
SignatureShapesFn EncoderShapes() {
  return [](const std::vector<std::vector<int64_t>>& in)
             -> absl::StatusOr<std::vector<std::vector<int64_t>>> {
    if (in.at(0).at(1) != in.at(1).at(0)) {
      return absl::InvalidArgumentError("input 'pos' dim 0 ('seq') differs from input 'x' dim 1");
    }
    return std::vector<std::vector<int64_t>>{in.at(0)};
  };
}

TEST(InferRequestTest, ShapePolymorphicRequestRunsAtItsSignature) {
  auto parsed = ParseInferRequest(Encoder(), EncoderRequest(2, 5, 5), 0, EncoderShapes());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rows, 2);  // x's batch; pos's dim 0 is 'seq'
  EXPECT_EQ(parsed->input_shapes, (std::vector<std::vector<int64_t>>{{2, 5, 8}, {5, 8}}));
  EXPECT_EQ(parsed->output_shapes, (std::vector<std::vector<int64_t>>{{2, 5, 8}}));
  EXPECT_EQ(parsed->output_bytes, (std::vector<size_t>{2 * 5 * 8 * 4}));
}

TEST(InferRequestTest, ShapePolymorphicRequestRefusalsNameTheInputAndDim) {
  auto fixed = ParseInferRequest(Encoder(), EncoderRequest(2, 5, 5, 7), 0, EncoderShapes());
  ASSERT_FALSE(fixed.ok());
  EXPECT_EQ(fixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fixed.status().message().find("input 'x' has shape [2,5,7]"), absl::string_view::npos)
      << fixed.status();
  EXPECT_NE(fixed.status().message().find("dim 2 is fixed at 8, got 7"), absl::string_view::npos)
      << fixed.status();
  auto zero = ParseInferRequest(Encoder(), EncoderRequest(2, 0, 5), 0, EncoderShapes());
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("dim 1 ('seq') is dynamic: it must be >= 1, got 0"),
            absl::string_view::npos)
      << zero.status();
  auto named = ParseInferRequest(Encoder(), EncoderRequest(2, 5, 6), 0, EncoderShapes());
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(named.status().message().find("input 'pos' dim 0 ('seq')"), absl::string_view::npos)
      << named.status();
}

}  // namespace
}  // namespace numaserve::serving
