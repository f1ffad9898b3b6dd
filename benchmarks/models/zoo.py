#!/usr/bin/python3
"""A model zoo from the exporters users use: torchvision's and transformers'
models, built with random weights (torch.manual_seed; no hub downloads) and
exported by torch.onnx.export at its default opset, with the dynamic axes
their users give (batch, sequence length, past length, image size): its
TorchScript path (opset 17; what models.zoo tests), or with --exporter
dynamo its torch.export-based one (dynamo=True, opset 18; --report only:
its exports take 2-13 s each, too long for make test).

  PY=$(bash tools/python/venv.sh build/release zoo)     # make venv-zoo
  $PY benchmarks/models/zoo.py --list
  $PY benchmarks/models/zoo.py --export DIR [--size small|full] [--models a,b]
  $PY benchmarks/models/zoo.py --report [--numaserve build/release/bin/numaserve]
                                        [--exporter torchscript|dynamo]
  $PY benchmarks/models/zoo.py --bench [--models bert_base,resnet50] [--threads 2]

The environment is <build>/venv/zoo (requirements/zoo.txt: transformers and
ONNX Runtime from PyPI, pinned; Debian 13's python3-torch and
python3-torchvision through the environment's system site packages).

Each model has two sizes. "small" (a few layers, narrow, small images) is
what ctest's models.zoo runs (tests/models/test_zoo.py): exported, served
by the real numaserve and checked against ONNX Runtime at the three shapes
of its shapes["small"], relative error at most 1e-4 (zoo_check.py).
"full" is the real architecture, for --bench (make bench-zoo) only; the
LLaMA decoder's full size is a 1.1B-parameter one (4.4 GB in FP32).

--report exports every small model, serves them all from one numaserve,
and prints one Markdown row per model: does it load (else the server's
reason, which names the node and op), its worst relative error against
ONNX Runtime over the three shapes, and ONNX Runtime's own against PyTorch
(which says the export itself is right at those shapes).

A model whose `served` is False is one numaserve refuses today (REFUSED
below holds the reason it gave, naming node and op); models.zoo checks
that it is still refused that way at load, or, should it load, that it
matches ONNX Runtime too.
"""
import argparse
import dataclasses
import os
import sys
import warnings
from typing import Callable

import numpy as np

SEED = 0
RTOL = 1e-4  # the zoo's bound: max|numaserve - ORT| / max|ORT| per output


@dataclasses.dataclass
class ZooModel:
    name: str
    family: str  # "vision" or "language"
    build: Callable  # build(size) -> torch.nn.Module, weights from torch.manual_seed
    input_names: list
    output_names: list
    dynamic_axes: dict
    make_inputs: Callable  # make_inputs(size, shape, rng) -> {input name: array}
    shapes: dict  # size -> shapes; the first is the export's example
    served: bool = True
    note: str = ""
    io_of: Callable = None  # io_of(size) -> (input names, output names, axes) where they vary

    def io(self, size):
        if self.io_of is not None:
            return self.io_of(size)
        return self.input_names, self.output_names, self.dynamic_axes


# --- Vision (torchvision) ------------------------------------------------------

IMAGE_AXES = {"images": {0: "batch", 2: "height", 3: "width"}}
BATCH_AXES = {"images": {0: "batch"}}
# (batch, height, width). Small images keep the test quick; each shape
# differs in batch and in image size where the model takes any size. The
# first, the export's example, is the most general: more than one row (a
# trace at batch 1 may fold what depends on it), and for the decoders more
# than one new token after a past (a trace at one token leaves out the
# causal mask).
IMAGE_SHAPES = {"small": [(2, 64, 64), (1, 96, 80), (3, 48, 112)],
                "full": [(1, 224, 224), (8, 224, 224)]}
FIXED_IMAGE_SHAPES = {"small": [(2, 64, 64), (1, 64, 64), (3, 64, 64)],
                      "full": [(1, 224, 224), (8, 224, 224)]}


def images(size, shape, rng):
    batch, height, width = shape
    return {"images": rng.standard_normal((batch, 3, height, width)).astype(np.float32)}


def vision(name, build, shapes=IMAGE_SHAPES, axes=IMAGE_AXES, outputs=("logits",), **kw):
    return ZooModel(name, "vision", build, ["images"], list(outputs), axes, images, shapes,
                    **kw)


def resnet50(size):
    from torchvision.models import resnet
    if size == "full":
        return resnet.resnet50()
    return resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16)


def mobilenet_v3_large(size):
    from torchvision.models import mobilenet_v3_large as build
    return build() if size == "full" else build(width_mult=0.25, num_classes=10)


