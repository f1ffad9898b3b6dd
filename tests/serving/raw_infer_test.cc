// ModelInfer's messages over gRPC's own buffers: a request read from slices
// of any size is the message protobuf reads, its raw_input_contents left in
// the slices; a response written with its outputs in slices of their own is
// the message protobuf writes. Hostile bytes are refused with the offset.
#include "serving/frontend/raw_infer.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"

namespace numaserve::serving {
namespace {

// `wire` cut into slices of `every` bytes (the last one shorter).
grpc::ByteBuffer Sliced(const std::string& wire, size_t every) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += every) {
    slices.emplace_back(wire.data() + at, std::min(every, wire.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const InputBytes& bytes) {
  std::string out;
  for (const auto& [data, size] : bytes.pieces) out.append(data, size);
  return out;
}

inference::ModelInferRequest FullRequest() {
  inference::ModelInferRequest r;
  r.set_model_name("classifier");
  r.set_model_version("3");
  r.set_id("request-17");
  (*r.mutable_parameters())["priority"].set_int64_param(2);
  (*r.mutable_parameters())["profile"].set_bool_param(true);
  auto* x = r.add_inputs();
  x->set_name("x");
  x->set_datatype("FP32");
  x->add_shape(2);
  x->add_shape(300);
  auto* mask = r.add_inputs();
  mask->set_name("mask");
  mask->set_datatype("BOOL");
  mask->add_shape(2);
  auto* empty = r.add_inputs();
  empty->set_name("none");
  empty->set_datatype("INT8");
  empty->add_shape(0);
  r.add_outputs()->set_name("y");
  std::string floats(2 * 300 * 4, '\0');
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<char>(i * 7 + 1);
  r.add_raw_input_contents(floats);
  r.add_raw_input_contents(std::string("\x01\x00", 2));
  r.add_raw_input_contents("");
  return r;
}

TEST(RawInferTest, ReadsWhatProtobufReadsFromSlicesOfAnySize) {
  const inference::ModelInferRequest full = FullRequest();
  const std::string wire = full.SerializeAsString();
  inference::ModelInferRequest expected = full;
  expected.clear_raw_input_contents();
  for (size_t every : {size_t{1}, size_t{3}, size_t{7}, size_t{64}, size_t{1000}, wire.size()}) {
    SCOPED_TRACE(every);
    auto read = ReadRawInferRequest(Sliced(wire, every));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(read->message, expected))
        << read->message.ShortDebugString();
    EXPECT_EQ(read->message.raw_input_contents_size(), 0);
    ASSERT_EQ(read->transport->inputs.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(Joined(read->transport->inputs[i]), full.raw_input_contents(i)) << "input " << i;
      EXPECT_EQ(read->transport->inputs[i].size, full.raw_input_contents(i).size());
    }
    // Left in the slices: a piece per slice it spans (gRPC joins slices of
    // up to 23 bytes as they are added).
    if (every < 100) {
      EXPECT_GT(read->transport->inputs[0].pieces.size(), 2400 / 100);
    }
  }
}

TEST(RawInferTest, RawContentsBetweenOtherFieldsKeepTheirOrder) {
  // raw_input_contents first, between the inputs and after an unknown field.
  inference::ModelInferRequest a, b;
  a.add_raw_input_contents("first");
  a.set_model_name("m");
  b.add_raw_input_contents("second");
  b.add_inputs()->set_name("x");
  const std::string unknown = std::string("\xa8\x06\x05", 3);  // field 101, varint 5
  const std::string wire = a.SerializeAsString() + unknown + b.SerializeAsString();
  auto read = ReadRawInferRequest(Sliced(wire, 5));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->message.model_name(), "m");
  ASSERT_EQ(read->message.inputs_size(), 1);
  ASSERT_EQ(read->transport->inputs.size(), 2u);
  EXPECT_EQ(Joined(read->transport->inputs[0]), "first");
  EXPECT_EQ(Joined(read->transport->inputs[1]), "second");
}

TEST(RawInferTest, TheSlicesOutliveTheBuffer) {
  const inference::ModelInferRequest full = FullRequest();
  std::shared_ptr<const TransportInputs> transport;
  {
    grpc::ByteBuffer buffer = Sliced(full.SerializeAsString(), 100);
    auto read = ReadRawInferRequest(buffer);
    ASSERT_TRUE(read.ok()) << read.status();
    transport = read->transport;
  }
  EXPECT_EQ(Joined(transport->inputs[0]), full.raw_input_contents(0));
}

TEST(RawInferTest, HostileBytesAreRefusedWithTheOffset) {
  const std::string name_field = std::string("\x0a\x01m", 3);  // model_name "m"
  struct Case {
    std::string wire;
    std::string why;
  };
  const std::vector<Case> cases = {
      {name_field + "\x3a", "a truncated length"},             // raw_input_contents, no length
      {name_field + "\x3a\x05" + "abc", "runs past the end"},  // 5 bytes claimed, 3 there
      {name_field + "\x3a\xff\xff\xff\xff\x0f", "runs past the end"},
      {name_field + "\x0b", "a group or an unknown wire type"},  // field 1, start group
      {name_field + "\x0e", "a group or an unknown wire type"},  // wire type 6
      {name_field + "\x02\x00", "field number 0"},
      {name_field + "\x80", "a truncated or oversized tag"},
      {name_field + std::string(5, '\x80') + "\x01", "a truncated or oversized tag"},
      {name_field + "\x10", "a truncated varint"},         // field 2 as a varint, no value
      {name_field + "\x19\x01\x02", "runs past the end"},  // fixed64, 2 of 8 bytes
  };
  for (const Case& c : cases) {
    for (size_t every : {size_t{1}, size_t{4}, c.wire.size()}) {
      auto read = ReadRawInferRequest(Sliced(c.wire, every));
      ASSERT_FALSE(read.ok()) << c.why;
      EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(read.status().message().find(c.why), std::string::npos) << read.status();
      EXPECT_NE(read.status().message().find("at byte 3"), std::string::npos) << read.status();
    }
  }
  // What protobuf refuses in the other fields: a string that is not UTF-8.
  auto bad = ReadRawInferRequest(Sliced(std::string("\x0a\x02\xc3\x28", 4), 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // A five-byte tag is kept to 32 bits, as protobuf reads it: 0x88 0x87
  // 0x87 0x87 0x78 is field 270284913 as a varint, unknown and skipped.
  auto wide = ReadRawInferRequest(
      Sliced(name_field + std::string("\x88\x87\x87\x87\x78\x05", 6) + "\x3a\x01z", 2));
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->message.model_name(), "m");
  ASSERT_EQ(wide->transport->inputs.size(), 1u);
  EXPECT_EQ(Joined(wide->transport->inputs[0]), "z");
  // An empty message is an empty request (which the service then refuses).
  auto empty = ReadRawInferRequest(grpc::ByteBuffer());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->transport->inputs.empty());
}

TEST(RawInferTest, WritesWhatProtobufReads) {
  inference::ModelInferResponse head;
  head.set_model_name("classifier");
  head.set_model_version("3");
  head.set_id("request-17");
  auto* y = head.add_outputs();
  y->set_name("y");
  y->set_datatype("FP32");
  y->add_shape(1);
  y->add_shape(40);
  head.add_outputs()->set_name("empty");
  std::string big(160, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i);
  std::vector<grpc::Slice> outputs;
  outputs.emplace_back(big.data(), big.size());
  outputs.emplace_back("", 0);
  grpc::ByteBuffer wire = WriteRawInferResponse(head, std::move(outputs));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(wire.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  inference::ModelInferResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  inference::ModelInferResponse expected = head;
  expected.add_raw_output_contents(big);
  expected.add_raw_output_contents("");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, expected))
      << parsed.ShortDebugString();
}

