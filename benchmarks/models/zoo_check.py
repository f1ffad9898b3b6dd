"""The zoo's models on numaserve against ONNX Runtime (zoo.py --report,
--bench; tests/models/test_zoo.py).

check(): exports the small models into a temporary repository, serves
them all from one `numaserve serve` (tests/clients/numaserve_client.py,
gRPC), and for each model that loads sends its three shapes' inputs, one
request each, comparing every output with ONNX Runtime's (CPU provider,
the same file and inputs): same shape and dtype, and for floats the
relative error max|numaserve - ORT| / max|ORT| at most zoo.RTOL (1e-4),
integers exactly. A model that does not load carries the server's reason.

bench(): the full-size models at batch 1 and 8 (the transformers at
sequence lengths 16, 128 and 512), each exported with only the batch
dynamic so that `numaserve bench` and benchmarks/peers/ort_peer.py bench
(this environment's ONNX Runtime) measure the same file, in process, on
--threads threads. Both draw each integer input below the rows of the
table the model gathers it from (index_bounds: input ids below the
vocabulary, token type ids below 2), masks 0 or 1.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import zoo

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
ORT_PEER = os.path.join(SOURCE_DIR, "benchmarks", "peers", "ort_peer.py")


def numaserve_client():
    sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
    import numaserve_client as nc
    return nc


def ort_outputs(path, inputs, threads=1):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, inputs)))


def relative_error(got, want, reference="ONNX Runtime"):
    """max|got - want| / max|want| over every output (floats), 0 or inf for
    integers (exact or not); a string naming the first output whose name,
    shape or dtype differs."""
    if sorted(got) != sorted(want):
        return "outputs %s, %s's %s" % (sorted(got), reference, sorted(want))
    worst = 0.0
    for name, w in sorted(want.items()):
        g = got[name]
        if g.shape != w.shape or g.dtype != w.dtype:
            return "%s: %s %s, %s's %s %s" % (name, g.dtype, list(g.shape), reference,
                                               w.dtype, list(w.shape))
        if w.size == 0:
            continue
        if not np.issubdtype(w.dtype, np.floating):
            worst = max(worst, 0.0 if np.array_equal(g, w) else float("inf"))
            continue
        scale = float(np.max(np.abs(w)))
        diff = float(np.max(np.abs(g.astype(np.float64) - w)))
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")))
    return worst


class Result(object):
    """One model's row: export, load, per-shape errors."""

    def __init__(self, model):
        self.model = model
        self.opset = None
        self.ops = 0
        self.export_error = None
        self.loaded = None  # None: not tried
        self.reason = ""
        self.errors = []  # per shape: float or a string
        self.torch_errors = []  # ONNX Runtime against PyTorch, per shape
        self.triton_errors = {}  # "grpc"/"http" -> per shape, through tritonclient
        # The same file served again as NAME_batched, with max_batch_size
        # 8 and a 100 ms queue delay: whether the server takes it (its rows
        # found apart at load), and then the first shape's rows sent at
        # once, one request each: their error against ONNX Runtime on the
        # whole batch.
        self.batched = False
        self.together_error = None
        self.together_runs = None  # the runs that computed them (1: one batch)

    def matches(self):
        return (self.loaded and len(self.errors) == len(self.model.shapes["small"]) and
                all(isinstance(e, float) and e <= zoo.RTOL for e in self.errors))


def fixed_axes(proto, axes):
    """'input[axis]' for each axis AXES asks dynamic that PROTO's inputs fix."""
    fixed = []
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        for axis in axes.get(value.name, {}):
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                fixed.append("%s[%d]" % (value.name, axis))
    return fixed


