#!/usr/bin/python3
"""numaserve on a machine with several NUMA nodes, checked from inside a QEMU
guest that tests/numa/guest.py boots with one of tests/numa/topologies.py.
The guest's topology (topology.json, $NUMA_GUEST_TOPOLOGY) is the truth
numaserve's view is checked against:

  * `numaserve topology`: one worker per node with cpus, on that node's
    cpus and memory; every node counted and listed, a memory-only node
    marked so and given no worker;
  * a served model (the default repository, <build>/models, as `make serve`
    serves it): each worker's Cpus_allowed_list is its node's cpus, its
    memory policy (numa_maps) binds to its node, at least 95% of its
    anonymous and shared-memory pages lie on its node (and the server's
    numaserve_worker_node_memory_bytes says so too), and requests reach
    every worker with the right answers;
  * with --membind strict, every worker's policy is "bind:N" (MPOL_BIND);
    with the policy refused (NUMASERVE_TEST_REFUSE_MEMBIND=1, as a
    container's seccomp filter refuses it), first touch from the worker's
    cpus still puts its pages on its node, and it says so;
  then, with NUMA_GUEST_CHECKS=full (make test-numa; ctest's short run,
  NUMA_GUEST_CHECKS=short, runs only SHORT_TESTS below):
  * a worker killed with SIGKILL under traffic: no request lost, the
    replacement bound to the same node;
  * `numaserve train` with one rank per node (real mpirun): each rank on
    its node's cpus, its pages on its node;
  * under `taskset -c <one node's cpus>` the plan has one worker;
  * `--max-workers 2` on a topology of several packages takes one node of
    each package;
  * `serve --weights-node <the memory-only node>` (topologies with one):
    each worker's weights on that node, its arena and the rest of its
    memory on its own node;
  * `serve --frontend-cpus <the first cpu>`: every thread of the server
    (gRPC's, HTTP's, the timers', the metrics') may run on that cpu alone
    but the supervisor threads and the input copiers (--input-copy auto:
    workers on several nodes), each on its worker's node (the front end's
    cpu there, else its worker's cpus), the copiers having made the copies;
    each worker on its node's cpus less the front end's, and answering.

A summary of what was seen (plans, numa_maps sums) goes to
$NUMA_GUEST_OUT/report.txt.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import numaserve_client as nc  # noqa: E402
import numa_procfs  # noqa: E402
import test_worker_failure as worker_failure  # noqa: E402  (its Traffic)

with open(os.environ["NUMA_GUEST_TOPOLOGY"]) as _f:
    TOPOLOGY = json.load(_f)
FULL = os.environ.get("NUMA_GUEST_CHECKS", "full") == "full"
OUT = os.environ.get("NUMA_GUEST_OUT", tempfile.gettempdir())
MODEL = nc.DEFAULT_MODEL_NAME
LOCAL_FRACTION = 0.95   # of a worker's anonymous + shared-memory pages on its node
SLOW = 300              # seconds: everything runs under TCG emulation


def cpu_nodes():
    """[(node, its cpus)] of the nodes with cpus, in node order."""
    return [(i, n["cpus"]) for i, n in enumerate(TOPOLOGY["nodes"]) if n["cpus"]]


def memory_only_nodes():
    return [i for i, n in enumerate(TOPOLOGY["nodes"]) if not n["cpus"]]


def package_of_node(node):
    return TOPOLOGY["nodes"][node]["cpus"][0] // TOPOLOGY["cores"]


def report(title, text):
    with open(os.path.join(OUT, "report.txt"), "a") as f:
        f.write("### %s: %s\n%s\n\n" % (TOPOLOGY["name"], title, text.rstrip()))


def numaserve(*args, timeout=SLOW):
    result = nc.run_numaserve(list(args), timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(nc.describe_run(args, result))
    return result.stdout


def worker_flags(pid):
    """{"index": int, "numa-node": int, "cpus": [..]} from a worker's command
    line; None for a child of the server that is not (yet) a worker: one
    just forked, before its exec, or gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if len(args) < 2 or args[1] != "worker":
        return None
    flags = {}
    for name in ("index", "numa-node", "cpus"):
        if "--" + name in args[:-1]:
            flags[name] = args[args.index("--" + name) + 1]
    if len(flags) != 3:
        return None
    return {"index": int(flags["index"]), "numa-node": int(flags["numa-node"]),
            "cpus": numa_procfs.parse_cpu_list(flags["cpus"])}


