#!/usr/bin/python3
"""The scheduler keeps every instance slot busy, on a 2-core machine.

A synthetic topology of 8 NUMA nodes of 2 cores (`serve --topology`, the
bindings advisory here) gives 8 workers; `instances_per_domain: 2` gives
each 2 instances: 16 slots. `--test-batch-compute-us` makes every batch
take a fixed time T whatever its rows (the worker sleeps it out, using no
CPU), so the 2 real cores are enough to keep 16 slots busy and the
expected throughput is known: 16 slots x R rows per batch / T. Enough
callers of one row each keep more than two full batches per slot queued,
for a few seconds after a warm-up; then:
  * served rows/s >= 0.9 x 16 x R / T;
  * numaserve_instance_busy_seconds_total, one series per worker and
    instance (16), grew by amounts within 10% of each other (max/min over
    the measured interval, the difference of two scrapes);
  * every answer is the caller's own row, computed right.
The same 16 slots again as one worker of 16 instances (a synthetic node
of 16 cores; the worker counts the plan's cores when it cannot bind to
them), the shape that left slots idle when a worker held one waiting batch
for all its instances.

Then `serve --instances auto` on a real model: the worker logs the choice
and its figures ("instances auto: ... -> N"), ModelConfig's instance_group
counts N, a model whose config sets instances_per_domain keeps its own
count, and both answer correctly.
"""

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402
import prerequisites  # noqa: E402

PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")

SLOTS_MODEL = "slots"
SLOTS = 16
ROWS_PER_BATCH = 4                      # max_batch_size R
BATCH_US = 100000                       # T: every batch takes 100 ms
EXPECTED_ROWS_PER_SECOND = SLOTS * ROWS_PER_BATCH / (BATCH_US * 1e-6)   # 640
# Three full batches per slot in flight: one computing, two queued, so a
# slot that frees always finds a full batch, even while the answers of the
# batch before travel back to their callers and come again.
CALLERS = 3 * SLOTS * ROWS_PER_BATCH    # 192
CHANNELS = 4
WIDTH = 8
WARMUP_SECONDS = 2.0
MEASURE_SECONDS = 6.0                   # about 60 batches per slot
MIN_THROUGHPUT_FRACTION = 0.9
MAX_BUSY_SPREAD = 1.1

SLOTS_CONFIG = """
max_batch_size: %d
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_placement { instances_per_domain: %%d }
""" % ROWS_PER_BATCH

AUTO_MODEL = nc.DEFAULT_MODEL_NAME
FIXED_MODEL = "fixed_one_instance"

BUSY = "numaserve_instance_busy_seconds_total"
BATCHES = "numaserve_instance_batches_total"


def add_model(width, seed=11):
    """x FP32 [batch, WIDTH] -> Add(x, b) -> y: every row answered by itself."""
    from onnx import TensorProto, helper, numpy_helper

    bias = np.random.default_rng(seed).standard_normal(width).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model, bias


def write_config(repo, name, text):
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(text)


def per_slot(metrics, name, model=None):
    """{(worker, instance): value} of NAME, summed over any other labels."""
    values = collections.defaultdict(float)
    for _, labels, value in metrics.find(name):
        if model is not None and labels.get("model", model) != model:
            continue
        values[(labels.get("worker"), labels.get("slot"))] += value
    return dict(values)


def slot_order(slot):
    """Sorts (worker, instance) label pairs numerically where they are numbers."""
    return tuple((0, int(v), "") if str(v).isdigit() else (1, 0, str(v)) for v in slot)