def export_all(models, out_dir, with_torch=False, exporter="torchscript"):
    """{name: Result} with each model exported to OUT_DIR/NAME/1/model.onnx
    (a model repository) and, WITH_TORCH, ONNX Runtime checked against
    PyTorch at every shape."""
    import onnx
    results = {}
    for m in models:
        r = results[m.name] = Result(m)
        path = os.path.join(out_dir, m.name, "1", "model.onnx")
        os.makedirs(os.path.dirname(path))
        try:
            module = zoo.export(m, "small", path, exporter=exporter)
        except Exception as e:  # noqa: BLE001 - the exporter's refusal is the result
            shutil.rmtree(os.path.join(out_dir, m.name))
            while e.__cause__ is not None:  # the exporter's wrapped root cause
                e = e.__cause__
            lines = [line for line in str(e).splitlines() if line.strip()] or [""]
            r.export_error = "%s: %s" % (type(e).__name__, lines[0].strip()[:300])
            continue
        proto = onnx.load(path, load_external_data=False)
        r.opset = {o.domain: o.version for o in proto.opset_import}.get("", 0)
        r.ops = sorted({n.op_type for n in proto.graph.node})
        fixed = fixed_axes(proto, m.io("small")[2])
        if fixed:
            # torch.onnx.export(dynamo=True) falls back to a TorchScript
            # capture without the dynamic shapes where torch.export fails.
            shutil.rmtree(os.path.join(out_dir, m.name))
            r.export_error = "the exported file has fixed dims where dynamic ones were asked: " + \
                ", ".join(fixed)
            continue
        if with_torch:
            for i in range(len(m.shapes["small"])):
                inputs = zoo.inputs_at(m, "small", i)
                try:
                    got = ort_outputs(path, inputs)
                except Exception as e:  # noqa: BLE001 - ONNX Runtime's refusal is the result
                    r.torch_errors.append("ONNX Runtime: " + str(e).splitlines()[0].replace(
                        path, "model.onnx")[:200])
                    continue
                r.torch_errors.append(relative_error(
                    got, zoo.torch_outputs(module, m, "small", inputs), "PyTorch"))
    return results


BATCHED = "_batched"


def add_batched_copies(results, repo):
    """Each exported model once more as NAME_batched, asking to be batched
    across requests (Result.batched)."""
    for name, r in results.items():
        if r.export_error:
            continue
        # The whole version folder: model.onnx and any weights beside it.
        shutil.copytree(os.path.join(repo, name, "1"), os.path.join(repo, name + BATCHED, "1"))
        with open(os.path.join(repo, name + BATCHED, "config.pbtxt"), "w") as f:
            f.write("max_batch_size: 8\n"
                    "dynamic_batching { max_queue_delay_microseconds: 100000 }\n")


def serve_and_compare(results, repo, binary=None, log=print, triton_python=None):
    """Serves REPO (the exported models) and fills each Result's loaded,
    reason and errors; with TRITON_PYTHON (the python of <build>/venv/triton)
    the loaded models' requests once more through Triton's tritonclient,
    gRPC and HTTP (triton_errors)."""
    nc = numaserve_client()
    with nc.ServerProcess(repo, ["--max-workers", "1"], binary=binary,
                          startup_timeout=300.0) as server:
        served_and_compared(nc, server, results, repo, log)
        if triton_python:
            through_tritonclient(server, results, repo, triton_python, log)


def served_and_compared(nc, server, results, repo, log):
    """The gRPC requests of every loaded model, compared with ONNX Runtime."""
    stub = server.stub()
    index = nc.repository_index(stub, by_version=False)
    for name, r in results.items():
        if r.export_error:
            continue
        state, reason = index.get(name, ("MISSING", "not in the repository index"))
        r.loaded = state == "READY"
        path = os.path.join(repo, name, "1", "model.onnx")
        # The reason without the temporary path; an unsupported op's
        # list of every supported op left out.
        reason = reason.replace(path + ": ", "").split(" (supported: ")[0]
        r.reason = "" if r.loaded else "%s: %s" % (state, reason)
        if not r.loaded:
            log("%s: not loaded: %s" % (name, r.reason))
            continue
        for i, shape in enumerate(r.model.shapes["small"]):
            inputs = zoo.inputs_at(r.model, "small", i)
            want = ort_outputs(path, inputs)
            try:
                got = nc.infer(stub, name, inputs, deadline=120.0)
            except Exception as e:  # noqa: BLE001 - grpc.RpcError, reported
                details = e.details() if hasattr(e, "details") else str(e)
                r.errors.append("at %s: %s" % (shape, details))
                log("%s %s: request failed: %s" % (name, shape, details))
                continue
            r.errors.append(relative_error(got, want))
            log("%s %s: relative error %s" % (name, shape, r.errors[-1]))
        r.batched = index.get(name + BATCHED, ("",))[0] == "READY"
        if r.batched:
            r.together_error = rows_together(nc, server, r, path)
            log("%s: %s rows as one request each, in %s run(s): relative error %s" % (
                name, r.model.shapes["small"][0][0], r.together_runs, r.together_error))


