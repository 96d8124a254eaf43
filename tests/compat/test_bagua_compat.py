"""Bagua 0.9.2's package paths (``bagua.torch_api``): every original module
and name imports; what is not built yet says so when used; and, across real
processes, the original calls work as there: ``init_process_group`` makes
torch's default group too (or uses the caller's), primitives, groups from
torch groups, the DDP-style wrappers against torch DDP, checkpoints.

The multi-process session is this file run as a worker (one session per world
size; pytest reports each case on its own).
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import tempfile

import pytest

from tests.harness.mp import REPO, launch

ORIGINAL_TOP_LEVEL = [
    "get_backend",
    "init_process_group",
    "send",
    "recv",
    "allgather",
    "allgather_inplace",
    "allreduce",
    "allreduce_inplace",
    "alltoall",
    "alltoall_inplace",
    "alltoall_v",
    "alltoall_v_inplace",
    "barrier",
    "broadcast",
    "gather",
    "gather_inplace",
    "reduce",
    "reduce_inplace",
    "reduce_scatter",
    "reduce_scatter_inplace",
    "scatter",
    "scatter_inplace",
    "ReduceOp",
    "BaguaModule",
    "BaguaTensor",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "communication",
    "algorithms",
    "checkpoint",
    "contrib",
    "data_parallel",
    "env",
]
ORIGINAL_COMMUNICATION = [
    "new_group",
    "from_torch_group",
    "is_initialized",
    "broadcast_object",
    "get_backend",
    "allreduce_inplace",
    "ReduceOp",
    "init_process_group",
    "barrier",
]


# ---------------------------------------------------------------- one process, no job


def test_original_module_paths_and_names():
    import bagua.torch_api as bagua
    import bagua_torch
    from bagua.torch_api import algorithms, checkpoint, communication, data_parallel, env
    from bagua.torch_api.algorithms import async_model_average, bytegrad, decentralized, gradient_allreduce, q_adam
    from bagua.torch_api.checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
    from bagua.torch_api.data_parallel.distributed import DistributedDataParallel_V1_9_0  # noqa: F401

    for name in ORIGINAL_TOP_LEVEL:
        assert hasattr(bagua, name), name
    for name in ORIGINAL_COMMUNICATION:
        assert hasattr(communication, name), name
    for name in (
        "get_rank",
        "get_local_rank",
        "get_world_size",
        "get_local_size",
        "get_node_rank",
        "get_default_bucket_size",
        "get_master_addr",
        "get_bagua_service_port",
        "get_autotune_level",
    ):
        assert callable(getattr(env, name)), name
    # the same objects as bagua_torch's: no second implementation
    assert gradient_allreduce.GradientAllReduceAlgorithm is bagua_torch.algorithms.GradientAllReduceAlgorithm
    assert bytegrad.ByteGradAlgorithm is bagua_torch.algorithms.ByteGradAlgorithm
    assert decentralized.DecentralizedAlgorithm is bagua_torch.algorithms.DecentralizedAlgorithm
    assert algorithms.Algorithm is bagua_torch.algorithms.Algorithm
    assert bagua.allreduce_inplace is bagua_torch.allreduce_inplace
    assert bagua.ReduceOp is bagua_torch.ReduceOp
    assert bagua.BaguaModule is bagua_torch.BaguaModule
    assert issubclass(data_parallel.DistributedDataParallel_V1_9_0, bagua_torch.DistributedDataParallel)
    assert data_parallel.BaguaDistributedDataParallel is bagua_torch.BaguaDistributedDataParallel
    assert checkpoint.save_checkpoint is bagua_torch.checkpoint.save_checkpoint
    assert q_adam.QAdamAlgorithm and async_model_average.AsyncModelAverageAlgorithm
    import bagua_torch.contrib as tc
    from bagua.torch_api.contrib import CachedDataset, CacheLoader, LoadBalancingDistributedSampler
    from bagua.torch_api.contrib.fuse.optimizer import fuse_optimizer
    from bagua.torch_api.contrib.sync_batchnorm import SyncBatchNorm
    from bagua.torch_api.contrib.utils.redis_store import RedisStore

    assert (CacheLoader, CachedDataset, LoadBalancingDistributedSampler, fuse_optimizer, SyncBatchNorm) == (
        tc.CacheLoader,
        tc.CachedDataset,
        tc.LoadBalancingDistributedSampler,
        tc.fuse_optimizer,
        tc.SyncBatchNorm,
    )
    assert RedisStore is bagua_torch.contrib.utils.redis_store.RedisStore
    import bagua_torch.moe
    from bagua.torch_api.model_parallel.moe import MoE, is_moe_param
    from bagua.torch_api.model_parallel.moe.experts import Experts
    from bagua.torch_api.model_parallel.moe.sharded_moe import MOELayer, TopKGate, top1gating, top2gating

    assert bagua.moe.MoE is MoE is bagua_torch.moe.MoE and bagua.moe.is_moe_param is is_moe_param
    assert (Experts, MOELayer, TopKGate) == (
        bagua_torch.moe.Experts,
        bagua_torch.moe.MOELayer,
        bagua_torch.moe.TopKGate,
    )
    import torch

    logits = torch.randn(12, 3)
    l_aux, combine, dispatch, counts = top1gating(logits, 1.0, 4)  # Bagua 0.9.2's signatures
    assert combine.shape == (12, 3, 4) and int(counts.sum()) == 12 and dispatch.dtype == torch.bool
    assert top2gating(logits, 1.0)[1].shape == (12, 3, 8)


def test_reduce_op_original_values():
    from bagua.torch_api import ReduceOp

    assert (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG) == (0, 1, 2, 3, 10)
    assert (ReduceOp.BOR, ReduceOp.BAND, ReduceOp.BXOR) == (7, 8, 9)


def test_algorithm_init_by_name():
    from bagua.torch_api.algorithms import Algorithm, bytegrad, decentralized

    a = Algorithm.init("bytegrad", average=False)
    assert isinstance(a, bytegrad.ByteGradAlgorithm) and a.average is False
    d = Algorithm.init("decentralized", peer_selection_mode="shift_one", communication_interval=2)
    assert isinstance(d, decentralized.DecentralizedAlgorithm) and d.communication_interval == 2
    with pytest.raises(KeyError, match="unknown algorithm 'nope'.*gradient_allreduce"):
        Algorithm.init("nope")


def test_algorithm_init_knows_every_name_of_bagua_0_9():
    from bagua.torch_api.algorithms import Algorithm
    from bagua_core.algorithms.frontend import ORIGINAL_NAMES

    assert set(ORIGINAL_NAMES) <= set(Algorithm.registered())


@pytest.mark.parametrize(
    "module,name",
    [
        ("q_adam", "QAdamAlgorithm"),
        ("q_adam", "QAdamOptimizer"),
        ("async_model_average", "AsyncModelAverageAlgorithm"),
        ("decentralized", "LowPrecisionDecentralizedAlgorithm"),
    ],
)
def test_original_module_paths_give_the_real_classes(module, name):
    import importlib

    import bagua_torch.algorithms

    cls = getattr(importlib.import_module(f"bagua.torch_api.algorithms.{module}"), name)
    assert cls is getattr(bagua_torch.algorithms, name)


def test_bagua_tensor_not_built():
    import bagua.torch_api as bagua

    with pytest.raises(NotImplementedError, match="BaguaTensor"):
        bagua.BaguaTensor()


def test_env_getters_read_the_environment_through_config(monkeypatch):
    from bagua.torch_api import env

    for k, v in dict(
        RANK="2",
        WORLD_SIZE="4",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="10.0.0.1",
        MASTER_PORT="29400",
        BAGUA_DEFAULT_BUCKET_SIZE="4096",
        BAGUA_SERVICE_PORT="31000",
    ).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("BAGUA_BUCKET_SIZE", raising=False)
    monkeypatch.delenv("BAGUA_STORE_PORT", raising=False)
    monkeypatch.delenv("NODE_RANK", raising=False)
    monkeypatch.delenv("GROUP_RANK", raising=False)
    monkeypatch.delenv("BAGUA_AUTOTUNE", raising=False)
    assert (env.get_rank(), env.get_world_size(), env.get_local_rank(), env.get_local_size()) == (2, 4, 0, 2)
    assert env.get_node_rank() == 1 and env.get_master_addr() == "10.0.0.1"
    assert env.get_default_bucket_size() == 4096 and env.get_bagua_service_port() == 31000
    assert env.get_autotune_level() == 0  # BAGUA_AUTOTUNE unset
    monkeypatch.setenv("BAGUA_AUTOTUNE_MAX_SAMPLES", "7")
    monkeypatch.setenv("BAGUA_AUTOTUNE_WARMUP_TIME_S", "2.5")
    monkeypatch.setenv("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", "1")
    monkeypatch.setenv("BAGUA_TIMEOUT", "42")
    assert env.get_autotune_max_samples() == 7 and env.get_autotune_warmup_time_s() == 2.5
    assert env.get_autotune_sampling_confidence_time_s() == 5.0 and env.get_is_output_autotune_log() is True
    assert env.get_autotune_server_wait_time() == 42 and env.is_report_metrics_switch_on() is False
    port = env.find_free_network_port()
    for p in (port, port + 1):  # both bindable: MASTER_PORT and the store's default beside it
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_light_imports():
    # `import bagua` and the launchers load neither torch nor the engine
    code = (
        "import sys, bagua, bagua.distributed.launch, bagua.distributed.run; "
        "bad = [m for m in ('torch', 'jax', 'bagua_core._C') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_init_arguments_validated():
    from bagua.torch_api import init_process_group

    with pytest.raises(ValueError, match="together"):
        init_process_group(rank=0)
    with pytest.raises(ValueError, match="out of range"):
        init_process_group(rank=2, world_size=2, local_world_size=1)
    with pytest.raises(TypeError, match="torch.distributed.Store"):
        init_process_group(store="localhost:29500")


# ---------------------------------------------------------------- worker side

SESSIONS = {"w2": 2, "w3": 3}
CASES = [
    "torch_distributed_is_ready",
    "primitives_and_reduce_ops",
    "bitwise_reduce_ops",
    "groups_from_bagua_and_torch",
    "env_matches_the_job",
    "get_backend_is_kept_per_name",
    "ddp_original_signature_equals_torch_ddp",
    "ddp_with_device_options_is_torch_ddp",
    "v1_9_0_accepts_a_torch_group",
    "algorithm_by_name_trains",
    "checkpoint_round_trip",
    "functional_all_reduce_and_its_gradient",
    "utils_apply_flattened_call_averages",
    "communicators_of_groups_match_torch_ranks",
    "coalesced_primitives_match_torch_distributed",
]


def case_names(_session):
    return CASES


class Worker:
    def __init__(self, ckpt_dir):
        import torch
        import torch.distributed as dist

        import bagua.torch_api as bagua

        torch.set_num_threads(1)
        self.torch, self.dist, self.bagua = torch, dist, bagua
        self.ckpt_dir = ckpt_dir
        self.group = bagua.init_process_group()
        self.rank, self.world = bagua.get_rank(), bagua.get_world_size()

    def mlp(self, seed):
        nn = self.torch.nn
        self.torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

    def batch(self, step):
        g = self.torch.Generator().manual_seed(1000 * step + self.rank)
        return self.torch.randn(8, 4, generator=g), self.torch.randint(0, 3, (8,), generator=g)

    def train(self, model, opt, steps=5):
        for step in range(steps):
            x, y = self.batch(step)
            opt.zero_grad()
            self.torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    def flat(self, model):
        return self.torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def ddp_reference(self, seed, steps=5):
        model = self.mlp(seed)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        self.train(self.torch.nn.parallel.DistributedDataParallel(model), opt, steps)
        return self.flat(model)

    # -- cases --
    def torch_distributed_is_ready(self):
        torch, dist = self.torch, self.dist
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert (dist.get_rank(), dist.get_world_size()) == (self.rank, self.world)
        dist.barrier()
        ds = torch.utils.data.TensorDataset(torch.arange(10))
        mine = list(torch.utils.data.distributed.DistributedSampler(ds, shuffle=False))
        t = torch.zeros(10)
        t[mine] = 1
        dist.all_reduce(t)
        assert bool((t >= 1).all()), t  # the shards cover the data set
        assert self.bagua.init_process_group() is self.group  # safe to call twice

    def primitives_and_reduce_ops(self):
        torch, b = self.torch, self.bagua
        assert b.communication.is_initialized()
        x = torch.full((5,), float(self.rank + 1))
        b.allreduce_inplace(x, op=b.ReduceOp.MAX)
        assert torch.equal(x, torch.full((5,), float(self.world)))
        y = b.allreduce(torch.ones(3), op=b.ReduceOp.SUM)
        assert torch.equal(y, torch.full((3,), float(self.world)))
        obj = b.communication.broadcast_object({"from": self.rank, "list": [1, 2]}, src=self.world - 1)
        assert obj == {"from": self.world - 1, "list": [1, 2]}
        b.barrier()

    def bitwise_reduce_ops(self):
        import functools
        import operator

        torch, b = self.torch, self.bagua
        values = [[1 << r, 0xF0 | r, 3 * r + 1] for r in range(self.world)]  # every rank's data
        for dtype in (torch.int64, torch.int32, torch.uint8):
            for op, fn in (
                (b.ReduceOp.BOR, operator.or_),
                (b.ReduceOp.BAND, operator.and_),
                (b.ReduceOp.BXOR, operator.xor),
            ):
                want = torch.tensor([functools.reduce(fn, col) for col in zip(*values)], dtype=dtype)
                x = torch.tensor(values[self.rank], dtype=dtype)
                b.allreduce_inplace(x, op=op)
                assert torch.equal(x, want), (dtype, op, x, want)
                got = b.reduce(torch.tensor(values[self.rank], dtype=dtype), dst=1, op=op)
                if self.rank == 1:
                    assert torch.equal(got, want), (dtype, op, got, want)
        try:
            b.allreduce_inplace(torch.ones(3), op=b.ReduceOp.BOR)
        except ValueError as e:
            assert "BOR needs an integer dtype" in str(e) and "float32" in str(e), e
        else:
            raise AssertionError("BOR on float32 did not raise")
        y = torch.ones(2)  # the group still works after the refused call
        b.allreduce_inplace(y)
        assert torch.equal(y, torch.full((2,), float(self.world)))

    def groups_from_bagua_and_torch(self):
        torch, b, dist = self.torch, self.bagua, self.dist
        members = [0, self.world - 1]
        tg = dist.new_group(members)  # every rank, in the same order
        bg = b.communication.from_torch_group(tg)
        assert list(bg.ranks) == members
        x = torch.full((4,), float(self.rank))
        b.allreduce_inplace(x, comm=bg)
        if self.rank in members:
            assert torch.equal(x, torch.full((4,), float(sum(members))))
        else:
            assert not bg.is_member and torch.equal(x, torch.full((4,), float(self.rank)))
        assert b.communication.from_torch_group(dist.group.WORLD) is self.group
        ng = b.communication.new_group(list(range(self.world)))
        z = torch.ones(2)
        b.allreduce_inplace(z, comm=ng)
        assert torch.equal(z, torch.full((2,), float(self.world)))
        nobody = b.communication.new_group(ranks=[])  # as in Bagua 0.9.2: a group no rank is in
        assert not nobody.is_member and nobody.size == 0
        comm = nobody.get_global_communicator()
        for c in (nobody, comm):  # the primitives return at once on a non-member
            w = torch.full((3,), float(self.rank))
            b.allreduce_inplace(w, comm=c)
            b.broadcast(w, 0, comm=c)
            b.barrier(comm=c)
            assert torch.equal(w, torch.full((3,), float(self.rank)))
        b.allreduce_inplace(z, comm=ng)  # the groups made after it still line up
        assert torch.equal(z, torch.full((2,), float(self.world) ** 2))

    def functional_all_reduce_and_its_gradient(self):
        """Forward against torch.distributed.all_reduce; the gradient against
        the hand-derived one: with loss_r = sum(all_reduce(x_r) * w_r) on
        every rank r, d(sum of losses)/d(x_r) = sum over ranks of w."""
        torch, dist = self.torch, self.dist
        from bagua.torch_api.data_parallel import functional as F

        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + self.rank
        x.requires_grad_(True)
        w = torch.full((2, 3), float(self.rank + 1))
        y = F.all_reduce(x)
        want = x.detach().clone()
        dist.all_reduce(want)
        assert torch.equal(y, want) and torch.equal(x.detach(), torch.arange(6.0).reshape(2, 3) + self.rank)
        (y * w).sum().backward()
        assert torch.equal(x.grad, torch.full((2, 3), float(sum(r + 1 for r in range(self.world))))), x.grad
        m = F.all_reduce(x.detach(), dist.ReduceOp.MAX)
        assert torch.equal(m, torch.arange(6.0).reshape(2, 3) + self.world - 1)
        members = [0, self.world - 1]
        tg = dist.new_group(members)
        z = F.all_reduce(torch.ones(3, requires_grad=True), group=tg)  # every rank: the first call makes the group
        assert torch.equal(z.detach(), torch.full((3,), 2.0 if self.rank in members else 1.0))
        assert F.torch_reduce_op_to_bagua(dist.ReduceOp.SUM) == F.ReduceOp.SUM
        try:
            F.all_reduce(x, dist.ReduceOp.PRODUCT)
        except ValueError as e:
            assert "SUM and MAX" in str(e)
        else:
            raise AssertionError("PRODUCT was accepted")

    def utils_apply_flattened_call_averages(self):
        """apply_flattened_call with torch.distributed.all_reduce: the
        original's average, against the ranks' values computed here."""
        torch, dist = self.torch, self.dist
        from bagua.torch_api.utils import apply_flattened_call

        bucket = [torch.full((2, 2), float(self.rank)), torch.arange(3.0) * (self.rank + 1)]
        apply_flattened_call(bucket, dist.all_reduce)
        ranks = range(self.world)
        assert torch.equal(bucket[0], torch.full((2, 2), sum(ranks) / self.world))
        assert torch.allclose(bucket[1], torch.arange(3.0) * sum(r + 1 for r in ranks) / self.world)

    def communicators_of_groups_match_torch_ranks(self):
        """Each group's global, intra- and inter-node communicators: ranks
        against torch.distributed's for the same ranks, and every primitive
        takes one as comm= (results against torch.distributed's)."""
        torch, b, dist = self.torch, self.bagua, self.dist
        c = b.communication
        world_comm = c._get_default_group().get_global_communicator()
        assert c._get_default_group() is self.group
        assert (world_comm.rank(), world_comm.nranks()) == (dist.get_rank(), dist.get_world_size())
        members = [self.world - 1, 0]  # torch sorts them, as new_group does
        tg = dist.new_group(members)
        bg = c.from_torch_group(tg)
        gc = bg.get_global_communicator()
        assert gc.rank() == dist.get_rank(tg) and gc.nranks() == 2  # torch: -1 on non-members, as here
        if self.rank in members:
            assert gc.nranks() == dist.get_world_size(tg)
        assert c._rank_not_in_group(bg) is c._rank_not_in_comm(gc) is (self.rank not in members)
        assert not c._rank_not_in_group(None) and not c._rank_not_in_comm(None)
        assert c.get_communicator(bg.name, "global") == gc
        x = torch.arange(4.0) + self.rank
        ref = x.clone()
        c.allreduce_inplace(x, comm=gc)
        if self.rank in members:
            dist.all_reduce(ref, group=tg)
        assert torch.equal(x, ref), (x, ref)
        got = c.allgather(torch.full((2,), float(self.rank)), comm=gc)
        if self.rank in members:
            assert torch.equal(got, torch.tensor([[0.0, 0.0], [self.world - 1.0] * 2]))
        else:
            assert got is None
        y = torch.full((3,), float(self.rank))
        c.broadcast(y, src=1, comm=gc)
        assert torch.equal(y, torch.full((3,), float(self.world - 1 if self.rank in members else self.rank)))
        c.barrier(comm=gc)
        # one node here: the intra-node communicator is the group, the inter-node one its first rank
        intra, inter = self.group.get_intra_node_communicator(), self.group.get_inter_node_communicator()
        assert (intra.rank(), intra.nranks()) == (self.rank, self.world)
        assert (inter.rank(), inter.nranks()) == ((0, 1) if self.rank == 0 else (-1, 1))
        assert c.get_communicator("world", "intra") == intra and c.get_communicator("world", "inter") == inter
        z = torch.ones(2)
        c.allreduce_inplace(z, comm=intra)
        c.allreduce_inplace(z, comm=inter)  # a no-op on the ranks that are not members
        assert torch.equal(z, torch.full((2,), float(self.world)))
        try:
            c.get_communicator("world", "local")
        except ValueError as e:
            assert "'global', 'inter', 'intra'" in str(e)
        else:
            raise AssertionError("an unknown comm_name was accepted")

    def coalesced_primitives_match_torch_distributed(self):
        torch, b, dist = self.torch, self.bagua, self.dist
        c = b.communication

        def mine():
            g = torch.Generator().manual_seed(self.rank)

            def exact(*shape):  # eighths: every summation order gives the same float
                return torch.randint(-99, 99, shape, generator=g).float() / 8

            return [
                exact(2, 3),
                torch.randint(-9, 9, (4,), generator=g),
                exact(5),
                torch.randint(0, 200, (3,), generator=g).to(torch.uint8),
            ]

        got, ref = mine(), mine()
        c.allreduce_coalesced_inplace(got)
        for t in ref:
            dist.all_reduce(t)
        assert all(a.dtype == r.dtype and torch.equal(a, r) for a, r in zip(got, ref)), (got, ref)
        got, ref = mine(), mine()
        src = self.world - 1
        c.broadcast_coalesced(got, src=src)
        for t in ref:
            dist.broadcast(t, src)
        assert all(torch.equal(a, r) for a, r in zip(got, ref))
        got = mine()
        c.allreduce_coalesced_inplace(got, op=c.ReduceOp.MAX, comm=self.group.get_global_communicator())
        ref = mine()
        for t in ref:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert all(torch.equal(a, r) for a, r in zip(got, ref))

    def env_matches_the_job(self):
        e = self.bagua.env
        assert (e.get_rank(), e.get_world_size()) == (self.rank, self.world)
        assert (e.get_local_rank(), e.get_local_size(), e.get_node_rank()) == (self.rank, self.world, 0)
        assert e.get_default_bucket_size() == 10 * 1024 * 1024

    def get_backend_is_kept_per_name(self):
        from bagua_core.engine import Engine

        a = self.bagua.get_backend("model_a")
        assert isinstance(a, Engine) and self.bagua.get_backend("model_a") is a

    def ddp_original_signature_equals_torch_ddp(self):
        from bagua.torch_api.algorithms.gradient_allreduce import GradientAllReduceAlgorithm
        from bagua.torch_api.data_parallel import DistributedDataParallel

        model = self.mlp(7)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel(
            model,
            optimizers=[opt],
            algorithm=GradientAllReduceAlgorithm(),
            find_unused_parameters=False,
            gradient_as_bucket_view=True,
        )
        self.train(ddp, opt)
        got, want = self.flat(model), self.ddp_reference(7)
        assert self.torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
        ddp.close()

    def ddp_with_device_options_is_torch_ddp(self):
        import warnings

        from bagua.torch_api.data_parallel import DistributedDataParallel

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ddp = DistributedDataParallel(self.mlp(3), dim=1)
        assert isinstance(ddp, self.torch.nn.parallel.DistributedDataParallel)
        assert any("not Bagua" in str(w.message) for w in caught)

    def v1_9_0_accepts_a_torch_group(self):
        from bagua.torch_api.algorithms import bytegrad
        from bagua.torch_api.data_parallel.distributed import DistributedDataParallel_V1_9_0

        model = self.mlp(11)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel_V1_9_0(
            model, [opt], bytegrad.ByteGradAlgorithm(), process_group=self.dist.group.WORLD
        )
        self.train(ddp, opt)
        allv = self.bagua.allgather(self.flat(model))
        for r in range(self.world):  # ByteGrad: every rank applies the same decompressed gradient
            assert self.torch.equal(allv[r], allv[0])
        ddp.close()

    def algorithm_by_name_trains(self):
        from bagua.torch_api.algorithms import Algorithm

        model = self.mlp(5)
        opt = self.torch.optim.SGD(model.parameters(), lr=0.1)
        model = model.with_bagua([opt], Algorithm.init("gradient_allreduce"))
        assert type(model.bagua_algorithm.algorithm).__name__ == "GradientAllReduceAlgorithm"
        self.train(model, opt)
        want = self.ddp_reference(5)
        assert self.torch.allclose(self.flat(model), want, rtol=1e-5, atol=1e-6)
        model.bagua_ddp.close()

    def checkpoint_round_trip(self):
        from bagua.torch_api.checkpoint import load_checkpoint, save_checkpoint

        torch = self.torch
        model = self.mlp(9)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model = model.with_bagua([opt], self.bagua.algorithms.gradient_allreduce.GradientAllReduceAlgorithm())
        self.train(model, opt, 3)
        assert load_checkpoint(self.ckpt_dir, self.mlp(0)) == 0  # nothing saved yet
        save_checkpoint(3, self.ckpt_dir, model, opt)
        assert os.path.isfile(os.path.join(self.ckpt_dir, "iter_0000003", "mp_rank_00_model_states.pt"))
        fresh = self.mlp(0)
        fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
        assert load_checkpoint(self.ckpt_dir, fresh, fresh_opt) == 3
        assert torch.equal(self.flat(fresh), self.flat(model))
        assert fresh_opt.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
        model.bagua_ddp.close()


def worker_main():
    from tests.harness.worker import run_cases

    w = Worker(sys.argv[2])
    failures = run_cases([(c, getattr(w, c)) for c in case_names(sys.argv[1])])
    sys.exit(1 if failures else 0)


# ---------------------------------------------------------------- pytest side


@functools.lru_cache(maxsize=None)
def session(name: str):
    ckpt = tempfile.mkdtemp(prefix=f"bagua-compat-{name}-")
    return launch(os.path.abspath(__file__), SESSIONS[name], timeout=120, args=[name, ckpt])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name,case", [pytest.param(s, c, id=f"{s}-{c}") for s in SESSIONS for c in CASES])
def test_case(name, case):
    session(name).check_case(case, SESSIONS[name])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(SESSIONS))