def worker_pids(server):
    """{index: pid} of the server's workers (see worker_flags)."""
    pids = {}
    for pid in server.worker_pids():
        flags = worker_flags(pid)
        if flags is not None:
            pids[flags["index"]] = pid
    return pids


class PlanTest(unittest.TestCase):
    """`numaserve topology` against the guest's topology."""

    def plan(self, *args, env_prefix=()):
        cmd = list(env_prefix) + [nc.default_binary(), "topology", "--json"] + list(args)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=SLOW)
        self.assertEqual(result.returncode, 0, "%s: %s" % (cmd, result.stderr))
        return json.loads(result.stdout)

    def test_one_worker_per_node_with_cpus(self):
        text = numaserve("topology", "--cpu-features=false")
        report("numaserve topology", text)
        plan = self.plan()
        workers = plan["plan"]["workers"]
        self.assertEqual([(w["numa_node"], w["cpus"]) for w in workers], cpu_nodes(),
                         "one worker per node with cpus, on its cpus\n" + text)
        listed = {n["os_index"]: n["cpus"] for n in plan["topology"]["numa_nodes"]}
        self.assertEqual(listed, dict(cpu_nodes()), text)
        for node in memory_only_nodes():
            self.assertNotIn(node, [w["numa_node"] for w in workers], text)

    def test_every_node_is_counted_and_a_memory_only_node_is_marked(self):
        text = numaserve("topology", "--cpu-features=false")
        total = len(TOPOLOGY["nodes"])
        self.assertIn("%d NUMA nodes" % total, text, "the guest has %d nodes (%d memory-only)\n%s"
                      % (total, len(memory_only_nodes()), text))
        listed = self.plan()["topology"].get("memory_only_nodes", [])
        self.assertEqual([n["os_index"] for n in listed], memory_only_nodes(), text)
        for node in memory_only_nodes():
            self.assertIn("numa %d: memory only" % node, text)

    def test_taskset_to_one_node_plans_one_worker(self):
        node, cpus = cpu_nodes()[-1]
        cpu_list = ",".join(str(c) for c in cpus)
        plan = self.plan(env_prefix=["taskset", "-c", cpu_list])
        workers = plan["plan"]["workers"]
        self.assertEqual([(w["numa_node"], w["cpus"]) for w in workers], [(node, cpus)],
                         json.dumps(plan["plan"]))
        # The nodes taskset leaves without cpus are not memory-only nodes.
        listed = [n["os_index"] for n in plan["topology"].get("memory_only_nodes", [])]
        self.assertEqual(listed, memory_only_nodes(), json.dumps(plan["topology"]))

    def test_max_workers_spreads_over_packages(self):
        packages = sorted({package_of_node(n) for n, _ in cpu_nodes()})
        plan = self.plan("--max-workers", str(len(packages)))
        chosen = [w["numa_node"] for w in plan["plan"]["workers"]]
        report("numaserve topology --max-workers %d" % len(packages), json.dumps(plan["plan"]))
        self.assertEqual(sorted(package_of_node(n) for n in chosen), packages,
                         "--max-workers %d took nodes %s, of packages %s; the guest has "
                         "packages %s" % (len(packages), chosen,
                                          [package_of_node(n) for n in chosen], packages))


