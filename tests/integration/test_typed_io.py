#!/usr/bin/python3
"""Tensors of every datatype through the real server and `numaserve infer`.

Two models, generated with onnx into a temporary repository:

* `embed`, a BERT-like front: INT64 `input_ids` [batch, 8] gathers rows of an
  FP32 embedding table, INT64 `attention_mask` [batch, 8] is cast to FP32 and
  multiplied in; outputs FP32 `embeddings` [batch, 8, 4], INT64 `next_ids`
  (input_ids + 1) and BOOL `padding` (attention_mask == 0).
* `echo`: one input per numeric datatype (`x_INT8`, `x_FP16`, ... [batch, 3]),
  each returned unchanged as `y_<TYPE>`, so rows of 1, 2, 4 and 8 bytes go
  through the batcher and the worker side by side; `echo_typed` is the same
  without FP16 and BF16, which have no typed contents field.

Requests use raw_input_contents and the typed contents fields, from
concurrent callers whose rows are batched together; every result is compared
with NumPy exactly. Also: ModelMetadata and ModelConfig datatypes, wrong
datatypes, values in the wrong field or out of range, and the CLI reading
.npy inputs of several dtypes and printing typed outputs.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

EMBED, ECHO, ECHO_TYPED = "embed", "echo", "echo_typed"
VOCAB, SEQ, DIM = 16, 8, 4
CALLERS = 24
# Every numeric KServe datatype; BF16 travels as its uint16 bit patterns.
ECHO_TYPES = ["BOOL", "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64",
              "FP16", "BF16", "FP32", "FP64"]
# Those with a typed contents field (FP16 and BF16 travel raw only).
TYPED_TYPES = [t for t in ECHO_TYPES if t not in ("FP16", "BF16")]
NUMPY = dict(nc.DATATYPES, BF16=np.uint16)
BATCHED_CONFIG = """
max_batch_size: 32
dynamic_batching { max_queue_delay_microseconds: 30000 }
"""


def embed_model(table):
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"], axis=0),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["mask_f", "mask_shape"], ["mask_3d"]),
        helper.make_node("Mul", ["tokens", "mask_3d"], ["embeddings"]),
        helper.make_node("Add", ["input_ids", "one"], ["next_ids"]),
        helper.make_node("Equal", ["attention_mask", "zero"], ["padding"]),
    ]
    graph = helper.make_graph(
        nodes, "embed",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", SEQ]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", SEQ])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", SEQ, DIM]),
         helper.make_tensor_value_info("next_ids", TensorProto.INT64, ["batch", SEQ]),
         helper.make_tensor_value_info("padding", TensorProto.BOOL, ["batch", SEQ])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.array([-1, SEQ, 1], np.int64), "mask_shape"),
                     numpy_helper.from_array(np.array(1, np.int64), "one"),
                     numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def echo_model(types):
    from onnx import TensorProto, helper

    onnx_type = {"BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "INT8": TensorProto.INT8,
                 "UINT16": TensorProto.UINT16, "INT16": TensorProto.INT16,
                 "UINT32": TensorProto.UINT32, "INT32": TensorProto.INT32,
                 "UINT64": TensorProto.UINT64, "INT64": TensorProto.INT64,
                 "FP16": TensorProto.FLOAT16, "BF16": TensorProto.BFLOAT16,
                 "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE}
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x_" + t], ["y_" + t]) for t in types], "echo",
        [helper.make_tensor_value_info("x_" + t, onnx_type[t], ["batch", 3]) for t in types],
        [helper.make_tensor_value_info("y_" + t, onnx_type[t], ["batch", 3]) for t in types])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def embed_inputs(rows, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(rows, SEQ), dtype=np.int64)
    mask = (rng.random((rows, SEQ)) < 0.7).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def echo_inputs(rows, seed, types=ECHO_TYPES):
    """{x_TYPE: array}: values that use each type's range (BF16: bit patterns)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for t in types:
        dtype = NUMPY[t]
        if t == "BOOL":
            a = rng.random((rows, 3)) < 0.5
        elif t in ("FP16", "FP32", "FP64"):
            a = (rng.standard_normal((rows, 3)) * 100).astype(dtype)
        elif t == "BF16":
            a = (rng.standard_normal((rows, 3)).astype(np.float32).view(np.uint32) >> 16)
            a = a.astype(np.uint16)
        else:
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, size=(rows, 3), dtype=dtype, endpoint=True)
        inputs["x_" + t] = a
    return inputs


