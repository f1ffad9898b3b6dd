"""What the tests of committed ONNX Runtime outputs share (test_index_ops.py,
test_opset20_ops.py): the files checked against the index their generator
wrote, and a model served by the real numaserve, its outputs compared."""
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

SOURCE_DIR = os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
import numaserve_client as nc  # noqa: E402

REFERENCE = os.path.join(SOURCE_DIR, "tests", "models", "reference")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_index(name):
    with open(os.path.join(REFERENCE, name)) as f:
        return json.load(f)


def check_files(test, index, inputs_file, remake):
    """Every committed file is the one the index names (else: remake)."""
    test.assertEqual(sha256(os.path.join(REFERENCE, inputs_file)), index["input_sha256"],
                     "the inputs changed; run " + remake)
    for entry in index["models"].values():
        for key in ("model", "outputs"):
            test.assertEqual(sha256(os.path.join(REFERENCE, entry[key])), entry[key + "_sha256"],
                             "%s changed; run %s" % (entry[key], remake))


def check_served(test, entry, name, inputs, rtol=1e-5, atol=0.0):
    """Serves entry's model as NAME, infers INPUTS, compares every output with
    ONNX Runtime's: same dtype and shape, floats within rtol/atol, others
    exactly."""
    want = dict(np.load(os.path.join(REFERENCE, entry["outputs"])))
    repo = tempfile.mkdtemp(prefix="numaserve_%s_" % name)
    try:
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(os.path.join(REFERENCE, entry["model"]),
                    os.path.join(repo, name, "1", "model.onnx"))
        with nc.ServerProcess(repo, ["--max-workers", "1"]) as server:
            got = nc.infer(server.stub(), name, inputs, deadline=120.0)
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    test.assertEqual(sorted(got), sorted(want))
    for output, w in sorted(want.items()):
        g = got[output]
        test.assertEqual(g.dtype, w.dtype, output)
        test.assertEqual(g.shape, w.shape, output)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=output)
        else:
            np.testing.assert_array_equal(g, w, err_msg=output)
        print("%s %s: %s %s matches" % (name, output, w.dtype, list(w.shape)))