TEST(RawInferTest, WritesAStreamReplyProtobufReads) {
  inference::ModelStreamInferResponse head;
  head.mutable_infer_response()->set_id("7");
  head.mutable_infer_response()->add_outputs()->set_name("y");
  (*head.mutable_infer_response()->mutable_parameters())["triton_final_response"].set_bool_param(
      true);
  const std::string big(300, 'x');  // a length of two varint bytes
  for (bool error : {false, true}) {
    inference::ModelStreamInferResponse h = head;
    if (error) h.set_error_message("INVALID_ARGUMENT: no");
    std::vector<grpc::Slice> outputs;
    if (!error) outputs.emplace_back(big.data(), big.size());
    grpc::ByteBuffer wire = WriteRawStreamResponse(h, std::move(outputs));
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(wire.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    inference::ModelStreamInferResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes));
    inference::ModelStreamInferResponse expected = h;
    if (!error) expected.mutable_infer_response()->add_raw_output_contents(big);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, expected))
        << parsed.ShortDebugString();
  }
}

// ParseInferRequest over a transport's pieces: the same checks as over
// raw_input_contents, the pieces kept as they are.
engine::ModelInfo BoolAndFloats() {
  engine::ModelInfo m;
  m.inputs = {{"x", engine::DataType::kFloat32, {-1, 3}}, {"b", engine::DataType::kBool, {-1, 2}}};
  m.outputs = {{"y", engine::DataType::kFloat32, {-1, 1}}};
  m.batched = true;
  return m;
}