def make_request(model, inputs, raw, datatypes=None):
    """A ModelInferRequest; DATATYPES overrides the datatype names ({name: 'BF16'})."""
    datatypes = datatypes or {}
    request = nc.pb.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        array = np.ascontiguousarray(array)
        datatype = datatypes.get(name) or nc.datatype_of(array)
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            request.raw_input_contents.append(array.tobytes())
        else:
            nc._fill_contents(tensor.contents, datatype, array)
    return request


def decode(response):
    """{name: (datatype, ndarray)} from raw_output_contents."""
    result = {}
    for i, tensor in enumerate(response.outputs):
        data = np.frombuffer(response.raw_output_contents[i], dtype=NUMPY[tensor.datatype])
        result[tensor.name] = (tensor.datatype, data.reshape(tuple(tensor.shape)))
    return result


def run_cli(*args):
    return subprocess.run([nc.default_binary()] + list(args), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def printed_outputs(stdout):
    """{name: (datatype, [row values as strings])} from `numaserve infer`'s output."""
    outputs, current = {}, None
    for line in stdout.splitlines():
        header = re.match(r"^(\S+) ([A-Z0-9]+) \[([-0-9,]*)\]$", line)
        row = re.match(r"^\s+\[(\d+)\] (.*?)(?:  argmax=\d+)?$", line)
        if header:
            current = header.group(1)
            outputs[current] = (header.group(2), [])
        elif row and current is not None:
            outputs[current][1].append(row.group(2).split())
    return outputs


class TypedIoTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_typed_io_")
        cls.table = np.random.default_rng(11).standard_normal((VOCAB, DIM)).astype(np.float32)
        for name, model in ((EMBED, embed_model(cls.table)), (ECHO, echo_model(ECHO_TYPES)),
                            (ECHO_TYPED, echo_model(TYPED_TYPES))):
            nc.write_model(cls.repo, name, model)
            with open(os.path.join(cls.repo, name, "config.pbtxt"), "w") as f:
                f.write(BATCHED_CONFIG)
        cls.server = nc.ServerProcess(cls.repo).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(4000)

    def expected_embed(self, inputs):
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        return {"embeddings": ("FP32", self.table[ids] * mask[..., None].astype(np.float32)),
                "next_ids": ("INT64", ids + 1),
                "padding": ("BOOL", mask == 0)}

    def assert_outputs(self, got, expected, what):
        self.assertEqual(sorted(got), sorted(expected), what)
        for name, (datatype, want) in expected.items():
            got_type, value = got[name]
            self.assertEqual(got_type, datatype, "%s: %s" % (what, name))
            self.assertEqual(value.dtype, np.asarray(want).dtype, "%s: %s" % (what, name))
            np.testing.assert_array_equal(value, want, err_msg="%s: %s" % (what, name))

    def infer(self, model, inputs, raw=True, datatypes=None, stub=None):
        request = make_request(model, inputs, raw, datatypes)
        return decode((stub or self.stub).ModelInfer(request, timeout=60))

    def assert_invalid(self, request, mentions):
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelInfer(request, timeout=30)
        error = caught.exception
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT, error.details())
        for word in mentions:
            self.assertIn(word, error.details())

    # -- metadata

    def test_metadata_and_config_name_every_datatype(self):
        meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=EMBED), timeout=10)
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in meta.inputs],
                         [("input_ids", "INT64", [-1, SEQ]),
                          ("attention_mask", "INT64", [-1, SEQ])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in meta.outputs],
                         [("embeddings", "FP32", [-1, SEQ, DIM]), ("next_ids", "INT64", [-1, SEQ]),
                          ("padding", "BOOL", [-1, SEQ])])
        meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=ECHO), timeout=10)
        self.assertEqual([t.datatype for t in meta.inputs], ECHO_TYPES)
        self.assertEqual([t.datatype for t in meta.outputs], ECHO_TYPES)

        config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=ECHO), timeout=10).config
        tpb = nc.triton_config_pb
        self.assertEqual([tpb.DataType.Name(t.data_type) for t in config.input],
                         ["TYPE_" + t for t in ECHO_TYPES])
        self.assertEqual([tpb.DataType.Name(t.data_type) for t in config.output],
                         ["TYPE_" + t for t in ECHO_TYPES])
        self.assertEqual(list(config.input[0].dims), [3])

    # -- results

    def test_embed_raw_and_typed_contents_match_numpy(self):
        inputs = embed_inputs(3, seed=1)
        for raw in (True, False):
            got = self.infer(EMBED, inputs, raw=raw)
            self.assert_outputs(got, self.expected_embed(inputs), "raw=%s" % raw)

    def test_every_datatype_round_trips(self):
        inputs = echo_inputs(4, seed=2)
        got = self.infer(ECHO, inputs, datatypes={"x_BF16": "BF16"})
        expected = {"y_" + t: (t, inputs["x_" + t]) for t in ECHO_TYPES}
        self.assert_outputs(got, expected, "echo, raw contents")

    def test_every_typed_field_round_trips(self):
        inputs = echo_inputs(2, seed=3, types=TYPED_TYPES)
        got = self.infer(ECHO_TYPED, inputs, raw=False)
        expected = {"y_" + t: (t, inputs["x_" + t]) for t in TYPED_TYPES}
        self.assert_outputs(got, expected, "echo, typed contents")
        # FP16 and BF16 in typed contents are refused: they travel raw only.
        inputs = echo_inputs(2, seed=3)
        request = make_request(ECHO, inputs, raw=True, datatypes={"x_BF16": "BF16"})
        del request.raw_input_contents[:]
        for tensor in request.inputs:
            if tensor.datatype in TYPED_TYPES:
                nc._fill_contents(tensor.contents, tensor.datatype, inputs[tensor.name])
            else:
                tensor.contents.fp32_contents.extend([0.5] * 6)
        self.assert_invalid(request, ("x_FP16", "FP16", "raw_input_contents"))

    def test_stream_carries_typed_requests(self):
        inputs = {i: embed_inputs(i + 1, seed=50 + i) for i in range(4)}

        def requests():
            for i, x in inputs.items():
                request = make_request(EMBED, x, raw=i % 2 == 0)
                request.id = str(i)
                yield request
            bad = make_request(EMBED, embed_inputs(1, seed=60), raw=False)
            bad.inputs[1].datatype = "FP32"
            bad.id = "bad"
            yield bad

        answers = {r.infer_response.id: r
                   for r in self.stub.ModelStreamInfer(requests(), timeout=60)}
        self.assertEqual(set(answers), {"0", "1", "2", "3", "bad"})
        for i, x in inputs.items():
            self.assertEqual(answers[str(i)].error_message, "", i)
            self.assert_outputs(decode(answers[str(i)].infer_response), self.expected_embed(x),
                                "stream request %d" % i)
        for word in ("attention_mask", "FP32", "INT64"):
            self.assertIn(word, answers["bad"].error_message)

    def test_concurrent_callers_get_their_own_rows_from_shared_batches(self):
        before = self.server.metrics()
        rows = [(i % 3) + 1 for i in range(CALLERS)]
        embed = [embed_inputs(r, seed=100 + i) for i, r in enumerate(rows)]
        # Even callers send raw bytes, odd ones typed contents (to echo_typed).
        echo_model = [ECHO if i % 2 == 0 else ECHO_TYPED for i in range(CALLERS)]
        echo = [echo_inputs(r, seed=200 + i, types=ECHO_TYPES if i % 2 == 0 else TYPED_TYPES)
                for i, r in enumerate(rows)]
        def call(i, stub):
            a = self.infer(EMBED, embed[i], raw=i % 2 == 0, stub=stub)
            b = self.infer(echo_model[i], echo[i], raw=i % 2 == 0,
                           datatypes={"x_BF16": "BF16"}, stub=stub)
            return (a, b)

        results = nc.call_together(self.server, CALLERS, call)
        for i, got in enumerate(results):
            self.assertIsInstance(got, tuple, "caller %d: %r%s" % (i, got, self.log()))
            self.assert_outputs(got[0], self.expected_embed(embed[i]), "caller %d embed" % i)
            self.assert_outputs(got[1], {"y" + k[1:]: (k[2:], v) for k, v in echo[i].items()},
                                "caller %d %s" % (i, echo_model[i]))
        after = self.server.metrics()
        callers = {EMBED: CALLERS, ECHO: CALLERS // 2, ECHO_TYPED: CALLERS // 2}
        for model, n in callers.items():
            executions = (after.sum("numaserve_executions_total", model=model, version="1")
                          - before.sum("numaserve_executions_total", model=model, version="1"))
            inferences = (after.sum("numaserve_inferences_total", model=model)
                          - before.sum("numaserve_inferences_total", model=model))
            self.assertEqual(inferences, sum(r for i, r in enumerate(rows)
                                             if model in (EMBED, echo_model[i])), model)
            self.assertLess(executions, n, "%s: %d callers in %d batches: nothing was batched"
                            % (model, n, executions))

    # -- errors

    def test_wrong_datatype_names_the_input_the_given_and_the_expected_type(self):
        inputs = embed_inputs(2, seed=4)
        inputs["input_ids"] = inputs["input_ids"].astype(np.int32)
        self.assert_invalid(make_request(EMBED, inputs, raw=True),
                            ("input_ids", "INT32", "INT64"))
        inputs = echo_inputs(1, seed=5)
        inputs["x_UINT16"] = inputs["x_UINT16"].astype(np.int16)
        self.assert_invalid(make_request(ECHO, inputs, raw=True, datatypes={"x_BF16": "BF16"}),
                            ("x_UINT16", "INT16", "UINT16"))

    def test_values_in_the_wrong_field_or_out_of_range_are_refused(self):
        inputs = embed_inputs(1, seed=6)
        request = make_request(EMBED, inputs, raw=False)
        ids = request.inputs[0].contents
        values = list(ids.int64_contents)
        del ids.int64_contents[:]
        ids.int_contents.extend(values)
        self.assert_invalid(request, ("input_ids", "int_contents", "int64_contents"))

        # INT8 carried in int_contents: 128 does not fit.
        inputs = echo_inputs(1, seed=7, types=TYPED_TYPES)
        request = make_request(ECHO_TYPED, inputs, raw=False)
        for tensor in request.inputs:
            if tensor.name == "x_INT8":
                tensor.contents.int_contents[1] = 128
        self.assert_invalid(request, ("x_INT8", "int_contents[1] = 128", "range"))

        # Raw BOOL bytes other than 0 and 1.
        request = make_request(ECHO, echo_inputs(1, seed=8), raw=True,
                               datatypes={"x_BF16": "BF16"})
        request.raw_input_contents[0] = b"\x01\x02\x00"
        self.assert_invalid(request, ("x_BOOL", "byte 1 is 2"))

    # -- the CLI

    def test_cli_reads_npy_of_each_dtype_and_prints_typed_outputs(self):
        inputs = embed_inputs(2, seed=9)
        args = ["infer", "--model", EMBED, "--url", self.server.grpc_address]
        for name, array in inputs.items():
            path = os.path.join(self.repo, name + ".npy")
            np.save(path, array)
            args += ["--input", "%s=%s" % (name, path)]
        result = run_cli(*args)
        what = "numaserve %s\n%s\n%s" % (" ".join(args), result.stdout, result.stderr)
        self.assertEqual(result.returncode, 0, what)
        printed = printed_outputs(result.stdout)
        expected = self.expected_embed(inputs)
        self.assertEqual(printed["next_ids"][0], "INT64", what)
        self.assertEqual([[int(v) for v in row] for row in printed["next_ids"][1]],
                         expected["next_ids"][1].tolist(), what)
        self.assertEqual(printed["padding"][0], "BOOL", what)
        self.assertEqual(printed["padding"][1],
                         [["true" if v else "false" for v in row]
                          for row in expected["padding"][1]], what)
        embeddings = np.array([[float(v) for v in row] for row in printed["embeddings"][1]])
        np.testing.assert_allclose(embeddings, expected["embeddings"][1].reshape(-1, DIM),
                                   atol=5e-5, err_msg=what)

        # A wrong dtype is refused naming the file and both types.
        bad = os.path.join(self.repo, "ids32.npy")
        np.save(bad, inputs["input_ids"].astype(np.int32))
        result = run_cli("infer", "--model", EMBED, "--url", self.server.grpc_address,
                         "--input", "input_ids=" + bad)
        self.assertNotEqual(result.returncode, 0)
        for word in (bad, "<i4", "INT64", "<i8"):
            self.assertIn(word, result.stderr)
        # A shape too large for random values is refused, not allocated.
        result = run_cli("infer", "--model", EMBED, "--url", self.server.grpc_address,
                         "--input", "input_ids=100000,100000:random")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("input 'input_ids' shape [100000,100000] is too large", result.stderr)

    def test_cli_half_types_from_npy_and_random_integers(self):
        half = (np.arange(6, dtype=np.float32).reshape(2, 3) / 4 - 0.5).astype(np.float16)
        bf16 = np.array([[1.0, -2.5, 0.15625], [3.0, 1e-3, 7.0]], dtype=np.float32)
        paths = {}
        for name, array in (("x_FP16", half), ("x_BF16", bf16)):
            paths[name] = os.path.join(self.repo, name + ".npy")
            np.save(paths[name], array)
        # The other inputs get random values (integers 0..9, booleans) with
        # the files' batch of 2.
        args = ["infer", "--model", ECHO, "--url", self.server.grpc_address,
                "--input", "x_FP16=" + paths["x_FP16"], "--input", "x_BF16=" + paths["x_BF16"]]
        result = run_cli(*args)
        what = "numaserve %s\n%s\n%s" % (" ".join(args), result.stdout, result.stderr)
        self.assertEqual(result.returncode, 0, what)
        printed = printed_outputs(result.stdout)
        self.assertEqual(printed["y_FP16"], ("FP16", [["%.4f" % v for v in row] for row in half]),
                         what)
        # bf16: float32 rounded to 8 significant bits (0.15625 and 1e-3 are
        # not exact: 0.15625 is, 1e-3 rounds to 0.00100708).
        bits = bf16.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
        self.assertEqual(printed["y_BF16"][1], [["%.4f" % v for v in row] for row in rounded],
                         what)
        for t in ("INT8", "UINT16", "INT64", "UINT64"):
            values = [int(v) for row in printed["y_" + t][1] for v in row]
            self.assertEqual(len(values), 6, what)
            self.assertTrue(all(0 <= v <= 9 for v in values), what)
        self.assertTrue(set(printed["y_BOOL"][1][0]) <= {"true", "false"}, what)


if __name__ == "__main__":
    unittest.main()
