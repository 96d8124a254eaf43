"""GPU worker: every NcclCommunicator operation on torch CUDA tensors, checked
against torch CPU results. Started by tests/core/test_cuda_nccl.py through
tests.harness.mp.launch (one process per GPU, or a single process on a single GPU).

Every rank builds every rank's inputs from seeded generators, so each one
computes the expected results locally on the CPU.
"""

import os
import sys

import torch

from bagua_core import _C, _nccl
from tests.gpu.nccl_cases import DTYPES, OPS
from tests.harness.worker import run_cases

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEVICE = RANK % torch.cuda.device_count()
TIMEOUT_S = 60.0
N = 1037  # odd on purpose

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
}
CODE = dict(DTYPES)
OP_CODE = dict(OPS)
SUM, AVG = OP_CODE["sum"], OP_CODE["avg"]
kernels = _C.kernels


def is_float(dtype):
    return dtype.is_floating_point


def make_input(rank, n, dtype_name, seed, op="sum"):
    """Small integers, so sums and products are exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if op == "prod":
        v = torch.randint(1, 3, (n,), generator=g)  # 1 or 2
    elif dtype_name == "uint8":
        v = torch.randint(0, 4, (n,), generator=g)
    else:
        v = torch.randint(-3, 4, (n,), generator=g)
    return v.to(TORCH_DTYPES[dtype_name])


def reduce_ref(inputs, op, dtype):
    """Expected reduction of the ranks' CPU inputs."""
    wide = torch.stack([x.to(torch.float64 if is_float(dtype) else torch.int64) for x in inputs])
    if op == "sum":
        out = wide.sum(0)
    elif op == "prod":
        out = wide.prod(0)
    elif op == "min":
        out = wide.amin(0)
    elif op == "max":
        out = wide.amax(0)
    elif op == "avg":
        s = wide.sum(0)
        out = s / len(inputs) if is_float(dtype) else torch.div(s, len(inputs), rounding_mode="trunc")
    else:
        raise ValueError(op)
    return out.to(dtype)


def check(actual_gpu, expected_cpu, what=""):
    actual = actual_gpu.cpu()
    assert actual.dtype == expected_cpu.dtype, (actual.dtype, expected_cpu.dtype)
    if is_float(actual.dtype):
        tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(actual.dtype, 1e-6)
        torch.testing.assert_close(actual.double(), expected_cpu.double(), rtol=tol, atol=tol, msg=what)
    else:
        assert torch.equal(actual, expected_cpu), f"{what}: {actual[:8]} != {expected_cpu[:8]}"


def gpu(t):
    return t.to(f"cuda:{DEVICE}")


_servers = []  # rank 0's store server lives as long as the process


