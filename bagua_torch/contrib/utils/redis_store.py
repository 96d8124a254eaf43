"""The Redis cache backend: one server per node started by the library, or given servers.

Contract: ``RedisStore(hosts=None, cluster_mode=True, capacity_per_node=100 GiB)``.

- ``hosts=None``: the local rank 0 of every node starts ``redis-server``
  bound to this host's address only (``BAGUA_HOSTNAME`` or the address of the
  host name), protected mode off, no persistence, ``maxmemory`` =
  ``capacity_per_node`` with random eviction (the original's settings). The
  ranks learn every node's server with one allgather over Bagua's world
  group, then every rank connects to every server and they meet once more,
  so every rank constructs the store at the same point (it is a collective
  when there are several processes). The first set of parameters of a
  process wins for its server.
- The server outlives its readers: when its process exits, it first closes
  Bagua's communication (so that no peer waits on this rank), then waits
  until no other rank is connected (each rank's connections carry its name,
  ``bagua-rank<r>``; a rank that exits or dies drops them), at most the
  job's timeout (``BAGUA_TIMEOUT``), and only then stops the server. If the
  process is killed, the server gets SIGTERM with it.
- ``hosts=[...]``: existing servers, as ``{"host": h, "port": p}`` dicts or
  ``"h:p"`` strings; nothing is started.
- ``cluster_mode=True`` shards keys over all servers by a stable hash;
  ``False`` uses only the server of this node (``node_rank % len(hosts)``).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Dict, List, Optional, Sequence

import numpy as np

from bagua_torch.contrib.utils.lmdb_store import DEFAULT_CAPACITY
from bagua_torch.contrib.utils.store import Store

__all__ = ["RedisStore", "start_redis_server", "start_redis_server_cli"]

_HOST_RECORD_BYTES = 256
_bootstrapped: Optional[List[dict]] = None  # this process's view of the job's servers


def _require_redis():
    try:
        import redis
    except ImportError as e:
        raise ImportError(
            "backend='redis' needs the 'redis' package: pip install 'bagua[contrib]' (or pip install redis)"
        ) from e
    return redis


def _parse_host(h) -> dict:
    if isinstance(h, dict) and "host" in h and "port" in h:
        return {"host": str(h["host"]), "port": int(h["port"])}
    if isinstance(h, str) and h.rpartition(":")[2].isdigit():
        host, _, port = h.rpartition(":")
        return {"host": host, "port": int(port)}
    raise ValueError(f"a Redis host is {{'host': ..., 'port': ...}} or 'host:port', got {h!r}")


def host_address() -> str:
    from bagua_core import config

    return config.load().hostname or socket.gethostbyname(socket.gethostname())


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the atexit handler still stops it
        pass


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_redis_server(host: str, capacity: int, timeout_s: float = 10.0) -> dict:
    """Starts ``redis-server`` on ``host`` at a free port; returns ``{"host", "port"}`` once it answers."""
    last_error = ""
    for _ in range(3):  # the free port may be taken in between: try another
        port = _free_port(host)
        started, last_error = _launch(port, capacity, ["--bind", host], host, timeout_s)
        if started:
            return {"host": host, "port": port}
    raise RuntimeError(f"redis-server did not start on {host}: {last_error.strip() or 'no answer'}")


def start_redis_server_cli(port: int, capacity: int, *args: str, timeout_s: float = 10.0) -> None:
    """Bagua 0.9.2's name: starts ``redis-server`` at ``port`` (all interfaces,
    as there) with ``capacity`` bytes of memory, random eviction and no
    persistence, plus ``args`` (redis-server options), and returns once it
    answers. Unlike the original's daemon, the server is this process's child:
    it stops when the process exits. RuntimeError when it does not start."""
    started, error = _launch(int(port), int(capacity), [str(a) for a in args], "127.0.0.1", timeout_s)
    if not started:
        raise RuntimeError(f"redis-server did not start at port {port}: {error.strip() or 'no answer'}")


def _launch(port: int, capacity: int, extra: List[str], reach: str, timeout_s: float):
    """(started, its error output): a redis-server child at ``port``, stopped
    at exit, once a client at ``reach`` gets an answer."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "starting a Redis server needs redis-server, which is not installed: "
            "apt-get install redis-server (or pass hosts=[...] of running servers)"
        )
    redis = _require_redis()
    cmd = [
        binary,
        "--port",
        str(port),
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
        "--maxmemory",
        str(capacity),
        "--maxmemory-policy",
        "allkeys-random",
        "--appendonly",
        "no",
        "--save",
        "",
        "--loglevel",
        "warning",
        "--dir",
        tempfile.gettempdir(),
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent
    )
    client = redis.Redis(host=reach, port=port, socket_connect_timeout=1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            client.ping()
            atexit.register(_stop_server, proc)
            return True, ""
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    _stop_server(proc)
    return False, proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr:
        proc.stderr.close()


def _client_name() -> str:
    """The name this rank's connections carry (DataLoader workers forked
    from it too): what a server's owner tells its own connections by."""
    from bagua_core import config

    return f"bagua-rank{config.load().rank}"


def _outlive_readers(server: dict, timeout_s: float) -> None:
    """At exit, before the server stops: closes Bagua's communication, then
    waits until no other rank's connection is open (see the module doc)."""
    import bagua_core

    bagua_core.destroy_process_group()  # at exit communication is over; peers must not wait for this rank
    redis = _require_redis()
    own = _client_name()
    probe = redis.Redis(host=server["host"], port=server["port"], socket_timeout=2, socket_connect_timeout=2)
    deadline = time.monotonic() + timeout_s
    others: List[str] = []
    try:
        while True:
            others = [c.get("name", "") for c in probe.client_list() if c.get("name", "") not in ("", own)]
            if not others or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    except redis.exceptions.RedisError:
        return  # the server is gone already: nothing to wait for
    finally:
        probe.close()
    if others:
        print(
            f"bagua: stopping the Redis cache server at {server['host']}:{server['port']} after "
            f"{timeout_s:.0f} s (BAGUA_TIMEOUT) while still connected: {sorted(set(others))}",
            file=sys.stderr,
        )


def _bootstrap(capacity: int) -> List[dict]:
    """Every node's server (started here on local rank 0), the same list on every rank."""
    global _bootstrapped
    if _bootstrapped is not None:
        return _bootstrapped
    import bagua_core
    from bagua_core import comm, config

    s = config.load()
    mine = start_redis_server(host_address(), capacity) if s.local_rank == 0 else None
    if mine is not None and s.world_size > 1:  # registered after the server's stop: runs before it
        atexit.register(_outlive_readers, mine, s.timeout_s)
    if s.world_size == 1:
        _bootstrapped = [mine]  # type: ignore[list-item]  # one process: local rank 0, which started it
        return _bootstrapped
    if not bagua_core.is_initialized():
        raise RuntimeError(
            "backend='redis' without hosts= in a job of several processes needs Bagua's process "
            "group to share the servers' addresses: call bagua_torch.init_process_group() first"
        )
    record = json.dumps({"node": s.node_rank, **mine}).encode() if mine else b""
    buf = np.zeros(_HOST_RECORD_BYTES, dtype=np.uint8)
    buf[: len(record)] = np.frombuffer(record, dtype=np.uint8)
    every = np.from_dlpack(comm.allgather(buf)).reshape(-1, _HOST_RECORD_BYTES)
    nodes = {}
    for row in every:
        text = row.tobytes().rstrip(b"\0")
        if text:
            rec = json.loads(text)
            nodes[rec["node"]] = {"host": rec["host"], "port": rec["port"]}
    _bootstrapped = [nodes[n] for n in sorted(nodes)]
    return _bootstrapped


class RedisStore(Store):
    def __init__(
        self,
        hosts: Optional[Sequence] = None,
        cluster_mode: bool = True,
        capacity_per_node: int = DEFAULT_CAPACITY,
        socket_timeout_s: float = 5.0,
    ):
        self.redis = _require_redis()
        if not isinstance(capacity_per_node, int) or capacity_per_node < 1 << 20:
            raise ValueError(f"capacity_per_node must be an integer of at least 1 MiB, got {capacity_per_node!r}")
        started_here = hosts is None
        hosts = _bootstrap(capacity_per_node) if hosts is None else [_parse_host(h) for h in hosts]
        if not hosts:
            raise ValueError("hosts is empty: give at least one Redis server, or hosts=None to start them")
        if not cluster_mode:
            from bagua_core import config

            hosts = [hosts[config.load().node_rank % len(hosts)]]
        self.hosts = hosts
        self.clients = [
            self.redis.Redis(
                host=h["host"],
                port=h["port"],
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                client_name=_client_name(),
            )
            for h in hosts
        ]
        if started_here:
            self._connect_then_meet()

    def _connect_then_meet(self) -> None:
        """Every rank holds a connection to every server before any rank goes
        on, so no server's owner can exit and find none of its readers yet."""
        import bagua_core
        from bagua_core import comm

        for c in self.clients:
            try:
                c.ping()
            except self.redis.exceptions.RedisError:
                pass  # a server that does not answer: the reads fall back to loading, with a warning
        if bagua_core.is_initialized() and bagua_core.get_world_size() > 1:
            comm.barrier()

    def _shard(self, key: bytes) -> int:
        return zlib.crc32(key) % len(self.clients)

    def mset(self, items: Dict[bytes, bytes]) -> None:
        per_shard: Dict[int, Dict[bytes, bytes]] = {}
        for k, v in items.items():
            per_shard.setdefault(self._shard(k), {})[k] = v
        for shard, part in per_shard.items():
            self.clients[shard].mset(part)

    def mget(self, keys: Sequence[bytes]) -> List[Optional[bytes]]:
        out: List[Optional[bytes]] = [None] * len(keys)
        per_shard: Dict[int, List[int]] = {}
        for i, k in enumerate(keys):
            per_shard.setdefault(self._shard(k), []).append(i)
        for shard, idx in per_shard.items():
            for i, v in zip(idx, self.clients[shard].mget([keys[i] for i in idx])):
                out[i] = v
        return out

    def num_keys(self) -> int:
        return sum(c.dbsize() for c in self.clients)

    def clear(self) -> None:
        for c in self.clients:
            c.flushdb()

    def status(self) -> bool:
        try:
            return all(c.ping() for c in self.clients)
        except self.redis.exceptions.RedisError:
            return False

    def shutdown(self) -> None:
        for c in self.clients:
            c.close()
