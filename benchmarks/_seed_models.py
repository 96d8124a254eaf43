"""The seed benchmark's models and what they cost in memory: VGG16 (torchvision's) on synthetic
ImageNet-shaped batches, BERT-large fine-tuned for question answering (transformers, built from
its configuration: nothing is downloaded) on synthetic SQuAD-shaped batches, and GPT-2 small and
medium (transformers' GPT2LMHeadModel, 124 M and 355 M) on synthetic token batches for the slow-link
race, plus tiny stand-ins of the same code for smoke runs. torch and transformers are imported lazily (the ``bench``
extra installs transformers).

:func:`per_rank_bytes` is the estimate a run is refused with before it starts: weights, gradients,
the recorded gradients of the replay, the optimizer's state, each configuration's own state (the
factors of STATE_COPIES, in copies of the weights) and the activations of a real step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

GIB = 2**30
# The weights' bytes of each model (float32), so that the driver can estimate memory without
# building a model: torchvision's vgg16() and transformers' BertForQuestionAnswering(bert-large-uncased).
PARAMETERS = {
    "vgg16": 138_357_544,
    "bert-large": 334_094_338,
    "gpt-124m": 124_439_808,  # GPT-2 small, its output layer tied to the token embedding
    "gpt-355m": 354_823_168,  # GPT-2 medium
    "tiny-vgg": 2_266,
    "tiny-bert": 37_762,
    "tiny-gpt": 31_616,
}
# What a process holds besides the model: torch, the engine, transformers (a worker's RSS before its
# first configuration, less the mapped recording: 333 MiB with VGG16, 416 MiB with BERT-large, on
# 2026-12-06), with 200 MiB to spare.
BASE_BYTES = {
    "vgg16": 0.55 * GIB,
    "bert-large": 0.65 * GIB,
    "gpt-124m": 0.65 * GIB,  # as BERT's (transformers)
    "gpt-355m": 0.65 * GIB,
    "tiny-vgg": 0.55 * GIB,
    "tiny-bert": 0.65 * GIB,
    "tiny-gpt": 0.65 * GIB,
}
SQUAD_TRAIN_SAMPLES = 88_641  # SQuAD v1.1's training set: one epoch of the seed's BERT-large figure

# A configuration's memory beyond weights, gradients and the optimizer, in copies of the weights: its
# peak RSS over DDP's with VGG16 on 4 hosts (seed_scale-2026-12-06-4h-vgg16), rounded up.
STATE_COPIES = {
    "DDP": 0.0,  # gradient_as_bucket_view=True: the gradients are views of DDP's buckets
    "DDP+fp16": 0.5,
    "DDP+PowerSGD": 3.0,  # the hook's copy of its one bucket, the error-feedback residual, P and Q
    "Horovod": 0.5,
    "Horovod+fp16": 0.5,
    # Bagua's allreduce: a bounded wire-packing scratch (packing_scratch_bytes), not a share of the weights
    "Bagua GradientAllReduce": 0.0,
    "Bagua GradientAllReduce hierarchical": 0.0,
    "Bagua ByteGrad": 0.5,  # compressed send and receive buffers
    "Bagua ByteGrad+EF": 1.5,  # and the residual
    "Bagua HalfGrad": 1.0,
    "Bagua Decentralized": 3.5,  # the peers' weights and their average
    "Bagua LowPrecisionDecentralized": 6.0,  # the neighbours' replicas, compressed buffers
    "Bagua QAdam": 0.75,  # (its Adam moments are the optimizer's: optimizer_copies)
    "Bagua LowRank": 3.0,  # the error-feedback residual, P and Q, the bucket's matrices
    "Bagua LocalSteps": 2.25,  # the anchor and the outer momentum
    "Bagua LocalSteps+8bit": 3.5,  # and the residual, compressed buffers
    "Bagua Async": 2.0,  # the averaging buckets
    # the anchor, outer momentum, residual and one fragment's pseudo-gradient and residual in flight
    "Bagua Streaming+fp4": 3.5,
    "Bagua Streaming+topk2": 3.5,
    "torchft DiLoCo": 3.0,  # its backup of the weights, the outer momentum, the pseudo-gradients
    "torchft Streaming DiLoCo": 3.0,
    "JAX Bagua GradientAllReduce": 1.0,  # the update's output beside the donated weights
    "no communication": 0.0,
}


# Bagua's allreduce keeps a wire-packing scratch of 2.25 times what one exchange carries (send and
# receive stages, a share for the gather), and a tensor larger than the bucket size (10 MiB) is a
# bucket of its own. Each of the 2 lanes reduces its half of a bucket in windows of at most 32 MiB
# (csrc/comm/gloo/communicator.h wire_packing_window_bytes), so the scratch stops growing at 2.25 x
# 64 MiB: before the windows, VGG16's fc6 weight (392 MiB) made GradientAllReduce's peak 925 MiB
# above DDP's (seed_scale-2026-12-06-4h-vgg16), after them 184 MiB (seed_scale-2026-12-07-4h-vgg16-memory).
LARGEST_TENSOR = {
    "vgg16": 102_760_448,
    "bert-large": 31_254_528,
    "gpt-124m": 38_597_376,
    "gpt-355m": 51_463_168,
    "tiny-vgg": 1_152,
    "tiny-bert": 16_384,
    "tiny-gpt": 4_096,
}
PACKING_WINDOW_BYTES = 2 * (32 << 20)  # both lanes' windows
PACKING_SCRATCH = ("Bagua GradientAllReduce", "Bagua GradientAllReduce hierarchical")


def packing_scratch_bytes(model: str, config: str) -> float:
    if config not in PACKING_SCRATCH:
        return 0.0
    return 2.25 * min(4 * LARGEST_TENSOR[model], PACKING_WINDOW_BYTES)


def optimizer_copies(config: str, momentum: float, stepped: bool = True) -> float:
    """The optimizer's state in copies of the weights: Adam's two moments for QAdam, SGD's momentum
    (none when the step never runs: device-time's GPU-timed step; QAdam's moments are the engine's)."""
    if config == "Bagua QAdam":
        return 2.0
    return 1.0 if momentum and stepped else 0.0


@dataclasses.dataclass
class ModelSpec:
    name: str
    batch_size: int  # per GPU, as in the seed's figure
    unit: str  # what a sample is called in the tables
    build: Callable  # () -> torch.nn.Module
    make_batch: Callable  # (rank, batch) -> inputs, passed to loss()
    loss: Callable  # (model, inputs) -> scalar loss
    activation_bytes: Callable  # (batch) -> bytes of a real step's activations (estimate)


# torchvision's vgg16() ("D"): its layout, written out for where torchvision cannot be imported. PyPI's
# torchvision wheels for Linux link CUDA's libc10_cuda.so, which the CPU build of torch lacks, so
# `import torchvision` fails there ("operator torchvision::nms does not exist"); where it imports, its
# own vgg16() is used. Both have the same parameters under the same names (features.N, classifier.N).
VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def torchvision_or_none():
    """torchvision when it imports with this torch, else None."""
    try:
        import torchvision
    except (ImportError, OSError, RuntimeError):
        return None
    return torchvision


def _vgg(layers, pool, classifier):
    import torch.nn as nn

    class VGG(nn.Module):
        def __init__(self):
            super().__init__()
            feats, channels = [], 3
            for v in layers:
                if v == "M":
                    feats.append(nn.MaxPool2d(kernel_size=2, stride=2))
                else:
                    feats += [nn.Conv2d(channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                    channels = v
            self.features = nn.Sequential(*feats)
            self.avgpool = nn.AdaptiveAvgPool2d(pool)
            self.classifier = classifier()
            for m in self.modules():  # torchvision's initialisation
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    nn.init.constant_(m.bias, 0)
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.constant_(m.bias, 0)

        def forward(self, x):
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    return VGG()


def _vgg16():
    tv = torchvision_or_none()
    if tv is not None:
        return tv.models.vgg16(weights=None)
    import torch.nn as nn

    def classifier():
        return nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(4096, 1000),
        )

    return _vgg(VGG16_LAYERS, (7, 7), classifier)


def _tiny_vgg():
    import torch.nn as nn

    return _vgg((8, "M", 16, "M"), (1, 1), lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)))