class ClosedLoad:
    """CALLERS callers of one row each, over CHANNELS connections: each has
    one request in flight and sends the next from the answer's callback, so
    a few Python threads keep hundreds of requests in the server. Caller i
    sends base[i] + k for its k-th request (its rows differ from everyone
    else's) and checks the answer against base[i] + k + bias."""

    def __init__(self, server, model, bias, callers, channels):
        self.model = model
        self.bias = bias
        self.channels = [server.new_channel() for _ in range(channels)]
        self.stubs = [nc.pb_grpc.GRPCInferenceServiceStub(c) for c in self.channels]
        self.base = np.random.default_rng(7).standard_normal((callers, WIDTH)).astype(np.float32)
        self.callers = callers
        self.lock = threading.Lock()
        self.stopping = False
        self.in_flight = 0
        self.idle = threading.Condition(self.lock)
        self.answered = []          # monotonic time of every correct answer
        self.wrong = []             # (caller, k, what)
        self.errors = collections.Counter()
        self.error_examples = []

    def start(self):
        for i in range(self.callers):
            with self.lock:
                self.in_flight += 1
            self._send(i, 0)

    def _send(self, i, k):
        x = (self.base[i] + np.float32(k)).reshape(1, WIDTH)
        request = nc.make_request(self.model, {"x": x})
        try:
            future = self.stubs[i % len(self.stubs)].ModelInfer.future(request, timeout=60)
        except Exception as e:  # noqa: BLE001  (a closed channel: record, stop)
            self._done(i, k, error=repr(e))
            return
        future.add_done_callback(lambda f, i=i, k=k, x=x: self._answered(f, i, k, x))

    def _answered(self, future, i, k, x):
        now = time.monotonic()
        try:
            response = future.result()
        except grpc.RpcError as e:
            self._done(i, k, error="%s: %s" % (e.code().name, e.details()))
            return
        try:
            y = nc.decode_outputs(response)["y"]
            ok = y.shape == (1, WIDTH) and np.allclose(y, x + self.bias, rtol=1e-6, atol=1e-6)
        except Exception as e:  # noqa: BLE001
            self._done(i, k, wrong=repr(e))
            return
        if not ok:
            self._done(i, k, wrong="got %r for %r" % (y, x))
            return
        with self.lock:
            self.answered.append(now)
            stop = self.stopping
        if stop:
            self._done(i, k)
        else:
            self._send(i, k + 1)

    def _done(self, i, k, error=None, wrong=None):
        with self.lock:
            if error is not None:
                self.errors[error.split(":")[0]] += 1
                if len(self.error_examples) < 5:
                    self.error_examples.append("caller %d request %d: %s" % (i, k, error))
            if wrong is not None:
                self.wrong.append((i, k, wrong))
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.notify_all()

    def answered_between(self, t0, t1):
        with self.lock:
            return sum(1 for t in self.answered if t0 <= t < t1)

    def stop(self, timeout=60):
        """Lets every caller finish its request in flight; True if all did."""
        with self.lock:
            self.stopping = True
            done = self.idle.wait_for(lambda: self.in_flight == 0, timeout)
        for c in self.channels:
            c.close()
        return done


