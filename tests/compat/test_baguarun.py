"""``baguarun`` (Bagua 0.9.2's multi-host launcher) against a real ``sshd``
started for the test on a loopback port, as the hosts of a 2-node job: the
job runs (an allreduce across both "hosts" gives the right sum), every worker
gets the -x variables and the same store secret, which never appears on a
command line; a failing host stops the others; SIGTERM stops every host; bad
input is refused. Nothing is left running.

Needs root and ``/usr/sbin/sshd`` (``apt-get install -y openssh-server``,
done by the Makefile's ``system`` target as root); skipped otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests.harness.mp import REPO

SSHD = "/usr/sbin/sshd"
SECRET = "s3cret-" + uuid.uuid4().hex

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None,
    reason="needs root and openssh-server: run  sudo apt-get install -y openssh-server",
)

WORKER = """
    import os, sys, time
    import numpy as np
    import bagua_core
    group = bagua_core.init_process_group()
    x = np.array([float(group.rank)], dtype=np.float32)
    bagua_core.allreduce_inplace(x)
    print(f"rank {group.rank} of {group.size} sum {x[0]:.0f} node {os.environ['NODE_RANK']} "
          f"foo {os.environ.get('FOO')} secret {os.environ.get('BAGUA_STORE_SECRET') == sys.argv[2]}", flush=True)
    if sys.argv[1] == "fail" and group.rank == group.size - 1:
        sys.exit(3)
    if sys.argv[1] in ("fail", "sleep"):
        time.sleep(120)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {d}/host_key
        PidFile {d}/sshd.pid
        AuthorizedKeysFile {d}/authorized_keys
        StrictModes no
        PermitRootLogin prohibit-password
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        """)
    )
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "sshd did not start"
                time.sleep(0.1)
        ssh = (
            f"ssh -i {d}/client_key -o BatchMode=yes -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        )
        yield port, ssh
    finally:
        proc.terminate()
        proc.wait(10)


def _baguarun(sshd, tmp_path, *args, env_extra=None, mode="ok", hosts=None):
    port, ssh = sshd
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    marker = "baguarun-test-" + uuid.uuid4().hex
    env = {
        **os.environ,
        "BAGUA_SSH_COMMAND": ssh,
        "BAGUA_STORE_SECRET": SECRET,
        "PYTHONPATH": REPO,
        **(env_extra or {}),
    }
    hosts = hosts or f"127.0.0.1:{port},127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "bagua.script.baguarun",
        "--host_list",
        hosts,
        "--nproc_per_node",
        "2",
        "-x",
        "FOO=bar",
        "-x",
        "BAGUA_TIMEOUT=60",
        "-x",
        "PYTHONPATH",
        *args,
        str(script),
        mode,
        SECRET,
        marker,
    ]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    ), marker


def _cmdlines():
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return out


def _assert_nothing_left(marker, within_s=20.0):
    deadline = time.monotonic() + within_s
    while any(marker in c for c in _cmdlines()):
        assert time.monotonic() < deadline, "processes of the job are still running"
        time.sleep(0.2)


def _finish(proc, timeout=120):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as timeout_error:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError("baguarun did not finish:\n" + out[-3000:] + err[-3000:]) from timeout_error
    return proc.returncode, out + err


@pytest.mark.timeout(180)
def test_two_hosts_run_the_job(sshd, tmp_path):
    proc, marker = _baguarun(sshd, tmp_path)
    seen_secret_in_argv = False
    while proc.poll() is None:
        seen_secret_in_argv |= any(SECRET in c and "baguarun" not in c and "worker.py" not in c for c in _cmdlines())
        time.sleep(0.2)
    rc, out = _finish(proc)
    assert rc == 0, out[-4000:]
    for rank in range(4):
        assert f"rank {rank} of 4 sum 6 node {rank // 2} foo bar secret True" in out, out[-4000:]
    assert not seen_secret_in_argv, "the store secret appeared on a command line"
    _assert_nothing_left(marker)


@pytest.mark.timeout(180)
def test_a_failing_host_stops_the_others(sshd, tmp_path):
    proc, marker = _baguarun(sshd, tmp_path, mode="fail")
    start = time.monotonic()
    rc, out = _finish(proc)
    assert rc != 0 and time.monotonic() - start < 90, out[-4000:]
    assert "failed" in out and "stopping the other hosts" in out, out[-4000:]
    _assert_nothing_left(marker)


@pytest.mark.timeout(180)
def test_sigterm_stops_every_host(sshd, tmp_path):
    proc, marker = _baguarun(sshd, tmp_path, mode="sleep")
    deadline = time.monotonic() + 90
    while sum(marker in c and "worker.py" in c for c in _cmdlines()) < 4:  # every worker started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    time.sleep(2)  # past the rendezvous
    proc.send_signal(signal.SIGTERM)
    rc, out = _finish(proc, timeout=60)
    assert rc == 128 + signal.SIGTERM, out[-4000:]
    assert "stopping every host" in out
    _assert_nothing_left(marker)


@pytest.mark.timeout(60)
def test_bad_input_is_refused(sshd, tmp_path):
    def run(*argv, env_extra=None):
        env = {**os.environ, **(env_extra or {})}
        env.pop("BAGUA_NODE_DOMAIN_NAMES", None)
        env.update(env_extra or {})
        return subprocess.run(
            [sys.executable, "-m", "bagua.script.baguarun", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
        )

    got = run("--nproc_per_node", "1", "x.py")
    assert got.returncode == 2 and "no hosts" in got.stderr
    got = run("--host_list", "a,,b", "--nproc_per_node", "1", "x.py")
    assert got.returncode == 2 and "empty host name" in got.stderr
    got = run("--host_list", "a:notaport", "--nproc_per_node", "1", "x.py")
    assert got.returncode == 2 and "ssh port must be a number" in got.stderr
    got = run("--host_list", "a", "--nproc_per_node", "1", "-x", "1BAD", "x.py")
    assert got.returncode == 2 and "not a variable name" in got.stderr
    got = run("--host_list", "a", "--nproc_per_node", "0", "x.py")
    assert got.returncode == 2 and "--nproc_per_node must be >= 1" in got.stderr
    got = run("--host_list", "a", "--nproc_per_node", "1", "x.py", env_extra={"BAGUA_SSH_PORT": "http"})
    assert got.returncode == 2 and "BAGUA_SSH_PORT" in got.stderr


@pytest.mark.timeout(60)
def test_unreachable_host_is_named(sshd, tmp_path):
    proc, marker = _baguarun(sshd, tmp_path, hosts=f"127.0.0.1:{sshd[0]},127.0.0.1:{_free_port()}")
    rc, out = _finish(proc, timeout=50)
    assert rc == 255 and "ssh failed" in out, out[-4000:]
    _assert_nothing_left(marker)


@pytest.mark.timeout(30)
def test_bagua_flags_reach_every_host_launcher():
    from bagua.script import baguarun

    a = baguarun.build_parser().parse_args(
        [
            "--host_list",
            "h1,h2",
            "--nproc_per_node",
            "3",
            "--master_port",
            "1234",
            "--autotune_level",
            "1",
            "--default_bucket_size",
            "4096",
            "--is_output_autotune_log",
            "train.py",
            "--lr",
            "0.1",
        ]
    )
    script = baguarun.remote_script(1, 2, "h1", a, [("FOO", "a b")])
    for part in (
        "--nnodes=2",
        "--node_rank=1",
        "--master_addr=h1",
        "--nproc_per_node=3",
        "--master_port=1234",
        "--autotune_level=1",
        "--default_bucket_size=4096",
        "--is_output_autotune_log",
        "train.py --lr 0.1",
        "export FOO=",
    ):
        assert part in script, (part, script)
