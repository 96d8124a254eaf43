"""Every primitive x op x dtype against numpy, with numpy, torch and JAX arrays,
at world sizes 1-4; sub-groups; intra/inter-node groups (4 processes as 2
nodes of 2) and a hierarchical allreduce; bad input.

One multi-process session per world size runs every case (this file is also the
worker script); pytest reports each case on its own.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

from tests.harness import mp
from tests.harness.dlpack_structs import FakeDeviceArray

WORLD_SIZES = (1, 2, 3, 4)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8")
OPS = ("SUM", "PROD", "MIN", "MAX", "AVG")
FRAMEWORKS = ("numpy", "torch", "jax")


def case_names(ws: int):
    return [name for name, _ in cases(ws)]


def cases(ws: int):
    """(name, fn) of every case at world size ws; fns only run in workers."""
    out = []
    for fw in FRAMEWORKS:
        for prim in (
            "allreduce",
            "reduce",
            "allgather",
            "gather",
            "scatter",
            "reduce_scatter",
            "alltoall",
            "alltoall_v",
            "broadcast",
            "send_recv",
        ):
            if prim == "send_recv" and ws == 1:
                continue
            out.append((f"{prim}[{fw}]", functools.partial(globals()[f"case_{prim}"], fw)))
    out += [
        ("barrier_and_broadcast_object", case_barrier_and_object),
        ("empty_arrays_are_no_ops", case_empty),
        ("reduce_op_names", case_op_names),
        ("bad_input", case_bad_input),
        ("jax_results_are_zero_copy_buffers", case_jax_buffers),
    ]
    if ws >= 3:
        out.append(("new_group_of_odd_ranks", case_new_group))
    if ws == 4:
        out.append(("intra_inter_node_groups", case_node_groups))
        out.append(("hierarchical_allreduce_equals_flat", case_hierarchical))
    return out


# --- the workers ----------------------------------------------------------------

np = torch = jax = jnp = ml_dtypes = bc = None
RANK = WS = 0


def value(rank, n):
    """Small positive integers: sums, products and averages stay exact in every dtype."""
    return ((np.arange(n) + rank) % 3 + 1).astype(np.float64)


def reference(op, n):
    xs = np.stack([value(r, n) for r in range(WS)])
    if op == "SUM":
        return xs.sum(0)
    if op == "PROD":
        return xs.prod(0)
    if op == "MIN":
        return xs.min(0)
    if op == "MAX":
        return xs.max(0)
    return xs.sum(0) / WS  # AVG (integer dtypes: truncated, fixed in expect())


class Framework:
    """Makes arrays from float64 numpy values and reads them back as float64."""

    def __init__(self, name):
        self.name = name

    def make(self, values, dtype):
        values = np.asarray(values, dtype=np.float64)
        if self.name == "torch":
            return torch.from_numpy(values).to(getattr(torch, dtype))
        a = values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        return a if self.name == "numpy" else jnp.asarray(a)  # device_put: nothing to compile

    def zeros(self, shape, dtype):
        if self.name == "jax":
            return None  # immutable: results come back as bagua_core.Buffer
        return self.make(np.zeros(shape), dtype)

    def read(self, x):
        if isinstance(x, bc.Buffer):  # JAX results: viewed, not copied
            x = jnp.from_dlpack(x) if self.name == "jax" else torch.from_dlpack(x)
        if isinstance(x, torch.Tensor):
            return x.double().numpy()
        return np.asarray(x, dtype=np.float64)

    @property
    def inplace(self):
        return self.name != "jax"


def expect(got, want, what):
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    if got.shape != want.shape or not np.array_equal(got, want):
        raise AssertionError(f"{what}: got {got[:12]} want {want[:12]} (shapes {got.shape} {want.shape})")


def avg_ref(dtype, x):
    return np.trunc(x) if dtype.startswith(("int", "uint")) else x


def case_allreduce(fw):
    f = Framework(fw)
    for dtype in DTYPES:
        for op in OPS:
            n = 7
            want = avg_ref(dtype, reference(op, n)) if op == "AVG" else reference(op, n)
            x = f.make(value(RANK, n), dtype)
            out = bc.allreduce(x, f.zeros(n, dtype), op=getattr(bc.ReduceOp, op))
            expect(f.read(out), want, f"allreduce {dtype} {op}")
            expect(f.read(x), value(RANK, n), f"allreduce {dtype} {op} left send alone")
            if f.inplace:
                bc.allreduce_inplace(x, op=op.lower())
                expect(f.read(x), want, f"allreduce_inplace {dtype} {op}")


def case_reduce(fw):
    f = Framework(fw)
    dst = WS - 1
    for dtype in DTYPES:
        for op in OPS:
            n = 5
            want = avg_ref(dtype, reference(op, n)) if op == "AVG" else reference(op, n)
            x = f.make(value(RANK, n), dtype)
            out = bc.reduce(x, f.zeros(n, dtype) if RANK == dst else None, dst=dst, op=op)
            if RANK == dst:
                expect(f.read(out), want, f"reduce {dtype} {op}")
            else:
                assert out is None
            if f.inplace:
                bc.reduce_inplace(x, dst=dst, op=op)
                expect(f.read(x), want if RANK == dst else value(RANK, n), f"reduce_inplace {dtype} {op}")


def case_allgather(fw):
    f = Framework(fw)
    for dtype in DTYPES:
        n = 3
        want = np.concatenate([value(r, n) for r in range(WS)])
        out = bc.allgather(f.make(value(RANK, n), dtype), f.zeros(WS * n, dtype))
        expect(f.read(out), want, f"allgather {dtype}")
        if fw == "jax":
            assert out.shape == (WS, n), out.shape
        if f.inplace:
            t = f.make(np.where(np.arange(WS * n) // n == RANK, np.tile(value(RANK, n), WS), 0), dtype)
            bc.allgather_inplace(t)
            expect(f.read(t), want, f"allgather_inplace {dtype}")


def case_gather(fw):
    f = Framework(fw)
    dst = WS // 2
    for dtype in DTYPES:
        n = 4
        want = np.concatenate([value(r, n) for r in range(WS)])
        out = bc.gather(f.make(value(RANK, n), dtype), f.zeros(WS * n, dtype) if RANK == dst else None, dst)
        if RANK == dst:
            expect(f.read(out), want, f"gather {dtype}")
        else:
            assert out is None
        if f.inplace:
            if RANK == dst:
                t = f.make(np.where(np.arange(WS * n) // n == dst, np.tile(value(RANK, n), WS), 0), dtype)
            else:
                t = f.make(value(RANK, n), dtype)
            bc.gather_inplace(t, n, dst)
            expect(f.read(t), want if RANK == dst else value(RANK, n), f"gather_inplace {dtype}")


def case_scatter(fw):
    f = Framework(fw)
    src = WS - 1
    for dtype in DTYPES:
        n = 3
        full = np.arange(WS * n) % 7 + 1
        send = f.make(full, dtype) if RANK == src else None
        recv = f.zeros(n, dtype) if f.inplace else bc.empty(n, dtype)
        out = bc.scatter(send, recv, src)
        assert out is recv
        expect(f.read(out), full[RANK * n : (RANK + 1) * n], f"scatter {dtype}")
        if f.inplace:
            t = f.make(full if RANK == src else np.zeros(n), dtype)
            bc.scatter_inplace(t, n, src)
            expect(f.read(t), full if RANK == src else full[RANK * n : (RANK + 1) * n], f"scatter_inplace {dtype}")


def case_reduce_scatter(fw):
    f = Framework(fw)
    for dtype in DTYPES:
        for op in OPS:
            n = 2
            full = reference(op, WS * n)
            want = avg_ref(dtype, full) if op == "AVG" else full
            mine = want[RANK * n : (RANK + 1) * n]
            x = f.make(value(RANK, WS * n), dtype)
            out = bc.reduce_scatter(x, f.zeros(n, dtype), op=op)
            expect(f.read(out), mine, f"reduce_scatter {dtype} {op}")
            if f.inplace:
                bc.reduce_scatter_inplace(x, op=op)
                got = f.read(x)[RANK * n : (RANK + 1) * n]
                expect(got, mine, f"reduce_scatter_inplace {dtype} {op}")


def alltoall_payload(rank, n):
    # chunk j of rank i: 10*i + j + k/10-ish, small ints: 10*i + j + 1
    return np.repeat(np.arange(WS) + 10 * rank + 1, n).astype(np.float64)


def case_alltoall(fw):
    f = Framework(fw)
    for dtype in DTYPES:
        n = 2
        want = np.repeat(np.arange(WS) * 10 + RANK + 1, n)
        x = f.make(alltoall_payload(RANK, n), dtype)
        out = bc.alltoall(x, f.zeros(WS * n, dtype))
        expect(f.read(out), want, f"alltoall {dtype}")
        if f.inplace:
            bc.alltoall_inplace(x)
            expect(f.read(x), want, f"alltoall_inplace {dtype}")


def case_alltoall_v(fw):
    f = Framework(fw)

    def count(i, j):  # elements rank i sends to rank j
        return (i + 2 * j) % 3  # includes zeros

    for dtype in DTYPES:
        sc = [count(RANK, j) for j in range(WS)]
        sd = list(np.cumsum([0] + sc[:-1]))
        send = np.concatenate([np.full(sc[j], 10 * RANK + j + 1) for j in range(WS)] + [np.zeros(0)])
        rc = [count(i, RANK) for i in range(WS)]
        rd = [int(d) + 1 for d in np.cumsum([0] + rc[:-1])]  # one spare element in front
        want = np.concatenate([[0]] + [np.full(rc[i], 10 * i + RANK + 1) for i in range(WS)])
        recv = f.zeros(sum(rc) + 1, dtype) if f.inplace else bc.zeros(sum(rc) + 1, dtype)
        out = bc.alltoall_v(f.make(send, dtype), sc, sd, recv, rc, rd)
        assert out is recv
        expect(f.read(out), want, f"alltoall_v {dtype}")
        # recv=None: a buffer just large enough for the last chunk
        out = bc.alltoall_v(f.make(send, dtype), sc, sd, None, rc, [d - 1 for d in rd])
        assert isinstance(out, bc.Buffer) and out.numel == (sum(rc) if any(rc) else 0), out
        expect(f.read(out), want[1:], f"alltoall_v recv=None {dtype}")
        # Bagua 0.9.2's cumulative form: one more displacement, where the last chunk ends
        cumulative = [d - 1 for d in rd] + [rd[-1] - 1 + rc[-1]]
        out = bc.alltoall_v(f.make(send, dtype), sc, sd + [sd[-1] + sc[-1]], None, rc, cumulative)
        expect(f.read(out), want[1:], f"alltoall_v cumulative displacements {dtype}")
    if f.inplace:
        # same counts both ways: symmetric count matrix
        c = [1 + (RANK + j) % 2 for j in range(WS)]
        d = list(np.cumsum([0] + c[:-1]))
        t = f.make(np.concatenate([np.full(c[j], 10 * RANK + j + 1) for j in range(WS)]), "float32")
        bc.alltoall_v_inplace(t, c, d)
        expect(f.read(t), np.concatenate([np.full(c[i], 10 * i + RANK + 1) for i in range(WS)]), "alltoall_v_inplace")


def case_broadcast(fw):
    f = Framework(fw)
    src = WS - 1
    for dtype in DTYPES:
        n = 6
        if fw == "jax":
            # immutable: src may pass its jax array, the others a writable Buffer
            x = f.make(value(RANK, n), dtype)
            t = x if RANK == src else bc.from_array(x)
        else:
            t = f.make(value(RANK, n), dtype)
        assert bc.broadcast(t, src) is None
        expect(f.read(t), value(src, n), f"broadcast {dtype}")


def case_send_recv(fw):
    f = Framework(fw)
    nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
    for dtype in DTYPES:
        x = f.make(value(RANK, 5), dtype)
        r = f.zeros(5, dtype) if f.inplace else bc.empty(5, dtype)
        if RANK % 2 == 0:
            bc.send(x, nxt)
            bc.recv(r, prv)
        else:
            bc.recv(r, prv)
            bc.send(x, nxt)
        expect(f.read(r), value(prv, 5), f"send/recv {dtype}")


def case_barrier_and_object(_=None):
    bc.barrier()
    obj = {"rank": RANK, "payload": list(range(RANK + 3)), "text": "é" * 50}
    got = bc.broadcast_object(obj, src=WS - 1)
    assert got == {"rank": WS - 1, "payload": list(range(WS + 2)), "text": "é" * 50}, got
    assert bc.broadcast_object(None, src=0) is None


def case_empty(_=None):
    e = np.zeros(0, np.float32)
    assert bc.allreduce(e, np.zeros(0, np.float32)).size == 0
    assert bc.allreduce(e).numel == 0
    bc.allreduce_inplace(e)
    bc.broadcast(e)
    bc.allgather(e, np.zeros(0, np.float32))
    bc.allgather_inplace(e)
    bc.reduce(e, np.zeros(0, np.float32))
    bc.reduce_scatter(e)
    bc.alltoall(e)
    bc.gather(e, np.zeros(0, np.float32) if RANK == 0 else None)
    bc.scatter(e if RANK == 0 else None, np.zeros(0, np.float32))
    bc.alltoall_v(e, [0] * WS, [0] * WS, None, [0] * WS, [0] * WS)
    if WS > 1:
        bc.send(e, (RANK + 1) % WS)  # nothing on the wire: no matching recv needed
        bc.recv(e, (RANK + 1) % WS)
    assert bc.allreduce(torch.zeros(0, 3)).shape == (0, 3)


def case_op_names(_=None):
    x = np.full(3, RANK + 1, np.int64)
    for name, want in [
        ("sum", WS * (WS + 1) // 2),
        ("max", WS),
        ("min", 1),
        ("avg", (WS + 1) // 2),
        ("prod", int(np.prod(np.arange(1, WS + 1)))),
        (3, WS),
        (bc.ReduceOp.PRODUCT, None),
    ]:
        out = bc.allreduce(x, op=name)
        if want is not None:
            expect(out.numpy(), np.full(3, want), f"op {name!r}")


def raises(exc, match, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        if match not in str(e):
            raise AssertionError(f"{fn.__name__}: message {str(e)!r} lacks {match!r}") from e
        return
    except Exception as e:
        raise AssertionError(f"{fn.__name__}: raised {type(e).__name__}: {e}, expected {exc.__name__}") from e
    raise AssertionError(f"{fn.__name__}: did not raise {exc.__name__} ({match})")


def case_bad_input(_=None):
    f32, i32 = np.zeros(4 * WS, np.float32), np.zeros(4 * WS, np.int32)
    raises(TypeError, "send is float32 but recv is int32", bc.allreduce, f32, i32)
    raises(ValueError, "recv has", bc.allreduce, f32, np.zeros(3, np.float32))
    raises(ValueError, "expected", bc.allgather, f32, np.zeros(4 * WS * WS + 1, np.float32))
    raises(ValueError, "read-only", bc.allreduce, f32, jnp.zeros(4 * WS, jnp.float32))
    raises(ValueError, "read-only", bc.allreduce_inplace, jnp.zeros(4, jnp.float32))
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    raises(ValueError, "read-only", bc.allreduce_inplace, ro)
    bc.allreduce(ro)  # read-only input is fine
    raises(ValueError, "not C-contiguous", bc.allreduce_inplace, np.zeros((4, 4), np.float32)[:, ::2])
    raises(TypeError, "complex64", bc.allreduce, np.zeros(3, np.complex64))
    raises(TypeError, "bool", bc.allreduce, torch.zeros(3, dtype=torch.bool))
    raises(TypeError, "DLPack", bc.allreduce, [1.0, 2.0])
    raises(ValueError, "unknown reduce op", bc.allreduce, f32, op="median")
    raises(ValueError, "unknown reduce op", bc.allreduce, f32, op=5)  # LAND: in the original engine, never exposed
    raises(TypeError, "op must be", bc.allreduce, f32, op=1.5)
    raises(ValueError, "out of range", bc.broadcast, f32, WS)
    raises(ValueError, "out of range", bc.reduce, f32, None, -1)
    raises(TypeError, "integer rank", bc.send, f32, "1")
    raises(ValueError, "cuda array", bc.allreduce, FakeDeviceArray(4))
    raises(TypeError, "required", bc.scatter, f32, None)
    if WS > 1:
        raises(ValueError, "not a multiple", bc.reduce_scatter, np.zeros(4 * WS + 1, np.float32))
        raises(ValueError, "not a multiple", bc.allgather_inplace, np.zeros(4 * WS + 1, np.float32))
        raises(ValueError, "not a multiple", bc.alltoall, np.zeros(4 * WS + 1, np.float32))
    raises(
        ValueError, "one entry per rank", bc.alltoall_v, f32, [1] * (WS + 1), [0] * (WS + 1), None, [1] * WS, [0] * WS
    )
    raises(ValueError, "must be where the last", bc.alltoall_v, f32, [1] * WS, [0] * WS + [7], None, [1] * WS, [0] * WS)
    raises(ValueError, "negative", bc.alltoall_v, f32, [-1] * WS, [0] * WS, None, [1] * WS, [0] * WS)
    raises(ValueError, "reach element", bc.alltoall_v, f32, [5] * WS, [4 * WS] * WS, None, [1] * WS, [0] * WS)
    if RANK == 0:
        raises(ValueError, "x count", bc.gather_inplace, f32, 3, 0)
    raises(TypeError, "ProcessGroup", bc.allreduce, f32, group="world")
    bc.barrier()  # nobody got out of step


def case_jax_buffers(_=None):
    x = jnp.arange(10, dtype=jnp.float32) + RANK
    out = bc.allreduce(x)
    assert isinstance(out, bc.Buffer) and out.shape == (10,) and out.address % 64 == 0
    j = jnp.from_dlpack(out)
    assert j.unsafe_buffer_pointer() == out.address, "jnp.from_dlpack must view the buffer"
    expect(j, np.arange(10) * WS + WS * (WS - 1) / 2, "jax allreduce")
    # a jax array is a valid source for writing into a Buffer, including donated views
    buf = bc.zeros(10, "float32")
    bc.allreduce(x, buf)
    expect(jnp.from_dlpack(buf), j, "allreduce into a Buffer")


def case_new_group():
    odd = bc.new_group([r for r in range(WS) if r % 2 == 1][::-1])  # unsorted on purpose
    assert odd.ranks == tuple(r for r in range(WS) if r % 2 == 1)
    x = np.full(3, RANK, np.float64)
    out = bc.allreduce(x, op="sum", group=odd)
    if RANK % 2:
        assert odd.is_member and odd.rank == odd.ranks.index(RANK) and odd.comm is not None
        assert isinstance(odd.handle, int)
        expect(out.numpy(), np.full(3, sum(odd.ranks)), "odd allreduce")
        bc.broadcast(x, src=0, group=odd)
        expect(x, np.full(3, odd.ranks[0]), "odd broadcast (group rank 0)")
    else:
        assert not odd.is_member and odd.rank == -1 and odd.comm is None and odd.handle is None
        assert out is None
        y = np.full(3, RANK, np.float64)
        for call in (
            lambda: bc.allreduce_inplace(y, group=odd),
            lambda: bc.barrier(odd),
            lambda: bc.broadcast(y, 0, odd),
            lambda: bc.send(y, 0, odd),
        ):
            assert call() is None
        expect(y, np.full(3, RANK), "non-member untouched")
    single = bc.new_group([WS - 1])
    if RANK == WS - 1:
        expect(bc.allreduce(x, group=single).numpy(), x, "group of one")
    raises(ValueError, "out of range", bc.new_group, [0, WS])
    raises(ValueError, "duplicate", bc.new_group, [0, 0])
    nobody = bc.new_group([])  # as in Bagua 0.9.2: a group no rank is in, collectives return at once
    assert not nobody.is_member and nobody.size == 0 and bc.allreduce(x, group=nobody) is None
    raises(TypeError, "integers", bc.new_group, [0.5])
    bc.barrier()


def case_node_groups():
    world = bc.get_default_group()
    intra, inter = world.intra_node_group(), world.inter_node_group()
    node = RANK // 2
    assert intra.ranks == (2 * node, 2 * node + 1) and intra.rank == RANK % 2, intra
    assert inter.ranks == (0, 2) and inter.is_member == (RANK % 2 == 0), inter
    assert world.intra_node_group() is intra  # created once
    expect(bc.allreduce(np.full(2, RANK, np.int64), group=intra).numpy(), np.full(2, 4 * node + 1), "intra")
    if inter.is_member:
        expect(bc.allreduce(np.full(2, RANK, np.int64), group=inter).numpy(), np.full(2, 2), "inter")
    # a sub-group splits by node too: [1, 2, 3] -> nodes {1} and {2, 3}; leaders 1 and 2
    sub = bc.new_group([1, 2, 3])
    if sub.is_member:
        si, se = sub.intra_node_group(), sub.inter_node_group()
        assert si.ranks == ((1,) if node == 0 else (2, 3)), si
        assert se.ranks == (1, 2) and se.is_member == (RANK in (1, 2)), se
        expect(bc.allreduce(np.full(1, RANK, np.int64), group=si).numpy(), np.full(1, sum(si.ranks)), "sub intra")
        if se.is_member:
            expect(bc.allreduce(np.full(1, RANK, np.int64), group=se).numpy(), np.full(1, 3), "sub inter")
    else:
        assert not sub.intra_node_group().is_member and not sub.inter_node_group().is_member
    bc.barrier()


def case_hierarchical():
    world = bc.get_default_group()
    intra, inter = world.intra_node_group(), world.inter_node_group()
    x = (np.arange(1000) * (RANK + 1) % 17).astype(np.float64)
    flat = bc.allreduce(x).numpy()
    t = x.copy()
    bc.reduce_inplace(t, dst=0, group=intra)  # node leader holds the node's sum
    bc.allreduce_inplace(t, group=inter)  # leaders: the global sum (no-op elsewhere)
    bc.broadcast(t, src=0, group=intra)  # back to every rank of the node
    expect(t, flat, "hierarchical == flat")


def worker_main(ws: int) -> int:
    global np, torch, jax, jnp, ml_dtypes, bc, RANK, WS
    import jax as _jax
    import jax.numpy as _jnp
    import ml_dtypes as _ml
    import numpy
    import torch as _torch

    import bagua_core
    from tests.harness.worker import run_cases

    np, torch, jax, jnp, ml_dtypes, bc = numpy, _torch, _jax, _jnp, _ml, bagua_core
    assert jax.config.jax_enable_x64, "the session enables x64 so that int64/float64 stay 64-bit"
    bc.init_process_group()
    RANK, WS = bc.get_rank(), bc.get_world_size()
    assert WS == ws
    failures = run_cases(cases(ws))
    bc.destroy_process_group()
    return 0 if failures == 0 else 1


# --- the parent: one session per world size -----------------------------------


@functools.lru_cache(maxsize=None)
def session(ws: int) -> mp.Run:
    return mp.launch(
        os.path.abspath(__file__),
        ws,
        timeout=150,
        args=[str(ws)],
        local_world_size=2 if ws == 4 else None,
        env={"JAX_ENABLE_X64": "1", "BAGUA_TIMEOUT": "30"},
    )


@pytest.mark.parametrize("ws,case", [(ws, c) for ws in WORLD_SIZES for c in case_names(ws)])
def test_case(ws, case):
    run = session(ws)
    got = run.cases().get(case, {})
    missing = [r for r in range(ws) if r not in got]
    assert not missing, f"ranks {missing} did not report {case}\n{run.summary()}"
    errors = {r: rec["error"] for r, rec in got.items() if not rec["ok"]}
    assert not errors, "\n".join(f"--- rank {r}\n{e}" for r, e in sorted(errors.items()))


def test_sessions_exit_cleanly():
    for ws in WORLD_SIZES:
        session(ws).check()


if __name__ == "__main__":
    sys.exit(worker_main(int(sys.argv[1])))
