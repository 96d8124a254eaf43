"""Local steps with an outer optimizer (local SGD, DiLoCo): ranks train on
their own for ``sync_interval`` steps, then average how far their weights
moved and apply that pseudo-gradient with an outer SGD with Nesterov momentum,
optionally averaging it compressed (8, 4 or 2 bits, FP4, or top-k) with error
feedback (``csrc/ops/local_steps.h``)."""

from __future__ import annotations

import dataclasses
import numbers

from bagua_core.algorithms._base import AFTER_OPTIMIZER_STEP, WEIGHTS, Plan, check_bool, check_int, register

_DEFAULT_DENSITY = 0.02


def compressions() -> tuple:
    """ "none" and the engine's codecs (``csrc/ops/codec.h``, their one registry)."""
    from bagua_core._loader import _C

    return ("none", *_C.codec_names())


def _check_number(name: str, value, low: float, high: float = None, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"LocalSteps: {name} must be a number, got {value!r}")
    v = float(value)
    if not (v > low if low_open else v >= low) or (high is not None and not v < high):
        bound = f"{'>' if low_open else '>='} {low}" + (f" and < {high}" if high is not None else "")
        raise ValueError(f"LocalSteps: {name} must be {bound}, got {value!r}")
    return v


@register
@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """Every rank runs its own optimizer (any torch optimizer, any optax
    chain) ``sync_interval`` steps without communicating; then the weights'
    movement since the last synchronisation is averaged over the ranks and
    applied to the common anchor by an outer SGD with (Nesterov) momentum
    (DiLoCo's defaults). ``outer_lr=1, outer_momentum=0`` is plain periodic
    weight averaging (post-local SGD). The anchor and the outer momentum are
    algorithm state (checkpointed): twice the weights' memory. DiLoCo's outer
    momentum 0.9 suits an AdamW inside; with an inner SGD with momentum a
    lighter one (0.5) or plain averaging is steadier (the demos: 85.7%
    against 39.7% accuracy with 0.9). A NaN or Inf in any rank's
    pseudo-gradient raises on every rank at that synchronisation, each saying
    whether its own held it; the bucket keeps its last synchronised weights.

    Args:
        sync_interval: optimizer steps between synchronisations (H).
        outer_lr: the outer SGD's learning rate (1 with ``outer_momentum=0``:
            plain weight averaging).
        outer_momentum: the outer SGD's momentum, in [0, 1).
        nesterov: Nesterov momentum for the outer step.
        warmup_steps: the first steps average the weights after every
            optimizer step.
        hierarchical: average within each node first.
        compression: ``"none"``, or the codec the pseudo-gradient travels in
            (the warm-up averages stay uncompressed). Dense codecs run a
            compressed scatter-reduce-gather (each element quantised twice;
            the weights' buckets are padded to a multiple of the group size):
            ``"minmax_uint8"`` (ByteGrad's, 8 bits per element),
            ``"minmax_uint4"`` / ``"minmax_uint2"`` (min-max per block of 128:
            4.5 / 2.5 bits), ``"fp4_e2m1"`` (FP4 with a float32 scale per
            block of 32: 5 bits). Top-k codecs keep the largest
            ``topk_density`` of each block of 256 with their indices and
            their values at 4 or 2 bits (``"topk_uint4"``, ``"topk_uint2"``)
            and run a compressed allgather (each element quantised once).
            Layouts: ``csrc/kernels/lowbit.h``.
        error_feedback: with the compression, keep each rank's residual of
            its own quantisation of its pseudo-gradient,
            ``e = (d + e) - decompress(compress(d + e))``, and add it to the
            next synchronisation's (with ``hierarchical`` the node leader,
            which quantises the node average, keeps it): algorithm state like
            the anchor, one more copy of the weights' memory, zero at the
            first synchronisation.
        topk_density: the share of each block the top-k codecs keep, in
            (0, 1]: ``ceil(topk_density * 256)`` of 256 (0.02: 6).
        num_fragments: streaming (Streaming DiLoCo): each bucket is cut
            into this many equal fragments (padded to a multiple), and
            fragment p synchronises every ``sync_interval`` steps at its own
            offset ``p * sync_interval // num_fragments``, so only a
            ``1 / num_fragments`` share of the weights travels at a time. In
            [1, sync_interval].
        overlap_steps: streaming: a fragment's exchange runs in the
            background while training goes on and lands this many steps
            later (0: blocking, as plain LocalSteps). In [0, sync_interval);
            CPU buckets only; not with ``hierarchical``. The in-flight
            pseudo-gradients (and residuals) are extra host memory, one
            fragment's worth per exchange in flight.
        mixing: streaming: when a fragment lands its weights become
            ``mixing * local + (1 - mixing) * new anchor`` (0: the new
            anchor, as plain LocalSteps). In [0, 1].
    """

    sync_interval: int = 8
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    warmup_steps: int = 0
    hierarchical: bool = False
    compression: str = "none"
    error_feedback: bool = False
    topk_density: float = _DEFAULT_DENSITY
    num_fragments: int = 1
    overlap_steps: int = 0
    mixing: float = 0.0

    name = "local_steps"
    # what a live job's members take on a membership change (docs/fault-tolerance.md's table)
    on_membership_change = (
        "Live. Rank 0's weights, anchor, outer momentum and error-feedback residual become every member's: its "
        "inner steps since the last exchange are everyone's; streaming exchanges in flight are dropped, as on a "
        "checkpoint."
    )

    def __post_init__(self):
        object.__setattr__(self, "sync_interval", check_int("LocalSteps", "sync_interval", self.sync_interval, 1))
        object.__setattr__(self, "warmup_steps", check_int("LocalSteps", "warmup_steps", self.warmup_steps, 0))
        object.__setattr__(self, "outer_lr", _check_number("outer_lr", self.outer_lr, 0.0))
        object.__setattr__(
            self, "outer_momentum", _check_number("outer_momentum", self.outer_momentum, 0.0, 1.0, low_open=False)
        )
        check_bool("LocalSteps", "nesterov", self.nesterov)
        check_bool("LocalSteps", "hierarchical", self.hierarchical)
        if not isinstance(self.compression, str):
            raise TypeError(f"LocalSteps: compression must be a str, got {self.compression!r}")
        known = compressions()
        if self.compression not in known:
            raise ValueError(f"LocalSteps: unknown compression {self.compression!r} (use one of {', '.join(known)})")
        check_bool("LocalSteps", "error_feedback", self.error_feedback)
        if self.error_feedback and self.compression == "none":
            raise ValueError(
                "LocalSteps: error_feedback needs a compression (without compression there is no residual to feed back)"
            )
        density = _check_number("topk_density", self.topk_density, 0.0, None)
        if not density <= 1.0:
            raise ValueError(f"LocalSteps: topk_density must be in (0, 1], got {self.topk_density!r}")
        object.__setattr__(self, "topk_density", density)
        if density != _DEFAULT_DENSITY and not self.compression.startswith("topk"):
            raise ValueError(f"LocalSteps: topk_density is for the top-k compressions, not {self.compression!r}")
        fragments = check_int("LocalSteps", "num_fragments", self.num_fragments, 1)
        if fragments > self.sync_interval:
            raise ValueError(
                f"LocalSteps: num_fragments must be in [1, sync_interval={self.sync_interval}] "
                f"(each fragment synchronises at its own step), got {fragments}"
            )
        object.__setattr__(self, "num_fragments", fragments)
        overlap = check_int("LocalSteps", "overlap_steps", self.overlap_steps, 0)
        if overlap >= self.sync_interval:
            raise ValueError(
                f"LocalSteps: overlap_steps must be in [0, sync_interval={self.sync_interval}) "
                f"(an exchange must land before its fragment's next one starts), got {overlap}"
            )
        if overlap > 0 and self.hierarchical:
            raise ValueError("LocalSteps: overlap_steps > 0 is not supported with hierarchical=True")
        object.__setattr__(self, "overlap_steps", overlap)
        mixing = _check_number("mixing", self.mixing, 0.0, None, low_open=False)
        if not mixing <= 1.0:
            raise ValueError(f"LocalSteps: mixing must be in [0, 1], got {self.mixing!r}")
        object.__setattr__(self, "mixing", mixing)

    def plan(self) -> Plan:
        params = {
            "sync_interval": self.sync_interval,
            "warmup_steps": self.warmup_steps,
            "outer_lr": repr(self.outer_lr),
            "outer_momentum": repr(self.outer_momentum),
            "nesterov": self.nesterov,
            "hierarchical": self.hierarchical,
        }
        if self.compression != "none":  # absent when off: the step and its description stay as without it
            params["compression"] = self.compression
        if self.error_feedback:
            params["error_feedback"] = True
        if self.compression.startswith("topk"):
            params["topk_density"] = repr(self.topk_density)
        # streaming, absent when off: the step and its description stay as without it
        if self.num_fragments > 1:
            params["num_fragments"] = self.num_fragments
        if self.overlap_steps > 0:
            params["overlap_steps"] = self.overlap_steps
        if self.mixing > 0.0:
            params["mixing"] = repr(self.mixing)
        return Plan(
            step="local_steps",
            params=params,
            communicates=WEIGHTS,
            phase=AFTER_OPTIMIZER_STEP,
            one_bucket_per_dtype=False,
            counts_steps=True,
        )
