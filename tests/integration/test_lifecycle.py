#!/usr/bin/python3
"""Model lifecycle against the real server: in poll mode a new version
dropped into the repository is served without a failed request and a broken
one leaves the previous version serving with the reason in RepositoryIndex;
an edited config.pbtxt is applied the same way, and a bad edit keeps the
previous config serving; in explicit mode RepositoryModelLoad /
RepositoryModelUnload load (or reload) and drain models."""

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

NAME = "mlp"
WIDTH = 64
RTOL, ATOL = 1e-4, 1e-5


def model_version(seed):
    return nc.deep_mlp_model(WIDTH, 2, seed=seed)


def publish(repo, name, version, model=None, raw=None):
    """Writes a version into a hidden directory, then renames it into place,
    so a poll never sees half a file."""
    import onnx

    staging = os.path.join(repo, name, ".staging-%d" % version)
    os.makedirs(staging)
    path = os.path.join(staging, "model.onnx")
    if model is not None:
        onnx.save(model, path)
    else:
        with open(path, "wb") as f:
            f.write(raw)
    os.rename(staging, os.path.join(repo, name, str(version)))


def replace_config(repo, name, text):
    """Writes DIR/NAME/config.pbtxt under another name, then renames it into
    place, so a poll never reads half of it."""
    path = os.path.join(repo, name, "config.pbtxt")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


index = nc.repository_index


class PollModeTest(unittest.TestCase):

    def test_new_version_is_served_without_a_failed_request(self):
        repo = tempfile.mkdtemp(prefix="numaserve_poll_")
        try:
            models = {1: model_version(11), 2: model_version(12)}
            nc.write_model(repo, NAME, models[1], version=1)
            x = np.random.default_rng(4).random((3, WIDTH), dtype=np.float32)
            expected = {v: nc.ReferenceModel(m).run({"x": x})["y"] for v, m in models.items()}
            self.assertFalse(np.allclose(expected[1], expected[2]))
            with nc.ServerProcess(repo, ["--model-control-mode", "poll",
                                         "--repository-poll-secs", "1"]) as server:
                stub = server.stub()
                outcomes = []
                lock = threading.Lock()
                stop = threading.Event()

                def caller():
                    channel = server.new_channel()
                    s = nc.pb_grpc.GRPCInferenceServiceStub(channel)
                    while not stop.is_set():
                        try:
                            response = s.ModelInfer(nc.make_request(NAME, {"x": x}), timeout=30)
                            version = int(response.model_version)
                            y = nc.decode_outputs(response)["y"]
                            right = np.allclose(y, expected[version], rtol=RTOL, atol=ATOL)
                            outcome = version if right else "wrong rows for v%d" % version
                        except grpc.RpcError as e:
                            outcome = "%s: %s" % (e.code().name, e.details())
                        with lock:
                            outcomes.append(outcome)
                    channel.close()

                threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
                for t in threads:
                    t.start()
                time.sleep(0.5)
                publish(repo, NAME, 2, model=models[2])
                switched = nc.wait_until(
                    lambda: index(stub).get((NAME, "2"), ("",))[0] == "READY"
                    and index(stub).get((NAME, "1"), ("",))[0] == "UNAVAILABLE", timeout=30)
                time.sleep(0.5)
                stop.set()
                for t in threads:
                    t.join(30)
                self.assertTrue(switched, "version 2 not served within 30 s: %r\n%s"
                                % (index(stub), server.stderr_text(3000)))
                failures = [o for o in outcomes if not isinstance(o, int)]
                self.assertEqual(failures, [], "requests failed during the switch")
                self.assertIn(1, outcomes)
                self.assertIn(2, outcomes)
                # After the switch the new version answers every call.
                self.assertEqual(outcomes[-1], 2)
                self.assertEqual(index(stub)[(NAME, "1")], ("UNAVAILABLE", "unloaded"))

                # A broken version 3: version 2 keeps serving, the index says why.
                publish(repo, NAME, 3, raw=b"this is not an onnx file")
                failed = nc.wait_until(
                    lambda: index(stub).get((NAME, "3"), ("",))[0] == "UNAVAILABLE", timeout=30)
                self.assertTrue(failed, "version 3 never reported: %r" % index(stub))
                _, reason = index(stub)[(NAME, "3")]
                self.assertTrue(reason, "no reason for the failed version 3")
                self.assertEqual(index(stub)[(NAME, "2")][0], "READY")
                response = stub.ModelInfer(nc.make_request(NAME, {"x": x}), timeout=30)
                self.assertEqual(response.model_version, "2")
                np.testing.assert_allclose(nc.decode_outputs(response)["y"], expected[2],
                                           rtol=RTOL, atol=ATOL)
                # Explicit load requests are refused in poll mode.
                with self.assertRaises(grpc.RpcError) as caught:
                    stub.RepositoryModelLoad(nc.pb.RepositoryModelLoadRequest(model_name=NAME),
                                             timeout=10)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        finally:
            shutil.rmtree(repo, ignore_errors=True)