def efficientnet_b0(size):
    from torchvision.models import efficientnet
    if size == "full":
        return efficientnet.efficientnet_b0()
    setting, last = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25,
                                                    depth_mult=0.25)
    return efficientnet.EfficientNet(setting, 0.2, num_classes=10, last_channel=last)


def convnext_tiny(size):
    from torchvision.models import convnext
    if size == "full":
        return convnext.convnext_tiny()
    C = convnext.CNBlockConfig
    return convnext.ConvNeXt([C(16, 32, 1), C(32, 64, 1), C(64, 128, 1), C(128, None, 1)],
                             num_classes=10)


def vit_b_16(size):
    import torch
    from torchvision.models import vision_transformer as vit
    if size == "full":
        model = vit.vit_b_16()
    else:
        model = vit.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2,
                                      hidden_dim=32, mlp_dim=64, num_classes=10)
    # torchvision zeroes the head (fine-tuning starts there): random
    # weights instead, or every logit is 0 and no comparison says anything.
    torch.nn.init.normal_(model.heads.head.weight, std=0.05)
    return model


def swin_t(size):
    from torchvision.models import swin_transformer as swin
    if size == "full":
        return swin.swin_t()
    return swin.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1, 2, 1],
                                num_heads=[1, 2, 2, 4], window_size=[4, 4], num_classes=10)


def regnet(size):
    from torchvision.models import regnet as rn
    if size == "full":
        return rn.regnet_y_400mf()
    params = rn.BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0,
                                             group_width=8, se_ratio=0.25)
    return rn.RegNet(params, stem_width=16, num_classes=10)


def deeplabv3(size):
    import torch
    from torchvision.models import resnet
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation import deeplabv3 as dl

    class Out(torch.nn.Module):  # the "out" entry of the model's dict
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            return self.model(images)["out"]

    if size == "full":
        return Out(dl.deeplabv3_resnet50(weights=None, weights_backbone=None))
    backbone = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], width_per_group=16,
                             replace_stride_with_dilation=[False, True, True])
    body = IntermediateLayerGetter(backbone, {"layer4": "out"})
    head = torch.nn.Sequential(dl.ASPP(2048, [12, 24, 36], out_channels=32),
                               torch.nn.Conv2d(32, 32, 3, padding=1, bias=False),
                               torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                               torch.nn.Conv2d(32, 5, 1))  # DeepLabHead, 32 wide
    return Out(dl.DeepLabV3(body, head, None))


def ssdlite(size):
    import torch
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large as build

    class Detections(torch.nn.Module):  # one image in, its boxes, scores and labels
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            found = self.model(list(images.unbind(0)))[0]
            return found["boxes"], found["scores"], found["labels"]

    classes = 91 if size == "full" else 5
    return Detections(build(weights=None, weights_backbone=None, num_classes=classes).eval())


# --- Language (transformers, built from configs) -----------------------------

# (batch, sequence): batch and length differ at each shape.
TEXT_SHAPES = {"small": [(2, 8), (1, 13), (3, 5)],
               "full": [(1, 16), (8, 16), (1, 128), (8, 128), (1, 512), (8, 512)]}
TEXT_AXES = {name: {0: "batch", 1: "sequence"}
             for name in ("input_ids", "attention_mask", "token_type_ids")}
HIDDEN_AXES = {"last_hidden_state": {0: "batch", 1: "sequence"}}


