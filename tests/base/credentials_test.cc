// Credential files (base/credentials.h): the token-file format, how a token
// is found in an `authorization` value, and the size limit of a file. The
// certificate and key checks run against real files made with openssl in
// tests/integration/test_tls.py and test_metrics_security.py.
#include "base/credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace numaserve::base {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "alice-0123456789abcdef";
constexpr char kBare[] = "fedcba9876543210fedcba";

std::vector<BearerToken> Tokens() {
  auto tokens =
      ParseBearerTokens("metrics-auth-token-file", "/tokens",
                        absl::StrCat("# comment\n\n  alice ", kAlice, "  \n", kBare, "\n"));
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *tokens : std::vector<BearerToken>();
}

TEST(ParseBearerTokensTest, NamedAndBareTokens) {
  const std::vector<BearerToken> tokens = Tokens();
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(tokens[0].name, "alice");
  EXPECT_EQ(tokens[0].secret, kAlice);
  EXPECT_EQ(tokens[1].name, "line-4");
  EXPECT_EQ(tokens[1].secret, kBare);
}

TEST(ParseBearerTokensTest, BadFilesNameTheFlagFileAndLine) {
  struct Case {
    std::string text;
    std::string error;
  };
  for (const Case& c : {
           Case{"alice tooshort\n", "--f /t:1: the token has 8 characters, at least 16"},
           Case{absl::StrCat("a ", kAlice, " extra\n"), "--f /t:1: expected \"NAME TOKEN\""},
           Case{absl::StrCat("a ", kAlice, "\na ", kBare, "\n"), "--f /t:2: the name 'a'"},
           Case{"# only a comment\n\n", "--f /t: no tokens in the file"},
       }) {
    auto tokens = ParseBearerTokens("f", "/t", c.text);
    ASSERT_FALSE(tokens.ok()) << c.text;
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokens.status().message(), HasSubstr(c.error)) << c.text;
  }
}

TEST(FindBearerTokenTest, TheSchemeInAnyCaseAndTheExactToken) {
  const std::vector<BearerToken> tokens = Tokens();
  const std::string* name = FindBearerToken(tokens, absl::StrCat("Bearer ", kAlice));
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(*name, "alice");
  name = FindBearerToken(tokens, absl::StrCat("  bEaReR   ", kBare, " "));
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(*name, "line-4");
  const std::string alice = kAlice;
  for (const std::string& wrong :
       {alice, absl::StrCat("Basic ", alice), absl::StrCat("Bearer ", alice, "x"),
        absl::StrCat("Bearer ", alice.substr(0, alice.size() - 1)), std::string("Bearer "),
        std::string("Bearer"), std::string(""), absl::StrCat("Bearer ", alice, " ", kBare)}) {
    EXPECT_EQ(FindBearerToken(tokens, wrong), nullptr) << wrong;
  }
  EXPECT_EQ(FindBearerToken({}, absl::StrCat("Bearer ", kAlice)), nullptr);
}

TEST(ReadCredentialFileTest, MissingAndOversizedFilesAreRefused) {
  auto missing = ReadCredentialFile("metrics-tls-key", "/nonexistent/key.pem");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("--metrics-tls-key /nonexistent/key.pem: cannot open"));
  char path[] = "/tmp/numaserve_credentials_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(kMaxCredentialFileBytes + 1, 'x');
  }
  auto big = ReadCredentialFile("metrics-tls-cert", path);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("more than 1 MiB"));
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "token";
  }
  auto small = ReadCredentialFile("metrics-tls-cert", path);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, "token");
  unlink(path);
}

}  // namespace
}  // namespace numaserve::base
