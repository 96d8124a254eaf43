"""VGG16 in Flax, trained through ``bagua_jax.transform`` for the seed-scale benchmark:

    model = flax_vgg16()                  # torchvision's VGG16 layout, NHWC, 3x224x224 -> 1000 classes
    t = JaxReplayTrainer("JAX ByteGrad", "ByteGradAlgorithm", "device-time", load_profile("a100"),
                         batch_size=32, record_batch=1, rank=rank, tiny=False)
    t.steps(10)                           # returns when the last step's result is ready
    t.compute_seconds, t.loss; t.close()

The optimizer is ``optax.chain(bagua_jax.transform(algorithm), optax.sgd(lr, momentum))`` (a weight
algorithm, such as Decentralized, goes after the optimizer instead), jitted, with the same initial
weights on every rank (seed 0) and synthetic data drawn with numpy from the rank.

Two modes:

* ``"real"``: every step is a real jitted forward and backward (softmax cross-entropy) on this rank's
  batch, then ``tx.update`` and ``optax.apply_updates``, in one XLA program.
* ``"device-time"``: a GPU's compute replayed on the CPU, as ``_replay.py`` does for torch. At
  construction, ONE real forward and backward at ``record_batch`` records the gradients; XLA's cost
  analysis of that compiled program gives its FLOPs, scaled by ``batch_size / record_batch``, and
  ``compute_seconds = flops / (peak_tflops * 1e12 * mfu)`` of the profile. Each step sleeps
  ``compute_seconds``, then runs the jitted update on the recorded gradients. The JAX transform
  communicates once all the gradients exist (its FFI calls take the whole gradient pytree), so there
  is no per-layer overlap of communication with backward in this frontend, unlike the torch replay.

Memory: VGG16 has 138 M parameters (553 MB of float32); a device-time trainer keeps the params, the
recorded gradients and the optax state (SGD's momentum), and the update donates params and state.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence, Tuple, Union

import numpy as np
from _seed_models import VGG16_LAYERS  # torchvision's VGG16 ("D"): 3x3 convolutions and 2x2 max-pools ("M")

MODES = ("real", "device-time")

TINY_LAYERS = (8, "M", 16, "M")
SHAPES = {  # tiny -> (input height/width, classes)
    False: (224, 1000),
    True: (32, 10),
}


def _vgg_class():
    from flax import linen as nn

    # torchvision's initialisation: Kaiming (fan out) for convolutions, N(0, 0.01) for Dense, zero biases.
    conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
    dense_init = nn.initializers.normal(0.01)

    class VGG(nn.Module):
        """Convolutions 3x3 + ReLU and max-pools (``layers``), an average pool to ``pool_to`` x ``pool_to``
        (None: a global average), then Dense + ReLU layers (``hidden``) and the classifier. No dropout:
        torchvision's two Dropout(0.5) layers change neither shapes nor FLOPs that matter here."""

        layers: Sequence[Union[int, str]]
        pool_to: Optional[int]
        hidden: Sequence[int]
        classes: int

        @nn.compact
        def __call__(self, x):
            for v in self.layers:
                if v == "M":
                    x = nn.max_pool(x, (2, 2), strides=(2, 2))
                else:
                    x = nn.relu(nn.Conv(v, (3, 3), padding=1, kernel_init=conv_init)(x))
            x = x.mean(axis=(1, 2)) if self.pool_to is None else adaptive_avg_pool(x, self.pool_to)
            x = x.reshape(x.shape[0], -1)
            for h in self.hidden:
                x = nn.relu(nn.Dense(h, kernel_init=dense_init)(x))
            return nn.Dense(self.classes, kernel_init=dense_init)(x)

    return VGG


