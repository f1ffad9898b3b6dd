#include "serving/http/http_status.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace numaserve::serving::http {
namespace {

// Every absl::StatusCode (which are gRPC's codes) has its HTTP status here:
// a new code added to absl without a row fails the test.
TEST(HttpStatusTest, EveryStatusCodeHasItsHttpStatus) {
  const std::map<absl::StatusCode, int> expected = {
      {absl::StatusCode::kOk, 200},
      {absl::StatusCode::kCancelled, 499},
      {absl::StatusCode::kUnknown, 500},
      {absl::StatusCode::kInvalidArgument, 400},
      {absl::StatusCode::kDeadlineExceeded, 504},
      {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kAlreadyExists, 409},
      {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kAborted, 409},
      {absl::StatusCode::kOutOfRange, 400},
      {absl::StatusCode::kUnimplemented, 501},
      {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDataLoss, 500},
      {absl::StatusCode::kUnauthenticated, 401},
  };
  // absl's codes are 0..16, as gRPC's.
  for (int code = 0; code <= 16; ++code) {
    const auto status_code = static_cast<absl::StatusCode>(code);
    ASSERT_TRUE(expected.count(status_code)) << "no expectation for code " << code;
    const HttpStatus http = HttpStatusFor(status_code);
    EXPECT_EQ(http.code, expected.at(status_code)) << absl::StatusCodeToString(status_code);
    EXPECT_STRNE(http.reason, "Unknown") << absl::StatusCodeToString(status_code);
  }
  // A value outside the enum is a server error, not a crash.
  EXPECT_EQ(HttpStatusFor(static_cast<absl::StatusCode>(99)).code, 500);
}

TEST(HttpStatusTest, BackPressureIsTooManyRequests) {
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("queue full").code()).code, 429);
  EXPECT_STREQ(ReasonPhrase(429), "Too Many Requests");
  EXPECT_STREQ(ReasonPhrase(405), "Method Not Allowed");
  EXPECT_STREQ(ReasonPhrase(413), "Content Too Large");
}

TEST(HttpStatusTest, ErrorBodyIsEscapedJson) {
  EXPECT_EQ(ErrorBody("plain"), R"({"error":"plain"})");
  EXPECT_EQ(ErrorBody("quote \" and \\ and\nnewline"),
            R"({"error":"quote \" and \\ and\nnewline"})");
  EXPECT_EQ(ErrorBody(std::string("nul\0byte", 8)), R"({"error":"nul\u0000byte"})");
  // UTF-8 passes; bytes that are not UTF-8 become '?', so the body stays JSON.
  EXPECT_EQ(ErrorBody("caf\xc3\xa9"), "{\"error\":\"caf\xc3\xa9\"}");
  EXPECT_EQ(ErrorBody("bad \xff\xfe end"), R"({"error":"bad ?? end"})");
}

TEST(HttpStatusTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("ascii"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // cut short
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // a UTF-16 surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x28\xa1"));      // bad continuation
}

}  // namespace
}  // namespace numaserve::serving::http
