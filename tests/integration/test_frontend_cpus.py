#!/usr/bin/python3
"""`serve --frontend-cpus` (docs/scheduling.md, "The front end on cores of
its own") on this machine:

  * with the first allowed cpu as the front end's, every thread of the
    server (gRPC's, HTTP's, the timers', the metrics', the supervisor's,
    named supervisor-N) may run on that cpu alone, under traffic; the
    worker, whose process is forked from a supervisor thread, runs on the
    other cpus (it re-pins itself rather than keep the front end's mask),
    and answers;
  * without the flag nothing moves: the server and its worker may run on
    every cpu (the default keeps the behaviour of before);
  * `--input-copy node`: a thread copier-0 copies the batches' inputs into
    the worker's arena, on the front end's cpu on the worker's node (or,
    without front-end cpus, on the worker's cpus), and has run; `auto` on
    one node starts none (every thread writes locally already); a bad value
    is refused naming the flag;
  * a malformed list, a cpu the server may not use, or a list leaving no
    core for a worker is refused, naming the flag; `numaserve topology`
    plans the same way.

Needs two allowed cpus (the development machine has two).
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
import numaserve_client as nc  # noqa: E402

TIMEOUT_S = 120
MODEL = nc.DEFAULT_MODEL_NAME
ALLOWED = sorted(os.sched_getaffinity(0))


def cpu_list(text):
    cpus = []
    for item in text.strip().split(","):
        first, _, last = item.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def allowed_cpus(path):
    with open(path) as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return cpu_list(line.split(":", 1)[1])
    raise AssertionError("%s has no Cpus_allowed_list" % path)


def threads(pid):
    """{tid: (name, allowed cpus)} of PID's threads."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        base = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(base + "comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, allowed_cpus(base + "status"))
        except OSError:
            continue  # ended meanwhile
    return out


def timeslices(pid, tid):
    """How many times thread TID of PID has run on a cpu (/proc/.../schedstat)."""
    with open("/proc/%d/task/%d/schedstat" % (pid, tid)) as f:
        return int(f.read().split()[2])


def worker_pids(server):
    pids = []
    for pid in server.worker_pids():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if f.read().split(b"\0")[1:2] == [b"worker"]:
                    pids.append(pid)
        except OSError:
            continue
    return pids


