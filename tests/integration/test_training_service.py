#!/usr/bin/python3
"""numaserve.training.TrainingService against a real server: a job started
over gRPC runs `numaserve train` (mpirun) as a child of the server, keeps
running when its client goes away, streams progress, exports a new model
version, can be cancelled (stopping after a step with a checkpoint); its
figures are numaserve_training_* metrics on /metrics (checked by `promtool
check metrics`), labelled with the public part of its id only; a server
shut down while a job runs stops it with a checkpoint and leaves no process
behind; a bad config is INVALID_ARGUMENT with the line of the error.

Who may train (serve --training-service):
  * without the flag, or with the service on its own --training-address,
    StartTraining on the inference port is UNIMPLEMENTED; the service on the
    inference port without authentication, or on a non-loopback address
    without it, or without --training-root, stops `serve` with a message;
  * a checkpoint, final_weights, timeline, export or input path that escapes
    the training root (absolute, '..', a symbolic link) is INVALID_ARGUMENT
    naming the field, and nothing is written outside; relative inputs and
    export repositories are taken from the root, relative outputs from the
    caller's own directory <root>/callers/<id>;
  * outputs go only into the caller's own directory: another caller can
    neither overwrite a caller's checkpoint, resume from it nor export into
    a model directory the caller's exports made, nor any caller overwrite a
    served model.onnx (PERMISSION_DENIED naming the field);
  * ranks above --training-max-ranks, a config above
    --training-max-config-bytes and a job beyond --training-max-jobs are
    refused;
  * a job's config lives in a private 0700 directory under $TMPDIR, removed
    with the job;
  * another caller (bearer token, or client certificate) can neither list,
    watch nor cancel a job; without authentication a job id is 128 random
    bits, ListTrainings is PERMISSION_DENIED and a guessed id NOT_FOUND.
"""

import glob
import hashlib
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
sys.path.insert(0, HERE)
import numaserve_client as nc  # noqa: E402
from test_training import read_weights, synthetic_dataset  # noqa: E402

PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")


def training_stubs():
    from grpc_tools import protoc
    out_dir = tempfile.mkdtemp(prefix="numaserve_training_stubs_")
    rc = protoc.main(["grpc_tools.protoc", "-I" + os.path.join(nc.SOURCE_DIR, "proto"),
                      "--python_out=" + out_dir, "--grpc_python_out=" + out_dir, "training.proto"])
    if rc != 0:
        raise RuntimeError("grpc_tools.protoc failed on training.proto")
    sys.path.insert(0, out_dir)
    import training_pb2
    import training_pb2_grpc
    return training_pb2, training_pb2_grpc


tpb, tpb_grpc = training_stubs()
MODEL = nc.DEFAULT_MODEL_NAME
JOB_ID = re.compile(r"^(train-\d+)-[0-9a-f]{32}$")
OWNER_FILE = ".numaserve-owner"


def caller_id(caller=""):
    """The id of CALLER ("token:NAME", "cert:SUBJECT"; "" without
    authentication): the name of its directory, its exports' owner."""
    return hashlib.sha256(caller.encode()).hexdigest() if caller else "anonymous"


def caller_dir(root, caller=""):
    """The directory of CALLER under the training root ROOT."""
    return os.path.join(os.path.realpath(root), "callers", caller_id(caller))


def hand_over(model_dir, caller=""):
    """What an operator does to let CALLER's jobs export new versions of a
    model it did not make: the owner file names the caller."""
    with open(os.path.join(model_dir, OWNER_FILE), "w") as f:
        f.write(caller_id(caller) + "\n")


def versions(model_dir):
    """The version numbers under MODEL_DIR, in order."""
    return sorted(int(v) for v in os.listdir(model_dir) if v.isdigit())


def training_args(root, *more):
    """serve flags for the training service on its own loopback port."""
    return ["--training-service", "--training-address", "127.0.0.1:0",
            "--training-root", root] + list(more)


def label_of(job_id):
    """The public part of a job id: what metrics and the log name it by."""
    match = JOB_ID.match(job_id)
    assert match, job_id
    return match.group(1)


def final_state(stub, job_id, timeout=120):
    """Watches JOB_ID to its end; returns the last progress message."""
    last = None
    for update in stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job_id), timeout=timeout):
        last = update
    assert last is not None and last.state != tpb.TrainingProgress.RUNNING, last
    return last


def first_step(stub, job_id, timeout=120):
    """Waits until JOB_ID has reported a step; returns that progress."""
    for update in stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job_id), timeout=timeout):
        if update.step > 0:
            return update
    raise AssertionError("job %s ended before its first step" % job_id)


class TrainingServiceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_service_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.dir, "train", 2048, seed=1)
        cls.test = synthetic_dataset(cls.dir, "t10k", 256, seed=2)
        # Its jobs export new versions of the served model: the operator
        # hands it over to the (anonymous) callers.
        hand_over(os.path.join(cls.repo, MODEL))
        cls.server = nc.ServerProcess(cls.repo, training_args(cls.dir)).start()
        cls.channel = cls.server.training_channel()

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def stub(self, channel=None):
        return tpb_grpc.TrainingServiceStub(channel or self.channel)

    def config_text(self, max_steps, export=True, checkpoint=None):
        text = ('model: "%s"\n' % self.model +
                'dataset { train_images: "%s" train_labels: "%s" test_images: "%s" '
                'test_labels: "%s" }\n' % (self.train + self.test) +
                "global_batch_size: 32\nlearning_rate: 0.05\nepochs: 1000\n"
                "max_steps: %d\nlog_every_steps: 8\nsgd { momentum: 0.9 }\n" % max_steps)
        if export:
            text += 'export_repository: "%s"\nexport_model_name: "%s"\n' % (self.repo, MODEL)
        if checkpoint:
            text += 'checkpoint: "%s"\n' % checkpoint
        return text

    def wait_for_state(self, job_id, timeout=120):
        return final_state(self.stub(), job_id, timeout)

    def test_job_streams_progress_and_exports_a_new_version(self):
        stub = self.stub()
        job = stub.StartTraining(tpb.StartTrainingRequest(config_text=self.config_text(48),
                                                          ranks="1")).job_id
        updates = list(stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=120))
        self.assertGreaterEqual(len(updates), 2)
        steps = [u.step for u in updates if u.step > 0]
        self.assertEqual(steps, sorted(steps))
        self.assertIn(48, steps)
        last = updates[-1]
        self.assertEqual(last.state, tpb.TrainingProgress.SUCCEEDED, last)
        self.assertEqual(last.total_steps, 48)
        self.assertGreater(last.images_per_second, 0)
        self.assertGreater(last.test_accuracy, 0.5)
        self.assertIn("exported", last.message)
        version_dirs = versions(os.path.join(self.repo, MODEL))
        self.assertGreaterEqual(version_dirs[-1], 2)
        self.assertTrue(os.path.exists(
            os.path.join(self.repo, MODEL, str(version_dirs[-1]), "model.onnx")))

    def test_job_survives_its_client(self):
        channel = self.server.training_channel()
        job = self.stub(channel).StartTraining(
            tpb.StartTrainingRequest(config_text=self.config_text(200, export=False),
                                     ranks="1")).job_id
        channel.close()
        final = self.wait_for_state(job)
        self.assertEqual(final.state, tpb.TrainingProgress.SUCCEEDED, final)
        self.assertEqual(final.step, 200)

    def test_cancel_ends_the_job(self):
        stub = self.stub()
        started = stub.StartTraining(tpb.StartTrainingRequest(
            config_text=self.config_text(1000000, export=False, checkpoint="cancelled.ckpt"),
            ranks="1"))
        job = started.job_id
        # A relative output is taken from the caller's own directory.
        self.assertEqual(started.output_directory, caller_dir(self.dir))
        checkpoint = os.path.join(started.output_directory, "cancelled.ckpt")
        stream = stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=120)
        for update in stream:
            if update.step > 0:
                break
        stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job))
        final = self.wait_for_state(job, timeout=60)
        self.assertEqual(final.state, tpb.TrainingProgress.CANCELLED, final)
        self.assertLess(final.step, 1000000)
        # The ranks stopped after a step and rank 0 wrote the checkpoint there.
        self.assertRegex(final.message, r"^cancelled: stopped at step %d of \d+: checkpoint %s "
                         % (final.step, re.escape(checkpoint)))
        self.assertEqual(read_weights(checkpoint)[0], final.step)
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_metrics_follow_the_job_and_pass_promtool(self):
        stub = self.stub()
        job = stub.StartTraining(tpb.StartTrainingRequest(
            config_text=self.config_text(400, export=False), ranks="1")).job_id
        during = None
        for update in stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=120):
            if update.state == tpb.TrainingProgress.RUNNING and update.step > 0 and during is None:
                during = (update, self.server.metrics())
        final = self.wait_for_state(job)
        self.assertEqual(final.state, tpb.TrainingProgress.SUCCEEDED, final)
        text = self.server.scrape()
        after = nc.Metrics(text)
        where = "\n--- page ---\n" + text
        # Metrics name the job by the public part of its id, never the whole.
        self.assertNotIn(job, text)

        def value(metrics, name):
            found = metrics.find(name, job_id=label_of(job))
            self.assertEqual(len(found), 1, name + where)
            self.assertEqual(found[0][1].get("model"), self.model, name)
            return found[0][2]

        # While it ran: at least the step that had been streamed, and running.
        self.assertIsNotNone(during, "no progress was streamed before the job ended")
        progress, metrics = during
        self.assertGreaterEqual(value(metrics, "numaserve_training_step"), progress.step)
        first_loss = value(metrics, "numaserve_training_loss")
        self.assertTrue(0 <= first_loss < 10, first_loss)
        self.assertGreaterEqual(metrics.sum("numaserve_training_jobs", state="running"), 1)
        # The interval's figures beyond the metrics: epochs, learning rate, eta.
        self.assertTrue(1 <= progress.epoch <= progress.epochs, progress)
        self.assertTrue(0 < progress.learning_rate <= 0.05 + 1e-6, progress)  # a float
        self.assertTrue(math.isfinite(progress.eta_seconds) and progress.eta_seconds >= 0, progress)
        # After: the last progress line's figures.
        self.assertEqual(value(after, "numaserve_training_step"), 400)
        self.assertEqual(value(after, "numaserve_training_total_steps"), 400)
        self.assertEqual(value(after, "numaserve_training_epoch"), final.epoch)
        self.assertGreaterEqual(final.epoch, 6)  # 2048 / 32 = 64 steps an epoch
        self.assertEqual(final.epochs, final.epoch)
        self.assertEqual(final.eta_seconds, 0)
        loss = value(after, "numaserve_training_loss")
        self.assertTrue(math.isfinite(loss) and 0 <= loss <= first_loss, (loss, first_loss))
        self.assertAlmostEqual(loss, final.loss, places=4)
        accuracy = value(after, "numaserve_training_accuracy_ratio")
        self.assertTrue(0.5 < accuracy <= 1, accuracy)
        self.assertAlmostEqual(accuracy, final.accuracy, places=4)
        self.assertTrue(0.5 < value(after, "numaserve_training_test_accuracy_ratio") <= 1)
        self.assertGreater(value(after, "numaserve_training_images_per_second"), 0)
        self.assertEqual(value(after, "numaserve_training_eta_seconds"), 0)
        self.assertGreaterEqual(after.sum("numaserve_training_jobs", state="succeeded"), 1)
        for state in ("running", "succeeded", "failed", "cancelled"):
            self.assertTrue(after.has("numaserve_training_jobs", state=state), state + where)
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=text,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0,
                         "promtool check metrics failed:\n%s%s" % (result.stdout, where))

    def test_errors(self):
        stub = self.stub()
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.StartTraining(tpb.StartTrainingRequest(config_text="model: \"m\"\nepochz: 3\n"))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(":2:", ctx.exception.details())
        with self.assertRaises(grpc.RpcError) as ctx:
            list(stub.WatchTraining(tpb.WatchTrainingRequest(job_id="nope"), timeout=10))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.CancelTraining(tpb.CancelTrainingRequest(job_id="nope"))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND)


