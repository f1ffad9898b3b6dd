"""Files and data the numaserve tests make without a server.

Runs on Debian's interpreter (/usr/bin/python3) with python3-onnx and
numpy; nothing here imports grpc or talks to a server, which is
numaserve_client.py's part (it re-exports every public name here, so
tests reach both as ``nc.NAME``).

What is here:
  * write_default_model / deep_mlp_model / write_model: ONNX models in a
    model repository's layout (NAME/VERSION/model.onnx).
  * random_images: Fashion-MNIST-shaped FP32 inputs.
  * write_idx / synthetic_idx_dataset / read_checkpoint: training data in
    the IDX format and the checkpoint format of training/checkpoint.h.
  * make_test_pki: a throw-away CA, server and client certificates made
    with the openssl CLI (numaserve_client.tls_credentials turns them into
    gRPC channel credentials).
  * ReferenceModel: a small NumPy evaluator of ONNX graphs (Flatten, Gemm,
    MatMul, Add, Relu, Softmax, Reshape, Identity, Constant), the reference
    server outputs are compared to.

Environment:
  NUMASERVE_SOURCE_DIR  the source tree (default: two levels above this file)
"""

import gzip
import os
import struct
import subprocess
import sys

import numpy as np

CLIENTS_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.abspath(
    os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.join(CLIENTS_DIR, "..", ".."))
DEFAULT_MODEL_SCRIPT = os.path.join(SOURCE_DIR, "models", "generate_default_model.py")
DEFAULT_MODEL_NAME = "fashion_classifier"

__all__ = [
    "SOURCE_DIR", "DEFAULT_MODEL_NAME", "write_default_model", "deep_mlp_model", "write_model",
    "random_images", "write_idx", "synthetic_idx_dataset", "read_checkpoint", "make_test_pki",
    "ReferenceModel",
]


# --- Models ------------------------------------------------------------------

def write_default_model(repository):
    """Writes the default model into REPOSITORY; returns the model.onnx path."""
    result = subprocess.run([sys.executable, DEFAULT_MODEL_SCRIPT, "--out", repository],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (DEFAULT_MODEL_SCRIPT, result.returncode,
                                                   result.stderr))
    path = os.path.join(repository, DEFAULT_MODEL_NAME, "1", "model.onnx")
    if not os.path.isfile(path):
        raise RuntimeError("%s did not write %s" % (DEFAULT_MODEL_SCRIPT, path))
    return path


