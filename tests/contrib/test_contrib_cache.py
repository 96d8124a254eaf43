"""CachedDataset / CacheLoader on real backends: the embedded LMDB default
(one process, DataLoader workers, two ranks of a node sharing it, eviction
when full) and real redis-server processes (started by the library per
node, 2 and 3 processes, two emulated nodes sharding keys; given hosts=[...];
a server killed mid-epoch: every sample still served). The safe format is
checked on its own, including that a planted pickle is never unpickled.
Redis tests skip when redis-server is missing, naming the command to install it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch

from tests.harness.mp import launch, repo_env
from tests.harness.paths import REPO

HAVE_REDIS = shutil.which("redis-server") is not None
needs_redis = pytest.mark.skipif(
    not HAVE_REDIS,
    reason="redis-server is not installed: run `sudo apt-get install -y redis-server` (make system does it as root)",
)
MARKER = "/tmp/bagua-cache-test-pickle-ran"


class Samples(torch.utils.data.Dataset):
    """Deterministic samples (a dict of arrays and numbers) that count their loads."""

    def __init__(self, n=40, size=16):
        self.n, self.size, self.loads = n, size, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loads += 1
        g = torch.Generator().manual_seed(i)
        return {
            "x": torch.randn(self.size, generator=g),
            "y": i % 3,
            "a": np.arange(i, i + 4, dtype=np.int16),
            "name": f"s{i}",
        }


def same_sample(a, b):
    assert a.keys() == b.keys()
    assert torch.equal(a["x"], b["x"]) and a["y"] == b["y"] and a["name"] == b["name"]
    assert np.array_equal(a["a"], b["a"]) and a["a"].dtype == b["a"].dtype


class Evil:
    def __reduce__(self):
        return (open, (MARKER, "w"))


# ---------------------------------------------------------------- the format


def test_format_round_trip():
    from bagua_torch.contrib.utils.serialization import dumps, loads

    value = {
        "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "f16": np.ones((2, 2), np.float16),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "b": b"\x00raw",
        "nums": [1, -(2**70), float("nan"), float("-inf"), 0.1, True, None],
        "tup": (np.int64(7), np.bool_(True)),
        3: "int key",
        ("k", 1): [np.zeros((0,), np.uint8)],
        "u": "ünïcode",
    }
    back = loads(dumps(value))
    assert torch.equal(back["t"], value["t"]) and back["t"].dtype == torch.bfloat16
    assert back["f16"].dtype == np.float16 and np.array_equal(back["f16"], value["f16"])
    assert back["empty"].shape == (0, 3) and back["scalar"].dtype == torch.float64 and back["scalar"].item() == 2.5
    assert back["b"] == b"\x00raw" and back[3] == "int key" and back["u"] == "ünïcode"
    assert back["nums"][:2] == [1, -(2**70)] and np.isnan(back["nums"][2]) and back["nums"][3] == float("-inf")
    assert back["nums"][4:] == [0.1, True, None] and type(back["nums"][5]) is bool
    assert type(back["tup"]) is tuple and back["tup"][0] == 7 and back["tup"][0].dtype == np.int64
    assert back[("k", 1)][0].dtype == np.uint8
    back["f16"][0, 0] = 3  # writable copies
    back["t"][0, 0] = 3


def test_format_refuses_pickle_unless_allowed():
    from bagua_torch.contrib.utils.serialization import UnsafeDataError, dumps, loads

    with pytest.raises(TypeError, match="allow_pickle=True"):
        dumps({"obj": Evil()})
    with pytest.raises(TypeError, match="allow_pickle"):
        dumps(np.array([object()], dtype=object))
    record = dumps({"obj": Evil()}, allow_pickle=True)
    if os.path.exists(MARKER):
        os.unlink(MARKER)
    with pytest.raises(UnsafeDataError, match="refusing to unpickle"):
        loads(record)
    assert not os.path.exists(MARKER)
    with pytest.raises(ValueError, match="bad magic"):
        loads(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match="length mismatch"):
        loads(dumps([1, 2]) + b"x")


# ---------------------------------------------------------------- LMDB, one process


def test_lmdb_second_epoch_is_served_from_the_cache(tmp_path):
    from bagua_torch.contrib import CachedDataset

    base = Samples()
    ds = CachedDataset(base, dataset_name="train", writer_buffer_size=7, path=str(tmp_path / "db"))
    first = [ds[i] for i in range(len(ds))]
    assert base.loads == 40
    assert ds.cache_loader.num_keys() == 35  # batched writes: 5 values still pending
    ds.cache_loader.flush()
    assert ds.cache_loader.num_keys() == 40
    second = [ds[i] for i in range(len(ds))]
    assert base.loads == 40
    for a, b in zip(first, second):
        same_sample(a, b)
    assert ds.cache_loader.stats()["hits"] == 40 and ds.cache_loader.hit_rate == 0.5
    # a second dataset on the same database, another name: its own keys
    other = CachedDataset(Samples(5), dataset_name="val", path=str(tmp_path / "db"))
    assert [other[i]["name"] for i in range(5)] == [f"s{i}" for i in range(5)]
    assert other.cache_loader.hits == 0


def test_lmdb_with_dataloader_workers_and_batched_reads(tmp_path):
    from bagua_torch.contrib import CachedDataset

    ds = CachedDataset(Samples(), writer_buffer_size=16, path=str(tmp_path / "db"))
    for epoch in range(2):
        loader = torch.utils.data.DataLoader(
            ds, batch_size=8, num_workers=2, shuffle=True, generator=torch.Generator().manual_seed(epoch)
        )
        seen = {}
        for batch in loader:
            for i, name in enumerate(batch["name"]):
                seen[name] = batch["x"][i]
        assert len(seen) == 40
        for i in range(40):
            assert torch.equal(seen[f"s{i}"], Samples()[i]["x"])
    # the workers wrote every sample into the shared database (what was pending, at their exit)
    assert ds.cache_loader.num_keys() == 40
    assert ds.__getitems__([3, 4])[1]["name"] == "s4"


def test_lmdb_full_cache_evicts_randomly_and_serves_everything(tmp_path):
    from bagua_torch.contrib import CachedDataset

    base = Samples(n=60, size=8192)  # 32 KiB per sample, 1.9 MiB in all, into 1 MiB
    ds = CachedDataset(base, writer_buffer_size=4, path=str(tmp_path / "db"), capacity_per_node=1 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(2):
            for i in range(60):
                assert ds[i]["name"] == f"s{i}"
        ds.cache_loader.flush()
    assert 0 < ds.cache_loader.num_keys() < 60


def test_bad_input(tmp_path):
    from bagua_torch.contrib import CachedDataset, CacheLoader

    with pytest.raises(ValueError, match="invalid backend"):
        CacheLoader(backend="memcached")
    with pytest.raises(ValueError, match="writer_buffer_size"):
        CacheLoader(writer_buffer_size=0, path=str(tmp_path / "a"))

    class Objects(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return Evil()

    with pytest.raises(TypeError, match="allow_pickle=True"):
        CachedDataset(Objects(), path=str(tmp_path / "b"))[0]
    if os.path.exists(MARKER):
        os.unlink(MARKER)
    trusting = CachedDataset(Objects(), path=str(tmp_path / "c"), allow_pickle=True, writer_buffer_size=1)
    trusting[0]  # loaded (not unpickled) and cached pickled, as allowed
    wary = CachedDataset(Objects(), path=str(tmp_path / "c"))
    with pytest.warns(RuntimeWarning, match="refusing to unpickle"):
        with pytest.raises(TypeError, match="allow_pickle"):  # reloaded, then refused on the way in
            wary[0]
    assert not os.path.exists(MARKER)


# ---------------------------------------------------------------- several processes


def _worker():
    import bagua_torch
    from bagua_torch.contrib import CachedDataset
    from tests.harness.worker import report, run_cases

    bagua_torch.init_process_group()
    rank = bagua_torch.get_rank()
    backend = sys.argv[2]
    base = Samples()
    ds = CachedDataset(base, backend=backend, dataset_name="mp", writer_buffer_size=5)
    store = ds.cache_loader.store

    def writer_then_readers():
        if rank == 0:
            for i in range(40):
                ds[i]
            ds.cache_loader.flush()
        bagua_torch.barrier()
        for i in range(40):
            same_sample(ds[i], Samples()[i])
        if rank != 0:
            assert base.loads == 0, f"rank {rank} loaded {base.loads} samples: the cache is not shared"
        assert ds.cache_loader.num_keys() == 40
        bagua_torch.barrier()

    def servers():
        if backend == "redis":
            nodes = int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]) + (
                1 if int(os.environ["WORLD_SIZE"]) % int(os.environ["LOCAL_WORLD_SIZE"]) else 0
            )
            assert len(store.hosts) == nodes, store.hosts
            for c in store.clients:
                assert c.dbsize() > 0, "a server got no key: keys are not sharded"
                assert c.config_get("bind")["bind"] == "127.0.0.1"
                assert c.config_get("protected-mode")["protected-mode"] == "no"
            report("where", True, hosts=store.hosts)
        else:
            report("where", True, path=store.path)

    def late_readers():
        """Rank 0 (owner of node 0's server) goes on to exit at once; the
        others read every sample a while later: the servers must still be
        there (redis: each outlives the ranks connected to it)."""
        if rank == 0:
            return
        time.sleep(1.5)
        errors = ds.cache_loader.errors
        for i in range(40):
            same_sample(ds[i], Samples()[i])
        assert base.loads == 0, f"rank {rank} loaded {base.loads} samples: a server was gone"
        assert ds.cache_loader.errors == errors

    cases = [("writer_then_readers", writer_then_readers), ("servers", servers), ("late_readers", late_readers)]
    sys.exit(1 if run_cases(cases) else 0)


def _port_open(host, port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def test_lmdb_shared_by_the_ranks_of_a_node():
    run = launch(os.path.abspath(__file__), 2, timeout=120, args=["worker", "lmdb"])
    run.check()
    run.check_case("writer_then_readers", 2)
    path = run.cases()["where"][0]["path"]
    assert not os.path.exists(path), "the job's cache directory was not removed at exit"


@needs_redis
@pytest.mark.parametrize("world,local", [(2, 2), (3, 2)], ids=["1node-w2", "2nodes-w3"])
def test_redis_started_per_node(world, local):
    run = launch(os.path.abspath(__file__), world, timeout=120, args=["worker", "redis"], local_world_size=local)
    run.check()
    run.check_case("writer_then_readers", world)
    run.check_case("servers", world)
    run.check_case("late_readers", world)
    hosts = run.cases()["where"][0]["hosts"]
    assert len(hosts) == (world + local - 1) // local
    for h in hosts:
        assert not _port_open(h["host"], h["port"]), f"redis-server on {h} still runs after the job"


def test_redis_down_from_the_start_serves_every_sample():
    pytest.importorskip("redis")
    from bagua_torch.contrib import CachedDataset

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = Samples(10)
    ds = CachedDataset(base, backend="redis", hosts=[f"127.0.0.1:{port}"], socket_timeout_s=0.5, retry_after_s=60)
    with pytest.warns(RuntimeWarning, match="redis cache failed to read"):
        for _ in range(2):
            for i in range(10):
                same_sample(ds[i], Samples()[i])
    assert base.loads == 20 and ds.cache_loader.errors == 1  # skipped while down, not retried per sample


@needs_redis
def test_redis_started_alone_evicts_when_full():
    """One process: the library's own server, with maxmemory and random eviction (the original's policy)."""
    from bagua_torch.contrib import CachedDataset

    base = Samples(n=80, size=8192)  # 32 KiB per sample, 2.5 MiB in all, into 2 MiB
    ds = CachedDataset(base, backend="redis", writer_buffer_size=4, capacity_per_node=2 << 20)
    client = ds.cache_loader.store.clients[0]
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-random"
    for _ in range(2):
        for i in range(80):
            assert ds[i]["name"] == f"s{i}"
    ds.cache_loader.flush()
    assert 0 < ds.cache_loader.num_keys() < 80 and ds.cache_loader.errors == 0


START_CLI = """
import sys, redis
from bagua.torch_api.contrib.utils.redis_store import start_redis_server_cli
port = int(sys.argv[1])
start_redis_server_cli(port, 10 ** 7, "--maxmemory-policy", "allkeys-lru")
r = redis.Redis(port=port)
r.set("k", "v")
assert r.get("k") == b"v"
assert r.config_get("maxmemory")["maxmemory"] == "10000000"
assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "allkeys-lru"  # the extra arguments come last
print("SERVED", flush=True)
"""


@needs_redis
@pytest.mark.timeout(60)
def test_start_redis_server_cli_serves_until_the_process_exits():
    """Bagua 0.9.2's start_redis_server_cli(port, capacity, *args): a server at
    that port, ready when it returns, gone with the process that started it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-c", START_CLI, str(port)],
        capture_output=True,
        text=True,
        timeout=50,
        env=repo_env(),
        cwd=REPO,
    )
    assert out.returncode == 0 and "SERVED" in out.stdout, out.stdout + out.stderr[-2000:]
    deadline = time.monotonic() + 10
    while _port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _port_open("127.0.0.1", port), "redis-server still runs after its process exited"


