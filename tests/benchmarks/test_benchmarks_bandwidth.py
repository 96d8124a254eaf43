"""benchmarks/bandwidth.py: the output files' shape (a smoke run over loopback, no root needed),
the clear refusal without root, and, as root with working network namespaces, that a short
shaped run creates its two namespaces and removes them, also when it is interrupted or killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from bandwidth import CONFIGS  # every configuration the script runs by default

from tests.harness.benchmark_scripts import (
    REPO,
    _hosts,
    driver_env,
    explain,
    needs_netns,
    run_script,
    script_path,
    start_script,
    table_rows,
)

SCRIPT = "bandwidth.py"


def _run(*args, timeout=100):
    return run_script(SCRIPT, *args, timeout=timeout)


@pytest.mark.timeout(120)
def test_smoke_run_unshaped_writes_table_json_and_png(tmp_path):
    p = _run("--smoke", "--no-shaping", "--out-dir", str(tmp_path), "--timeout", "90")
    assert p.returncode == 0, explain(p)
    assert "shaping skipped: --no-shaping given" in p.stdout

    rows = table_rows(p.stdout)
    for name in CONFIGS:
        assert name in rows, f"{name!r} missing from the table:\n{p.stdout}"
    assert rows["DDP"].rstrip(" |").endswith("1.00x")
    md_rows = [line for line in (tmp_path / "bandwidth.md").read_text().splitlines() if line.startswith("|")]
    assert len(md_rows) == len(CONFIGS) + 2  # + the header and separator rows

    doc = json.loads((tmp_path / "bandwidth.json").read_text())
    assert doc["mode"] == "throughput" and doc["shaping"] is False
    assert doc["links"] == ["loopback (unshaped)"] and doc["configs"] == list(CONFIGS)
    for key in ("load_average_before", "uptime_after", "model", "batch_size", "seconds"):
        assert key in doc, key
    run = doc["runs"]["loopback (unshaped)"]
    assert run["world_size"] == 2
    for name in CONFIGS:
        r = run["results"][name]
        assert r["samples_per_s"] > 0 and r["ms_per_step"] > 0 and r["ratio_to_ddp"] > 0, (name, r)
        assert len(r["step_seconds"]) == 2, (name, r)
    assert (tmp_path / "bandwidth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_time_to_loss_smoke_writes_curves(tmp_path):
    p = _run(
        "--smoke",
        "--no-shaping",
        "--time-to-loss",
        "--configs",
        "DDP,Bagua ByteGrad",
        "--target-loss",
        "0.0",
        "--max-steps",
        "3",
        "--out-dir",
        str(tmp_path),
        "--timeout",
        "50",
        timeout=58,
    )
    assert p.returncode == 0, explain(p)
    doc = json.loads((tmp_path / "time_to_loss.json").read_text())
    for name in ("DDP", "Bagua ByteGrad"):
        r = doc["runs"]["loopback (unshaped)"]["results"][name]
        assert r["steps"] == 3 and r["seconds_to_target"] is None, r
        times = [c[0] for c in r["curve"]]
        assert times == sorted(times) and times[0] > 0
    assert (tmp_path / "time_to_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert "not reached" in (tmp_path / "time_to_loss.md").read_text()


@pytest.mark.timeout(30)
def test_without_root_it_says_so(tmp_path):
    """Not root: the message names root. Root: run with CAP_NET_ADMIN dropped (setpriv), as in a
    container without it; the message names the capability."""
    cmd = [sys.executable, script_path(SCRIPT), "--rates", "100mbit", "--out-dir", str(tmp_path)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and setpriv (util-linux) is missing to drop CAP_NET_ADMIN")
        cmd = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", *cmd]
    p = subprocess.run(
        cmd, cwd=REPO, env=driver_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=25
    )
    assert p.returncode == 2, explain(p)
    assert "CAP_NET_ADMIN" in p.stderr and "--no-shaping" in p.stderr, explain(p)
    assert not (tmp_path / "bandwidth.json").exists()
    p = _run("--rates", "3 parsecs", timeout=25)
    assert p.returncode == 2 and "expected a number followed by kbit, mbit or gbit" in p.stderr, explain(p)


@pytest.mark.timeout(30)
def test_overlap_and_one_lane_suffixes_and_extra_configurations_parse():
    import argparse

    import _training  # benchmarks/_training.py

    class Refused(Exception):
        pass

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise Refused(message)

    from bandwidth import EXTRA_CONFIGS

    ok = "DDP,Bagua ByteGrad overlap,Bagua GradientAllReduce overlap 1 lane,Bagua ByteGrad 1 lane,no communication"
    assert _training.parse_configs(Parser(), ok, CONFIGS + EXTRA_CONFIGS, "DDP") == tuple(ok.split(","))
    for bad in ("DDP,DDP overlap", "DDP,Bagua ByteGrad 1 lane overlap", "DDP,Bagua Nothing overlap"):
        with pytest.raises(Refused, match="unknown configuration"):
            _training.parse_configs(Parser(), bad, CONFIGS, "DDP")


# ------------------------------------------------------------ as root ---


def _own_netns(pid):
    return sorted(n for n in _hosts.list_netns() if n.startswith(f"{_hosts.NETNS_PREFIX}{pid}-"))


def _start(*args):
    return start_script(SCRIPT, *args)


def _wait_for_workers(proc, timeout=40):
    """The run's namespace names and the pids running in them, once its workers are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        names = _own_netns(proc.pid)
        pids = [
            int(x)
            for n in names
            for x in subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()
        ]
        if len(names) == 2 and len(pids) >= 4:  # a launcher and a worker on each host
            return names, pids
        time.sleep(0.2)
    raise AssertionError("the run's namespaces and workers did not appear")


