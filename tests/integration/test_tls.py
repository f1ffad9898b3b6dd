#!/usr/bin/python3
"""TLS, mutual TLS and bearer tokens on numaserve's gRPC port, against the
real server with certificates made at test time by the openssl CLI:

  * --grpc-tls-cert/--grpc-tls-key: a TLS client trusting the CA infers; a
    plaintext client, and a TLS client trusting another CA, cannot connect;
  * --grpc-tls-client-ca: a client without a certificate, or with one
    another CA signed, is refused in the handshake; one with a certificate
    the CA signed infers;
  * --grpc-auth-token-file: a call without the token, or with a wrong one,
    is UNAUTHENTICATED (inference and model management alike); with it the
    call succeeds; the standard health check stays open;
  * bad security flags (token without TLS, a key that is not the
    certificate's, a short token) stop `serve` with a message naming the
    option and the file.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
TOKEN_ALICE = "alice-0123456789abcdef0123456789abcdef"
TOKEN_BOB = "bob-fedcba9876543210fedcba9876543210"


def refused(test, call, codes=(grpc.StatusCode.UNAVAILABLE,)):
    """CALL raises an RpcError with one of CODES; returns it."""
    with test.assertRaises(grpc.RpcError) as ctx:
        call()
    test.assertIn(ctx.exception.code(), codes, ctx.exception.details())
    return ctx.exception


class TlsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_tls_")
        cls.repo = os.path.join(cls.dir, "repo")
        nc.write_default_model(cls.repo)
        cls.pki = nc.make_test_pki(os.path.join(cls.dir, "pki"))
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write("# name token\nalice %s\n\nbob %s\n" % (TOKEN_ALICE, TOKEN_BOB))
        os.chmod(cls.tokens, 0o600)
        cls.tls_args = ["--grpc-tls-cert", cls.pki["server_cert"],
                        "--grpc-tls-key", cls.pki["server_key"]]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def credentials(self, client=None, token=None, ca=None):
        cert, key = self.pki["client"][client] if client else (None, None)
        return nc.tls_credentials(ca or self.pki["ca"], cert, key, token)

    def infer_on(self, channel):
        stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
        outputs = nc.infer(stub, MODEL, {"image": nc.random_images(2)}, deadline=30)
        self.assertEqual(outputs["probabilities"].shape, (2, 10))
        return stub

    @staticmethod
    def live(channel, timeout=10):
        stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
        return stub.ServerLive(nc.pb.ServerLiveRequest(), timeout=timeout).live

    def test_tls_client_with_the_ca_infers_and_plaintext_is_refused(self):
        with nc.ServerProcess(self.repo, self.tls_args,
                              credentials=self.credentials()) as server:
            self.infer_on(server.channel())
            self.assertIn("gRPC security: TLS", server.stderr_text())
            with nc.insecure_channel(server.grpc_address) as plain:
                refused(self, lambda: self.live(plain, timeout=5))
            with server.new_channel(self.credentials(ca=self.pki["other_ca"])) as untrusted:
                refused(self, lambda: self.live(untrusted, timeout=5))

    def test_mtls_needs_a_client_certificate_the_ca_signed(self):
        args = self.tls_args + ["--grpc-tls-client-ca", self.pki["ca"]]
        with nc.ServerProcess(self.repo, args,
                              credentials=self.credentials(client="alice")) as server:
            self.infer_on(server.channel())
            with server.new_channel(self.credentials()) as anonymous:
                refused(self, lambda: self.live(anonymous, timeout=5))
            with server.new_channel(self.credentials(client="mallory")) as stranger:
                refused(self, lambda: self.live(stranger, timeout=5))
            with server.new_channel(self.credentials(client="bob")) as bob:
                self.assertTrue(self.live(bob))

    def test_token_is_needed_for_every_call_but_health(self):
        args = self.tls_args + ["--grpc-auth-token-file", self.tokens]
        with nc.ServerProcess(self.repo, args,
                              credentials=self.credentials(token=TOKEN_ALICE)) as server:
            self.infer_on(server.channel())
            with server.new_channel(self.credentials(token=TOKEN_BOB)) as bob:
                self.assertTrue(self.live(bob))
            with server.new_channel(self.credentials()) as anonymous:
                stub = nc.pb_grpc.GRPCInferenceServiceStub(anonymous)
                error = refused(self, lambda: stub.ServerLive(nc.pb.ServerLiveRequest(),
                                                              timeout=10),
                                (grpc.StatusCode.UNAUTHENTICATED,))
                self.assertIn("Bearer", error.details())
                refused(self, lambda: nc.infer(stub, MODEL, {"image": nc.random_images(1)}),
                        (grpc.StatusCode.UNAUTHENTICATED,))
                refused(self, lambda: stub.RepositoryModelUnload(
                    nc.pb.RepositoryModelUnloadRequest(model_name=MODEL), timeout=10),
                    (grpc.StatusCode.UNAUTHENTICATED,))
                # The standard health check is answered without a token.
                health = nc.health_pb_grpc.HealthStub(anonymous)
                reply = health.Check(nc.health_pb.HealthCheckRequest(service=""), timeout=10)
                self.assertEqual(reply.status, nc.health_pb.HealthCheckResponse.SERVING)
            with server.new_channel(self.credentials(token=TOKEN_ALICE + "x")) as wrong:
                refused(self, lambda: self.live(wrong), (grpc.StatusCode.UNAUTHENTICATED,))
            with server.new_channel(self.credentials(token=TOKEN_ALICE[:-1])) as short:
                refused(self, lambda: self.live(short), (grpc.StatusCode.UNAUTHENTICATED,))
            # The model is still served: the refused unload did nothing.
            self.infer_on(server.channel())

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

    def test_a_private_key_others_can_read_draws_a_warning(self):
        private = os.path.join(self.dir, "private.key")
        readable = os.path.join(self.dir, "readable.key")
        for path, mode in ((private, 0o600), (readable, 0o644)):
            shutil.copy(self.pki["server_key"], path)
            os.chmod(path, mode)
        for key, warned in ((private, False), (readable, True)):
            args = ["--max-workers", "1", "--grpc-tls-cert", self.pki["server_cert"],
                    "--grpc-tls-key", key]
            with nc.ServerProcess(self.repo, args, credentials=self.credentials()) as server:
                self.live(server.channel())
                warning = "--grpc-tls-key %s is readable by other users" % key
                self.assertEqual(warning in server.stderr_text(), warned, server.stderr_text())

    def test_bad_security_flags_are_refused_with_the_option_and_file(self):
        self.serve_fails(["--grpc-auth-token-file", self.tokens],
                         "--grpc-auth-token-file needs --grpc-tls-cert")
        self.serve_fails(["--grpc-tls-cert", self.pki["server_cert"]],
                         "--grpc-tls-cert and --grpc-tls-key")
        self.serve_fails(["--grpc-tls-client-ca", self.pki["ca"]], "--grpc-tls-client-ca needs")
        alice_cert, alice_key = self.pki["client"]["alice"]
        self.serve_fails(["--grpc-tls-cert", self.pki["server_cert"], "--grpc-tls-key", alice_key],
                         alice_key, "is not the key of the certificate")
        self.serve_fails(["--grpc-tls-cert", self.tokens, "--grpc-tls-key", alice_key],
                         self.tokens, "no PEM certificate")
        missing = os.path.join(self.dir, "missing.pem")
        self.serve_fails(self.tls_args + ["--grpc-tls-client-ca", missing], missing,
                         "cannot open")
        short = os.path.join(self.dir, "short-tokens")
        with open(short, "w") as f:
            f.write("alice %s\nbob tooshort\n" % TOKEN_ALICE)
        self.serve_fails(self.tls_args + ["--grpc-auth-token-file", short], short + ":2:",
                         "at least 16")


if __name__ == "__main__":
    unittest.main()
