#!/usr/bin/python3
"""Soak and fault runs against a real numaserve, each bounded in time.

Every scenario starts its own server on 127.0.0.1 with a repository it
writes into a temporary directory, drives it with grpc_loadgen (the C++ load
generator next to the numaserve binary) and prints what it measured and
whether the bar was met:

  soak      open-loop load at --load-fraction (0.8) of the capacity measured
            first, for --soak-seconds (600); no request may fail, and the
            resident memory of the server and its workers may not grow by
            more than --max-rss-growth (5%) after the warm-up, besides the
            steps that come with a new depth of the queue (a stall's
            backlog, whose memory the allocator keeps).
  overload  open-loop load at twice the capacity with a bounded queue
            (--max-queue-size): what cannot be queued is refused with
            RESOURCE_EXHAUSTED at once (no other failure, refusals answered
            far faster than served requests wait), the server keeps serving
            near its capacity meanwhile, and at half the capacity afterwards
            no request fails.
  kill      a worker killed with SIGKILL under load (two workers): no
            accepted request is lost (the batch in flight is run again on
            the other worker), the supervisor starts a new worker.
  corrupt   poll mode under load: a version copied in slowly (half a file
            seen by a poll, then the rest), one of random bytes and one
            whose initializer claims 2^40 elements; the half-copied one is
            served once complete, the others are unavailable with a reason,
            the served version answers throughout, no worker restarts.
  diskfull  `numaserve train` whose checkpoint directory is a tmpfs that
            holds one checkpoint but not the next: the run stops with an
            error naming the file and the cause, the last checkpoint is
            intact, no temporary file is left, and --resume continues from
            it. Needs a private mount namespace (root, or unprivileged user
            namespaces); reported as not run otherwise.

  benchmarks/e2e/reliability.py                       # all, full length
  benchmarks/e2e/reliability.py --short               # the make-test lengths (~4 min)
  benchmarks/e2e/reliability.py --scenario soak --soak-seconds 600 --json out.json

Exit status 0 when every scenario run met its bar, 1 otherwise. The last
line of output is a JSON object with every figure.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
# soak, overload and kill serve a model whose requests cost compute, as a
# deployed model's do (a 16-layer 1024-wide MLP, 8 rows a request: 270
# MFLOP), so that the workers, not the gRPC front end, are what saturates.
HEAVY = "mlp16x1024"
HEAVY_CONFIG = ("max_batch_size: 32\n"
                "dynamic_batching { max_queue_delay_microseconds: 2000 }\n")
SCENARIOS = ("soak", "overload", "kill", "corrupt", "diskfull")


class Scenario:
    """What one scenario measured and the bars it missed."""

    def __init__(self, name):
        self.name = name
        self.figures = {}
        self.failures = []
        self.skipped = None

    def check(self, ok, message):
        if not ok:
            self.failures.append(message)
        return ok

    @property
    def passed(self):
        return self.skipped is None and not self.failures

    def as_dict(self):
        return {"scenario": self.name, "passed": self.passed, "skipped": self.skipped,
                "failures": self.failures, "figures": self.figures}


def log(text):
    print(text, flush=True)


# --- load ---------------------------------------------------------------------

def loadgen_command(args, server, mode, seconds, warmup, concurrency=32, rate=None,
                    max_outstanding=4096, model=HEAVY, rows=None):
    cmd = [args.loadgen, "--url", server.grpc_address, "--model", model,
           "--rows", str(rows or args.rows), "--mode", mode, "--seconds", "%g" % seconds,
           "--warmup-seconds", "%g" % warmup, "--channels", "4",
           "--max-outstanding", str(max_outstanding)]
    if mode == "open":
        cmd += ["--rate", "%g" % rate]
    else:
        cmd += ["--concurrency", str(concurrency)]
    return cmd


def parse_loadgen(proc_stdout, proc_stderr, returncode):
    lines = [line for line in proc_stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError("grpc_loadgen printed no result (exit %d): %s %s"
                           % (returncode, proc_stdout[-2000:], proc_stderr[-2000:]))
    return json.loads(lines[-1])


def run_load(args, server, mode, seconds, warmup=1.0, **kw):
    cmd = loadgen_command(args, server, mode, seconds, warmup, **kw)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + warmup + 120)
    return parse_loadgen(proc.stdout, proc.stderr, proc.returncode)


class BackgroundLoad:
    """grpc_loadgen in the background; result() waits for its figures."""

    def __init__(self, args, server, mode, seconds, warmup=1.0, **kw):
        self.seconds = seconds + warmup
        self.proc = subprocess.Popen(loadgen_command(args, server, mode, seconds, warmup, **kw),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def running(self):
        return self.proc.poll() is None

    def result(self):
        out, err = self.proc.communicate(timeout=self.seconds + 120)
        return parse_loadgen(out, err, self.proc.returncode)


def capacity(args, server, **kw):
    """Requests/s served to an open loop offered more than that, with at
    most 64 calls outstanding (sends beyond are skipped): the rate the
    server sustains with the load generator's open-loop cost on the same
    machine, which a closed loop's completion-driven sends understate."""
    closed = run_load(args, server, "closed", args.capacity_seconds, warmup=1.0,
                      concurrency=32, **kw)
    r = run_load(args, server, "open", args.capacity_seconds, warmup=1.0,
                 rate=2.0 * closed["requests_per_second"], max_outstanding=64, **kw)
    if closed["errors"] or r["errors"]:
        raise RuntimeError("the capacity runs failed requests: %s %s"
                           % (closed["errors_by_code"], r["errors_by_code"]))
    return r["requests_per_second"], r


