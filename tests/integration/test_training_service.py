#!/usr/bin/python3
"""numaserve.training.TrainingService against a real server: a job started
over gRPC runs `numaserve train` (mpirun) as a child of the server, keeps
running when its client goes away, streams progress, exports a new model
version, can be listed and cancelled (stopping after a step with a
checkpoint); its figures are numaserve_training_* metrics on /metrics
(checked by `promtool check metrics`); a server shut down while a job runs
stops it with a checkpoint and leaves no process behind; a bad config is
INVALID_ARGUMENT with the line of the error.
"""

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
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


class TrainingServiceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_service_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.dir, "train", 2048, seed=1)
        cls.test = synthetic_dataset(cls.dir, "t10k", 256, seed=2)
        cls.server = nc.ServerProcess(cls.repo).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def stub(self, channel=None):
        return tpb_grpc.TrainingServiceStub(channel or self.server.channel())

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
        stub = self.stub()
        deadline = time.time() + timeout
        while time.time() < deadline:
            jobs = {j.job_id: j for j in stub.ListTrainings(tpb.ListTrainingsRequest()).jobs}
            if jobs[job_id].state != tpb.TrainingProgress.RUNNING:
                return jobs[job_id]
            time.sleep(0.1)
        self.fail("job %s still running after %ss" % (job_id, timeout))

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
        version_dirs = sorted(int(v) for v in os.listdir(os.path.join(self.repo, MODEL)))
        self.assertGreaterEqual(version_dirs[-1], 2)
        self.assertTrue(os.path.exists(
            os.path.join(self.repo, MODEL, str(version_dirs[-1]), "model.onnx")))

    def test_job_survives_its_client_and_is_listed(self):
        channel = self.server.new_channel()
        job = self.stub(channel).StartTraining(
            tpb.StartTrainingRequest(config_text=self.config_text(200, export=False),
                                     ranks="1")).job_id
        channel.close()
        final = self.wait_for_state(job)
        self.assertEqual(final.state, tpb.TrainingProgress.SUCCEEDED, final)
        self.assertEqual(final.step, 200)

    def test_cancel_ends_the_job(self):
        stub = self.stub()
        checkpoint = os.path.join(self.dir, "cancelled.ckpt")
        job = stub.StartTraining(tpb.StartTrainingRequest(
            config_text=self.config_text(1000000, export=False, checkpoint=checkpoint),
            ranks="1")).job_id
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

        def value(metrics, name):
            found = metrics.find(name, job_id=job)
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
        # After: the last progress line's figures.
        self.assertEqual(value(after, "numaserve_training_step"), 400)
        self.assertEqual(value(after, "numaserve_training_total_steps"), 400)
        self.assertEqual(value(after, "numaserve_training_epoch"), final.epoch)
        self.assertGreaterEqual(final.epoch, 6)  # 2048 / 32 = 64 steps an epoch
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
            checkpoint = os.path.join(directory, "job.ckpt")
            config = ('model: "%s"\ndataset { train_images: "%s" train_labels: "%s" }\n'
                      "global_batch_size: 32\nlearning_rate: 0.05\nepochs: 100000\n"
                      'log_every_steps: 4\ncheckpoint: "%s"\n' % ((model,) + train + (checkpoint,)))
            server = nc.ServerProcess(repo).start()
            try:
                stub = tpb_grpc.TrainingServiceStub(server.channel())
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
            self.assertIn("stopping training job %s" % job, stderr)
            step, _ = read_weights(checkpoint)
            self.assertGreaterEqual(step, update.step)
            self.assertIn("training job %s cancelled at step %d: cancelled: stopped at step %d"
                          % (job, step, step), stderr)
            alive = [p for p in descendants if os.path.exists("/proc/%d" % p)
                     and not nc._is_zombie(p)]
            self.assertEqual(alive, [], "left running after the server exited")
        finally:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
