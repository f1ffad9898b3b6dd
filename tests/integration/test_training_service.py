#!/usr/bin/python3
"""numaserve.training.TrainingService against a real server: a job started
over gRPC runs `numaserve train` (mpirun) as a child of the server, keeps
running when its client goes away, streams progress, exports a new model
version, can be listed and cancelled; a bad config is INVALID_ARGUMENT with
the line of the error.
"""

import os
import shutil
import sys
import tempfile
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
sys.path.insert(0, HERE)
import numaserve_client as nc  # noqa: E402
from test_training import synthetic_dataset  # noqa: E402


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

    def config_text(self, max_steps, export=True):
        text = ('model: "%s"\n' % self.model +
                'dataset { train_images: "%s" train_labels: "%s" test_images: "%s" '
                'test_labels: "%s" }\n' % (self.train + self.test) +
                "global_batch_size: 32\nlearning_rate: 0.05\nepochs: 1000\n"
                "max_steps: %d\nlog_every_steps: 8\nsgd { momentum: 0.9 }\n" % max_steps)
        if export:
            text += 'export_repository: "%s"\nexport_model_name: "%s"\n' % (self.repo, MODEL)
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
        job = stub.StartTraining(tpb.StartTrainingRequest(
            config_text=self.config_text(1000000, export=False), ranks="1")).job_id
        stream = stub.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=120)
        for update in stream:
            if update.step > 0:
                break
        stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job))
        final = self.wait_for_state(job, timeout=60)
        self.assertEqual(final.state, tpb.TrainingProgress.CANCELLED, final)
        self.assertLess(final.step, 1000000)
        with self.assertRaises(grpc.RpcError) as ctx:
            stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

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


if __name__ == "__main__":
    unittest.main()