class ConfigEditTest(unittest.TestCase):
    """Poll mode: an edited config.pbtxt of a served version is applied (the
    version loads again with it and traffic switches without a failed
    request); an edit that does not validate leaves the previous config
    serving, with the reason in RepositoryIndex."""

    def test_edited_config_is_applied_and_a_bad_edit_keeps_the_old_one(self):
        repo = tempfile.mkdtemp(prefix="numaserve_config_edit_")
        try:
            model = model_version(31)
            nc.write_model(repo, NAME, model, version=1)
            replace_config(repo, NAME,
                           "max_batch_size: 4\n"
                           "dynamic_batching { max_queue_delay_microseconds: 100 }\n")
            rng = np.random.default_rng(6)
            x2 = rng.random((2, WIDTH), dtype=np.float32)
            x6 = rng.random((6, WIDTH), dtype=np.float32)
            reference = nc.ReferenceModel(model)
            expected2 = reference.run({"x": x2})["y"]
            expected6 = reference.run({"x": x6})["y"]
            with nc.ServerProcess(repo, ["--model-control-mode", "poll",
                                         "--repository-poll-secs", "1"]) as server:
                stub = server.stub()

                def config():
                    return stub.ModelConfig(nc.pb.ModelConfigRequest(name=NAME),
                                            timeout=10).config

                self.assertEqual(config().max_batch_size, 4)
                with self.assertRaises(grpc.RpcError) as caught:
                    nc.infer(stub, NAME, {"x": x6})
                self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

                # Callers keep sending 2-row requests (valid under both
                # configs) while the edit is picked up.
                outcomes = []
                lock = threading.Lock()
                stop = threading.Event()

                def caller():
                    channel = server.new_channel()
                    s = nc.pb_grpc.GRPCInferenceServiceStub(channel)
                    while not stop.is_set():
                        try:
                            y = nc.decode_outputs(
                                s.ModelInfer(nc.make_request(NAME, {"x": x2}), timeout=30))["y"]
                            outcome = ("ok" if np.allclose(y, expected2, rtol=RTOL, atol=ATOL)
                                       else "wrong rows")
                        except grpc.RpcError as e:
                            outcome = "%s: %s" % (e.code().name, e.details())
                        with lock:
                            outcomes.append(outcome)
                    channel.close()

                threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
                for t in threads:
                    t.start()
                time.sleep(0.5)
                replace_config(repo, NAME,
                               "max_batch_size: 8\n"
                               "dynamic_batching { max_queue_delay_microseconds: 200 "
                               "preferred_batch_size: [ 2 ] }\n")
                switched = nc.wait_until(lambda: config().max_batch_size == 8, timeout=30)
                time.sleep(0.5)
                stop.set()
                for t in threads:
                    t.join(30)
                self.assertTrue(switched, "the edited config was not applied within 30 s\n"
                                + server.stderr_text(3000))
                failures = [o for o in outcomes if o != "ok"]
                self.assertEqual(failures, [], "requests failed during the reload")
                self.assertGreater(len(outcomes), 0)
                self.assertEqual(list(config().dynamic_batching.preferred_batch_size), [2])
                self.assertEqual(config().dynamic_batching.max_queue_delay_microseconds, 200)
                np.testing.assert_allclose(nc.infer(stub, NAME, {"x": x6})["y"], expected6,
                                           rtol=RTOL, atol=ATOL)
                self.assertEqual(index(stub)[(NAME, "1")], ("READY", ""))
                self.assertIn("reloaded with its edited config.pbtxt", server.stderr_text(0))

                # Edits that do not validate: one that does not parse, one that
                # contradicts the ONNX file. Each time the previous config keeps
                # serving and the index says why.
                for text, mentions in (
                        ("max_batch_size: 16\nmax_batch_sise: 4\n", "max_batch_sise"),
                        ('max_batch_size: 16\ninput { name: "pixels" data_type: "FP32" }\n',
                         "pixels")):
                    replace_config(repo, NAME, text)
                    reported = nc.wait_until(
                        lambda: mentions in index(stub)[(NAME, "1")][1], timeout=30)
                    self.assertTrue(reported, "no reason for the bad edit: %r\n%s"
                                    % (index(stub), server.stderr_text(3000)))
                    state, reason = index(stub)[(NAME, "1")]
                    self.assertEqual(state, "READY", reason)
                    self.assertIn("not applied", reason)
                    self.assertEqual(config().max_batch_size, 8)
                    np.testing.assert_allclose(nc.infer(stub, NAME, {"x": x6})["y"], expected6,
                                               rtol=RTOL, atol=ATOL)

                # Fixed: applied, and the reason is gone.
                replace_config(repo, NAME, "max_batch_size: 16\n")
                self.assertTrue(nc.wait_until(lambda: config().max_batch_size == 16, timeout=30),
                                server.stderr_text(3000))
                self.assertFalse(config().HasField("dynamic_batching"))
                self.assertEqual(index(stub)[(NAME, "1")], ("READY", ""))
                np.testing.assert_allclose(nc.infer(stub, NAME, {"x": x6})["y"], expected6,
                                           rtol=RTOL, atol=ATOL)
        finally:
            shutil.rmtree(repo, ignore_errors=True)


