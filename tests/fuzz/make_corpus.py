#!/usr/bin/python3
"""Writes the seed corpus of every fuzz target into tests/fuzz/corpus/.

    /usr/bin/python3 tests/fuzz/make_corpus.py [--out DIR]

The seeds are small valid inputs (plus a few edge cases) of each format, the
starting points libFuzzer mutates; they are checked in, so this only needs to
run again when a format changes. Debian's python3-onnx and python3-numpy
write the models and arrays; ModelInferRequest messages come from the
protos in proto/ through the test client's generated modules, and the
worker control messages from proto/worker.proto, compiled the same way.
"""

import argparse
import gzip
import hashlib
import io
import os
import shutil
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))


def write(out, target, name, data):
    directory = os.path.join(out, target)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


# --- onnx_import -------------------------------------------------------------

def model(nodes, inputs, outputs, initializers=(), opset=13):
    graph = helper.make_graph(nodes, "seed", inputs, outputs, list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="numaserve-fuzz-seed")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def tensor(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def onnx_seeds():
    f32 = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    yield "mlp.onnx", model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
         helper.make_node("Add", ["h", "b"], ["a"], name="bias"),
         helper.make_node("Relu", ["a"], ["r"], name="relu"),
         helper.make_node("Softmax", ["r"], ["y"], axis=-1, name="softmax")],
        [tensor("x", f32, ["batch", 4])], [tensor("y", f32, ["batch", 3])],
        [const("w", w), const("b", np.zeros(3, np.float32))])
    yield "gemm.onnx", model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5, name="gemm")],
        [tensor("x", f32, ["batch", 4])], [tensor("y", f32, ["batch", 2])],
        [const("w", rng.standard_normal((2, 4)).astype(np.float32)),
         const("b", np.ones(2, np.float32))])
    yield "conv.onnx", model(
        [helper.make_node("Conv", ["x", "k", "kb"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["n"], name="bn"),
         helper.make_node("Relu", ["n"], ["r"], name="relu"),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                          name="pool"),
         helper.make_node("Flatten", ["p"], ["y"], name="flatten")],
        [tensor("x", f32, ["batch", 1, 4, 4])], [tensor("y", f32, ["batch", 8])],
        [const("k", rng.standard_normal((2, 1, 3, 3)).astype(np.float32)),
         const("kb", np.zeros(2, np.float32)), const("s", np.ones(2, np.float32)),
         const("o", np.zeros(2, np.float32)), const("m", np.zeros(2, np.float32)),
         const("v", np.ones(2, np.float32))])
    yield "reshape.onnx", model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [tensor("x", f32, ["batch", 4])], [tensor("y", f32, [1, None])],
        [const("shape", np.array([1, -1], np.int64))])
    yield "matmul_transpose.onnx", model(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0], name="t"),
         helper.make_node("MatMul", ["x", "t"], ["y"], name="mm")],
        [tensor("x", f32, ["batch", 3])], [tensor("y", f32, ["batch", "batch"])])
    yield "shape_ops.onnx", model(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"], name="slice"),
         helper.make_node("Pad", ["s", "pads"], ["p"], mode="constant", name="pad"),
         helper.make_node("Concat", ["p", "p"], ["c"], axis=1, name="concat"),
         helper.make_node("Unsqueeze", ["c", "ax"], ["u"], name="unsqueeze"),
         helper.make_node("Expand", ["u", "e"], ["y"], name="expand")],
        [tensor("x", f32, ["batch", 6])], [tensor("y", f32, ["batch", 2, 10])],
        [const("starts", np.array([1], np.int64)), const("ends", np.array([5], np.int64)),
         const("axes", np.array([1], np.int64)),
         const("pads", np.array([0, 1, 0, 0], np.int64)), const("ax", np.array([1], np.int64)),
         const("e", np.array([1, 2, 1], np.int64))])
    yield "reduce_norm.onnx", model(
        [helper.make_node("LayerNormalization", ["x", "g", "bb"], ["n"], axis=-1, name="ln"),
         helper.make_node("ReduceMean", ["n"], ["m"], axes=[1], keepdims=1, name="mean"),
         helper.make_node("Sub", ["n", "m"], ["d"], name="sub"),
         helper.make_node("Mul", ["d", "d"], ["y"], name="sq")],
        [tensor("x", f32, ["batch", 4])], [tensor("y", f32, ["batch", 4])],
        [const("g", np.ones(4, np.float32)), const("bb", np.zeros(4, np.float32))], opset=17)
    yield "typed.onnx", model(
        [helper.make_node("Cast", ["i"], ["f"], to=f32, name="cast"),
         helper.make_node("Gather", ["table", "i"], ["g"], axis=0, name="gather"),
         helper.make_node("ReduceSum", ["g", "ax"], ["s"], keepdims=0, name="sum"),
         helper.make_node("Greater", ["f", "zero"], ["y"], name="gt")],
        [tensor("i", TensorProto.INT64, ["batch", 2])],
        [tensor("y", TensorProto.BOOL, ["batch", 2]), tensor("s", f32, ["batch", 3])],
        [const("table", rng.standard_normal((5, 3)).astype(np.float32)),
         const("ax", np.array([1], np.int64)), const("zero", np.zeros(1, np.float32))])
    yield "constant_of_shape.onnx", model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("ConstantOfShape", ["s"], ["c"],
                          value=numpy_helper.from_array(np.array([2.0], np.float32)),
                          name="cos"),
         helper.make_node("Mul", ["x", "c"], ["y"], name="mul")],
        [tensor("x", f32, ["batch", 3])], [tensor("y", f32, ["batch", 3])])
    yield "resize.onnx", model(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", name="resize")],
        [tensor("x", f32, ["batch", 1, 2, 2])], [tensor("y", f32, ["batch", 1, 4, 4])],
        [const("scales", np.array([1, 1, 2, 2], np.float32))])
    yield "static.onnx", model(
        [helper.make_node("Sigmoid", ["x"], ["y"], name="sigmoid")],
        [tensor("x", f32, [2, 3])], [tensor("y", f32, [2, 3])])
    # Hostile: constants that fold to 40 x 4 MiB from a few hundred bytes
    # (an Expand of one value, a Concat of 40 of those): the importer
    # refuses the Concat at its constant folding budget (64 MiB).
    yield "fold_budget.onnx", model(
        [helper.make_node("Expand", ["one", "n"], ["e"], name="expand"),
         helper.make_node("Concat", ["e"] * 40, ["c"], axis=0, name="cat"),
         helper.make_node("ReduceSum", ["c"], ["s"], name="sum"),
         helper.make_node("Add", ["x", "s"], ["y"], name="add")],
        [tensor("x", f32, [1])], [tensor("y", f32, [1])],
        [const("one", np.array([1.0], np.float32)), const("n", np.array([1 << 20], np.int64))])