def deep_mlp_model(width=1024, layers=64, seed=5):
    """An ONNX model whose cost is set by WIDTH and LAYERS, not its size.

    x FP32 [batch, WIDTH] -> LAYERS x (MatMul W -> Add b -> Relu) -> Identity
    -> y [batch, WIDTH], every layer sharing one W (sqrt(2) times a random
    orthogonal matrix, so activations keep their scale) and one b. A batch
    of B rows costs about 2 * B * WIDTH^2 * LAYERS FLOPs: a slow request
    for shutdown and overload tests, with WIDTH^2 weights only.
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((width, width)))
    weight = (q * np.sqrt(2.0)).astype(np.float32)
    bias = (rng.random(width) * 0.1).astype(np.float32)
    nodes, current = [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [current, "w"], ["mm%d" % i]),
                  helper.make_node("Add", ["mm%d" % i, "b"], ["add%d" % i]),
                  helper.make_node("Relu", ["add%d" % i], ["h%d" % i])]
        current = "h%d" % i
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes, "deep_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def write_model(repository, name, model, version=1):
    """Saves the ONNX MODEL as REPOSITORY/NAME/VERSION/model.onnx; returns the path."""
    import onnx

    path = os.path.join(repository, name, str(version), "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)
    return path


def random_images(batch, seed=0):
    """BATCH Fashion-MNIST-shaped FP32 images in [0, 1)."""
    rng = np.random.default_rng(seed)
    return rng.random((batch, 1, 28, 28), dtype=np.float32)


# --- Training data and checkpoints -----------------------------------------

def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + b"".join(
        struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def synthetic_idx_dataset(directory, prefix, count, seed):
    """Gzipped IDX files (images, labels) of COUNT Fashion-MNIST-shaped
    images whose class shows as a bright 7x7 block in one of 10 places."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count)
    images = rng.integers(0, 60, size=(count, 28, 28))
    for i, label in enumerate(labels):
        r, c = 3 + 7 * (label // 4), 3 + 7 * (label % 4)
        images[i, r:r + 7, c:c + 7] += 150
    paths = (os.path.join(directory, prefix + "-images-idx3-ubyte.gz"),
             os.path.join(directory, prefix + "-labels-idx1-ubyte.gz"))
    write_idx(paths[0], images)
    write_idx(paths[1], labels)
    return paths


def read_checkpoint(path):
    """The checkpoint format of training/checkpoint.h -> (step, {name: array})."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"NSCKPT01", path
    step, count = struct.unpack_from("<QQ", data, 8)
    off, tensors = 24, {}
    for _ in range(count):
        (name_len,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + name_len].decode()
        off += name_len
        (n,) = struct.unpack_from("<Q", data, off)
        off += 8
        tensors[name] = np.frombuffer(data, dtype="<f4", count=n, offset=off).copy()
        off += 4 * n
    return step, tensors


# --- TLS ---------------------------------------------------------------------

def _openssl(*args, cwd):
    result = subprocess.run(["openssl"] + list(args), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError("openssl %s failed:\n%s" % (" ".join(args), result.stdout))


def make_test_pki(directory, clients=("alice", "bob"), server_names=("localhost",),
                  server_ips=("127.0.0.1",)):
    """A throw-away PKI in DIRECTORY, made with the openssl CLI: a CA, a server
    certificate for SERVER_NAMES / SERVER_IPS, and one client certificate per
    name in CLIENTS (subject CN=<name>), all signed by the CA; plus a second,
    unrelated CA ("other") with a client certificate "mallory" it signed.

    Returns {"ca", "server_cert", "server_key", "other_ca",
    "client": {name: (cert, key)}} of file paths (PEM, keys unencrypted).
    """
    os.makedirs(directory, exist_ok=True)
    days = "2"

    def make_ca(name):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
                 "-out", name + ".pem", "-days", days, "-subj", "/CN=numaserve test " + name,
                 cwd=directory)
        return os.path.join(directory, name + ".pem")

    def sign(ca, name, subject, extensions):
        ext = os.path.join(directory, name + ".ext")
        with open(ext, "w") as f:
            f.write(extensions)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
                 "-out", name + ".csr", "-subj", subject, cwd=directory)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                 "-CAcreateserial", "-out", name + ".pem", "-days", days, "-extfile", ext,
                 cwd=directory)
        return os.path.join(directory, name + ".pem"), os.path.join(directory, name + ".key")

    pki = {"ca": make_ca("ca"), "other_ca": make_ca("other"), "client": {}}
    alt = ",".join(["DNS:" + n for n in server_names] + ["IP:" + i for i in server_ips])
    pki["server_cert"], pki["server_key"] = sign(
        "ca", "server", "/CN=" + server_names[0],
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=" + alt + "\n")
    client_ext = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                  "extendedKeyUsage=clientAuth\n")
    for name in clients:
        pki["client"][name] = sign("ca", "client-" + name, "/CN=" + name, client_ext)
    pki["client"]["mallory"] = sign("other", "client-mallory", "/CN=mallory", client_ext)
    return pki


# --- Reference evaluator -----------------------------------------------------

class ReferenceModel:
    """Evaluates an ONNX graph with NumPy (in float64), for comparison.

    Supports Flatten, Gemm, MatMul, Add, Relu, Softmax, Reshape, Identity and
    Constant: the ops of the default model and the test models.
    """

    def __init__(self, model):
        import onnx
        from onnx import numpy_helper

        if isinstance(model, (str, bytes, os.PathLike)):
            model = onnx.load(model)
        self.model = model
        self.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                         default=13)
        self.initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input
                            if i.name not in self.initializers]
        self.output_names = [o.name for o in model.graph.output]
        self._numpy_helper = numpy_helper

    def run(self, feeds):
        """{input name: array} -> {output name: float64 array}."""
        values = {k: np.asarray(v) for k, v in self.initializers.items()}
        for name in self.input_names:
            if name not in feeds:
                raise KeyError("missing input %r" % name)
            values[name] = np.asarray(feeds[name])
        for node in self.model.graph.node:
            attrs = self._attributes(node)
            args = [values[n] if n else None for n in node.input]
            op = getattr(self, "_op_" + node.op_type, None)
            if op is None:
                raise NotImplementedError("ReferenceModel: op %s (node %r)"
                                          % (node.op_type, node.name))
            results = op(args, attrs)
            if not isinstance(results, tuple):
                results = (results,)
            for name, value in zip(node.output, results):
                values[name] = value
        return {name: values[name] for name in self.output_names}

    def _attributes(self, node):
        from onnx import helper

        attrs = {}
        for a in node.attribute:
            value = helper.get_attribute_value(a)
            if a.type == a.TENSOR:
                value = self._numpy_helper.to_array(value)
            attrs[a.name] = value
        return attrs

    @staticmethod
    def _float(x):
        x = np.asarray(x)
        return x.astype(np.float64) if x.dtype.kind == "f" else x

    def _op_Identity(self, args, attrs):
        return args[0]

    def _op_Constant(self, args, attrs):
        return np.asarray(attrs["value"])

    def _op_Relu(self, args, attrs):
        x = self._float(args[0])
        return np.maximum(x, 0)

    def _op_Add(self, args, attrs):
        return self._float(args[0]) + self._float(args[1])

    def _op_MatMul(self, args, attrs):
        return np.matmul(self._float(args[0]), self._float(args[1]))

    def _op_Gemm(self, args, attrs):
        a, b = self._float(args[0]), self._float(args[1])
        if attrs.get("transA", 0):
            a = a.T
        if attrs.get("transB", 0):
            b = b.T
        y = attrs.get("alpha", 1.0) * (a @ b)
        if len(args) > 2 and args[2] is not None:
            y = y + attrs.get("beta", 1.0) * self._float(args[2])
        return y

    def _op_Flatten(self, args, attrs):
        x = args[0]
        axis = attrs.get("axis", 1)
        if axis < 0:
            axis += x.ndim
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        return x.reshape(outer, -1) if x.size else x.reshape(outer, 0)

    def _op_Reshape(self, args, attrs):
        x, shape = args[0], [int(d) for d in args[1]]
        allowzero = attrs.get("allowzero", 0)
        if not allowzero:
            shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return x.reshape(shape)

    def _op_Softmax(self, args, attrs):
        x = self._float(args[0])
        if self.opset >= 13:
            axis = attrs.get("axis", -1)
            e = np.exp(x - x.max(axis=axis, keepdims=True))
            return e / e.sum(axis=axis, keepdims=True)
        # Before opset 13: softmax over the 2-D coercion [prod(:axis), prod(axis:)].
        axis = attrs.get("axis", 1)
        if axis < 0:
            axis += x.ndim
        flat = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