def _image_batch(size: int, classes: int):
    def make(rank, batch):
        import torch

        g = torch.Generator().manual_seed(1000 + rank)
        return torch.randn(batch, 3, size, size, generator=g), torch.randint(0, classes, (batch,), generator=g)

    return make


def _image_loss(model, inputs):
    import torch.nn.functional as F

    x, y = inputs
    return F.cross_entropy(model(x), y)


BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=128)


def _bert(shape: dict):
    def build():
        from transformers import BertConfig, BertForQuestionAnswering

        return BertForQuestionAnswering(BertConfig(**shape))  # bert-large-uncased's shape, random weights

    return build


def _squad_batch(seq_len: int, vocab: int):
    def make(rank, batch):
        import torch

        g = torch.Generator().manual_seed(1000 + rank)
        ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
        start = torch.randint(0, seq_len, (batch,), generator=g)
        end = torch.clamp(start + torch.randint(0, 30, (batch,), generator=g), max=seq_len - 1)
        return {
            "input_ids": ids,
            "token_type_ids": (torch.arange(seq_len) >= seq_len // 4).long().expand(batch, seq_len),
            "attention_mask": torch.ones(batch, seq_len, dtype=torch.long),
            "start_positions": start,
            "end_positions": end,
        }

    return make


def _squad_loss(model, inputs):
    return model(**inputs).loss


def _bert_activations(shape: dict, seq_len: int):
    h, layers, heads = shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"]
    ff = shape["intermediate_size"]
    # per layer and sample, kept for backward: ~10 hidden-sized tensors, 2 of the feed-forward's
    # width, the attention scores, probabilities and dropout mask
    per_layer = seq_len * (10 * h + 2 * ff) + 3 * heads * seq_len * seq_len
    return lambda batch: 4 * batch * layers * per_layer


GPT2_SMALL = dict(n_embd=768, n_layer=12, n_head=12)
GPT2_MEDIUM = dict(n_embd=1024, n_layer=24, n_head=16)
TINY_GPT = dict(n_embd=32, n_layer=2, n_head=2, vocab_size=128, n_positions=64)
GPT_BATCH = 64  # sequences per rank: 64 x 1024 tokens, a Streaming DiLoCo replica's share of a 256 k-token batch


def _gpt(shape: dict):
    def build():
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(**shape, bos_token_id=None, eos_token_id=None))  # random weights

    return build


