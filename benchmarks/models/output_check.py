"""The benchmark models' outputs, numaserve's against ONNX Runtime's.

One definition of the inputs, the error measures and the tolerances, shared
by the three places that compare the two engines' outputs:

  benchmarks/models/compare.py              (`make bench`) numaserve vs ONNX
                                            Runtime run now, through node
  benchmarks/peers/make_reference_outputs.py  writes ONNX Runtime's outputs
                                            into tests/models/reference/
  tests/models/test_benchmark_outputs.py    (`make test`) numaserve vs those
                                            committed outputs

Inputs are standard normal float32 from a fixed seed per model (INPUT_SEEDS),
so they are rebuilt anywhere instead of committed. numaserve runs as the
real binary: `numaserve serve` on a temporary repository linking to the
model files, asked over gRPC (tests/clients/numaserve_client.py), one
request per model, every request its own batch. ONNX Runtime runs as
benchmarks/peers/ort_peer.py (PyPI onnxruntime, CPU provider) in the peers'
virtual environment (requirements/peers.txt; peer_python() makes it).

Errors of an output `got` against the reference `want` (ONNX Runtime's):
  nmse      mse(want, got) / mse(want, 0): the error's energy against the
            output's, the normalized error the engine's tests use
  max_rel   max|got - want| / max|want|: the worst element, against the
            output's largest magnitude (a single wrong element or row that
            the mean hides)
Both must be at most MAX_NMSE and MAX_REL; the comment there says what was
measured.

Uses Debian's python3-numpy, python3-onnx and python3-grpcio only; ONNX
Runtime is only ever imported by ort_peer.py, in its own environment.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(os.path.join(HERE, "..", ".."))
PEERS_DIR = os.path.join(SOURCE_DIR, "benchmarks", "peers")
ORT_PEER = os.path.join(PEERS_DIR, "ort_peer.py")
VENV_SCRIPT = os.path.join(SOURCE_DIR, "tools", "python", "venv.sh")
REFERENCE_DIR = os.path.join(SOURCE_DIR, "tests", "models", "reference")

# Model: (input name, input shape without the batch, output name).
MODELS = {
    "mlp": ("input", (784,), "logits"),
    "resnet50": ("input", (3, 224, 224), "logits"),
    "mobilenetv2": ("input", (3, 224, 224), "logits"),
    "bert_base": ("input", (128, 768), "output"),
}
INPUT_SEEDS = {"mlp": 101, "resnet50": 102, "mobilenetv2": 103, "bert_base": 104}
# The batch of the committed references (and compare.py's default): more
# than one row, so that the batch dimension is exercised.
REFERENCE_BATCH = 2

# The bounds on nmse and max_rel, the same for every model. Measured,
# numaserve against ONNX Runtime 1.30.0 at batch 2 (2-vCPU AMD Zen 5 guest
# with AVX-512, 2026-11-25), over its three GEMM backends and with
# numaserve capped to AVX2 (NUMASERVE_MAX_ISA=avx2):
#                nmse                max_rel
#   mlp          1.7e-13 - 4.1e-13   3.7e-7 - 5.6e-7
#   resnet50     2.0e-13 - 4.7e-13   3.9e-7 - 1.0e-6  (the top with oneDNN
#                                    Winograd, AVX-512 only: max abs 2.8e-3
#                                    at |logit| up to 2812)
#   mobilenetv2  1.4e-12 - 1.7e-12   1.2e-6 - 1.7e-6
#   bert_base    4.6e-13 - 1.0e-12   8.1e-7 - 1.5e-6
# i.e. FP32 rounding in another order. The bounds leave 600x (nmse) and
# 17x (max_rel) over the worst of those for other CPUs' kernels, and stay
# far below real faults: ResNet-50's two rows, whose logits are dominated
# by the random weights, differ from each other by nmse 2.3e-4 and max_rel
# 1.4e-2, so even a swapped batch fails; one element of bert_base's output
# off by 0.01 passes nmse (5e-10) but fails max_rel (2.1e-3).
MAX_NMSE = 1e-9
MAX_REL = 3e-5


def model_input(model, batch=REFERENCE_BATCH):
    """The fixed input of MODEL at BATCH: standard normal float32 from its seed."""
    _, shape, _ = MODELS[model]
    rng = np.random.default_rng(INPUT_SEEDS[model])
    return rng.standard_normal((batch, *shape), dtype=np.float32)


def sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of_array(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def errors(got, want):
    """{"max_abs", "max_ref", "max_rel", "nmse"} of GOT against the reference WANT."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise ValueError("shape %s, reference %s" % (list(got.shape), list(want.shape)))
    diff = got - want
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    max_ref = float(np.abs(want).max()) if want.size else 0.0
    energy = float(np.mean(want * want)) if want.size else 0.0
    return {
        "max_abs": max_abs,
        "max_ref": max_ref,
        "max_rel": max_abs / max_ref if max_ref > 0 else max_abs,
        "nmse": float(np.mean(diff * diff)) / energy if energy > 0 else float(np.mean(diff * diff)),
    }


