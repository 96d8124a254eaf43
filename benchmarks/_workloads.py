"""Learnable synthetic tasks with a held-out validation set, CPU-sized, for the time-to-accuracy
benchmark: an MLP on a teacher network's labels, a small CNN on noisy shifted class templates, a
small causal transformer language model on an order-2 Markov corpus (token-level accuracy).

The data depend only on the workload (generated with numpy from a fixed seed, the same on every
rank); a run's seed sets the initial weights and the order of the training samples
(:meth:`Workload.batch`), so all configurations run with one seed see the same weights and the same
batches, and the global batch of a step is the same whatever the world size. Two sizes: "full"
(the benchmark's) and "tiny" (smoke runs). torch is imported lazily.
"""

from __future__ import annotations

import numpy as np

WORKLOADS = ("mlp", "cnn", "lm")
DATA_SEED = 1234

SIZES = {
    "full": {
        "mlp": dict(features=128, hidden=1024, classes=10, teacher=16, train=32768, val=2048, batch=64),
        "cnn": dict(image=16, channels=(32, 64), fc=128, classes=10, train=8192, val=1024, batch=64),
        "lm": dict(vocab=32, seq=32, d=128, heads=4, layers=2, ff=256, train=4096, val=256, batch=32),
    },
    "tiny": {
        "mlp": dict(features=16, hidden=32, classes=4, teacher=8, train=512, val=128, batch=16),
        "cnn": dict(image=8, channels=(4, 8), fc=16, classes=4, train=256, val=64, batch=16),
        "lm": dict(vocab=8, seq=8, d=16, heads=2, layers=1, ff=32, train=256, val=32, batch=16),
    },
}


class Workload:
    """A task: ``make_model()`` (call after seeding torch), ``batch(step, seed, rank, world)``,
    ``loss(out, y)`` and ``evaluate(model, rank, world)`` (this rank's share of the validation set:
    (correct, total), to be summed over ranks). ``batch`` is the global batch (a multiple of the
    world size); ``parameters`` the model's size."""

    metric = "validation accuracy"

    def __init__(self, name, size, train, val):
        import torch

        self.name, self.size = name, size
        self.batch_size = size["batch"]
        self.train = tuple(torch.from_numpy(a) for a in train)
        self.val = tuple(torch.from_numpy(a) for a in val)
        self._perms = {}

    def batch(self, step, seed, rank, world):
        """Rank ``rank``'s share of global batch ``step``: epochs of a permutation drawn from ``seed``."""
        n = len(self.train[1])
        per_epoch = n // self.batch_size
        epoch, k = divmod(step, per_epoch)
        key = (seed, epoch)
        if key not in self._perms:
            self._perms = {key: np.random.default_rng([seed, epoch]).permutation(n)}
        b = self.batch_size // world
        idx = self._perms[key][k * self.batch_size + rank * b : k * self.batch_size + (rank + 1) * b]
        return self.train[0][idx], self.train[1][idx]

    def loss(self, out, y):
        import torch.nn.functional as F

        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def evaluate(self, model, rank, world, chunk=512):
        import torch

        x, y = self.val
        lo, hi = rank * len(y) // world, (rank + 1) * len(y) // world
        correct = 0
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for i in range(lo, hi, chunk):
                j = min(hi, i + chunk)
                correct += int((model(x[i:j]).argmax(-1) == y[i:j]).sum())
        model.train(was_training)
        return correct, int(y[lo:hi].numel())

    @property
    def parameters(self):
        import torch

        torch.manual_seed(0)
        return sum(p.numel() for p in self.make_model().parameters())


class TeacherMLP(Workload):
    """Gaussian inputs labelled by a random one-hidden-layer tanh network; a ReLU MLP
    features -> hidden -> hidden -> classes learns them."""

    def __init__(self, size):
        rng = np.random.default_rng(DATA_SEED)
        w1 = rng.standard_normal((size["features"], size["teacher"])) / np.sqrt(size["features"])
        w2 = rng.standard_normal((size["teacher"], size["classes"]))

        def sample(n):
            x = rng.standard_normal((n, size["features"])).astype(np.float32)
            return x, np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int64)

        super().__init__("mlp", size, sample(size["train"]), sample(size["val"]))

    def make_model(self):
        import torch.nn as nn

        s = self.size
        return nn.Sequential(
            nn.Linear(s["features"], s["hidden"]),
            nn.ReLU(),
            nn.Linear(s["hidden"], s["hidden"]),
            nn.ReLU(),
            nn.Linear(s["hidden"], s["classes"]),
        )


