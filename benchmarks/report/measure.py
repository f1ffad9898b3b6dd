"""The measurements behind benchmarks/report/: each function runs one kind
of benchmark with the project's own tools and returns plain data (dicts and
lists, written to data.json as they are), never a plot.

  machine()        lscpu, nproc, git, `numaserve --version`, the load
  limits()         FP32 peak and memory bandwidth (`numaserve topology`)
  in_process()     `numaserve bench --json` and benchmarks/peers/ort_peer.py bench
                   --json per batch and per thread count, with the settings
                   compare.py uses (benchmarks/models/compare.py)
  served()         the real server (`numaserve serve`) under grpc_loadgen at
                   a few loads: the load generator's percentiles and the
                   server's own latency histogram over each run
  layouts()        benchmarks/e2e/scaleout_bench.sh, its summary table
  profile()        `numaserve profile --json` per model and batch (per-step
                   FLOPs, bytes and time), or `numaserve bench --profile
                   --json` where the binary has no profile command

Uses the Python standard library only (plus benchmarks/models/output_check.py
for the models' input shapes, which imports numpy).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
BENCH_MODELS = os.path.join(SOURCE_DIR, "benchmarks", "models")
sys.path.insert(0, BENCH_MODELS)
import output_check  # noqa: E402  (the models' input shapes; the peer's commands)

# How idle worker threads wait: compare.py's default ("short"), each engine
# as it ships.
NUMASERVE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}
ORT_SPIN = "1"


def log(message):
    print(f"make_report: {message}", file=sys.stderr, flush=True)


def run(cmd, env=None, timeout=None, check=True):
    """stdout of CMD; on failure raises with its stderr's tail."""
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {result.returncode}: {tail}")
    return result.stdout


