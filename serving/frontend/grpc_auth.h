// Who may talk to numaserve's gRPC ports, and who is calling.
//
//   * TLS: the server presents --grpc-tls-cert/--grpc-tls-key (gRPC's own
//     SslServerCredentials); a plaintext client cannot connect.
//   * mTLS: with --grpc-tls-client-ca every client must present a
//     certificate that CA signed, checked during the handshake; the
//     caller is its subject ("cert:CN=alice,O=...").
//   * Bearer tokens: with --grpc-auth-token-file every call must carry
//     `authorization: Bearer <token>` metadata naming one of the file's
//     tokens (compared in constant time), else UNAUTHENTICATED; the caller
//     is the token's name ("token:alice"). Only the standard health service
//     (grpc.health.v1.Health, what load balancers and Kubernetes probe) is
//     answered without a token. Tokens need TLS: gRPC's C++ server runs
//     AuthMetadataProcessors on secure ports only, and a token sent in the
//     clear is anybody's.
//
// With neither client certificates nor tokens every caller is anonymous
// (Caller() is empty).
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/credentials.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace numaserve::serving {

struct GrpcAuthOptions {
  // PEM certificate chain and private key of the server; both empty =
  // plaintext gRPC.
  std::string tls_cert_file;
  std::string tls_key_file;
  // PEM CA certificates; set = mutual TLS: clients must present a
  // certificate signed by one of them (needs the two above).
  std::string tls_client_ca_file;
  // Bearer tokens, one a line: "NAME TOKEN", or just "TOKEN" (named
  // "line-N"); blank lines and lines starting with # are skipped. Tokens are
  // at least 16 characters without spaces. Needs TLS.
  std::string token_file;
};

class GrpcAuth {
 public:
  // Reads and checks the files; errors name the option and the file (and
  // the line of a bad token).
  static absl::StatusOr<std::unique_ptr<GrpcAuth>> Create(const GrpcAuthOptions& options);
  ~GrpcAuth();

  // Credentials for one listening port: TLS (with the token check) or
  // plaintext. Call once per port.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  bool tls() const { return !cert_chain_.empty(); }
  // Every caller is identified (client certificates or tokens).
  bool authenticates() const { return !client_ca_.empty() || !tokens_.empty(); }

  // The caller of a call that passed the port's checks: "token:NAME" with
  // tokens, else "cert:SUBJECT" with client certificates, else "" (anonymous).
  std::string Caller(const grpc::ServerContextBase& context) const;

  // Whether calls need a bearer token (--grpc-auth-token-file).
  bool checks_tokens() const { return !tokens_.empty(); }

  // An OpenSSL server context with the same certificate, key and client
  // verification (mTLS: a client certificate the CA signed is required in
  // the handshake), TLS 1.2 or later, for the HTTP/REST port; null without
  // TLS. Errors name the option.
  absl::StatusOr<std::shared_ptr<ssl_ctx_st>> MakeHttpTlsContext() const;

  // One line for the start-up log: "TLS, client certificates, 2 bearer tokens".
  std::string Describe() const;

  // A token and its name, as read from the token file.
  using Token = base::BearerToken;
  // The name of the token `authorization` ("Bearer <token>") carries, or
  // nullptr; compares with every token in constant time.
  const std::string* FindToken(absl::string_view authorization) const;

 private:
  GrpcAuth() = default;
  class TokenProcessor;

  std::string cert_chain_;
  std::string private_key_;
  std::string client_ca_;
  std::vector<Token> tokens_;
  std::shared_ptr<TokenProcessor> processor_;
};

}  // namespace numaserve::serving