@unittest.skipIf(len(ALLOWED) < 2, "needs two allowed cpus, has %s" % ALLOWED)
class FrontendCpusTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_frontend_cpus_")
        cls.repo = os.path.join(cls.dir, "repo")
        model = nc.write_default_model(cls.repo)
        cls.images = nc.random_images(4, seed=11)
        cls.expected = nc.ReferenceModel(model).run({"image": cls.images})["probabilities"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def serve(self, args):
        server = nc.ServerProcess(self.repo, list(args)).start()
        self.addCleanup(server.stop)

        def ready():
            return server.metrics().sum("numaserve_worker_ready") == 1
        self.assertTrue(nc.wait_until(ready, TIMEOUT_S), server.stderr_text())
        # Traffic from several clients at once, so that gRPC's thread pool
        # grows before the threads are read.
        def call(i, stub):
            got = nc.infer(stub, MODEL, {"image": self.images}, deadline=TIMEOUT_S)
            return np.allclose(got["probabilities"], self.expected, rtol=1e-4, atol=1e-5)
        results = nc.call_together(server, 16, call, timeout=TIMEOUT_S)
        self.assertEqual([r for r in results if r is not True], [], server.stderr_text())
        pids = worker_pids(server)
        self.assertEqual(len(pids), 1, server.stderr_text())
        return server, pids[0]

    def test_front_end_threads_on_its_cpu_and_the_worker_off_it(self):
        front, rest = ALLOWED[0], ALLOWED[1:]
        server, worker = self.serve(["--frontend-cpus", str(front)])
        what = server.stderr_text()
        self.assertIn("front end on cpus %d" % front, what)
        self.assertEqual(allowed_cpus("/proc/%d/status" % worker), rest,
                         "the worker's Cpus_allowed_list\n" + what)
        seen = threads(server.proc.pid)
        self.assertIn("supervisor-0", [name for name, _ in seen.values()], seen)
        for tid, (name, cpus) in seen.items():
            self.assertEqual(cpus, [front], "server thread %d (%s) may run on %s, not on the "
                             "front end's cpu alone\n%s" % (tid, name, cpus, what))

    def test_without_the_flag_nothing_moves(self):
        server, worker = self.serve([])
        self.assertEqual(allowed_cpus("/proc/%d/status" % worker), ALLOWED)
        for tid, (name, cpus) in threads(server.proc.pid).items():
            self.assertEqual(cpus, ALLOWED, "server thread %d (%s)" % (tid, name))

    def copiers(self, server):
        return {tid: cpus for tid, (name, cpus) in threads(server.proc.pid).items()
                if name.startswith("copier-")}

    def test_input_copy_node_copies_on_the_workers_node(self):
        front = ALLOWED[0]
        for args, wanted in ((["--frontend-cpus", str(front)], [front]), ([], ALLOWED)):
            with self.subTest(args=args):
                server, _ = self.serve(args + ["--input-copy", "node"])
                what = server.stderr_text()
                self.assertIn("inputs copied into each worker's arena on its node: worker 0 on "
                              "cpus", what)
                copiers = self.copiers(server)
                self.assertEqual(list(copiers.values()), [wanted], "copier-0's cpus\n" + what)
                tid = next(iter(copiers))
                # The 16 calls of serve() went through it.
                self.assertGreater(timeslices(server.proc.pid, tid), 0, what)
                self.assertEqual(server.stop(), 0, server.stderr_text())

    def test_input_copy_auto_on_one_node_leaves_the_copy_to_the_caller(self):
        server, _ = self.serve(["--frontend-cpus", str(ALLOWED[0])])
        self.assertEqual(self.copiers(server), {})
        self.assertNotIn("inputs copied into each worker's arena", server.stderr_text())

    def test_a_bad_input_copy_is_refused_naming_the_flag(self):
        args = ["serve", "--input-copy", "sideways", "--model-repository", self.repo,
                "--grpc-port", "0", "--metrics-port", "0", "--http-port", "-1"]
        result = nc.run_numaserve(args, timeout=TIMEOUT_S)
        self.assertNotEqual(result.returncode, 0, nc.describe_run(args, result))
        self.assertIn("--input-copy: 'sideways' is not one of auto, caller, node", result.stderr,
                      nc.describe_run(args, result))

    def test_bad_lists_are_refused_naming_the_flag(self):
        everything = "%d-%d" % (ALLOWED[0], ALLOWED[-1]) if ALLOWED == list(
            range(ALLOWED[0], ALLOWED[-1] + 1)) else ",".join(map(str, ALLOWED))
        outside = max(ALLOWED) + 1
        for value, mention in (("zero", "--frontend-cpus expects none, auto or a cpu list"),
                               ("0-", "--frontend-cpus expects"),
                               (str(outside), "--frontend-cpus: cpu %d is not one of" % outside),
                               (everything, "--frontend-cpus %s leaves no core for a worker"
                                % everything)):
            for command in ("serve", "topology"):
                with self.subTest(value=value, command=command):
                    args = [command, "--frontend-cpus", value]
                    if command == "serve":
                        args += ["--model-repository", self.repo, "--grpc-port", "0",
                                 "--metrics-port", "0", "--http-port", "-1"]
                    result = nc.run_numaserve(args, timeout=TIMEOUT_S)
                    self.assertNotEqual(result.returncode, 0, nc.describe_run(args, result))
                    self.assertIn(mention, result.stderr, nc.describe_run(args, result))
                    self.assertNotIn("grpc=", result.stdout)

    def test_topology_shows_the_front_end_and_the_supervisors(self):
        args = ["topology", "--json", "--frontend-cpus", str(ALLOWED[0])]
        result = nc.run_numaserve(args, timeout=TIMEOUT_S)
        self.assertEqual(result.returncode, 0, nc.describe_run(args, result))
        plan = json.loads(result.stdout)["plan"]
        self.assertEqual(plan["frontend_cpus"], [ALLOWED[0]])
        for worker in plan["workers"]:
            self.assertNotIn(ALLOWED[0], worker["cpus"])
            self.assertTrue(worker["supervisor_cpus"], worker)


if __name__ == "__main__":
    unittest.main()
