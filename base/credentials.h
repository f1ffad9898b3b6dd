// The secrets a server is handed in files: TLS certificates and keys, and
// bearer-token files. Shared by the gRPC ports (serving/frontend/grpc_auth.h)
// and the metrics endpoint (serving/observability/metrics_auth.h), so both
// read, check and compare them the same way. Every error names the flag
// ("--grpc-tls-key FILE: ...") that gave the file.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace numaserve::base {

// The largest credential file read (a certificate chain, a key, a token list).
inline constexpr size_t kMaxCredentialFileBytes = size_t{1} << 20;

// The whole file; NOT_FOUND "--FLAG PATH: cannot open", INVALID_ARGUMENT
// when it is larger than kMaxCredentialFileBytes.
absl::StatusOr<std::string> ReadCredentialFile(const std::string& flag, const std::string& path);

// Logs a warning naming --FLAG and PATH when the file's group or others may
// read it (mode & 077): a secret should be readable by the server's user
// only (chmod 600). Nothing when it cannot be stat'ed.
void WarnIfOthersCanRead(const std::string& flag, const std::string& path);

// Checks what a TLS library would otherwise only fail on at the first
// handshake: CERT holds a PEM certificate (chain), KEY an unencrypted PEM
// private key that is the certificate's, and the certificate has not
// expired. Errors name the flag and file at fault.
absl::Status CheckCertificateAndKey(const std::string& cert_flag, const std::string& cert_path,
                                    const std::string& cert, const std::string& key_flag,
                                    const std::string& key_path, const std::string& key);

// Puts a server's certificate chain and key (PEM text CHAIN and KEY,
// checked by CheckCertificateAndKey) on an OpenSSL context, and asks for
// TLS 1.2 at least: the leaf certificate first, the rest of CHAIN sent as
// its intermediates. Errors name --CERT_FLAG or --KEY_FLAG.
absl::Status UseCertificateChainAndKey(ssl_ctx_st* ctx, const std::string& cert_flag,
                                       const std::string& chain, const std::string& key_flag,
                                       const std::string& key);

// The text of OpenSSL's oldest queued error ("not PEM" when none), and the
// queue cleared.
std::string TakeOpenSslError();

// One token of a token file and its name.
struct BearerToken {
  std::string name;
  std::string secret;
};

// The shortest token a token file may hold.
inline constexpr size_t kMinBearerTokenChars = 16;

// Parses a token file: one token a line, "NAME TOKEN" or "TOKEN" alone
// (named "line-N"); blank lines and lines starting with # are skipped.
// Tokens have at least kMinBearerTokenChars characters, names are unique,
// and at least one token is needed. Errors: "--FLAG PATH:LINE: ...".
absl::StatusOr<std::vector<BearerToken>> ParseBearerTokens(const std::string& flag,
                                                           const std::string& path,
                                                           const std::string& text);

// The name of the token an `authorization` value ("Bearer <token>", the
// scheme in any case) carries, or nullptr. Every token is compared, each in
// time that depends on its own length only, never on where `authorization`
// first differs.
const std::string* FindBearerToken(const std::vector<BearerToken>& tokens,
                                   absl::string_view authorization);

}  // namespace numaserve::base