def _token_batch(seq_len: int, vocab: int):
    def make(rank, batch):
        import torch

        g = torch.Generator().manual_seed(1000 + rank)
        return torch.randint(0, vocab, (batch, seq_len), generator=g)

    return make


def _lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def _gpt_activations(shape: dict, seq_len: int):
    h, layers, heads, vocab = shape["n_embd"], shape["n_layer"], shape["n_head"], shape.get("vocab_size", 50257)
    per_layer = seq_len * 16 * h + 3 * heads * seq_len * seq_len  # as BERT's, with a 4h feed-forward
    return lambda batch: 4 * batch * (layers * per_layer + 2 * seq_len * vocab)  # and the logits, twice


def fragments(model, count: int):
    """``model`` cut into ``count`` consecutive groups of its leaf modules with about equal numbers
    of parameters (torchft's DiLoCo takes its fragments as modules); a parameter shared by two
    modules (GPT-2's tied output layer) stays in the first."""
    import torch.nn as nn

    seen, leaves = set(), []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        if own and len(own) == len(list(module.parameters(recurse=False))):
            leaves.append((module, sum(p.numel() for p in own)))
            seen.update(id(p) for p in own)
    if len(leaves) < count:
        raise ValueError(f"the model has {len(leaves)} parameter-holding modules: fewer than {count} fragments")
    total, groups, size = sum(n for _, n in leaves), [[]], 0
    for i, (module, n) in enumerate(leaves):
        short = len(leaves) - i <= count - len(groups)  # one module left per fragment still to start
        if groups[-1] and len(groups) < count and (size >= total * len(groups) / count or short):
            groups.append([])
        groups[-1].append(module)
        size += n
    return [nn.ModuleList(g) for g in groups]


