#!/usr/bin/python3
"""The process settings (--max-isa, --blis-arch, --openblas-core,
--gemm-cache, --profile-steps, --training-reference-ops and their
NUMASERVE_* variables) reach a server's workers and training jobs as flags,
never through their environment (docs/security.md, "Round two: hidden
configuration"; docs/configuration.md, "Process settings"):

  * a server started with the variables set hands each to its workers as
    a flag (/proc/PID/cmdline), and no worker has any of the variables in
    its environment (/proc/PID/environ); the workers run capped (their
    dispatch record: oneDNN capped at avx2);
  * a training job started on that server (`numaserve train`, mpirun and
    its rank) gets the kernel and training settings as flags and none of
    the variables, and its rank trains on the reference ops;
  * `serve --max-isa avx2`, with no variable set, caps the workers the same
    way;
  * a bad value stops the command, naming the flag or the variable.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
sys.path.insert(0, HERE)
import numaserve_client as nc  # noqa: E402
from test_training import synthetic_dataset  # noqa: E402
from test_training_service import (final_state, first_step, quick_config, tpb,  # noqa: E402
                                   tpb_grpc, training_args)

TIMEOUT_S = 60
VARIABLES = ("NUMASERVE_MAX_ISA", "NUMASERVE_BLIS_ARCH", "NUMASERVE_OPENBLAS_CORE",
             "NUMASERVE_GEMM_CACHE", "NUMASERVE_PROFILE_STEPS",
             "NUMASERVE_TRAINING_REFERENCE_OPS")


def cmdline(pid):
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        return f.read().decode("utf-8", "replace").split("\0")[:-1]


def environment(pid):
    """PID's environment as it was started with (its KEY=VALUE block)."""
    with open("/proc/%d/environ" % pid, "rb") as f:
        entries = f.read().decode("utf-8", "replace").split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


def descendants(pid):
    found, todo = set(), [pid]
    while todo:
        children = nc.child_pids(todo.pop())
        found |= children
        todo.extend(children)
    return found


