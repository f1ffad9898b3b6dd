#!/usr/bin/python3
"""HTTPS and bearer tokens on numaserve's /metrics endpoint, against the real
server, with certificates made at test time by the openssl CLI:

  * --metrics-tls-cert/--metrics-tls-key: an HTTPS client trusting the CA
    scrapes, again and again, and the page passes `promtool check metrics`
    (on Debian 13's civetweb the first HTTPS request used to kill the
    server: serving/observability/civetweb_openssl3.c); a plain-HTTP
    request on that port gets no HTTP answer and no metrics; a client
    trusting another CA fails the handshake, and so does one that offers
    TLS 1.1 at most;
  * --metrics-auth-token-file: a scrape without the token, with a wrong one,
    with two Authorization headers or with Basic credentials is 401 with a
    `WWW-Authenticate: Bearer` challenge and no metrics; with either token
    of the file it is served; over HTTPS, and over plain HTTP on loopback;
  * the server goes on serving gRPC and /metrics after all of that;
  * bad flags (a certificate without its key, a key that is not the
    certificate's, a file that is not PEM, a missing file, a short token, a
    token without HTTPS on an address other machines reach) stop `serve`
    with a message naming the option and the file.
"""

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
TOKEN_PROMETHEUS = "prometheus-0123456789abcdef0123456789abcdef"
TOKEN_AGENT = "agent-fedcba9876543210fedcba9876543210"
# The libraries the server loads for HTTPS (civetweb_openssl3.c).
CIVETWEB_OPENSSL = ("libnumaserve-civetweb-ssl.so", "libnumaserve-civetweb-crypto.so")


def https_context(ca, maximum_version=None):
    context = ssl.create_default_context(cafile=ca)
    # Python 3.13 verifies strictly by default and wants a keyUsage in the
    # CA certificate, which make_test_pki's CAs (openssl req -x509) lack.
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if maximum_version is not None:
        context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        context.maximum_version = maximum_version
        # OpenSSL 3's default security level refuses TLS 1.1 in the client
        # too; level 0 lets it offer it, so the refusal is the server's.
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def get(port, path="/metrics", context=None, headers=None, timeout=10):
    """(status, headers, body) of GET PATH on 127.0.0.1:PORT, over HTTPS
    with CONTEXT, else plain HTTP. HEADERS: [(name, value)], repeats kept."""
    if context is not None:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                                 context=context)
    else:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.putrequest("GET", path)
        for name, value in headers or ():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.headers, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def bearer(token):
    return [("Authorization", "Bearer " + token)]


