/* What Debian 13's civetweb needs to serve HTTPS on OpenSSL 3.
 *
 * civetweb (libcivetweb1 1.16, which serves /metrics for prometheus-cpp)
 * is built without linking OpenSSL: at its first HTTPS port it dlopen()s
 * "libcrypto.so" and "libssl.so" by those names and looks each function up
 * with dlsym() on the handles. It was built for OpenSSL 1.1's names, and one
 * of them, SSL_get_peer_certificate, is only a macro in OpenSSL 3 (for
 * SSL_get1_peer_certificate): libssl.so.3 does not export it. civetweb then
 * fails to load libssl the first time, succeeds "the second" without
 * loading it (its reference count was already taken), and the first HTTPS
 * connection calls the missing function through a NULL pointer: the whole
 * process dies (SIGSEGV). Without libssl-dev the two unversioned names do
 * not exist at all and no HTTPS port starts.
 *
 * This file is built twice, as the two libraries civetweb asks for, and
 * numaserve loads both by path before it starts an HTTPS endpoint
 * (serving/observability/metrics_auth.cc):
 *
 *   libnumaserve-civetweb-crypto.so  SONAME libcrypto.so, needs libcrypto.so.3
 *   libnumaserve-civetweb-ssl.so     SONAME libssl.so, needs libssl.so.3, and
 *                                    defines SSL_get_peer_certificate
 *
 * The dynamic loader answers a dlopen() of a bare name with an object
 * already loaded under that SONAME, so civetweb gets these two; dlsym() on
 * them searches each one and then its dependencies, where every other
 * function is OpenSSL 3's own.
 */
#include <openssl/ssl.h>

#ifdef NUMASERVE_CIVETWEB_SSL
/* OpenSSL 3 defines the old name as a macro for the new one. */
#undef SSL_get_peer_certificate

X509* SSL_get_peer_certificate(const SSL* ssl);

/* OpenSSL 1.1's SSL_get_peer_certificate, like OpenSSL 3's
 * SSL_get1_peer_certificate, returns a reference the caller frees. */
X509* SSL_get_peer_certificate(const SSL* ssl) { return SSL_get1_peer_certificate(ssl); }
#endif
