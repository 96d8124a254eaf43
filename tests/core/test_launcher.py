"""bagua-run with real worker processes: environment, output, arguments, failures, signals."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from bagua_core import config, run as bagua_run
from tests.harness.paths import REPO

CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONUNBUFFERED",
)
PREFIXED = re.compile(r"^\[rank (\d+)\] (.*)$")

pytestmark = pytest.mark.timeout(30)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for k in CONTRACT:  # the launcher must set these, not inherit them
        env.pop(k, None)
    return env


def _cmd(*args):
    return [sys.executable, "-m", "bagua_core.run", *map(str, args)]


def _launch(*args, cwd=REPO, timeout=20):
    return subprocess.run(
        _cmd(*args), cwd=cwd, env=_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout
    )


def _script(tmp_path, source, name="worker.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def _by_rank(text):
    """{rank: [line, ...]} of prefixed lines; asserts every line is prefixed."""
    out = {}
    for line in text.splitlines():
        m = PREFIXED.match(line)
        assert m, f"line without rank prefix: {line!r}"
        out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


ENV_WORKER = f"""
import json, os, sys
print(json.dumps({{k: os.environ.get(k) for k in {CONTRACT!r}}}))
"""


def test_env_contract_three_workers(tmp_path):
    r = _launch("--nproc-per-node", 3, _script(tmp_path, ENV_WORKER))
    assert r.returncode == 0, r.stderr
    envs = {rank: json.loads(lines[0]) for rank, lines in _by_rank(r.stdout).items()}
    assert sorted(envs) == [0, 1, 2]
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1
    port = int(ports.pop())
    for rank, e in envs.items():
        assert e == {
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "3",
            "NODE_RANK": "0",
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
        }
        s = config.load(e)  # what the engine makes of it
        assert (s.rank, s.world_size, s.local_rank, s.node_rank, s.store_port) == (rank, 3, rank, 0, port + 1)
    # The chosen port and the store port next to it were free (nothing listened during the run).
    assert 0 < port < 65535 and _bindable(port) and _bindable(port + 1)


def test_multi_node_env_without_other_node(tmp_path):
    r = _launch("--nnodes", 2, "--node-rank", 1, "--nproc-per-node", 2, _script(tmp_path, ENV_WORKER))
    assert r.returncode == 0, r.stderr
    envs = {rank: json.loads(lines[0]) for rank, lines in _by_rank(r.stdout).items()}
    assert sorted(envs) == [2, 3]  # prefixes carry the global rank
    for rank, e in envs.items():
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            str(rank - 2),
            "4",
            "2",
        )
        assert (e["NODE_RANK"], e["GROUP_RANK"], e["MASTER_PORT"]) == ("1", "1", "29500")
        s = config.load(e)
        assert (s.rank, s.node_rank, s.num_nodes) == (rank, 1, 2)
    assert "loopback" in r.stderr  # warns that other machines cannot reach 127.0.0.1


def test_prefixes_on_stdout_and_stderr(tmp_path):
    worker = _script(
        tmp_path,
        """
        import os, sys
        rank = os.environ["RANK"]
        print(f"out {rank}")
        print(f"err {rank}", file=sys.stderr)
        print("second line")
        sys.stdout.write("partial without newline")
    """,
    )
    r = _launch("--nproc-per-node", 2, worker)
    assert r.returncode == 0, r.stderr
    assert _by_rank(r.stdout) == {rank: [f"out {rank}", "second line", "partial without newline"] for rank in (0, 1)}
    assert _by_rank(r.stderr) == {0: ["err 0"], 1: ["err 1"]}


def test_lines_never_interleave(tmp_path):
    worker = _script(
        tmp_path,
        """
        import os, sys
        rank = os.environ["RANK"]
        for i in range(3000):
            sys.stdout.write(f"{rank}:{i}:" + rank * 300 + "\\n")
    """,
    )
    r = _launch("--nproc-per-node", 3, worker)
    assert r.returncode == 0, r.stderr
    lines = _by_rank(r.stdout)
    for rank in range(3):
        assert lines[rank] == [f"{rank}:{i}:" + str(rank) * 300 for i in range(3000)]


def test_no_prefix(tmp_path):
    worker = _script(tmp_path, "print('plain')\n")
    r = _launch("--no-prefix", "--nproc-per-node", 2, worker)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["plain", "plain"]


def test_arguments_pass_through(tmp_path):
    worker = _script(tmp_path, "import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    args = ["--foo", "bar", "-x", "--nproc-per-node", "7", "-m", "--", "--master-port=1", ""]
    r = _launch("--nproc-per-node", 2, worker, *args)
    assert r.returncode == 0, r.stderr
    assert {rank: json.loads(lines[0]) for rank, lines in _by_rank(r.stdout).items()} == {0: args, 1: args}


def test_module_mode(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    _script(
        tmp_path,
        """
        import os, sys
        print(__name__, __spec__.name, os.environ["RANK"], sys.argv[1:])
    """,
        name="mypkg/hello.py",
    )
    r = _launch("--nproc-per-node", 2, "-m", "mypkg.hello", "--foo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _by_rank(r.stdout) == {rank: [f"__main__ mypkg.hello {rank} ['--foo']"] for rank in (0, 1)}


# Workers write their pid, wait until every rank has, then do what the test asks.
PID_WORKER = """
import os, signal, subprocess, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
d = sys.argv[1]
def wait_for_all():
    deadline = time.time() + 15
    while not all(os.path.exists(os.path.join(d, f"pid{r}")) for r in range(world)):
        assert time.time() < deadline
        time.sleep(0.01)
