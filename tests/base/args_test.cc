#include "base/args.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace numaserve::base {
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

// Writes TEXT to a file of its own in the test's temporary directory.
std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The options of a small serve command.
struct ServeFlags {
  std::string host = "127.0.0.1";
  int64_t grpc_port = 8001;
  double ratio = 0;
  bool training = false;
  std::string cpuset;
  std::vector<std::string> inputs;
  ArgParser parser{"serve", "test"};
  ServeFlags() {
    parser.AddConfigFile("config", "options from FILE");
    parser.AddString("host", &host, "");
    parser.AddInt("grpc-port", &grpc_port, "");
    parser.AddDouble("ratio", &ratio, "");
    parser.AddBool("training-service", &training, "");
    parser.AddString("cpuset", &cpuset, "");
    parser.AddRepeated("input", &inputs, "");
  }
};

TEST(ArgParserConfigTest, ReadsEveryKindOfOption) {
  const std::string path = WriteConfig("every.conf",
                                       "# a serve config\n"
                                       "\n"
                                       "host: 0.0.0.0\n"
                                       "  grpc-port = 9001   # the gRPC port\n"
                                       "ratio: 0.5\n"
                                       "training-service: true\n"
                                       "cpuset: \"0-3 #not a comment\"\n"
                                       "input: a=1\n"
                                       "input: b=2\n");
  ServeFlags f;
  ASSERT_TRUE(f.parser.Parse({"--config", path}).ok());
  EXPECT_EQ(f.host, "0.0.0.0");
  EXPECT_EQ(f.grpc_port, 9001);
  EXPECT_DOUBLE_EQ(f.ratio, 0.5);
  EXPECT_TRUE(f.training);
  EXPECT_EQ(f.cpuset, "0-3 #not a comment");
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"a=1", "b=2"}));
}

TEST(ArgParserConfigTest, FlagsOverrideTheFileWhereverTheyAre) {
  const std::string path = WriteConfig("override.conf",
                                       "grpc-port: 9001\nhost: 0.0.0.0\ntraining-service: true\n"
                                       "input: from-file\n");
  ServeFlags f;
  ASSERT_TRUE(f.parser
                  .Parse({"--grpc-port", "7000", "--config=" + path, "--training-service=false",
                          "--input", "from-flags"})
                  .ok());
  EXPECT_EQ(f.grpc_port, 7000);
  EXPECT_EQ(f.host, "0.0.0.0");  // from the file
  EXPECT_FALSE(f.training);
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"from-flags"}));
}

TEST(ArgParserConfigTest, ErrorsNameFileLineAndOption) {
  const auto error = [](const std::string& name, const std::string& text) {
    const std::string path = WriteConfig(name, text);
    ServeFlags f;
    absl::Status s = f.parser.Parse({"--config", path});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::make_pair(path, std::string(s.message()));
  };
  auto [path, message] = error("typo.conf", "# comment\nhost: ::1\ngrpc-prot: 9001\n");
  EXPECT_EQ(message, path + ":3: unknown option 'grpc-prot'");
  std::tie(path, message) = error("value.conf", "grpc-port: ninety\n");
  EXPECT_EQ(message.rfind(path + ":1: ", 0), 0u) << message;
  EXPECT_NE(message.find("grpc-port"), std::string::npos) << message;
  EXPECT_NE(message.find("ninety"), std::string::npos) << message;
  std::tie(path, message) = error("bool.conf", "\ntraining-service: maybe\n");
  EXPECT_EQ(message.rfind(path + ":2: ", 0), 0u) << message;
  std::tie(path, message) = error("syntax.conf", "grpc-port 9001\n");
  EXPECT_EQ(message.rfind(path + ":1: expected 'name: value'", 0), 0u) << message;
  std::tie(path, message) = error("twice.conf", "grpc-port: 1\ngrpc-port: 2\n");
  EXPECT_EQ(message, path + ":2: option 'grpc-port' is set twice");
  std::tie(path, message) = error("nested.conf", "config: other.conf\n");
  EXPECT_EQ(message.rfind(path + ":1: ", 0), 0u) << message;

  ServeFlags f;
  absl::Status missing = f.parser.Parse({"--config", "/nonexistent/serve.conf"});
  EXPECT_NE(missing.message().find("/nonexistent/serve.conf"), absl::string_view::npos) << missing;
  EXPECT_FALSE(f.parser.Parse({"--config"}).ok());
}

TEST(ArgParserConfigTest, OnlyWhereAskedFor) {
  int64_t port = 0;
  ArgParser p("infer", "test");
  p.AddInt("grpc-port", &port, "");
  EXPECT_FALSE(p.Parse({"--config", "x.conf"}).ok());
  ServeFlags f;
  EXPECT_NE(f.parser.Usage().find("--config FILE"), std::string::npos);
}

}  // namespace
}  // namespace numaserve::base
