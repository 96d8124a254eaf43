"""The problem both frontends train in ``bagua-compare``: an MLP's initial
weights and every rank's batches, drawn with numpy from fixed seeds, so the
torch and JAX runs start identical and see identical data, in ``dtype``
(float32, or float64: the same values, drawn in float32, held in float64).

Weights are listed in torch's ``named_parameters()`` order with torch's
layouts (a linear layer's weight is ``(out, in)``): the JAX worker keeps the
same list, so both frontends lay out the same buckets.
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

import numpy as np

DTYPES = ("float32", "float64")

# Configurations compared besides each algorithm with its defaults:
# name -> (registered algorithm name, hyperparameters)
VARIANTS = {
    "bytegrad_error_feedback": ("bytegrad", {"error_feedback": True}),
    "local_steps_compressed": ("local_steps", {"compression": "minmax_uint8", "error_feedback": True}),
    "local_steps_fp4": ("local_steps", {"compression": "fp4_e2m1", "error_feedback": True}),
    "local_steps_topk": ("local_steps", {"compression": "topk_uint2", "error_feedback": True}),
    # streaming: 4 fragments at staggered steps, each exchange landing a step later, mixed half and half
    "local_steps_streaming": (
        "local_steps",
        {"num_fragments": 4, "overlap_steps": 1, "mixing": 0.5, "compression": "fp4_e2m1", "error_feedback": True},
    ),
}


def configurations() -> List[str]:
    """What ``--algorithm`` accepts: every registered algorithm, then the variants."""
    from bagua_core.algorithms import names

    return list(names()) + list(VARIANTS)


def algorithm_of(configuration: str) -> Tuple[str, dict]:
    """(registered algorithm name, hyperparameters) of a configuration."""
    name, hyperparameters = VARIANTS.get(configuration, (configuration, {}))
    return name, dict(hyperparameters)


@dataclasses.dataclass(frozen=True)
class Problem:
    features: int = 32
    hidden: int = 128
    classes: int = 8
    batch_size: int = 32  # per rank
    steps: int = 50
    lr: float = 0.05
    seed: int = 0
    # algorithms that bring their own optimizer (QAdam: Adam's learning rate, warm-up);
    # warmup_steps is asynchronous model average's warm-up too, and low rank's start_iter
    adam_lr: float = 0.005
    warmup_steps: int = 10
    # asynchronous model average: averages after every this many steps past the
    # warm-up, triggered by abort() + resume() with a timer that never fires, so
    # both frontends average at the same steps; 0: the timer (sync_interval_ms
    # default), whose rounds fall at wall-clock times
    async_average_every: int = 5
    dtype: str = "float32"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.async_average_every < 0:
            raise ValueError(f"async_average_every must be >= 0, got {self.async_average_every}")

    def async_sync_interval_ms(self):
        """AsyncModelAverage's sync_interval_ms: None (its default) for the
        timer, else a day: no timed round within a comparison."""
        return None if self.async_average_every == 0 else 24 * 3600 * 1000

    def averages_after(self, step: int) -> bool:
        """Whether asynchronous model average averages (abort + resume) after
        0-based training step ``step``."""
        k = self.async_average_every
        return k > 0 and step + 1 > self.warmup_steps and (step + 1 - self.warmup_steps) % k == 0

    @property
    def sizes(self) -> List[Tuple[int, int]]:
        """(in, out) of each linear layer; ReLU between them."""
        return [(self.features, self.hidden), (self.hidden, self.hidden), (self.hidden, self.classes)]

    def initial_weights(self) -> List[np.ndarray]:
        """[w0, b0, w1, b1, ...] in ``dtype``, w of shape (out, in) (torch's default init)."""
        rng = np.random.default_rng(self.seed)
        out = []
        for fan_in, fan_out in self.sizes:
            bound = 1.0 / np.sqrt(fan_in)
            out.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32).astype(self.dtype))
            out.append(rng.uniform(-bound, bound, (fan_out,)).astype(np.float32).astype(self.dtype))
        return out

    def batch(self, step: int, rank: int) -> Tuple[np.ndarray, np.ndarray]:
        """Rank ``rank``'s batch at ``step``: overlapping Gaussian clusters."""
        centres = np.random.default_rng(self.seed + 1234).standard_normal((self.classes, self.features)) * 0.5
        rng = np.random.default_rng([self.seed, step, rank])
        y = rng.integers(0, self.classes, self.batch_size)
        x = centres[y] + rng.standard_normal((self.batch_size, self.features))
        return x.astype(np.float32).astype(self.dtype), y.astype(np.int64)

    def to_args(self) -> List[str]:
        return [f"--{f.name.replace('_', '-')}={getattr(self, f.name)}" for f in dataclasses.fields(self)]

    @classmethod
    def add_args(cls, parser) -> None:
        for f in dataclasses.fields(cls):
            choices = DTYPES if f.name == "dtype" else None
            parser.add_argument(
                f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default, choices=choices
            )

    @classmethod
    def from_args(cls, args) -> "Problem":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def worker_arguments(argv=None):
    """Parses a worker's command line: the problem, ``--algorithm`` (one
    configuration or several, comma-separated, trained in turn) and ``--out``;
    ``args.algorithm`` becomes the list."""
    import argparse

    p = argparse.ArgumentParser(description="a bagua-compare worker")
    p.add_argument("--algorithm", required=True, help="configurations, comma-separated")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    Problem.add_args(p)
    args = p.parse_args(argv)
    args.algorithm = args.algorithm.split(",")
    return args, Problem.from_args(args)


def result(framework: str, algorithm: str, world: int, losses, step_times) -> dict:
    """One configuration's run, as rank 0 of a worker run hands it back to the tool."""
    return {
        "framework": framework,
        "algorithm": algorithm,
        "world_size": world,
        "losses": [float(v) for v in losses],
        "step_times_s": [float(t) for t in step_times],
    }


def train_each(args, problem, group, train) -> None:
    """Trains every configuration of ``args.algorithm`` in turn in this one
    launch (the processes start and join once), ``train(name, problem,
    group)`` each, and on rank 0 writes what the tool reads back:
    configuration -> :func:`result`."""
    import json

    results = {}
    for name in args.algorithm:
        if group.rank == 0:
            print(f"compare_worker: {name}", flush=True)  # names the configuration of a failure
        results[name] = train(name, problem, group)
    if group.rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
