#include "serving/frontend/grpc_auth.h"

#include <grpc/grpc_security_constants.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/log.h"

namespace numaserve::serving {
namespace {

constexpr size_t kMaxFileBytes = size_t{1} << 20;
constexpr size_t kMinTokenChars = 16;
// Answered without a token (see grpc_auth.h).
constexpr absl::string_view kOpenPathPrefix = "/grpc.health.v1.Health/";

absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, " ", path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  std::string bytes = text.str();
  if (bytes.size() > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": ", bytes.size(), " bytes, more than 1 MiB"));
  }
  return bytes;
}

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "not PEM";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

// Checks what gRPC would otherwise only fail on at the first handshake:
// the files are PEM, the key is the certificate's, the certificate is valid
// now, and the CA file holds at least one certificate.
absl::Status CheckPem(const GrpcAuthOptions& o, const std::string& cert, const std::string& key,
                      const std::string& ca) {
  std::unique_ptr<BIO, decltype(&BIO_free)> cert_bio(BIO_new_mem_buf(cert.data(), cert.size()),
                                                     BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> x509(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (x509 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc-tls-cert ", o.tls_cert_file,
                                                   ": no PEM certificate (", OpenSslError(), ")"));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(BIO_new_mem_buf(key.data(), key.size()),
                                                    BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc-tls-key ", o.tls_key_file,
                                                   ": no unencrypted PEM private key (",
                                                   OpenSslError(), ")"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--grpc-tls-key ", o.tls_key_file,
                                                   " is not the key of the certificate in "
                                                   "--grpc-tls-cert ",
                                                   o.tls_cert_file));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(x509.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-tls-cert ", o.tls_cert_file, ": the certificate has expired"));
  }
  if (!ca.empty()) {
    std::unique_ptr<BIO, decltype(&BIO_free)> ca_bio(BIO_new_mem_buf(ca.data(), ca.size()),
                                                     BIO_free);
    std::unique_ptr<X509, decltype(&X509_free)> ca_cert(
        PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr), X509_free);
    if (ca_cert == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--grpc-tls-client-ca ", o.tls_client_ca_file,
                                                     ": no PEM certificate (", OpenSslError(),
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GrpcAuth::Token>> ParseTokens(const std::string& path,
                                                         const std::string& text) {
  std::vector<GrpcAuth::Token> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipWhitespace());
    const std::string where = absl::StrCat("--grpc-auth-token-file ", path, ":", line_number);
    if (fields.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected \"NAME TOKEN\" or \"TOKEN\", got ", fields.size(), " fields"));
    }
    GrpcAuth::Token token;
    token.secret = std::string(fields.back());
    token.name = fields.size() == 2 ? std::string(fields[0]) : absl::StrCat("line-", line_number);
    if (token.secret.size() < kMinTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the token has ", token.secret.size(),
                                                     " characters, at least 16 are needed"));
    }
    for (const GrpcAuth::Token& t : tokens) {
      if (t.name == token.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the name '", token.name, "' is used twice"));
      }
    }
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-auth-token-file ", path, ": no tokens in the file"));
  }
  return tokens;
}

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

absl::string_view View(const grpc::string_ref& s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

// Runs before every call on a TLS port: UNAUTHENTICATED unless the call
// carries one of the tokens (the health service excepted).
class GrpcAuth::TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(const GrpcAuth* auth) : auth_(auth) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    auto path = metadata.find(":path");
    if (path != metadata.end() && absl::StartsWith(View(path->second), kOpenPathPrefix)) {
      return grpc::Status::OK;
    }
    if (metadata.count("authorization") != 1) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this server needs one 'authorization: Bearer <token>' metadata entry");
    }
    if (auth_->FindToken(View(metadata.find("authorization")->second)) == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown bearer token");
    }
    return grpc::Status::OK;
  }

 private:
  const GrpcAuth* const auth_;
};

absl::StatusOr<std::unique_ptr<GrpcAuth>> GrpcAuth::Create(const GrpcAuthOptions& o) {
  std::unique_ptr<GrpcAuth> auth(new GrpcAuth());
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--grpc-tls-cert and --grpc-tls-key go together");
  }
  const bool tls = !o.tls_cert_file.empty();
  if (!tls && !o.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key (client certificates are "
        "checked in the TLS handshake)");
  }
  if (!tls && !o.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--grpc-auth-token-file needs --grpc-tls-cert and --grpc-tls-key (a bearer token sent "
        "over plaintext gRPC can be read on the way)");
  }
  if (tls) {
    absl::StatusOr<std::string> cert = ReadSmallFile("grpc-tls-cert", o.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadSmallFile("grpc-tls-key", o.tls_key_file);
    if (!key.ok()) return key.status();
    std::string ca;
    if (!o.tls_client_ca_file.empty()) {
      absl::StatusOr<std::string> read = ReadSmallFile("grpc-tls-client-ca", o.tls_client_ca_file);
      if (!read.ok()) return read.status();
      ca = std::move(*read);
    }
    if (absl::Status s = CheckPem(o, *cert, *key, ca); !s.ok()) return s;
    auth->cert_chain_ = std::move(*cert);
    auth->private_key_ = std::move(*key);
    auth->client_ca_ = std::move(ca);
  }
  if (!o.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadSmallFile("grpc-auth-token-file", o.token_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<Token>> tokens = ParseTokens(o.token_file, *text);
    if (!tokens.ok()) return tokens.status();
    auth->tokens_ = std::move(*tokens);
    struct stat st;
    if (stat(o.token_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      base::Log(base::LogLevel::kWarning, "auth",
                absl::StrCat("--grpc-auth-token-file ", o.token_file,
                             " is readable by other users (chmod 600)"),
                {{"path", o.token_file}});
    }
    auth->processor_ = std::make_shared<TokenProcessor>(auth.get());
  }
  return auth;
}

GrpcAuth::~GrpcAuth() = default;

std::shared_ptr<grpc::ServerCredentials> GrpcAuth::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      client_ca_.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                         : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = client_ca_;
  options.pem_key_cert_pairs.push_back({private_key_, cert_chain_});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (processor_ != nullptr) credentials->SetAuthMetadataProcessor(processor_);
  return credentials;
}

const std::string* GrpcAuth::FindToken(absl::string_view authorization) const {
  absl::string_view value = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return nullptr;
  }
  value = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  const std::string* found = nullptr;
  for (const Token& t : tokens_) {  // no early exit: every token is compared
    if (ConstantTimeEquals(value, t.secret)) found = &t.name;
  }
  return found;
}

std::string GrpcAuth::Caller(const grpc::ServerContextBase& context) const {
  if (!tokens_.empty()) {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) return "";
    const std::string* name = FindToken(View(it->second));
    return name == nullptr ? "" : absl::StrCat("token:", *name);
  }
  if (!client_ca_.empty()) {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth == nullptr) return "";
    std::vector<grpc::string_ref> subject =
        auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
    if (subject.empty()) return "";
    return absl::StrCat("cert:", View(subject[0]));
  }
  return "";
}

std::string GrpcAuth::Describe() const {
  if (!tls()) return "plaintext, no authentication";
  std::string out = "TLS";
  if (!client_ca_.empty()) absl::StrAppend(&out, ", client certificates required");
  if (!tokens_.empty()) absl::StrAppend(&out, ", ", tokens_.size(), " bearer token(s)");
  if (!authenticates()) absl::StrAppend(&out, ", no authentication");
  return out;
}

}  // namespace numaserve::serving