# --- infer_request -------------------------------------------------------------

def infer_request_seeds():
    sys.path.insert(0, os.path.join(SOURCE, "tests", "clients"))
    import numaserve_client  # noqa: E402  (generates the protos' modules)
    pb = numaserve_client.pb

    def request(model_name, inputs, raw=None, outputs=()):
        r = pb.ModelInferRequest(model_name=model_name, id="seed")
        for name, datatype, shape, fill in inputs:
            t = r.inputs.add(name=name, datatype=datatype, shape=shape)
            if fill:
                fill(t.contents)
        for b in raw or []:
            r.raw_input_contents.append(b)
        for o in outputs:
            r.outputs.add(name=o)
        return r.SerializeToString()

    yield "fp32_raw.pb", request("fp32", [("x", "FP32", [2, 4], None)],
                                 raw=[np.arange(8, dtype=np.float32).tobytes()])
    yield "fp32_typed.pb", request(
        "fp32", [("x", "FP32", [1, 4], lambda c: c.fp32_contents.extend([1, 2, 3, 4]))],
        outputs=["z"])
    yield "mixed_typed.pb", request(
        "mixed", [("a", "INT8", [2, 3], lambda c: c.int_contents.extend([1, -2, 3, 127, -128, 0])),
                  ("b", "BOOL", [2, 2], lambda c: c.bool_contents.extend([True, False] * 2))])
    yield "mixed_raw.pb", request(
        "mixed", [("a", "INT8", [1, 3], None), ("b", "BOOL", [1, 2], None)],
        raw=[b"\x01\x02\x03", b"\x00\x01"], outputs=["o"])
    yield "static.pb", request(
        "static", [("s", "FP16", [2, 2], None), ("t", "UINT8", [3], None)],
        raw=[np.ones((2, 2), np.float16).tobytes(), b"\x07\x08\x09"])
    yield "static_typed_bad.pb", request(
        "static", [("s", "FP16", [2, 2], lambda c: c.fp32_contents.extend([1, 2, 3, 4])),
                   ("t", "UINT8", [3], lambda c: c.uint_contents.extend([1, 2, 300]))])
    yield "reshape.pb", request("reshape", [("x", "FP32", [3, 2], None)],
                                raw=[np.zeros((3, 2), np.float32).tobytes()])
    yield "typed_all.pb", request("typed", [
        ("i16", "INT16", [2], lambda c: c.int_contents.extend([-300, 300])),
        ("u16", "UINT16", [2], lambda c: c.uint_contents.extend([0, 65535])),
        ("i32", "INT32", [2], lambda c: c.int_contents.extend([-1, 1])),
        ("u32", "UINT32", [2], lambda c: c.uint_contents.extend([0, 4000000000])),
        ("i64", "INT64", [2], lambda c: c.int64_contents.extend([-(2 ** 40), 2 ** 40])),
        ("u64", "UINT64", [2], lambda c: c.uint64_contents.extend([0, 2 ** 63])),
        ("f64", "FP64", [2], lambda c: c.fp64_contents.extend([0.5, -0.5])),
        ("bf16", "BF16", [2], None)])
    yield "typed_raw.pb", request("typed", [
        (n, t, [1], None) for n, t in [("i16", "INT16"), ("u16", "UINT16"), ("i32", "INT32"),
                                       ("u32", "UINT32"), ("i64", "INT64"), ("u64", "UINT64"),
                                       ("f64", "FP64"), ("bf16", "BF16")]],
        raw=[b"\x01\x00", b"\x02\x00", b"\x03\x00\x00\x00", b"\x04\x00\x00\x00", b"\x05" + b"\0" * 7,
             b"\x06" + b"\0" * 7, struct.pack("<d", 1.5), b"\x80\x3f"])


