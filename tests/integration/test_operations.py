#!/usr/bin/python3
"""Server operations: JSON logs and log levels (every line the server, its
worker supervisor, its worker processes, the kernels in them and its
training ranks write is a record), the config file (and flags overriding
it), --version, --metrics-address, and gRPC server reflection (with
Debian's grpcurl when it is installed, else through grpcio with message
classes compiled from a small copy of reflection.proto)."""

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

TIMEOUT_S = 60
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
LEVELS = ("debug", "info", "warning", "error")
VERSION = re.compile(r"^numaserve \d+\.\d+\.\d+ \(git \S+, isa (avx512|avx2|scalar)\b.*\)$")
MODEL = nc.DEFAULT_MODEL_NAME
INFERENCE_SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"

# The part of grpc/reflection/v1alpha/reflection.proto these tests speak
# (field numbers as in gRPC's file; Debian packages neither the file nor
# python3-grpcio-reflection).
REFLECTION_PROTO = """
syntax = "proto3";
package grpc.reflection.v1alpha;
message ServerReflectionRequest {
  string host = 1;
  oneof message_request {
    string file_by_filename = 3;
    string file_containing_symbol = 4;
    string list_services = 7;
  }
}
message FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ServiceResponse { string name = 1; }
message ErrorResponse { int32 error_code = 1; string error_message = 2; }
message ServerReflectionResponse {
  string valid_host = 1;
  ServerReflectionRequest original_request = 2;
  oneof message_response {
    FileDescriptorResponse file_descriptor_response = 4;
    ListServiceResponse list_services_response = 6;
    ErrorResponse error_response = 7;
  }
}
"""


_reflection_pb = None


def reflection_messages():
    """The reflection message module, compiled once from REFLECTION_PROTO."""
    global _reflection_pb
    if _reflection_pb is not None:
        return _reflection_pb
    from grpc_tools import protoc
    out_dir = tempfile.mkdtemp(prefix="numaserve_reflection_")
    atexit.register(shutil.rmtree, out_dir, ignore_errors=True)
    proto = os.path.join(out_dir, "numaserve_test_reflection.proto")
    with open(proto, "w") as f:
        f.write(REFLECTION_PROTO)
    rc = protoc.main(["grpc_tools.protoc", "-I" + out_dir, "--python_out=" + out_dir, proto])
    if rc != 0:
        raise RuntimeError("grpc_tools.protoc failed (%d) on %s" % (rc, proto))
    sys.path.insert(0, out_dir)
    import numaserve_test_reflection_pb2 as reflection_pb  # noqa: E402
    _reflection_pb = reflection_pb
    return reflection_pb


def reflect(channel, reflection_pb, requests):
    """Sends REQUESTS on one ServerReflectionInfo stream; the responses."""
    call = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb.ServerReflectionResponse.FromString)
    return list(call(iter(requests), timeout=TIMEOUT_S))


def run(*args, timeout=TIMEOUT_S):
    return nc.run_numaserve(args, timeout=timeout)


describe = nc.describe_run


