// `numaserve serve`'s address checks (tools/numaserve/serve_options.h):
// which hosts count as reachable from this machine only, which Unix socket
// directories a training service without authentication may use, and
// where a /metrics bearer token needs HTTPS.
#include "tools/numaserve/serve_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace numaserve::cli {
namespace {

using ::testing::HasSubstr;

TEST(IsLocalOnlyTest, LoopbackAddressesAreLocal) {
  for (const char* host :
       {"localhost", "127.0.0.1", "127.1.2.3", "127.255.255.255", "::1", "0:0:0:0:0:0:0:1"}) {
    EXPECT_TRUE(IsLocalOnly(host)) << host;
  }
}

TEST(IsLocalOnlyTest, NamesAndOtherAddressesAreNot) {
  for (const char* host : {"127.evil.example",
                           "127.0.0.1.evil.example",
                           "127.",
                           "127",
                           "127.0.0.1 ",
                           " 127.0.0.1",
                           "127.0.0.1:80",
                           "127.0.0.256",
                           "0x7f.0.0.1",
                           "128.0.0.1",
                           "10.0.0.1",
                           "0.0.0.0",
                           "::",
                           "::2",
                           "::ffff:10.0.0.1",
                           "localhost.evil.example",
                           "LOCALHOST.",
                           "",
                           "[::1]",
                           "unix:/tmp/socket",
                           "unix-abstract:socket"}) {
    EXPECT_FALSE(IsLocalOnly(host)) << host;
  }
}

class PrivateSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TMPDIR");
    dir_ = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/socket_dir_XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override { rmdir(dir_.c_str()); }
  std::string dir_;
};

TEST_F(PrivateSocketTest, AnOwnerOnlyDirectoryIsAccepted) {
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  EXPECT_TRUE(CheckPrivateSocket("unix:" + dir_ + "/training.sock").ok());
  EXPECT_TRUE(CheckPrivateSocket("unix://" + dir_ + "/training.sock").ok());
}

TEST_F(PrivateSocketTest, ADirectoryOthersCanEnterOrWriteIsRefused) {
  for (mode_t mode : {0755, 0711, 0770, 0707, 01777}) {
    ASSERT_EQ(chmod(dir_.c_str(), mode), 0);
    const absl::Status s = CheckPrivateSocket("unix:" + dir_ + "/training.sock");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << std::oct << mode;
    EXPECT_THAT(s.message(), HasSubstr("--training-address")) << std::oct << mode;
    EXPECT_THAT(s.message(), HasSubstr("only this server's user")) << std::oct << mode;
  }
}

TEST_F(PrivateSocketTest, AMissingDirectoryIsRefused) {
  const absl::Status s = CheckPrivateSocket("unix:" + dir_ + "/missing/training.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no directory"));
}

TEST(CheckMetricsFlagsTest, ATokenWithoutHttpsOnlyOnLoopback) {
  ServeOptions o;
  o.metrics_auth_token_file = "/etc/numaserve/metrics-tokens";
  for (const char* host : {"127.0.0.1", "localhost", "::1"}) {
    o.host = host;
    EXPECT_TRUE(CheckMetricsFlags(o).ok()) << host;
  }
  o.host = "127.0.0.1";
  o.metrics_address = "[::1]:8002";
  EXPECT_TRUE(CheckMetricsFlags(o).ok());
  for (const char* address : {"0.0.0.0:8002", "10.1.2.3:8002", "[::]:8002", "127.evil.example:1"}) {
    o.metrics_address = address;
    const absl::Status s = CheckMetricsFlags(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(s.message(), HasSubstr("--metrics-auth-token-file needs --metrics-tls-cert"))
        << address;
  }
  o.metrics_address = "";
  o.host = "0.0.0.0";
  EXPECT_FALSE(CheckMetricsFlags(o).ok());
  // With HTTPS (the files are MetricsAuth::Create's to check) any address.
  o.metrics_tls_cert = "/etc/numaserve/tls/metrics.pem";
  o.metrics_tls_key = "/etc/numaserve/tls/metrics.key";
  EXPECT_TRUE(CheckMetricsFlags(o).ok());
  // Without a token nothing is asked of the address.
  o = ServeOptions();
  o.host = "0.0.0.0";
  EXPECT_TRUE(CheckMetricsFlags(o).ok());
}

TEST(MetricsAddressTest, TheAddressOrHostAndPort) {
  ServeOptions o;
  o.host = "10.0.0.5";
  o.metrics_port = 9100;
  EXPECT_EQ(MetricsAddress(o), "10.0.0.5:9100");
  o.metrics_address = "127.0.0.1:8002";
  EXPECT_EQ(MetricsAddress(o), "127.0.0.1:8002");
  EXPECT_EQ(HostOf("[fd00::1]:8002"), "fd00::1");
  EXPECT_EQ(HostOf("10.0.0.5:8002"), "10.0.0.5");
}

}  // namespace
}  // namespace numaserve::cli