class ServerShutdownTest(unittest.TestCase):
    """SIGTERM to a server running a training job: the job stops after its
    step with a checkpoint, the server exits 0 and no process is left."""

    def test_shutdown_stops_the_job_with_a_checkpoint(self):
        directory = tempfile.mkdtemp(prefix="numaserve_training_shutdown_")
        try:
            repo = os.path.join(directory, "repo")
            model = nc.write_default_model(repo)
            train = synthetic_dataset(directory, "train", 512, seed=3)
            checkpoint = os.path.join(caller_dir(directory), "job.ckpt")
            config = ('model: "%s"\ndataset { train_images: "%s" train_labels: "%s" }\n'
                      "global_batch_size: 32\nlearning_rate: 0.05\nepochs: 100000\n"
                      'log_every_steps: 4\ncheckpoint: "job.ckpt"\n' % ((model,) + train))
            server = nc.ServerProcess(
                repo, training_args(directory, "--training-max-ranks", "2")).start()
            try:
                stub = tpb_grpc.TrainingServiceStub(server.training_channel())
                job = stub.StartTraining(tpb.StartTrainingRequest(config_text=config,
                                                                  ranks="2")).job_id
                for update in stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job),
                                                 timeout=120):
                    if update.step > 0:
                        break
                self.assertFalse(os.path.exists(checkpoint))  # only written at the end
                descendants, todo = set(), [server.pid]
                while todo:  # the launcher (mpirun) and its ranks
                    pid = todo.pop()
                    children = nc.child_pids(pid)
                    descendants |= children
                    todo.extend(children)
                self.assertGreaterEqual(len(descendants), 3, descendants)
            finally:
                code = server.stop(timeout=60)
            stderr = server.stderr_text()
            self.assertEqual(code, 0, stderr)
            self.assertIn("stopping training job %s " % label_of(job), stderr)
            self.assertTrue(os.path.exists(checkpoint),
                            "no checkpoint at %s; the server said:\n%s" % (checkpoint, stderr))
            step, _ = read_weights(checkpoint)
            self.assertGreaterEqual(step, update.step)
            self.assertIn("training job %s cancelled at step %d: cancelled: stopped at step %d"
                          % (label_of(job), step, step), stderr)
            self.assertNotIn(job, stderr)
            alive = [p for p in descendants if os.path.exists("/proc/%d" % p)
                     and not nc._is_zombie(p)]
            self.assertEqual(alive, [], "left running after the server exited")
        finally:
            shutil.rmtree(directory, ignore_errors=True)



