#include "serving/observability/metrics_auth.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <dlfcn.h>
#include <openssl/ssl.h>
#include <prometheus/exposer.h>
#include <strings.h>
#include <unistd.h>

#include <exception>
#include <filesystem>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"

// Where the libraries of civetweb_openssl3.c lie, from the directory of the
// running binary (serving/observability/CMakeLists.txt sets it).
#ifndef NUMASERVE_CIVETWEB_OPENSSL_DIR
#define NUMASERVE_CIVETWEB_OPENSSL_DIR "../lib/numaserve"
#endif

namespace numaserve::serving {
namespace {

constexpr char kCertFlag[] = "metrics-tls-cert";
constexpr char kKeyFlag[] = "metrics-tls-key";
constexpr char kTokenFlag[] = "metrics-auth-token-file";

// Which MetricsAuth guards which civetweb context. civetweb's callbacks
// carry no pointer of ours (a context's user data is prometheus-cpp's
// CivetServer), so each context is entered here by init_context, which
// civetweb runs in the thread that starts the context before it serves any
// request, and removed by exit_context, once its threads have ended (and,
// should a start fail between the two, by ~MetricsAuth).
class GuardedContexts {
 public:
  void Add(const mg_context* context, const MetricsAuth* auth) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    guards_[context] = auth;
  }
  void Remove(const mg_context* context) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    guards_.erase(context);
  }
  void RemoveAll(const MetricsAuth* auth) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    std::erase_if(guards_, [auth](const auto& entry) { return entry.second == auth; });
  }
  const MetricsAuth* Find(const mg_context* context) ABSL_LOCKS_EXCLUDED(mu_) {
    base::MutexLock lock(&mu_);
    auto it = guards_.find(context);
    return it == guards_.end() ? nullptr : it->second;
  }

 private:
  base::Mutex mu_;
  std::map<const mg_context*, const MetricsAuth*> guards_ ABSL_GUARDED_BY(mu_);
};

GuardedContexts& Contexts() {
  // Never destroyed: a civetweb thread may still look a context up while
  // the process exits.
  static GuardedContexts* contexts = new GuardedContexts();
  return *contexts;
}

// The exposer this thread is starting (StartExposer): civetweb runs
// init_context and init_ssl in the thread that constructs it.
struct Starting {
  const MetricsAuth* auth = nullptr;
  std::string tls_error;  // why init_ssl failed, for StartExposer's error
};
thread_local Starting* starting = nullptr;

// Loads civetweb_openssl3.c's two libraries, once per process (see there
// for why), and checks that a dlopen of the names civetweb asks for now
// finds them.
absl::Status LoadCivetwebOpenSslOnce() {
  const std::string directory = MetricsAuth::CivetwebOpenSslDirectory();
  struct Library {
    const char* file;
    const char* soname;
  };
  void* ssl = nullptr;
  for (const Library& library : {Library{"libnumaserve-civetweb-crypto.so", "libcrypto.so"},
                                 Library{"libnumaserve-civetweb-ssl.so", "libssl.so"}}) {
    const std::string path = absl::StrCat(directory, "/", library.file);
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--", kCertFlag, ": HTTPS for /metrics needs ", path,
                       " (installed beside numaserve): ", dlerror()));
    }
    if (dlopen(library.soname, RTLD_NOW | RTLD_NOLOAD) != handle) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--", kCertFlag, ": another ", library.soname,
          " is already loaded in this process; civetweb would use it instead of ", path));
    }
    ssl = handle;
  }
  if (dlsym(ssl, "SSL_get_peer_certificate") == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", kCertFlag, ": ", directory,
                     "/libnumaserve-civetweb-ssl.so lacks SSL_get_peer_certificate"));
  }
  return absl::OkStatus();
}

absl::Status LoadCivetwebOpenSsl() {
  static const absl::Status* loaded = new absl::Status(LoadCivetwebOpenSslOnce());
  return *loaded;
}

// The answer to a request without the right token; civetweb closes the
// connection after it (no keep-alive).
void SendUnauthorized(mg_connection* connection, bool token_given) {
  const std::string body = token_given
                               ? "unknown bearer token\n"
                               : "this endpoint needs one 'Authorization: Bearer <token>' header\n";
  const std::string head = absl::StrCat(
      "HTTP/1.1 401 Unauthorized\r\n", "WWW-Authenticate: Bearer realm=\"numaserve metrics\"",
      token_given ? ", error=\"invalid_token\"" : "", "\r\n",
      "Content-Type: text/plain; charset=utf-8\r\n", "Content-Length: ", body.size(), "\r\n",
      "Connection: close\r\n\r\n");
  mg_write(connection, head.data(), head.size());
  mg_write(connection, body.data(), body.size());
}

}  // namespace

// civetweb's callbacks (plain functions), with access to the guard's secrets.
struct MetricsAuth::Callbacks {
  static void InitContext(const mg_context* context) {
    if (starting != nullptr) Contexts().Add(context, starting->auth);
  }

