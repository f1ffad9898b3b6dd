#!/usr/bin/python3
"""`numaserve train` end to end, with real mpirun runs on a small synthetic
Fashion-MNIST-shaped dataset written as gzipped IDX files:

  * 1 rank and 2 ranks with the same global batch reach the same weights;
  * the 2-rank run's Chrome-trace timeline has both ranks' spans;
  * a run killed with SIGKILL and continued with --resume ends with the same
    weights as one never interrupted;
  * the exported model is a new version of the repository that a real
    server serves, with outputs matching a NumPy evaluation of the file;
  * IDX files converted to packed records (numaserve-dataset) train to
    the same weights, on 2 ranks that each read only their shard of the
    record file;
  * SIGUSR1 to a 2-rank run stops it after a step with a checkpoint, and
    no thread of a rank is interrupted by it (all block it; one sigwaits);
  * configuration errors name the file, line and field;
  * `precision: "bf16"` trains the CNN with its convolutions in BF16 to
    test accuracy and weights close to the FP32 run's where the CPU has
    native BF16 kernels, and is refused with the reason where it has not
    (always under NUMASERVE_MAX_ISA=avx2, which `train` passes to its rank
    as --max-isa);
  * checkpoints, final weights, timelines and exports are written through
    fresh temporary files: a symbolic link planted at `<output>.tmp`, or
    at the export's model directory, does not redirect the write.
"""

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME


synthetic_dataset = nc.synthetic_idx_dataset
read_weights = nc.read_checkpoint


class TrainingTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_training_")
        cls.repo = os.path.join(cls.dir, "repo")
        cls.model = nc.write_default_model(cls.repo)
        cls.train = synthetic_dataset(cls.dir, "train", 2048, seed=1)
        cls.test = synthetic_dataset(cls.dir, "t10k", 256, seed=2)
        cls.binary = nc.default_binary()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def config(self, name, **fields):
        values = dict(model='"%s"' % self.model, global_batch_size=32, learning_rate=0.05,
                      epochs=100, max_steps=24, seed=9, log_every_steps=8)
        values.update(fields)
        lines = ['dataset { train_images: "%s" train_labels: "%s" test_images: "%s" '
                 'test_labels: "%s" }' % (self.train + self.test)]
        lines += ["%s: %s" % (k, v) for k, v in values.items() if not k.startswith("_")]
        lines.append(values.get("_optimizer", "sgd { momentum: 0.9 nesterov: true }"))
        path = os.path.join(self.dir, name + ".cfg")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def run_train(self, config, *args, timeout=120):
        proc = subprocess.run([self.binary, "train", "--config", config] + list(args),
                              capture_output=True, text=True, timeout=timeout)
        self.assertEqual(proc.returncode, 0, "train failed:\n%s\n%s" % (proc.stdout, proc.stderr))
        return proc

    def test_one_and_two_ranks_reach_the_same_weights(self):
        one = os.path.join(self.dir, "one.weights")
        two = os.path.join(self.dir, "two.weights")
        self.run_train(self.config("one", final_weights='"%s"' % one), "--ranks", "1")
        timeline = os.path.join(self.dir, "timeline.json")
        proc = self.run_train(self.config("two", final_weights='"%s"' % two,
                                          fusion_threshold_bytes=65536,
                                          timeline='"%s"' % timeline, timeline_steps=5),
                              "--ranks", "2")
        self.assertIn("rank 1/2", proc.stderr)
        with open(timeline) as f:
            events = json.load(f)["traceEvents"]
        for rank in (0, 1):
            spans = [e for e in events if e["pid"] == rank and e["ph"] == "X"]
            names = [e["name"] for e in spans]
            self.assertEqual(names.count("backward"), 5, names)
            # 64 KiB buckets: fc3+fc2 (133 KiB) close before fc1 (785 KiB).
            self.assertEqual(names.count("all-reduce 133 KiB"), 5, names)
            self.assertEqual(names.count("all-reduce 785 KiB"), 5, names)
            # The first bucket is sent while backward still runs.
            backward = [e for e in spans if e["name"] == "backward"]
            first = [e for e in spans if e["name"] == "all-reduce 133 KiB"]
            self.assertTrue(any(b["ts"] <= a["ts"] < b["ts"] + b["dur"]
                                for a in first for b in backward), spans)
        self.assertIn("2 ranks x 16 images per step", proc.stdout)
        step1, w1 = read_weights(one)
        step2, w2 = read_weights(two)
        self.assertEqual((step1, step2), (24, 24))
        _, initial = read_weights_from_onnx(self.model)
        self.assertEqual(sorted(w1), sorted(w2))
        for name in w1:
            moved = np.abs(w1[name] - initial[name]).max()
            self.assertGreater(moved, 1e-4, "%s did not train" % name)
            np.testing.assert_allclose(w2[name], w1[name], rtol=0, atol=2e-5 + 1e-3 * moved,
                                       err_msg=name)

    def test_killed_run_resumes_to_the_same_weights(self):
        fields = dict(global_batch_size=256, max_steps=240, checkpoint_every_steps=16,
                      log_every_steps=16, _optimizer="adamw { }", learning_rate=0.002)
        straight = os.path.join(self.dir, "straight.weights")
        self.run_train(self.config("straight", final_weights='"%s"' % straight,
                                   checkpoint='"%s"' % os.path.join(self.dir, "straight.ckpt"),
                                   **fields), "--ranks", "1")
        checkpoint = os.path.join(self.dir, "killed.ckpt")
        resumed = os.path.join(self.dir, "resumed.weights")
        config = self.config("killed", final_weights='"%s"' % resumed,
                             checkpoint='"%s"' % checkpoint, **fields)
        proc = subprocess.Popen([self.binary, "train", "--config", config, "--ranks", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            nc.wait_until(lambda: os.path.exists(checkpoint) or proc.poll() is not None, 60,
                          interval=0.005)
        finally:
            pids, todo = [], [proc.pid]
            while todo:  # mpirun and its ranks, ranks first
                pid = todo.pop()
                pids.insert(0, pid)
                todo.extend(nc.child_pids(pid))
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        self.assertEqual(proc.returncode, -signal.SIGKILL, "the run ended before it was killed")
        step, _ = read_weights(checkpoint)
        self.assertLess(step, 240)
        self.assertFalse(os.path.exists(resumed))
        proc = self.run_train(config, "--ranks", "1", "--resume")
        self.assertIn("resumed from %s at step %d" % (checkpoint, step), proc.stdout)
        _, w_straight = read_weights(straight)
        _, w_resumed = read_weights(resumed)
        for name in w_straight:
            np.testing.assert_allclose(w_resumed[name], w_straight[name], rtol=0, atol=1e-6,
                                       err_msg=name)

    def test_stop_signals_interrupt_no_thread(self):
        """SIGUSR1 to a 2-rank job stops it with a checkpoint. No thread of a
        rank runs a handler for it (a handler once interrupted a oneDNN GEMM
        and a rank aborted with a corrupted heap): every thread blocks
        SIGUSR1 and SIGTERM and one takes them with sigwait."""
        checkpoint = os.path.join(self.dir, "signalled.ckpt")
        config = self.config("signalled", max_steps=10000000, epochs=100000, log_every_steps=4,
                             checkpoint='"%s"' % checkpoint)
        proc = subprocess.Popen([self.binary, "train", "--config", config, "--ranks", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            for line in proc.stdout:  # the first progress line: both ranks are in the loop
                if re.match(r"epoch \d+/\d+ step \d+/", line):
                    break
            ranks = nc.child_pids(proc.pid)
            self.assertEqual(len(ranks), 2, ranks)
            usr1, term = 1 << (signal.SIGUSR1 - 1), 1 << (signal.SIGTERM - 1)
            for rank in ranks:
                threads = os.listdir("/proc/%d/task" % rank)
                self.assertGreaterEqual(len(threads), 3, threads)  # MPI's and the waiter
                waiters = 0
                for tid in threads:
                    task = "/proc/%d/task/%s/" % (rank, tid)
                    try:
                        with open(task + "status") as f:
                            status = dict(line.split(":", 1) for line in f if ":" in line)
                        with open(task + "syscall") as f:
                            syscall = f.read().split()[0]
                    except (FileNotFoundError, IndexError):
                        continue  # a thread that has just ended
                    blocked, caught = int(status["SigBlk"], 16), int(status["SigCgt"], 16)
                    self.assertEqual(caught & (usr1 | term), 0, (rank, tid, status))
                    # In sigwait (rt_sigtimedwait, 128 on x86-64) the kernel
                    # shows the signals waited for as unblocked.
                    if syscall == "128":
                        waiters += 1
                        continue
                    self.assertEqual(blocked & (usr1 | term), usr1 | term, (rank, tid, status))
                self.assertEqual(waiters, 1, "rank %d: %d threads in sigwait" % (rank, waiters))
            os.killpg(proc.pid, signal.SIGUSR1)
            rest, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.assertEqual(proc.returncode, 0, rest)
        step, _ = read_weights(checkpoint)
        self.assertGreater(step, 0)
        self.assertRegex(rest, r"stopped at step %d of \d+: checkpoint %s" % (step, re.escape(checkpoint)))

    def test_exported_model_is_served_as_a_new_version(self):
        repo = os.path.join(self.dir, "export_repo")
        nc.write_default_model(repo)
        proc = self.run_train(self.config("export", max_steps=64, learning_rate=0.02,
                                          export_repository='"%s"' % repo,
                                          export_model_name='"%s"' % MODEL), "--ranks", "1")
        exported = os.path.join(repo, MODEL, "2", "model.onnx")
        self.assertIn("exported " + exported, proc.stdout)
        self.assertRegex(proc.stdout, r"test acc (9\d|100)\.\d\d%")
        images = np.stack([np.frombuffer(gzip.open(self.test[0]).read()[16:], np.uint8)
                           .reshape(-1, 1, 28, 28)[:8]]).reshape(8, 1, 28, 28) / 255.0
        images = images.astype(np.float32)
        expected = nc.ReferenceModel(exported).run({"image": images})["probabilities"]
        with nc.ServerProcess(repo) as server:
            stub = server.stub()
            nc.wait_until(lambda: stub.ModelReady(
                nc.pb.ModelReadyRequest(name=MODEL, version="2")).ready, 60)
            got = nc.infer(stub, MODEL, {"image": images}, version="2")["probabilities"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        labels = np.frombuffer(gzip.open(self.test[1]).read()[8:], np.uint8)[:8]
        self.assertGreaterEqual(int((got.argmax(axis=1) == labels).sum()), 7)

    def test_packed_records_train_like_the_idx_files(self):
        converter = os.path.join(os.path.dirname(self.binary), "numaserve-dataset")
        records = os.path.join(self.dir, "train.nsrec")
        proc = subprocess.run([converter, "--idx", self.train[0], self.train[1], "--out", records],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("2048 examples", proc.stdout)
        self.assertTrue(os.path.exists(records + ".idx"))
        from_idx = os.path.join(self.dir, "from_idx.weights")
        from_records = os.path.join(self.dir, "from_records.weights")
        self.run_train(self.config("idx", final_weights='"%s"' % from_idx, max_steps=16),
                       "--ranks", "2")
        path = self.config("records", final_weights='"%s"' % from_records, max_steps=16)
        with open(path) as f:
            text = f.read().replace('train_images: "%s" train_labels: "%s"' % self.train,
                                    'train_records: "%s"' % records)
        with open(path, "w") as f:
            f.write(text)
        self.run_train(path, "--ranks", "2")
        _, a = read_weights(from_idx)
        _, b = read_weights(from_records)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)

    def test_dry_run_prints_the_mpirun_command(self):
        config = self.config("dry")
        out = subprocess.run([self.binary, "train", "--config", config, "--ranks", "2",
                              "--dry-run"], capture_output=True, text=True, timeout=60).stdout
        self.assertRegex(out, r"^mpirun -np 2 --oversubscribe .*--bind-to none \S+ train --config ")
        out = subprocess.run([self.binary, "train", "--config", config, "--hostfile", "hosts",
                              "--dry-run", "--resume"], capture_output=True, text=True,
                             timeout=60).stdout
        self.assertRegex(out, r"^mpirun --hostfile hosts --map-by ppr:1:numa .*--bind-to none "
                              r"\S+ train --config \S+ --resume "
                              r"--log-format text --log-level info$")
        # The ranks log as train does: its options on their command line.
        out = subprocess.run([self.binary, "train", "--config", config, "--ranks", "2",
                              "--log-format", "json", "--log-level", "debug", "--dry-run"],
                             capture_output=True, text=True, timeout=60).stdout
        self.assertRegex(out, r"^mpirun -np 2 .*--bind-to none \S+ train --config \S+ "
                              r"--log-format json --log-level debug$")
        self.assertNotIn(" -x ", out)

    def test_outputs_are_not_written_through_planted_links(self):
        work = tempfile.mkdtemp(prefix="links_", dir=self.dir)
        outside = tempfile.mkdtemp(prefix="outside_", dir=self.dir)
        targets = {}
        for name in ("checkpoint", "weights", "timeline.json", "model.onnx"):
            targets[name] = os.path.join(outside, name)
            with open(targets[name], "w") as f:
                f.write("precious " + name)
        outputs = {k: os.path.join(work, k) for k in ("checkpoint", "weights", "timeline.json")}
        for name, path in outputs.items():
            os.symlink(targets[name], path + ".tmp")
        # The next version of the export would be written through this link.
        repo = os.path.join(work, "repo")
        os.makedirs(os.path.join(repo, MODEL, "1"))
        os.symlink(outside, os.path.join(repo, MODEL, "2"))
        os.symlink(outside, os.path.join(repo, "linked"))
        self.run_train(self.config("links", max_steps=8,
                                   checkpoint='"%s"' % outputs["checkpoint"],
                                   final_weights='"%s"' % outputs["weights"],
                                   timeline='"%s"' % outputs["timeline.json"],
                                   export_repository='"%s"' % repo,
                                   export_model_name='"%s"' % MODEL), "--ranks", "1")
        for name, path in targets.items():
            with open(path, "rb") as f:
                self.assertEqual(f.read()[:40], b"precious " + name.encode(), path)
        for path in outputs.values():
            self.assertFalse(os.path.islink(path), path)
            self.assertTrue(os.path.isfile(path), path)
        self.assertEqual(read_weights(outputs["weights"])[0], 8)
        self.assertTrue(os.path.isfile(os.path.join(repo, MODEL, "3", "model.onnx")))
        # A model directory that is a link is not exported into.
        proc = subprocess.run([self.binary, "train", "--config", self.config(
            "linked", max_steps=8, export_repository='"%s"' % repo,
            export_model_name='"linked"'), "--ranks", "1"],
            capture_output=True, text=True, timeout=120)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("is a symbolic link", proc.stderr)
        self.assertEqual(sorted(os.listdir(outside)), sorted(targets))

    def cnn_model(self):
        path = os.path.join(self.dir, "fashion_cnn.onnx")
        if not os.path.exists(path):
            script = os.path.join(os.environ["NUMASERVE_SOURCE_DIR"], "training",
                                  "models", "make_fashion_cnn.py")
            subprocess.run([sys.executable, script, "--out", path], check=True,
                           capture_output=True, timeout=120)
        return path

    def test_bf16_cnn_trains_like_fp32(self):
        model = '"%s"' % self.cnn_model()
        fields = dict(model=model, global_batch_size=64, learning_rate=0.02, max_steps=64,
                      log_every_steps=16)
        fp32 = os.path.join(self.dir, "cnn_fp32.weights")
        bf16 = os.path.join(self.dir, "cnn_bf16.weights")
        proc = self.run_train(self.config("cnn_fp32", final_weights='"%s"' % fp32, **fields),
                              "--ranks", "1", timeout=240)
        self.assertNotIn("precision bf16", proc.stdout)
        fp32_acc = last_test_accuracy(proc.stdout)
        config = self.config("cnn_bf16", final_weights='"%s"' % bf16, precision='"bf16"',
                             **fields)
        # Without a native BF16 path (here made so by the AVX2 cap) it is refused.
        env = dict(os.environ, NUMASERVE_MAX_ISA="avx2", DNNL_MAX_CPU_ISA="AVX2")
        capped = subprocess.run([self.binary, "train", "--config", config, "--ranks", "1"],
                                capture_output=True, text=True, timeout=120, env=env)
        self.assertNotEqual(capped.returncode, 0, capped.stdout)
        self.assertIn("'precision' is \"bf16\"", capped.stderr)
        self.assertIn("no native BF16 path", capped.stderr)
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        if "avx512_bf16" not in flags and "amx_bf16" not in flags:
            native = subprocess.run([self.binary, "train", "--config", config, "--ranks", "1"],
                                    capture_output=True, text=True, timeout=120)
            self.assertNotEqual(native.returncode, 0, native.stdout)
            self.assertIn("no native BF16 path", native.stderr)
            return
        proc = self.run_train(config, "--ranks", "1", timeout=240)
        self.assertIn("precision bf16", proc.stdout)
        # conv2 (32 -> 64, 3x3) has BF16 kernels: forward, backward data and
        # weights (and the evaluation's forward) at least.
        counts = [l for l in proc.stdout.splitlines() if l.startswith("bf16: ")]
        self.assertEqual(len(counts), 1, proc.stdout)
        self.assertGreaterEqual(int(counts[0].split()[1]), 3, counts[0])
        bf16_acc = last_test_accuracy(proc.stdout)
        self.assertGreater(fp32_acc, 50.0, proc.stdout)
        self.assertGreater(bf16_acc, fp32_acc - 3.0, proc.stdout)
        _, w32 = read_weights(fp32)
        _, w16 = read_weights(bf16)
        _, initial = read_weights_from_onnx(self.cnn_model())
        for name in w32:
            moved = np.abs(w32[name] - initial[name]).max()
            self.assertGreater(moved, 1e-4, "%s did not train" % name)
            differs = np.abs(w16[name] - w32[name]).max()
            # BF16 operands change the path, not where it leads.
            self.assertLess(differs, 0.5 * moved + 1e-3, name)
        self.assertTrue(any(np.abs(w16[n] - w32[n]).max() > 1e-6 for n in w32),
                        "the BF16 run gave the FP32 run's weights")

    def test_precision_must_be_fp32_or_bf16(self):
        path = self.config("fp16", precision='"fp16"')
        proc = subprocess.run([self.binary, "train", "--config", path], capture_output=True,
                              text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(path + ": field 'precision' is \"fp16\"", proc.stderr)

    def test_config_errors_name_file_line_and_field(self):
        path = os.path.join(self.dir, "bad.cfg")
        with open(path, "w") as f:
            f.write('model: "m.onnx"\nglobal_batch_size: 8\nlearnig_rate: 0.1\n')
        proc = subprocess.run([self.binary, "train", "--config", path], capture_output=True,
                              text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(path + ":3:", proc.stderr)
        self.assertIn("learnig_rate", proc.stderr)
        with open(path, "w") as f:
            f.write('model: "m.onnx"\nglobal_batch_size: 8\nlearning_rate: 0.1\nepochs: 1\n')
        proc = subprocess.run([self.binary, "train", "--config", path], capture_output=True,
                              text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("dataset.train_images", proc.stderr)


def last_test_accuracy(stdout):
    """The test accuracy (%) of the last evaluation in a training log."""
    found = [float(l.split("test acc ")[1].split("%")[0]) for l in stdout.splitlines()
             if "test acc " in l]
    assert found, stdout
    return found[-1]


def read_weights_from_onnx(path):
    import onnx
    from onnx import numpy_helper
    model = onnx.load(path)
    return 0, {t.name: numpy_helper.to_array(t).ravel() for t in model.graph.initializer}


if __name__ == "__main__":
    unittest.main()
