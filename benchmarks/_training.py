"""The training pieces the benchmarks share: how each configuration makes a
model data-parallel (:func:`wrap`), one torch trainer per configuration
(:class:`Trainer`), the MLP of the JAX and bandwidth benchmarks in torch and
Flax (same initial weights, same batches), and the timing helpers.

Every configuration in one process trains its own copy of the model from the
same initial weights on the same batches, so configurations differ only in
how they communicate. torch and jax are imported lazily: the drivers of the
benchmark scripts import this module without them.
"""

from __future__ import annotations

import json
import os
import statistics
import time

POWERSGD_START_ITER = 2  # > 1, as torch requires with error feedback / warm start
# powerSGD_hook's callbacks issue nested allreduces from gloo's worker threads and block on them.
# With 2+ DDP buckets in flight this deadlocks with gloo's 2 default threads (seen with torch 2.13),
# and with more threads the nested allreduces of different buckets are issued in a different order
# on each rank ("collective mismatch"). So DDP+PowerSGD runs with one bucket holding all gradients.

BAGUA_ALGORITHMS = {
    "Bagua GradientAllReduce": "GradientAllReduceAlgorithm",
    "Bagua GradientAllReduce hierarchical": "GradientAllReduceAlgorithm",
    "Bagua ByteGrad": "ByteGradAlgorithm",
    "Bagua HalfGrad": "HalfGradAlgorithm",
    "Bagua Decentralized": "DecentralizedAlgorithm",
    "Bagua LowPrecisionDecentralized": "LowPrecisionDecentralizedAlgorithm",
    "Bagua Async": "AsyncModelAverageAlgorithm",
    "Bagua LocalSteps": "LocalStepsAlgorithm",
    "Bagua ByteGrad+EF": "ByteGradAlgorithm",
    "Bagua LowRank": "LowRankAlgorithm",
    "Bagua LocalSteps+8bit": "LocalStepsAlgorithm",
    "Bagua LocalAvg+8bit": "LocalStepsAlgorithm",
    "Bagua Streaming+fp4": "LocalStepsAlgorithm",
    "Bagua Streaming+topk2": "LocalStepsAlgorithm",
}
# Constructor arguments a configuration passes unless wrap()'s options give others. Bagua LowRank
# starts as DDP+PowerSGD does (rank 1 from step POWERSGD_START_ITER), not at its own defaults
# (rank 4 after 1000 steps: a throughput run of a few steps would never compress). The local-step
# configurations name their outer optimizer: DiLoCo's Nesterov SGD, or plain periodic averaging
# (post-local SGD), which does not amplify the inner steps (Nesterov 0.7/0.9 moves the weights about
# 7x the averaged pseudo-gradient once its momentum has built up).
OUTER_NESTEROV = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
OUTER_AVERAGE = {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}
PSEUDO_GRADIENT_8BIT = {"compression": "minmax_uint8", "error_feedback": True}
FIXED_OPTIONS = {
    "Bagua ByteGrad+EF": {"error_feedback": True},
    "Bagua GradientAllReduce hierarchical": {"hierarchical": True},
    "Bagua LocalSteps": OUTER_NESTEROV,
    "Bagua LocalSteps+8bit": {**OUTER_NESTEROV, **PSEUDO_GRADIENT_8BIT},
    "Bagua LocalAvg+8bit": {**OUTER_AVERAGE, **PSEUDO_GRADIENT_8BIT},
    # streaming (fragments, overlap, mixing: wrap()'s options) with 4- and 2-bit pseudo-gradients
    "Bagua Streaming+fp4": {**OUTER_NESTEROV, "compression": "fp4_e2m1", "error_feedback": True},
    "Bagua Streaming+topk2": {**OUTER_NESTEROV, "compression": "topk_uint2", "error_feedback": True},
    "Bagua LowRank": {"rank": 1, "start_iter": POWERSGD_START_ITER},
}
# A low-rank algorithm's settings under the names of wrap()'s options, and the names its
# constructor may use for them (the first one in its signature is taken).
LOW_RANK_PARAMETERS = {
    "rank": ("rank", "matrix_approximation_rank"),
    "start_iter": ("start_iter", "start_powerSGD_iter", "warmup_steps"),
}