# --- model_config --------------------------------------------------------------

def model_config_seeds():
    yield "full.pbtxt", """# every block
name: "m"
max_batch_size: 8
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 500
  max_queue_size: 64
  default_timeout_microseconds: 2000000
}
instance_placement { domains: [ 0, 1 ] instances_per_domain: 2 }
version_policy { latest { num_versions: 2 } }
gemm_backend: "onednn"
max_activation_bytes: 1048576
input { name: "input" data_type: "FP32" dims: [ 4 ] }
input { name: "mask" data_type: "BOOL" dims: [ 4 ] }
output { name: "output" data_type: "FP32" dims: [ 2 ] }
"""
    yield "instances_auto.pbtxt", ("instance_placement {\n  all: true\n"
                                   "  instances_per_domain: auto  # measured at load\n}\n")
    yield "instances_per_core.pbtxt", ("name: 'm' instance_placement "
                                       "{ instances_per_domain : per_core }\n")
    yield "instances_negative.pbtxt", "instance_placement { instances_per_domain: -3 }\n"
    yield "versions_specific.pbtxt", "version_policy { specific { versions: [ 1, 7, 7 ] } }\n"
    yield "versions_all.pbtxt", "version_policy { all {} }\nmax_batch_size: 0\n"
    yield "strings.pbtxt", ('name: "instances_per_domain: auto \\" # not a comment"\n'
                            "gemm_backend: 'au\\x74o'\n")
    yield "static.pbtxt", ("input { name: \"input\" data_type: \"FP32\" dims: [ 1, 4 ] }\n"
                           "output { name: \"output\" dims: [ 1, 2 ] }\n")
    yield "empty.pbtxt", ""