class ServerCase(unittest.TestCase):
    """One server for the class, serving <build>/models (make serve's
    repository) with ARGS and, where ENV is set, those variables added."""

    ARGS = ()
    ENV = None

    @classmethod
    def policies_wanted(cls, node):
        """The numa_maps policies a worker on `node` may show. hwloc's
        non-strict bind is MPOL_PREFERRED_MANY ("prefer (many):N") where the
        kernel has it; "local" is the policy OpenBLAS gives its buffers
        (mbind MPOL_PREFERRED, no node): the node of the touching cpu, which
        the cpu binding makes this one. The page counts check where pages
        actually are."""
        return {"bind:%d" % node, "prefer:%d" % node, "prefer (many):%d" % node, "local"}

    @classmethod
    def setUpClass(cls):
        binary = nc.default_binary()
        cls.repo = os.path.join(os.path.dirname(os.path.dirname(binary)), "models")
        model_path = os.path.join(cls.repo, MODEL, "1", "model.onnx")
        reference = nc.ReferenceModel(model_path)
        cls.inputs = [nc.random_images(b, seed=b) for b in (1, 3, 8)]
        cls.expected = [reference.run({"image": x})["probabilities"] for x in cls.inputs]
        env = dict(os.environ, **cls.ENV) if cls.ENV else None
        cls.server = nc.ServerProcess(cls.repo, ["--log-level", "info"] + list(cls.ARGS),
                                      startup_timeout=SLOW, stop_timeout=SLOW, env=env)
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(6000)

    def workers(self):
        """{index: pid} once every planned worker is ready."""
        count = len(cpu_nodes())

        def ready():
            m = self.server.metrics()
            return m.sum("numaserve_worker_ready") == count
        self.assertTrue(nc.wait_until(ready, SLOW, 0.5), "workers not ready" + self.log())
        pids = worker_pids(self.server)
        self.assertEqual(sorted(pids), list(range(count)), self.log())
        return pids

    def assert_bound(self, index, pid, node, cpus, what="worker"):
        flags = worker_flags(pid) or {}
        self.assertEqual((flags.get("numa-node"), flags.get("cpus")), (node, cpus),
                         "%s %d (pid %d) was planned elsewhere" % (what, index, pid))
        self.assertEqual(numa_procfs.allowed_cpus(pid), cpus,
                         "%s %d (pid %d): Cpus_allowed_list" % (what, index, pid))
        maps = numa_procfs.NumaMaps.read(pid)
        policies = maps.policies()
        self.assertTrue(set(policies) <= self.policies_wanted(node),
                        "%s %d (pid %d) on node %d: memory policies %s"
                        % (what, index, pid, node, dict(policies)))
        return maps

    def assert_pages_local(self, index, pid, node, maps):
        fraction, total = maps.local_fraction(node)
        self.assertGreater(total, 0, "worker %d has no pages" % index)
        self.assertGreaterEqual(fraction, LOCAL_FRACTION,
                                "worker %d (pid %d): %.1f%% of %d anonymous + shared pages on "
                                "node %d (%s); largest elsewhere:\n%s"
                                % (index, pid, 100 * fraction, total, node, maps.summary(),
                                   maps.off_node(node)))

    def infer_many(self, count):
        def call(i, stub):
            k = i % len(self.inputs)
            got = nc.infer(stub, MODEL, {"image": self.inputs[k]}, deadline=SLOW)
            return np.allclose(got["probabilities"], self.expected[k], rtol=1e-4, atol=1e-5)
        return nc.call_together(self.server, count, call, timeout=SLOW)

    def check_placement(self, title, policy_words):
        """Every worker bound to its node's cpus, with only the policies
        policies_wanted allows, most of its pages on its node after a few
        requests, and its start-up line (the supervisor's) saying
        `policy_words` % node."""
        pids = self.workers()
        results = self.infer_many(8)
        self.assertEqual([r for r in results if r is not True], [], self.log())
        lines = []
        for index, (node, cpus) in enumerate(cpu_nodes()):
            maps = self.assert_bound(index, pids[index], node, cpus)
            self.assert_pages_local(index, pids[index], node, maps)
            fraction, total = maps.local_fraction(node)
            lines.append("worker %d (node %d): policies %s; pages %s (%.1f%% of %d local)"
                         % (index, node, dict(maps.policies()), maps.summary(),
                            100 * fraction, total))
            self.assertIn(policy_words % node, self.server.stderr_text(0),
                          "worker %d's start-up line" % index + self.log())
        report(title, "\n".join(lines))


