"""GPU worker: NCCL process groups (BAGUA_BACKEND=nccl) on torch CUDA tensors.
Started by tests/core/test_backend.py through tests.harness.mp.launch: at world size 1
(``case_names()``), or with ``mismatch`` on 2 ranks (needs 2 GPUs)."""

import os
import sys


def case_names():
    return [name for name, _ in CASES]


def _setup():
    import torch

    import bagua_core as bc

    return torch, bc


def case_world():
    torch, bc = _setup()
    g = bc.init_process_group()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    assert (g.backend, g.device_type, g.device_index) == ("nccl", "cuda", local), g
    assert g.control_group is not g and g.control_group.device_type == "cpu"
    from bagua_core import engine

    assert engine.default_lanes(g) == (
        int(os.environ["BAGUA_ENGINE_LANES"]) if os.environ.get("BAGUA_ENGINE_LANES") else 1
    )


def case_allreduce():
    torch, bc = _setup()
    g = bc.get_default_group()
    x = torch.arange(1000, dtype=torch.float32, device=f"cuda:{g.device_index}")
    bc.allreduce_inplace(x, op=bc.ReduceOp.SUM, group=g)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.arange(1000, dtype=torch.float32) * g.size)
    y = bc.allreduce(x, torch.empty_like(x), op=bc.ReduceOp.AVG, group=g)
    torch.cuda.synchronize()
    assert torch.equal(y, x)
    try:
        bc.allreduce_inplace(torch.ones(4), group=g)  # host memory on an NCCL group
    except ValueError as e:
        assert "cuda" in str(e), e
    else:
        raise AssertionError("a CPU tensor on an NCCL group was accepted")


def case_host_metadata():
    torch, bc = _setup()
    from bagua_core import agreement

    g = bc.get_default_group()
    assert bc.broadcast_object({"a": 1}, 0, g) == {"a": 1}
    agreement.check_same_everywhere([("param", "w", (2,), "float32")], g, "the model")


def case_new_group_and_clone():
    torch, bc = _setup()
    g = bc.get_default_group()
    sub = bc.new_group([0])
    assert sub.backend == "nccl" and sub.device_type == "cuda"
    c = g.clone()
    assert c.backend == "nccl" and c.device_index == g.device_index
    for group in (sub, c, g.intra_node_group(), g.inter_node_group()):
        if group.is_member:
            x = torch.ones(8, device=f"cuda:{g.device_index}")
            bc.allreduce_inplace(x, group=group)
            torch.cuda.synchronize()
            assert torch.equal(x.cpu(), torch.full((8,), float(group.size)))
    gloo = bc.new_group([0], backend="gloo")
    assert gloo.backend == "gloo" and gloo.device_type == "cpu"
    for group in (sub, c, gloo):
        group.close()


def case_close():
    torch, bc = _setup()
    c = bc.get_default_group().clone()
    comm, ctl = c.comm, c.control_group.comm
    c.close()
    for closed in (comm, ctl):
        try:
            closed.barrier()
        except bc.BaguaError as e:
            assert "closed" in str(e), e
        else:
            raise AssertionError("a closed communicator still works")


def case_broken_promise():
    torch, bc = _setup()
    # world size 1 needs no agreement: expect_calls is accepted and ignored
    g = bc.get_default_group()
    g.comm._expect_calls([(1, 0, 4, -1, 0)])
    x = torch.ones(8, device=f"cuda:{g.device_index}")
    bc.allreduce_inplace(x, group=g)
    torch.cuda.synchronize()


CASES = [
    ("nccl_world", case_world),
    ("nccl_allreduce", case_allreduce),
    ("nccl_host_metadata_on_control", case_host_metadata),
    ("nccl_new_group_clone_subgroups", case_new_group_and_clone),
    ("nccl_close_closes_both", case_close),
    ("nccl_promise_at_world_size_1", case_broken_promise),
]


def case_mismatch():
    torch, bc = _setup()
    g = bc.init_process_group()
    rank = bc.get_rank()
    x = torch.ones(4 + rank, device=f"cuda:{g.device_index}")
    try:
        bc.allreduce_inplace(x, group=g)
    except bc.MismatchError as e:
        assert "ranks disagree" in str(e) and "allreduce" in str(e), e
    else:
        raise AssertionError("no MismatchError")
    y = torch.ones(4, device=f"cuda:{g.device_index}")
    bc.allreduce_inplace(y, group=g)  # still in step
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))


if __name__ == "__main__":
    import bagua_core
    from tests.harness.worker import run_cases

    cases = [("nccl_mismatch_raises_everywhere", case_mismatch)] if sys.argv[1:] == ["mismatch"] else CASES
    failures = run_cases(cases)
    bagua_core.destroy_process_group()
    sys.stdout.flush()
    os._exit(0 if failures == 0 else 1)