def test_session_exits_cleanly(name):
    run = session(name)
    assert run.ok(), run.summary()


# ---------------------------------------------------------------- ways to start a job

USER_MADE_TORCH_GROUP_FIRST = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")           # the user's own, before Bagua
import bagua.torch_api as bagua
g = bagua.init_process_group()
assert dist.get_world_size() == g.size and dist.get_rank() == g.rank
x = torch.ones(3); bagua.allreduce_inplace(x)
assert torch.equal(x, torch.full((3,), float(g.size)))
dist.barrier()
print("OK")
"""

STORE_AND_LAYOUT_ARGUMENTS = """
import os, datetime, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
port = int(os.environ["MASTER_PORT"])
for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(k)
kind = os.environ["STORE_KIND"]
if kind == "tcp":
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
else:
    store = dist.FileStore(os.environ["STORE_FILE"], world)
import bagua.torch_api as bagua
g = bagua.init_process_group(store, rank=rank, world_size=world, local_world_size=world)
assert (g.rank, g.size) == (rank, world) and bagua.get_rank() == rank
x = torch.ones(2); bagua.allreduce_inplace(x)
assert torch.equal(x, torch.full((2,), float(world)))
dist.barrier()
print("OK", os.environ.get("BAGUA_STORE_PORT"), os.environ.get("MASTER_PORT"))
"""

TWO_NODES = """
import torch, torch.distributed as dist
import bagua.torch_api as bagua
from bagua.torch_api import communication as c
g = bagua.init_process_group()
rank, world, local = g.rank, g.size, bagua.get_local_size()
node = rank // local
on_my_node = [r for r in range(world) if r // local == node]
leaders = sorted({r - r % local for r in range(world)})
intra, inter = g.get_intra_node_communicator(), g.get_inter_node_communicator()
assert (intra.rank(), intra.nranks()) == (on_my_node.index(rank), len(on_my_node)), intra
assert inter.nranks() == len(leaders) and inter.rank() == (leaders.index(rank) if rank in leaders else -1)
torch_groups = [dist.new_group([r for r in range(world) if r // local == n]) for n in range(len(leaders))]
torch_leaders = dist.new_group(leaders)
x, ref = torch.full((3,), float(rank + 1)), torch.full((3,), float(rank + 1))
c.allreduce_inplace(x, comm=intra)
dist.all_reduce(ref, group=torch_groups[node])
assert torch.equal(x, ref), (x, ref)
assert intra.rank() == dist.get_rank(torch_groups[node]) and inter.rank() == dist.get_rank(torch_leaders)
y, ref = torch.full((2,), float(rank)), torch.full((2,), float(rank))
c.allreduce_inplace(y, comm=inter)
if rank in leaders:
    dist.all_reduce(ref, group=torch_leaders)
assert torch.equal(y, ref), (y, ref)
print("OK")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,local", [(3, 2), (4, 2)])
def test_node_communicators_on_emulated_nodes(world, local):
    run = launch(TWO_NODES, world, timeout=90, local_world_size=local)
    assert run.ok() and all("OK" in w.stdout for w in run.workers), run.summary()


ALONE = """
import os, sys, torch, torch.distributed as dist
for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(k, None)
import bagua.torch_api as bagua
g = bagua.init_process_group()
assert g.size == 1 and dist.get_world_size() == 1
dist.barrier()
import bagua_core
bagua_core.destroy_process_group()
bagua.init_process_group()  # the notice comes once per process
print("OK")
"""


@pytest.mark.timeout(120)
def test_init_uses_a_torch_group_the_user_made_first():
    run = launch(USER_MADE_TORCH_GROUP_FIRST, 3, timeout=90)
    assert run.ok() and all("OK" in w.stdout for w in run.workers), run.summary()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["tcp", "file"])
def test_init_with_a_store_and_layout_arguments(kind, tmp_path):
    run = launch(
        STORE_AND_LAYOUT_ARGUMENTS, 3, timeout=90, env={"STORE_KIND": kind, "STORE_FILE": str(tmp_path / "store")}
    )
    assert run.ok() and all("OK" in w.stdout for w in run.workers), run.summary()
    if kind == "file":  # no MASTER_ADDR: rank 0 published a store port through the user's store
        ports = {w.stdout.split()[1] for w in run.workers}
        assert len(ports) == 1 and ports != {"None"}, run.summary()


@pytest.mark.timeout(60)
def test_init_alone_needs_no_port():
    proc = subprocess.run([sys.executable, "-c", ALONE], cwd=REPO, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr
    assert proc.stderr.count("runs alone, as a single process") == 1, proc.stderr


if __name__ == "__main__":
    worker_main()