class ServeTest(ServerCase):
    """The default server (--membind prefer)."""

    def test_1_workers_are_bound_to_their_nodes(self):
        pids = self.workers()
        for index, (node, cpus) in enumerate(cpu_nodes()):
            self.assert_bound(index, pids[index], node, cpus)

    def test_2_every_worker_answers(self):
        self.workers()
        rows = {}
        for round_ in range(6):
            results = self.infer_many(8)
            bad = [r for r in results if r is not True]
            self.assertEqual(bad, [], "wrong answers or errors: %s%s" % (bad[:3], self.log()))
            rows = {int(labels["worker"]): value for _, labels, value in
                    self.server.metrics().find("numaserve_worker_inferences_total")}
            if len(rows) == len(cpu_nodes()) and all(rows.values()):
                break
        self.assertEqual(sorted(w for w, v in rows.items() if v > 0),
                         list(range(len(cpu_nodes()))),
                         "inferences per worker after %d rounds: %s" % (round_ + 1, rows))
        report("numaserve_worker_inferences_total", json.dumps(rows))

    def test_3_pages_lie_on_the_workers_nodes(self):
        pids = self.workers()
        self.infer_many(8)
        lines = []
        for index, (node, cpus) in enumerate(cpu_nodes()):
            maps = self.assert_bound(index, pids[index], node, cpus)
            fraction, total = maps.local_fraction(node)
            lines.append("worker %d (node %d, cpus %s): anonymous + shared pages %s: %.1f%% "
                         "of %d on node %d; file pages %s; policies %s"
                         % (index, node, cpus, maps.summary(), 100 * fraction, total, node,
                            maps.summary(("file",)), dict(maps.policies())))
            self.assert_pages_local(index, pids[index], node, maps)
        report("numa_maps of the workers", "\n".join(lines))
        # The server's own view (read by each worker from its numa_maps after a load).
        metrics = self.server.metrics()
        for index, (node, _) in enumerate(cpu_nodes()):
            by_node = {int(labels["memory_node"]): value for _, labels, value in
                       metrics.find("numaserve_worker_node_memory_bytes", worker=index)}
            self.assertTrue(by_node, "no numaserve_worker_node_memory_bytes for worker %d"
                            % index)
            self.assertEqual(max(by_node, key=by_node.get), node,
                             "numaserve_worker_node_memory_bytes of worker %d: %s"
                             % (index, by_node))

    def test_4_a_killed_worker_comes_back_on_its_node(self):
        before = self.workers()
        victim_index = len(before) - 1
        victim = before[victim_index]
        node, cpus = cpu_nodes()[victim_index]
        traffic = worker_failure.Traffic(self.server, self.inputs, self.expected).start()
        try:
            warmed = nc.wait_until(lambda: traffic.successes() >= 10, SLOW, 0.2)
            self.assertTrue(warmed, "fewer than 10 answers before the kill" + self.log())
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()

            def replaced():
                new = worker_pids(self.server).get(victim_index)
                ready = self.server.metrics().sum("numaserve_worker_ready") == len(before)
                return new if new and new != victim and ready else None
            new_pid = nc.wait_until(replaced, SLOW, 0.5)
            self.assertTrue(new_pid, "worker %d not replaced within %d s%s"
                            % (victim_index, SLOW, self.log()))
            recovered_in = time.monotonic() - killed_at
            served = traffic.successes()
            nc.wait_until(lambda: traffic.successes() >= served + 10, 60, 0.2)
        finally:
            hung = traffic.stop()
        self.assertEqual(hung, [], "client threads still waiting (a request hung)" + self.log())
        bad = [r for r in traffic.results if r.code != grpc.StatusCode.OK]
        self.assertEqual(bad[:5], [], "%d of %d requests failed around the kill%s"
                         % (len(bad), len(traffic.results), self.log()))
        maps = self.assert_bound(victim_index, new_pid, node, cpus, "replacement worker")
        report("kill -9 of worker %d" % victim_index,
               "pid %d -> %d, ready again after %.1f s, %d requests all answered; the "
               "replacement's pages %s" % (victim, new_pid, recovered_in, len(traffic.results),
                                           maps.summary()))


def thread_cpus(pid):
    """{tid: (name, allowed cpus)} of the threads of PID."""
    threads = {}
    for entry in os.listdir("/proc/%d/task" % pid):
        base = "/proc/%d/task/%s/" % (pid, entry)
        try:
            with open(base + "comm") as f:
                name = f.read().strip()
            with open(base + "status") as f:
                allowed = [line for line in f if line.startswith("Cpus_allowed_list:")]
        except OSError:
            continue  # the thread ended meanwhile
        if allowed:
            threads[int(entry)] = (name, numa_procfs.parse_cpu_list(allowed[0].split(":", 1)[1]))
    return threads


