"""bagua_jax.qadam: QAdam's optimizer as an optax transformation.

Alone it is a local optimizer (Adam whose moments freeze from step
``warmup_steps`` on). Wrapped by ``bagua_jax.transform(QAdamAlgorithm(tx))``
it becomes QAdam: gradients averaged during the warm-up, then the momentum
updated with the local gradient and averaged with MinMaxUInt8 compression by
the engine's ``qadam`` step (csrc/ops/qadam.h), as the torch frontend does.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class QAdamState(NamedTuple):
    """``count``: optimizer steps so far (int32); ``mu``, ``nu``: the moments."""

    count: jax.Array  # type: ignore[assignment]  # optax's name for it; shadows tuple.count
    mu: optax.Updates
    nu: optax.Updates


@dataclasses.dataclass(frozen=True)
class QAdamHyperparameters:
    learning_rate: optax.ScalarOrSchedule
    warmup_steps: int
    b1: float
    b2: float
    eps: float
    weight_decay: float


def hyperparameters_of(tx: optax.GradientTransformation) -> QAdamHyperparameters:
    """The hyperparameters of a :func:`qadam` transformation; TypeError otherwise."""
    hp = getattr(getattr(tx, "update", None), "bagua_qadam", None)
    if not isinstance(hp, QAdamHyperparameters):
        raise TypeError(f"QAdamAlgorithm needs the optimizer bagua_jax.qadam(...) returns, got {type(tx).__name__}")
    return hp


def qadam(
    learning_rate: optax.ScalarOrSchedule,
    warmup_steps: int = 100,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> optax.GradientTransformationExtraArgs:
    """QAdam's optimizer. Step ``t`` (1-based): ``g = grad + weight_decay * param``;
    while ``t < warmup_steps`` the moments update as Adam's; afterwards they
    stay (wrapped with ``QAdamAlgorithm``, the engine updates ``mu``); the
    update is ``-lr(t) / (1 - b1^t) * mu / (sqrt(nu) / sqrt(1 - b2^t) + eps)``.
    ``learning_rate`` is a float or an optax schedule (of the step count)."""
    if not callable(learning_rate) and not learning_rate >= 0.0:
        raise ValueError(f"Invalid learning rate: {learning_rate}")
    if not eps >= 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for name, b in (("b1", b1), ("b2", b2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"Invalid {name}: {b}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps <= 0:
        raise ValueError(f"Invalid warmup_steps parameter, must be an int larger than 0: {warmup_steps!r}")
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    hp = QAdamHyperparameters(learning_rate, warmup_steps, float(b1), float(b2), float(eps), float(weight_decay))

    def init_fn(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return QAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=jax.tree_util.tree_map(jnp.zeros_like, params))

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if hp.weight_decay != 0.0 and params is None:
            raise ValueError("bagua_jax.qadam with weight_decay needs params: tx.update(grads, state, params)")
        count = state.count + jnp.asarray(1, jnp.int32)
        t = count.astype(jnp.result_type(float))  # float64 under jax_enable_x64, as torch's Python floats
        warm = count < hp.warmup_steps
        if hp.weight_decay != 0.0:
            grads = jax.tree_util.tree_map(lambda g, p: g + hp.weight_decay * p, updates, params)
        else:
            grads = updates
        mu = jax.tree_util.tree_map(lambda m, g: jnp.where(warm, hp.b1 * m + (1 - hp.b1) * g, m), state.mu, grads)
        nu = jax.tree_util.tree_map(lambda v, g: jnp.where(warm, hp.b2 * v + (1 - hp.b2) * g * g, v), state.nu, grads)
        lr = hp.learning_rate(state.count) if callable(hp.learning_rate) else hp.learning_rate
        step_size = lr / (1 - hp.b1**t)
        correction = jnp.sqrt(1 - hp.b2**t)
        new_updates = jax.tree_util.tree_map(
            lambda m, v: (-step_size * m / (jnp.sqrt(v) / correction + hp.eps)).astype(m.dtype), mu, nu
        )
        return new_updates, QAdamState(count=count, mu=mu, nu=nu)

    update_fn.bagua_qadam = hp  # type: ignore[attr-defined]  # read by hyperparameters_of
    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
