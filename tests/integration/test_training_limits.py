#!/usr/bin/python3
"""What a client of the training service can make the server hold, against
a real server (serve --training-service on its own loopback port):

  * ended jobs are reaped: many jobs that fail at once leave the server's
    thread count and its numaserve_training_* series bounded, only the
    latest --training-max-finished-jobs ended jobs can still be watched,
    and the server goes on answering;
  * a thread that cannot be started for a job is RESOURCE_EXHAUSTED, and
    the server lives on;
  * export_model_name must be a model name the repository would load
    (CheckModelName, and UTF-8) or the job is INVALID_ARGUMENT naming the
    field, and a label from a client's path cannot break /metrics for
    `promtool check metrics`;
  * the training port has the gRPC port's limits: a message above
    --grpc-max-message-bytes is refused by gRPC.
"""

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
sys.path.insert(0, HERE)
import numaserve_client as nc  # noqa: E402
from test_training_service import (final_state, label_of, quick_config, tpb,  # noqa: E402
                                   tpb_grpc, training_args)

PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")


def vm_size(pid):
    """Bytes of the address space of PID."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/%d/status" % pid)


def task_count(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def training_job_labels(metrics):
    """The job_id labels of every numaserve_training_* series."""
    return {labels["job_id"] for name, labels, _ in metrics.samples
            if name.startswith("numaserve_training_") and "job_id" in labels}


class TrainingLimitsTest(unittest.TestCase):

    KEPT = 3  # --training-max-finished-jobs

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_limits_")
        cls.root = os.path.join(cls.dir, "root")
        os.makedirs(cls.root)
        cls.repo = os.path.join(cls.root, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = nc.synthetic_idx_dataset(cls.root, "train", 64, seed=5)
        # Not a model: a job on it fails as soon as its rank reads it.
        cls.broken = os.path.join(cls.root, "broken.onnx")
        with open(cls.broken, "wb") as f:
            f.write(b"not an onnx model")
        cls.server = nc.ServerProcess(cls.repo, training_args(
            cls.root, "--training-max-finished-jobs", str(cls.KEPT))).start()
        cls.channel = cls.server.training_channel()
        cls.stub = tpb_grpc.TrainingServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start(self, config_text):
        return self.stub.StartTraining(tpb.StartTrainingRequest(config_text=config_text,
                                                                ranks="1"), timeout=30).job_id

    def failed_job(self, config_text):
        job = self.start(config_text)
        final = final_state(self.stub, job, timeout=60)
        self.assertEqual(final.state, tpb.TrainingProgress.FAILED, final)
        return job

    def assert_promtool_passes(self, text):
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode("utf-8"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(result.returncode, 0,
                         "promtool check metrics failed:\n%s\n--- page ---\n%s"
                         % (result.stdout.decode("utf-8", "replace"), text))

    def test_ended_jobs_are_reaped(self):
        config = quick_config(self.broken, self.train)
        jobs = [self.failed_job(config)]
        threads = task_count(self.server.pid)
        for _ in range(11):
            jobs.append(self.failed_job(config))
        # Each start forgets the oldest ended jobs beyond KEPT: the KEPT
        # kept at the last start and the last job are left.
        left = jobs[-(self.KEPT + 1):]
        for job in jobs[:-(self.KEPT + 1)]:
            with self.assertRaises(grpc.RpcError) as ctx:
                list(self.stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=10))
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND, job)
        for job in left:
            self.assertEqual(final_state(self.stub, job, timeout=10).state,
                             tpb.TrainingProgress.FAILED)
        text = self.server.scrape()
        metrics = nc.Metrics(text)
        self.assertEqual(training_job_labels(metrics), {label_of(job) for job in left}, text)
        # Every job is still counted by state.
        self.assertGreaterEqual(metrics.sum("numaserve_training_jobs", state="failed"), len(jobs))
        self.assert_promtool_passes(text)
        # The readers of ended jobs are gone: no thread per job.
        self.assertLessEqual(task_count(self.server.pid), threads + 4)
        # The server still answers, on both ports.
        self.failed_job(config)
        self.assertTrue(self.server.stub().ServerLive(nc.pb.ServerLiveRequest(), timeout=10).live)

    def test_export_model_name_must_be_a_model_name(self):
        config = quick_config(self.broken, self.train)
        # Text-format escapes reach the config with any bytes but NUL.
        for name, why in [(r"\377\376", "not UTF-8"),
                          ("a" * 300, "longer than 255 bytes"),
                          (".hidden", "starts with '.'"),
                          (r"line\nbreak", "control character"),
                          (r"back\\slash", "path separator"),
                          ("a/b", "path separator")]:
            with self.assertRaises(grpc.RpcError) as ctx:
                self.start(config + 'export_repository: "repo"\nexport_model_name: "%s"\n'
                           % name)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, name)
            self.assertIn("export_model_name", ctx.exception.details())
            self.assertIn(why, ctx.exception.details())
        # Without an export repository too: the name would still label metrics.
        with self.assertRaises(grpc.RpcError) as ctx:
            self.start(config + 'export_model_name: "\\377"\n')
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("not UTF-8", ctx.exception.details())

    def test_a_model_path_that_is_not_utf8_keeps_metrics_valid(self):
        # A file in the root whose name is not UTF-8 (a job's checkpoint may
        # be named so): the job's model label is escaped.
        shutil.copy(self.broken, os.path.join(os.fsencode(self.root), b"\xffmodel.onnx"))
        job = self.failed_job(quick_config(r"\377model.onnx", self.train))
        text = self.server.scrape()  # decoded as UTF-8: fails on a stray byte
        self.assertIn(label_of(job), text)
        self.assert_promtool_passes(text)


class ThreadLimitTest(unittest.TestCase):
    """A thread the server cannot start for a job is an error status."""

    def test_a_thread_that_cannot_start_is_resource_exhausted(self):
        # A server of its own: no ended job has left a stack that glibc
        # would reuse for the next thread.
        directory = tempfile.mkdtemp(prefix="numaserve_training_threads_")
        try:
            repo = os.path.join(directory, "repo")
            nc.write_default_model(repo)
            train = nc.synthetic_idx_dataset(directory, "train", 64, seed=7)
            broken = os.path.join(directory, "broken.onnx")
            with open(broken, "wb") as f:
                f.write(b"not an onnx model")
            server = nc.ServerProcess(repo, training_args(directory)).start()
            try:
                with server.training_channel() as channel:
                    self.check(server, tpb_grpc.TrainingServiceStub(channel),
                               quick_config(broken, train))
            finally:
                server.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def check(self, server, stub, config):
        # The server's address space capped just above what it maps now:
        # no room for a new thread's stack.
        pid = server.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
        resource.prlimit(pid, resource.RLIMIT_AS, (vm_size(pid) + (2 << 20), hard))
        try:
            with self.assertRaises(grpc.RpcError) as ctx:
                stub.StartTraining(tpb.StartTrainingRequest(config_text=config, ranks="1"),
                                   timeout=30)
        finally:
            resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         ctx.exception.details())
        self.assertIn("cannot start a thread for training job", ctx.exception.details())
        # The server lives on, and its next job runs.
        job = stub.StartTraining(tpb.StartTrainingRequest(config_text=config, ranks="1"),
                                 timeout=30).job_id
        self.assertEqual(final_state(stub, job, timeout=60).state, tpb.TrainingProgress.FAILED)
        self.assertTrue(server.stub().ServerLive(nc.pb.ServerLiveRequest(), timeout=10).live)


class TrainingListenerLimitsTest(unittest.TestCase):
    """The training service's own port has the gRPC port's limits."""

    def test_a_message_over_the_grpc_limit_is_refused(self):
        directory = tempfile.mkdtemp(prefix="numaserve_training_listener_")
        try:
            repo = os.path.join(directory, "repo")
            nc.write_default_model(repo)
            train = nc.synthetic_idx_dataset(directory, "train", 64, seed=6)
            broken = os.path.join(directory, "broken.onnx")
            with open(broken, "wb") as f:
                f.write(b"not an onnx model")
            server = nc.ServerProcess(repo, training_args(
                directory, "--grpc-max-message-bytes", "4096")).start()
            try:
                with server.training_channel() as channel:
                    stub = tpb_grpc.TrainingServiceStub(channel)
                    config = quick_config(broken, train)
                    # Below --training-max-config-bytes (1 MiB), above the
                    # gRPC port's 4096 bytes.
                    padded = config + "#" * 8192 + "\n"
                    with self.assertRaises(grpc.RpcError) as ctx:
                        stub.StartTraining(tpb.StartTrainingRequest(config_text=padded,
                                                                    ranks="1"), timeout=30)
                    self.assertEqual(ctx.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     ctx.exception.details())
                    # A config within the limit is taken.
                    job = stub.StartTraining(tpb.StartTrainingRequest(config_text=config,
                                                                      ranks="1"), timeout=30)
                    self.assertEqual(final_state(stub, job.job_id, timeout=60).state,
                                     tpb.TrainingProgress.FAILED)
            finally:
                server.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
