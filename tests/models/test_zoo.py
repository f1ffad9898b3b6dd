#!/usr/bin/python3
"""The model zoo's small models on the real numaserve against ONNX Runtime.

  ctest -R models.zoo --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve \\
      $(bash tools/python/venv.sh build/release zoo) tests/models/test_zoo.py -v

benchmarks/models/zoo.py builds each model numaserve loads (zoo.MODELS
whose `served` is set: torchvision's ResNet-50, MobileNetV3-Large,
EfficientNet-B0, ConvNeXt-Tiny, RegNet, ViT-B/16, Swin-T and DeepLabV3,
transformers' BERT-base, DistilBERT, RoBERTa, T5's encoder, Whisper's
encoder, GPT-2 and a LLaMA decoder with past key/values, shrunk) with
seeded random weights, exports it with torch.onnx.export (TorchScript, the
default opset, batch, sequence, past and image size dynamic as its users
give them), serves them all from one `numaserve
serve` and sends each its three shapes (other batch, other image size);
every output must match ONNX Runtime's on the same file and inputs within
a relative error max|numaserve - ORT| / max|ORT| of 1e-4
(benchmarks/models/zoo_check.py). Each is served once more with
max_batch_size 8: the ones the server takes (their rows found apart at
load) answer rows sent as separate requests and batched together as ONNX
Runtime answers the whole batch. The models numaserve refuses are listed
in zoo.REFUSED with the server's reason: served from the same server, each
must be refused at load naming its node and op, or (once the engine takes
it) match ONNX Runtime too. zoo.py --report prints the table.

The served models' requests go once more through Triton's own
tritonclient, gRPC and HTTP (tests/models/zoo_tritonclient.py, run by the
python of <build>/venv/triton, NUMASERVE_TRITON_PYTHON), the answers held
to the same bound.

Two interpreters: ctest starts this file with Debian's python3, which
re-executes it with the zoo's environment <build>/venv/zoo
(NUMASERVE_ZOO_PYTHON; requirements/zoo.txt, made by make test): PyPI's
transformers and ONNX Runtime over Debian's PyTorch. Without it the test
skips, and fails under CI=true; so does the tritonclient test without
<build>/venv/triton.
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.abspath(
    os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "benchmarks", "models"))
import prerequisites  # noqa: E402

ZOO_PYTHON = os.environ.get("NUMASERVE_ZOO_PYTHON", "")
TRITON_PYTHON = os.environ.get("NUMASERVE_TRITON_PYTHON", "")
if not os.access(TRITON_PYTHON, os.X_OK):
    TRITON_PYTHON = ""
try:
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    MISSING = None
except ImportError as e:
    # Once only: the environment's python, if it lacks them too, reports it.
    if (__name__ == "__main__" and os.access(ZOO_PYTHON, os.X_OK)
            and not os.environ.get("NUMASERVE_ZOO_REEXEC")):
        os.environ["NUMASERVE_ZOO_REEXEC"] = "1"
        os.execv(ZOO_PYTHON, [ZOO_PYTHON] + sys.argv)
    MISSING = ("%s; NUMASERVE_ZOO_PYTHON=%r is not a python with PyTorch, transformers and "
               "ONNX Runtime: make venv-zoo (make test makes it)" % (e, ZOO_PYTHON))

if not MISSING:
    import zoo  # noqa: E402
    import zoo_check  # noqa: E402


class ZooTest(unittest.TestCase):
    results = None

    @classmethod
    def setUpClass(cls):
        if MISSING:
            return
        cls.results = zoo_check.check(zoo.MODELS, os.environ.get("NUMASERVE_BIN"),
                                      triton_python=TRITON_PYTHON or None)

    def setUp(self):
        if MISSING:
            prerequisites.missing(self, MISSING)

    def test_the_registry_covers_the_issue_list(self):
        self.assertGreaterEqual(len(zoo.MODELS), 16)
        for m in zoo.MODELS:
            self.assertEqual(len(m.shapes["small"]), 3, m.name)
            self.assertTrue(m.served or m.note, "%s: refused without a reason" % m.name)
        self.assertGreaterEqual(sum(m.served for m in zoo.MODELS), 5)

    def check(self, name):
        r = self.results[name]
        self.assertIsNone(r.export_error, name)
        self.assertTrue(r.loaded, "%s not loaded: %s" % (name, r.reason))
        self.assertEqual(len(r.errors), 3, r.errors)
        for shape, error in zip(r.model.shapes["small"], r.errors):
            self.assertIsInstance(error, float, "%s at %s: %s" % (name, shape, error))
            self.assertLessEqual(error, zoo.RTOL, "%s at %s" % (name, shape))
            print("%s at %s: relative error %.1e, opset %d" % (name, shape, error, r.opset))

    def test_requests_batched_together_answer_as_one(self):
        """Every model the server takes with max_batch_size 8 (its rows
        found apart at load), the transformers' encoders among them since
        their padding mask's flat-index lookup is understood, and the
        decoders with past key/values since the probes keep their mask as
        long as past + sequence: the first
        shape's rows sent at once, one request each (a 100 ms queue delay
        puts them in one batch), answered as ONNX Runtime answers the whole
        batch."""
        batched = {n for n, r in self.results.items() if r.loaded and r.batched}
        self.assertTrue({"resnet50", "bert_base", "distilbert", "roberta", "t5_encoder",
                         "swin_t", "vit_b_16", "gpt2_past", "llama_past"} <= batched,
                        sorted(batched))
        for name in sorted(batched):
            r = self.results[name]
            self.assertIsInstance(r.together_error, float, "%s: %s" % (name, r.together_error))
            self.assertLessEqual(r.together_error, zoo.RTOL, name)
            self.assertEqual(r.together_runs, 1, "%s: the requests were not batched" % name)
            print("%s: %d requests batched together, relative error %.1e" % (
                name, r.model.shapes["small"][0][0], r.together_error))

    def test_resnet50(self):
        self.check("resnet50")

    def test_mobilenet_v3_large(self):
        self.check("mobilenet_v3_large")

    def test_efficientnet_b0(self):
        self.check("efficientnet_b0")

    def test_convnext_tiny(self):
        self.check("convnext_tiny")

    def test_regnet(self):
        self.check("regnet")

    # Shapes computed in the graph (Shape -> Gather -> Concat -> a Reshape's
    # target, a Slice's ends, an Expand's shape, a Range's limit, a Resize's
    # sizes), computed per signature.
    def test_bert_base(self):
        self.check("bert_base")

    def test_distilbert(self):
        self.check("distilbert")

    def test_roberta(self):
        self.check("roberta")

    def test_t5_encoder(self):
        self.check("t5_encoder")

    def test_whisper_encoder(self):
        self.check("whisper_encoder")

    def test_gpt2_past(self):
        self.check("gpt2_past")

    def test_llama_past(self):
        self.check("llama_past")

    def test_vit_b_16(self):
        self.check("vit_b_16")

    def test_swin_t(self):
        self.check("swin_t")

    def test_deeplabv3(self):
        self.check("deeplabv3")

    def test_the_served_ones_answer_tritonclient_alike(self):
        """The same requests through Triton's tritonclient (gRPC and HTTP
        binary, tests/models/zoo_tritonclient.py in <build>/venv/triton)."""
        if not TRITON_PYTHON:
            prerequisites.missing(self, "NUMASERVE_TRITON_PYTHON is not a python with "
                                  "tritonclient: make venv-triton (make test makes it)")
        for m in zoo.MODELS:
            if not m.served:
                continue
            r = self.results[m.name]
            for protocol in ("grpc", "http"):
                errors = r.triton_errors.get(protocol, [])
                self.assertEqual(len(errors), 3, "%s over %s: %s" % (m.name, protocol, errors))
                for shape, error in zip(m.shapes["small"], errors):
                    self.assertIsInstance(error, float, "%s %s at %s: %s" % (
                        m.name, protocol, shape, error))
                    self.assertLessEqual(error, zoo.RTOL, "%s %s at %s" % (m.name, protocol,
                                                                         shape))
            print("%s through tritonclient (grpc, http): %s" % (m.name, r.triton_errors))

    def test_the_others_are_refused_at_load_naming_node_and_op(self):
        """A model numaserve cannot run fails at load, its reason naming the
        node and op (never at run time, never a wrong answer); one that
        starts loading must match ONNX Runtime, and then belongs in the
        tests above (its zoo.REFUSED entry removed)."""
        for name, r in self.results.items():
            if r.model.served:
                continue
            self.assertIsNone(r.export_error, name)
            if r.loaded:
                self.assertTrue(r.matches(), "%s now loads but differs: %s" % (name, r.errors))
                print("%s now loads and matches: remove it from zoo.REFUSED" % name)
                continue
            self.assertRegex(r.reason, r"node '[^']+' \(op [A-Za-z]+\)", name)
            print("%s refused: %s" % (name, r.reason))

    def test_bench_draws_integer_inputs_below_their_tables(self):
        """zoo.py --bench (zoo_check.bench_one) on BERT-base: each integer
        input drawn below the rows of the table its Gather reads (token
        type ids below 2), so that numaserve bench and ort_peer.py bench
        run it to the end (numaserve's default 0..9 reach past the token
        type table, and its Gather refuses them), at batch 1 and 2."""
        import subprocess
        import tempfile
        m = zoo.BY_NAME["bert_base"]
        names, outputs, axes = m.io("small")
        batch_only = {n: {0: "batch"} for n in names + outputs if 0 in axes.get(n, {})}
        with tempfile.TemporaryDirectory(prefix="numaserve_zoo_bounds_") as work:
            path = os.path.join(work, "bert_base.onnx")
            zoo.export(m, "small", path, dynamic_axes=batch_only)
            bounds = zoo_check.index_bounds(path)
            self.assertEqual(bounds, {"input_ids": 96, "attention_mask": 2, "token_type_ids": 2})
            text = ",".join("%s=%d" % kv for kv in sorted(bounds.items()))
            binary = os.environ.get("NUMASERVE_BIN") or \
                zoo_check.numaserve_client().default_binary()
            for command in ([binary, "bench"], [sys.executable, zoo_check.ORT_PEER, "bench"]):
                run = subprocess.run(command + ["--model", path, "--batch", "1,2", "--threads",
                                                "1", "--seconds", "0.05", "--json",
                                                "--index-bounds", text],
                                     capture_output=True, text=True, timeout=300)
                self.assertEqual(run.returncode, 0, "%s: %s" % (command, run.stderr[-2000:]))
                # Batch 2 too.
                self.assertEqual(run.stdout.count('"batch"'), 2, run.stdout)

    def test_every_served_model_has_its_test(self):
        tested = {n[len("test_"):] for n in dir(self) if n.startswith("test_")}
        for m in zoo.MODELS:
            if m.served:
                self.assertIn(m.name, tested)


if __name__ == "__main__":
    unittest.main()