def raw_exchange(port, data, timeout=10):
    """Sends DATA to 127.0.0.1:PORT and returns what comes back until the
    server closes the connection (or resets it)."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                received += chunk
        except ConnectionResetError:
            pass
    return received


class MetricsSecurityTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_metrics_security_")
        cls.repo = os.path.join(cls.dir, "repo")
        nc.write_default_model(cls.repo)
        cls.pki = nc.make_test_pki(os.path.join(cls.dir, "pki"))
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write("# name token\nprometheus %s\n\n%s\n" % (TOKEN_PROMETHEUS, TOKEN_AGENT))
        os.chmod(cls.tokens, 0o600)
        cls.tls_args = ["--metrics-tls-cert", cls.pki["server_cert"],
                        "--metrics-tls-key", cls.pki["server_key"]]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def context(self):
        return https_context(self.pki["ca"])

    def assert_served(self, status, body):
        self.assertEqual(status, 200, body)
        self.assertIn("numaserve_worker_ready", body)

    def assert_unauthorized(self, answer, invalid_token):
        status, headers, body = answer
        self.assertEqual(status, 401, body)
        challenge = headers.get("WWW-Authenticate", "")
        self.assertTrue(challenge.startswith("Bearer "), challenge)
        self.assertEqual('error="invalid_token"' in challenge, invalid_token, challenge)
        self.assertNotIn("numaserve_", body)

    def assert_still_serving(self, server, context=None, headers=None):
        self.assertIsNone(server.proc.poll(), server.stderr_text())
        stub = server.stub()
        self.assertTrue(stub.ServerLive(nc.pb.ServerLiveRequest(), timeout=10).live)
        status, _, body = get(server.metrics_port, context=context, headers=headers)
        self.assert_served(status, body)

    def test_https_serves_the_page_and_plain_http_gets_nothing(self):
        with nc.ServerProcess(self.repo, ["--max-workers", "1"] + self.tls_args) as server:
            self.assertIn("metrics security: HTTPS, no authentication", server.stderr_text())
            maps = open("/proc/%d/maps" % server.pid).read()
            for library in CIVETWEB_OPENSSL:
                self.assertIn(library, maps)
            nc.infer(server.stub(), nc.DEFAULT_MODEL_NAME, {"image": nc.random_images(2)})
            # Several scrapes, each on a new connection (and handshake).
            for _ in range(5):
                status, _, body = get(server.metrics_port, context=self.context())
                self.assert_served(status, body)
            check = subprocess.run([PROMTOOL, "check", "metrics"], input=body,
                                   capture_output=True, text=True, timeout=60)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
            # Plain HTTP on the HTTPS port: no HTTP answer, no metrics.
            answer = raw_exchange(server.metrics_port,
                                  b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            self.assertFalse(answer.startswith(b"HTTP/"), answer[:200])
            self.assertNotIn(b"numaserve_", answer)
            with self.assertRaises((http.client.HTTPException, OSError)):
                get(server.metrics_port)
            # A client trusting another CA, and one offering at most TLS 1.1.
            with self.assertRaises(ssl.SSLError):
                get(server.metrics_port, context=https_context(self.pki["other_ca"]))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TLSVersion.TLSv1_1
                old = https_context(self.pki["ca"], ssl.TLSVersion.TLSv1_1)
            with self.assertRaises((ssl.SSLError, ConnectionResetError)):
                get(server.metrics_port, context=old)
            self.assert_still_serving(server, context=self.context())

    def check_tokens(self, server, context):
        port = server.metrics_port
        self.assert_unauthorized(get(port, context=context), invalid_token=False)
        self.assert_unauthorized(get(port, context=context, headers=bearer(TOKEN_PROMETHEUS + "x")),
                                 invalid_token=True)
        self.assert_unauthorized(get(port, context=context, headers=bearer(TOKEN_PROMETHEUS[:-1])),
                                 invalid_token=True)
        self.assert_unauthorized(
            get(port, context=context,
                headers=bearer(TOKEN_PROMETHEUS) + bearer(TOKEN_PROMETHEUS)),
            invalid_token=True)
        basic = [("Authorization", "Basic cHJvbWV0aGV1czo=")]  # prometheus:
        self.assert_unauthorized(get(port, context=context, headers=basic), invalid_token=True)
        # Any path: the token is checked before civetweb looks at it.
        self.assert_unauthorized(get(port, "/", context=context), invalid_token=False)
        for token in (TOKEN_PROMETHEUS, TOKEN_AGENT):
            status, _, body = get(port, context=context, headers=bearer(token))
            self.assert_served(status, body)
        # The scheme in any case, as RFC 7235 has it.
        status, _, body = get(port, context=context,
                              headers=[("Authorization", "bearer " + TOKEN_AGENT)])
        self.assert_served(status, body)
        self.assert_still_serving(server, context=context, headers=bearer(TOKEN_AGENT))

    def test_token_over_https(self):
        args = ["--max-workers", "1", "--metrics-auth-token-file", self.tokens] + self.tls_args
        with nc.ServerProcess(self.repo, args) as server:
            self.assertIn("metrics security: HTTPS, 2 bearer token(s)", server.stderr_text())
            self.check_tokens(server, self.context())

    def test_token_over_plain_http_on_loopback(self):
        args = ["--max-workers", "1", "--metrics-auth-token-file", self.tokens]
        with nc.ServerProcess(self.repo, args) as server:
            self.assertIn("metrics security: plain HTTP, 2 bearer token(s)", server.stderr_text())
            self.check_tokens(server, None)

    def serve_fails(self, args, *mentions):
        result = subprocess.run([nc.default_binary(), "serve", "--model-repository", self.repo,
                                 "--grpc-port", "0", "--metrics-port", "0"] + args,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=60)
        self.assertNotEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("grpc=", result.stdout)
        for m in mentions:
            self.assertIn(m, result.stderr)
        return result.stderr

    def test_bad_flags_are_refused_with_the_option_and_file(self):
        cert, key = self.pki["server_cert"], self.pki["server_key"]
        alice_cert, alice_key = self.pki["client"]["alice"]
        self.serve_fails(["--metrics-tls-cert", cert], "--metrics-tls-cert and --metrics-tls-key")
        self.serve_fails(["--metrics-tls-key", key], "--metrics-tls-cert and --metrics-tls-key")
        self.serve_fails(["--metrics-tls-cert", cert, "--metrics-tls-key", alice_key],
                         "--metrics-tls-key " + alice_key, "is not the key of the certificate")
        self.serve_fails(["--metrics-tls-cert", self.tokens, "--metrics-tls-key", key],
                         "--metrics-tls-cert " + self.tokens, "no PEM certificate")
        self.serve_fails(["--metrics-tls-cert", cert, "--metrics-tls-key", alice_cert],
                         "--metrics-tls-key " + alice_cert, "no unencrypted PEM private key")
        missing = os.path.join(self.dir, "missing.pem")
        self.serve_fails(["--metrics-tls-cert", missing, "--metrics-tls-key", key],
                         "--metrics-tls-cert " + missing, "cannot open")
        self.serve_fails(self.tls_args + ["--metrics-auth-token-file", missing],
                         "--metrics-auth-token-file " + missing, "cannot open")
        short = os.path.join(self.dir, "short-tokens")
        with open(short, "w") as f:
            f.write("prometheus %s\nagent tooshort\n" % TOKEN_PROMETHEUS)
        self.serve_fails(self.tls_args + ["--metrics-auth-token-file", short],
                         "--metrics-auth-token-file " + short + ":2:", "at least 16")
        # A token over plain HTTP where other machines may listen in.
        self.serve_fails(["--metrics-address", "0.0.0.0:0", "--metrics-auth-token-file",
                          self.tokens],
                         "--metrics-auth-token-file needs --metrics-tls-cert", "0.0.0.0")
        self.serve_fails(["--host", "0.0.0.0", "--metrics-auth-token-file", self.tokens],
                         "--metrics-auth-token-file needs --metrics-tls-cert")

    def test_readable_secrets_draw_a_warning(self):
        readable = os.path.join(self.dir, "readable-tokens")
        shutil.copy(self.tokens, readable)
        os.chmod(readable, 0o644)
        args = ["--max-workers", "1", "--metrics-auth-token-file", readable]
        with nc.ServerProcess(self.repo, args) as server:
            self.assertIn("--metrics-auth-token-file %s is readable by other users" % readable,
                          server.stderr_text())


if __name__ == "__main__":
    unittest.main()