class SchedulerSlotsTest(unittest.TestCase):
    """16 slots (8 workers x 2 instances) with fixed-time batches."""

    WORKERS, INSTANCES = 8, 2

    @classmethod
    def setUpClass(cls):
        assert cls.WORKERS * cls.INSTANCES == SLOTS
        cls.repo = tempfile.mkdtemp(prefix="numaserve_slots_")
        model, cls.bias = add_model(WIDTH)
        nc.write_model(cls.repo, SLOTS_MODEL, model)
        write_config(cls.repo, SLOTS_MODEL, SLOTS_CONFIG % cls.INSTANCES)
        topology = "package:1 numa:%d core:%d pu:1" % (cls.WORKERS, cls.INSTANCES)
        cls.server = nc.ServerProcess(cls.repo, [
            "--topology", topology, "--domain", "numa",
            "--test-batch-compute-us", str(BATCH_US),
            "--worker-arena-mb", "16"]).start()
        cls.stub = cls.server.stub()
        ready = nc.wait_until(lambda: cls.stub.ModelReady(
            nc.pb.ModelReadyRequest(name=SLOTS_MODEL), timeout=10).ready, 60)
        if not ready:
            raise AssertionError("model %s not ready\n%s"
                                 % (SLOTS_MODEL, cls.server.stderr_text(6000)))
        cls.load = ClosedLoad(cls.server, SLOTS_MODEL, cls.bias, CALLERS, CHANNELS)
        cls.load.start()
        time.sleep(WARMUP_SECONDS)
        # The measured interval: between the two scrapes, the callers'
        # answers counted over the same span of time.
        cls.t0 = time.monotonic()
        cls.before_text = cls.server.scrape()
        cls.t0 = (cls.t0 + time.monotonic()) / 2
        time.sleep(MEASURE_SECONDS)
        cls.t1 = time.monotonic()
        cls.after_text = cls.server.scrape()
        cls.t1 = (cls.t1 + time.monotonic()) / 2
        cls.drained = cls.load.stop()
        cls.before = nc.Metrics(cls.before_text)
        cls.after = nc.Metrics(cls.after_text)
        cls.seconds = cls.t1 - cls.t0

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(6000)

    def busy_deltas(self):
        before = per_slot(self.before, BUSY, SLOTS_MODEL)
        after = per_slot(self.after, BUSY, SLOTS_MODEL)
        return {slot: after[slot] - before.get(slot, 0.0) for slot in after}

    def test_every_worker_has_its_instances(self):
        log = self.server.stderr_text(0)
        placed = set(re.findall(r"numaserve: worker (\d+): %s:1: instance (\d+) of %d on cpus"
                                % (SLOTS_MODEL, self.INSTANCES), log))
        self.assertEqual(len(placed), SLOTS, "instance lines: %s%s" % (sorted(placed), self.log()))
        self.assertEqual({w for w, _ in placed}, {str(w) for w in range(self.WORKERS)})
        response = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=SLOTS_MODEL))
        self.assertEqual(sum(g.count for g in response.config.instance_group), SLOTS, response)

    def test_every_answer_is_the_callers_own_row(self):
        self.assertTrue(self.drained, "callers still waiting 60 s after the load stopped"
                        + self.log())
        self.assertEqual(self.load.wrong[:5], [], "%d wrong answers" % len(self.load.wrong))
        self.assertEqual(dict(self.load.errors), {},
                         "failed calls, e.g. %s%s" % (self.load.error_examples, self.log()))
        self.assertGreater(len(self.load.answered), 0)

    def test_served_throughput_fills_all_slots(self):
        answered = self.load.answered_between(self.t0, self.t1)
        served = answered / self.seconds
        rows = (self.after.sum("numaserve_inferences_total", model=SLOTS_MODEL)
                - self.before.sum("numaserve_inferences_total", model=SLOTS_MODEL))
        batches = (self.after.sum("numaserve_executions_total", model=SLOTS_MODEL)
                   - self.before.sum("numaserve_executions_total", model=SLOTS_MODEL))
        ratio = served / EXPECTED_ROWS_PER_SECOND
        print("\nslots: %d workers x %d instances, R=%d, T=%.0f ms, %d callers: "
              "served %.1f rows/s by the callers' count, %.1f by the server's "
              "(%.0f batches of %.2f rows mean) over %.2f s; expected %.0f; ratio %.3f"
              % (self.WORKERS, self.INSTANCES, ROWS_PER_BATCH, BATCH_US / 1000, CALLERS, served,
                 rows / self.seconds, batches, rows / batches if batches else 0,
                 self.seconds, EXPECTED_ROWS_PER_SECOND, ratio), file=sys.stderr)
        self.assertGreaterEqual(
            ratio, MIN_THROUGHPUT_FRACTION,
            "served %.1f rows/s, below %.1f x %d slots x %d rows / %.3f s = %.1f%s"
            % (served, MIN_THROUGHPUT_FRACTION, SLOTS, ROWS_PER_BATCH, BATCH_US * 1e-6,
               MIN_THROUGHPUT_FRACTION * EXPECTED_ROWS_PER_SECOND, self.log()))

    def test_every_slot_is_equally_busy(self):
        busy = self.busy_deltas()
        batches_before = per_slot(self.before, BATCHES, SLOTS_MODEL)
        batches = {slot: v - batches_before.get(slot, 0.0)
                   for slot, v in per_slot(self.after, BATCHES, SLOTS_MODEL).items()}
        table = ", ".join("w%s/i%s %.2fs %d" % (w, i, busy[(w, i)], batches.get((w, i), 0))
                          for w, i in sorted(busy, key=slot_order))
        low, high = (min(busy.values()), max(busy.values())) if busy else (0.0, 0.0)
        spread = high / low if low > 0 else float("inf")
        print("\nslots: busy seconds and batches per worker/instance over %.2f s: %s; "
              "busy %.0f%% of the interval (mean), max/min %.3f"
              % (self.seconds, table,
                 100 * sum(busy.values()) / (len(busy) * self.seconds) if busy else 0, spread),
              file=sys.stderr)
        self.assertEqual(len(busy), SLOTS, "%s series: %s" % (BUSY, sorted(busy)))
        self.assertEqual(len(batches), SLOTS, "%s series: %s" % (BATCHES, sorted(batches)))
        self.assertEqual({w for w, _ in busy}, {str(w) for w in range(self.WORKERS)})
        self.assertGreater(low, 0, "an idle slot: %s%s" % (table, self.log()))
        self.assertLessEqual(spread, MAX_BUSY_SPREAD,
                             "busy seconds per slot differ by more than 10%%: %s" % table)
        # The batches per slot add up to the model's executions.
        executions = (self.after.sum("numaserve_executions_total", model=SLOTS_MODEL)
                      - self.before.sum("numaserve_executions_total", model=SLOTS_MODEL))
        self.assertAlmostEqual(sum(batches.values()), executions,
                               delta=max(2.0, 0.02 * executions))

    def test_instance_series_carry_worker_and_numa_labels(self):
        for name in (BUSY, BATCHES):
            samples = self.after.find(name)
            self.assertTrue(samples, "%s missing from /metrics" % name)
            for _, labels, _ in samples:
                for label in ("worker", "numa_node", "slot"):
                    self.assertIn(label, labels, "%s %s" % (name, labels))
        self.assertIn("# TYPE %s counter" % BUSY, self.after_text)
        self.assertIn("# TYPE %s counter" % BATCHES, self.after_text)

    def test_promtool_check_metrics(self):
        if not os.access(PROMTOOL, os.X_OK):
            prerequisites.missing(self, "%s not found" % PROMTOOL)
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=self.after_text,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0, "promtool check metrics failed:\n%s"
                         % result.stdout)