def model_spec(name: str, seq_len: int = 384) -> ModelSpec:
    """The model called ``name`` (a key of PARAMETERS); ``seq_len`` for the BERT ones (384 as SQuAD's)
    and the GPT ones (1024, GPT-2's context, when 384 is given)."""
    if name == "vgg16":
        return ModelSpec(name, 32, "images", _vgg16, _image_batch(224, 1000), _image_loss, lambda b: b * 110 * 2**20)
    if name == "tiny-vgg":
        return ModelSpec(name, 4, "images", _tiny_vgg, _image_batch(32, 10), _image_loss, lambda b: b * 2**20)
    if name in ("bert-large", "tiny-bert"):
        shape, seq, vocab, batch = (
            (BERT_LARGE, seq_len, 30522, 6) if name == "bert-large" else (TINY_BERT, min(seq_len, 32), 128, 2)
        )
        return ModelSpec(
            name, batch, "sequences", _bert(shape), _squad_batch(seq, vocab), _squad_loss, _bert_activations(shape, seq)
        )
    if name in ("gpt-124m", "gpt-355m", "tiny-gpt"):
        shape, seq, batch = {"gpt-124m": (GPT2_SMALL, 1024, GPT_BATCH), "gpt-355m": (GPT2_MEDIUM, 1024, GPT_BATCH)}.get(
            name, (TINY_GPT, 32, 2)
        )
        seq = seq if seq_len == 384 else min(seq_len, seq)
        return ModelSpec(
            name, batch, f"sequences of {seq} tokens", _gpt(shape), _token_batch(seq, shape.get("vocab_size", 50257)), _lm_loss,
            _gpt_activations(shape, seq),
        )  # fmt: skip
    raise ValueError(f"unknown model {name!r}: choose from {sorted(PARAMETERS)}")


def per_rank_bytes(
    model: str,
    config: str,
    mode: str,
    batch: int,
    record_batch: int,
    momentum: float,
    seq_len: int = 384,
    optimizer_on: str = "gpu-time",
) -> float:
    """Estimated peak memory of one rank while ``config`` runs on ``model`` (see the module docstring).
    device-time: the weights, their gradients and rank 0's recorded gradients (one copy in shared
    memory, mapped by every rank: counted here, once for all in :func:`refusal`); the optimizer's state
    only when its step runs."""
    weights = 4 * PARAMETERS[model]
    if mode == "real":
        copies = 2.0 + optimizer_copies(config, momentum) + STATE_COPIES[config]
        scratch = packing_scratch_bytes(model, config)
        return BASE_BYTES[model] + copies * weights + scratch + model_spec(model, seq_len).activation_bytes(batch)
    stepped = optimizer_on == "cpu" or config.startswith("JAX")  # JAX's optax update runs here
    scratch = packing_scratch_bytes(model, config)
    copies = 3.0 + optimizer_copies(config, momentum, stepped) + STATE_COPIES[config]
    return BASE_BYTES[model] + copies * weights + scratch


def recording_bytes(model: str, record_batch: int, seq_len: int = 384) -> float:
    """device-time: rank 0's peak while it records (weights, gradients, their copy, activations)."""
    weights = 4 * PARAMETERS[model]
    return BASE_BYTES[model] + 3.0 * weights + model_spec(model, seq_len).activation_bytes(record_batch)


def refusal(
    model: str,
    config: str,
    mode: str,
    batch: int,
    record_batch: int,
    momentum: float,
    ranks: int,
    budget_bytes: float,
    seq_len: int = 384,
    optimizer_on: str = "gpu-time",
) -> Optional[str]:
    """Why ``config`` on ``model`` cannot run ``ranks`` ranks on this machine within ``budget_bytes``
    (with the estimate), or None."""
    need = per_rank_bytes(model, config, mode, batch, record_batch, momentum, seq_len, optimizer_on)
    shared = 4 * PARAMETERS[model] * (ranks - 1) if mode == "device-time" else 0  # mapped once, not per rank
    total = need * ranks - shared
    if mode == "device-time":  # rank 0 records first, while the others wait
        total = max(total, recording_bytes(model, record_batch, seq_len) + (ranks - 1) * BASE_BYTES[model])
    if total <= budget_bytes:
        return None
    return (
        f"needs about {need / GIB:.1f} GiB per rank x {ranks} ranks"
        + (f" - {shared / GIB:.1f} GiB mapped by all" if shared else "")
        + f" = {total / GIB:.1f} GiB > {budget_bytes / GIB:.1f} GiB of memory budget"
    )