class FrontendCpusTest(unittest.TestCase):
    """`serve --frontend-cpus`: the front end's threads on its cpu, the
    supervisor threads on their workers' nodes, the workers off it."""

    def test_front_end_supervisors_and_workers_each_where_planned(self):
        front_node, node_cpus = cpu_nodes()[0]
        front = node_cpus[0]
        # The workers: one per node keeping a cpu, in node order.
        planned = [(node, [c for c in cpus if c != front]) for node, cpus in cpu_nodes()]
        planned = [(node, cpus) for node, cpus in planned if cpus]
        binary = nc.default_binary()
        repo = os.path.join(os.path.dirname(os.path.dirname(binary)), "models")
        server = nc.ServerProcess(repo, ["--frontend-cpus", str(front)],
                                  startup_timeout=SLOW, stop_timeout=SLOW)
        server.start()
        self.addCleanup(server.stop)
        log = lambda: "\n--- server stderr (tail) ---\n" + server.stderr_text(6000)  # noqa: E731

        def ready():
            return server.metrics().sum("numaserve_worker_ready") == len(planned)
        self.assertTrue(nc.wait_until(ready, SLOW, 0.5), "workers not ready" + log())
        model_path = os.path.join(repo, MODEL, "1", "model.onnx")
        image = nc.random_images(2, seed=5)
        expected = nc.ReferenceModel(model_path).run({"image": image})["probabilities"]
        got = nc.infer(server.stub(), MODEL, {"image": image}, deadline=SLOW)
        self.assertTrue(np.allclose(got["probabilities"], expected, rtol=1e-4, atol=1e-5), log())
        pids = worker_pids(server)
        self.assertEqual(sorted(pids), list(range(len(planned))), log())
        lines = ["front end: cpu %d (node %d)" % (front, front_node)]
        for index, (node, cpus) in enumerate(planned):
            allowed = numa_procfs.allowed_cpus(pids[index])
            lines.append("worker %d (pid %d, node %d): cpus %s" % (index, pids[index], node,
                                                                  allowed))
            self.assertEqual(allowed, cpus, "worker %d (pid %d): Cpus_allowed_list; the front "
                             "end's cpu %d is not its own%s" % (index, pids[index], front, log()))
        node_of_worker = {index: node for index, (node, _) in enumerate(planned)}
        on_nodes = {"supervisor-": 0, "copier-": 0}
        copier_runs = 0
        for tid, (name, allowed) in sorted(thread_cpus(server.proc.pid).items()):
            prefix = next((p for p in on_nodes if name.startswith(p)), None)
            if prefix is not None:
                # The front end's cpu where it is on the worker's node, else
                # the worker's cpus (one thread per core in the guests).
                index = int(name[len(prefix):])
                node = node_of_worker[index]
                wanted = [front] if node == front_node else dict(planned)[node]
                on_nodes[prefix] += 1
                lines.append("%s (tid %d): cpus %s" % (name, tid, allowed))
                if prefix == "copier-":
                    with open("/proc/%d/task/%d/schedstat" % (server.proc.pid, tid)) as f:
                        copier_runs += int(f.read().split()[2])
            else:
                wanted = [front]
            self.assertEqual(allowed, wanted, "server thread %d (%s): Cpus_allowed_list"
                             % (tid, name))
        self.assertEqual(on_nodes["supervisor-"], len(planned),
                         "supervisor threads named supervisor-N")
        # Workers on several nodes with front-end cpus: --input-copy auto
        # copies each batch's inputs on its worker's node.
        self.assertEqual(on_nodes["copier-"], len(planned), "copier threads named copier-N" + log())
        self.assertGreater(copier_runs, 0, "the copiers never ran: who copied the inputs?")
        report("serve --frontend-cpus %d" % front, "\n".join(lines))


class StrictMembindTest(ServerCase):
    """serve --membind strict: each worker's policy is MPOL_BIND ("bind:N"),
    never preferred, and it says so."""

    ARGS = ("--membind", "strict")

    @classmethod
    def policies_wanted(cls, node):
        return {"bind:%d" % node, "local"}  # "local": OpenBLAS's own buffers

    def test_workers_bind_strictly(self):
        self.check_placement("serve --membind strict", "memory strict on node %d")
        for index, pid in self.workers().items():
            node = cpu_nodes()[index][0]
            policies = numa_procfs.NumaMaps.read(pid).policies()
            self.assertIn("bind:%d" % node, policies, "worker %d: %s" % (index, dict(policies)))


