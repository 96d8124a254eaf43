"""examples/elastic_train.py under bagua-run's elastic launch (torch
elastic's agent and c10d rendezvous), with real kills: node a (2 workers,
an agent on this machine) trains alone, node b joins; b is SIGKILLed whole
(agent and workers), a goes on alone from the last checkpoint, b starts
again and the job goes on with both. Counted from what each worker
recorded: in the steps the finished job is made of (each step as the last
worker group that ran it ran it), every sample of every epoch is trained on
exactly once, across the changes from 4 to 2 ranks and back. A worker's
SIGKILL restarting the group ends bitwise as the job without the kill
(GradientAllReduce, ByteGrad with error feedback, QAdam, local steps)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from _launch import kill_tree  # benchmarks/ is on the test path (pyproject)

from tests.harness.paths import REPO

pytestmark = [pytest.mark.timeout(300), pytest.mark.multiprocess]

EXAMPLE = os.path.join(REPO, "examples", "elastic_train.py")
TRAIN_SIZE, BATCH, STEPS = 48, 2, 150  # 4 ranks take 8 samples a step, 2 ranks 4: an epoch is whole steps


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["BAGUA_TIMEOUT"] = "30"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(k, None)
    return env


def _records(directory):
    out = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as f:
            out += [json.loads(line) for line in f if line.endswith("\n")]
    return out


def _wait_for(what, condition, nodes, seconds=120):
    deadline = time.monotonic() + seconds
    while not condition():
        for log, proc in nodes:
            assert proc.poll() is None, f"{log.name} ended before {what}: " + log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.2)


def test_a_node_lost_and_back_trains_every_sample_once(tmp_path):
    from bagua_core.launcher.ports import free_master_ports

    port = free_master_ports()
    record = tmp_path / "record"
    record.mkdir()
    line = [sys.executable, "-m", "bagua.run", "--nnodes", "1:2", "--nproc-per-node", 2, "--max-restarts", 3]
    line += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "count"]
    line += ["--rdzv-conf", "last_call_timeout=2", EXAMPLE, "--steps", STEPS, "--checkpoint-every", 2]
    line += ["--train-size", TRAIN_SIZE, "--batch-size", BATCH, "--pause", 0.1]
    line += ["--checkpoint-dir", tmp_path / "ckpt", "--record", record]
    nodes = []

    def start(name):
        log = tmp_path / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [str(a) for a in line], cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        nodes.append((log, proc))
        return proc

    def new_group_ran(world, steps):  # a worker group of that size, started from now on, ran that many steps
        before = {r["group"] for r in _records(record)}

        def ran():
            done = collections.defaultdict(set)
            for r in _records(record):
                if r["group"] not in before and r["world"] == world:
                    done[r["group"]].add(r["step"])
            return any(len(s) >= steps for s in done.values())

        return ran

    try:
        start("a")  # first: its agent hosts the rendezvous store, which must outlive b
        _wait_for("node a training alone", new_group_ran(2, 1), nodes)
        joined = new_group_ran(4, 6)  # past a checkpoint of theirs
        second = start("b")
        _wait_for("4 ranks", joined, nodes)
        alone = new_group_ran(2, 6)
        kill_tree(second.pid)
        second.wait(timeout=30)
        nodes.pop()
        _wait_for("2 ranks going on", alone, nodes)
        joined_again = new_group_ran(4, 1)
        start("b again")
        _wait_for("4 ranks again", joined_again, nodes)
        for log, proc in nodes:
            assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        for _, proc in nodes:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()

    records = _records(record)
    by_step = collections.defaultdict(list)
    for r in records:
        by_step[r["step"]].append(r)
    assert sorted(by_step) == list(range(1, STEPS + 1))
    per_epoch = collections.defaultdict(list)
    worlds = []
    for step, rs in sorted(by_step.items()):  # the run of each step in the finished job: its last group's
        group = max((r["group"] for r in rs), key=lambda g: _group_start(records, g))
        mine = [r for r in rs if r["group"] == group]
        assert len(mine) == mine[0]["world"], (step, mine)
        worlds.append(mine[0]["world"])
        for r in mine:
            per_epoch[r["epoch"]] += r["indices"]
    changes = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
    assert changes == [2, 4, 2, 4], changes
    whole = [e for e in sorted(per_epoch) if e < max(per_epoch)]
    assert len(whole) >= 3, sorted(per_epoch)
    for epoch in whole:
        counts = collections.Counter(per_epoch[epoch])
        assert sorted(counts) == list(range(TRAIN_SIZE)) and set(counts.values()) == {1}, (epoch, counts)
    rerun = sum(len(rs) for rs in by_step.values()) - sum(worlds)
    assert rerun > 0, "the kill cost no step: nothing was redone from a checkpoint"


def _group_start(records, group):
    """When a worker group began: the time of its first recorded step."""
    return min(r["time"] for r in records if r["group"] == group)


def _launch(tmp_path, name, world, *flags, launcher=()):
    """examples/elastic_train.py on ``world`` workers of one agent; rank 0's final state dict, or None."""
    from bagua_core.launcher.ports import free_master_ports

    out = tmp_path / f"{name}.pt"
    line = [sys.executable, "-m", "bagua.run", "--nproc-per-node", world, "--master-port", free_master_ports()]
    line += [*launcher, EXAMPLE, "--train-size", 72, "--batch-size", 4, "--checkpoint-every", 5, *flags]
    got = subprocess.run(
        [str(a) for a in [*line, "--out", out]], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=200
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    return got.stdout, (torch.load(out) if out.exists() else None)


@pytest.mark.parametrize(
    "algorithm, world",
    [
        (["--algorithm", "gradient_allreduce"], 2),
        (["--algorithm", "qadam", "--lr", 0.005], 2),  # compressed from step 5, before the kill
        (["--algorithm", "local_steps"], 3),  # the checkpoint at step 10 is between synchronisations (8, 16)
        (["--algorithm", "bytegrad", "--error-feedback"], 3),
    ],
    ids=["gradient_allreduce", "qadam", "local_steps", "bytegrad_ef"],
)
def test_a_killed_worker_restarts_the_group_and_it_ends_bitwise_as_without(tmp_path, algorithm, world):
    """--max-restarts 1: rank 1 SIGKILLs itself before step 13; every worker
    restarts from the checkpoint of step 10, and rank 0's final state dict
    (weights, algorithm state) is bitwise that of the same job run without
    the kill. Local steps' weights and inner optimizers and ByteGrad's
    residual differ per rank: each rank resumes from its own saved state."""
    _, expected = _launch(tmp_path, "unbroken", world, "--steps", 24, *algorithm, "--checkpoint-dir", tmp_path / "u")
    flags = ["--steps", 24, *algorithm, "--checkpoint-dir", tmp_path / "killed", "--kill-rank-at-step", "1:13"]
    out, killed = _launch(tmp_path, "killed", world, *flags, launcher=["--max-restarts", 1])
    assert "starting at step 10" in out, out[-3000:]
    assert sorted(killed) == sorted(expected)
    for key in expected:
        assert torch.equal(killed[key], expected[key]), key
