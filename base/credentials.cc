#include "base/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/log.h"

namespace numaserve::base {
namespace {

// The time depends on the secret's length only, never on where `given`
// first differs.
bool ConstantTimeEquals(absl::string_view given, absl::string_view secret) {
  unsigned char diff = given.size() != secret.size() ? 1 : 0;
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(secret[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::string> ReadCredentialFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, " ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  std::string bytes = text.str();
  if (bytes.size() > kMaxCredentialFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": ", bytes.size(), " bytes, more than 1 MiB"));
  }
  return bytes;
}

void WarnIfOthersCanRead(const std::string& flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    Log(LogLevel::kWarning, "auth",
        absl::StrCat("--", flag, " ", path, " is readable by other users (chmod 600)"),
        {{"path", path}});
  }
}

absl::Status UseCertificateChainAndKey(SSL_CTX* ctx, const std::string& cert_flag,
                                       const std::string& chain, const std::string& key_flag,
                                       const std::string& key) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  std::unique_ptr<BIO, decltype(&BIO_free)> chain_bio(BIO_new_mem_buf(chain.data(), chain.size()),
                                                      BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> leaf(
      PEM_read_bio_X509(chain_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (leaf == nullptr || SSL_CTX_use_certificate(ctx, leaf.get()) != 1) {
    return absl::InternalError(
        absl::StrCat("--", cert_flag, ": cannot use the certificate (", TakeOpenSslError(), ")"));
  }
  // The rest of the file: the intermediate certificates, sent with it.
  while (X509* intermediate = PEM_read_bio_X509(chain_bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, intermediate) != 1) {
      X509_free(intermediate);
      return absl::InternalError(
          absl::StrCat("--", cert_flag, ": cannot use the chain (", TakeOpenSslError(), ")"));
    }
  }
  ERR_clear_error();  // the end of the PEM text
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(BIO_new_mem_buf(key.data(), key.size()),
                                                    BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (pkey == nullptr || SSL_CTX_use_PrivateKey(ctx, pkey.get()) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InternalError(
        absl::StrCat("--", key_flag, ": cannot use the key (", TakeOpenSslError(), ")"));
  }
  return absl::OkStatus();
}

std::string TakeOpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "not PEM";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

absl::Status CheckCertificateAndKey(const std::string& cert_flag, const std::string& cert_path,
                                    const std::string& cert, const std::string& key_flag,
                                    const std::string& key_path, const std::string& key) {
  std::unique_ptr<BIO, decltype(&BIO_free)> cert_bio(BIO_new_mem_buf(cert.data(), cert.size()),
                                                     BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> x509(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (x509 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", cert_flag, " ", cert_path, ": no PEM certificate (", TakeOpenSslError(), ")"));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(BIO_new_mem_buf(key.data(), key.size()),
                                                    BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--", key_flag, " ", key_path,
                                                   ": no unencrypted PEM private key (",
                                                   TakeOpenSslError(), ")"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--", key_flag, " ", key_path,
                                                   " is not the key of the certificate in --",
                                                   cert_flag, " ", cert_path));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(x509.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", cert_flag, " ", cert_path, ": the certificate has expired"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BearerToken>> ParseBearerTokens(const std::string& flag,
                                                           const std::string& path,
                                                           const std::string& text) {
  std::vector<BearerToken> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipWhitespace());
    const std::string where = absl::StrCat("--", flag, " ", path, ":", line_number);
    if (fields.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected \"NAME TOKEN\" or \"TOKEN\", got ", fields.size(), " fields"));
    }
    BearerToken token;
    token.secret = std::string(fields.back());
    token.name = fields.size() == 2 ? std::string(fields[0]) : absl::StrCat("line-", line_number);
    if (token.secret.size() < kMinBearerTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the token has ", token.secret.size(),
                                                     " characters, at least ", kMinBearerTokenChars,
                                                     " are needed"));
    }
    for (const BearerToken& t : tokens) {
      if (t.name == token.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the name '", token.name, "' is used twice"));
      }
    }
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": no tokens in the file"));
  }
  return tokens;
}

const std::string* FindBearerToken(const std::vector<BearerToken>& tokens,
                                   absl::string_view authorization) {
  absl::string_view value = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return nullptr;
  }
  value = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  const std::string* found = nullptr;
  for (const BearerToken& t : tokens) {  // no early exit: every token is compared
    if (ConstantTimeEquals(value, t.secret)) found = &t.name;
  }
  return found;
}

}  // namespace numaserve::base
