// Who may read numaserve's Prometheus endpoint, and over what.
//
//   * TLS: with --metrics-tls-cert/--metrics-tls-key the endpoint speaks
//     HTTPS only (TLS 1.2 or later); a plain-HTTP request on its port gets
//     no answer. prometheus-cpp serves it through Debian's civetweb, which
//     needs civetweb_openssl3.c's two libraries to run on OpenSSL 3; they
//     are loaded from <the binary's directory>/../lib/numaserve first.
//   * Bearer tokens: with --metrics-auth-token-file every request needs
//     `Authorization: Bearer <token>` naming one of the file's tokens (the
//     --grpc-auth-token-file format, compared in constant time), else
//     401 Unauthorized. Prometheus sends it with `authorization:
//     {credentials_file: ...}` in the scrape config.
//
// With neither, /metrics is plain HTTP and open to whoever reaches the port.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/credentials.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus
struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace numaserve::serving {

struct MetricsAuthOptions {
  // PEM certificate chain and private key of the endpoint; both empty =
  // plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Bearer tokens, one a line ("NAME TOKEN" or "TOKEN"), as
  // --grpc-auth-token-file; empty = no token asked for.
  std::string token_file;
};

class MetricsAuth {
 public:
  // Reads and checks the files; errors name the option and the file (and
  // the line of a bad token). Starts nothing.
  static absl::StatusOr<std::unique_ptr<MetricsAuth>> Create(const MetricsAuthOptions& options);
  ~MetricsAuth();

  // Starts prometheus-cpp's HTTP(S) server on `address` ("127.0.0.1:8002";
  // port 0 picks one), guarded as above. This object must outlive it.
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(
      const std::string& address) const;

  bool tls() const { return !cert_chain_.empty(); }
  bool authenticates() const { return !tokens_.empty(); }

  // One line for the start-up log: "HTTPS, 2 bearer token(s)".
  std::string Describe() const;

  // Where StartExposer loads civetweb's OpenSSL 3 libraries from.
  static std::string CivetwebOpenSslDirectory();

 private:
  MetricsAuth() = default;
  struct Callbacks;
  // Sets the certificate chain and key (and TLS 1.2 at least) on a context
  // civetweb made.
  absl::Status ConfigureTls(ssl_ctx_st* ctx) const;

  std::string cert_chain_;
  std::string private_key_;
  std::vector<base::BearerToken> tokens_;
};

}  // namespace numaserve::serving