def records(text):
    """The JSON log records in TEXT."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class ProcessSettingsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_process_settings_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.dir, "train", 256, seed=7)
        cls.cache = os.path.join(cls.dir, "gemm_choices.tsv")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start(self, args=(), env=None):
        base = {k: v for k, v in os.environ.items() if k not in VARIABLES}
        base.update(env or {})
        server = nc.ServerProcess(self.repo, ["--log-format", "json"] + list(args),
                                  env=base).start()
        self.addCleanup(server.stop)
        return server

    def workers(self, server):
        """The pids of the server's workers once they have loaded the model."""
        def ready():
            samples = server.metrics().find("numaserve_worker_ready")
            return len(samples) > 0 and all(value == 1 for _, _, value in samples)
        self.assertTrue(nc.wait_until(ready, TIMEOUT_S), server.stderr_text())
        pids = [pid for pid in server.worker_pids() if cmdline(pid)[1:2] == ["worker"]]
        self.assertGreater(len(pids), 0, server.stderr_text())
        return pids

    def assert_workers_run_capped(self, server, pids):
        """Each worker's dispatch record (logged at its first kernel, the
        model's load): the own kernels at most AVX2, oneDNN capped at it."""
        dispatch = {}

        def logged():
            for r in records(server.stderr_text(tail=0)):
                if r.get("component") == "dispatch" and r.get("pid") in pids:
                    dispatch[r["pid"]] = r
            return sorted(dispatch) == sorted(pids)
        self.assertTrue(nc.wait_until(logged, TIMEOUT_S),
                        "dispatch records %s\n%s" % (dispatch, server.stderr_text()))
        for pid, record in dispatch.items():
            self.assertIn(record.get("tier"), ("avx2", "scalar"), record)
            self.assertEqual(record.get("onednn_cap"), "avx2", record)

    def test_variables_reach_workers_and_jobs_as_flags_only(self):
        env = {"NUMASERVE_MAX_ISA": "avx2", "NUMASERVE_BLIS_ARCH": "haswell",
               "NUMASERVE_OPENBLAS_CORE": "Haswell", "NUMASERVE_GEMM_CACHE": self.cache,
               "NUMASERVE_PROFILE_STEPS": "1", "NUMASERVE_TRAINING_REFERENCE_OPS": "1"}
        server = self.start(training_args(self.dir), env)
        pids = self.workers(server)
        for pid in pids:
            args = cmdline(pid)
            for flag in ("--max-isa=avx2", "--blis-arch=haswell", "--openblas-core=Haswell",
                         "--gemm-cache=" + self.cache, "--profile-steps"):
                self.assertIn(flag, args, "worker %d: %s" % (pid, args))
            inherited = sorted(set(VARIABLES) & set(environment(pid)))
            self.assertEqual(inherited, [], "worker %d inherited %s" % (pid, inherited))
        self.assert_workers_run_capped(server, pids)

        channel = server.training_channel()
        self.addCleanup(channel.close)
        stub = tpb_grpc.TrainingServiceStub(channel)
        job = stub.StartTraining(tpb.StartTrainingRequest(
            config_text=quick_config(self.model, self.train, steps=1000000), ranks="1"),
            timeout=30).job_id
        first_step(stub, job)
        job_pids = descendants(server.pid) - set(server.worker_pids())
        ranks = []
        for pid in job_pids:
            try:
                args, env_of = cmdline(pid), environment(pid)
            except OSError:
                continue  # it exited meanwhile
            inherited = sorted(set(VARIABLES) & set(env_of))
            self.assertEqual(inherited, [], "%s (pid %d) inherited %s" % (args, pid, inherited))
            if "train" in args and "--config" in args:
                ranks.append(args)
        # `numaserve train` became mpirun; its rank is `numaserve train` again.
        self.assertGreaterEqual(len(ranks), 1, job_pids)
        for args in ranks:
            self.assertIn("--max-isa=avx2", args)
            self.assertIn("--training-reference-ops", args)
            self.assertNotIn("--gemm-cache=" + self.cache, args)  # not a job's setting
        self.assertTrue(nc.wait_until(
            lambda: "on their reference implementations" in server.stderr_text(tail=0),
            TIMEOUT_S), server.stderr_text())
        stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job), timeout=10)
        final = final_state(stub, job, timeout=TIMEOUT_S)
        self.assertEqual(final.state, tpb.TrainingProgress.CANCELLED, final)

    def test_the_flag_caps_the_workers_too(self):
        server = self.start(["--max-isa", "avx2"])
        pids = self.workers(server)
        for pid in pids:
            self.assertIn("--max-isa=avx2", cmdline(pid))
        self.assert_workers_run_capped(server, pids)

    def test_a_bad_value_is_refused_naming_the_flag_or_the_variable(self):
        binary = nc.default_binary()
        base = {k: v for k, v in os.environ.items() if k not in VARIABLES}
        flag = subprocess.run([binary, "bench", "--model", self.model, "--max-isa", "avx1024"],
                              capture_output=True, text=True, timeout=60, env=base)
        self.assertEqual(flag.returncode, 2, flag.stderr)
        self.assertIn("--max-isa (NUMASERVE_MAX_ISA): 'avx1024' is not one of avx2, avx512, amx",
                      flag.stderr)
        variable = subprocess.run([binary, "serve", "--model-repository", self.repo],
                                  capture_output=True, text=True, timeout=60,
                                  env=dict(base, NUMASERVE_MAX_ISA="sse9"))
        self.assertEqual(variable.returncode, 2, variable.stderr)
        self.assertIn("NUMASERVE_MAX_ISA: 'sse9' is not one of avx2, avx512, amx",
                      variable.stderr)


if __name__ == "__main__":
    unittest.main()