def _alive(pids):
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1][0] != "Z":
                    alive.append(pid)
        except FileNotFoundError:
            pass
    return alive


def _gone_soon(pids, timeout=15):
    deadline = time.monotonic() + timeout
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive(pids)


@needs_netns
@pytest.mark.timeout(90)
def test_shaped_run_creates_and_removes_its_hosts(tmp_path):
    proc = _start(
        "--smoke",
        "--rates",
        "100mbit",
        "--configs",
        "DDP,Bagua ByteGrad",
        "--out-dir",
        str(tmp_path),
        "--timeout",
        "70",
    )
    try:
        names, _ = _wait_for_workers(proc)
        assert names == [f"{_hosts.NETNS_PREFIX}{proc.pid}-a", f"{_hosts.NETNS_PREFIX}{proc.pid}-b"]
        out, _ = proc.communicate(timeout=80)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "shaping skipped" not in out and f"veth bbw{proc.pid}a <-> bbw{proc.pid}b" in out
    assert _own_netns(proc.pid) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"bbw{proc.pid}" not in links
    doc = json.loads((tmp_path / "bandwidth.json").read_text())
    assert doc["shaping"] is True and doc["links"] == ["100mbit"]
    assert set(doc["runs"]["100mbit"]["results"]) == {"DDP", "Bagua ByteGrad"}


# A tiny model for many steps: still running when the test interrupts it
# (--smoke would cap the steps at 2 and let a quiet machine finish first).
LONG_TINY_RUN = ("--batch-size", "4", "--features", "16", "--hidden", "32", "--warmup", "1", "--steps", "1000")


@needs_netns
@pytest.mark.timeout(60)
def test_interrupted_run_removes_its_hosts_and_workers(tmp_path):
    proc = _start(
        *LONG_TINY_RUN, "--rates", "100mbit,10mbit", "--configs", "DDP", "--out-dir", str(tmp_path), "--timeout", "50"
    )
    try:
        _, pids = _wait_for_workers(proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=40)
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-4000:]
    assert _own_netns(proc.pid) == []
    assert _gone_soon(pids), _alive(pids)


@needs_netns
@pytest.mark.timeout(60)
def test_run_killed_with_sigkill_is_cleaned_up_by_the_next(tmp_path):
    proc = _start(
        *LONG_TINY_RUN, "--rates", "100mbit", "--configs", "DDP", "--out-dir", str(tmp_path), "--timeout", "50"
    )
    try:
        names, pids = _wait_for_workers(proc)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert _gone_soon(pids), _alive(pids)  # the launchers die with the driver, the workers with them
    assert _own_netns(proc.pid) == names  # nothing could remove them
    p = _run("--cleanup", timeout=30)
    assert p.returncode == 0, explain(p)
    assert _own_netns(proc.pid) == []


LANES_TINY = ("--rounds", "2", "--buckets", "3", "--bucket-mib", "0.25")


def _lanes(*args, timeout=60):
    return run_script("engine_lanes.py", *args, timeout=timeout)


@pytest.mark.timeout(80)
def test_engine_lanes_benchmark_over_loopback():
    for step in ("bytegrad", "centralized_allreduce"):
        p = _lanes("--no-shaping", "--step", step, *LANES_TINY)
        assert p.returncode == 0, explain(p)  # the engines' results were also compared bitwise
        assert f"{step}, 3 buckets" in p.stdout and "link loopback" in p.stdout, explain(p)
        assert "1 lane :" in p.stdout and "2 lanes:" in p.stdout and "x the one-lane speed" in p.stdout, explain(p)
    p = _lanes("--buckets", "1")
    assert p.returncode == 2 and "--buckets must be >= 2" in p.stderr, explain(p)


@needs_netns
@pytest.mark.timeout(80)
def test_engine_lanes_benchmark_on_a_shaped_link_removes_its_hosts():
    before = set(_hosts.list_netns())
    p = _lanes("--rate", "1gbit", *LANES_TINY)
    assert p.returncode == 0 and "link 1gbit" in p.stdout, explain(p)
    assert set(_hosts.list_netns()) == before