def _algorithm_kwargs(name, options):
    """The keyword arguments of the Bagua algorithm of configuration ``name`` for wrap()'s ``options``;
    raises LookupError (why) when this checkout's algorithm lacks the class or an argument."""
    import inspect

    from bagua_torch import algorithms as A

    cls = getattr(A, BAGUA_ALGORITHMS[name], None)
    if cls is None:
        raise LookupError(f"bagua_torch.algorithms has no {BAGUA_ALGORITHMS[name]}")
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = dict(FIXED_OPTIONS.get(name, {}))
    for key, value in (options or {}).items():
        aliases = LOW_RANK_PARAMETERS.get(key, (key,)) if name == "Bagua LowRank" else (key,)
        match = next((a for a in aliases if a in accepted), None)
        if match is None:
            raise LookupError(f"{cls.__name__} takes no {key!r} (its signature: {inspect.signature(cls.__init__)})")
        kwargs[match] = value
    for key in kwargs:
        if key not in accepted:
            raise LookupError(f"{cls.__name__} takes no {key!r} (its signature: {inspect.signature(cls.__init__)})")
    return cls, kwargs


def unavailable_reason(name, options=None):
    """Why configuration ``name`` cannot run with ``options`` in this checkout (its Bagua algorithm, or
    one of its arguments, is missing), or None when it can."""
    if name.endswith(OVERLAP):
        import inspect

        import bagua_torch

        if "overlap_optimizer" not in inspect.signature(bagua_torch.distributed.with_bagua).parameters:
            return "with_bagua takes no overlap_optimizer"
        name = name[: -len(OVERLAP)]
    if name not in BAGUA_ALGORITHMS:
        return None
    try:
        _algorithm_kwargs(name, options)
    except LookupError as e:
        return str(e)
    return None


ONE_LANE = " 1 lane"
OVERLAP = " overlap"  # with_bagua(..., overlap_optimizer=True): the optimizer steps bucket by bucket


def wrap(name, model, opt, options=None):
    """Makes ``model`` data-parallel with configuration ``name``; returns (module to call, close).

    Names: ``DDP``, ``DDP+fp16``, ``DDP+PowerSGD``, ``no communication``, ``Bagua QAdam`` (``opt``
    must be a QAdamOptimizer), ``Bagua GradientAllReduce 25MiB`` and the keys of BAGUA_ALGORITHMS;
    a Bagua name ending in " 1 lane" builds its engine with one lane (``BAGUA_ENGINE_LANES=1``)
    instead of the default two, so both run side by side; one ending in " overlap" (before any
    " 1 lane") wraps with ``overlap_optimizer=True`` (gradient algorithms).

    ``options``: for the DDP names ``gradient_as_bucket_view`` (default False, as DDP's), and for
    DDP+PowerSGD ``rank`` and ``start_iter`` (default 1 and POWERSGD_START_ITER);
    for a Bagua algorithm, its constructor's keyword arguments (Bagua LowRank: ``rank`` and
    ``start_iter``, under whichever name its signature uses, see LOW_RANK_PARAMETERS)."""
    if name.endswith(ONE_LANE):
        saved = os.environ.get("BAGUA_ENGINE_LANES")
        os.environ["BAGUA_ENGINE_LANES"] = "1"  # read once, when the model is wrapped
        try:
            return wrap(name[: -len(ONE_LANE)], model, opt, options)
        finally:
            if saved is None:
                del os.environ["BAGUA_ENGINE_LANES"]
            else:
                os.environ["BAGUA_ENGINE_LANES"] = saved
    overlap = name.startswith("Bagua") and name.endswith(OVERLAP)
    if overlap:
        name = name[: -len(OVERLAP)]
    if name == "no communication":
        return model, lambda: None
    if name.startswith("DDP"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        options = dict(options or {})
        as_view = {"gradient_as_bucket_view": bool(options.pop("gradient_as_bucket_view", False))}
        if name == "DDP+PowerSGD":
            grad_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
            # one bucket (an explicit cap also sizes the first)
            ddp = DDP(model, bucket_cap_mb=int(grad_mib) + 1, **as_view)
        else:
            ddp = DDP(model, **as_view)  # defaults: a 1 MiB first bucket, then 25 MiB
        if name == "DDP+fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
        elif name == "DDP+PowerSGD":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=options.get("rank", 1),
                start_powerSGD_iter=options.get("start_iter", POWERSGD_START_ITER),
            )
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp, lambda: None
    from bagua_torch import algorithms as A

    if name == "Bagua GradientAllReduce 25MiB":
        import bagua_torch

        ddp = bagua_torch.DistributedDataParallel(
            model,
            optimizers=[opt],
            algorithm=A.GradientAllReduceAlgorithm(),
            bucket_cap_mb=25,
            **({"overlap_optimizer": True} if overlap else {}),
        )
        return ddp, ddp.close
    if name == "Bagua QAdam":
        algorithm = A.QAdamAlgorithm(opt)
    else:
        try:
            cls, kwargs = _algorithm_kwargs(name, options)
        except LookupError as e:
            raise ValueError(f"{name}: {e}") from None
        algorithm = cls(**kwargs)
    model = model.with_bagua([opt], algorithm, **({"overlap_optimizer": True} if overlap else {}))
    if name == "Bagua Async":

        def close():
            algorithm.abort(model)  # every rank: the loop's last round, then it stops
            model.bagua_ddp.close()

        return model, close
    return model, model.bagua_ddp.close