# --- npy -----------------------------------------------------------------------

def npy_bytes(array, version=None):
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def npy_seeds():
    yield "f32_2x3.npy", npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3))
    yield "i8_v2.npy", npy_bytes(np.array([-1, 0, 1], np.int8), version=(2, 0))
    yield "bool.npy", npy_bytes(np.array([[True, False]]))
    yield "f16_scalar.npy", npy_bytes(np.array(1.5, np.float16))
    yield "u64_empty.npy", npy_bytes(np.zeros((0, 3), np.uint64))
    yield "f64_v3.npy", npy_bytes(np.array([0.25], np.float64), version=(3, 0))
    yield "fortran.npy", npy_bytes(np.asfortranarray(np.ones((2, 2), np.float32)))
    yield "big_endian.npy", npy_bytes(np.ones(2, dtype=">i4"))


# --- checkpoint -----------------------------------------------------------------

def checkpoint_bytes(step, tensors):
    out = b"NSCKPT01" + struct.pack("<QQ", step, len(tensors))
    for name, values in tensors:
        name = name.encode()
        out += struct.pack("<I", len(name)) + name + struct.pack("<Q", len(values))
        out += np.asarray(values, np.float32).tobytes()
    return out


def checkpoint_seeds():
    yield "two_tensors.ckpt", checkpoint_bytes(12, [("fc1.weight", [0.5, -1, 2, 3]),
                                                    ("fc1.bias", [0.0])])
    yield "empty.ckpt", checkpoint_bytes(0, [])
    yield "zero_elements.ckpt", checkpoint_bytes(3, [("w", []), ("", [1.0])])
    yield "truncated.ckpt", checkpoint_bytes(1, [("w", [1, 2, 3])])[:-5]


# --- record_file ----------------------------------------------------------------

def record_pair(dims, examples, labels):
    data = b"NSREC001" + struct.pack("<I", len(dims))
    data += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<Q", len(examples))
    index = b"NSIDX001" + struct.pack("<Q", len(examples))
    for example, label in zip(examples, labels):
        index += struct.pack("<Q", len(data))
        data += bytes([label]) + bytes(example)
    return data, index


def record_input(limit, data, index):
    # The target's layout: u8 limit, u32 len(FILE), FILE, FILE.idx.
    return bytes([limit]) + struct.pack("<I", len(data)) + data + index


def record_file_seeds():
    images = [[i * 16 + j for j in range(4)] for i in range(3)]
    yield "three_2x2.rec", record_input(0, *record_pair([2, 2], images, [0, 1, 9]))
    yield "three_2x2_limit2.rec", record_input(2, *record_pair([2, 2], images, [3, 4, 5]))
    yield "rank0.rec", record_input(0, *record_pair([], [[7], [8]], [1, 2]))
    yield "empty.rec", record_input(0, *record_pair([28, 28], [], []))
    data, index = record_pair([3], [[1, 2, 3], [4, 5, 6]], [0, 1])
    yield "bad_index.rec", record_input(0, data, index[:-8] + struct.pack("<Q", 99))


# --- idx_file -------------------------------------------------------------------

def idx_bytes(array):
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.tobytes()


def idx_file_seeds():
    images = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    yield "images_3x2x2.idx", idx_bytes(images)
    yield "labels_3.idx", idx_bytes([1, 2, 3])
    yield "images_3x2x2.idx.gz", gzip.compress(idx_bytes(images), mtime=0)
    yield "zero_dim.idx", idx_bytes(np.zeros((2, 0), np.uint8))
    yield "trailing.idx", idx_bytes([5]) + b"\x00"


# --- training_config ---------------------------------------------------------------

# The callers' directories of the target's training root
# (training_config_fuzz.cc): this caller's and the other one's.
OTHER_CALLER = hashlib.sha256(b"token:other").hexdigest()