def rss_bytes(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def restarts(server):
    return server.metrics().sum("numaserve_worker_restarts_total")


def new_repository(prefix):
    """The default model and the compute-bound HEAVY one."""
    repo = tempfile.mkdtemp(prefix=prefix)
    nc.write_default_model(repo)
    nc.write_model(repo, HEAVY, nc.deep_mlp_model(width=1024, layers=16))
    with open(os.path.join(repo, HEAVY, "config.pbtxt"), "w") as f:
        f.write(HEAVY_CONFIG)
    return repo


def serve(args, repo, extra=()):
    return nc.ServerProcess(repo, ["--domain", "core"] + list(extra), binary=args.binary)


# --- scenarios ----------------------------------------------------------------

def unexplained_growth(samples, warmup):
    """Resident memory growth after `warmup` seconds that no new high-water
    mark of the queue explains, in bytes, and the growth left out.

    `samples` are (seconds, resident bytes, requests pending) in time
    order. A host that stalls the server for a second queues a second of
    requests; the memory they held stays resident after they are served
    (the allocator keeps it for reuse), so resident memory steps up once
    with the deepest queue seen so far and not again. A leak grows with
    every request served, queue or not. So each step between two samples
    counts unless the queue reached a new depth at either end of it or at
    the sample before (the memory of a backlog shows up as it is read and
    parsed, within a sample of the queue's peak)."""
    deepest = max([p for t, _, p in samples if t < warmup] or [0])
    counted = excused = 0
    new_depth_at = set()
    for i, (t, _, pending) in enumerate(samples):
        if t >= warmup and pending > deepest:
            new_depth_at.add(i)
            deepest = pending
    for i in range(1, len(samples)):
        if samples[i - 1][0] < warmup:
            continue
        step = samples[i][1] - samples[i - 1][1]
        if new_depth_at & {i - 2, i - 1, i}:
            excused += step
        else:
            counted += step
    return counted, excused


def soak(args, s):
    repo = new_repository("numaserve_soak_")
    try:
        with serve(args, repo) as server:
            cap, _ = capacity(args, server)
            rate = args.load_fraction * cap
            s.figures.update(capacity_rps=round(cap, 1), rate_rps=round(rate, 1),
                             seconds=args.soak_seconds, rows=args.rows)
            log("soak: capacity %.0f req/s, %.0f s at %.0f req/s (%.0f%%)"
                % (cap, args.soak_seconds, rate, 100 * args.load_fraction))
            restarts_before = restarts(server)
            # The allocators and gRPC's buffers settle in the first seconds
            # (tens of seconds at most); growth is measured after that.
            warmup = args.warmup_fraction * args.soak_seconds
            if not args.short:
                warmup = min(60.0, max(5.0, warmup))
            load = BackgroundLoad(args, server, "open", args.soak_seconds, warmup=0.0,
                                  rate=rate)
            started = time.monotonic()
            samples = []  # (seconds since start, resident bytes, requests pending)
            while load.running():
                pids = {server.pid} | server.worker_pids()
                pending = server.metrics().sum("numaserve_pending_requests", model=HEAVY)
                samples.append((time.monotonic() - started, rss_bytes(pids), pending))
                time.sleep(args.sample_seconds)
            r = load.result()
            check_memory(args, s, samples, warmup)
            s.figures.update(served_rps=r["requests_per_second"], p50_ms=r["p50_ms"],
                             p99_ms=r["p99_ms"], p999_ms=r["p999_ms"], errors=r["errors"],
                             dropped=r["dropped"])
            s.check(r["errors"] == 0, "%d requests failed: %s" % (r["errors"],
                                                                   r["errors_by_code"]))
            s.check(r["dropped"] == 0, "%d sends found 4096 calls outstanding" % r["dropped"])
            s.check(r["requests_per_second"] >= 0.95 * rate,
                    "served %.0f req/s of the %.0f sent" % (r["requests_per_second"], rate))
            s.figures["worker_restarts"] = restarts(server) - restarts_before
            s.check(s.figures["worker_restarts"] == 0, "workers restarted during the soak")
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def check_memory(args, s, samples, warmup):
    """The soak's memory figures, and its bar: growth after the warm-up,
    less the steps a new queue depth explains, under --max-rss-growth."""
    after_warmup = [b for t, b, _ in samples if warmup <= t < warmup + args.rss_window]
    last = [b for t, b, _ in samples if t >= args.soak_seconds - args.rss_window]
    if not s.check(after_warmup and last, "too few memory samples (%d)" % len(samples)):
        return
    base, end = statistics.median(after_warmup), statistics.median(last)
    counted, excused = unexplained_growth(samples, warmup)
    mib = 2.0**20
    s.figures.update(rss_after_warmup_mib=round(base / mib, 1), rss_end_mib=round(end / mib, 1),
                     rss_peak_mib=round(max(b for _, b, _ in samples) / mib, 1),
                     rss_growth=round(end / base - 1.0, 4), warmup_seconds=warmup,
                     rss_leak_growth=round(counted / base, 4),
                     rss_queue_high_water_mib=round(excused / mib, 1),
                     pending_peak=max(p for _, _, p in samples))
    # The trajectory, ten points: a leak climbs, a settling allocator
    # flattens, a stall steps up once with the queue.
    step = max(1, len(samples) // 10)
    s.figures["rss_mib_pending_by_second"] = [[round(t), round(b / mib, 1), p]
                                              for t, b, p in samples[::step]]
    s.check(counted / base < args.max_rss_growth,
            "resident memory grew %.1f%% after the warm-up, besides %.1f MiB with new queue "
            "depths (bar %.0f%%)" % (100 * counted / base, excused / mib,
                                     100 * args.max_rss_growth))


def overload(args, s):
    repo = new_repository("numaserve_overload_")
    try:
        with serve(args, repo, ["--max-queue-size", str(args.max_queue_size)]) as server:
            cap, _ = capacity(args, server)
            calm = run_load(args, server, "open", args.phase_seconds, rate=0.5 * cap)
            hot = run_load(args, server, "open", args.overload_seconds, rate=2.0 * cap)
            # Recovered: a window at half the capacity after the overload
            # within the bound of the window before it. Up to 3 windows: a
            # burst of other work on the machine can slow one (the check ran
            # beside other tests under ctest -j2), while a server that does
            # not recover (a stuck queue, slots never freed) fails them all.
            recovered_bound = max(3.0 * calm["p99_ms"], calm["p99_ms"] + 20.0)
            afters = []
            while True:
                after = run_load(args, server, "open", args.phase_seconds, warmup=0.0,
                                 rate=0.5 * cap)
                afters.append(after)
                if after["errors"] or after["p99_ms"] <= recovered_bound or len(afters) == 3:
                    break
            by_code = hot["errors_by_code"]
            refused = by_code.get("8", 0)  # RESOURCE_EXHAUSTED
            other = hot["errors"] - refused
            s.figures.update(
                capacity_rps=round(cap, 1), max_queue_size=args.max_queue_size,
                offered_rps=round(2 * cap, 1), served_rps=hot["requests_per_second"],
                served_fraction_of_capacity=round(hot["requests_per_second"] / cap, 3),
                refused=refused, other_failures=other, dropped=hot["dropped"],
                refusal_p50_ms=hot["error_p50_ms"], refusal_p99_ms=hot["error_p99_ms"],
                served_p50_ms=hot["p50_ms"], served_p99_ms=hot["p99_ms"],
                calm_p99_ms_before=calm["p99_ms"], calm_p99_ms_after=after["p99_ms"],
                calm_p99_ms_after_windows=[a["p99_ms"] for a in afters],
                errors_after=after["errors"])
            log("overload: capacity %.0f req/s, offered %.0f: served %.0f, refused %d "
                "(p99 %.2f ms) , served p99 %.1f ms; afterwards p99 %.2f ms, %d errors"
                % (cap, 2 * cap, hot["requests_per_second"], refused, hot["error_p99_ms"],
                   hot["p99_ms"], after["p99_ms"], after["errors"]))
            s.check(calm["errors"] == 0, "requests failed at half the capacity before the "
                    "overload: %s" % calm["errors_by_code"])
            s.check(refused > 0, "nothing was refused at twice the capacity")
            s.check(other == 0, "failures other than RESOURCE_EXHAUSTED: %s" % by_code)
            s.check(hot["dropped"] == 0, "%d sends found 4096 calls outstanding (the server "
                    "neither answered nor refused)" % hot["dropped"])
            s.check(hot["requests_per_second"] >= args.min_overload_goodput * cap,
                    "served only %.0f req/s of a %.0f req/s capacity during the overload"
                    % (hot["requests_per_second"], cap))
            # A refusal is decided at admission: it must not wait the way a
            # queued request does.
            s.check(hot["error_p50_ms"] < 0.5 * hot["p50_ms"] or hot["error_p50_ms"] < 2.0,
                    "refusals took %.2f ms (p50), served requests %.2f ms: refusals wait"
                    % (hot["error_p50_ms"], hot["p50_ms"]))
            s.check(after["errors"] == 0, "after the overload, requests at half the capacity "
                    "still fail: %s" % after["errors_by_code"])
            s.check(after["p99_ms"] <= recovered_bound,
                    "after the overload p99 is %s ms in %d windows in a row against %.1f ms "
                    "before" % (" / ".join("%.1f" % a["p99_ms"] for a in afters), len(afters),
                                calm["p99_ms"]))
            s.check(restarts(server) == 0, "workers restarted under overload")
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def kill(args, s):
    """Two workers, then one (whose batch waits for its replacement)."""
    for workers in (2, 1):
        kill_one(args, s, workers)


def kill_one(args, s, workers):
    repo = new_repository("numaserve_kill_")
    try:
        with serve(args, repo, [] if workers == 2 else ["--domain", "numa"]) as server:
            before = nc.wait_until(lambda: len(server.worker_pids()) == workers or None, 30)
            s.check(before, "expected %d workers, found %s" % (workers, server.worker_pids()))
            cap, _ = capacity(args, server)
            restarts_before = restarts(server)
            rate = 0.5 * cap
            load = BackgroundLoad(args, server, "open", args.kill_seconds, warmup=0.0,
                                  rate=rate)
            time.sleep(args.kill_seconds / 3)
            victim = min(server.worker_pids())
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            replaced = nc.wait_until(
                lambda: len(server.worker_pids()) == workers
                and victim not in server.worker_pids(), 30)
            replaced_s = time.monotonic() - killed_at
            r = load.result()
            f = dict(capacity_rps=round(cap, 1), rate_rps=round(rate, 1),
                     requests=round(r["requests_per_second"] * args.kill_seconds),
                     errors=r["errors"], errors_by_code=r["errors_by_code"],
                     dropped=r["dropped"], p99_ms=r["p99_ms"], p999_ms=r["p999_ms"],
                     max_ms=r.get("max_ms"), worker_replaced_s=round(replaced_s, 2))
            s.figures["%d_workers" % workers] = f
            log("kill: 1 of %d workers (pid %d) killed at %.0f req/s: %d requests, %d failed, "
                "p99.9 %.1f ms, replaced in %.1f s" % (workers, victim, rate, f["requests"],
                                                       r["errors"], r["p999_ms"], replaced_s))
            s.check(r["errors"] == 0, "%d workers: %d requests lost: %s"
                    % (workers, r["errors"], r["errors_by_code"]))
            s.check(r["dropped"] == 0, "%d sends found 4096 calls outstanding" % r["dropped"])
            s.check(replaced, "the killed worker was not replaced within 30 s")
            s.check(nc.wait_until(lambda: restarts(server) > restarts_before, 10),
                    "numaserve_worker_restarts_total did not count the restart")
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _huge_initializer_model(path):
    """The default model with an unused initializer that claims 2^40
    elements backed by 16 bytes."""
    import onnx

    model = onnx.load(path)
    t = model.graph.initializer.add()
    t.name = "unused_huge"
    t.data_type = onnx.TensorProto.FLOAT
    t.dims.extend([1 << 40])
    t.raw_data = b"\0" * 16
    return model.SerializeToString()


def corrupt(args, s):
    repo = new_repository("numaserve_corrupt_")
    try:
        good = open(os.path.join(repo, MODEL, "1", "model.onnx"), "rb").read()
        with serve(args, repo, ["--model-control-mode", "poll",
                                "--repository-poll-secs", "1"]) as server:
            stub = server.stub()
            light = dict(model=MODEL, rows=1)
            cap, _ = capacity(args, server, **light)
            restarts_before = restarts(server)
            seconds = args.corrupt_seconds
            load = BackgroundLoad(args, server, "open", seconds, warmup=0.0, rate=0.5 * cap,
                                  **light)
            events = []

            def wait_state(version, state):
                ok = nc.wait_until(lambda: nc.repository_index(stub).get((MODEL, str(version)),
                                                            ("",))[0] == state,
                                   args.poll_wait_seconds)
                events.append((version, state, bool(ok)))
                return ok

            # Version 2 copied in place slowly: a poll sees half the file.
            d2 = os.path.join(repo, MODEL, "2")
            os.makedirs(d2)
            with open(os.path.join(d2, "model.onnx"), "wb") as f:
                f.write(good[:len(good) // 2])
                f.flush()
                time.sleep(2.5)
                f.write(good[len(good) // 2:])
            s.check(wait_state(2, "READY"), "version 2 was not served once its file was "
                    "complete: %r" % (nc.repository_index(stub),))
            hostile = {3: os.urandom(len(good) // 4),
                       4: _huge_initializer_model(os.path.join(repo, MODEL, "1", "model.onnx"))}
            for version, data in hostile.items():
                d = os.path.join(repo, MODEL, str(version))
                os.makedirs(d)
                with open(os.path.join(d, "model.onnx"), "wb") as f:
                    f.write(data)
                s.check(wait_state(version, "UNAVAILABLE"),
                        "version %d was not reported unavailable: %r" % (version, nc.repository_index(stub)))
                state, reason = nc.repository_index(stub).get((MODEL, str(version)), ("", ""))
                s.check(reason, "version %d unavailable without a reason" % version)
                s.figures["reason_v%d" % version] = reason[:200]
                s.check(nc.repository_index(stub).get((MODEL, "2"), ("",))[0] == "READY",
                        "version 2 stopped serving after version %d: %r"
                        % (version, nc.repository_index(stub)))
            r = load.result()
            s.figures.update(requests=round(r["requests_per_second"] * seconds),
                             errors=r["errors"], errors_by_code=r["errors_by_code"],
                             p99_ms=r["p99_ms"],
                             worker_restarts=restarts(server) - restarts_before)
            log("corrupt: %d requests while versions 2-4 were dropped in: %d failed; %s"
                % (s.figures["requests"], r["errors"],
                   ", ".join("v%d %s %s" % (v, st, "ok" if ok else "MISSED")
                             for v, st, ok in events)))
            s.check(r["errors"] == 0, "%d requests failed while models were dropped in: %s"
                    % (r["errors"], r["errors_by_code"]))
            s.check(s.figures["worker_restarts"] == 0, "workers restarted")
            s.check(server.proc.poll() is None, "the server exited")
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _namespace_prefix():
    """A command prefix that runs in a private mount namespace, or None."""
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        if shutil.which(prefix[0]) is None:
            return None
        probe = subprocess.run(prefix + ["sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                               capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


def diskfull(args, s):
    prefix = _namespace_prefix()
    if prefix is None:
        s.skipped = ("no private mount namespace (needs root or unprivileged user "
                     "namespaces) for a small tmpfs")
        return
    work = tempfile.mkdtemp(prefix="numaserve_diskfull_")
    try:
        model = nc.write_default_model(os.path.join(work, "repo"))
        train = nc.synthetic_idx_dataset(work, "train", 1024, seed=1)
        test = nc.synthetic_idx_dataset(work, "t10k", 128, seed=2)

        def config(name, checkpoint, max_steps):
            path = os.path.join(work, name + ".cfg")
            with open(path, "w") as f:
                f.write('dataset { train_images: "%s" train_labels: "%s" test_images: "%s" '
                        'test_labels: "%s" }\n' % (train + test))
                f.write('model: "%s"\nglobal_batch_size: 32\nlearning_rate: 0.05\n'
                        'epochs: 100\nmax_steps: %d\nseed: 9\nlog_every_steps: 8\n'
                        'checkpoint_every_steps: 8\ncheckpoint: "%s"\n'
                        'sgd { momentum: 0.9 }\n' % (model, max_steps, checkpoint))
            return path

        # The size of one checkpoint, from a run on the ordinary disk.
        probe_ckpt = os.path.join(work, "probe.ckpt")
        p = subprocess.run([args.binary, "train", "--config", config("probe", probe_ckpt, 8),
                            "--ranks", "1"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            s.check(False, "the probe run failed: %s" % p.stderr[-2000:])
            return
        size = os.path.getsize(probe_ckpt)
        # Room for the first checkpoint, not for the next one's temporary
        # file beside it.
        tmpfs_bytes = (size + size // 2 + 4095) // 4096 * 4096
        mnt = os.path.join(work, "ckpt")
        saved = os.path.join(work, "saved")
        os.makedirs(mnt)
        os.makedirs(saved)
        ckpt = os.path.join(mnt, "run.ckpt")
        cfg = config("full", ckpt, 64)
        script = ('mount -t tmpfs -o size=%d tmpfs "$1" || exit 99\n'
                  '"$2" train --config "$3" --ranks 1; rc=$?\n'
                  'ls -A "$1" > "$4/listing"; cp -p "$1"/* "$4"/ 2>/dev/null\n'
                  'exit $rc\n' % tmpfs_bytes)
        started = time.monotonic()
        p = subprocess.run(prefix + ["sh", "-c", script, "sh", mnt, args.binary, cfg, saved],
                           capture_output=True, text=True, timeout=300)
        s.figures.update(checkpoint_bytes=size, tmpfs_bytes=tmpfs_bytes,
                         exit_code=p.returncode, seconds=round(time.monotonic() - started, 1))
        message = [line for line in p.stderr.splitlines() if "run.ckpt" in line]
        s.figures["error"] = message[-1][:300] if message else p.stderr[-300:]
        log("diskfull: checkpoint of %d bytes on a %d-byte tmpfs: exit %d: %s"
            % (size, tmpfs_bytes, p.returncode, s.figures["error"]))
        if not s.check(p.returncode != 99, "could not mount the tmpfs"):
            return
        s.check(p.returncode != 0, "the run ended well though its checkpoint could not be "
                "written")
        s.check(message and "No space left on device" in message[-1],
                "no error naming the checkpoint and ENOSPC: %s" % p.stderr[-2000:])
        listing = open(os.path.join(saved, "listing")).read().split()
        s.figures["left_in_checkpoint_dir"] = listing
        s.check(listing == ["run.ckpt"], "the checkpoint directory holds %s, not just "
                "the last checkpoint" % listing)
        kept = os.path.join(saved, "run.ckpt")
        if not s.check(os.path.exists(kept), "no checkpoint survived"):
            return
        step, tensors = nc.read_checkpoint(kept)
        s.figures["checkpoint_step"] = step
        s.check(step == 8 and tensors, "the surviving checkpoint is at step %d" % step)
        # With room again, --resume continues from it.
        resumed = os.path.join(work, "resumed.ckpt")
        shutil.copy(kept, resumed)
        p = subprocess.run([args.binary, "train", "--config", config("resume", resumed, 64),
                            "--ranks", "1", "--resume"], capture_output=True, text=True,
                           timeout=300)
        s.check(p.returncode == 0 and ("resumed from %s at step 8" % resumed) in p.stdout,
                "--resume from the surviving checkpoint failed (%d): %s %s"
                % (p.returncode, p.stdout[-1000:], p.stderr[-1000:]))
        if p.returncode == 0:
            s.figures["resumed_to_step"] = nc.read_checkpoint(resumed)[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- main ---------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS,
                    help="run this scenario (repeatable; default: all)")
    ap.add_argument("--short", action="store_true",
                    help="the lengths make test uses (a soak of 30 s, half of it warm-up)")
    ap.add_argument("--binary", default=None, help="numaserve binary (default: $NUMASERVE_BIN "
                    "or the build tree)")
    ap.add_argument("--loadgen", default=None, help="grpc_loadgen (default: beside numaserve)")
    ap.add_argument("--rows", type=int, default=8, help="rows per request of the "
                    "compute-bound model")
    ap.add_argument("--soak-seconds", type=float, default=None)
    ap.add_argument("--load-fraction", type=float, default=0.8)
    ap.add_argument("--max-rss-growth", type=float, default=0.05)
    ap.add_argument("--max-queue-size", type=int, default=64,
                    help="overload: the server's --max-queue-size")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    args.binary = args.binary or nc.default_binary()
    args.loadgen = args.loadgen or os.path.join(os.path.dirname(args.binary), "grpc_loadgen")
    if not os.access(args.loadgen, os.X_OK):
        ap.error("grpc_loadgen not found at %s (give --loadgen)" % args.loadgen)
    if args.soak_seconds is None:
        args.soak_seconds = 30.0 if args.short else 600.0
    args.warmup_fraction = 0.5 if args.short else 0.2
    args.capacity_seconds = 3.0 if args.short else 10.0
    args.phase_seconds = 3.0 if args.short else 10.0
    args.overload_seconds = 5.0 if args.short else 30.0
    args.kill_seconds = 9.0 if args.short else 30.0
    args.poll_wait_seconds = 15.0
    # Load for the whole corrupt scenario (its drops take a few seconds each).
    args.corrupt_seconds = 24.0 if args.short else 66.0
    args.sample_seconds = 0.5 if args.short else 1.0
    args.rss_window = max(2.0, min(30.0, 0.1 * args.soak_seconds))
    # On a machine whose cores the load generator shares, twice the
    # capacity costs the generator a share of them too.
    args.min_overload_goodput = 0.5

    results = []
    for name in args.scenario or SCENARIOS:
        s = Scenario(name)
        started = time.monotonic()
        try:
            globals()[name](args, s)
        except Exception as e:  # a scenario that cannot run is a failure, said so
            s.failures.append("%s: %s" % (type(e).__name__, e))
        s.figures["wall_seconds"] = round(time.monotonic() - started, 1)
        verdict = "skipped (%s)" % s.skipped if s.skipped else (
            "PASS" if s.passed else "FAIL: " + "; ".join(s.failures))
        log("%-9s %s" % (name, verdict))
        results.append(s.as_dict())
    summary = {"scenarios": results,
               "passed": all(r["passed"] or r["skipped"] for r in results)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