def text_inputs(names, vocab):
    def make(size, shape, rng):
        batch, seq = shape
        out = {"input_ids": rng.integers(0, vocab(size), (batch, seq)).astype(np.int64)}
        if "attention_mask" in names:
            mask = np.ones((batch, seq), np.int64)
            mask[1:, seq - seq // 3:] = 0  # rows after the first padded at the end
            out["attention_mask"] = mask
        if "token_type_ids" in names:
            types = np.zeros((batch, seq), np.int64)
            types[:, seq // 2:] = 1
            out["token_type_ids"] = types
        return out
    return make


def keywords_in_tuple_out(model, inputs, outputs):
    """MODEL (transformers') called with its inputs by keyword, its named
    outputs returned as a tuple: transformers' forward takes more
    positional arguments than the exported inputs."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            result = self.model(**dict(zip(inputs, args)))
            return tuple(getattr(result, o) for o in outputs)

    return Wrapped().eval()


def text_model(name, build, inputs, outputs, vocab, **kw):
    axes = {i: TEXT_AXES[i] for i in inputs}
    axes.update({o: HIDDEN_AXES[o] for o in outputs if o in HIDDEN_AXES})

    def built(size):
        return keywords_in_tuple_out(build(size), inputs, outputs)
    return ZooModel(name, "language", built, list(inputs), list(outputs), axes,
                    text_inputs(inputs, vocab), TEXT_SHAPES, **kw)


def small_or_full(small, full):
    return lambda size: small if size == "small" else full


def bert(size):
    from transformers import BertConfig, BertModel
    if size == "full":
        return BertModel(BertConfig())
    return BertModel(BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64))


def distilbert(size):
    from transformers import DistilBertConfig, DistilBertModel
    if size == "full":
        return DistilBertModel(DistilBertConfig())
    return DistilBertModel(DistilBertConfig(vocab_size=96, dim=32, n_layers=2, n_heads=2,
                                            hidden_dim=64))


def roberta(size):
    from transformers import RobertaConfig, RobertaModel
    if size == "full":
        return RobertaModel(RobertaConfig(vocab_size=50265))
    return RobertaModel(RobertaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=64))


def t5_encoder(size):
    from transformers import T5Config, T5EncoderModel
    if size == "full":
        return T5EncoderModel(T5Config(d_model=768, d_ff=3072, num_layers=12,
                                       num_heads=12))  # t5-base's shape
    return T5EncoderModel(T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                   num_heads=4))


# Whisper's encoder takes exactly 2 * max_source_positions frames of
# num_mel_bins (the model checks): only the batch is dynamic.
WHISPER = {"small": dict(num_mel_bins=16, max_source_positions=24, d_model=32,
                         encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                         decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
                         vocab_size=96, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         decoder_start_token_id=1),
           "full": dict(d_model=512, encoder_layers=6, encoder_attention_heads=8,
                        encoder_ffn_dim=2048, decoder_layers=6, decoder_attention_heads=8,
                        decoder_ffn_dim=2048)}  # whisper-base


def whisper_encoder(size):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    return keywords_in_tuple_out(WhisperEncoder(WhisperConfig(**WHISPER[size])),
                                 ["input_features"], ["last_hidden_state"])


def whisper_inputs(size, shape, rng):
    from transformers import WhisperConfig
    config = WhisperConfig(**WHISPER[size])
    frames = 2 * config.max_source_positions
    return {"input_features": rng.standard_normal(
        (shape[0], config.num_mel_bins, frames)).astype(np.float32)}


# --- Decoders with past key/values -------------------------------------------

# (batch, new tokens, past length)
DECODER_SHAPES = {"small": [(2, 4, 3), (1, 1, 5), (3, 1, 9)],
                  "full": [(1, 1, 16), (8, 1, 16), (1, 1, 128), (8, 1, 128), (1, 1, 512),
                           (8, 1, 512)]}


def gpt2_config(size):
    from transformers import GPT2Config
    if size == "full":
        return GPT2Config()
    return GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                      bos_token_id=0, eos_token_id=0)


def llama_config(size):
    from transformers import LlamaConfig
    if size == "full":  # a 1B-class LLaMA: RMSNorm, rotary, SwiGLU, grouped-query
        return LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                           num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, max_position_embeddings=2048)
    return LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128)


def kv_geometry(config):
    """(layers, key/value heads, head dim) of a GPT-2 or LLaMA config."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    return layers, kv_heads, hidden // heads


def decoder(name, config_of, model_class):
    """A causal LM as optimum exports it: input_ids, attention_mask over past
    and new tokens, past_key_values.N.key/value in; logits and
    present.N.key/value out."""
    def io_of(size):
        layers = kv_geometry(config_of(size))[0]
        past = ["past_key_values.%d.%s" % (i, kv) for i in range(layers)
                for kv in ("key", "value")]
        present = ["present.%d.%s" % (i, kv) for i in range(layers) for kv in ("key", "value")]
        axes = {"input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "total_sequence"},
                "logits": {0: "batch", 1: "sequence"}}
        axes.update({n: {0: "batch", 2: "past_sequence"} for n in past})
        axes.update({n: {0: "batch", 2: "total_sequence"} for n in present})
        return ["input_ids", "attention_mask"] + past, ["logits"] + present, axes

    def build(size):
        import torch
        import transformers
        from transformers import DynamicCache
        model = getattr(transformers, model_class)(config_of(size)).eval()

        class WithPast(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, *kv):
                cache = DynamicCache(ddp_cache_data=list(zip(kv[0::2], kv[1::2])))
                out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                 past_key_values=cache, use_cache=True)
                flat = []
                for layer in out.past_key_values.layers:
                    flat += [layer.keys, layer.values]
                return (out.logits, *flat)

        return WithPast().eval()

    def make_inputs(size, shape, rng):
        batch, seq, past_len = shape
        config = config_of(size)
        layers, kv_heads, head_dim = kv_geometry(config)
        out = {"input_ids": rng.integers(0, config.vocab_size, (batch, seq)).astype(np.int64),
               "attention_mask": np.ones((batch, past_len + seq), np.int64)}
        for n in io_of(size)[0][2:]:
            out[n] = (rng.standard_normal((batch, kv_heads, past_len, head_dim)) * 0.5).astype(
                np.float32)
        return out

    inputs, outputs, axes = io_of("small")
    return ZooModel(name, "language", build, inputs, outputs, axes, make_inputs, DECODER_SHAPES,
                    io_of=io_of)


MODELS = [
    text_model("bert_base", bert, ["input_ids", "attention_mask", "token_type_ids"],
               ["last_hidden_state", "pooler_output"], small_or_full(96, 30522)),
    text_model("distilbert", distilbert, ["input_ids", "attention_mask"],
               ["last_hidden_state"], small_or_full(96, 30522)),
    decoder("gpt2_past", gpt2_config, "GPT2LMHeadModel"),
    decoder("llama_past", llama_config, "LlamaForCausalLM"),
    text_model("roberta", roberta, ["input_ids", "attention_mask"], ["last_hidden_state"],
               small_or_full(96, 50265)),
    text_model("t5_encoder", t5_encoder, ["input_ids", "attention_mask"],
               ["last_hidden_state"], small_or_full(96, 32128)),
    ZooModel("whisper_encoder", "language", whisper_encoder, ["input_features"],
             ["last_hidden_state"], {"input_features": {0: "batch"},
                                     "last_hidden_state": {0: "batch"}},
             whisper_inputs, {"small": [(2,), (1,), (3,)], "full": [(1,), (8,)]}),
    vision("resnet50", resnet50),
    vision("mobilenet_v3_large", mobilenet_v3_large),
    vision("efficientnet_b0", efficientnet_b0),
    vision("convnext_tiny", convnext_tiny),
    # torchvision's ViT checks the image size against its position
    # embeddings: only the batch is dynamic.
    vision("vit_b_16", vit_b_16, shapes=FIXED_IMAGE_SHAPES, axes=BATCH_AXES),
    # torchvision's Swin pads to whole windows and builds its shifted
    # windows' masks from Python ints: a trace holds them at the example's
    # size (ONNX Runtime's outputs at other sizes are off by 1e-2 against
    # PyTorch's), so only the batch is dynamic, as for ViT.
    vision("swin_t", swin_t, shapes=FIXED_IMAGE_SHAPES, axes=BATCH_AXES),
    vision("regnet", regnet),
    vision("deeplabv3", deeplabv3, outputs=("out",),
           axes={"images": {0: "batch", 2: "height", 3: "width"},
                 "out": {0: "batch", 2: "height", 3: "width"}}),
    # One image in (torchvision's detection models take a list of images);
    # the post-processing (score threshold, NonMaxSuppression, TopK) is in
    # the graph.
    vision("ssdlite", ssdlite, outputs=("boxes", "scores", "labels"),
           shapes={"small": [(1, 96, 96), (1, 128, 96), (1, 64, 160)],
                   "full": [(1, 320, 320)]},
           axes={"images": {2: "height", 3: "width"}, "boxes": {0: "detections"},
                 "scores": {0: "detections"}, "labels": {0: "detections"}}),
]
# What numaserve says at load of the models it refuses (zoo.py --report;
# the tables in benchmarks/results/2026-12-07-zoo.md and
# 2026-12-07-zoo-shape-values.md). The shapes computed in the graph (Shape ->
# Gather -> Concat -> a Reshape's target, a Slice's ends, a Range's limit,
# a Resize's sizes) are computed per signature since the second; models.zoo
# leaves these models out until they load.
REFUSED = {
    "ssdlite": "node '/model/NonZero' (op NonZero): its input must be a constant (the output's "
               "shape depends on the input's values, and data-dependent shapes are not "
               "supported)",
}
BY_NAME = {m.name: m for m in MODELS}
for _name, _why in REFUSED.items():
    BY_NAME[_name].served = False
    BY_NAME[_name].note = _why


def pick(names):
    """The models named in a comma-separated list (all if empty)."""
    if not names:
        return list(MODELS)
    unknown = [n for n in names.split(",") if n not in BY_NAME]
    if unknown:
        raise SystemExit("zoo: unknown model(s) %s; known: %s" % (
            ", ".join(unknown), ", ".join(BY_NAME)))
    return [BY_NAME[n] for n in names.split(",")]


def inputs_at(model, size, index):
    """The seeded inputs of MODEL at its INDEXth shape of SIZE."""
    rng = np.random.default_rng(SEED + 1000 * index + len(model.name))
    return model.make_inputs(size, model.shapes[size][index], rng)


EXPORTERS = ("torchscript", "dynamo")


def dynamic_shapes(module, inputs, axes):
    """torch.export's dynamic_shapes for MODULE's forward called with
    INPUTS in order: Dim.AUTO on each axis AXES names (torch.export then
    finds the relations itself, such as the total length being past plus
    new tokens), grouped as forward's parameters are (a *args parameter
    takes the rest as one tuple)."""
    import inspect

    import torch
    specs = [{axis: torch.export.Dim.AUTO for axis in axes.get(n, {})} or None for n in inputs]
    grouped = []
    for parameter in inspect.signature(module.forward).parameters.values():
        if parameter.kind == parameter.VAR_POSITIONAL:
            grouped.append(tuple(specs))
            return tuple(grouped)
        grouped.append(specs.pop(0))
    return tuple(grouped)


def export(model, size, path, dynamic_axes=None, exporter="torchscript"):
    """Builds MODEL at SIZE (weights from torch.manual_seed(SEED)) and
    writes it to PATH with torch.onnx.export at the exporter's default
    opset: its TorchScript path, or with EXPORTER "dynamo" its
    torch.export-based one (dynamo=True; the dynamic axes as
    dynamic_shapes, and the weights in external data beside PATH, as it
    writes them by default). Returns the eval module (for PyTorch's own
    outputs)."""
    import torch
    torch.manual_seed(SEED)
    module = model.build(size).eval()
    inputs, outputs, axes = model.io(size)
    axes = axes if dynamic_axes is None else dynamic_axes
    example = inputs_at(model, size, 0)
    args = tuple(torch.from_numpy(example[n]) for n in inputs)
    # Not under torch.no_grad(), as users export: there nn.MultiheadAttention
    # (ViT's) takes its fused fast path, which has no ONNX export.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings: the checks at 3 shapes say more
        if exporter == "dynamo":
            torch.onnx.export(module, args, path, input_names=inputs, output_names=outputs,
                              dynamic_shapes=dynamic_shapes(module, inputs, axes),
                              dynamo=True, external_data=True)
        else:
            torch.onnx.export(module, args, path, input_names=inputs, output_names=outputs,
                              dynamic_axes=axes, dynamo=False)
    return module


def torch_outputs(module, model, size, inputs):
    import torch
    names, outputs, _ = model.io(size)
    with torch.no_grad():
        out = module(*(torch.from_numpy(inputs[n]) for n in names))
    out = out if isinstance(out, (tuple, list)) else (out,)
    return {n: o.detach().numpy() for n, o in zip(outputs, out)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="the models and their shapes")
    parser.add_argument("--export", metavar="DIR", help="write NAME.onnx for each model")
    parser.add_argument("--report", action="store_true",
                        help="the table: loads in numaserve? matches ONNX Runtime?")
    parser.add_argument("--bench", action="store_true",
                        help="full-size models: numaserve bench vs ONNX Runtime")
    parser.add_argument("--size", choices=["small", "full"], default="small")
    parser.add_argument("--exporter", choices=EXPORTERS, default="torchscript",
                        help="torch.onnx.export's path (--export, --report)")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--numaserve", default=None, help="the numaserve binary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sequences", default="",
                        help="--bench: the transformers' sequence lengths (the decoders' past "
                             "lengths), comma-separated (default: 16, 128 and 512)")
    args = parser.parse_args(argv)
    models = pick(args.models)
    if args.list:
        for m in models:
            print("%-20s %-8s %-5s %s" % (m.name, m.family, "yes" if m.served else "no",
                                          " ".join(str(s) for s in m.shapes[args.size])))
        return 0
    if args.export:
        os.makedirs(args.export, exist_ok=True)
        for m in models:
            export(m, args.size, os.path.join(args.export, m.name + ".onnx"),
                   exporter=args.exporter)
            print("%s.onnx" % m.name)
        return 0
    import zoo_check
    if args.report:
        return zoo_check.report(models, args.numaserve, args.exporter)
    if args.bench:
        sequences = tuple(int(n) for n in args.sequences.split(",") if n)
        return zoo_check.bench(models, args.numaserve, args.threads, args.seconds, sequences)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