def start_worker(timeout_s, bagua=True):
    """A benchmark worker's start: one torch thread (one process per core), torch's gloo group (its
    store on MASTER_PORT) and, with ``bagua``, Bagua's (its store on MASTER_PORT + 1). A collective
    stuck for ``timeout_s`` seconds raises instead of hanging. Returns (rank, world size, ``say``:
    print on rank 0 only)."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    if bagua:
        import bagua_torch

        bagua_torch.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    return rank, world, say


class Trainer:
    """One torch configuration: its own model from ``make_model()`` (the same initial weights for
    every configuration), optimizer and position in ``batches`` (a list of (x, y) tensors).

    SGD with momentum (lr 0.01, momentum 0.9 unless given); QAdam: QAdamOptimizer (Adam, lr 1e-3,
    eps 1e-3) warming up for ``warmup`` steps. ``options`` go to :func:`wrap`."""

    def __init__(self, name, make_model, batches, warmup, momentum=0.9, options=None):
        import torch

        self.name, self.batches, self.i = name, batches, 0
        torch.manual_seed(0)  # the same initial weights for every configuration (Bagua broadcasts rank 0's anyway)
        model = make_model()
        if name.removesuffix(ONE_LANE).removesuffix(OVERLAP) == "Bagua QAdam":
            from bagua_torch.algorithms import QAdamOptimizer

            # eps bounds m / sqrt(v) where the (short) warm-up left a tiny second moment
            self.opt = QAdamOptimizer(model.parameters(), lr=1e-3, warmup_steps=max(1, warmup), eps=1e-3)
        else:
            self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
        self.net, self.close = wrap(name, model, self.opt, options)
        self.loss = float("nan")

    def steps(self, n):
        import torch.nn.functional as F

        for _ in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            loss = F.cross_entropy(self.net(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        if n:
            self.loss = loss.item()


# ---------------------------------------------------------------- the MLP ---


def mlp_initial_weights(features, hidden, classes):
    """[w0, b0, w1, b1, w2, b2] of the MLP features -> hidden -> hidden -> classes, torch's
    (out, in) layout, numpy float32: the same in every configuration and framework."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for fan_in, fan_out in ((features, hidden), (hidden, hidden), (hidden, classes)):
        bound = 1.0 / np.sqrt(fan_in)
        out += [
            rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
            rng.uniform(-bound, bound, (fan_out,)).astype(np.float32),
        ]
    return out


def mlp_parameters(features, hidden, classes):
    return (features + 1) * hidden + (hidden + 1) * hidden + (hidden + 1) * classes


def mlp_batches(rank, batch_size, features, classes, n=8):
    """A few fixed synthetic (x float32, y int32) numpy batches per rank, cycled by the trainers."""
    import numpy as np

    rng = np.random.default_rng(100 + rank)
    return [
        (
            rng.standard_normal((batch_size, features)).astype(np.float32),
            rng.integers(0, classes, batch_size).astype(np.int32),
        )
        for _ in range(n)
    ]


def torch_batches(batches):
    """The numpy batches of :func:`mlp_batches` as torch tensors (labels int64)."""
    import torch

    return [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in batches]


