"""A GPU's compute replayed on a CPU: real gradients made ready on a GPU's per-layer timeline, so that
a 2-core machine trains like a GPU node, where compute is fast and the link is the bottleneck.

    rec = record(model, forward_loss, batch_scale)   # one real forward and backward on the CPU
    times = timeline(rec, load_profile("a100"))      # per-layer seconds on that GPU
    net = ReplayNet(model, rec, times)               # same parameters, same names ("model." prefix)
    loss = net(); loss.backward()                    # sleeps forward, then each layer's backward,
                                                     # handing each layer its recorded gradients

What :func:`record` keeps, from one real step on the CPU: the model's *layers* (the modules that own
parameters directly), the order in which backward made their gradients ready, the gradients
themselves (float32, as the parameters), and the FLOPs of each layer's forward and backward counted
by ``torch.utils.flop_counter`` (scaled by ``batch_scale``: a small batch can be recorded for a large
one, FLOPs being linear in the batch).

What :func:`timeline` makes of it: the step's FLOPs at the profile's rate (``peak_tflops`` x ``mfu``),
split over the layers in proportion to their FLOPs (FLOPs outside any layer, such as attention's
matrix products, are spread the same way). A profile is a JSON file in ``benchmarks/gpu_profiles/``
(or a path): a published peak with its source, and the model-FLOP utilisation assumed.

What :class:`ReplayNet` does each step: ``forward()`` sleeps the forward time and builds a chain of
one autograd node per layer; ``backward()`` walks the chain in the recorded order, each node waiting
until its layer's deadline on the timeline (``t0`` + the layers' backward times so far) and then
returning that layer's recorded gradients. So torch's ``AccumulateGrad`` runs for every parameter at
the time a GPU would have made its gradient ready, and every wrapper that hooks it (DDP's reducer,
Bagua's buckets, Horovod's hooks) starts its communication then, on real tensors, through its real
engine. Nothing about communication is simulated. Accumulating a gradient into ``.grad`` is real CPU
work (a memory pass) that a GPU would do in microseconds: a deadline already passed is not waited for,
so that cost shows in the measured step and in the ``no communication`` floor, not in the timeline.

:func:`gpu_timed_step` does the same for the optimizer: its step becomes a wait of the time the GPU
takes to read and write the optimizer's tensors at the profile's memory bandwidth (a memory-bound
elementwise update), and the weights do not move. The gradients replayed do not depend on the weights,
so what travels is unchanged for gradient algorithms; weight algorithms then exchange weights that do
not change (the same bytes, the same kernels: compressing a constant costs as much as any other).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Dict, List

PROFILES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_profiles")
_PROFILE_FIELDS = {"name": str, "device": str, "peak_tflops": (int, float), "mfu": (int, float), "source": str}


def profile_names() -> List[str]:
    """The profiles shipped in ``benchmarks/gpu_profiles/`` (file names without ``.json``)."""
    return sorted(f[:-5] for f in os.listdir(PROFILES_DIR) if f.endswith(".json"))


def load_profile(name_or_path: str, mfu: float = None) -> dict:
    """A GPU profile by name (``a100``) or path; ``mfu`` overrides the file's utilisation. Raises
    ValueError saying what is wrong (unknown name, not JSON, a field missing or out of range)."""
    path = name_or_path if os.sep in name_or_path or name_or_path.endswith(".json") else None
    if path is None:
        if name_or_path not in profile_names():
            raise ValueError(f"unknown GPU profile {name_or_path!r}: choose from {profile_names()} or give a path")
        path = os.path.join(PROFILES_DIR, name_or_path + ".json")
    try:
        with open(path) as f:
            profile = json.load(f)
    except OSError as e:
        raise ValueError(f"GPU profile {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"GPU profile {path} does not parse as JSON: {e}") from None
    if not isinstance(profile, dict):
        raise ValueError(f"GPU profile {path}: expected a JSON object with {sorted(_PROFILE_FIELDS)}")
    for key, kind in _PROFILE_FIELDS.items():
        if not isinstance(profile.get(key), kind) or isinstance(profile.get(key), bool):
            raise ValueError(
                f"GPU profile {path}: field {key!r} missing or not a {getattr(kind, '__name__', 'number')}"
            )
    if mfu is not None:
        profile = {**profile, "mfu": mfu, "mfu_overridden": True}
    if not profile["peak_tflops"] > 0 or not 0 < profile["mfu"] <= 1:
        raise ValueError(f"GPU profile {path}: peak_tflops must be > 0 and mfu in (0, 1]")
    return profile


@dataclasses.dataclass
class Layer:
    name: str  # the module's name in the model
    params: List[str]  # its parameters' full names, in the module's order
    forward_flops: float
    backward_flops: float


@dataclasses.dataclass
class Recording:
    layers: List[Layer]  # in the order backward made them ready
    grads: Dict[str, object]  # parameter name -> recorded gradient (a torch tensor)
    forward_flops: float  # the whole step's, layers or not (scaled to the replayed batch)
    backward_flops: float
    cpu_seconds: float  # the recorded forward and backward on this CPU (at the recorded batch)


def record(model, forward_loss: Callable, batch_scale: float = 1.0) -> Recording:
    """One real forward and backward of ``model`` (``forward_loss(model)`` returns the loss) on the
    CPU: the layers in the order their gradients became ready, the gradients, and the FLOPs of the
    step at ``batch_scale`` times the recorded batch. Leaves the model's ``.grad`` as None."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    owners, seen = {}, set()  # module name -> its own parameters; a shared one (tied weights) is its first module's
    for n, m in model.named_modules():
        own = [(pn, p) for pn, p in m.named_parameters(recurse=False) if id(p) not in seen]
        if own:
            owners[n] = own
            seen.update(id(p) for _, p in own)
    root = type(model).__name__
    ready: List[str] = []
    handles = [
        p.register_post_accumulate_grad_hook(lambda p, n=n: ready.append(n))
        for n, own in owners.items()
        for _, p in own
    ]
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as fwd:
            forward_loss(model)
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with FlopCounterMode(display=False) as both:
            forward_loss(model).backward()
        cpu_seconds = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()

    def flops(counter, name):
        return float(sum(counter.get_flop_counts().get(f"{root}.{name}" if name else root, {}).values()))

    layers = []
    for name in dict.fromkeys(ready):  # first readiness of any of the module's parameters
        f, fb = flops(fwd, name), flops(both, name)
        params = [f"{name}.{pn}" if name else pn for pn, _ in owners[name]]
        layers.append(Layer(name, params, f * batch_scale, max(0.0, fb - f) * batch_scale))
    missing = [n for n in owners if n not in ready]
    if missing:
        raise ValueError(f"record: backward gave no gradient to the parameters of {missing}")
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    total_fwd, total = flops(fwd, ""), flops(both, "")
    return Recording(layers, grads, total_fwd * batch_scale, (total - total_fwd) * batch_scale, cpu_seconds)


