"""``fuse_optimizer(optimizer)``: one optimizer step over many small parameters
as a few large tensors.

Contract: ``fuse_optimizer(opt)`` returns ``opt`` itself with a new method
``opt.fuse_step(closure=None)`` whose results are bitwise equal to
``opt.step(closure)`` for any torch optimizer whose update is elementwise
(SGD, Adam, AdamW, RMSprop, Rprop, ASGD, Adamax, Adadelta, ...). ``step()``
keeps its own behaviour; the two can be mixed freely and share the state.
The closure is evaluated once, before the step (optimizers that evaluate it
several times, like LBFGS, are not elementwise: use their ``step``). Step
hooks registered on the optimizer run around ``fuse_step`` too.

How: parameters of one group whose weights, gradients and every per-element
state tensor lie back to back in memory, in the same order, are stepped as
one flat parameter (views of the same memory, nothing copied) by an internal
copy of the optimizer; scalar state (e.g. Adam's ``step``) must be equal
across them. Afterwards the state is written back as per-parameter views of
the flat state, so the next ``fuse_step`` finds it contiguous again.

``do_flatten=True`` makes that layout happen: at fuse time the weights of each
group (per dtype and device) are moved into one contiguous buffer, and at each
``fuse_step`` gradients and state that are not contiguous (e.g. gradients
re-allocated after ``zero_grad(set_to_none=True)``) are copied into one.
Only tensors that own their memory (or live in a buffer this module made) are
ever moved; tensors that are views of someone else's buffer stay where they
are, and where such state lies back to back in another order than the
weights (QAdam's momentum, held by the engine in bucket order), the weights
are moved into that order so the run still fuses. ``check_flatten`` warns once when a group cannot be fused, so the user
learns the step runs unfused.

``optimizer._bagua_fused_count`` counts, as in Bagua 0.9.2, the groups that
stepped at least one fused parameter, summed over ``fuse_step`` calls. With
``model.with_bagua``: fusing gives the same numbers in every combination; it
fuses when ``with_bagua`` gets ``do_flatten=False`` and this module
``do_flatten=True`` (in either order), and not when ``with_bagua`` flattens
(parameters whose weights or gradients live in its communication buckets
step unfused: the buckets' layout is the wrapper's) or nobody does.
"""

from __future__ import annotations

import copy
import types
import warnings
from collections import defaultdict
from typing import Any, DefaultDict, Dict, List, Optional, Sequence, Tuple, cast

import torch

__all__ = ["fuse_optimizer", "is_fused_optimizer", "calculate_mutual_groups"]

_Key = Tuple[int, int, torch.dtype, torch.device]


def is_fused_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    return getattr(optimizer, "_bagua_fused_optimizer", None) is not None


def fuse_optimizer(
    optimizer: torch.optim.Optimizer, do_flatten: bool = True, check_flatten: bool = True
) -> torch.optim.Optimizer:
    """Adds ``fuse_step()`` to ``optimizer`` and returns it (see the module doc)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"fuse_optimizer expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if is_fused_optimizer(optimizer):
        raise RuntimeError("this optimizer is already fused; call fuse_optimizer once per optimizer")
    fuser = _Fuser(optimizer, bool(do_flatten), bool(do_flatten and check_flatten))
    attrs = vars(optimizer)  # Bagua 0.9.2's API: its attributes live on the optimizer itself
    attrs["_bagua_fused_optimizer"] = fuser
    attrs["_bagua_fused_count"] = 0
    attrs["fuse_step"] = types.MethodType(_fuse_step, optimizer)
    return optimizer


def _fuse_step(self: torch.optim.Optimizer, closure=None):
    """One optimizer step, bitwise equal to ``step(closure)``, over fused parameters."""
    for owner in list(self.__dict__.get("_bagua_ddps", ())):  # a with_bagua step left open
        owner.finish_step()
    for hook in list(self._optimizer_step_pre_hooks.values()):
        hook(self, (closure,), {})
    loss = None
    if closure is not None:  # before the layout is read: the closure may re-allocate gradients
        with torch.enable_grad():
            loss = closure()
    fuser: _Fuser = vars(self)["_bagua_fused_optimizer"]
    fuser.step()
    vars(self)["_opt_called"] = True  # what LR schedulers check, as after step()
    for handle_id, hook in list(self._optimizer_step_post_hooks.items()):
        if handle_id != fuser.step_hook.id:
            hook(self, (closure,), {})
    return loss


# ---------------------------------------------------------------- memory layout helpers


def _end(t: torch.Tensor) -> int:
    return t.data_ptr() + t.numel() * t.element_size()


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    """``p.grad`` of a parameter already checked to have one."""
    assert p.grad is not None
    return p.grad


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _owns_memory(t: torch.Tensor) -> bool:
    """The tensor is its whole allocation (not a view into a larger buffer)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _contiguous_run(tensors: Sequence[Optional[torch.Tensor]]) -> bool:
    """True when the tensors are dense, of one allocation (so that one view can
    cover them) and each starts where the previous ends."""
    if any(t is None or not t.is_contiguous() for t in tensors):
        return False
    dense = cast(Sequence[torch.Tensor], tensors)  # none is None (checked above)
    first = dense[0]
    if any(t.dtype != first.dtype or t.device != first.device or _storage(t) != _storage(first) for t in dense):
        return False
    return all(_end(a) == b.data_ptr() for a, b in zip(dense, dense[1:]))