def training_config_seeds():
    full = ('model: "model.onnx"\n'
            'dataset { train_images: "data/train.idx" train_labels: "data/train.idx"\n'
            '          test_images: "data/train.idx" test_labels: "data/train.idx" }\n'
            "epochs: 2\nglobal_batch_size: 32\nlearning_rate: 0.05\n"
            "sgd { momentum: 0.9 }\n"
            'checkpoint: "ckpt"\ncheckpoint_every_steps: 10\n'
            'final_weights: "runs/weights"\ntimeline: "timeline.json"\n'
            'export_repository: "repo"\nexport_model_name: "mine"\n')
    yield "full.pbtxt", full
    yield "records.pbtxt", ('model: "model.onnx"\n'
                            'dataset { train_records: "data/train.idx" }\n'
                            "max_steps: 8\nglobal_batch_size: 4\nlearning_rate: 1\n"
                            'precision: "bf16"\nexport_repository: "repo"\n'
                            'export_model_name: "new_model"\n')
    yield "escapes.pbtxt", ('model: "../outside/secret"\n'
                            'checkpoint: "/etc/passwd"\ntimeline: "link"\n'
                            'final_weights: "data/../../x"\n')
    yield "links.pbtxt", ('model: "link_secret"\ndataset { train_images: "link_out/secret" }\n'
                          'export_repository: "repo"\nexport_model_name: "link_model"\n')
    yield "other_caller.pbtxt", ('model: "callers/%s/ckpt"\ncheckpoint: "ckpt"\n'
                                 'export_repository: "callers/%s/repo"\n'
                                 'export_model_name: "m"\n' % (OTHER_CALLER, OTHER_CALLER))
    yield "not_owned.pbtxt", ('model: "model.onnx"\nexport_repository: "repo"\n'
                              'export_model_name: "served"\n')
    yield "theirs.pbtxt", ('model: "model.onnx"\nexport_repository: "repo"\n'
                           'export_model_name: "theirs"\n')
    yield "bytes.pbtxt", ('model: "\\377model.onnx"\ncheckpoint: "a\\000b"\n'
                          'export_model_name: "\\303\\251"\n')
    yield "raw_input", "data/train.idx\n"
    yield "raw_other", "callers/%s/ckpt\n" % OTHER_CALLER
    yield "raw_export", "repo\nmine\n"
    yield "raw_root", "/\n.\n"


# --- worker_framing ---------------------------------------------------------------

def worker_pb2():
    """proto/worker.proto compiled with grpc_tools.protoc into a temporary
    directory, imported."""
    import atexit
    import importlib
    import tempfile
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="numaserve_worker_pb_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    proto_dir = os.path.join(SOURCE, "proto")
    if protoc.main(["grpc_tools.protoc", "-I" + proto_dir, "--python_out=" + out,
                    "worker.proto"]) != 0:
        raise RuntimeError("grpc_tools.protoc failed on worker.proto")
    sys.path.insert(0, out)
    return importlib.import_module("worker_pb2")


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def framed(*messages):
    """Each message as framing.cc writes it: its length as a varint, then
    its bytes."""
    out = b""
    for m in messages:
        data = m.SerializeToString()
        out += varint(len(data)) + data
    return out