def rows_together(nc, server, r, path):
    """The first shape's rows sent at once, one request per row, to a model
    the server batches across requests: each row's answer against ONNX
    Runtime's on the whole batch (the worst relative error), or the
    failure."""
    inputs = zoo.inputs_at(r.model, "small", 0)
    want = ort_outputs(path, inputs)
    rows = len(next(iter(inputs.values())))
    model = r.model.name + BATCHED
    runs_before = server.metrics().sum("numaserve_executions_total", model=model)
    answers = nc.call_together(server, rows, lambda i, stub: nc.infer(
        stub, model, {k: v[i:i + 1] for k, v in inputs.items()}, deadline=120.0))
    r.together_runs = int(server.metrics().sum("numaserve_executions_total", model=model) -
                          runs_before)
    for a in answers:
        if not isinstance(a, dict):
            return "failed: %s" % (a.details() if hasattr(a, "details") else a)
    got = {k: np.concatenate([a[k] for a in answers]) for k in want}
    return relative_error(got, want)


def through_tritonclient(server, results, repo, triton_python, log):
    """Each loaded model's requests sent again by tests/models/
    zoo_tritonclient.py (Triton's tritonclient, gRPC and HTTP) to SERVER;
    the answers compared with ONNX Runtime's into Result.triton_errors."""
    work = os.path.join(repo, "..", "tritonclient")
    os.makedirs(work, exist_ok=True)
    manifest, wants = [], []
    for name, r in results.items():
        if not r.loaded:
            continue
        path = os.path.join(repo, name, "1", "model.onnx")
        for i in range(len(r.model.shapes["small"])):
            inputs = zoo.inputs_at(r.model, "small", i)
            stem = os.path.join(work, "%s_%d" % (name, i))
            np.savez(stem + "_inputs.npz", **inputs)
            manifest.append({"model": name, "inputs": stem + "_inputs.npz", "outputs": stem})
            wants.append((r, ort_outputs(path, inputs)))
    with open(os.path.join(work, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    run = subprocess.run([triton_python, os.path.join(SOURCE_DIR, "tests", "models",
                                                      "zoo_tritonclient.py"),
                          "--grpc", server.grpc_address, "--http",
                          "%s:%d" % (server.host, server.http_port),
                          "--manifest", os.path.join(work, "manifest.json")],
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError("zoo_tritonclient.py failed (%d): %s" % (
            run.returncode, run.stderr[-2000:]))
    for request, (r, want) in zip(manifest, wants):
        for protocol in ("grpc", "http"):
            got = dict(np.load(request["outputs"] + "." + protocol + ".npz"))
            r.triton_errors.setdefault(protocol, []).append(relative_error(got, want))
            log("%s through tritonclient.%s: relative error %s" % (
                request["model"], protocol, r.triton_errors[protocol][-1]))


def check(models, binary=None, with_torch=False, log=print, exporter="torchscript",
          triton_python=None):
    """{name: Result} for MODELS (small), exported and served."""
    work = tempfile.mkdtemp(prefix="numaserve_zoo_")
    try:
        repo = os.path.join(work, "models")
        os.makedirs(repo)
        start = time.monotonic()
        results = export_all(models, repo, with_torch, exporter)
        log("exported %d models in %.1f s" % (len(results), time.monotonic() - start))
        add_batched_copies(results, repo)
        serve_and_compare(results, repo, binary, log, triton_python)
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fmt_errors(errors):
    """Errors per shape; a message the same at every shape once."""
    texts = [e if isinstance(e, str) else "%.1e" % e for e in errors]
    if texts and all(isinstance(e, str) for e in errors) and len(set(texts)) == 1:
        texts = texts[:1]
    return " ".join(texts) or "-"


def report(models, binary=None, exporter="torchscript"):
    """Prints the Markdown table of every model; returns 0 where every model
    the registry calls served loads and matches (TorchScript exports; the
    registry says nothing of the dynamo path's)."""
    results = check(models, binary, with_torch=True, log=lambda s: print(s, file=sys.stderr),
                    exporter=exporter)
    print("| model | opset | loads | numaserve vs ORT (3 shapes) | ORT vs PyTorch | "
          "shapes | why not |")
    print("|---|---|---|---|---|---|---|")
    failed = []
    for name, r in results.items():
        shapes = " ".join("x".join(str(d) for d in s) for s in r.model.shapes["small"])
        why = r.export_error or r.reason or ("" if r.matches() else "outputs differ")
        if r.model.served and not r.matches() and exporter == "torchscript":
            failed.append(name)
        print("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, r.opset or "-", "export fails" if r.export_error else
            ("yes" if r.loaded else "no"),
            fmt_errors(r.errors), fmt_errors(r.torch_errors), shapes,
            why.replace("|", "\\|").replace("\n", " ")[:400]))
    if failed:
        print("zoo: served models that failed: %s" % ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


# Ops an index passes through unchanged on its way to the Gather reading it.
INDEX_PASSING_OPS = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")
INTEGER_TYPES = (2, 3, 4, 5, 6, 7, 12, 13)  # onnx.TensorProto's (U)INT8..64


def index_bounds(path):
    """{input: bound} for every integer input of the ONNX file at PATH: the
    rows of the smallest constant table (an initializer or a Constant node)
    a Gather reads it as indices of, directly or through INDEX_PASSING_OPS;
    2 (0 or 1: a mask or a flag) for an integer input no such Gather reads."""
    import onnx
    from onnx import numpy_helper
    graph = onnx.load(path, load_external_data=False).graph
    tables = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    tables[node.output[0]] = list(numpy_helper.to_array(a.t).shape)
    readers = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, slot))
    bounds = {}
    for value in graph.input:
        if value.type.tensor_type.elem_type not in INTEGER_TYPES:
            continue
        rows, frontier, seen = [], [value.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node, slot in readers.get(name, []):
                if node.op_type == "Gather" and slot == 1 and node.input[0] in tables:
                    dims = tables[node.input[0]]
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    if -len(dims) <= axis < len(dims):
                        rows.append(dims[axis])
                elif node.op_type in INDEX_PASSING_OPS and slot == 0:
                    frontier.extend(node.output)
        bounds[value.name] = min(rows) if rows else 2
    return bounds


def bench(models, binary, threads, seconds, sequences=()):
    """numaserve bench and ort_peer.py bench on each full-size model, batch
    1 and 8; prints one JSON line per model, shape and engine. SEQUENCES
    (if any): the transformers' sequence lengths (the decoders' past
    lengths) measured, of 16, 128 and 512."""
    nc = numaserve_client()
    binary = binary or nc.default_binary()
    work = tempfile.mkdtemp(prefix="numaserve_zoo_bench_")
    try:
        for m in models:
            names, outputs, axes = m.io("full")
            batch_only = {n: {0: "batch"} for n in names + outputs
                          if 0 in axes.get(n, {})}
            seen = set()
            for shape in m.shapes["full"]:
                key = shape[1:]  # one export per non-batch shape
                if key in seen or (sequences and m.family == "language" and len(shape) > 1 and
                                   shape[-1] not in sequences):
                    continue
                seen.add(key)
                bench_one(m, shape, batch_only, work, binary, threads, seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def bench_one(model, shape, batch_only, work, binary, threads, seconds):
    """Exports MODEL at SHAPE's non-batch dims (the example's first dim
    only dynamic) and runs both benches at batch 1 and 8."""
    full = dict(model.shapes)
    full["full"] = [shape]
    fixed = zoo.ZooModel(**{**model.__dict__, "shapes": full})
    # A folder per export: one past 2 GiB (the LLaMA decoder) keeps its
    # weights beside model.onnx as external data.
    folder = os.path.join(work, "%s_%s" % (model.name, "x".join(map(str, shape[1:])) or "b"))
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    zoo.export(fixed, "full", path, dynamic_axes=batch_only)
    bounds = ",".join("%s=%d" % kv for kv in sorted(index_bounds(path).items()))
    runs = {"numaserve": [binary, "bench", "--model", path, "--batch", "1,8", "--threads",
                          str(threads), "--seconds", str(seconds), "--json"],
            "onnxruntime": [sys.executable, ORT_PEER, "bench", "--model", path, "--batch",
                            "1,8", "--threads", str(threads), "--seconds", str(seconds),
                            "--json"]}
    if bounds:
        for command in runs.values():
            command += ["--index-bounds", bounds]
    for engine, command in runs.items():
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            print(json.dumps({"model": model.name, "shape": shape[1:], "engine": engine,
                              "error": (run.stderr or run.stdout).strip()[-400:]}), flush=True)
            continue
        for line in run.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                row.update(model=model.name, shape=shape[1:], engine=engine)
                print(json.dumps(row), flush=True)
    shutil.rmtree(folder)