inference::ModelInferRequest TwoInputs(int64_t rows) {
  inference::ModelInferRequest r;
  auto* x = r.add_inputs();
  x->set_name("x");
  x->set_datatype("FP32");
  x->add_shape(rows);
  x->add_shape(3);
  auto* b = r.add_inputs();
  b->set_name("b");
  b->set_datatype("BOOL");
  b->add_shape(rows);
  b->add_shape(2);
  return r;
}

TEST(RawInferTest, TransportPiecesAreCheckedAsRawContents) {
  inference::ModelInferRequest r = TwoInputs(2);
  std::string floats(24, '\x11');
  std::string bools("\x01\x00\x00\x01", 4);
  r.add_raw_input_contents(floats);
  r.add_raw_input_contents(bools);
  const std::string wire = r.SerializeAsString();
  auto read = ReadRawInferRequest(Sliced(wire, 5));
  ASSERT_TRUE(read.ok()) << read.status();
  auto parsed =
      ParseInferRequest(BoolAndFloats(), read->message, 0, nullptr, read->transport.get());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rows, 2);
  EXPECT_EQ(parsed->inputs[0].size, 24u);
  EXPECT_GT(parsed->inputs[0].pieces.size(), 1u) << "the slices were copied into one piece";
  EXPECT_EQ(Joined(parsed->inputs[0]), floats);
  EXPECT_EQ(Joined(parsed->inputs[1]), bools);
  EXPECT_EQ(parsed->transport, read->transport->owner);

  // A BOOL byte other than 0 or 1 in a later piece; a short input; one
  // entry too few; raw contents in both places.
  inference::ModelInferRequest bad_bool = TwoInputs(2);
  bad_bool.add_raw_input_contents(floats);
  bad_bool.add_raw_input_contents(std::string("\x01\x00\x00\x02", 4));
  auto bad = ReadRawInferRequest(Sliced(bad_bool.SerializeAsString(), 3));
  ASSERT_TRUE(bad.ok());
  auto refused = ParseInferRequest(BoolAndFloats(), bad->message, 0, nullptr, bad->transport.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("byte 3 is 2"), std::string::npos) << refused.status();

  inference::ModelInferRequest short_input = TwoInputs(2);
  short_input.add_raw_input_contents(floats.substr(1));
  short_input.add_raw_input_contents(bools);
  auto s = ReadRawInferRequest(Sliced(short_input.SerializeAsString(), 2));
  ASSERT_TRUE(s.ok());
  refused = ParseInferRequest(BoolAndFloats(), s->message, 0, nullptr, s->transport.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs 24 bytes, got 23"), std::string::npos)
      << refused.status();

  inference::ModelInferRequest one = TwoInputs(2);
  one.add_raw_input_contents(floats);
  auto o = ReadRawInferRequest(Sliced(one.SerializeAsString(), 64));
  ASSERT_TRUE(o.ok());
  refused = ParseInferRequest(BoolAndFloats(), o->message, 0, nullptr, o->transport.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has 1 entries but the request names 2"),
            std::string::npos)
      << refused.status();

  inference::ModelInferRequest both = read->message;
  both.add_raw_input_contents(floats);
  both.add_raw_input_contents(bools);
  refused = ParseInferRequest(BoolAndFloats(), both, 0, nullptr, read->transport.get());
  EXPECT_FALSE(refused.ok());
}

}  // namespace
}  // namespace numaserve::serving
