#include "server/args.h"

#include <gtest/gtest.h>

namespace numaserve::server {
namespace {

TEST(ArgParserTest, ParsesEveryKindOfOption) {
  std::string name = "x";
  int64_t port = 1;
  double ratio = 0;
  bool smt = false;
  std::vector<std::string> inputs;
  ArgParser p("serve", "test");
  p.AddString("name", &name, "");
  p.AddInt("port", &port, "");
  p.AddDouble("ratio", &ratio, "");
  p.AddBool("use-smt", &smt, "");
  p.AddRepeated("input", &inputs, "");
  ASSERT_TRUE(p.Parse({"--name", "abc", "--port=0", "--ratio", "0.5", "--use-smt", "--input", "a=1",
                       "--input=b=2"})
                  .ok());
  EXPECT_EQ(name, "abc");
  EXPECT_EQ(port, 0);
  EXPECT_DOUBLE_EQ(ratio, 0.5);
  EXPECT_TRUE(smt);
  EXPECT_EQ(inputs, (std::vector<std::string>{"a=1", "b=2"}));
}

TEST(ArgParserTest, ErrorsNameTheCommandAndOption) {
  int64_t port = 0;
  bool flag = false;
  ArgParser p("serve", "test");
  p.AddInt("grpc-port", &port, "");
  p.AddBool("flag", &flag, "");
  absl::Status s = p.Parse({"--bogus"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("serve"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--bogus"), absl::string_view::npos) << s;
  s = p.Parse({"--grpc-port", "eighty"});
  EXPECT_NE(s.message().find("--grpc-port"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("eighty"), absl::string_view::npos) << s;
  EXPECT_FALSE(p.Parse({"--grpc-port"}).ok());  // missing value
  EXPECT_FALSE(p.Parse({"positional"}).ok());
  EXPECT_FALSE(p.Parse({"--flag=maybe"}).ok());
}

TEST(ArgParserTest, HelpListsOptionsWithDefaults) {
  int64_t port = 8001;
  ArgParser p("serve", "Serve models.");
  p.AddInt("grpc-port", &port, "gRPC port");
  ASSERT_TRUE(p.Parse({"--help"}).ok());
  EXPECT_TRUE(p.help_requested());
  EXPECT_NE(p.Usage().find("--grpc-port"), std::string::npos);
  EXPECT_NE(p.Usage().find("8001"), std::string::npos);
}

}  // namespace
}  // namespace numaserve::server