def adaptive_avg_pool(x, size: int):
    """torch's ``AdaptiveAvgPool2d(size)`` on NHWC: output cell i averages rows floor(i*H/size) to
    ceil((i+1)*H/size) (likewise columns). At 224x224 VGG16's features are already 7x7: the identity."""
    import jax.numpy as jnp

    h, w = x.shape[1], x.shape[2]
    if (h, w) == (size, size):
        return x

    def cells(n):
        return [(i * n // size, -(-(i + 1) * n // size)) for i in range(size)]

    rows = [jnp.stack([x[:, a:b, c:d].mean(axis=(1, 2)) for c, d in cells(w)], axis=1) for a, b in cells(h)]
    return jnp.stack(rows, axis=1)


def flax_vgg16(tiny: bool = False):
    """torchvision's VGG16 in Flax (NHWC input, 224x224x3 -> 1000 logits; dropout omitted); ``tiny``:
    the same code at smoke-test size (convolutions 8, pool, 16, pool, global average, Dense 32, 10),
    on 32x32x3 inputs."""
    vgg = _vgg_class()
    if tiny:
        return vgg(layers=TINY_LAYERS, pool_to=None, hidden=(32,), classes=SHAPES[True][1])
    return vgg(layers=VGG16_LAYERS, pool_to=7, hidden=(4096, 4096), classes=SHAPES[False][1])


def synthetic_batch(rank: int, batch_size: int, tiny: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s images (NHWC float32) and integer labels, from numpy seeded by the rank."""
    side, classes = SHAPES[tiny]
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((batch_size, side, side, 3), dtype=np.float32)
    return x, rng.integers(0, classes, batch_size).astype(np.int32)


def initial_params(model, tiny: bool):
    """The model's parameters from seed 0: the same on every rank. The key is RBG's (XLA's
    RngBitGenerator), not threefry's ``PRNGKey(0)``: each distinct shape of a threefry draw is a
    separate XLA compilation of seconds on a CPU, RBG's a fraction of one."""
    import jax
    import jax.numpy as jnp

    side = SHAPES[tiny][0]
    return model.init(jax.random.key(0, impl="rbg"), jnp.zeros((1, side, side, 3), jnp.float32))


def loss_fn(model):
    """Mean softmax cross-entropy of ``model`` as ``f(params, x, y)``."""
    import optax

    def f(params, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()

    return f


def cost_flops(compiled) -> float:
    """FLOPs of a compiled XLA program by its cost analysis (a dict, or a list of one per program in
    older jax versions)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, dict):
        analysis = [analysis]
    return float(sum(a.get("flops", 0.0) for a in analysis or ()))


def make_optimizer(algorithm_name: str, lr: float, momentum: float):
    """``bagua_jax.transform`` of the named algorithm chained with SGD: gradient algorithms before the
    optimizer, weight algorithms after it. The default process group is made if there is none yet."""
    import optax

    import bagua_jax
    from bagua_core.algorithms import WEIGHTS

    classes = bagua_jax.algorithms.Algorithm.classes()
    jittable = sorted(set(classes) - {"AsyncModelAverageAlgorithm", "QAdamAlgorithm"})
    if algorithm_name not in jittable:
        raise ValueError(f"unknown or unsupported algorithm {algorithm_name!r}: choose from {jittable}")
    bagua_jax.init_process_group()  # idempotent: returns the group that is there
    algorithm = classes[algorithm_name]()
    bagua, sgd = bagua_jax.transform(algorithm), optax.sgd(lr, momentum)
    weights = algorithm.to_core().plan().communicates == WEIGHTS
    return optax.chain(sgd, bagua) if weights else optax.chain(bagua, sgd)


class JaxReplayTrainer:
    """A Flax VGG16 (``tiny``: its stand-in) trained through ``bagua_jax.transform``; ``steps(n)``
    returns once the last step's result is ready. ``compute_seconds``: the replayed forward and
    backward of a step (0 in real mode); ``loss``: the last step's (device-time: the recorded one)."""

    def __init__(
        self,
        name: str,
        algorithm_name: str,
        mode: str,
        profile: Optional[dict],
        batch_size: int,
        record_batch: int,
        rank: int,
        tiny: bool,
        lr: float = 0.01,
        momentum: float = 0.9,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "device-time" and not profile:
            raise ValueError("device-time mode needs a GPU profile (peak_tflops, mfu)")
        import jax

        self.name, self.mode, self.loss = name, mode, float("nan")
        self.compute_seconds, self.flops = 0.0, 0.0
        model = flax_vgg16(tiny)
        self.tx = make_optimizer(algorithm_name, lr, momentum)
        self.params = initial_params(model, tiny)
        self.state = self.tx.init(self.params)
        self.grads = None
        if mode == "real":
            self.batch = tuple(jax.numpy.asarray(a) for a in synthetic_batch(rank, batch_size, tiny))
            self._step = jax.jit(self._real_step(model), donate_argnums=(0, 1))
        else:
            self._record(model, rank, record_batch, tiny)
            self.flops *= batch_size / record_batch  # FLOPs are linear in the batch
            self.compute_seconds = self.flops / (profile["peak_tflops"] * 1e12 * profile["mfu"])
            self._update = jax.jit(self._replay_update, donate_argnums=(1, 2))

    def _real_step(self, model):
        import jax
        import optax

        grad = jax.value_and_grad(loss_fn(model))

        def step(params, state, x, y):
            loss, grads = grad(params, x, y)
            updates, state = self.tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        return step

    def _replay_update(self, grads, state, params):
        import optax

        updates, state = self.tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def _record(self, model, rank, record_batch, tiny):
        """One real forward and backward at ``record_batch``: its gradients, loss and FLOPs."""
        import jax

        x, y = synthetic_batch(rank, record_batch, tiny)
        compiled = jax.jit(jax.value_and_grad(loss_fn(model))).lower(self.params, x, y).compile()
        self.flops = cost_flops(compiled)
        loss, self.grads = compiled(self.params, x, y)
        self.loss = float(loss)

    def steps(self, n: int) -> None:
        import jax

        for _ in range(n):
            if self.mode == "real":
                self.params, self.state, loss = self._step(self.params, self.state, *self.batch)
            else:
                time.sleep(self.compute_seconds)
                self.params, self.state = self._update(self.grads, self.state, self.params)
            jax.block_until_ready(self.params)  # the caller's clock must include the step
        if n and self.mode == "real":
            self.loss = float(loss)

    def close(self) -> None:
        """Drops the arrays and compiled functions (params, gradients, state), so their memory can go."""
        self.params = self.state = self.grads = self.batch = None
        self._step = self._update = self.tx = None
