"""GPU worker for failures: a missing rank and a dead peer must become
exceptions within the timeout, never a hang. Started by
tests/core/test_cuda_nccl.py through tests.harness.mp.launch.

  nccl_failure_worker.py lonely     1 process: rank 0 of a 2-rank communicator
                                    whose rank 1 never comes
  nccl_failure_worker.py dead_peer  2 processes on 2 GPUs: rank 1 exits after
                                    setup; rank 0's operations must fail
"""

import os
import sys
import threading
import time

import torch

from bagua_core import _C, _nccl
from tests.harness.worker import run_cases

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DEVICE = RANK % torch.cuda.device_count()
TIMEOUT_S = 8.0
FLOAT32, SUM = 0, 0


_servers = []  # rank 0's store server lives as long as the process


def make_store():
    """Bagua's rendezvous store: the server on rank 0 at MASTER_PORT + 1."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
    if RANK == 0:
        _servers.append(_C.TcpStoreServer(host, port))
    return _C.TcpStore(host, port, RANK, 60.0)


def expect_failure(fn, max_s):
    """fn() must raise a BaguaError (CommTimeoutError included) within max_s seconds."""
    start = time.monotonic()
    try:
        fn()
    except _C.BaguaError as e:
        elapsed = time.monotonic() - start
        assert elapsed < max_s, f"failed only after {elapsed:.1f}s: {e}"
        return e
    raise AssertionError("no exception")


def lonely():
    store = make_store()
    cases = []

    def init_times_out():
        e = expect_failure(
            lambda: _nccl.create_communicator(store, "lonely", 0, 2, DEVICE, timeout_s=TIMEOUT_S), TIMEOUT_S + 20
        )
        assert isinstance(e, _C.CommTimeoutError), repr(e)
        assert "lonely" in str(e), str(e)

    def still_usable_after_abort():
        comm = _nccl.create_communicator(store, "alone", 0, 1, DEVICE, timeout_s=TIMEOUT_S)
        x = torch.ones(16, device=f"cuda:{DEVICE}")
        comm.allreduce(x.data_ptr(), x.data_ptr(), 16, FLOAT32, SUM)
        assert torch.equal(x.cpu(), torch.ones(16))

    cases.append(("init_missing_rank_times_out", init_times_out))
    cases.append(("new_communicator_after_abort", still_usable_after_abort))
    return run_cases(cases)


def dead_peer():
    store = make_store()
    comm_a = _nccl.create_communicator(store, "dead/a", RANK, WORLD, DEVICE, timeout_s=TIMEOUT_S)
    comm_b = _nccl.create_communicator(store, "dead/b", RANK, WORLD, DEVICE, timeout_s=TIMEOUT_S)
    comm_a.barrier()
    comm_b.barrier()
    if RANK != 0:
        os._exit(0)  # a peer that vanishes without a word
    time.sleep(1.0)
    x = torch.ones(1 << 20, device=f"cuda:{DEVICE}")
    n = x.numel()
    cases = []

    def sync_op_fails():
        expect_failure(lambda: comm_a.allreduce(x.data_ptr(), x.data_ptr(), n, FLOAT32, SUM), TIMEOUT_S + 20)

    def later_call_fails_at_once():
        e = expect_failure(lambda: comm_a.barrier(), 2.0)
        assert "aborted" in str(e), str(e)

    def watchdog_aborts_stream_op():
        s = torch.cuda.Stream(device=DEVICE)
        comm_b.allreduce(x.data_ptr(), x.data_ptr(), n, FLOAT32, SUM, stream=s.cuda_stream)
        # enqueued: the watchdog must abort it, and then every call fails
        expect_failure(lambda: comm_b.barrier(), 2 * TIMEOUT_S + 20)
        done = threading.Event()
        threading.Thread(target=lambda: (s.synchronize(), done.set()), daemon=True).start()
        assert done.wait(30), "the caller's stream still hangs after the abort"

    cases.append(("sync_op_fails", sync_op_fails))
    cases.append(("later_call_fails_at_once", later_call_fails_at_once))
    cases.append(("watchdog_aborts_stream_op", watchdog_aborts_stream_op))
    failures = run_cases(cases)
    sys.stdout.flush()
    os._exit(1 if failures else 0)  # skip teardown of the aborted communicators' peers


if __name__ == "__main__":
    torch.cuda.set_device(DEVICE)
    mode = sys.argv[1]
    sys.exit(1 if {"lonely": lonely, "dead_peer": dead_peer}[mode]() else 0)
