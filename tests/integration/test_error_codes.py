#!/usr/bin/python3
"""An engine error keeps its status code on the way to the client: the
worker's reply carries the code, so an integer division by zero is
INVALID_ARGUMENT naming the node (not INTERNAL), alone or in a batch with
other callers' good rows, and the server keeps answering afterwards.

  a [n,2] INT32, b [n,2] INT32 -> Div -> q [n,2] INT32   (DIV)
"""

import os
import sys
import tempfile
import unittest

import grpc
import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

DIV = "int_div"


def div_model():
    graph = helper.make_graph(
        [helper.make_node("Div", ["a", "b"], ["q"], name="divide")], DIV,
        [helper.make_tensor_value_info("a", TensorProto.INT32, ["n", 2]),
         helper.make_tensor_value_info("b", TensorProto.INT32, ["n", 2])],
        [helper.make_tensor_value_info("q", TensorProto.INT32, ["n", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


class ErrorCodesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_error_codes_")
        nc.write_model(cls.repo, DIV, div_model())
        with open(os.path.join(cls.repo, DIV, "config.pbtxt"), "w") as f:
            f.write("max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 0 }\n")
        cls.server = nc.ServerProcess(cls.repo).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def test_division_by_zero_is_invalid_argument(self):
        a = np.array([[7, -9]], dtype=np.int32)
        with self.assertRaises(grpc.RpcError) as caught:
            nc.infer(self.stub, DIV, {"a": a, "b": np.array([[2, 0]], dtype=np.int32)})
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         caught.exception.details())
        self.assertIn("divide", caught.exception.details())
        self.assertIn("by zero", caught.exception.details())
        # The server still answers, and truncates toward zero.
        q = nc.infer(self.stub, DIV, {"a": a, "b": np.array([[2, 4]], dtype=np.int32)})["q"]
        np.testing.assert_array_equal(q, np.array([[3, -2]], dtype=np.int32))

    def test_code_is_kept_from_concurrent_callers(self):
        # Some callers divide by zero; whichever batch they land in fails
        # with INVALID_ARGUMENT, never INTERNAL or UNAVAILABLE.
        def call(i, stub):
            b = np.array([[1, 0 if i % 3 == 0 else 2]], dtype=np.int32)
            try:
                nc.infer(stub, DIV, {"a": np.array([[i, i]], dtype=np.int32), "b": b})
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

        codes = nc.call_together(self.server, 24, call)
        self.assertIn(grpc.StatusCode.INVALID_ARGUMENT, codes)
        self.assertEqual(set(codes) - {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT},
                         set(), codes)
        for i, code in enumerate(codes):
            if i % 3 == 0:
                self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, i)


if __name__ == "__main__":
    unittest.main()