def make_store():
    """Bagua's rendezvous store: the server on rank 0 at MASTER_PORT + 1."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
    if RANK == 0:
        _servers.append(_C.TcpStoreServer(host, port))
    return _C.TcpStore(host, port, RANK, TIMEOUT_S)


class UserStream:
    """A side stream that waits for the default stream; ops get its handle."""

    def __enter__(self):
        self.stream = torch.cuda.Stream(device=DEVICE)
        self.stream.wait_stream(torch.cuda.current_stream(DEVICE))
        return self.stream.cuda_stream

    def __exit__(self, *exc):
        self.stream.synchronize()


def main():
    torch.cuda.set_device(DEVICE)
    store = make_store()
    comm = _nccl.create_communicator(store, "test/nccl", RANK, WORLD, DEVICE, timeout_s=TIMEOUT_S)
    comm_div = _nccl.create_communicator(
        store, "test/nccl_div", RANK, WORLD, DEVICE, timeout_s=TIMEOUT_S, native_avg=False
    )
    print(f"rank {RANK}: {comm!r} NCCL {_nccl.version_string(_nccl.version())}", flush=True)

    cases = []

    def case(name):
        def deco(fn):
            cases.append((name, fn))
            return fn

        return deco

    def allreduce_case(dname, oname, seed):
        def fn():
            dtype = TORCH_DTYPES[dname]
            inputs = [make_input(r, N, dname, seed, oname) for r in range(WORLD)]
            send = gpu(inputs[RANK])
            recv = torch.empty_like(send)
            comm.allreduce(send.data_ptr(), recv.data_ptr(), N, CODE[dname], OP_CODE[oname])
            check(recv, reduce_ref(inputs, oname, dtype), f"allreduce {dname} {oname}")
            check(send, inputs[RANK], "send buffer untouched")

        return fn

    seed = 0
    for dname, _ in DTYPES:
        for oname, _ in OPS:
            seed += 1
            cases.append((f"allreduce_{dname}_{oname}", allreduce_case(dname, oname, seed)))

    @case("allreduce_user_stream")
    def _():
        inputs = [make_input(r, N, "float32", 101) for r in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.zeros_like(send)
        with UserStream() as s:
            comm.allreduce(send.data_ptr(), recv.data_ptr(), N, CODE["float32"], SUM, stream=s)
        check(recv, reduce_ref(inputs, "sum", torch.float32))

    @case("allreduce_inplace")
    def _():
        inputs = [make_input(r, N, "int64", 102) for r in range(WORLD)]
        buf = gpu(inputs[RANK])
        comm.allreduce(buf.data_ptr(), buf.data_ptr(), N, CODE["int64"], SUM)
        check(buf, reduce_ref(inputs, "sum", torch.int64))

    @case("allreduce_avg_divide_kernel")
    def _():
        for dname in ("float32", "float16", "bfloat16", "int32", "uint8"):
            inputs = [make_input(r, N, dname, 103) for r in range(WORLD)]
            send = gpu(inputs[RANK])
            recv = torch.empty_like(send)
            comm_div.allreduce(send.data_ptr(), recv.data_ptr(), N, CODE[dname], AVG)
            check(recv, reduce_ref(inputs, "avg", TORCH_DTYPES[dname]), f"avg by SUM + divide {dname}")

    @case("reduce")
    def _():
        root = WORLD - 1
        inputs = [make_input(r, N, "float64", 104) for r in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.full_like(send, -7.0)
        comm.reduce(send.data_ptr(), recv.data_ptr(), N, CODE["float64"], OP_CODE["max"], root)
        if RANK == root:
            check(recv, reduce_ref(inputs, "max", torch.float64))
        else:
            check(recv, torch.full((N,), -7.0, dtype=torch.float64), "non-root recv untouched")

    @case("reduce_avg_divide_kernel")
    def _():
        root = 0
        inputs = [make_input(r, N, "float32", 105) for r in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.zeros_like(send)
        # non-root ranks may pass a null recv
        recv_ptr = recv.data_ptr() if RANK == root else 0
        comm_div.reduce(send.data_ptr(), recv_ptr, N, CODE["float32"], AVG, root)
        if RANK == root:
            check(recv, reduce_ref(inputs, "avg", torch.float32))

    @case("broadcast")
    def _():
        root = WORLD - 1
        inputs = [make_input(r, N, "bfloat16", 106) for r in range(WORLD)]
        buf = gpu(inputs[RANK])
        with UserStream() as s:
            comm.broadcast(buf.data_ptr(), N, CODE["bfloat16"], root, stream=s)
        check(buf, inputs[root])

    @case("allgather")
    def _():
        inputs = [make_input(r, N, "int32", 107) for r in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.zeros(WORLD * N, dtype=torch.int32, device=send.device)
        comm.allgather(send.data_ptr(), recv.data_ptr(), N, CODE["int32"])
        check(recv, torch.cat(inputs))

    @case("allgather_inplace")
    def _():
        inputs = [make_input(r, N, "float16", 108) for r in range(WORLD)]
        recv = torch.zeros(WORLD * N, dtype=torch.float16, device=f"cuda:{DEVICE}")
        recv[RANK * N : (RANK + 1) * N] = gpu(inputs[RANK])
        own = recv[RANK * N :]
        comm.allgather(own.data_ptr(), recv.data_ptr(), N, CODE["float16"])
        check(recv, torch.cat(inputs))

    @case("gather")
    def _():
        root = WORLD // 2
        inputs = [make_input(r, N, "uint8", 109) for r in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.zeros(WORLD * N, dtype=torch.uint8, device=send.device)
        with UserStream() as s:
            comm.gather(send.data_ptr(), recv.data_ptr(), N, CODE["uint8"], root, stream=s)
        if RANK == root:
            check(recv, torch.cat(inputs))
        else:
            check(recv, torch.zeros(WORLD * N, dtype=torch.uint8), "non-root recv untouched")

    @case("scatter")
    def _():
        root = WORLD - 1
        chunks = [make_input(r, N, "float32", 110) for r in range(WORLD)]
        send = gpu(torch.cat(chunks)) if RANK == root else None
        recv = torch.zeros(N, dtype=torch.float32, device=f"cuda:{DEVICE}")
        comm.scatter(send.data_ptr() if send is not None else 0, recv.data_ptr(), N, CODE["float32"], root)
        check(recv, chunks[RANK])

    def reduce_scatter_case(c, oname, seed):
        def fn():
            # inputs[r] holds WORLD chunks; rank k gets the reduction of chunk k
            inputs = [make_input(r, WORLD * N, "float32", seed) for r in range(WORLD)]
            send = gpu(inputs[RANK])
            recv = torch.zeros(N, dtype=torch.float32, device=send.device)
            c.reduce_scatter(send.data_ptr(), recv.data_ptr(), N, CODE["float32"], OP_CODE[oname])
            full = reduce_ref(inputs, oname, torch.float32)
            check(recv, full[RANK * N : (RANK + 1) * N])

        return fn

    cases.append(("reduce_scatter_sum", reduce_scatter_case(comm, "sum", 111)))
    cases.append(("reduce_scatter_avg", reduce_scatter_case(comm, "avg", 112)))
    cases.append(("reduce_scatter_avg_divide_kernel", reduce_scatter_case(comm_div, "avg", 113)))

    @case("alltoall")
    def _():
        # chunk j of rank i's send goes to rank j
        inputs = [make_input(r, WORLD * N, "int64", 114) for r in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.zeros_like(send)
        with UserStream() as s:
            comm.alltoall(send.data_ptr(), recv.data_ptr(), N, CODE["int64"], stream=s)
        expected = torch.cat([inputs[i][RANK * N : (RANK + 1) * N] for i in range(WORLD)])
        check(recv, expected)

    @case("alltoall_v")
    def _():
        # rank i sends (i + j + 1) elements to rank j, packed in rank order
        def counts_from(i):
            return [i + j + 1 for j in range(WORLD)]

        def displs(counts):
            out, acc = [], 0
            for c in counts:
                out.append(acc)
                acc += c
            return out

        inputs = [make_input(r, sum(counts_from(r)), "float64", 115) for r in range(WORLD)]
        send_counts = counts_from(RANK)
        recv_counts = [i + RANK + 1 for i in range(WORLD)]
        send = gpu(inputs[RANK])
        recv = torch.zeros(sum(recv_counts), dtype=torch.float64, device=send.device)
        comm.alltoall_v(
            send.data_ptr(),
            send_counts,
            displs(send_counts),
            recv.data_ptr(),
            recv_counts,
            displs(recv_counts),
            CODE["float64"],
        )
        expected = []
        for i in range(WORLD):
            off = displs(counts_from(i))[RANK]
            expected.append(inputs[i][off : off + counts_from(i)[RANK]])
        check(recv, torch.cat(expected))

    @case("send_recv")
    def _():
        if WORLD == 1:
            return  # a rank cannot send to itself
        # pairs (0,1), (2,3)...: even ranks send first, odd ranks receive first
        inputs = [make_input(r, N, "float32", 116) for r in range(WORLD)]
        peer = RANK + 1 if RANK % 2 == 0 else RANK - 1
        if peer >= WORLD:
            return  # odd world size: the last rank has no partner
        send = gpu(inputs[RANK])
        recv = torch.zeros_like(send)
        with UserStream() as s:
            if RANK % 2 == 0:
                comm.send(send.data_ptr(), N, CODE["float32"], peer, stream=s)
                comm.recv(recv.data_ptr(), N, CODE["float32"], peer, stream=s)
            else:
                comm.recv(recv.data_ptr(), N, CODE["float32"], peer, stream=s)
                comm.send(send.data_ptr(), N, CODE["float32"], peer, stream=s)
        check(recv, inputs[peer])

    @case("barrier")
    def _():
        comm.barrier()
        with UserStream() as s:
            comm.barrier(stream=s)

    @case("empty_is_noop")
    def _():
        x = torch.zeros(4, device=f"cuda:{DEVICE}")
        comm.allreduce(x.data_ptr(), x.data_ptr(), 0, CODE["float32"], SUM)
        comm.allreduce(0, 0, 0, CODE["float32"], SUM)  # null buffers are fine when empty
        comm.broadcast(0, 0, CODE["float32"], 0)
        comm.alltoall_v(0, [0] * WORLD, [0] * WORLD, 0, [0] * WORLD, [0] * WORLD, CODE["float32"])

    @case("bad_arguments")
    def _():
        x = torch.zeros(N, device=f"cuda:{DEVICE}")
        host = torch.zeros(N)
        bad = [
            lambda: comm.allreduce(host.data_ptr(), host.data_ptr(), N, CODE["float32"], SUM),
            lambda: comm.allreduce(x.data_ptr(), x.data_ptr(), N, 99, SUM),
            lambda: comm.allreduce(x.data_ptr(), x.data_ptr(), N, CODE["float32"], 7),
            lambda: comm.allreduce(0, x.data_ptr(), N, CODE["float32"], SUM),
            lambda: comm.broadcast(x.data_ptr(), N, CODE["float32"], WORLD),
            lambda: comm.send(x.data_ptr(), N, CODE["float32"], RANK),
            lambda: (
                comm.alltoall_v(x.data_ptr(), [1], [0], x.data_ptr(), [1], [0], CODE["float32"])
                if WORLD > 1
                else comm.alltoall_v(x.data_ptr(), [1, 1], [0, 1], x.data_ptr(), [1, 1], [0, 1], CODE["float32"])
            ),
        ]
        if torch.cuda.device_count() > 1:
            other = torch.zeros(N, device=f"cuda:{(DEVICE + 1) % torch.cuda.device_count()}")
            bad.append(lambda: comm.allreduce(other.data_ptr(), other.data_ptr(), N, CODE["float32"], SUM))
        for i, call in enumerate(bad):
            try:
                call()
            except ValueError:
                continue
            raise AssertionError(f"bad call #{i} did not raise ValueError")
        # the communicator still works after rejected calls
        y = gpu(torch.ones(N))
        comm.allreduce(y.data_ptr(), y.data_ptr(), N, CODE["float32"], SUM)
        check(y, torch.full((N,), float(WORLD)))

    @case("many_ops_user_stream")
    def _():
        # many ops in flight at once on one stream: exercises the watchdog's queue
        inputs = [make_input(r, N, "float32", 117) for r in range(WORLD)]
        bufs = [gpu(inputs[RANK]) for _ in range(200)]
        with UserStream() as s:
            for b in bufs:
                comm.allreduce(b.data_ptr(), b.data_ptr(), N, CODE["float32"], SUM, stream=s)
        expected = reduce_ref(inputs, "sum", torch.float32)
        for b in bufs:
            check(b, expected)

    def kernel_case(kind, dname):
        def fn():
            dtype = TORCH_DTYPES[dname]
            g = torch.Generator().manual_seed(118)
            if dname == "uint8":
                x = torch.randint(0, 256, (N,), generator=g).to(dtype)
            elif is_float(dtype):
                x = (torch.randn(N, generator=g, dtype=torch.float64) * 100).to(dtype)
            else:
                x = torch.randint(-1000, 1000, (N,), generator=g).to(dtype)
            arg = 3.0 if kind == "divide" else 0.37
            on_gpu = gpu(x)
            on_cpu = x.clone()
            if kind == "divide":
                kernels.cuda_divide(on_gpu.data_ptr(), N, CODE[dname], arg)
                kernels.host_divide(on_cpu.data_ptr(), N, CODE[dname], arg)
                ref = x / arg if is_float(dtype) else torch.div(x.to(torch.int64), 3, rounding_mode="trunc")
            else:
                kernels.cuda_scale(on_gpu.data_ptr(), N, CODE[dname], arg)
                kernels.host_scale(on_cpu.data_ptr(), N, CODE[dname], arg)
                ref = x * arg if is_float(dtype) else (x.double() * arg).trunc()
            torch.cuda.synchronize(DEVICE)
            # the same element function on both sides: bit-identical
            assert torch.equal(on_gpu.cpu(), on_cpu), f"{kind} {dname}: GPU and CPU differ"
            check(on_gpu, ref.to(dtype), f"{kind} {dname} vs torch")

        return fn

    for kind in ("divide", "scale"):
        for dname, _ in DTYPES:
            cases.append((f"{kind}_kernel_{dname}", kernel_case(kind, dname)))

    failures = run_cases(cases)
    comm = comm_div = None  # destroy the communicators before the process exits
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