def write(name, text):
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
"""


def _pids(d, world):
    return [int((d / f"pid{r}").read_text()) for r in range(world)]


def _kill_leftovers(d, world, *extra):
    """Cleanup when a test failed: SIGKILL whatever reported pids are still alive."""
    for name in [f"pid{r}" for r in range(world)] + list(extra):
        try:
            os.kill(int((d / name).read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_failing_worker_stops_the_others(tmp_path):
    worker = _script(
        tmp_path,
        PID_WORKER
        + """
        write(f"pid{rank}", str(os.getpid()))
        wait_for_all()
        if rank == 1:
            print("giving up", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
    """.replace("\n        ", "\n"),
    )
    start = time.monotonic()
    r = _launch("--nproc-per-node", 3, worker, tmp_path)
    elapsed = time.monotonic() - start
    assert r.returncode == 3, r.stderr
    assert elapsed < 8, f"the sleeping workers were not stopped promptly ({elapsed:.1f} s)"
    assert "[rank 1] giving up" in r.stderr
    summary = r.stderr.strip().splitlines()[-1]
    assert "rank 1" in summary and "exit code 3" in summary and "other 2 running" in summary, summary
    assert not any(_alive(p) for p in _pids(tmp_path, 3))


def test_worker_killed_by_signal_and_sigterm_ignored(tmp_path):
    # Rank 1 dies by SIGKILL; rank 0 ignores SIGTERM and must get SIGKILL after the grace period.
    worker = _script(
        tmp_path,
        PID_WORKER
        + """
        if rank == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write(f"pid{rank}", str(os.getpid()))
        wait_for_all()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """.replace("\n        ", "\n"),
    )
    start = time.monotonic()
    r = _launch("--nproc-per-node", 2, "--grace-period", 0.5, worker, tmp_path)
    elapsed = time.monotonic() - start
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    assert 0.5 <= elapsed < 8
    summary = r.stderr.strip().splitlines()[-1]
    assert "rank 1" in summary and "SIGKILL" in summary and "137" in summary, summary
    assert "1 worker(s) got SIGKILL after the 0.5 s grace period" in summary, summary
    assert not any(_alive(p) for p in _pids(tmp_path, 2))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_is_forwarded_and_nothing_left_behind(tmp_path, signum):
    # Rank 0 also starts a grandchild: the whole process group must go.
    worker = _script(
        tmp_path,
        PID_WORKER
        + """
        def on_signal(s, _frame):
            write(f"got{rank}", str(s))
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if rank == 0:
            child = subprocess.Popen(["sleep", "60"])
            write("grandchild", str(child.pid))
        write(f"pid{rank}", str(os.getpid()))
        time.sleep(60)
    """.replace("\n        ", "\n"),
    )
    p = subprocess.Popen(
        _cmd("--nproc-per-node", 2, worker, tmp_path),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_until(lambda: all((tmp_path / f"pid{r}").exists() for r in range(2)), 15, "workers to start")
        p.send_signal(signum)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
            _kill_leftovers(tmp_path, 2, "grandchild")
    assert p.returncode == 128 + signum, err
    for r in range(2):
        assert (tmp_path / f"got{r}").read_text() == str(int(signum))
    assert f"received {signal.Signals(signum).name}" in err.strip().splitlines()[-1]
    pids = _pids(tmp_path, 2) + [int((tmp_path / "grandchild").read_text())]
    _wait_until(lambda: not any(_alive(q) for q in pids), 2, "workers and grandchild to be gone")


def test_workers_die_with_a_killed_launcher(tmp_path):
    worker = _script(
        tmp_path,
        PID_WORKER
        + """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write(f"pid{rank}", str(os.getpid()))
        time.sleep(60)
    """.replace("\n        ", "\n"),
    )
    p = subprocess.Popen(
        _cmd("--nproc-per-node", 2, worker, tmp_path),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_until(lambda: all((tmp_path / f"pid{r}").exists() for r in range(2)), 15, "workers to start")
        p.kill()  # SIGKILL: the launcher cannot forward anything
        p.wait(timeout=10)
        pids = _pids(tmp_path, 2)
        _wait_until(lambda: not any(_alive(q) for q in pids), 5, "orphaned workers to die")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        _kill_leftovers(tmp_path, 2)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nproc-per-node", "0", "x.py"], "--nproc-per-node must be >= 1"),
        (["--nproc-per-node", "two", "x.py"], "'two' is not an integer"),
        (["--nnodes", "2", "--node-rank", "2", "x.py"], "--node-rank 2 is out of range for --nnodes 2"),
        (["--master-port", "65535", "x.py"], "must be in 1..65534"),
        (["--grace-period", "-1", "x.py"], "seconds >= 0"),
        (["--nproc-per-node", "2"], "the following arguments are required: SCRIPT"),
        (["does_not_exist.py"], "script 'does_not_exist.py' not found"),
        (["--nproc", "2", "x.py"], "unrecognized arguments"),  # no abbreviations
        (["--nnodes", "3:2", "x.py"], "MIN:MAX needs MIN <= MAX, got 3:2"),
        (["--nnodes", "0:2", "x.py"], "the number of nodes must be >= 1"),
        (["--max-restarts", "-1", "x.py"], "--max-restarts must be >= 0, got -1"),
        (["--rdzv-backend", "etcd", "x.py"], "invalid choice: 'etcd'"),
        (["--rdzv-endpoint", "host:port", "--max-restarts", "1", "x.py"], "is not HOST[:PORT]"),
        (["--rdzv-conf", "timeout", "x.py"], "--rdzv-conf takes key=value"),
        (["--monitor-interval", "0", "x.py"], "must be > 0 seconds"),
    ],
)
def test_invalid_arguments(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "x.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        bagua_run.main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("module", ["bagua_core.run", "bagua.run"])
def test_launcher_imports_neither_torch_nor_jax(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'jax', 'numpy') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


SECRET_WORKER = """
import os
print(os.environ.get("BAGUA_STORE_SECRET", "<unset>"))
"""


def test_single_node_jobs_get_one_store_secret(tmp_path, monkeypatch):
    monkeypatch.delenv("BAGUA_STORE_SECRET", raising=False)
    r = _launch("--nproc-per-node", 3, _script(tmp_path, SECRET_WORKER))
    assert r.returncode == 0, r.stderr
    seen = {lines[0] for lines in _by_rank(r.stdout).values()}
    assert len(seen) == 1 and re.fullmatch(r"[0-9a-f]{64}", next(iter(seen))), seen
    again = _launch("--nproc-per-node", 2, _script(tmp_path, SECRET_WORKER))
    other = {lines[0] for lines in _by_rank(again.stdout).values()}
    assert len(other) == 1 and other.isdisjoint(seen)  # one per job
    monkeypatch.setenv("BAGUA_STORE_SECRET", "mine")
    r = _launch("--nproc-per-node", 2, _script(tmp_path, SECRET_WORKER))
    assert {lines[0] for lines in _by_rank(r.stdout).values()} == {"mine"}


def test_multi_node_jobs_without_a_secret_warn(tmp_path, monkeypatch):
    monkeypatch.delenv("BAGUA_STORE_SECRET", raising=False)
    r = _launch("--nnodes", 2, "--node-rank", 1, "--nproc-per-node", 1, _script(tmp_path, SECRET_WORKER))
    assert r.returncode == 0, r.stderr
    assert {lines[0] for lines in _by_rank(r.stdout).values()} == {"<unset>"}
    assert "BAGUA_STORE_SECRET is not set" in r.stderr


def test_version_and_help_name_the_defaults():
    import bagua_core

    out = _launch("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"bagua-run (bagua {bagua_core.__version__})"
    out = _launch("--help")
    assert out.returncode == 0 and "OMP_NUM_THREADS=1 unless it is set" in out.stdout


def test_carriage_returns_pass_through_live_with_the_prefix(tmp_path):
    # a progress bar (tqdm) redraws its line after \r: each redraw shows at once, prefixed
    go = tmp_path / "go"
    script = _script(
        tmp_path,
        f"""
        import os, sys, time
        sys.stderr.write("\\r10%")
        sys.stderr.flush()
        deadline = time.monotonic() + 10
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the test saw 10%
        sys.stderr.write("\\r50%\\r100%\\r\\n")
        print("done")
    """,
    )
    proc = subprocess.Popen(
        _cmd("--nproc-per-node", 1, script),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        first = b""
        while b"10%" not in first:
            more = proc.stderr.read1(4096)
            assert more, first
            first += more
        go.touch()
        err = first + proc.stderr.read()
        out = proc.stdout.read()
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
    assert first == b"[rank 0] \r[rank 0] 10%", first
    assert err == b"[rank 0] \r[rank 0] 10%\r[rank 0] 50%\r[rank 0] 100%\r\n", err
    assert out == b"[rank 0] done\n"