def calculate_mutual_groups(tensors_list: Sequence[Sequence[torch.Tensor]]) -> List[List[int]]:
    """Bagua 0.9.2's helper: the groups of indices (two or more each) whose
    tensors lie back to back in memory in every list of ``tensors_list`` (e.g.
    the parameters, their gradients, one optimizer state), each group in
    memory order. ValueError when the lists differ in length."""
    if not tensors_list:
        return []
    size = len(tensors_list[0])
    if any(len(ts) != size for ts in tensors_list):
        raise ValueError(
            f"calculate_mutual_groups: the lists must have equal lengths, got {[len(ts) for ts in tensors_list]}"
        )
    groups = _adjacent_runs(tensors_list[0])
    for tensors in tensors_list[1:]:
        theirs = _adjacent_runs(tensors)
        groups = [g for g in groups if g in theirs]
    return groups


def _adjacent_runs(tensors: Sequence[torch.Tensor]) -> List[List[int]]:
    """Indices of the runs (two or more) of tensors that follow each other in memory."""
    runs: List[List[int]] = []
    run: List[int] = []
    for i in sorted(range(len(tensors)), key=lambda i: tensors[i].data_ptr()):
        if run and _end(tensors[run[-1]]) != tensors[i].data_ptr():
            if len(run) > 1:
                runs.append(run)
            run = []
        run.append(i)
    if len(run) > 1:
        runs.append(run)
    return runs


def _flat_view(first: torch.Tensor, numel: int) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements over the memory starting at ``first``."""
    return first.detach().new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (numel,), (1,))


def _flatten_into_one(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Copies ``tensors`` into one new contiguous buffer; returns views of it, in order."""
    buf = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
    views, offset = [], 0
    with torch.no_grad():
        for t in tensors:
            v = buf.narrow(0, offset, t.numel()).view(t.shape)
            v.copy_(t)
            views.append(v)
            offset += t.numel()
    return views


def _per_element_keys(states: Sequence[dict], params: Sequence[torch.Tensor]) -> Optional[List[str]]:
    """The state keys holding one tensor per element of the parameter (same
    shape as it), if every member has the same keys; None when they differ."""
    keys = set(states[0])
    if any(set(s) != keys for s in states):
        return None
    per_element = []
    for k in sorted(keys):
        values = [s[k] for s in states]
        if all(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == p.shape for v, p in zip(values, params)):
            per_element.append(k)
    return per_element


def _same_scalars(a: dict, b: dict, per_element: Sequence[str]) -> bool:
    for k, va in a.items():
        if k in per_element:
            continue
        vb = b[k]
        if isinstance(va, torch.Tensor) != isinstance(vb, torch.Tensor):
            return False
        if isinstance(va, torch.Tensor):
            if va.shape != vb.shape or va.dtype != vb.dtype or not torch.equal(va, vb):
                return False
        elif va != vb:
            return False
    return True


def _copy_scalar(v):
    return v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)


# ---------------------------------------------------------------- the fuser


