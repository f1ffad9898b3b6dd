#!/usr/bin/python3
"""What the server's child processes hold of its open files
(docs/security.md, "Round two: shared-memory arenas"). A server with two
workers (a synthetic two-node topology, so on any machine) and the
training service on its own loopback port:

  * each worker holds exactly one shared-memory arena (a memfd): its own,
    the file the server made for its index, at descriptor 4; never the
    other worker's, which carries other callers' tensors;
  * a worker holds no socket of the server's or of the other worker's
    (its control socket is its half of a socket pair);
  * a worker started again after a SIGKILL gets its own arena only, too;
  * a training job's processes (`numaserve train`, mpirun and its ranks),
    started while a client is connected, hold no arena and none of the
    server's or the workers' sockets; the job's stdin is /dev/null.
"""

import os
import re
import shutil
import signal
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
sys.path.insert(0, HERE)
import numaserve_client as nc  # noqa: E402
from test_training import synthetic_dataset  # noqa: E402
from test_training_service import (first_step, final_state, quick_config, tpb,  # noqa: E402
                                   tpb_grpc, training_args)

TIMEOUT_S = 60
ARENA = re.compile(r"^/memfd:numaserve-worker-(\d+)(?: \(deleted\))?$")
# Two NUMA nodes of one core each: two workers on any machine (those whose
# cpus this machine lacks run unpinned).
TOPOLOGY = "package:1 numa:2 core:1 pu:1"


def open_files(pid):
    """{descriptor: (link text, inode)} of PID's open files; descriptors
    closed while they are read are left out."""
    files = {}
    directory = "/proc/%d/fd" % pid
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            files[int(name)] = (os.readlink(path), os.stat(path).st_ino)
        except OSError:
            continue
    return files


def memfds(files):
    """{descriptor: (link text, inode)} of the memfds among FILES."""
    return {fd: f for fd, f in files.items() if f[0].startswith("/memfd:")}


def sockets(files):
    """The socket inodes among FILES ("socket:[N]")."""
    return {f[0] for f in files.values() if f[0].startswith("socket:")}


def worker_index(pid):
    """The --index of worker PID, or None when PID is not a worker."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if len(args) < 4 or args[1] != "worker" or "--index" not in args:
        return None
    return int(args[args.index("--index") + 1])


def descendants(pid):
    """Every live process below PID."""
    found, todo = set(), [pid]
    while todo:
        children = nc.child_pids(todo.pop())
        found |= children
        todo.extend(children)
    return found


class DescriptorTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_descriptors_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.dir, "train", 256, seed=5)
        cls.server = nc.ServerProcess(cls.repo, training_args(cls.dir) + [
            "--topology", TOPOLOGY, "--domain", "numa", "--worker-arena-mb", "16"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def wait_until_ready(self):
        """Waits until both workers have loaded their models (a worker
        caught between fork and exec still holds the server's files)."""
        def ready():
            samples = self.server.metrics().find("numaserve_worker_ready")
            return len(samples) == 2 and all(value == 1 for _, _, value in samples)
        self.assertTrue(nc.wait_until(ready, TIMEOUT_S), self.server.stderr_text())

    def workers(self):
        """{index: pid} of the live workers; waits until there are two."""
        found = {}

        def both():
            found.clear()
            for pid in self.server.worker_pids():
                index = worker_index(pid)
                if index is not None:
                    found[index] = pid
            return sorted(found) == [0, 1]
        self.assertTrue(nc.wait_until(both, TIMEOUT_S),
                        "workers %s\n%s" % (found, self.server.stderr_text()))
        return dict(found)

    def server_arenas(self):
        """{worker index: inode} of the arenas the server made."""
        arenas = {}
        for link, inode in memfds(open_files(self.server.pid)).values():
            match = ARENA.match(link)
            self.assertIsNotNone(match, "unexpected memfd %r in the server" % link)
            arenas[int(match.group(1))] = inode
        self.assertEqual(sorted(arenas), [0, 1], arenas)
        return arenas

    def assert_each_worker_holds_its_own_arena_only(self):
        self.wait_until_ready()
        arenas = self.server_arenas()
        server_sockets = sockets(open_files(self.server.pid))
        held = {}
        for index, pid in self.workers().items():
            files = open_files(pid)
            held[index] = sockets(files)
            shared = memfds(files)
            self.assertEqual(len(shared), 1, "worker %d (pid %d) holds %d arenas: %s"
                             % (index, pid, len(shared), shared))
            fd, (link, inode) = next(iter(shared.items()))
            self.assertEqual(fd, 4, "worker %d: %s" % (index, shared))
            self.assertEqual(inode, arenas[index],
                             "worker %d holds another worker's arena: %s" % (index, link))
            self.assertEqual(held[index] & server_sockets, set(),
                             "worker %d holds the server's sockets" % index)
        self.assertEqual(held[0] & held[1], set(), "the workers share sockets")

    def test_each_worker_holds_its_own_arena_only(self):
        self.assert_each_worker_holds_its_own_arena_only()
        # A worker started again holds its own arena only too.
        first = self.workers()
        os.kill(first[0], signal.SIGKILL)
        self.assertTrue(nc.wait_until(lambda: self.workers()[0] != first[0], TIMEOUT_S),
                        self.server.stderr_text())
        self.assert_each_worker_holds_its_own_arena_only()

    def test_a_training_job_holds_no_arena_and_no_socket_of_the_server(self):
        channel = self.server.training_channel()
        try:
            stub = tpb_grpc.TrainingServiceStub(channel)
            job = stub.StartTraining(tpb.StartTrainingRequest(
                config_text=quick_config(self.model, self.train, steps=1000000),
                ranks="1"), timeout=30).job_id
            first_step(stub, job)
            self.wait_until_ready()
            workers = self.workers()
            ours = sockets(open_files(self.server.pid))
            for pid in workers.values():
                ours |= sockets(open_files(pid))
            arenas = set(self.server_arenas().values())
            job_pids = descendants(self.server.pid) - set(workers.values())
            # `numaserve train` became mpirun, which runs the rank.
            self.assertGreaterEqual(len(job_pids), 2, job_pids)
            launcher = nc.child_pids(self.server.pid) - set(workers.values())
            self.assertEqual(len(launcher), 1, launcher)
            self.assertEqual(open_files(launcher.pop())[0][0], "/dev/null")
            for pid in job_pids:
                try:
                    files = open_files(pid)
                except OSError:
                    continue  # it exited meanwhile
                with open("/proc/%d/comm" % pid) as f:
                    name = "%s (pid %d)" % (f.read().strip(), pid)
                arena_files = {fd: f for fd, f in memfds(files).items()
                               if ARENA.match(f[0]) or f[1] in arenas}
                self.assertEqual(arena_files, {}, "%s holds the workers' arenas" % name)
                self.assertEqual(sockets(files) & ours, set(),
                                 "%s holds sockets of the server or its workers" % name)
            stub.CancelTraining(tpb.CancelTrainingRequest(job_id=job), timeout=10)
            final = final_state(stub, job, timeout=TIMEOUT_S)
            self.assertEqual(final.state, tpb.TrainingProgress.CANCELLED, final)
        finally:
            channel.close()


if __name__ == "__main__":
    unittest.main()