def quick_config(model, train, steps=8, **paths):
    """A small job's config text; PATHS adds string fields (checkpoint=...)."""
    text = ('model: "%s"\ndataset { train_images: "%s" train_labels: "%s" }\n'
            "global_batch_size: 32\nlearning_rate: 0.05\nepochs: 100000\nmax_steps: %d\n"
            "log_every_steps: 4\n" % ((model,) + tuple(train) + (steps,)))
    for field, value in paths.items():
        text += '%s: "%s"\n' % (field, value)
    return text


def tree(directory):
    """{relative path: bytes or link target} of everything under DIRECTORY."""
    out = {}
    for base, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, directory)
            if os.path.islink(path):
                out[rel] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[rel] = f.read()
            else:
                out[rel] = "dir"
    return out


class TrainingServiceOffTest(unittest.TestCase):
    """The training service is not on the inference port unless asked for,
    and `serve` refuses settings that would expose it."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_off_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def assert_unimplemented(self, channel):
        stub = tpb_grpc.TrainingServiceStub(channel)
        for call in (lambda: stub.StartTraining(tpb.StartTrainingRequest(
                         config_text='model: "/etc/passwd"\n', ranks="100000"), timeout=10),
                     lambda: stub.ListTrainings(tpb.ListTrainingsRequest(), timeout=10),
                     lambda: stub.CancelTraining(tpb.CancelTrainingRequest(job_id="train-1"),
                                                 timeout=10)):
            with self.assertRaises(grpc.RpcError) as ctx:
                call()
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNIMPLEMENTED,
                             ctx.exception.details())

    def test_anonymous_start_training_on_the_inference_port_is_unimplemented(self):
        with nc.ServerProcess(self.repo) as server:
            self.assertIsNone(server.training_port)
            self.assert_unimplemented(server.channel())
            # Inference is served as before.
            outputs = nc.infer(server.stub(), MODEL, {"image": nc.random_images(1)})
            self.assertEqual(outputs["probabilities"].shape, (1, 10))

    def test_own_address_keeps_training_off_the_inference_port(self):
        with nc.ServerProcess(self.repo, training_args(self.dir)) as server:
            self.assertNotEqual(server.training_port, server.grpc_port)
            self.assertEqual(server.training_host, "127.0.0.1")
            self.assert_unimplemented(server.channel())
            with server.training_channel() as channel:
                with self.assertRaises(grpc.RpcError) as ctx:
                    tpb_grpc.TrainingServiceStub(channel).StartTraining(
                        tpb.StartTrainingRequest(config_text="epochz: 1\n"), timeout=10)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            # Inference is not on the training port.
            with server.training_channel() as channel:
                with self.assertRaises(grpc.RpcError) as ctx:
                    nc.pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(
                        nc.pb.ServerLiveRequest(), timeout=10)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

    def serve_fails(self, args, *mentions):
        result = subprocess.run([nc.default_binary(), "serve", "--model-repository", self.repo,
                                 "--grpc-port", "0", "--metrics-port", "0"] + args,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=60)
        self.assertNotEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("grpc=", result.stdout)
        for m in mentions:
            self.assertIn(m, result.stderr)

    def test_settings_that_would_expose_training_are_refused(self):
        self.serve_fails(["--training-service", "--training-root", self.dir],
                         "--training-service on the gRPC port needs authentication")
        self.serve_fails(["--training-service", "--training-address", "0.0.0.0:0",
                          "--training-root", self.dir],
                         "--training-address 0.0.0.0:0 is reachable from other machines")
        self.serve_fails(["--training-service", "--training-address", "127.0.0.1:0"],
                         "--training-service needs --training-root")
        self.serve_fails(["--training-root", self.dir], "need --training-service")
        missing = os.path.join(self.dir, "missing")
        self.serve_fails(training_args(missing), "--training-root " + missing)


class TrainingConfinementTest(unittest.TestCase):
    """Paths, caps and files of jobs on an anonymous loopback training port."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_confine_")
        cls.root = os.path.join(cls.dir, "root")
        cls.outside = os.path.join(cls.dir, "outside")
        cls.tmp = os.path.join(cls.dir, "tmp")
        for d in (cls.root, cls.outside, cls.tmp):
            os.makedirs(d)
        cls.repo = os.path.join(cls.root, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.root, "train", 256, seed=4)
        # Bait outside the root: a file to overwrite, a copy of the model.
        cls.target = os.path.join(cls.outside, "target")
        with open(cls.target, "w") as f:
            f.write("precious")
        shutil.copy(cls.model, os.path.join(cls.outside, "model.onnx"))
        shutil.copy(cls.train[0], os.path.join(cls.outside, "images.gz"))
        # Links inside the root that lead out of it: in the root (inputs),
        # and in the anonymous caller's own directory (outputs), as if an
        # operator had put them there.
        cls.area = caller_dir(cls.root)
        os.makedirs(cls.area)
        os.symlink(cls.outside, os.path.join(cls.area, "out_dir"))
        os.symlink(cls.target, os.path.join(cls.area, "out_file"))
        os.symlink(os.path.join(cls.outside, "images.gz"), os.path.join(cls.root, "images.gz"))
        os.makedirs(os.path.join(cls.root, "exports"))
        os.symlink(cls.outside, os.path.join(cls.root, "exports", "evil"))
        env = dict(os.environ, TMPDIR=cls.tmp)
        cls.server = nc.ServerProcess(cls.repo, training_args(cls.root, "--training-max-ranks",
                                                              "2"), env=env).start()
        cls.channel = cls.server.training_channel()
        cls.stub = tpb_grpc.TrainingServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start(self, config_text, ranks="1"):
        return self.stub.StartTraining(tpb.StartTrainingRequest(config_text=config_text,
                                                                ranks=ranks), timeout=30)

    def assert_refused(self, config_text, field, code=grpc.StatusCode.INVALID_ARGUMENT,
                       ranks="1"):
        with self.assertRaises(grpc.RpcError) as ctx:
            self.start(config_text, ranks)
        self.assertEqual(ctx.exception.code(), code, ctx.exception.details())
        self.assertIn(field, ctx.exception.details())
        return ctx.exception.details()

    def test_output_paths_that_escape_the_root_are_refused(self):
        before = tree(self.outside)
        escapes = [os.path.join(self.outside, "x"),      # absolute, outside
                   "../outside/x",                        # '..'
                   os.path.join(self.root, "..", "outside", "x"),
                   "out_dir/x",                           # through a linked directory
                   "out_file",                            # a link to a file outside
                   "/etc/numaserve-test-x"]
        for field in ("checkpoint", "final_weights", "timeline"):
            for path in escapes:
                with self.subTest(field=field, path=path):
                    details = self.assert_refused(
                        quick_config(self.model, self.train, **{field: path}),
                        "config field '%s'" % field)
                    self.assertIn(path[:40], details)
        for repo, name, field in [(self.outside, MODEL, "export_repository"),
                                  ("../outside", MODEL, "export_repository"),
                                  ("out_dir", MODEL, "export_repository"),
                                  ("exports", "evil", "export_model_name"),
                                  ("exports", "../../outside", "export_model_name"),
                                  ("exports", "a/b", "export_model_name")]:
            with self.subTest(repo=repo, name=name):
                self.assert_refused(quick_config(self.model, self.train, export_repository=repo,
                                                 export_model_name=name),
                                    "config field '%s'" % field)
        self.assertEqual(tree(self.outside), before)
        self.assertFalse(os.path.exists("/etc/numaserve-test-x"))

    def test_input_paths_that_escape_the_root_are_refused(self):
        self.assert_refused(quick_config(os.path.join(self.outside, "model.onnx"), self.train),
                            "config field 'model'")
        self.assert_refused(quick_config("/etc/passwd", self.train), "config field 'model'")
        self.assert_refused(quick_config(self.model, ("images.gz", self.train[1])),
                            "config field 'dataset.train_images'")
        details = self.assert_refused(quick_config(self.model, (self.train[0], "../outside/t")),
                                      "config field 'dataset.train_labels'")
        self.assertIn("'..'", details)

    def test_relative_paths_are_taken_from_the_root_or_the_callers_directory(self):
        os.makedirs(os.path.join(self.area, "runs"), exist_ok=True)
        config = quick_config(os.path.relpath(self.model, self.root),
                              [os.path.basename(p) for p in self.train],
                              final_weights="runs/weights", timeline="timeline.json",
                              export_repository="exports", export_model_name="relative")
        started = self.start(config)
        self.assertEqual(started.output_directory, self.area)
        final = final_state(self.stub, started.job_id)
        self.assertEqual(final.state, tpb.TrainingProgress.SUCCEEDED, final)
        # Outputs in the caller's directory, the export in the root's
        # repository, marked as this caller's.
        self.assertEqual(read_weights(os.path.join(self.area, "runs", "weights"))[0], 8)
        self.assertTrue(os.path.isfile(os.path.join(self.area, "timeline.json")))
        self.assertFalse(os.path.exists(os.path.join(self.root, "timeline.json")))
        model_dir = os.path.join(self.root, "exports", "relative")
        self.assertTrue(os.path.isfile(os.path.join(model_dir, "1", "model.onnx")))
        with open(os.path.join(model_dir, OWNER_FILE)) as f:
            self.assertEqual(f.read(), "anonymous\n")

    def test_served_models_are_not_overwritten(self):
        # The repository the server serves lies inside the root: readable,
        # but neither an output nor an export may replace what is there.
        served = os.path.join(self.repo, MODEL, "1", "model.onnx")
        before = tree(self.repo)
        for field in ("checkpoint", "final_weights", "timeline"):
            with self.subTest(field=field):
                details = self.assert_refused(quick_config(self.model, self.train,
                                                           **{field: served}),
                                              "config field '%s'" % field,
                                              code=grpc.StatusCode.PERMISSION_DENIED)
                self.assertIn(self.area, details)
        details = self.assert_refused(
            quick_config(self.model, self.train, export_repository=self.repo,
                         export_model_name=MODEL),
            "config field 'export_model_name'", code=grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("not made by this caller's exports", details)
        self.assertEqual(tree(self.repo), before)

    def test_ranks_and_config_size_are_capped(self):
        config = quick_config(self.model, self.train)
        details = self.assert_refused(config, "ranks", ranks="100000")
        self.assertIn("--training-max-ranks", details)
        self.assert_refused(config, "ranks", ranks="3")
        self.assert_refused(config, "ranks", ranks="-1")
        self.assert_refused(config, "ranks", ranks="many")
        padded = config + "#" * (1 << 20) + "\n"
        details = self.assert_refused(padded, "config_text")
        self.assertIn("--training-max-config-bytes", details)

    def test_job_files_are_private_and_removed_and_running_jobs_are_capped(self):
        checkpoint = os.path.join(self.area, "long.ckpt")
        job = self.start(quick_config(self.model, self.train, steps=1000000,
                                      checkpoint="long.ckpt")).job_id
        self.assertRegex(job, JOB_ID)
        first_step(self.stub, job)
        # The config is in a private directory under $TMPDIR (where mpirun
        # may keep its session directory too), with the
        # resolved paths; nothing is in /tmp under the old predictable name.
        dirs = glob.glob(os.path.join(self.tmp, "numaserve-training-*"))
        self.assertEqual(len(dirs), 1, os.listdir(self.tmp))
        self.assertEqual(stat.S_IMODE(os.lstat(dirs[0]).st_mode), 0o700)
        self.assertEqual(os.listdir(dirs[0]), ["job.cfg"])
        config = os.path.join(dirs[0], "job.cfg")
        self.assertEqual(stat.S_IMODE(os.lstat(config).st_mode), 0o600)
        with open(config) as f:
            self.assertIn('checkpoint: "%s"' % checkpoint, f.read())
        self.assertFalse(os.path.exists("/tmp/numaserve-training-%d" % self.server.pid))
        # --training-max-jobs 1 (the default): a second job waits its turn.
        details = self.assert_refused(quick_config(self.model, self.train), "running",
                                      code=grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("--training-max-jobs", details)
        # Anonymous callers: no listing; an id is needed whole.
        with self.assertRaises(grpc.RpcError) as ctx:
            self.stub.ListTrainings(tpb.ListTrainingsRequest(), timeout=10)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        for guess in (label_of(job), label_of(job) + "-" + "0" * 32, job[:-1]):
            with self.assertRaises(grpc.RpcError) as ctx:
                self.stub.CancelTraining(tpb.CancelTrainingRequest(job_id=guess), timeout=10)
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND, guess)
        self.stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job), timeout=10)
        final = final_state(self.stub, job, timeout=60)
        self.assertEqual(final.state, tpb.TrainingProgress.CANCELLED, final)
        self.assertEqual(glob.glob(os.path.join(self.tmp, "numaserve-training-*")), [])