class ExplicitModeTest(unittest.TestCase):

    def test_sigterm_answers_load_requests_in_progress_and_queued(self):
        """Loads run one at a time on a thread the server owns: at SIGTERM
        the load under way finishes and is answered OK, the ones waiting
        for it are refused UNAVAILABLE, none is left hanging or cancelled,
        and the server exits 0."""
        repo = tempfile.mkdtemp(prefix="numaserve_load_shutdown_")
        names = ["slow%d" % i for i in range(3)]
        try:
            # 64 layers of 1024 x 1024: a load that takes a while.
            model = nc.deep_mlp_model(1024, 64, seed=40)
            for name in names:
                nc.write_model(repo, name, model)
            server = nc.ServerProcess(repo, ["--model-control-mode", "explicit"]).start()
            try:
                stub = server.stub()
                calls = [stub.RepositoryModelLoad.future(
                    nc.pb.RepositoryModelLoadRequest(model_name=name), timeout=120)
                    for name in names]
                started = nc.wait_until(
                    lambda: any(state in ("LOADING", "READY") for (n, _), (state, _r)
                                in index(stub).items() if n in names), timeout=60)
                self.assertTrue(started, "no load started: %r" % index(stub))
                os.kill(server.pid, signal.SIGTERM)
                outcomes = []
                for call in calls:
                    try:
                        call.result(timeout=120)
                        outcomes.append((grpc.StatusCode.OK, ""))
                    except grpc.FutureTimeoutError:
                        outcomes.append(("hanging", ""))
                    except grpc.RpcError as e:
                        outcomes.append((e.code(), e.details()))
            finally:
                code = server.stop()
            log = "\n--- server stderr ---\n" + server.stderr_text(4000)
            self.assertIn((grpc.StatusCode.OK, ""), outcomes, repr(outcomes) + log)
            for status, details in outcomes:
                if status != grpc.StatusCode.OK:
                    self.assertEqual(status, grpc.StatusCode.UNAVAILABLE, repr(outcomes) + log)
                    self.assertIn("shutting down", details)
            self.assertEqual(code, 0, "exit code after SIGTERM" + log)
        finally:
            shutil.rmtree(repo, ignore_errors=True)

    def test_load_and_unload_by_request(self):
        repo = tempfile.mkdtemp(prefix="numaserve_explicit_")
        try:
            model = model_version(21)
            nc.write_model(repo, NAME, model, version=1)
            x = np.random.default_rng(5).random((2, WIDTH), dtype=np.float32)
            expected = nc.ReferenceModel(model).run({"x": x})["y"]
            with nc.ServerProcess(repo, ["--model-control-mode", "explicit"]) as server:
                stub = server.stub()
                ready = lambda: stub.ModelReady(nc.pb.ModelReadyRequest(name=NAME),
                                                timeout=10).ready
                self.assertFalse(ready())
                self.assertEqual(index(stub)[(NAME, "")][0], "UNAVAILABLE")

                stub.RepositoryModelLoad(nc.pb.RepositoryModelLoadRequest(model_name=NAME),
                                         timeout=120)
                self.assertTrue(ready())
                self.assertEqual(index(stub)[(NAME, "1")], ("READY", ""))
                np.testing.assert_allclose(nc.infer(stub, NAME, {"x": x})["y"], expected,
                                           rtol=RTOL, atol=ATOL)

                held = lambda: {name: server.metrics().find(name, model=NAME)
                                for name in ("numaserve_model_weight_bytes",
                                             "numaserve_model_load_duration_seconds")}
                self.assertTrue(all(held().values()), held())

                stub.RepositoryModelUnload(nc.pb.RepositoryModelUnloadRequest(model_name=NAME),
                                           timeout=60)
                self.assertFalse(ready())
                self.assertEqual(index(stub)[(NAME, "1")], ("UNAVAILABLE", "unloaded"))
                # The weights are no longer held: their series went with them.
                self.assertEqual(held(), {"numaserve_model_weight_bytes": [],
                                          "numaserve_model_load_duration_seconds": []})
                with self.assertRaises(grpc.RpcError) as caught:
                    nc.infer(stub, NAME, {"x": x})
                self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)

                # Loading again serves again.
                stub.RepositoryModelLoad(nc.pb.RepositoryModelLoadRequest(model_name=NAME),
                                         timeout=120)
                np.testing.assert_allclose(nc.infer(stub, NAME, {"x": x})["y"], expected,
                                           rtol=RTOL, atol=ATOL)
                with self.assertRaises(grpc.RpcError) as caught:
                    stub.RepositoryModelLoad(
                        nc.pb.RepositoryModelLoadRequest(model_name="no_such_model"),
                        timeout=60)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)
                self.assertNotIn(("no_such_model", ""), index(stub))

                # An edited config is applied by the next load request; one
                # that does not parse is refused and the old one keeps serving.
                config = lambda: stub.ModelConfig(nc.pb.ModelConfigRequest(name=NAME),
                                                  timeout=10).config
                self.assertEqual(config().max_batch_size, 0)
                replace_config(repo, NAME, "max_batch_size: 4\n")
                stub.RepositoryModelLoad(nc.pb.RepositoryModelLoadRequest(model_name=NAME),
                                         timeout=120)
                self.assertEqual(config().max_batch_size, 4)
                replace_config(repo, NAME, "max_batch_size: [\n")
                with self.assertRaises(grpc.RpcError) as caught:
                    stub.RepositoryModelLoad(nc.pb.RepositoryModelLoadRequest(model_name=NAME),
                                             timeout=120)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("config.pbtxt", caught.exception.details())
                self.assertEqual(config().max_batch_size, 4)
                state, reason = index(stub)[(NAME, "1")]
                self.assertEqual(state, "READY")
                self.assertIn("not applied", reason)
                np.testing.assert_allclose(nc.infer(stub, NAME, {"x": x})["y"], expected,
                                           rtol=RTOL, atol=ATOL)
        finally:
            shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
