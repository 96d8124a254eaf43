"""``model.with_bagua(optimizers, algorithm)``: the glue between a torch model
and the engine.

This module is the torch frontend's one generic driver: it runs the plan of
any algorithm (:class:`bagua_core.algorithms.Plan`: which engine step, on
gradients or weights, in which phase). At wrap time (every rank, same order):

1. the ranks agree that they hold the same model (parameter and buffer names,
   shapes, dtypes, optimizer layout, algorithm); otherwise every rank raises
   ``ValueError`` naming the first difference;
2. the engine is built on a clone of the group and makes the algorithm's step
   over it, which checks it against the group (e.g. ``shift_one`` with an odd
   number of peers raises here, on every rank);
3. rank 0's parameters, buffers and optimizer state are broadcast;
4. the engine gets buckets (reverse parameter order) for what the algorithm
   communicates: gradients (GradientAllReduce, ByteGrad) or weights
   (Decentralized). With ``do_flatten`` the tensors torch uses *are* the
   bucket slots: ``p.grad`` (or ``p.data``) is a zero-copy view of engine
   memory, so nothing is copied per step. Asynchronous model average runs
   GradientAllReduce's plan during its warm-up, and keeps the weights in
   buckets of their own that a background loop (bagua_core.averager) averages,
   holding a weight lock from each training forward to the end of the
   optimizer step;
5. hooks: a forward pre-hook (buffers broadcast, gradient views re-attached
   after ``zero_grad(set_to_none=True)``, weights handed to the engine for
   Decentralized), a post-accumulate-grad hook per parameter (marks its
   gradient ready, so buckets communicate while backward still runs), a
   callback queued on the autograd engine that ends the step when backward
   ends (``engine.wait()``, then e.g. the decentralized copy-back), and each
   optimizer's ``step`` wrapped to end a step left open. With
   ``overlap_optimizer=True`` backward's end does not wait: the wrapped
   ``step`` updates each bucket's parameters as that bucket's exchange
   finishes (``engine.wait_any``, bagua_torch._overlap), and ``zero_grad``,
   the next forward or the next backward end a step whose optimizer step was
   skipped.

Errors of the communication (a dead or stuck peer) surface as Python
exceptions from ``loss.backward()`` (or ``optimizer.step()``), on every rank.

Beside it: what the hooks do in each phase (bagua_torch._phases), the
optimizer checks and shared optimizer state (bagua_torch._optimizers), the
wrapped optimizer step (bagua_torch._step_guard), trace and autotune
(bagua_torch._observe) and the views of engine memory (bagua_torch._views).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union, cast

import torch

import bagua_core
from bagua_core import agreement, algorithm_steps, config, devices
from bagua_core.algorithms import check_tensors
from bagua_core.autotune import AutotuneSession
from bagua_core.averager import AsyncAverager, weight_buckets
from bagua_core.dtypes import as_dtype
from bagua_core.engine import Engine, monotonic_ns
from bagua_core.errors import BaguaError
from bagua_core.process_group import ProcessGroup
from bagua_torch import _observe, _optimizers, _phases, _relayout, _sync
from bagua_torch._step_guard import StepGuard
from bagua_torch._views import bucket_tensors, same_memory
from bagua_torch.algorithms.base import Algorithm, AlgorithmImpl, as_algorithm
from bagua_torch.bucket import BaguaBucket
from bagua_torch.moe.experts import is_moe_param

if TYPE_CHECKING:
    from bagua_core.algorithms import Plan
    from bagua_torch.algorithms.async_model_average import AsyncModelAverageImpl

__all__ = ["BaguaDistributedDataParallel", "BaguaModule", "with_bagua"]


_IGNORE_ATTRS = ("_bagua_params_and_buffers_to_ignore", "_ddp_params_and_buffers_to_ignore")


def _expert_names(module: torch.nn.Module) -> set:
    """The parameters of MoE experts (``expert = True``): each rank trains its
    own, so they are neither broadcast nor averaged (see bagua_torch.moe)."""
    return {n for n, p in module.named_parameters() if is_moe_param(p)}


def _ignored_names(module: torch.nn.Module) -> set:
    """The names listed in the module's ignore attributes: parameter and
    buffer names exactly as ``named_parameters()`` / ``named_buffers()`` give
    them (e.g. ``"fc.weight"``, ``"weight"`` for the module's own). Raises
    ValueError for a name the module does not have (e.g. the original Bagua's
    ``".weight"`` or ``"<module name>.fc.weight"``), since a misspelt name
    would silently be communicated."""
    names = set()
    for attr in _IGNORE_ATTRS:
        listed = getattr(module, attr, None) or ()
        if isinstance(listed, str):
            listed = (listed,)
        for n in listed:
            if not isinstance(n, str):
                raise TypeError(f"module.{attr} must list parameter and buffer names (str), got {n!r}")
            names.add(n)
    known = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    known.update(n for n, _ in module.named_buffers(remove_duplicate=False))
    unknown = sorted(names - known)
    if unknown:
        example = next(iter(sorted(known)), "fc.weight")
        raise ValueError(
            f"{type(module).__name__} has no parameter or buffer named {', '.join(repr(n) for n in unknown)} "
            f"(listed in {' / '.join(_IGNORE_ATTRS)}); use the names of named_parameters() / "
            f"named_buffers(), e.g. {example!r}"
        )
    return names


class BaguaDistributedDataParallel:
    """The state of one wrapped model (``module.bagua_ddp``). Built by
    :func:`with_bagua` and :class:`bagua_torch.DistributedDataParallel`."""

    def __init__(
        self,
        module: torch.nn.Module,
        optimizers: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], None],
        algorithm: Union[Algorithm, Any],
        process_group: Optional[ProcessGroup] = None,
        module_name: Optional[str] = None,
        do_flatten: bool = True,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        bucket_bytes: Optional[int] = None,
        overlap_optimizer: bool = False,
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if isinstance(optimizers, torch.optim.Optimizer):
            optimizers = [optimizers]
        optimizers = list(optimizers or [])
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"optimizers must be torch.optim.Optimizer instances, got {type(opt).__name__}")
        group = bagua_core.get_default_group() if process_group is None else process_group
        if not isinstance(group, ProcessGroup):
            raise TypeError(f"process_group must be a bagua_core.ProcessGroup, got {type(group).__name__}")
        if not group.is_member:
            raise ValueError(f"this process (rank {bagua_core.get_rank()}) is not a member of {group!r}")
        self.module = module
        self.optimizers: List[torch.optim.Optimizer] = optimizers
        self.algorithm: Algorithm = as_algorithm(algorithm)
        self.process_group = group
        self.module_name = module_name or f"{type(module).__name__}_{id(module)}"
        self.do_flatten = bool(do_flatten)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.broadcast_buffers = bool(broadcast_buffers)
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.step_pending = False  # the engine has a step this wrapper must end
        # optimizer.step() applies each bucket as its exchange finishes (bagua_torch._overlap)
        self.overlap_optimizer = bool(overlap_optimizer)
        self._awaiting_optimizer = False  # overlap: backward ended, its step is still open
        self.bucket_params: List[List[torch.nn.Parameter]] = []  # per engine bucket, its parameters
        self._optimizer_spans: List[tuple] = []  # overlap, traced: (bucket, start ns, end ns) of this step
        self.engine: Engine = None  # type: ignore[assignment]  # set below; None only while a wrap fails
        self._hooks: list = []
        self._marked: set = set()
        self._callback_queued = False
        self._closed = False
        self._settings = config.load()
        self._tracer = None  # BAGUA_TRACE: this process's trace writer
        self.autotune: Optional[AutotuneSession] = None  # BAGUA_AUTOTUNE on a plan it can re-bucket
        self._t_forward = self._t_first_grad = self._t_backward_end = -1

        self.ignored = _ignored_names(module) | _expert_names(module)
        self.params = self._build_params()
        self._by_name: Dict[str, torch.nn.Parameter] = dict(self.params)
        self.device = self._model_device()
        devices.check_group_serves(group, self.device.type, "the model", self.device.index or 0)
        # None: plain host memory; else the engine's buckets live on this device
        self._engine_device = devices.for_arrays(self.device.type, self.device.index or 0)
        self.impl = self.algorithm.reify(group)
        self.plan = self.impl.plan
        # asynchronous model average: the engine runs the warm-up plan, a
        # background loop the weights' plan (see _build_weight_buckets)
        self.background_plan: Optional[Plan] = getattr(self.impl, "background_plan", None)
        self.averager: Optional[AsyncAverager] = None
        if self.background_plan is not None and not self.do_flatten:
            raise ValueError(
                f"{type(self.algorithm).__name__} supports do_flatten=True only: its background loop "
                "averages the weights in place, in the buckets the parameters are views of"
            )
        self.phase_driver = _phases.for_plan(self.plan, self.algorithm)  # what the hooks do, by phase
        self.phase_driver.check_optimizers(self)
        if self.plan.optimizer_state:
            _optimizers.check_own_optimizer(self)
        if self.overlap_optimizer:
            _optimizers.check_overlap_optimizer(self)

        agreement.check_same_everywhere(self._signature(), group, "the wrapped model")
        check_tensors(self.impl.description, [tuple(p.shape) for _, p in self.params])
        try:
            self.engine = Engine.for_group(
                group,
                hierarchical=bool(self.plan.params.get("hierarchical", False)),
                lanes=self._settings.engine_lanes,
                device=self._engine_device,
            )
            self.step_info = self.engine.check_step(self.plan)
            if self.background_plan is not None:
                algorithm_steps.check_plan(self.background_plan, group)
            self._broadcast_initial_state()
            self._build_buckets(bucket_bytes)
            if self.background_plan is not None:
                self._build_weight_buckets()
            self._register_hooks()
            _observe.start_observing(self, bucket_bytes)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ set-up

    def _build_params(self):
        for mod_name, m in self.module.named_modules():
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
                raise ValueError(
                    f"module '{mod_name}' ({type(m).__name__}): sparse gradients ({type(m).__name__}(sparse=True)) are not "
                    "supported by Bagua; use sparse=False"
                )
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad and n not in self.ignored]
        if not params:
            raise ValueError("the model has no parameter that requires grad (and is not ignored): nothing to train")
        for _, p in params:
            as_dtype(p.dtype)  # TypeError for dtypes the engine cannot carry
        return params

    def _model_device(self) -> torch.device:
        """The one device of the parameters and buffers the engine handles."""
        tensors = list(self.params) + [(n, b) for n, b in self.module.named_buffers() if n not in self.ignored]
        found: Dict[torch.device, str] = {}
        for n, t in tensors:
            found.setdefault(t.device, n)
        if len(found) > 1:
            seen = ", ".join(f"'{n}' on {d}" for d, n in found.items())
            raise ValueError(
                f"the model's tensors are on {len(found)} devices ({seen}); Bagua trains one device "
                "per process: move the model with model.to(device) before with_bagua"
            )
        device = next(iter(found))
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"the model is on {device}; Bagua trains on CPU and CUDA devices")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def _stream(self) -> Optional[int]:
        """The framework's current stream on the model's device (the producer
        of what is marked ready, the consumer of what wait() hands back), or
        None on the host."""
        if self.device.type == "cuda":
            return torch.cuda.current_stream(self.device).cuda_stream
        return None

    def _buffers(self) -> List[torch.Tensor]:
        return [b for n, b in self.module.named_buffers() if n not in self.ignored]

    def bucket_storages(self) -> set:
        """Addresses of the allocations behind this wrapper's buckets (what a
        tensor's ``untyped_storage().data_ptr()`` is when it lives in one)."""
        slots = list(getattr(self, "slots", {}).values()) + list(getattr(self, "weight_slots", {}).values())
        return {t.untyped_storage().data_ptr() for t in slots}

    def _signature(self) -> List[tuple]:
        sig: List[tuple] = [
            ("algorithm", type(self.algorithm).__name__, repr(self.algorithm.to_core())),
            (
                "setting",
                "BAGUA_AUTOTUNE",
                self._settings.autotune_level > 0,
                "BAGUA_AUTOTUNE_INTERVAL_STEPS",
                self._settings.autotune_interval_steps,
            ),
            ("setting", "BAGUA_ENGINE_LANES", self._settings.engine_lanes),
        ]
        for n, p in self.module.named_parameters():
            if n not in self.ignored:
                sig.append(("parameter", n, tuple(p.shape), str(p.dtype), "requires_grad" if p.requires_grad else ""))
        for n, b in self.module.named_buffers():
            if n not in self.ignored:
                sig.append(("buffer", n, tuple(b.shape), str(b.dtype)))
        names = {id(p): n for n, p in self.module.named_parameters()}
        for opt in self.optimizers:
            sig.extend(_sync.optimizer_signature(opt, names))
        return sig

    def _broadcast_initial_state(self) -> None:
        g = self.process_group
        with torch.no_grad():
            tensors = [p for n, p in self.module.named_parameters() if n not in self.ignored]
            _sync.broadcast_tensors(tensors + self._buffers(), 0, g)
        ignored = {id(p) for n, p in self.module.named_parameters() if n in self.ignored}
        for opt in self.optimizers:
            _sync.broadcast_optimizer_state(opt, 0, g, skip=ignored)

    def _build_buckets(self, bucket_bytes: Optional[int], order_names: Optional[Sequence[str]] = None) -> None:
        if order_names is None:
            order = list(reversed(self.params))  # backward produces gradients roughly in this order
        else:
            order = [(n, self._by_name[n]) for n in order_names]
        decls = [(n, tuple(p.shape), as_dtype(p.dtype)) for n, p in order]
        self.declared = [
            (n, p.numel(), _relayout.dtype_name(p.dtype)) for n, p in order
        ]  # what a saved state is planned from
        alignment = self.step_info.alignment
        if self.plan.one_bucket_per_dtype:
            by_dtype: Dict[object, list] = {}
            for n, shape, dt in decls:
                by_dtype.setdefault(dt, []).append((n, shape))
            buckets = [
                self.engine.add_bucket(str(i), tensors, dt, alignment)
                for i, (dt, tensors) in enumerate(by_dtype.items())
            ]
        else:
            buckets = self.engine.create_buckets(decls, bucket_bytes, alignment)
        self.buckets = buckets
        self.bucket_params = [[self._by_name[n] for n in b.tensor_names] for b in buckets]
        self.slots: Dict[str, torch.Tensor] = {}
        for b in buckets:
            self.slots.update(bucket_tensors(b, b.tensor_names))

        with torch.no_grad():
            for n, p in self.params:
                slot = self.slots[n]
                if self.communicates_weights:
                    slot.copy_(p.detach())
                    if self.do_flatten:
                        p.data = slot
                else:
                    if p.grad is not None:
                        slot.copy_(p.grad)
                    if self.do_flatten:
                        p.grad = slot
        # after the weights sit in the buckets: weight steps copy them at bind time
        self.impl.ops = [b.append_op(self.plan.step, **self.plan.params) for b in buckets]
        if self.plan.optimizer_state:
            _optimizers.link_optimizer_state(self)

    def _build_weight_buckets(self) -> None:
        """Asynchronous model average: one bucket per dtype holds the weights
        (the parameters become views of it), averaged in place by the
        background loop on its own clone of the group."""
        self.weight_buckets = weight_buckets(
            [(n, tuple(p.shape), p.dtype) for n, p in reversed(self.params)], self._engine_device
        )
        self.weight_slots: Dict[str, torch.Tensor] = {
            n: t for b in self.weight_buckets for n, t in bucket_tensors(b, b.slot_names).items()
        }
        with torch.no_grad():
            for n, p in self.params:
                slot = self.weight_slots[n]
                slot.copy_(p.detach())
                p.data = slot
        self.averager = AsyncAverager(
            self.process_group,
            self.weight_buckets,
            cast("Plan", self.background_plan),
            device=self._engine_device,
            producer_stream=self._stream,
        )
        impl = cast("AsyncModelAverageImpl", self.impl)
        impl.averager = self.averager
        impl.after_abort = self._broadcast_buffers_after_abort

    def _broadcast_buffers_after_abort(self) -> None:
        """After abort (every rank): rank 0's buffers (e.g. BatchNorm
        statistics), which asynchronous training does not keep in step."""
        if self.broadcast_buffers:
            with torch.no_grad():
                _sync.broadcast_tensors(self._buffers(), 0, self.process_group)

    def _background_before_forward(self) -> None:
        """Asynchronous model average: switches from the warm-up (gradient
        allreduce) to the background loop once the warm-up steps are done."""
        impl = cast("AsyncModelAverageImpl", self.impl)
        if not impl.in_warmup and self.plan is not self.background_plan:
            self.finish_step()
            self.plan = cast("Plan", self.background_plan)
            self.phase_driver = _phases.BackgroundDriver()
        impl.before_forward()

    def before_optimizer_step(self) -> None:
        """Called before each step of a wrapped optimizer (asynchronous model
        average holds the weights: the step never sees half an average)."""
        if not self._closed:
            self.phase_driver.before_optimizer_step(self)

    @property
    def communicates_weights(self) -> bool:
        return self.plan.communicates == "weights"

    def _register_hooks(self) -> None:
        self._hooks.append(self.module.register_forward_pre_hook(self._forward_pre_hook))
        owners: Dict[int, list] = {}
        params = {id(p): n for n, p in self.params}
        for m in self.module.modules():
            for leaf, p in m._parameters.items():
                if p is not None and id(p) in params:
                    owners.setdefault(id(m), [m, []])[1].append((leaf, p))
        for m, held in owners.values():
            self._hooks.append(m.register_load_state_dict_post_hook(functools.partial(self._keep_parameters, held)))
        for n, p in self.params:
            self._hooks.append(p.register_post_accumulate_grad_hook(functools.partial(self._grad_hook, n)))
            if self.overlap_optimizer:  # before the gradient is accumulated into its bucket slot
                self._hooks.append(p.register_hook(self._grad_pre_hook))
        for opt in self.optimizers:
            StepGuard.attach(opt, self)

    # ------------------------------------------------------------ hooks

    def _keep_parameters(self, held, module, incompatible_keys) -> None:
        """``load_state_dict(..., assign=True)`` swaps in new Parameter objects,
        while the hooks, bucket slots and optimizers hold the wrapped ones: the
        loaded values are copied into the wrapped Parameters, which go back in
        place, so training stays synchronised."""
        for leaf, kept in held:
            now = module._parameters.get(leaf)
            if now is kept or now is None:
                continue
            if now.shape != kept.shape or now.dtype != kept.dtype or now.device != kept.device:
                raise ValueError(
                    f"load_state_dict(assign=True) replaced parameter '{leaf}' of {type(module).__name__} "
                    f"({tuple(kept.shape)}, {kept.dtype}) by one of {tuple(now.shape)}, {now.dtype} on "
                    f"{now.device} after with_bagua: the engine's buckets cannot follow; load before wrapping"
                )
            with torch.no_grad():
                kept.copy_(now)
            module._parameters[leaf] = kept

    def _forward_pre_hook(self, module, inputs) -> None:
        if self._closed or not (module.training and torch.is_grad_enabled()):
            return
        if not self.require_backward_grad_sync:  # no_sync(): accumulate locally
            if self.overlap_optimizer:
                self.finish_step()  # a step whose optimizer step was skipped: its buckets are the gradients
            self.attach_gradients()
            return
        self.finish_step()  # a step left open (backward never ran)
        if self.averager is not None:
            self._background_before_forward()
        if self.autotune is not None:
            _observe.autotune_step(self)
        if self._tracer is not None:
            self._t_forward = monotonic_ns()
        if self.plan.optimizer_state:
            _optimizers.share_optimizer_state(self)
        if self.broadcast_buffers and self.phase_driver.broadcasts_buffers:
            with torch.no_grad():
                _sync.broadcast_tensors(self._buffers(), 0, self.process_group)
        self.attach_gradients()
        self.phase_driver.forward_start(self)

    def _grad_hook(self, name: str, param: torch.nn.Parameter) -> None:
        if self._closed or not self.require_backward_grad_sync:
            return
        if param.grad is not None and param.grad.layout != torch.strided:
            raise ValueError(f"parameter '{name}' got a sparse gradient; Bagua supports dense gradients only")
        if self._tracer is not None and self._t_first_grad < 0:
            self._t_first_grad = monotonic_ns()
        self.phase_driver.gradient_ready(self, name)
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._post_backward)

    def _grad_pre_hook(self, grad) -> None:
        """overlap_optimizer: a backward that starts while the last one's step
        is still open (its optimizer step skipped) ends that step first, as
        its gradients are about to be accumulated into the engine's buckets."""
        if self._awaiting_optimizer:
            self.finish_step()

    def _post_backward(self) -> None:
        self._callback_queued = False
        if self._closed:
            return
        if self._tracer is not None:
            self._t_backward_end = monotonic_ns()
        missing = self.phase_driver.backward_end(self)
        if self.overlap_optimizer and self.step_pending:
            self._awaiting_optimizer = True  # optimizer.step() waits, bucket by bucket
        else:
            self.finish_step()
        self.check_unused(missing)

    # ------------------------------------------------------------ helpers for the algorithms

    def attach_gradients(self) -> None:
        """With do_flatten, makes every gradient the view of its bucket slot
        again (zeroed) where ``zero_grad(set_to_none=True)`` dropped it."""
        if not self.do_flatten or self.communicates_weights:
            return
        with torch.no_grad():
            for n, p in self.params:
                if p.grad is None:
                    slot = self.slots[n]
                    slot.zero_()
                    p.grad = slot

    def mark_gradient_ready(self, name: str) -> None:
        """The gradient of ``name`` is final for this step: into its slot (a
        copy only when torch replaced the view), then ready."""
        p = self._by_name[name]
        slot = self.slots[name]
        g = p.grad
        with torch.no_grad():
            if g is None:
                slot.zero_()
            elif not same_memory(g, slot):
                slot.copy_(g)
            if self.do_flatten and not same_memory(g, slot):
                p.grad = slot
        self._marked.add(name)
        self.step_pending = True
        self.engine.mark_ready(name, self._stream())

    def mark_unused_gradients_ready(self) -> List[str]:
        """End of backward: marks ready the gradients of parameters that got
        none (their slots hold zeros, or what no_sync() accumulated), so the
        step completes on every rank. Returns their names unless
        find_unused_parameters allows them (see :meth:`check_unused`)."""
        if not self.step_pending:
            return []
        missing = [n for n, _ in self.params if n not in self._marked]
        for n in missing:
            self.mark_gradient_ready(n)
        return [] if self.find_unused_parameters else missing

    def check_unused(self, missing: List[str]) -> None:
        if missing:
            shown = ", ".join(repr(n) for n in missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise RuntimeError(
                f"{len(missing)} parameter(s) received no gradient in this backward pass ({shown}). Wrap with "
                "find_unused_parameters=True (bagua_torch.DistributedDataParallel) to communicate zeros for "
                "them, or list them in module._bagua_params_and_buffers_to_ignore"
            )

    def after_optimizer_step(self) -> None:
        """Called after each step of a wrapped optimizer: algorithms of the
        AFTER_OPTIMIZER_STEP phase communicate the updated weights now (the
        step decides whether this step communicates) and wait for it;
        asynchronous model average releases the weights."""
        if self.averager is not None:
            self.averager.unlock()
        if self._closed or not self.require_backward_grad_sync:
            return
        self.phase_driver.after_optimizer_step(self)

    def finish_step(self) -> None:
        """Ends the open step: waits for the engine (re-raising its failure)
        and applies the results (e.g. decentralized copy-back)."""
        if not self.step_pending:
            return
        self.step_pending = False
        self._awaiting_optimizer = False
        try:
            self.engine.wait(self._stream())
            if self._tracer is not None:
                _observe.trace_step(self)
            self._apply_results()
        finally:
            self._marked.clear()

    def wait_bucket_of_step(self, buckets: Sequence[int]) -> int:
        """overlap_optimizer: the lowest of ``buckets`` (indices) whose
        exchange has finished in the open step, waiting for one
        (:meth:`Engine.wait_any`); its results are then in the gradients torch
        uses. A failure ends the step and raises, as
        :meth:`finish_step` does."""
        try:
            i = self.engine.wait_any(buckets, self._stream())
        except BaseException:
            self.step_pending = self._awaiting_optimizer = False
            self._marked.clear()
            raise
        if not self.do_flatten:
            with torch.no_grad():
                for n, p in zip(self.buckets[i].tensor_names, self.bucket_params[i]):
                    if p.grad is None:
                        p.grad = self.slots[n].clone()
                    else:
                        p.grad.copy_(self.slots[n])
        return i

    def record_optimizer_span(self, bucket: int, start_ns: int, end_ns: int) -> None:
        _observe.record_optimizer_span(self, bucket, start_ns, end_ns)

    def trace_optimizer_step(self, start_ns: int, end_ns: int) -> None:
        """Traced: the optimizer step (and, overlapped, each bucket's part of
        it) as spans of the step just ended."""
        _observe.trace_optimizer_step(self, start_ns, end_ns)

    def _apply_results(self) -> None:
        """After engine.wait(): the results into the tensors torch uses."""
        if not self.communicates_weights:
            self.copy_slots_to_gradients()
            return
        self.phase_driver.apply_weights(self)

    def copy_slots_to_gradients(self) -> None:
        if self.do_flatten:
            return
        with torch.no_grad():
            for n, p in self.params:
                if p.grad is None:
                    p.grad = self.slots[n].clone()
                else:
                    p.grad.copy_(self.slots[n])

    def copy_weights_to_slots(self) -> None:
        with torch.no_grad():
            for n, p in self.params:
                slot = self.slots[n]
                if not same_memory(p.data, slot):
                    slot.copy_(p.detach())
                    if self.do_flatten:  # someone replaced p.data: put it back in the bucket
                        p.data = slot

    def copy_slots_to_weights(self) -> None:
        if self.do_flatten:
            return
        with torch.no_grad():
            for n, p in self.params:
                p.copy_(self.slots[n])

    # ------------------------------------------------------------ API

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Within this context gradients accumulate locally (no communication);
        the first backward after it communicates the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    @property
    def bagua_buckets(self) -> List[BaguaBucket]:
        """The engine's buckets in communication order, with torch views of
        their tensors and of the algorithm's per-bucket state
        (:class:`bagua_torch.bucket.BaguaBucket`)."""
        buckets = getattr(self, "buckets", []) if self.engine is not None else []
        ops = self.impl.ops if len(self.impl.ops) == len(buckets) else [None] * len(buckets)
        return [
            BaguaBucket(
                b, op, [self._by_name[n] for n in b.tensor_names], type(self.algorithm).__name__, self.impl.plan.step
            )
            for b, op in zip(buckets, ops)
        ]

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """The algorithm's state, for checkpoints: ``{"algorithm": name,
        "state": {...}}``, the step counter as an int (e.g. the Decentralized
        one, which decides when communication happens and which peer
        ``shift_one`` pairs with) and the steps' state as tensors (copies). The
        model's and optimizers' state are saved separately
        (``module.state_dict()``, ``optimizer.state_dict()``);
        :class:`bagua_torch.DistributedDataParallel` puts the same values in
        its state dict as tensor entries ``bagua.*``."""
        if self.overlap_optimizer:
            self.finish_step()  # the steps' state is final once the exchange ended
        return {"algorithm": self.algorithm.name, "state": self.impl.state_dict()}

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Restores what :meth:`state_dict` saved. Call it after wrapping (the
        wrap broadcasts rank 0's parameters, so load per-rank weights, e.g.
        decentralized replicas, after it too). A state saved with another
        algorithm raises ValueError, or is skipped when ``strict`` is False."""
        if not isinstance(state_dict, dict) or "algorithm" not in state_dict or "state" not in state_dict:
            raise ValueError(f"expected the dict of BaguaDistributedDataParallel.state_dict(), got {state_dict!r}")
        if state_dict["algorithm"] != self.algorithm.name:
            if not strict:
                return
            raise ValueError(
                f"the state was saved with algorithm {state_dict['algorithm']!r} but "
                f"{self.module_name} trains with {self.algorithm.name!r}"
            )
        self.finish_step()
        state = dict(state_dict["state"])
        if "step_state" in state and self.impl.ops and self.impl.keeps_state:
            state["step_state"] = _relayout.step_state_for(
                type(self.algorithm).__name__,
                state["step_state"],
                self.impl.ops,
                self.buckets,
                self.declared,
                self.step_info.alignment,
            )
        self.impl.load_state_dict(state)

    def close(self) -> None:
        """Removes the hooks, gives parameters and gradients their own memory
        back and stops the engine (used when the algorithm is switched)."""
        if self._closed:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for opt in self.optimizers:
            StepGuard.detach(opt, self)
        if self.averager is not None:
            cast("AsyncModelAverageImpl", self.impl).close()
            with torch.no_grad():
                for n, p in self.params:
                    if same_memory(p.data, self.weight_slots[n]):
                        p.data = self.weight_slots[n].clone()
        if self.engine is None:
            return
        try:
            self.finish_step()
        except BaguaError:
            pass  # the engine is broken; the new one starts clean
        with torch.no_grad():
            for n, p in self.params:
                slot = getattr(self, "slots", {}).get(n)
                if slot is None:
                    continue
                if same_memory(p.grad, slot):
                    p.grad = slot.clone()
                if same_memory(p.data, slot):
                    p.data = slot.clone()
            for p, view in getattr(self, "_shared_state", ()):
                state = self.optimizers[0].state.get(p, {})
                if state.get(self.plan.optimizer_state) is view:
                    state[self.plan.optimizer_state] = view.clone()
            if getattr(self, "_shared_state", None) is not None:
                self.optimizers[0].momentum_by_engine = None  # unwrapped: the optimizer alone again
        self.engine.close()

    def __repr__(self) -> str:
        return f"<BaguaDistributedDataParallel {self.module_name} {self.algorithm!r} buckets={len(self.bagua_buckets)}>"


def wrap(module: torch.nn.Module, *args: Any, **kwargs: Any) -> BaguaDistributedDataParallel:
    """Builds the module's BaguaDistributedDataParallel (``module.bagua_ddp``),
    first closing the previous one: wrapping again switches algorithm."""
    old = module.__dict__.pop("bagua_ddp", None)
    if old is not None:
        old.close()
    ddp = BaguaDistributedDataParallel(module, *args, **kwargs)
    module.__dict__["bagua_ddp"] = ddp
    return ddp


def with_bagua(
    self: torch.nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    algorithm: Union[Algorithm, Any],
    process_group: Optional[ProcessGroup] = None,
    do_flatten: bool = True,
    overlap_optimizer: bool = False,
) -> torch.nn.Module:
    """Makes this module train data-parallel with ``algorithm`` (a
    :mod:`bagua_torch.algorithms` algorithm or a :mod:`bagua_core.algorithms`
    description) and returns it. Call it on every rank of ``process_group``
    (default: all), after ``bagua_torch.init_process_group()``. Calling it
    again switches algorithm.

    Parameters and buffers named in ``self._bagua_params_and_buffers_to_ignore``
    or ``self._ddp_params_and_buffers_to_ignore`` (names as in
    ``named_parameters()``) are neither broadcast nor communicated.

    Checkpoints: ``self.state_dict()`` stays the plain model state; the
    algorithm's own state (e.g. the Decentralized step counter) is
    ``self.bagua_ddp.state_dict()``, restored with
    ``self.bagua_ddp.load_state_dict(...)`` after wrapping.

    ``overlap_optimizer=True`` (gradient algorithms that communicate during
    backward: GradientAllReduce, ByteGrad, LowRank, QAdam; optimizers that
    update each parameter on its own: torch's SGD, Adam, AdamW, Adamax, NAdam,
    RAdam, Adagrad, Adadelta, RMSprop, Rprop, ASGD, Adafactor, and
    QAdamOptimizer) overlaps the optimizer with the exchange: backward returns
    without waiting for it, and ``optimizer.step()`` updates each bucket's
    parameters as soon as that bucket's exchange has finished, with exactly
    the result of the ordinary step. The contract: between ``backward()`` and
    ``optimizer.step()`` the gradients are not final, so nothing may read or
    write them there (no gradient clipping, ``GradScaler.unscale_``, gradient
    logging or ``model.zero_grad(set_to_none=False)``); call
    ``self.bagua_ddp.finish_step()`` first to make them final when you must
    (that step is then not overlapped). Only the optimizers passed here may
    step the model (each communicated parameter must be in one of them). A
    skipped ``optimizer.step()`` is fine: ``optimizer.zero_grad()``, the next
    forward or the next backward ends the open step."""
    wrap(
        self,
        optimizers,
        algorithm,
        process_group,
        module_name=self.bagua_module_name,
        do_flatten=do_flatten,
        overlap_optimizer=overlap_optimizer,
    )
    return self


def _ddp_of(module: object) -> BaguaDistributedDataParallel:
    ddp = module.__dict__.get("bagua_ddp")
    if ddp is None:
        raise AttributeError(f"{type(module).__name__} is not wrapped: call module.with_bagua(...) first")
    return ddp


class BaguaModule:
    """Methods and properties added to ``torch.nn.Module`` by ``import bagua_torch``."""

    with_bagua = with_bagua

    @property
    def bagua_module_name(self) -> str:
        name = self.__dict__.get("_bagua_module_name")
        return name if name is not None else f"{type(self).__name__}_{id(self)}"

    @bagua_module_name.setter
    def bagua_module_name(self, name: str) -> None:
        self.__dict__["_bagua_module_name"] = str(name)

    @property
    def bagua_algorithm(self) -> AlgorithmImpl:
        """The algorithm bound to this wrapped module (its plan and step state)."""
        return _ddp_of(self).impl

    @property
    def bagua_optimizers(self) -> List[torch.optim.Optimizer]:
        """The optimizers given to :meth:`with_bagua`."""
        return _ddp_of(self).optimizers

    @property
    def bagua_buckets(self) -> List[BaguaBucket]:
        """The engine's buckets (see :attr:`BaguaDistributedDataParallel.bagua_buckets`)."""
        return _ddp_of(self).bagua_buckets


def _patch_torch_module() -> None:
    for name in ("with_bagua", "bagua_module_name", "bagua_algorithm", "bagua_optimizers", "bagua_buckets"):
        setattr(torch.nn.Module, name, BaguaModule.__dict__[name])