class _Fuser:
    """The internal optimizer that steps fused parameters, and the bookkeeping."""

    def __init__(self, optimizer: torch.optim.Optimizer, do_flatten: bool, check_flatten: bool):
        self.optimizer = optimizer
        self.do_flatten = do_flatten
        self.check_flatten = check_flatten
        self.warned = False
        self.fused_params: Dict[_Key, torch.nn.Parameter] = {}
        self.plans: Dict[int, "_GroupPlan"] = {}
        # the gradient and state buffers flattening made (storage address -> a view keeping it)
        self.buffers: Dict[int, torch.Tensor] = {}
        self.weight_buffers: set = set()  # storage addresses of the weight buffers flattening made
        # A shallow copy with its own groups, state and hooks; same class, so same step().
        inner = object.__new__(type(optimizer))
        skip = {"step", "fuse_step", "param_groups", "state"}
        inner.__dict__.update(
            {k: v for k, v in optimizer.__dict__.items() if k not in skip and not k.startswith("_bagua")}
        )
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
            if hasattr(optimizer, hooks):
                setattr(inner, hooks, type(getattr(optimizer, hooks))())
        inner.param_groups = [{} for _ in optimizer.param_groups]
        inner.state = defaultdict(dict)
        self.inner = inner
        # step() updates the state in place: the layout snapshots must be checked anew after it
        self.stepped_unfused = False
        self.step_hook = optimizer.register_step_post_hook(self._after_unfused_step)
        if do_flatten:
            self._flatten_weights()

    def _flatten_weights(self) -> None:
        for group in self.optimizer.param_groups:
            by_kind: Dict[Tuple[torch.dtype, torch.device], List[torch.nn.Parameter]] = {}
            for p in group["params"]:
                if p.requires_grad and p.layout == torch.strided:
                    by_kind.setdefault((p.dtype, p.device), []).append(p)
            for params in by_kind.values():
                if len(params) < 2 or _contiguous_run(params) or not all(_owns_memory(p) for p in params):
                    continue
                self._move_weights(params)

    def _move_weights(self, params: Sequence[torch.nn.Parameter]) -> None:
        """The weights into one new buffer, in this order."""
        views = _flatten_into_one([p.detach() for p in params])
        for p, v in zip(params, views):
            p.data = v
        self.weight_buffers.add(_storage(views[0]))

    def _follow_fixed_state(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Per-element state held in someone else's buffer (QAdam's momentum
        is the engine's) cannot move; where it lies back to back in an order
        the weights do not, the weights (ours to move) take that order, so
        that the run can fuse. The gradients follow in ``_layout_matches``."""
        if not self.do_flatten or len(params) < 2:
            return
        states = [self.optimizer.state.get(p, {}) for p in params]
        keys = _per_element_keys(states, params) or []
        for key in keys:
            tensors = [s[key] for s in states]
            if any(_owns_memory(t) or _storage(t) in self.buffers for t in tensors):
                continue  # movable: flattening arranges it
            order = sorted(range(len(params)), key=lambda i: (_storage(tensors[i]), tensors[i].data_ptr()))
            run = [order[0]]
            for i in order[1:] + [-1]:
                if i >= 0 and _contiguous_run([tensors[run[-1]], tensors[i]]):
                    run.append(i)
                    continue
                members = [params[j] for j in run]
                movable = all(_owns_memory(p) or _storage(p) in self.weight_buffers for p in members)
                if len(members) > 1 and movable and not _contiguous_run(members):
                    self._move_weights(members)
                run = [i]
            return

    def _after_unfused_step(self, *_) -> None:
        self.stepped_unfused = True

    # ------------------------------------------------------------ one step

    def step(self) -> None:
        opt, inner = self.optimizer, self.inner
        if self.stepped_unfused:
            self.plans.clear()
            self.stepped_unfused = False
        state: DefaultDict[Any, dict] = defaultdict(dict)
        plans = []
        for gi, group in enumerate(opt.param_groups):
            params = group["params"]
            plan = self.plans.get(gi)
            if plan is None or not plan.still_valid(params, opt.state):
                plan = _GroupPlan(params, self._runs(params))  # the slow path: layout checked anew
                self.plans[gi] = plan
                live = {id(r.fp) for pl in self.plans.values() for r in pl.runs}
                self.fused_params = {k: fp for k, fp in self.fused_params.items() if id(fp) in live}
                self._forget_unused_buffers()
            fgroup = {k: v for k, v in group.items() if k != "params"}
            fgroup["params"] = [r.fp for r in plan.runs] + plan.unfused
            inner.param_groups[gi] = fgroup
            for r in plan.runs:
                state[r.fp] = r.fstate
            for p in plan.unfused:  # unfused parameters step on their own state
                if p in opt.state:
                    state[p] = opt.state[p]
            plans.append(plan)
            if plan.runs:
                vars(opt)["_bagua_fused_count"] += 1
        inner.state = state
        cloned = {k: v for k, v in inner.__dict__.items() if k not in ("param_groups", "state")}
        inner.step()
        for k, v in inner.__dict__.items():  # attributes the step rebinds (a counter, say)
            if k in cloned and cloned[k] is not v:
                setattr(opt, k, v)
        for plan in plans:
            for r in plan.runs:
                r.write_back(opt.state)
            for p in plan.unfused:
                s = state.get(p)
                if s and p not in opt.state:
                    opt.state[p] = s

    def _forget_unused_buffers(self) -> None:
        used = set()
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    used.add(_storage(p.grad))
                used.update(
                    _storage(v) for v in self.optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)
                )
        self.buffers = {k: v for k, v in self.buffers.items() if k in used}

    def _runs(self, params: Sequence[torch.nn.Parameter]) -> List["_Run"]:
        """(fused parameter, members) for each run of ≥2 parameters that can step as one."""
        wrapped = set()  # with_bagua's buckets: their layout is the wrapper's (see the module doc)
        for ddp in list(self.optimizer.__dict__.get("_bagua_ddps", ())):
            wrapped |= ddp.bucket_storages()
        eligible = [
            p
            for p in params
            if p.grad is not None and p.grad.layout == torch.strided and p.numel() > 0 and p.is_contiguous()
        ]
        candidates = [p for p in eligible if _storage(p) not in wrapped and _storage(_grad(p)) not in wrapped]
        self._follow_fixed_state(candidates)
        candidates.sort(key=lambda p: p.data_ptr())
        weight_runs: List[List[torch.nn.Parameter]] = []
        current: List[torch.nn.Parameter] = []
        for p in candidates:
            if current and _contiguous_run([current[-1], p]):
                current.append(p)
            else:
                if len(current) > 1:
                    weight_runs.append(current)
                current = [p]
        if len(current) > 1:
            weight_runs.append(current)
        out = []
        for run in weight_runs:
            for members in self._split_by_state(run):
                if len(members) > 1 and self._layout_matches(members):
                    out.append(self._fused_run(members))
        if self.check_flatten and not self.warned:
            fused = sum(len(r.members) for r in out)
            if len(eligible) > 1 and fused < len(eligible):
                self.warned = True
                why = "their weights, gradients or state are not contiguous in memory, or their scalar state differs"
                if len(candidates) < len(eligible):
                    why = (
                        f"{len(eligible) - len(candidates)} live in with_bagua's buckets: pass do_flatten=False "
                        f"to with_bagua to fuse them; or {why}"
                    )
                warnings.warn(
                    f"fuse_step: {len(eligible) - fused} of {len(eligible)} parameters of a group "
                    f"are stepped unfused ({why})",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return out

    def _split_by_state(self, run: List[torch.nn.Parameter]) -> List[List[torch.nn.Parameter]]:
        """Splits a run where the state's keys or scalar values change."""
        state = self.optimizer.state
        parts, current = [], [run[0]]
        for p in run[1:]:
            a, b = state.get(current[0], {}), state.get(p, {})
            keys = _per_element_keys([a, b], [current[0], p])
            if keys is not None and _same_scalars(a, b, keys):
                current.append(p)
            else:
                parts.append(current)
                current = [p]
        parts.append(current)
        return parts

    def _layout_matches(self, members: List[torch.nn.Parameter]) -> bool:
        """Gradients and per-element state lie back to back in the members'
        order (flattened into one buffer first when allowed)."""
        kinds: List[Tuple[str, List[torch.Tensor]]] = [("grad", [_grad(p) for p in members])]
        states = [self.optimizer.state.get(p, {}) for p in members]
        keys = _per_element_keys(states, members)
        if keys is None:
            return False
        kinds += [(k, [s[k] for s in states]) for k in keys]
        for kind, tensors in kinds:
            if _contiguous_run(tensors):
                continue
            if not self.do_flatten or any(
                t.dtype != tensors[0].dtype or t.device != tensors[0].device for t in tensors
            ):
                return False
            if not all(_owns_memory(t) or _storage(t) in self.buffers for t in tensors):
                return False  # someone else's buffer (a wrapper's bucket): not ours to move
            views = _flatten_into_one([t.detach() for t in tensors])
            self.buffers[_storage(views[0])] = views[0]
            for p, s, v in zip(members, states, views):
                if kind == "grad":
                    p.grad = v
                else:
                    s[kind] = v
        return True

    def _fused_run(self, members: List[torch.nn.Parameter]) -> "_Run":
        first = members[0]
        numel = sum(p.numel() for p in members)
        key = (first.data_ptr(), numel, first.dtype, first.device)
        fp = self.fused_params.get(key)
        if fp is None:
            fp = torch.nn.Parameter(_flat_view(first, numel), requires_grad=False)
            self.fused_params[key] = fp
        fp.grad = _flat_view(_grad(first), numel)
        state = self.optimizer.state.get(first, {})
        keys = _per_element_keys([state], [first]) or []
        fstate = {k: (_flat_view(v, numel) if k in keys else _copy_scalar(v)) for k, v in state.items()}
        return _Run(fp, members, fstate)


class _Run:
    """Parameters stepped as one flat parameter ``fp`` with state ``fstate``,
    and a snapshot of the layout it relies on (so later steps skip the checks)."""

    def __init__(self, fp: torch.nn.Parameter, members: List[torch.nn.Parameter], fstate: dict):
        self.fp, self.members, self.fstate = fp, members, fstate
        self.placed: Dict[str, torch.Tensor] = {}  # the per-element tensors the members view
        self.snapshot: list = []

    def write_back(self, state) -> None:
        """The fused state into each member's state: per-element tensors as
        views (once: the optimizer then updates them in place), scalars as copies."""
        numel = self.fp.numel()
        changed = not self.snapshot
        for k, v in self.fstate.items():
            if self.placed.get(k) is v:
                continue
            if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == numel and numel > 1:
                changed = True
                offset = 0
                for p in self.members:
                    state[p][k] = v.narrow(0, offset, p.numel()).view(p.shape)
                    offset += p.numel()
                self.placed[k] = v
            elif isinstance(v, torch.Tensor) and v.dim() > 0:
                raise RuntimeError(
                    f"fuse_step: state {k!r} of shape {tuple(v.shape)} cannot be split per "
                    "parameter; this optimizer's update is not elementwise, use step()"
                )
            else:
                for p in self.members:
                    old = state[p].get(k)
                    if (
                        isinstance(v, torch.Tensor)
                        and isinstance(old, torch.Tensor)
                        and old.shape == v.shape
                        and old.dtype == v.dtype
                        and old.device == v.device
                    ):
                        old.copy_(v)  # same object: the snapshot stays valid
                    else:
                        state[p][k] = _copy_scalar(v)
                        changed = True
        if changed:
            self.snapshot = [self._layout(p, state[p]) for p in self.members]

    @staticmethod
    def _layout(p, s) -> tuple:
        """What a later step relies on: the weight's memory, the gradient and
        state objects (held, so their ids cannot be reused; step() is noticed
        through a hook; anything that moves them replaces them), the values of
        non-tensor scalars."""
        return (p.data_ptr(), p.grad, tuple(s.items()))

    def still_valid(self, state) -> bool:
        if len(self.snapshot) != len(self.members):
            return False
        for p, (ptr, grad, items) in zip(self.members, self.snapshot):
            s = state.get(p)
            if s is None or p.grad is not grad or p.data_ptr() != ptr or len(s) != len(items):
                return False
            for k, v in items:
                now = s.get(k)
                if now is not v and (isinstance(v, torch.Tensor) or isinstance(now, torch.Tensor) or now != v):
                    return False
        return True


class _GroupPlan:
    """A group's runs and unfused parameters, reused while nothing moved."""

    def __init__(self, params: Sequence[torch.nn.Parameter], runs: List[_Run]):
        self.with_grad = tuple(id(p) for p in params if p.grad is not None)
        self.runs = runs
        in_run = {id(p) for r in runs for p in r.members}
        self.unfused = [p for p in params if id(p) not in in_run]

    def still_valid(self, params, state) -> bool:
        if tuple(id(p) for p in params if p.grad is not None) != self.with_grad:
            return False
        return all(r.still_valid(state) for r in self.runs)