class TrainingOwnersTest(unittest.TestCase):
    """Jobs belong to their caller: bearer tokens over TLS on the inference
    port, and client certificates (mTLS)."""

    TOKENS = {"alice": "alice-0123456789abcdef0123456789abcdef",
              "bob": "bob-fedcba9876543210fedcba9876543210"}

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_owners_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.dir, "train", 256, seed=5)
        cls.pki = nc.make_test_pki(os.path.join(cls.dir, "pki"))
        cls.token_file = os.path.join(cls.dir, "tokens")
        with open(cls.token_file, "w") as f:
            f.write("".join("%s %s\n" % kv for kv in cls.TOKENS.items()))
        os.chmod(cls.token_file, 0o600)
        cls.tls = ["--grpc-tls-cert", cls.pki["server_cert"], "--grpc-tls-key",
                   cls.pki["server_key"]]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check_owners(self, server, alice, bob, anonymous=None):
        """ALICE's job is hers alone; BOB, ANONYMOUS are credentials."""
        with server.training_channel(alice) as a, server.training_channel(bob) as b:
            sa, sb = tpb_grpc.TrainingServiceStub(a), tpb_grpc.TrainingServiceStub(b)
            job = sa.StartTraining(tpb.StartTrainingRequest(
                config_text=quick_config(self.model, self.train, steps=1000000),
                ranks="1"), timeout=30).job_id
            first_step(sa, job)
            self.assertEqual([j.job_id for j in sa.ListTrainings(
                tpb.ListTrainingsRequest(), timeout=10).jobs], [job])
            self.assertEqual(list(sb.ListTrainings(tpb.ListTrainingsRequest(),
                                                   timeout=10).jobs), [])
            for call in (lambda: sb.CancelTraining(tpb.CancelTrainingRequest(job_id=job),
                                                   timeout=10),
                         lambda: list(sb.WatchTraining(tpb.WatchTrainingRequest(job_id=job),
                                                       timeout=10))):
                with self.assertRaises(grpc.RpcError) as ctx:
                    call()
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND)
            if anonymous is not None:
                with server.training_channel(anonymous) as c:
                    with self.assertRaises(grpc.RpcError) as ctx:
                        tpb_grpc.TrainingServiceStub(c).CancelTraining(
                            tpb.CancelTrainingRequest(job_id=job), timeout=10)
                    self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            # Still running: bob's calls did nothing.
            state = sa.ListTrainings(tpb.ListTrainingsRequest(), timeout=10).jobs[0].state
            self.assertEqual(state, tpb.TrainingProgress.RUNNING)
            sa.CancelTraining(tpb.CancelTrainingRequest(job_id=job), timeout=10)
            final = final_state(sa, job, timeout=60)
            self.assertEqual(final.state, tpb.TrainingProgress.CANCELLED, final)

    def test_token_callers_see_only_their_jobs(self):
        def creds(name=None):
            return nc.tls_credentials(self.pki["ca"], token=self.TOKENS[name] if name else None)

        args = self.tls + ["--grpc-auth-token-file", self.token_file, "--training-service",
                           "--training-root", self.dir]
        with nc.ServerProcess(self.repo, args, credentials=creds("alice")) as server:
            # On the inference port, which has authentication.
            self.assertEqual(server.training_port, server.grpc_port)
            self.check_owners(server, creds("alice"), creds("bob"), anonymous=creds())
            self.assertIn("for token:alice", server.stderr_text())

    def test_callers_cannot_touch_each_others_files(self):
        """Each caller writes in its own directory only: bob can neither
        overwrite alice's checkpoint, resume from it, read it, nor export
        into her model, and no caller can replace a served model; alice
        goes on resuming and exporting her own."""
        def creds(name):
            return nc.tls_credentials(self.pki["ca"], token=self.TOKENS[name])

        exports = os.path.join(self.dir, "exports")
        os.makedirs(exports, exist_ok=True)
        args = self.tls + ["--grpc-auth-token-file", self.token_file, "--training-service",
                           "--training-root", self.dir]
        with nc.ServerProcess(self.repo, args, credentials=creds("alice")) as server, \
                server.training_channel(creds("alice")) as a, \
                server.training_channel(creds("bob")) as b:
            sa, sb = tpb_grpc.TrainingServiceStub(a), tpb_grpc.TrainingServiceStub(b)

            def config(steps=4, **paths):
                return quick_config(self.model, self.train, steps=steps, **paths)

            def run(stub, text, resume=False):
                started = stub.StartTraining(tpb.StartTrainingRequest(
                    config_text=text, ranks="1", resume=resume), timeout=30)
                final = final_state(stub, started.job_id)
                self.assertEqual(final.state, tpb.TrainingProgress.SUCCEEDED, final)
                return started.output_directory

            def refused(stub, text, field, resume=False):
                with self.assertRaises(grpc.RpcError) as ctx:
                    stub.StartTraining(tpb.StartTrainingRequest(
                        config_text=text, ranks="1", resume=resume), timeout=30)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.PERMISSION_DENIED,
                                 ctx.exception.details())
                self.assertIn("config field '%s'" % field, ctx.exception.details())

            alice_dir = run(sa, config(checkpoint="job.ckpt", export_repository="exports",
                                       export_model_name="alices"))
            self.assertEqual(alice_dir, caller_dir(self.dir, "token:alice"))
            theirs = os.path.join(alice_dir, "job.ckpt")
            self.assertEqual(read_weights(theirs)[0], 4)
            served = os.path.join(self.repo, MODEL, "1", "model.onnx")
            before = {d: tree(d) for d in (alice_dir, exports, self.repo)}

            for field in ("checkpoint", "final_weights", "timeline"):
                refused(sb, config(**{field: theirs}), field)
                refused(sb, config(**{field: served}), field)
            refused(sb, config(checkpoint=theirs), "checkpoint", resume=True)
            refused(sb, quick_config(self.model, (theirs, self.train[1])),
                    "dataset.train_images")
            refused(sb, config(export_repository="exports", export_model_name="alices"),
                    "export_model_name")
            refused(sb, config(export_repository=self.repo, export_model_name=MODEL),
                    "export_model_name")
            refused(sb, config(export_repository=alice_dir, export_model_name="b"),
                    "export_repository")
            self.assertEqual({d: tree(d) for d in before}, before)

            # Bob's own files, beside hers.
            bob_dir = run(sb, config(checkpoint="job.ckpt", export_repository="exports",
                                     export_model_name="bobs"))
            self.assertEqual(bob_dir, caller_dir(self.dir, "token:bob"))
            self.assertEqual(read_weights(os.path.join(bob_dir, "job.ckpt"))[0], 4)
            self.assertEqual(tree(alice_dir), before[alice_dir])
            # Alice resumes from her checkpoint and exports her next version.
            run(sa, config(steps=8, checkpoint="job.ckpt", export_repository="exports",
                           export_model_name="alices"), resume=True)
            self.assertEqual(read_weights(theirs)[0], 8)
            self.assertEqual(versions(os.path.join(exports, "alices")), [1, 2])
            self.assertEqual(versions(os.path.join(exports, "bobs")), [1])
            for name, caller in (("alices", "token:alice"), ("bobs", "token:bob")):
                with open(os.path.join(exports, name, OWNER_FILE)) as f:
                    self.assertEqual(f.read(), caller_id(caller) + "\n")
            self.assertEqual(tree(self.repo), before[self.repo])

    def test_client_certificate_callers_see_only_their_jobs(self):
        def creds(name):
            cert, key = self.pki["client"][name]
            return nc.tls_credentials(self.pki["ca"], cert, key)

        args = self.tls + ["--grpc-tls-client-ca", self.pki["ca"], "--training-service",
                           "--training-address", "127.0.0.1:0", "--training-root", self.dir]
        with nc.ServerProcess(self.repo, args, credentials=creds("alice")) as server:
            self.assertNotEqual(server.training_port, server.grpc_port)
            self.check_owners(server, creds("alice"), creds("bob"))
            self.assertIn("for cert:CN=alice", server.stderr_text())
            # The training port is TLS with client certificates as well.
            with nc.insecure_channel(server.training_address) as plain:
                with self.assertRaises(grpc.RpcError) as ctx:
                    tpb_grpc.TrainingServiceStub(plain).ListTrainings(
                        tpb.ListTrainingsRequest(), timeout=5)
                self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