def json_lines(text):
    """Every line of TEXT that is a JSON object."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def has_command(numaserve, command):
    """Whether `numaserve COMMAND --help` is known to this binary."""
    result = subprocess.run([numaserve, command, "--help"], capture_output=True, text=True)
    return result.returncode == 0 and "usage: numaserve " + command in result.stdout


def has_option(numaserve, command, option):
    result = subprocess.run([numaserve, command, "--help"], capture_output=True, text=True)
    return result.returncode == 0 and re.search(rf"^\s*{re.escape(option)}\b", result.stdout,
                                                re.M) is not None


# --- The machine --------------------------------------------------------------

def machine(numaserve):
    lscpu = run(["lscpu"], check=False)
    model_line = next((l.strip() for l in lscpu.splitlines() if l.startswith("Model name:")),
                      "Model name: unknown")
    git = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", SOURCE_DIR, "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True)
    version = subprocess.run([numaserve, "--version"], capture_output=True, text=True)
    numa = re.search(r"^NUMA node\(s\):\s*(\d+)", lscpu, re.M)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "lscpu_model_name": re.sub(r"\s+", " ", model_line),
        "cpus": os.cpu_count(),
        "numa_nodes": int(numa.group(1)) if numa else None,
        "commit": git.stdout.strip() or "unknown",
        "uncommitted_changes": bool(dirty.stdout.strip()),
        "numaserve_version": version.stdout.strip().splitlines()[0] if version.stdout else "",
        "load_before": load_average(),
    }


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def limits(numaserve, measure=True):
    """{"fp32_gflops_per_core", "cores", "memory_gb_per_second" (None when not
    measured), "bandwidth_source", "peak_source", ...}.

    The FP32 peak per core comes from the CPU model (cpuid table, checked by
    an FMA probe) as `numaserve topology` prints it: in its --measure --json
    object ("limits.peak_per_core.fp32_gflops") where the binary has
    --measure, else from its text ("peak per core at G GHz: fp32 P GFLOP/s";
    `topology --json` without --measure has no peak). The memory bandwidth
    only from `topology --measure --json` ("limits.memory_bandwidth", one
    STREAM triad per NUMA node on its cores, summed over the nodes): a
    binary without --measure leaves it None and the report marks the memory
    roof "not measured"."""
    out = {"fp32_gflops_per_core": None, "memory_gb_per_second": None, "nodes": [],
           "peak_source": None, "bandwidth_source": None}
    topology = json.loads(run([numaserve, "topology", "--json"]))
    out["cores"] = topology.get("topology", {}).get("cores") or os.cpu_count()
    if measure and has_option(numaserve, "topology", "--measure"):
        log("topology --measure: FP32 peak and memory bandwidth")
        text = run([numaserve, "topology", "--measure", "--json"], timeout=300)
        data = json.loads(text[text.index("{"):])
        found = data.get("limits", {})
        peak = found.get("peak_per_core", {}).get("fp32_gflops")
        if peak:
            out["fp32_gflops_per_core"] = float(peak)
            out["peak_source"] = "numaserve topology --measure --json"
        nodes = [n for n in found.get("memory_bandwidth", []) if n.get("gb_per_second")]
        if nodes:
            out["nodes"] = nodes
            out["memory_gb_per_second"] = sum(float(n["gb_per_second"]) for n in nodes)
            out["bandwidth_source"] = ("numaserve topology --measure --json (STREAM triad, "
                                       f"{len(nodes)} NUMA node{'s' if len(nodes) > 1 else ''})")
    elif not measure:
        out["bandwidth_source"] = "not measured (--no-measure)"
    else:
        out["bandwidth_source"] = "not measured (this numaserve has no topology --measure)"
    if out["fp32_gflops_per_core"] is None:
        text = run([numaserve, "topology"])
        m = re.search(r"peak per core at ([\d.]+) GHz: fp32 ([\d.]+) GFLOP/s", text)
        if m:
            out["fp32_gflops_per_core"] = float(m.group(2))
            out["peak_source"] = "numaserve topology (cpu: peak per core)"
    return out


# --- In process: numaserve bench and ONNX Runtime ----------------------------

def model_path(models_dir, model):
    return os.path.join(models_dir, model + ".onnx")


def generate_models(models_dir, models):
    """Writes the benchmark models that are missing or stale (as compare.py)."""
    subprocess.run([sys.executable, os.path.join(BENCH_MODELS, "generate.py"), "--out",
                    models_dir, "--if-stale", "--only", *models], check=True,
                   stdout=subprocess.DEVNULL)


def numaserve_bench(numaserve, path, batches, threads, seconds):
    """{batch: bench's JSON row}."""
    out = run([numaserve, "bench", "--model", path, "--batch", ",".join(map(str, batches)),
               "--threads", str(threads), "--seconds", str(seconds), "--json"],
              env=dict(os.environ, **NUMASERVE_ENV))
    return {r["batch"]: r for r in json_lines(out) if "batch" in r and "profile" not in r}


def ort_bench(python, path, batches, threads, seconds):
    """{batch: ort_peer.py bench's JSON row} (the keys numaserve bench uses)."""
    out = run(output_check.ort_bench_command(python, path, ",".join(map(str, batches)), threads,
                                             seconds, ORT_SPIN))
    return {r["batch"]: r for r in json_lines(out) if "batch" in r}


def in_process(numaserve, models_dir, models, batches_of, threads_list, thread_batch_of,
               seconds, with_ort):
    """{"batch": {model: {engine: {batch: row}}}, "threads": {model: {engine:
    {threads: row}}}}: throughput per batch (batches_of[model]) at all
    cores, and per thread count at thread_batch_of[model]. numaserve and
    ONNX Runtime alternate per point series, so a slow stretch of a shared
    machine tends to fall on both."""
    all_threads = max(threads_list)
    by_batch, by_threads = {}, {}
    for m in models:
        path = model_path(models_dir, m)
        batches, thread_batch = batches_of[m], thread_batch_of[m]
        log(f"{m}: throughput per batch {batches} at {all_threads} threads")
        by_batch[m] = {"numaserve": numaserve_bench(numaserve, path, batches, all_threads,
                                                    seconds)}
        if with_ort:
            by_batch[m]["onnxruntime"] = ort_bench(with_ort, path, batches, all_threads, seconds)
        log(f"{m}: throughput per threads {threads_list} at batch {thread_batch}")
        by_threads[m] = {"numaserve": {}, "onnxruntime": {}}
        for t in threads_list:
            row = numaserve_bench(numaserve, path, [thread_batch], t, seconds)
            by_threads[m]["numaserve"][t] = row.get(thread_batch)
            if with_ort:
                row = ort_bench(with_ort, path, [thread_batch], t, seconds)
                by_threads[m]["onnxruntime"][t] = row.get(thread_batch)
        if not with_ort:
            del by_threads[m]["onnxruntime"]
    return {"batch": by_batch, "threads": by_threads}


# --- Served: the real server under load --------------------------------------

def cpu_split(cpus):
    """(compute cpus, front cpus) as serving_bench.sh splits the machine: the
    worker on the last cpu, the front end and the load generator on the
    others; (None, None) on one cpu (nothing pinned)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    return [allowed[-1]], allowed[:-1]


def cpu_list(cpus):
    return ",".join(map(str, cpus))


class Server:
    """`numaserve serve` on a temporary repository holding one model with
    dynamic batching; stopped (SIGTERM, then SIGKILL) by stop() or on exit
    of a with-block."""

    def __init__(self, numaserve, name, path, max_batch, delay_us, serve_args=(),
                 extra_config=""):
        self.repo = tempfile.mkdtemp(prefix="numaserve-report-")
        os.makedirs(os.path.join(self.repo, name, "1"))
        os.symlink(os.path.abspath(path), os.path.join(self.repo, name, "1", "model.onnx"))
        with open(os.path.join(self.repo, name, "config.pbtxt"), "w") as f:
            f.write(f"max_batch_size: {max_batch}\n"
                    f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"
                    f"{extra_config}")
        self.out = tempfile.TemporaryFile(mode="w+")
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [numaserve, "serve", "--model-repository", self.repo, "--grpc-port", "0",
             "--metrics-port", "0", "--http-port", "-1", *serve_args], stdout=self.out, stderr=self.err)
        self.url = self.metrics = None
        deadline = time.time() + 120
        while time.time() < deadline and self.proc.poll() is None:
            self.out.seek(0)
            m = re.search(r"grpc=(\S+) metrics=(\S+)", self.out.read())
            if m:
                self.url, self.metrics = m.group(1), m.group(2)
                break
            time.sleep(0.1)
        if self.url is None:
            self.err.seek(0)
            log_tail = self.err.read()[-2000:]
            self.stop()
            raise RuntimeError(f"the server did not start:\n{log_tail}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.out, self.err):
            f.close()
        shutil.rmtree(self.repo, ignore_errors=True)

    def move_front_end(self, cpus):
        """Every thread of the server process (not its workers, which are
        processes of their own) onto CPUS, as serving_bench.sh does with
        `taskset -a -p` once the server is up."""
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass

    def scrape(self):
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as r:
            return r.read().decode()


def histogram(page, name, model):
    """{upper bound in seconds: cumulative count} of a Prometheus histogram,
    summed over the series of MODEL."""
    buckets = {}
    pattern = re.compile(rf'^{name}_bucket\{{([^}}]*)\}}\s+(\S+)$')
    for line in page.splitlines():
        m = pattern.match(line)
        if not m or f'model="{model}"' not in m.group(1):
            continue
        le = re.search(r'le="([^"]+)"', m.group(1))
        if not le:
            continue
        bound = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + float(m.group(2))
    return buckets


def loadgen(binary, url, model, seconds, warmup, args):
    """grpc_loadgen's JSON summary (its second line), with its text line."""
    result = subprocess.run([binary, "--url", url, "--model", model, "--seconds", str(seconds),
                             "--warmup-seconds", str(warmup), *args],
                            capture_output=True, text=True, timeout=seconds + warmup + 120)
    rows = json_lines(result.stdout)
    if not rows:
        raise RuntimeError(f"grpc_loadgen {' '.join(args)} printed no result: "
                           f"{result.stderr.strip()[-500:]}")
    rows[0]["line"] = result.stdout.splitlines()[0] if result.stdout else ""
    return rows[0]


def served(numaserve, loadgen_bin, name, path, seconds, max_batch=64, delay_us=0,
           callers=32, rows=1, open_shares=(0.25, 0.5)):
    """The server under a few loads, one row per request: 1 caller in
    closed loop, `callers` callers over 4 connections (saturation), and
    open loops at `open_shares` of the saturation rate (requests sent on
    schedule, latency from each one's scheduled send time, so a backlog
    shows). For each: grpc_loadgen's
    p50/p90/p99/p99.9 (client side, from send to answer) and the server's
    numaserve_request_duration_seconds histogram over that run (from
    receiving the request to answering it)."""
    compute, front = cpu_split(os.cpu_count())
    serve_args = ["--cpuset", cpu_list(compute)] if compute else []
    lg_cpus = ["--cpus", cpu_list(front)] if front else []
    runs = []
    with Server(numaserve, name, path, max_batch, delay_us, serve_args) as server:
        if front:
            server.move_front_end(front)
        # Warm-up; also waits for the model to be ready.
        for attempt in range(10):
            try:
                loadgen(loadgen_bin, server.url, name, 0.5, 0,
                        ["--rows", str(rows), "--concurrency", "4"] + lg_cpus)
                break
            except RuntimeError:
                if attempt == 9:
                    raise
                time.sleep(1)
        loads = [("closed, 1 caller", ["--mode", "closed", "--concurrency", "1"]),
                 (f"closed, {callers} callers (saturation)",
                  ["--mode", "closed", "--concurrency", str(callers), "--channels", "4"])]
        i = 0
        while i < len(loads):
            label, args = loads[i]
            log(f"served {name}: {label}, {seconds} s")
            before = histogram(server.scrape(), "numaserve_request_duration_seconds", name)
            result = loadgen(loadgen_bin, server.url, name, seconds, min(1.0, seconds / 2),
                             ["--rows", str(rows), *args] + lg_cpus)
            after = histogram(server.scrape(), "numaserve_request_duration_seconds", name)
            # The warm-up part is in the histogram too: the client's
            # percentiles are over the measured part only.
            # [upper bound in seconds ("+Inf" for the last), requests]
            result["server_histogram"] = [
                [b if b != float("inf") else "+Inf", after[b] - before.get(b, 0.0)]
                for b in sorted(after)]
            result["load"] = label
            runs.append(result)
            if i == 1 and result.get("requests_per_second"):
                for share in open_shares:
                    rate = max(1, int(result["requests_per_second"] * share))
                    loads.append((f"open loop, {rate} req/s ({share:.0%} of saturation)",
                                  ["--mode", "open", "--rate", str(rate)]))
            i += 1
    return {"model": name, "rows_per_request": rows, "max_batch_size": max_batch,
            "max_queue_delay_us": delay_us,
            "compute_cpus": compute, "front_cpus": front, "runs": runs}


# --- Layouts: scaleout_bench.sh ------------------------------------------------

def layouts(build_dir, cases, seconds, warmup):
    """scaleout_bench.sh with CASES, SECONDS_PER_RUN and WARMUP_SECONDS; its
    summary table as {"rows": [{model, layout, served, reference,
    reference_kind, ratio, p50_ms, p99_ms, batch}], "output": text}."""
    env = dict(os.environ, CASES=cases, SECONDS_PER_RUN=str(seconds),
               WARMUP_SECONDS=str(warmup))
    script = os.path.join(SOURCE_DIR, "benchmarks", "e2e", "scaleout_bench.sh")
    result = subprocess.run(["bash", script, build_dir], capture_output=True, text=True,
                            env=env, cwd=SOURCE_DIR, timeout=3600)
    text = result.stdout
    rows = []
    in_summary = False
    for line in text.splitlines():
        if line.startswith("== summary"):
            in_summary = True
            continue
        if not in_summary or not line.startswith("| ") or line.startswith("| model") \
                or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7:
            continue
        layout = cells[1]
        letter = re.match(r"\((\w)\)", layout)
        reference = re.match(r"([\d.]+) \((.*)\)", cells[3])
        latency = re.match(r"([\d.]+) / ([\d.]+)", cells[5])
        rows.append({
            "model": cells[0],
            "layout": layout,
            "letter": letter.group(1) if letter else "?",
            "served": to_float(cells[2]),
            "reference": to_float(reference.group(1)) if reference else None,
            "reference_kind": reference.group(2) if reference else "",
            "ratio": to_float(cells[4]),
            "p50_ms": to_float(latency.group(1)) if latency else None,
            "p99_ms": to_float(latency.group(2)) if latency else None,
            "batch": to_float(cells[6]),
        })
    if result.returncode != 0 and not rows:
        raise RuntimeError(f"scaleout_bench.sh exited {result.returncode}: "
                           f"{(result.stderr or text).strip()[-800:]}")
    return {"rows": rows, "output": text}


def to_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


# --- Per-step profile -----------------------------------------------------------

def profile(numaserve, models_dir, models, batches, threads, seconds):
    """{"source": "profile" | "bench --profile", "runs": [{model, batch,
    steps: [{step, kind, flops, bytes, seconds, share, gflops}], totals}]}.

    Per step, FLOPs and bytes are per call and seconds the mean time of one
    call; missing figures are None. Read defensively: the keys are those of
    `numaserve profile --json` ("flops", "bytes", "ms" or "seconds" with
    "calls", "gflops", "share"; "totals"), else of `numaserve bench --profile
    --json` (rows with "ms", "gflops", "share" and, in newer binaries,
    "bytes")."""
    use_profile = has_command(numaserve, "profile")
    runs = []
    for m in models:
        path = model_path(models_dir, m)
        for b in batches:
            log(f"{m}: per-step profile at batch {b}")
            if use_profile:
                text = run([numaserve, "profile", "--model", path, "--batch", str(b),
                            "--threads", str(threads), "--seconds", str(seconds), "--json"],
                           env=dict(os.environ, **NUMASERVE_ENV), timeout=600)
                data = json.loads(text[text.index("{"):])
                steps = [step_row(s) for s in data.get("steps", [])]
                totals = step_row(data.get("totals", {}))
                if totals["seconds"] is None and data.get("step_ms"):
                    totals["seconds"] = float(data["step_ms"]) / 1e3
                runs.append({"model": m, "batch": b, "steps": steps, "totals": totals,
                             "limits": data.get("limits", {})})
            else:
                text = run([numaserve, "bench", "--model", path, "--batch", str(b),
                            "--threads", str(threads), "--seconds", str(seconds), "--json",
                            "--profile", "--top", "0"],
                           env=dict(os.environ, **NUMASERVE_ENV), timeout=600)
                prof = next((r["profile"] for r in json_lines(text) if "profile" in r), {})
                steps = [step_row(s) for s in prof.get("rows", [])]
                totals = {"flops": sum(s["flops"] or 0 for s in steps) or None,
                          "bytes": (sum(s["bytes"] for s in steps)
                                    if steps and all(s["bytes"] for s in steps) else None),
                          "seconds": (float(prof["step_ms"]) / 1e3
                                      if prof.get("step_ms") else None)}
                runs.append({"model": m, "batch": b, "steps": steps, "totals": totals,
                             "limits": {}})
    return {"source": "profile" if use_profile else "bench --profile", "runs": runs}


# GEMM shapes for the roofline, M x K x N: the MLP's first layer at batch 1
# and 32, BERT-base's projections and feed-forward over 128 tokens, a square
# one; --quick takes the first two of QUICK_GEMM_SHAPES.
GEMM_SHAPES = [(1, 784, 1024), (32, 1024, 1024), (128, 768, 768), (128, 768, 3072),
               (1024, 1024, 1024)]
QUICK_GEMM_SHAPES = [(1, 64, 64), (32, 256, 256)]


def gemm_model(path, k, n):
    """An ONNX model y[batch, n] = x[batch, k] @ W[k, n], W constant."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper, TensorProto
    w = np.random.default_rng(k * 7919 + n).uniform(-1, 1, (k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="gemm")], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def gemm_shapes(numaserve, shapes, threads, seconds):
    """[{m, k, n, flops, bytes, seconds, gflops}] for each GEMM shape, from
    `numaserve profile --json` of a one-MatMul model at batch M (FLOPs and
    bytes per call, seconds per call)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="numaserve_report_gemm_") as tmp:
        for m, k, n in shapes:
            log(f"GEMM {m}x{k}x{n}: profile")
            path = os.path.join(tmp, f"gemm_{k}x{n}.onnx")
            if not os.path.exists(path):
                gemm_model(path, k, n)
            text = run([numaserve, "profile", "--model", path, "--batch", str(m),
                        "--threads", str(threads), "--seconds", str(seconds), "--json"],
                       env=dict(os.environ, **NUMASERVE_ENV), timeout=600)
            data = json.loads(text[text.index("{"):])
            totals = step_row(data.get("totals", {}))
            if totals["seconds"] is None and data.get("step_ms"):
                totals["seconds"] = float(data["step_ms"]) / 1e3
            if totals["gflops"] is None and totals["flops"] and totals["seconds"]:
                totals["gflops"] = totals["flops"] / totals["seconds"] / 1e9
            out.append({"m": m, "k": k, "n": n, "flops": totals["flops"],
                        "bytes": totals["bytes"], "seconds": totals["seconds"],
                        "gflops": totals["gflops"]})
    return out


def number(row, *keys):
    for k in keys:
        v = row.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def step_row(s):
    """One step (or the totals) as {step, kind, flops, bytes, seconds, share,
    gflops}: FLOPs and bytes per call, seconds per call."""
    seconds = number(s, "seconds")
    calls = number(s, "calls")
    if seconds is not None and calls:
        seconds /= calls  # "seconds" over all calls
    elif seconds is None:
        ms = number(s, "ms")
        seconds = ms / 1e3 if ms is not None else None
    flops = number(s, "flops")
    gflops = number(s, "gflops")
    if flops is None and gflops is not None and seconds:
        flops = gflops * 1e9 * seconds
    if gflops is None and flops is not None and seconds:
        gflops = flops / seconds / 1e9
    bytes_ = number(s, "bytes")
    return {"step": s.get("step", ""), "kind": s.get("kind", ""), "flops": flops,
            "bytes": bytes_, "seconds": seconds, "share": number(s, "share"), "gflops": gflops,
            "threads": number(s, "threads")}
