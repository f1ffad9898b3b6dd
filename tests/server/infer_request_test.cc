#include "server/infer_request.h"

#include <gtest/gtest.h>

#include <cstring>

namespace numaserve::server {
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
    EXPECT_EQ(parsed->inputs[0].second, 5u * 784 * 4);
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
  ExpectInvalid(r, "bytes");

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

}  // namespace
}  // namespace numaserve::server