def problems(e):
    """What in the errors E breaks the tolerance ([] when nothing does).

    NaN errors break it too (comparisons with NaN are false).
    """
    found = []
    if not e["nmse"] <= MAX_NMSE:
        found.append("normalized error %.2e > %.0e" % (e["nmse"], MAX_NMSE))
    if not e["max_rel"] <= MAX_REL:
        found.append("max abs error %.3g is %.2e of max |reference| %.4g > %.0e"
                     % (e["max_abs"], e["max_rel"], e["max_ref"], MAX_REL))
    return found


def numaserve_outputs(binary, model_paths, inputs, server_args=("--max-workers", "1")):
    """{model: output} from the real numaserve binary.

    MODEL_PATHS: {model: .onnx path}; INPUTS: {model: input array}. Starts
    one `numaserve serve` on a temporary repository whose versions link to
    the model files, sends each model its input, stops the server.
    """
    sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
    import numaserve_client as nc  # noqa: E402  (generates its gRPC stubs on import)

    repo = tempfile.mkdtemp(prefix="numaserve_benchmark_models_")
    try:
        for model, path in model_paths.items():
            os.makedirs(os.path.join(repo, model, "1"))
            os.symlink(os.path.abspath(path), os.path.join(repo, model, "1", "model.onnx"))
        with nc.ServerProcess(repo, list(server_args), binary=binary) as server:
            stub = server.stub()
            outputs = {}
            for model in model_paths:
                input_name, _, output_name = MODELS[model]
                result = nc.infer(stub, model, {input_name: inputs[model]}, deadline=300.0)
                outputs[model] = result[output_name]
            return outputs
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def peer_python(build_dir):
    """The python of the peers' virtual environment, BUILD_DIR/venv/peers
    (ONNX Runtime and its closure from PyPI, pinned with hashes in
    requirements/peers.txt), made by tools/python/venv.sh if missing or
    stale; $NUMASERVE_ORT_PYTHON instead when set. None, said on stderr,
    when it cannot be made (no network, no python3-venv)."""
    override = os.environ.get("NUMASERVE_ORT_PYTHON")
    if override:
        return override
    result = subprocess.run(["bash", VENV_SCRIPT, build_dir, "peers"], capture_output=True,
                            text=True)
    if result.returncode != 0:
        print(f"ONNX Runtime unavailable: tools/python/venv.sh {build_dir} peers failed:\n"
              f"{result.stderr.strip()}", file=sys.stderr)
        return None
    return result.stdout.strip().splitlines()[-1]


def identity_model(out_dir):
    """OUT_DIR/identity.onnx (written if missing): [batch, 16] float32 through
    one Identity, the model on which each engine's cost per call, with no
    work in it, is measured."""
    path = os.path.join(out_dir, "identity.onnx")
    if not os.path.exists(path):
        import onnx
        from onnx import TensorProto, helper
        x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])
        y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 16])
        graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])],
                                  "identity", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        os.makedirs(out_dir, exist_ok=True)
        onnx.save(model, path)
    return path


def build_dir_of(binary):
    """BUILD from BUILD/bin/numaserve."""
    return os.path.dirname(os.path.dirname(os.path.abspath(binary)))


def ort_version(python):
    return subprocess.run([python, ORT_PEER, "version"], check=True, capture_output=True,
                          text=True).stdout.strip()


def ort_bench_command(python, model_path, batches, threads, seconds, spin=1):
    """The command that measures MODEL_PATH on ONNX Runtime as `numaserve
    bench --json` does, inputs and outputs bound once (ort_peer.py bench)."""
    return [python, ORT_PEER, "bench", "--model", model_path, "--batch", str(batches),
            "--threads", str(threads), "--seconds", str(seconds), "--spin", str(spin), "--json"]


def ort_output(python, model_path, array, threads=0):
    """MODEL_PATH's first output for ARRAY on ONNX Runtime (ort_peer.py run)."""
    with tempfile.TemporaryDirectory(prefix="numaserve_ort_") as tmp:
        inp, out = os.path.join(tmp, "input.npy"), os.path.join(tmp, "output.npy")
        np.save(inp, np.ascontiguousarray(array, np.float32))
        subprocess.run([python, ORT_PEER, "run", "--model", model_path, "--input", inp,
                        "--output", out, "--threads", str(threads)], check=True)
        return np.load(out)