def worker_framing_seeds():
    w = worker_pb2()
    load = w.Command(id=1, load=w.LoadModel(
        key="mlp:1", path="/models/mlp/1/model.onnx", gemm_backend="onednn", instances=-1,
        precision="fp32", max_activation_bytes=1 << 20))
    run = w.Command(id=2, run=w.RunBatch(
        key="mlp:1", batch=8, profile=True,
        inputs=[w.TensorSlice(offset=0, bytes=512)],
        outputs=[w.TensorSlice(offset=512, bytes=64), w.TensorSlice(offset=576, bytes=32)]))
    unload = w.Command(id=3, unload=w.UnloadModel(key="mlp:1"))
    hello = w.Reply(ok=True, hello=w.Hello(
        worker_index=1, pid=4242, binding="cpus 0-7, memory bind node 0",
        environment="OMP_NUM_THREADS=8", isa="avx2 fma", bind_warning=""))
    loaded = w.Reply(id=1, ok=True, load_ns=123456789, weight_bytes=1 << 20, instances=2,
                     instances_report="1x2 threads 41.0 rows/s, 2x1 thread 70.2 rows/s -> 2",
                     memory_nodes="0=1234 1=5")
    ran = w.Reply(id=2, ok=True, compute_ns=98765, instance=1,
                  profile_json='{"batch": 8, "compute_ms": 0.1, "runs": 1}')
    failed = w.Reply(id=2, ok=False, code=8,
                     error="model 'mlp' version 1: a batch of 9 rows needs 4096 activation bytes")
    yield "commands.bin", framed(load, run, unload)
    yield "replies.bin", framed(hello, loaded, ran, failed)
    yield "empty_frame.bin", framed(w.Command()) * 3
    # A length claiming 60 MiB (under the 64 MiB limit) followed by 3 bytes,
    # one claiming 2 GiB, and a length varint of 6 bytes.
    yield "claims_60_mib.bin", varint(60 << 20) + b"abc"
    yield "claims_2_gib.bin", varint(2 << 30) + framed(run)
    yield "overlong_length.bin", b"\x80" * 6 + b"\x01"
    # A frame cut short, and one whose bytes are not a message.
    yield "truncated.bin", framed(load)[:-5]
    yield "malformed.bin", varint(4) + b"\x0a\xff\xff\xff"


# --- infer_json -------------------------------------------------------------------
# A REST inference body: the JSON, then (after a NUL, where the fuzz target
# splits it) the binary part Inference-Header-Content-Length would mark.

def infer_json_seeds():
    def body(obj, binary=None):
        import json
        text = json.dumps(obj, separators=(",", ":"))
        return text if binary is None else text.encode() + b"\0" + binary

    yield "fp32.json", body({"id": "a", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4.5, -5, 6e-3]}]})
    yield "nested.json", body({"inputs": [
        {"name": "x", "datatype": "INT64", "shape": [2, 2], "data": [[1, -2], [3, 4]]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}]})
    yield "types.json", body({"parameters": {"binary_data_output": False}, "inputs": [
        {"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]},
        {"name": "u8", "datatype": "UINT8", "shape": [1], "data": [255]},
        {"name": "i16", "datatype": "INT16", "shape": [1], "data": [-32768]},
        {"name": "f16", "datatype": "FP16", "shape": [2], "data": [0.5, "NaN"]},
        {"name": "bf", "datatype": "BF16", "shape": [1], "data": ["-Infinity"]},
        {"name": "f64", "datatype": "FP64", "shape": [1], "data": [1e300]},
        {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["ab", ""]}]})
    yield "binary.bin", body({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
        {"name": "y", "datatype": "UINT16", "shape": [1], "data": [7]}]},
        np.array([1.0, 2.0], np.float32).tobytes())
    yield "bytes_binary.bin", body({"inputs": [
        {"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}]},
        struct.pack("<I", 3) + b"abc")
    yield "huge_shape.json", body({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1 << 40, 1 << 40], "data": [1]}]})
    yield "short_data.json", body({"inputs": [
        {"name": "x", "datatype": "INT32", "shape": [3], "data": [1, 2]}]})
    yield "truncated.json", body({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})[:-7]


TARGETS = {
    "onnx_import": onnx_seeds,
    "infer_request": infer_request_seeds,
    "model_config": model_config_seeds,
    "npy": npy_seeds,
    "checkpoint": checkpoint_seeds,
    "record_file": record_file_seeds,
    "idx_file": idx_file_seeds,
    "training_config": training_config_seeds,
    "worker_framing": worker_framing_seeds,
    "infer_json": infer_json_seeds,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "corpus"))
    parser.add_argument("targets", nargs="*", default=sorted(TARGETS))
    args = parser.parse_args()
    for target in args.targets:
        directory = os.path.join(args.out, target)
        shutil.rmtree(directory, ignore_errors=True)
        count = 0
        for name, data in TARGETS[target]():
            write(args.out, target, name, data)
            count += 1
        print("%s: %d seeds in %s" % (target, count, directory))


if __name__ == "__main__":
    main()
