#include "serving/frontend/grpc_auth.h"

#include <grpc/grpc_security_constants.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/credentials.h"

namespace numaserve::serving {
namespace {

// Answered without a token (see grpc_auth.h).
constexpr absl::string_view kOpenPathPrefix = "/grpc.health.v1.Health/";

// The certificate and key (base::CheckCertificateAndKey), and a CA file
// holding at least one certificate.
absl::Status CheckPem(const GrpcAuthOptions& o, const std::string& cert, const std::string& key,
                      const std::string& ca) {
  if (absl::Status s = base::CheckCertificateAndKey("grpc-tls-cert", o.tls_cert_file, cert,
                                                    "grpc-tls-key", o.tls_key_file, key);
      !s.ok()) {
    return s;
  }
  if (!ca.empty()) {
    std::unique_ptr<BIO, decltype(&BIO_free)> ca_bio(BIO_new_mem_buf(ca.data(), ca.size()),
                                                     BIO_free);
    std::unique_ptr<X509, decltype(&X509_free)> ca_cert(
        PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr), X509_free);
    if (ca_cert == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--grpc-tls-client-ca ", o.tls_client_ca_file,
                                                     ": no PEM certificate (",
                                                     base::TakeOpenSslError(), ")"));
    }
  }
  return absl::OkStatus();
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
    absl::StatusOr<std::string> cert = base::ReadCredentialFile("grpc-tls-cert", o.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = base::ReadCredentialFile("grpc-tls-key", o.tls_key_file);
    if (!key.ok()) return key.status();
    base::WarnIfOthersCanRead("grpc-tls-key", o.tls_key_file);
    std::string ca;
    if (!o.tls_client_ca_file.empty()) {
      absl::StatusOr<std::string> read =
          base::ReadCredentialFile("grpc-tls-client-ca", o.tls_client_ca_file);
      if (!read.ok()) return read.status();
      ca = std::move(*read);
    }
    if (absl::Status s = CheckPem(o, *cert, *key, ca); !s.ok()) return s;
    auth->cert_chain_ = std::move(*cert);
    auth->private_key_ = std::move(*key);
    auth->client_ca_ = std::move(ca);
  }
  if (!o.token_file.empty()) {
    absl::StatusOr<std::string> text =
        base::ReadCredentialFile("grpc-auth-token-file", o.token_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<Token>> tokens =
        base::ParseBearerTokens("grpc-auth-token-file", o.token_file, *text);
    if (!tokens.ok()) return tokens.status();
    auth->tokens_ = std::move(*tokens);
    base::WarnIfOthersCanRead("grpc-auth-token-file", o.token_file);
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

absl::StatusOr<std::shared_ptr<SSL_CTX>> GrpcAuth::MakeHttpTlsContext() const {
  if (!tls()) return nullptr;
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (ctx == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot make a TLS context (", base::TakeOpenSslError(), ")"));
  }
  if (absl::Status s = base::UseCertificateChainAndKey(ctx.get(), "grpc-tls-cert", cert_chain_,
                                                       "grpc-tls-key", private_key_);
      !s.ok()) {
    return s;
  }
  if (client_ca_.empty()) return ctx;
  // mTLS: every certificate of the CA file is trusted and named to clients.
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(client_ca_.data(), client_ca_.size()), BIO_free);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
  while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    const bool added =
        X509_STORE_add_cert(store, ca) == 1 && SSL_CTX_add_client_CA(ctx.get(), ca) == 1;
    X509_free(ca);
    if (!added) {
      return absl::InternalError(absl::StrCat("--grpc-tls-client-ca: cannot use a certificate (",
                                              base::TakeOpenSslError(), ")"));
    }
  }
  ERR_clear_error();  // the end of the PEM text
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  static constexpr unsigned char kSessionContext[] = "numaserve-http";
  SSL_CTX_set_session_id_context(ctx.get(), kSessionContext, sizeof kSessionContext - 1);
  return ctx;
}

const std::string* GrpcAuth::FindToken(absl::string_view authorization) const {
  return base::FindBearerToken(tokens_, authorization);
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