def timeline(rec: Recording, profile: dict) -> List[tuple]:
    """(forward seconds, backward seconds) of each layer of ``rec`` on the GPU of ``profile``."""
    rate = profile["peak_tflops"] * 1e12 * profile["mfu"]
    fwd_total, bwd_total = rec.forward_flops / rate, rec.backward_flops / rate
    f_sum = sum(layer.forward_flops for layer in rec.layers) or 1.0
    b_sum = sum(layer.backward_flops for layer in rec.layers) or 1.0
    return [(fwd_total * layer.forward_flops / f_sum, bwd_total * layer.backward_flops / b_sum) for layer in rec.layers]


# float32 copies of the weights an optimizer step reads and writes: SGD reads the weights and the
# gradients and writes the weights, momentum adds one read and one write, Adam two of each.
OPTIMIZER_PASSES = {"sgd": 3, "sgd-momentum": 5, "adam": 7}


def optimizer_gpu_seconds(profile: dict, parameters: int, kind: str) -> float:
    """Seconds of a ``kind`` optimizer step (a key of OPTIMIZER_PASSES) over ``parameters`` float32
    weights at the profile's memory bandwidth."""
    return OPTIMIZER_PASSES[kind] * 4 * parameters / (profile["hbm_gbytes_per_s"] * 1e9)


def gpu_timed_step(optimizer, seconds: float) -> None:
    """Makes ``optimizer.step()`` wait ``seconds`` instead of updating the weights. Call it before a
    wrapper takes the optimizer's step (Bagua keeps the step it finds and calls it). The optimizer's
    step hooks still run around the wait (torchft's DiLoCo synchronises in one); torch keeps them in
    private dicts, read here only."""

    def step(*args, **kwargs):
        for hook in optimizer._optimizer_step_pre_hooks.values():
            hook(optimizer, args, kwargs)
        _sleep_until(time.perf_counter() + seconds)
        for hook in optimizer._optimizer_step_post_hooks.values():
            hook(optimizer, args, kwargs)

    optimizer.step = step


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


def _replay_function():
    import torch

    class ReplayLayer(torch.autograd.Function):
        """Forward: passes ``x`` on. Backward: waits for the layer's deadline, then returns its
        recorded gradients for its parameters (torch accumulates them into ``.grad``)."""

        @staticmethod
        def forward(ctx, x, net, k, *params):
            ctx.net, ctx.k = net, k
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            net, k = ctx.net, ctx.k
            if net._t0 is None:  # the first node backward reaches: the backward's start
                net._t0 = time.perf_counter()
            _sleep_until(net._t0 + net._deadlines[k])
            return (g, None, None, *net._layer_grads[k])

    return ReplayLayer


class _Lazy:
    cls = None


def ReplayNet(model, rec: Recording, times: List[tuple]):
    """A ``torch.nn.Module`` holding ``model`` (so its parameters, as ``model.<name>``) whose forward
    replays the step of ``rec`` on ``times`` (see the module's docstring); call it with no input, or
    with anything (ignored), and call ``.backward()`` on what it returns (a scalar)."""
    import torch

    if _Lazy.cls is None:
        replay_layer = _replay_function()

        class _ReplayNet(torch.nn.Module):
            def __init__(self, model, rec, times):
                super().__init__()
                self.model = model
                named = dict(model.named_parameters())
                self._layers = [[named[n] for n in layer.params] for layer in rec.layers]
                self._layer_grads = [[rec.grads[n] for n in layer.params] for layer in rec.layers]
                self._forward_seconds = sum(t[0] for t in times)
                backward = [t[1] for t in times]
                self._deadlines = [sum(backward[: k + 1]) for k in range(len(backward))]
                self.compute_seconds = self._forward_seconds + self._deadlines[-1] if backward else 0.0
                self._t0 = None

            def forward(self, *_ignored):
                _sleep_until(time.perf_counter() + self._forward_seconds)
                self._t0 = None
                x = torch.zeros(1, requires_grad=False)
                # built last-ready first, so backward meets the layers in the recorded order
                for k in reversed(range(len(self._layers))):
                    x = replay_layer.apply(x, self, k, *self._layers[k])
                return x.sum()

        _Lazy.cls = _ReplayNet
    return _Lazy.cls(model, rec, times)
