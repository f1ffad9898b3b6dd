#include "serving/request/request_parameters.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace numaserve::serving {
namespace {

using ::testing::HasSubstr;

inference::ModelInferRequest Request() {
  inference::ModelInferRequest r;
  r.set_model_name("m");
  r.add_inputs()->set_name("x");
  r.add_outputs()->set_name("y");
  return r;
}

void ExpectInvalid(const inference::ModelInferRequest& r, const std::string& expect,
                   PriorityConfig levels = {}) {
  auto p = ReadRequestParameters(r, levels);
  ASSERT_FALSE(p.ok()) << expect;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(expect));
}

TEST(RequestParameters, NoneGivenMeansNoTimeoutAndTheDefaultLevel) {
  auto p = ReadRequestParameters(Request(), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->timeout_us, 0u);
  EXPECT_EQ(p->priority, 1u);
  EXPECT_FALSE(p->profile);
  p = ReadRequestParameters(Request(), {.levels = 3, .default_level = 2});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->priority, 2u);
}

TEST(RequestParameters, TimeoutInMicrosecondsAsInt64OrUint64) {
  auto r = Request();
  (*r.mutable_parameters())["timeout"].set_int64_param(2500);
  auto p = ReadRequestParameters(r, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->timeout_us, 2500u);
  (*r.mutable_parameters())["timeout"].set_uint64_param(kMaxRequestTimeoutMicroseconds);
  p = ReadRequestParameters(r, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->timeout_us, kMaxRequestTimeoutMicroseconds);
  (*r.mutable_parameters())["timeout"].set_uint64_param(kMaxRequestTimeoutMicroseconds + 1);
  ExpectInvalid(r, "request parameter 'timeout' is 86400000001 microseconds, above the limit");
  (*r.mutable_parameters())["timeout"].set_int64_param(-1);
  ExpectInvalid(r, "request parameter 'timeout' is -1; it must not be negative");
  (*r.mutable_parameters())["timeout"].set_string_param("10");
  ExpectInvalid(r, "request parameter 'timeout' must be an integer");
  (*r.mutable_parameters())["timeout"].set_double_param(1.5);
  ExpectInvalid(r, "request parameter 'timeout' must be an integer");
}

TEST(RequestParameters, PriorityWithinTheModelsLevels) {
  auto r = Request();
  const PriorityConfig levels{.levels = 3, .default_level = 3};
  for (uint64_t asked : {1, 2, 3}) {
    (*r.mutable_parameters())["priority"].set_uint64_param(asked);
    auto p = ReadRequestParameters(r, levels);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->priority, asked);
  }
  (*r.mutable_parameters())["priority"].set_int64_param(0);  // the default
  auto p = ReadRequestParameters(r, levels);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->priority, 3u);
  (*r.mutable_parameters())["priority"].set_int64_param(4);
  ExpectInvalid(r, "request parameter 'priority' is 4; the model has 3 priority levels", levels);
  // Without priority_levels a model has one level: 0 and 1 only.
  (*r.mutable_parameters())["priority"].set_int64_param(1);
  EXPECT_TRUE(ReadRequestParameters(r, {}).ok());
  (*r.mutable_parameters())["priority"].set_int64_param(2);
  ExpectInvalid(r, "the model has 1 priority level (dynamic_batching.priority_levels)");
  (*r.mutable_parameters())["priority"].set_bool_param(true);
  ExpectInvalid(r, "request parameter 'priority' must be an integer");
}

TEST(RequestParameters, SequencesAreRefused) {
  for (const char* name : {"sequence_id", "sequence_start", "sequence_end"}) {
    auto r = Request();
    (*r.mutable_parameters())[name].set_int64_param(1);
    ExpectInvalid(r, "sequence batching is not supported");
    ExpectInvalid(r, name);
  }
}

TEST(RequestParameters, UnknownParametersAreRefusedNotIgnored) {
  auto r = Request();
  (*r.mutable_parameters())["priorty"].set_int64_param(1);
  ExpectInvalid(r, "unknown request parameter 'priorty' (numaserve takes timeout, priority");
  // gRPC has no binary_data_output: HTTP takes it out before this.
  r = Request();
  (*r.mutable_parameters())["binary_data_output"].set_bool_param(true);
  ExpectInvalid(r, "unknown request parameter 'binary_data_output'");
  r = Request();
  (*r.mutable_parameters())[std::string("a\0b", 3)].set_bool_param(true);
  ExpectInvalid(r, "unknown request parameter 'a\\x00");
}

TEST(RequestParameters, InputAndOutputParametersAreRefused) {
  auto r = Request();
  (*r.mutable_inputs(0)->mutable_parameters())["tag"].set_string_param("t");
  ExpectInvalid(r, "unknown input 'x' parameter 'tag'");
  r = Request();
  (*r.mutable_inputs(0)->mutable_parameters())["shared_memory_region"].set_string_param("r");
  ExpectInvalid(r, "the shared-memory extension is not supported");
  r = Request();
  (*r.mutable_outputs(0)->mutable_parameters())["classification"].set_int64_param(3);
  ExpectInvalid(r, "output 'y' parameter 'classification': the classification extension");
  r = Request();
  (*r.mutable_outputs(0)->mutable_parameters())["binary_data"].set_bool_param(true);
  ExpectInvalid(r, "unknown output 'y' parameter 'binary_data'");
}

TEST(RequestParameters, TritonsFinalResponseFlagIsABool) {
  auto r = Request();
  auto p = ReadRequestParameters(r, {});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->mark_final_response);
  (*r.mutable_parameters())["triton_enable_empty_final_response"].set_bool_param(true);
  p = ReadRequestParameters(r, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->mark_final_response);
  (*r.mutable_parameters())["triton_enable_empty_final_response"].set_int64_param(1);
  ExpectInvalid(r, "'triton_enable_empty_final_response' must be a bool");
}

TEST(RequestParameters, ProfileIsStillRead) {
  auto r = Request();
  (*r.mutable_parameters())["profile"].set_bool_param(true);
  auto p = ReadRequestParameters(r, {});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->profile);
  (*r.mutable_parameters())["profile"].set_int64_param(1);
  ExpectInvalid(r, "request parameter 'profile' must be bool");
}

}  // namespace
}  // namespace numaserve::serving
