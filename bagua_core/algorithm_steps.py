"""The engine's algorithm steps (``csrc/ops/registry.h``), seen from Python.

A frontend binds an algorithm's plan (:mod:`bagua_core.algorithms`) to a
process group with :func:`check_plan` on every rank before anything is sent:
the engine makes the step over the group's communicators, which checks the
constraints that depend on the group (``shift_one`` needs an even number of
peers, hierarchical steps need the same number of processes on every node) in
one place, and says what the frontend must know to lay out its buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence, Tuple

from bagua_core._loader import _C
from bagua_core.dtypes import DTypeLike

if TYPE_CHECKING:
    from bagua_core.algorithms._base import Plan
    from bagua_core.process_group import ProcessGroup


class StepInfo(NamedTuple):
    description: str  # e.g. "bytegrad(hierarchical=false, average=true)"
    alignment: int  # element counts must be a multiple of it
    has_result: bool  # writes a separate result (weights -> peer average) instead of working in place
    num_state: int = 0  # state spans of the data's size the step keeps between runs (e.g. replicas)


def names() -> Tuple[str, ...]:
    return tuple(_C.step_names())


def step_groups(
    group: ProcessGroup, hierarchical: bool
) -> Tuple[ProcessGroup, Optional[ProcessGroup], Optional[ProcessGroup]]:
    """``(group, intra, inter)``: the groups a step over ``group`` uses; the
    intra- and inter-node groups only when ``hierarchical`` (creating them is
    collective: every member calls this, in the same order). ``inter`` is None
    on ranks that do not lead their node."""
    if not hierarchical:
        return group, None, None
    intra = group.intra_node_group()
    inter = group.inter_node_group()
    return group, intra, (inter if inter.is_member else None)


def communicators(group: ProcessGroup, hierarchical: bool) -> tuple:
    """``(comm, intra, inter)``: the communicators of :func:`step_groups`."""
    return tuple(None if g is None else g.comm for g in step_groups(group, hierarchical))


def check_plan(plan: Plan, group: Optional[ProcessGroup], comms: Optional[tuple] = None) -> StepInfo:
    """Makes ``plan``'s step over ``group`` (or the given ``(comm, intra,
    inter)``); raises ValueError naming the problem when it cannot run there."""
    if comms is None:
        comms = communicators(group, bool(plan.params.get("hierarchical", False)))
    info = _C.step_info(plan.step, dict(plan.params), *comms)
    return StepInfo(info["description"], int(info["alignment"]), bool(info["has_result"]), int(info["num_state"]))


class StateLayout(NamedTuple):
    """A step's state block on one bucket (``Step::state_layout``,
    ``csrc/ops/algorithm_step.h``): ``spans`` spans of ``span_count`` elements of
    ``dtype``; ``init``: what the block starts as (``"copy_of_data"``: each
    span a copy of the bucket's data, or ``"zero"``); ``data_shaped``: each
    span has the bucket's layout (else the block is the step's own)."""

    spans: int
    span_count: int
    dtype: object  # bagua_core.dtypes.DType
    init: str
    data_shaped: bool

    @property
    def count(self) -> int:
        return self.spans * self.span_count


def state_layout(
    plan: Plan, comms: tuple, dtype: DTypeLike, shapes: Sequence[Sequence[int]], count: int
) -> StateLayout:
    """The state block of ``plan``'s step over ``comms`` (``(comm, intra,
    inter)``) on a bucket of ``count`` elements of ``dtype`` holding tensors
    of ``shapes`` back to back (padding after them)."""
    from bagua_core.dtypes import DType, as_dtype

    d = _C.step_state_layout(
        plan.step,
        dict(plan.params),
        int(as_dtype(dtype)),
        [tuple(int(x) for x in s) for s in shapes],
        int(count),
        *comms,
    )
    return StateLayout(int(d["spans"]), int(d["span_count"]), DType(d["dtype"]), str(d["init"]), bool(d["data_shaped"]))