class RefusedMembindTest(ServerCase):
    """Where the kernel refuses the memory policy (a container's seccomp
    filter; here NUMASERVE_TEST_REFUSE_MEMBIND=1), first touch from the
    worker's pinned cpus still puts its pages, the shared arena's included,
    on its node, and the worker says that first touch placed them."""

    ENV = {"NUMASERVE_TEST_REFUSE_MEMBIND": "1"}

    @classmethod
    def policies_wanted(cls, node):
        return {"default", "local"}

    def test_first_touch_places_the_pages(self):
        self.check_placement("serve, memory policy refused (first touch)",
                             "memory first-touch on node %d (the policy was refused")
        # The arena was touched whole by the worker at its start (not page by
        # page by the server as requests came), all of it on the node.
        for index, pid in self.workers().items():
            node = cpu_nodes()[index][0]
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = f.read().decode().split("\0")
            arena_bytes = int(args[args.index("--arena-bytes") + 1])
            maps = numa_procfs.NumaMaps.read(pid)
            shm = maps.pages_by_node(("shm",))
            self.assertGreaterEqual(sum(shm.values()) * 4096, arena_bytes,
                                    "worker %d: arena of %d bytes, shared pages %s"
                                    % (index, arena_bytes, shm))
            fraction, total = maps.local_fraction(node, kinds=("shm",))
            self.assertGreaterEqual(fraction, LOCAL_FRACTION,
                                    "worker %d: arena pages %s" % (index, shm))


class WeightsNodeTest(ServerCase):
    """serve --weights-node <the memory-only node>: each worker's model
    weights are placed on that node, its shared arena and the rest of its
    memory stay on its own node (a topology without a memory-only node
    skips it, saying so)."""

    @classmethod
    def setUpClass(cls):
        if not memory_only_nodes():
            raise unittest.SkipTest("topology %s has no memory-only node" % TOPOLOGY["name"])
        cls.weights_node = memory_only_nodes()[0]
        cls.ARGS = ("--weights-node", str(cls.weights_node))
        super().setUpClass()

    def test_weights_on_the_memory_only_node_the_rest_on_the_workers(self):
        pids = self.workers()
        results = self.infer_many(8)
        self.assertEqual([r for r in results if r is not True], [], self.log())
        self.assertIn("weights on NUMA node %d (prefer)" % self.weights_node,
                      self.server.stderr_text(0), self.log())
        # The model file is its weights and little else; the compiled model
        # holds at least one copy of them (packed for the kernels).
        model_path = os.path.join(self.repo, MODEL, "1", "model.onnx")
        weight_pages = os.path.getsize(model_path) // 4096
        lines = []
        for index, (node, cpus) in enumerate(cpu_nodes()):
            maps = self.assert_bound(index, pids[index], node, cpus)
            pages = maps.pages_by_node()
            total = sum(pages.values())
            on_weights = pages.get(self.weights_node, 0)
            elsewhere = total - on_weights - pages.get(node, 0)
            shm_fraction, shm_total = maps.local_fraction(node, kinds=("shm",))
            lines.append("worker %d (node %d): pages %s; shared (arena) %s, %.1f%% of %d on "
                         "node %d; model file %d pages; the largest mappings off its node:\n%s"
                         % (index, node, maps.summary(), maps.summary(("shm",)),
                            100 * shm_fraction, shm_total, node, weight_pages,
                            maps.off_node(node)))
            self.assertGreaterEqual(on_weights, 0.9 * weight_pages,
                                    "worker %d (pid %d): %d pages on node %d, the model's "
                                    "weights are %d pages; pages %s%s"
                                    % (index, pids[index], on_weights, self.weights_node,
                                       weight_pages, maps.summary(), self.log()))
            self.assertGreater(shm_total, 0, "worker %d: no shared pages" % index)
            self.assertGreaterEqual(shm_fraction, LOCAL_FRACTION,
                                    "worker %d: arena pages %s, not on node %d"
                                    % (index, maps.summary(("shm",)), node))
            # Nothing of the worker's own memory strays to the other cpu
            # node: what is not its node's is the weights'.
            self.assertLess(elsewhere, (1 - LOCAL_FRACTION) * total,
                            "worker %d: %d of %d pages on neither node %d nor %d: %s"
                            % (index, elsewhere, total, node, self.weights_node,
                               maps.off_node(node)))
        report("serve --weights-node %d" % self.weights_node, "\n".join(lines))


def rank_processes():
    """{local rank: pid} of the running `numaserve train` ranks (started by mpirun)."""
    ranks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
            if len(args) < 2 or args[1] != b"train" or b"numaserve" not in args[0]:
                continue
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_LOCAL_RANK" in env:
            ranks[int(env[b"OMPI_COMM_WORLD_LOCAL_RANK"])] = pid
    return ranks