def torch_mlp(features, hidden, classes):
    """The MLP as a torch ``nn.Sequential`` with :func:`mlp_initial_weights`."""
    import torch

    layers = [
        torch.nn.Linear(features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    ]
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for p, w in zip(model.parameters(), mlp_initial_weights(features, hidden, classes)):
            p.copy_(torch.from_numpy(w))
    return model


class JaxTrainer:
    """The MLP in Flax, trained with the optax transformation ``tx`` under ``jax.jit`` on numpy
    ``batches``; with ``mesh``, data parallel over JAX's own collectives."""

    def __init__(self, name, features, hidden, classes, batches, tx, mesh=None):
        import jax
        import jax.numpy as jnp
        import optax
        from flax import linen as nn

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                x = nn.relu(nn.Dense(hidden)(x))
                x = nn.relu(nn.Dense(hidden)(x))
                return nn.Dense(classes)(x)

        self.name, self.i, self.loss = name, 0, float("nan")
        model = MLP()
        w = mlp_initial_weights(features, hidden, classes)
        params = {
            "params": {
                f"Dense_{k}": {"kernel": jnp.asarray(w[2 * k].T), "bias": jnp.asarray(w[2 * k + 1])} for k in range(3)
            }
        }

        def loss_fn(p, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        def step(p, s, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
            updates, s = tx.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss

        if mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec as P

            replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
            params = jax.device_put(params, replicated)
            self.batches = [
                (jax.make_array_from_process_local_data(sharded, x), jax.make_array_from_process_local_data(sharded, y))
                for x, y in batches
            ]
            self.step = jax.jit(step, out_shardings=(replicated, replicated, replicated))
        else:
            self.batches = batches
            self.step = jax.jit(step)
        self.params, self.state = params, tx.init(params)

    def steps(self, n):
        for _ in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.params, self.state, loss = self.step(self.params, self.state, x, y)
        if n:
            self.loss = float(loss)  # waits for the step

    def close(self):
        pass


# ---------------------------------------------------------------- timing ---


def timed_steps(trainer, n, barrier):
    """Seconds for ``n`` steps of ``trainer``, all ranks starting and ending together (``barrier()``)."""
    barrier()
    t0 = time.perf_counter()
    trainer.steps(n)
    barrier()
    return time.perf_counter() - t0


def interleaved_rounds(trainers, warmup, rounds, steps, samples, barrier):
    """{trainer name: samples/s per round}: every trainer ``warmup`` untimed
    steps, then ``rounds`` rounds of ``steps`` timed steps each (``samples``
    samples in all ranks' steps), the order reversed every other round so no
    configuration always follows the same one."""
    for t in trainers:
        t.steps(warmup)
    per_round = {t.name: [] for t in trainers}
    for r in range(rounds):
        for t in trainers if r % 2 == 0 else trainers[::-1]:
            per_round[t.name].append(samples / timed_steps(t, steps, barrier))
    return per_round


def timed_async_window(trainer, min_steps, barrier, all_agree):
    """Asynchronous model average's timed window: ``(steps, seconds)``, the same steps on every rank.

    Its background loop runs only inside the window (``resume`` first, ``abort`` after, untimed):
    left running, its rounds, which the weight lock keeps out of its own steps, would land in the
    other configurations' windows and slow them instead. The window lasts until at least
    ``min_steps`` steps ran and one averaging round has completed on every rank since it began (a
    pause of ``sync_interval_ms`` and its round: one period of the loop's steady state), so it holds
    the cost of its averaging. After each step the ranks agree whether to go on
    (``all_agree(flag)``: true when true on every rank), so, as in a window of :func:`timed_steps`,
    every step ends in a synchronisation of the ranks."""
    ddp = trainer.net.bagua_ddp
    ddp.impl.resume()
    barrier()
    t0 = time.perf_counter()
    start, n = ddp.averager.rounds, 0
    while True:
        trainer.steps(1)
        n += 1
        if all_agree(n >= min_steps and ddp.averager.rounds > start):
            break
    seconds = time.perf_counter() - t0
    ddp.impl.abort()
    return n, seconds


def finish(rank, json_path, doc) -> int:
    """The end of a torch.distributed benchmark worker: rank 0 writes ``doc``
    to ``json_path`` (when given), then every rank meets the others and tears
    the process group down. Returns the worker's exit status (0)."""
    import torch.distributed as dist

    if rank == 0 and json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def quartiles(xs):
    """(25th percentile, median, 75th percentile)."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    return q1, q2, q3


def parse_configs(parser, text, known, baseline):
    """``--configs`` ("a,b,..."): each must be in ``known`` (a Bagua one may end in
    " overlap" and then " 1 lane", see :func:`wrap`), and ``baseline`` (what the ratios divide by) must be
    among them; errors through ``parser``."""
    configs = tuple(c.strip() for c in text.split(",") if c.strip())

    def is_known(c):
        base = c[: -len(ONE_LANE)] if c.endswith(ONE_LANE) else c
        if base not in known and base.endswith(OVERLAP):
            base = base[: -len(OVERLAP)]
        return base in known and (base == c or base.startswith("Bagua") and base != "Bagua Async")

    unknown = [c for c in configs if not is_known(c)]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; choose from {list(known)}")
    if baseline not in configs:
        parser.error(f"{baseline!r} is the baseline of the ratios and must be measured")
    return configs