  static void ExitContext(const mg_context* context) { Contexts().Remove(context); }

  // The certificate chain and key, from memory: the files were read and
  // checked once, by Create. 1: done; -1: civetweb fails to start.
  static int InitSsl(void* ssl_ctx, void* /*civet_server*/) {
    if (starting == nullptr) return -1;
    absl::Status s = starting->auth->ConfigureTls(static_cast<SSL_CTX*>(ssl_ctx));
    if (!s.ok()) {
      starting->tls_error = std::string(s.message());
      return -1;
    }
    return 1;
  }

  // 0: civetweb serves the request; 401: answered here.
  static int BeginRequest(mg_connection* connection) {
    const MetricsAuth* auth = Contexts().Find(mg_get_context(connection));
    const mg_request_info* request = mg_get_request_info(connection);
    const char* authorization = nullptr;
    int headers = 0;
    for (int i = 0; request != nullptr && i < request->num_headers; ++i) {
      if (strcasecmp(request->http_headers[i].name, "Authorization") == 0) {
        authorization = request->http_headers[i].value;
        ++headers;
      }
    }
    if (auth != nullptr && headers == 1 && authorization != nullptr &&
        base::FindBearerToken(auth->tokens_, authorization) != nullptr) {
      return 0;
    }
    SendUnauthorized(connection, headers > 0);
    return 401;
  }
};

absl::StatusOr<std::unique_ptr<MetricsAuth>> MetricsAuth::Create(const MetricsAuthOptions& o) {
  std::unique_ptr<MetricsAuth> auth(new MetricsAuth());
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", kCertFlag, " and --", kKeyFlag, " go together"));
  }
  if (!o.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = base::ReadCredentialFile(kCertFlag, o.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = base::ReadCredentialFile(kKeyFlag, o.tls_key_file);
    if (!key.ok()) return key.status();
    if (absl::Status s = base::CheckCertificateAndKey(kCertFlag, o.tls_cert_file, *cert, kKeyFlag,
                                                      o.tls_key_file, *key);
        !s.ok()) {
      return s;
    }
    base::WarnIfOthersCanRead(kKeyFlag, o.tls_key_file);
    auth->cert_chain_ = std::move(*cert);
    auth->private_key_ = std::move(*key);
  }
  if (!o.token_file.empty()) {
    absl::StatusOr<std::string> text = base::ReadCredentialFile(kTokenFlag, o.token_file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<base::BearerToken>> tokens =
        base::ParseBearerTokens(kTokenFlag, o.token_file, *text);
    if (!tokens.ok()) return tokens.status();
    auth->tokens_ = std::move(*tokens);
    base::WarnIfOthersCanRead(kTokenFlag, o.token_file);
  }
  return auth;
}

MetricsAuth::~MetricsAuth() { Contexts().RemoveAll(this); }

absl::Status MetricsAuth::ConfigureTls(SSL_CTX* ctx) const {
  return base::UseCertificateChainAndKey(ctx, kCertFlag, cert_chain_, kKeyFlag, private_key_);
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> MetricsAuth::StartExposer(
    const std::string& address) const {
  if (tls()) {
    if (absl::Status s = LoadCivetwebOpenSsl(); !s.ok()) return s;
  }
  // prometheus-cpp's own options for an address, with civetweb's "s"
  // (HTTPS only on that port) and TLS 1.2 or later ("4").
  std::vector<std::string> options = {"listening_ports", tls() ? address + "s" : address,
                                      "num_threads", "2"};
  if (tls()) options.insert(options.end(), {"ssl_protocol_version", "4"});
  CivetCallbacks callbacks;
  callbacks.init_context = &Callbacks::InitContext;
  callbacks.exit_context = &Callbacks::ExitContext;
  if (tls()) callbacks.init_ssl = &Callbacks::InitSsl;
  if (authenticates()) callbacks.begin_request = &Callbacks::BeginRequest;
  Starting state{.auth = this};
  starting = &state;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(options, &callbacks);
  } catch (const std::exception& e) {
    starting = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", e.what(),
                                               state.tls_error.empty() ? "" : ": ",
                                               state.tls_error));
  }
  starting = nullptr;
  return exposer;
}

std::string MetricsAuth::Describe() const {
  std::string out = tls() ? "HTTPS" : "plain HTTP";
  if (authenticates()) {
    absl::StrAppend(&out, ", ", tokens_.size(), " bearer token(s)");
  } else {
    absl::StrAppend(&out, ", no authentication");
  }
  return out;
}

std::string MetricsAuth::CivetwebOpenSslDirectory() {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return NUMASERVE_CIVETWEB_OPENSSL_DIR;
  const std::filesystem::path binary(std::string(self, static_cast<size_t>(len)));
  return (binary.parent_path() / NUMASERVE_CIVETWEB_OPENSSL_DIR).lexically_normal().string();
}

}  // namespace numaserve::serving