def anon_pages(maps):
    """A process's anonymous pages on every node (NumaMaps)."""
    return sum(maps.pages_by_node(("anon",)).values())


class TrainTest(unittest.TestCase):
    """`numaserve train --ranks <nodes with cpus>` under the real mpirun."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="numa_train_")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def config(self):
        model = nc.write_default_model(os.path.join(self.dir, "repo"))
        train = nc.synthetic_idx_dataset(self.dir, "train", 2048, seed=1)
        test = nc.synthetic_idx_dataset(self.dir, "t10k", 128, seed=2)
        path = os.path.join(self.dir, "job.cfg")
        with open(path, "w") as f:
            f.write('model: "%s"\n' % model)
            f.write('dataset { train_images: "%s" train_labels: "%s" test_images: "%s" '
                    'test_labels: "%s" }\n' % (train + test))
            # 24 steps: ~100 s under TCG on a loaded host (60 steps ran past
            # SLOW at 15 images/s); the pages are sampled every 0.5 s meanwhile.
            f.write("epochs: 100\nmax_steps: 24\nglobal_batch_size: 64\nlearning_rate: 0.05\n"
                    "seed: 3\nlog_every_steps: 8\nsgd { momentum: 0.9 }\n")
        return path

    def test_each_rank_on_its_node(self):
        ranks = len(cpu_nodes())
        proc = subprocess.Popen([nc.default_binary(), "train", "--config", self.config(),
                                 "--ranks", str(ranks)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        output = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        # local rank -> (pid, allowed cpus, NumaMaps): the sample with the
        # most anonymous pages, taken while the rank trained (a rank read
        # as it exits has unmapped its memory already: 0 pages).
        seen = {}
        deadline = time.monotonic() + SLOW
        while proc.poll() is None and time.monotonic() < deadline:
            for rank, pid in rank_processes().items():
                try:
                    sample = (pid, numa_procfs.allowed_cpus(pid), numa_procfs.NumaMaps.read(pid))
                except (OSError, RuntimeError):
                    continue  # the rank ended meanwhile
                pages = anon_pages(sample[2])
                if rank not in seen or pages > anon_pages(seen[rank][2]):
                    seen[rank] = sample
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(10)
        proc.stdout.close()
        log = "".join(output)
        self.assertEqual(proc.returncode, 0, "numaserve train failed:\n" + log[-6000:])
        self.assertEqual(sorted(seen), list(range(ranks)), "ranks seen running\n" + log[-4000:])
        lines = []
        for rank, (node, cpus) in enumerate(cpu_nodes()):
            pid, allowed, maps = seen[rank]
            self.assertEqual(allowed, cpus, "rank %d (pid %d): Cpus_allowed_list\n%s"
                             % (rank, pid, log[-3000:]))
            fraction, total = maps.local_fraction(node, kinds=("anon",))
            lines.append("rank %d (node %d): anonymous pages %s (%.1f%% of %d local); shared "
                         "memory %s" % (rank, node, maps.summary(("anon",)), 100 * fraction,
                                        total, maps.summary(("shm",))))
            self.assertGreaterEqual(fraction, LOCAL_FRACTION,
                                    "rank %d (pid %d): %.1f%% of its %d anonymous pages on node "
                                    "%d (%s); largest elsewhere:\n%s"
                                    % (rank, pid, 100 * fraction, total, node,
                                       maps.summary(("anon",)), maps.off_node(node, ("anon",))))
        report("numaserve train --ranks %d" % ranks, "\n".join(lines))


# NUMA_GUEST_CHECKS=short (ctest's numa.guest_short): these alone, not the
# rest left out as skips (a skip would make the whole ctest test read as skipped).
SHORT_TESTS = (
    "PlanTest.test_one_worker_per_node_with_cpus",
    "PlanTest.test_every_node_is_counted_and_a_memory_only_node_is_marked",
    "ServeTest.test_1_workers_are_bound_to_their_nodes",
    "ServeTest.test_2_every_worker_answers",
    "ServeTest.test_3_pages_lie_on_the_workers_nodes",
)


def load_tests(loader, tests, pattern):
    if FULL:
        return tests
    module = sys.modules[__name__]
    return unittest.TestSuite(loader.loadTestsFromName(name, module) for name in SHORT_TESTS)


if __name__ == "__main__":
    unittest.main()