def json_records(text):
    """The JSON records of a log (lines starting with '{'), each parsed."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def all_records(test, log):
    """Every line of LOG as a record; fails TEST on a line that is not a JSON
    object with a ts, a level, a component and a msg."""
    records = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError as e:
            test.fail("not JSON (%s): %r\n%s" % (e, line, log[-20000:]))
        test.assertIsInstance(record, dict, line)
        for key in ("ts", "level", "component", "msg"):
            test.assertIn(key, record, line)
        test.assertRegex(record["ts"], TIMESTAMP, line)
        test.assertIn(record["level"], LEVELS, line)
        test.assertIsInstance(record["component"], str, line)
        test.assertIsInstance(record["msg"], str, line)
        records.append(record)
    return records


def usable_cpus():
    return len(os.sched_getaffinity(0))


def free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def setUpModule():
    global REPO
    REPO = tempfile.mkdtemp(prefix="numaserve_operations_")
    nc.write_default_model(REPO)


def tearDownModule():
    shutil.rmtree(REPO, ignore_errors=True)


class LogTest(unittest.TestCase):

    def serve_and_stop(self, *args):
        """Starts a server with ARGS, stops it; its whole stderr."""
        server = nc.ServerProcess(REPO, list(args))
        with server:
            pass
        return server.stderr_text(0)

    def test_json_lines(self):
        """Two workers (--domain core), a request, a worker killed with
        SIGKILL (the supervisor restarts it), a bad request: every line the
        process tree wrote is a record, the workers' and the supervisor's
        among them, each worker's (its kernels' too) naming its index and
        pid; the workers log at debug too (the server passes its log options
        on their command lines)."""
        server = nc.ServerProcess(REPO, ["--log-format", "json", "--log-level", "debug",
                                         "--domain", "core", "--max-workers", "2"])
        workers = min(2, usable_cpus())
        with server:
            stub = server.stub()
            images = nc.random_images(2, seed=3)
            self.assertEqual(nc.infer(stub, MODEL, {"image": images})["probabilities"].shape,
                             (2, 10))
            first = server.worker_pids()
            self.assertEqual(len(first), workers, server.stderr_text())
            victim = max(first)
            os.kill(victim, signal.SIGKILL)

            def restarted():
                records = json_records(server.stderr_text(0))
                lost = any(r["component"] == "supervisor" and r.get("pid") == victim
                           and r["msg"].endswith("; restarting") for r in records)
                # The new worker has loaded the model again.
                loaded = any(r["component"] == "worker" and r.get("pid") not in first
                             and r["level"] == "debug" and " loaded: " in r["msg"]
                             for r in records)
                return lost and loaded
            self.assertTrue(nc.wait_until(restarted, TIMEOUT_S), server.stderr_text())
            with self.assertRaises(grpc.RpcError) as caught:
                nc.infer(stub, MODEL, {"image": np.zeros((1, 3), np.float32)})
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(nc.infer(stub, MODEL, {"image": images})["probabilities"].shape,
                             (2, 10))
            now = server.worker_pids()
        log = server.stderr_text(0)
        records = all_records(self, log)

        # The serve command's own.
        messages = [r["msg"] for r in records if r["component"] == "serve"]
        self.assertTrue(any(m.startswith("starting numaserve ") for m in messages), log)
        self.assertIn("stopped", messages, log)
        models = [r for r in records if r.get("model") == nc.DEFAULT_MODEL_NAME]
        self.assertTrue(models, log)
        self.assertEqual(models[0]["version"], 1, log)
        self.assertTrue(any(r["component"] == "placement" for r in records), log)
        serving = [r for r in records if r["msg"].startswith("serving: ")]
        self.assertEqual(len(serving), 1, log)
        self.assertIn("grpc_address", serving[0], log)

        # The supervisor: each worker started (the new one too), the kill.
        supervisor = [r for r in records if r["component"] == "supervisor"]
        started = {r["pid"]: r for r in supervisor if " started: " in r["msg"]}
        self.assertEqual(set(started), first | now, log)
        for r in started.values():
            self.assertIn(r["worker"], range(workers), r)
        restarts = [r for r in supervisor if r["msg"].endswith("; restarting")]
        self.assertEqual(len(restarts), 1, log)
        self.assertEqual(restarts[0]["level"], "warning", restarts[0])
        self.assertEqual(restarts[0]["pid"], victim, restarts[0])
        self.assertEqual(restarts[0]["worker"], started[victim]["worker"], restarts[0])
        self.assertIn("signal 9", restarts[0]["exit"], restarts[0])

        # The workers, in their own processes: each names itself, at every
        # level it logs (debug: the level came on its command line),
        # and so do the kernels it runs.
        for pid in first | now:
            own = [r for r in records if r.get("pid") == pid and r["component"] != "supervisor"]
            components = {r["component"] for r in own}
            self.assertIn("worker", components, "worker pid %d\n%s" % (pid, log))
            self.assertIn("dispatch", components, "worker pid %d\n%s" % (pid, log))
            self.assertEqual({r["worker"] for r in own}, {started[pid]["worker"]}, own)
            levels = {r["level"] for r in own if r["component"] == "worker"}
            self.assertIn("debug", levels, own)
            hello = [r for r in own if r["msg"].startswith("worker %d pid %d: "
                                                           % (started[pid]["worker"], pid))]
            self.assertEqual(len(hello), 1, own)
            self.assertIn("binding", hello[0], hello[0])

    def test_training_job_logs_in_json(self):
        """A training job's ranks (under mpirun, started by the training
        service) log as records too: the server writes them in its log,
        naming the job; each names its rank."""
        from test_training import synthetic_dataset
        from test_training_service import final_state, label_of, tpb, tpb_grpc, training_args
        root = tempfile.mkdtemp(prefix="numaserve_json_training_")
        self.addCleanup(shutil.rmtree, root, True)
        train = synthetic_dataset(root, "train", 256, seed=1)
        model = nc.write_default_model(os.path.join(root, "repo"))  # inside the training root
        config = ('model: "%s"\n' % model +
                  'dataset { train_images: "%s" train_labels: "%s" }\n' % train +
                  "global_batch_size: 32\nlearning_rate: 0.05\nepochs: 1\nmax_steps: 4\n"
                  "log_every_steps: 2\nsgd { momentum: 0.9 }\n")
        server = nc.ServerProcess(REPO, training_args(root, "--log-format", "json",
                                                      "--log-level", "debug"))
        with server:
            stub = tpb_grpc.TrainingServiceStub(server.training_channel())
            job = stub.StartTraining(tpb.StartTrainingRequest(config_text=config,
                                                              ranks="1")).job_id
            final = final_state(stub, job)
            self.assertEqual(final.state, tpb.TrainingProgress.SUCCEEDED, final)
        log = server.stderr_text(0)
        records = all_records(self, log)
        label = label_of(job)
        self.assertNotIn(job, log)  # the secret part of the id never
        mine = [r for r in records if r.get("job") == label]
        ranks = [r for r in mine if r.get("rank") == 0]
        self.assertTrue([r for r in ranks if r["component"] == "training"
                         and "rank 0/1 " in r["msg"]], log)
        self.assertTrue([r for r in ranks if r["component"] == "dispatch"], log)
        steps = [r for r in mine if r.get("step") == 4 and "loss" in r]
        self.assertEqual(len(steps), 1, log)
        self.assertEqual(steps[0]["level"], "debug", steps[0])
        ended = [r for r in mine if r.get("state") == "succeeded"]
        self.assertEqual(len(ended), 1, log)

    def test_warning_level_hides_info(self):
        log = self.serve_and_stop("--log-format", "json", "--log-level", "warning",
                                  "--domain", "core", "--max-workers", "2")
        records = all_records(self, log)  # the workers' lines too
        self.assertFalse([r for r in records if r["level"] in ("debug", "info")], log)
        self.assertNotIn("stopped", [r["msg"] for r in records], log)
        text = self.serve_and_stop("--log-level", "warning")
        self.assertNotIn("numaserve: stopped", text, text)
        self.assertNotIn("numaserve: gRPC security", text, text)

    def test_text_keeps_its_look(self):
        log = self.serve_and_stop()
        self.assertIn("numaserve: stopped\n", log, log)
        self.assertIn("numaserve: gRPC security: ", log, log)
        self.assertFalse(json_records(log), log)

    def test_bad_values_are_named(self):
        for args in (("--log-format", "xml"), ("--log-level", "loud")):
            with self.subTest(args=args):
                full = ("serve", "--model-repository", REPO) + args
                result = run(*full)
                self.assertEqual(result.returncode, 1, describe(full, result))
                self.assertIn(args[0], result.stderr, describe(full, result))
                self.assertIn(args[1], result.stderr, describe(full, result))

    def test_errors_in_json(self):
        args = ("serve", "--log-format", "json", "--model-repository", "/nonexistent/models")
        result = run(*args)
        self.assertEqual(result.returncode, 1, describe(args, result))
        records = json_records(result.stderr)
        errors = [r for r in records if r["level"] == "error"]
        self.assertTrue(errors, describe(args, result))
        self.assertIn("/nonexistent/models", errors[-1]["msg"], describe(args, result))


class ConfigFileTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="numaserve_conf_")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, text):
        path = os.path.join(self.dir, "serve.conf")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_file_and_flags_over_it(self):
        # ServerProcess passes --grpc-port 0 and --metrics-port 0: they win
        # over the file's ports; --log-level info wins over its warning.
        path = self.write("# numaserve serve options\n"
                          "model-repository: /nonexistent/overridden\n"
                          "grpc-port: 1\n"
                          "metrics-port = 2   # overridden too\n"
                          "log-format: json\n"
                          "log-level: warning\n"
                          "grpc-reflection: false\n")
        server = nc.ServerProcess(REPO, ["--config", path, "--log-level", "info"])
        with server:
            self.assertNotIn(server.grpc_port, (1, 2))
            self.assertNotIn(server.metrics_port, (1, 2))
            # From the file: no reflection.
            reflection_pb = reflection_messages()
            with self.assertRaises(grpc.RpcError) as caught:
                reflect(server.channel(), reflection_pb,
                        [reflection_pb.ServerReflectionRequest(list_services="")])
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        log = server.stderr_text(0)
        records = json_records(log)  # json: from the file
        self.assertIn("stopped", [r["msg"] for r in records], log)  # info: from the flag

    def test_error_names_file_line_and_option(self):
        path = self.write("# serve.conf\nhost: 127.0.0.1\ngrpc-prot: 9001\n")
        args = ("serve", "--model-repository", REPO, "--config", path)
        result = run(*args)
        self.assertEqual(result.returncode, 1, describe(args, result))
        self.assertIn("%s:3: unknown option 'grpc-prot'" % path, result.stderr,
                      describe(args, result))
        self.assertNotIn("grpc=", result.stdout, describe(args, result))

        path = self.write("grpc-port: 9001\nmax-queue-size: lots\n")
        result = run(*args)
        self.assertEqual(result.returncode, 1, describe(args, result))
        self.assertIn("%s:2: " % path, result.stderr, describe(args, result))
        self.assertIn("max-queue-size", result.stderr, describe(args, result))

    def test_missing_file(self):
        path = os.path.join(self.dir, "absent.conf")
        args = ("serve", "--model-repository", REPO, "--config", path)
        result = run(*args)
        self.assertEqual(result.returncode, 1, describe(args, result))
        self.assertIn(path, result.stderr, describe(args, result))


class VersionTest(unittest.TestCase):

    def test_version(self):
        outputs = []
        for args in (("--version",), ("serve", "--version")):
            with self.subTest(args=args):
                result = run(*args)
                self.assertEqual(result.returncode, 0, describe(args, result))
                self.assertRegex(result.stdout.strip(), VERSION, describe(args, result))
                outputs.append(result.stdout)
        self.assertEqual(outputs[0], outputs[1])


class MetricsAddressTest(unittest.TestCase):

    def test_chosen_interface_and_port(self):
        # 127.0.0.2 is loopback too on Linux: metrics there, gRPC on 127.0.0.1.
        host = "127.0.0.2"
        try:
            port = free_port(host)
        except OSError:
            host = "127.0.0.1"
            port = free_port(host)
        server = nc.ServerProcess(REPO, ["--metrics-address", "%s:%d" % (host, port)])
        with server:
            self.assertEqual(server.metrics_port, port, server.stderr_text())
            url = "http://%s:%d/metrics" % (host, port)
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode("utf-8")
            self.assertIn("numaserve_", text)
            if host != "127.0.0.1":
                with self.assertRaises(urllib.error.URLError):
                    urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5)
            # gRPC stays on --host.
            nc.wait_until(lambda: server.stub().ServerReady(nc.pb.ServerReadyRequest()).ready,
                          TIMEOUT_S)

    def test_malformed(self):
        args = ("serve", "--model-repository", REPO, "--metrics-address", "nowhere")
        result = run(*args)
        self.assertEqual(result.returncode, 1, describe(args, result))
        self.assertIn("--metrics-address", result.stderr, describe(args, result))


class ReflectionTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.reflection_pb = reflection_messages()

    def list_services(self, server):
        pb = self.reflection_pb
        responses = reflect(server.channel(), pb, [pb.ServerReflectionRequest(list_services="")])
        self.assertEqual(len(responses), 1)
        return sorted(s.name for s in responses[0].list_services_response.service)

    def test_on_by_default(self):
        with nc.ServerProcess(REPO) as server:
            services = self.list_services(server)
            for name in (INFERENCE_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE):
                self.assertIn(name, services)
            # The descriptors too: what `grpcurl describe` and calls need.
            pb = self.reflection_pb
            responses = reflect(server.channel(), pb, [
                pb.ServerReflectionRequest(file_containing_symbol=INFERENCE_SERVICE)])
            files = responses[0].file_descriptor_response.file_descriptor_proto
            self.assertTrue(files, responses[0])
            from google.protobuf import descriptor_pb2
            names = set()
            for blob in files:
                fd = descriptor_pb2.FileDescriptorProto.FromString(blob)
                names |= {"%s.%s" % (fd.package, s.name) for s in fd.service}
            self.assertIn(INFERENCE_SERVICE, names)
            grpcurl = shutil.which("grpcurl")
            if grpcurl:
                result = subprocess.run([grpcurl, "-plaintext", server.grpc_address, "list"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, timeout=TIMEOUT_S)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertIn(INFERENCE_SERVICE, result.stdout.split())
                self.assertIn(HEALTH_SERVICE, result.stdout.split())

    def test_off(self):
        with nc.ServerProcess(REPO, ["--grpc-reflection=false"]) as server:
            pb = self.reflection_pb
            with self.assertRaises(grpc.RpcError) as caught:
                reflect(server.channel(), pb, [pb.ServerReflectionRequest(list_services="")])
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
            # The API itself is unchanged.
            nc.wait_until(lambda: server.stub().ServerReady(nc.pb.ServerReadyRequest()).ready,
                          TIMEOUT_S)


if __name__ == "__main__":
    unittest.main()