class OneWorkerSixteenInstancesTest(SchedulerSlotsTest):
    """The same 16 slots as 16 instances in one worker (a synthetic node of
    16 cores): the worker holds one waiting batch per instance, so one
    worker keeps 16 slots as busy as 8 workers do."""

    WORKERS, INSTANCES = 1, 16


class InstancesAutoTest(unittest.TestCase):
    """`serve --instances auto` on one 2-core worker: the choice from the
    model's own scaling is logged with its figures and reported by
    ModelConfig; a config's own instances_per_domain wins over the flag."""

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_auto_")
        path = nc.write_default_model(cls.repo)
        cls.reference = nc.ReferenceModel(path)
        write_config(cls.repo, AUTO_MODEL, "max_batch_size: 16\n")
        shutil.copytree(os.path.join(cls.repo, AUTO_MODEL), os.path.join(cls.repo, FIXED_MODEL))
        write_config(cls.repo, FIXED_MODEL,
                     "max_batch_size: 16\ninstance_placement { instances_per_domain: 1 }\n")
        cls.server = nc.ServerProcess(cls.repo, ["--cpuset", "0-1", "--instances", "auto"]).start()
        cls.stub = cls.server.stub()
        for name in (AUTO_MODEL, FIXED_MODEL):
            nc.wait_until(lambda name=name: cls.stub.ModelReady(
                nc.pb.ModelReadyRequest(name=name), timeout=10).ready, 60)

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(6000)

    def auto_lines(self, model):
        return re.findall(r"numaserve: worker (\d+): %s:1: instances auto: (.*) -> (\d+)\s*$"
                          % re.escape(model), self.server.stderr_text(0), re.MULTILINE)

    def test_the_choice_is_logged_and_counted_by_model_config(self):
        lines = self.auto_lines(AUTO_MODEL)
        self.assertEqual(len(lines), 1, "one worker, one 'instances auto' line%s" % self.log())
        worker, figures, chosen = lines[0]
        chosen = int(chosen)
        print("\nauto: worker %s: %s:1: instances auto: %s -> %d"
              % (worker, AUTO_MODEL, figures, chosen), file=sys.stderr)
        self.assertIn(chosen, (1, 2), "2 cores: 1 or 2 instances")
        response = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=AUTO_MODEL))
        groups = response.config.instance_group
        self.assertEqual(sum(g.count for g in groups), chosen, response)
        if chosen > 1:
            for i in range(1, chosen + 1):
                self.assertIn("%s:1: instance %d of %d on cpus" % (AUTO_MODEL, i, chosen),
                              self.server.stderr_text(0), self.log())

    def test_a_config_that_sets_instances_keeps_them(self):
        self.assertEqual(self.auto_lines(FIXED_MODEL), [], self.log())
        response = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=FIXED_MODEL))
        self.assertEqual(sum(g.count for g in response.config.instance_group), 1, response)

    def test_both_answer_correctly(self):
        for name in (AUTO_MODEL, FIXED_MODEL):
            images = nc.random_images(3, seed=21)
            expected = self.reference.run({"image": images})["probabilities"]
            results = nc.call_together(
                self.server, 8, lambda i, stub, name=name: nc.infer(
                    stub, name, {"image": images}, deadline=60)["probabilities"])
            for i, got in enumerate(results):
                self.assertIsInstance(got, np.ndarray, "%s caller %d: %r%s"
                                      % (name, i, got, self.log()))
                np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5,
                                           err_msg="%s caller %d" % (name, i))


if __name__ == "__main__":
    unittest.main()