class Templates(Workload):
    """3-channel images: each class a smooth random pattern, drawn circularly shifted by up to a
    quarter of the image, scaled and with noise; a two-conv-layer CNN learns them."""

    def __init__(self, size):
        rng = np.random.default_rng(DATA_SEED)
        side, classes = size["image"], size["classes"]
        grid = np.arange(side) * 2 * np.pi / side
        templates = np.zeros((classes, 3, side, side))
        for c in range(classes):
            for _ in range(4):
                fy, fx = rng.integers(1, 4, 2)
                phase = rng.uniform(0, 2 * np.pi, 3)
                templates[c] += np.sin(fy * grid[:, None] + fx * grid[None, :] + phase[:, None, None])
        templates /= templates.std(axis=(1, 2, 3), keepdims=True)

        def sample(n):
            y = rng.integers(0, classes, n)
            shift = rng.integers(-side // 4, side // 4 + 1, (n, 2))
            x = np.stack([np.roll(templates[c], tuple(s), axis=(1, 2)) for c, s in zip(y, shift)])
            x = x * rng.uniform(0.5, 1.5, (n, 1, 1, 1)) + rng.standard_normal(x.shape) * 3.0
            return x.astype(np.float32), y.astype(np.int64)

        super().__init__("cnn", size, sample(size["train"]), sample(size["val"]))

    def make_model(self):
        import torch.nn as nn

        s = self.size
        c1, c2 = s["channels"]
        return nn.Sequential(
            nn.Conv2d(3, c1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * (s["image"] // 4) ** 2, s["fc"]),
            nn.ReLU(),
            nn.Linear(s["fc"], s["classes"]),
        )


class MarkovLM(Workload):
    """Sequences from an order-2 Markov chain (every pair of tokens has three possible successors,
    with random probabilities); a causal transformer predicts each next token. The metric is the
    token-level accuracy of those predictions on held-out sequences (the chain's own best guess
    bounds it below 100%)."""

    metric = "validation token accuracy"

    def __init__(self, size):
        rng = np.random.default_rng(DATA_SEED)
        v, length = size["vocab"], size["seq"] + 1
        successors = rng.integers(0, v, (v, v, 3))
        probs = rng.dirichlet(np.full(3, 0.5), (v, v))

        def sample(n):
            seqs = np.zeros((n, length), dtype=np.int64)
            seqs[:, :2] = rng.integers(0, v, (n, 2))
            for t in range(2, length):
                a, b = seqs[:, t - 2], seqs[:, t - 1]
                pick = (rng.random(n)[:, None] > probs[a, b].cumsum(-1)).sum(-1).clip(max=2)
                seqs[:, t] = successors[a, b, pick]
            return seqs[:, :-1].copy(), seqs[:, 1:].copy()

        super().__init__("lm", size, sample(size["train"]), sample(size["val"]))

    def make_model(self):
        return _CausalTransformer(**{k: self.size[k] for k in ("vocab", "seq", "d", "heads", "layers", "ff")})


def _CausalTransformer(vocab, seq, d, heads, layers, ff):
    import torch
    import torch.nn as nn

    class CausalTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.position = nn.Parameter(torch.randn(seq, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)
            # A plain attribute, not a buffer: DDP would broadcast a buffer every step.
            self.mask = nn.Transformer.generate_square_subsequent_mask(seq)

        def forward(self, x):
            n = x.shape[1]
            h = self.blocks(self.embed(x) + self.position[:n], mask=self.mask[:n, :n], is_causal=True)
            return self.head(self.norm(h))

    return CausalTransformer()


def make(name, size="full"):
    """The workload ``name`` (one of WORKLOADS) at ``size`` ("full" or "tiny")."""
    cls = {"mlp": TeacherMLP, "cnn": Templates, "lm": MarkovLM}[name]
    return cls(SIZES[size][name])