@pytest.fixture
def two_servers():
    if not HAVE_REDIS:
        pytest.skip("redis-server is not installed: run `sudo apt-get install -y redis-server`")
    procs, hosts = [], []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs.append(
            subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            )
        )
        hosts.append({"host": "127.0.0.1", "port": port})
    deadline = time.monotonic() + 10
    while not all(_port_open(h["host"], h["port"]) for h in hosts):
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    yield procs, hosts
    for p in procs:
        p.kill()
        p.wait()


def test_redis_given_hosts_shards_and_survives_a_dead_server(two_servers):
    from bagua_torch.contrib import CachedDataset

    procs, hosts = two_servers
    base = Samples()
    ds = CachedDataset(
        base,
        backend="redis",
        hosts=[hosts[0], f"127.0.0.1:{hosts[1]['port']}"],
        writer_buffer_size=4,
        retry_after_s=0.2,
        socket_timeout_s=1.0,
    )
    for i in range(40):
        ds[i]
    ds.cache_loader.flush()
    assert [c.dbsize() for c in ds.cache_loader.store.clients] and all(
        c.dbsize() > 0 for c in ds.cache_loader.store.clients
    )
    assert ds.cache_loader.num_keys() == 40
    procs[1].kill()  # one server dies mid-epoch
    procs[1].wait()
    with pytest.warns(RuntimeWarning, match="redis cache failed"):
        for i in range(40):
            same_sample(ds[i], Samples()[i])  # no sample lost
    assert ds.cache_loader.errors >= 1
    one = CachedDataset(Samples(), backend="redis", hosts=hosts[:1], cluster_mode=False)
    assert one.cache_loader.store.hosts == hosts[:1]


def test_redis_planted_pickle_is_not_unpickled(two_servers):
    import redis

    from bagua_torch.contrib import CachedDataset
    from bagua_torch.contrib.utils.serialization import dumps

    _, hosts = two_servers
    client = redis.Redis(**hosts[0])
    client.set(b"evil_0", dumps(Evil(), allow_pickle=True))
    client.set(b"evil_1", pickle.dumps(Evil()))  # the original's format: a bare pickle
    if os.path.exists(MARKER):
        os.unlink(MARKER)
    ds = CachedDataset(Samples(), backend="redis", dataset_name="evil", hosts=hosts[:1])
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        assert ds[0]["name"] == "s0" and ds[1]["name"] == "s1"
    assert not os.path.exists(MARKER)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker()
