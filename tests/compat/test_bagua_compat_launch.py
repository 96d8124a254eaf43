"""Bagua 0.9.2's launchers (``python -m bagua.distributed.launch`` / ``.run``)
with real workers, and Bagua's own examples (examples/bagua_0_9/), unchanged
in their Bagua calls, run under them: MNIST checked against torch DDP
(tests/harness/reference/mnist_ddp.py) on the same data, seeds and loop; the
others trained, saved, resumed; the elastic example under its own elastic
launch line, through a killed worker and an added node."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tests.harness.mp import REPO, launch

MNIST = os.path.join(REPO, "examples", "bagua_0_9", "mnist.py")
PRIMITIVES = os.path.join(REPO, "examples", "bagua_0_9", "communication_primitives.py")
MOE_MNIST = os.path.join(REPO, "examples", "bagua_0_9", "moe_mnist.py")
SYNTHETIC = os.path.join(REPO, "examples", "bagua_0_9", "synthetic_benchmark.py")
IMAGENET = os.path.join(REPO, "examples", "bagua_0_9", "imagenet.py")
SQUAD = os.path.join(REPO, "examples", "bagua_0_9", "squad.py")
ELASTIC = os.path.join(REPO, "examples", "bagua_0_9", "elastic_mnist.py")
CONTRACT = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "BAGUA_BUCKET_SIZE",
    "BAGUA_STORE_PORT",
)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["BAGUA_TIMEOUT"] = "60"
    for k in CONTRACT:
        env.pop(k, None)
    return env


def _run(module, *args, timeout=150, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def _script(tmp_path, source):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(source))
    return path


def _state(path):
    return torch.load(path, map_location="cpu")


# ---------------------------------------------------------------- MNIST, original style


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_mnist_example_under_launch_equals_torch_ddp(world, tmp_path):
    flags = ["--epochs", "2", "--save-model"]
    got = _run("bagua.distributed.launch", "--nproc_per_node", world, MNIST, *flags, tmp_path / "bagua.pt")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "Test set: Average loss" in got.stderr  # logging goes to stderr, rank 0 only at INFO
    ref = launch(
        os.path.join(REPO, "tests", "harness", "reference", "mnist_ddp.py"),
        world,
        timeout=150,
        args=[*flags, str(tmp_path / "ddp.pt")],
    )
    assert ref.ok(), ref.summary()
    bagua_state, ddp_state = _state(tmp_path / "bagua.pt"), _state(tmp_path / "ddp.pt")
    assert sorted(bagua_state) == sorted(ddp_state)  # with_bagua keeps the plain model state dict
    for k in ddp_state:
        err = (bagua_state[k] - ddp_state[k]).abs().max().item()
        assert torch.allclose(bagua_state[k], ddp_state[k], rtol=1e-4, atol=1e-5), f"{k}: max abs diff {err:.3g}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "algorithm,world,flags",
    [
        ("bytegrad", 3, []),
        ("decentralized", 2, []),
        ("low_precision_decentralized", 3, []),
        ("async", 2, []),
        # Adam's step: the original's CI ran it at lr 0.05; 5 epochs pass its 100 warm-up steps
        ("qadam", 2, ["--lr", "0.002", "--epochs", "5"]),
    ],
)
def test_mnist_example_under_run_trains(algorithm, world, flags, tmp_path):
    epochs = int(dict(zip(flags[::2], flags[1::2])).get("--epochs", 2))
    got = _run(
        "bagua.distributed.run", "--nproc_per_node", world, MNIST, "--algorithm", algorithm, "--epochs", "2", *flags
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    losses = [
        float(line.split("Average loss: ")[1].split(",")[0])
        for line in got.stderr.splitlines()
        if "Average loss" in line
    ]
    assert len(losses) == epochs and losses[-1] < 2.0, got.stderr[-3000:]  # chance level is ln(10) = 2.30


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_communication_primitives_example_matches_torch_distributed(world):
    got = _run("bagua.distributed.launch", "--nproc_per_node", world, PRIMITIVES)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "communication primitives: all match" in got.stdout, got.stdout[-3000:]


def _test_losses(out):
    return [float(line.split("Average loss: ")[1].split(",")[0]) for line in out.splitlines() if "Average loss" in line]


@pytest.mark.timeout(300)
def test_moe_mnist_example_trains_saves_and_resumes(tmp_path):
    """2 ranks x 2 experts train and save (a file per expert) and resume with
    ByteGrad; 4 ranks x 1 expert (the same 4 experts) cannot take the
    per-rank optimizer state, and every rank says so."""
    ckpt = tmp_path / "ckpt"
    got = _run("bagua.distributed.launch", "--nproc_per_node", 2, MOE_MNIST, "--save-checkpoint", ckpt)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    losses = _test_losses(got.stderr)
    assert len(losses) == 2 and losses[-1] < 1.0, got.stderr[-3000:]
    names = sorted(p.name for p in (ckpt / "iter_0000032").iterdir())
    assert [n for n in names if n.startswith("expert_")] == [f"expert_{g}_mp_rank_00_model_states.pt" for g in range(4)]
    flags = ["--resume", ckpt, "--algorithm", "bytegrad", "--epochs", 1]
    got = _run("bagua.distributed.launch", "--nproc_per_node", 2, MOE_MNIST, *flags)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "resumed from iteration 32" in got.stderr
    assert _test_losses(got.stderr)[-1] < 1.0, got.stderr[-3000:]
    got = _run("bagua.distributed.launch", "--nproc_per_node", 4, MOE_MNIST, *flags, "--num-local-experts", 1)
    assert got.returncode != 0
    said = "holds the optimizer state of 2 ranks, this job has 4"
    assert said in got.stdout + got.stderr, got.stdout[-3000:] + got.stderr[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "algorithm", ["gradient_allreduce", "bytegrad", "decentralized", "low_precision_decentralized", "qadam", "async"]
)
def test_synthetic_benchmark_example(algorithm):
    """Every algorithm the original's CI benchmarked; --deterministic gives the
    same final loss twice (what that CI compared)."""
    flags = ["--algorithm", algorithm, "--deterministic", "--num-iters", 2, "--num-batches-per-iter", 3]
    finals = []
    for _ in range(2 if algorithm == "gradient_allreduce" else 1):
        got = _run("bagua.distributed.launch", "--nproc_per_node", 2, SYNTHETIC, *flags)
        assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
        assert "Total img/sec on 2 CPU(s): " in got.stdout, got.stdout[-3000:]
        finals += [line.split("Final loss: ")[1] for line in got.stdout.splitlines() if "Final loss: " in line]
    assert finals and all(float(f) < 10 for f in finals) and len(set(finals)) == 1, finals


def _image_folder(root, classes=3, per_class=(12, 4)):
    """A tiny ImageNet in torchvision's ImageFolder layout: one colour per class, noisy JPEGs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in zip(("train", "val"), per_class):
        for c in range(classes):
            colour = np.roll(np.array([210.0, 30.0, 30.0]), c)
            os.makedirs(root / split / f"n{c:08d}")
            for i in range(n):
                pixels = np.clip(colour + rng.normal(0, 40, (40, 48, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / f"n{c:08d}" / f"{i}.JPEG")


@pytest.mark.timeout(300)
def test_imagenet_example_on_an_image_folder(tmp_path):
    """Trains, keeps checkpoint.pth.tar and model_best.pth.tar, and evaluates
    again from --resume, as the original's flags say."""
    _image_folder(tmp_path / "data")
    flags = ["--algorithm", "bytegrad", "--epochs", 4, "--lr", 0.02, "--save-dir", tmp_path, "--seed", 1]
    got = _run("bagua.distributed.launch", "--nproc_per_node", 2, IMAGENET, tmp_path / "data", *flags)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    acc = [float(line.split("Acc@1 ")[1].split()[0]) for line in got.stdout.splitlines() if " * Acc@1 " in line]
    assert len(acc) == 4 and max(acc) > 90, got.stdout[-3000:]  # 3 classes: chance is 33%
    assert (tmp_path / "checkpoint.pth.tar").exists() and (tmp_path / "model_best.pth.tar").exists()
    resume = ["--resume", tmp_path / "model_best.pth.tar", "--evaluate"]
    got = _run("bagua.distributed.launch", "--nproc_per_node", 2, IMAGENET, tmp_path / "data", *resume)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "=> loaded checkpoint" in got.stdout and f" * Acc@1 {max(acc):.3f}" in got.stdout, got.stdout[-3000:]


def _squad_file(path, n, seed):
    """A SQuAD v1.1 file whose answers are spans of their paragraph: who likes which colour, lives where."""
    import json
    import random

    rng = random.Random(seed)
    names = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
    colours, cities = ["red", "green", "blue", "yellow", "purple"], ["paris", "rome", "berlin", "oslo", "vienna"]
    data = []
    for i in range(n):
        facts = [(w, rng.choice(colours), rng.choice(cities)) for w in rng.sample(names, 3)]
        context = " ".join(f"{w} likes the color {c} and lives in {t} ." for w, c, t in facts)
        w, c, t = rng.choice(facts)
        question, answer = (f"which color does {w} like ?", c) if rng.random() < 0.5 else (f"where does {w} live ?", t)
        start = context.index(answer, context.index(f"{w} likes the color {c} and lives in {t}"))
        qa = {"id": f"{seed}-{i}", "question": question, "answers": [{"text": answer, "answer_start": start}]}
        data.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": [qa]}]})
    path.write_text(json.dumps({"version": "1.1", "data": data}))


@pytest.mark.timeout(300)
def test_squad_example_on_a_squad_format_file(tmp_path):
    """BERT (from a config) fine-tuned with QAdam, as the original's SQuAD
    benchmark: the loss falls, SQuAD's exact match and F1 come out, rank 0
    saves the model."""
    import json

    _squad_file(tmp_path / "train.json", 400, 1)
    _squad_file(tmp_path / "dev.json", 60, 2)
    flags = ["--train_file", tmp_path / "train.json", "--predict_file", tmp_path / "dev.json", "--do_train"]
    flags += ["--do_eval", "--num_train_epochs", 4, "--logging_steps", 10, "--algorithm", "qadam"]
    got = _run("bagua.distributed.launch", "--nproc_per_node", 2, SQUAD, *flags, "--output_dir", tmp_path / "out")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    losses = [float(line.split(" loss ")[1]) for line in got.stdout.splitlines() if " loss " in line]
    assert len(losses) >= 5 and losses[-1] < 0.6 * losses[0], got.stdout[-3000:]
    results = json.loads(got.stdout.split("Results: ")[1].splitlines()[0])
    assert set(results) == {"exact", "f1"} and results["f1"] > 0, results
    assert (tmp_path / "out" / "config.json").exists()


def _elastic_line(port, *more):
    """The original's elastic launch line (its README's), at 1 to 2 nodes of 2 workers."""
    return ["--nnodes=1:2", "--nproc_per_node=2", "--rdzv_id=JOB_ID", "--rdzv_backend=c10d"] + [
        f"--rdzv_endpoint=127.0.0.1:{port}",
        *more,
    ]


def _epochs(out):
    """[(epoch, world size)] that rank 0 reported."""
    return [
        (int(line.split("epoch ")[1].split()[0]), int(line.split("world size ")[1].split()[0]))
        for line in out.splitlines()
        if " test loss " in line
    ]


@pytest.mark.timeout(300)
def test_elastic_example_under_its_own_launch_line(tmp_path):
    """Unchanged, as its README runs it; the c10d rendezvous waits its last
    call (30 s) for more nodes before starting with one."""
    from bagua_core.launcher.ports import free_master_ports

    line = _elastic_line(free_master_ports())
    got = _run("bagua.distributed.run", *line, ELASTIC, "--epochs", 3, "--checkpoint_path", tmp_path / "c.ckpt")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert _epochs(got.stderr) == [(1, 2), (2, 2), (3, 2)], got.stderr[-3000:]


@pytest.mark.timeout(300)
def test_elastic_example_restarts_from_its_checkpoint_after_a_kill(tmp_path):
    """--max_restarts=3: rank 1 SIGKILLs itself in epoch 3; the group restarts
    and resumes from the checkpoint of epoch 2."""
    from bagua_core.launcher.ports import free_master_ports

    line = _elastic_line(free_master_ports(), "--max_restarts=3", "--rdzv_conf=last_call_timeout=1")
    flags = ["--epochs", 4, "--checkpoint_path", tmp_path / "c.ckpt", "--kill-rank-at-epoch", "1:3"]
    got = _run("bagua.distributed.run", *line, ELASTIC, *flags)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "world size 2, restart 1" in got.stderr and "resumed at epoch 3" in got.stderr, got.stderr[-3000:]
    assert _epochs(got.stderr) == [(1, 2), (2, 2), (3, 2), (4, 2)], got.stderr[-3000:]


@pytest.mark.timeout(300)
def test_elastic_example_takes_an_added_node(tmp_path):
    """--nnodes=1:2: one node trains alone; the same command started again
    adds a node, and training goes on from the checkpoint with 4 workers."""
    from bagua_core.launcher.ports import free_master_ports

    line = _elastic_line(free_master_ports(), "--max_restarts=3", "--rdzv_conf=last_call_timeout=1")
    cmd = [sys.executable, "-m", "bagua.distributed.run", *line, ELASTIC]
    cmd += ["--epochs", "400", "--train-size", "64", "--checkpoint_path", str(tmp_path / "c.ckpt")]
    log = tmp_path / "first.log"
    with open(log, "w") as f:
        first = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while "epoch 2 world size 2" not in log.read_text() and time.monotonic() < deadline:
            assert first.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        second = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=240)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert first.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    epochs = _epochs(log.read_text())
    sizes = [w for _, w in epochs]
    assert sizes[0] == 2 and sizes[-1] == 4 and sizes == sorted(sizes), epochs
    assert [e for e, _ in epochs][-1] == 400 and "resumed at epoch" in log.read_text()


# ---------------------------------------------------------------- launcher flags

SHOW = """
import json, os, sys
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
        "BAGUA_SERVICE_PORT", "BAGUA_DEFAULT_BUCKET_SIZE", "BAGUA_AUTOTUNE")
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}))
"""


def _envs(out):
    import json

    return sorted(
        (json.loads(line.split("ENV ", 1)[1]) for line in out.splitlines() if "ENV " in line),
        key=lambda e: int(e["RANK"]),
    )


@pytest.mark.timeout(60)
def test_launch_flags(tmp_path):
    script = _script(tmp_path, SHOW)
    got = _run(
        "bagua.distributed.launch",
        "--nproc_per_node",
        3,
        "--master_port",
        29950,
        "--set_additional_flag",
        "--bagua_service_port",
        29960,
        "--default_bucket_size",
        4096,
        "--autotune_level",
        1,
        "--enable_bagua_net",
        script,
        "--lr",
        "0.1",
        timeout=50,
    )
    assert got.returncode == 0, got.stderr
    envs = _envs(got.stdout)
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    for i, e in enumerate(envs):
        assert e["WORLD_SIZE"] == "3" and e["LOCAL_RANK"] == str(i) and e["MASTER_PORT"] == "29950"
        assert e["BAGUA_SERVICE_PORT"] == "29960" and e["BAGUA_DEFAULT_BUCKET_SIZE"] == "4096"
        assert e["argv"] == ["--lr", "0.1", f"--local_rank={i}"]
        assert e["BAGUA_AUTOTUNE"] == "1"
    assert "--autotune_level" not in got.stderr
    assert "--enable_bagua_net has no effect here" in got.stderr
    assert got.stdout.startswith("[rank ")  # bagua-run's prefixes


@pytest.mark.timeout(60)
def test_launch_logdir_and_no_python(tmp_path):
    logdir = tmp_path / "logs"
    got = _run(
        "bagua.distributed.launch",
        "--nproc_per_node",
        2,
        "--no_python",
        "--logdir",
        logdir,
        "sh",
        "-c",
        "echo out $RANK; echo err $LOCAL_RANK >&2",
        timeout=50,
    )
    assert got.returncode == 0, got.stderr
    for r in range(2):
        assert (logdir / f"node_0_local_rank_{r}_stdout").read_text() == f"out {r}\n"
        assert (logdir / f"node_0_local_rank_{r}_stderr").read_text() == f"err {r}\n"


@pytest.mark.timeout(60)
def test_launch_failure_stops_the_job(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """,
    )
    got = _run("bagua.distributed.launch", "--nproc_per_node", 3, script, timeout=50)
    assert got.returncode == 3 and "rank 1 (local rank 1) failed with exit code 3" in got.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--nnodes", "3:2"], "MIN:MAX needs MIN <= MAX"),
        (["--max_restarts", "-1"], "--max_restarts must be >= 0"),
        (["--rdzv_conf", "join_timeout"], "--rdzv-conf takes key=value"),
        (["--nproc_per_node", "many"], "not a number, auto or cpu"),
        (["--master_port", "70000"], "1..65534"),
    ],
)
def test_run_bad_flags(args, message, tmp_path):
    got = _run("bagua.distributed.run", *args, _script(tmp_path, SHOW), timeout=50)
    assert got.returncode == 2 and message in got.stderr, got.stderr


@pytest.mark.timeout(60)
def test_run_flags(tmp_path):
    """A fixed job: --rdzv_endpoint is the master's address, the supervisor runs it."""
    got = _run(
        "bagua.distributed.run",
        "--nnodes",
        "1:1",
        "--nproc_per_node",
        2,
        "--rdzv_endpoint",
        "127.0.0.1:29970",
        "--start_method",
        "fork",
        _script(tmp_path, SHOW),
        "x",
        timeout=50,
    )
    assert got.returncode == 0, got.stderr
    envs = _envs(got.stdout)
    assert [(e["RANK"], e["MASTER_PORT"], e["argv"]) for e in envs] == [("0", "29970", ["x"]), ("1", "29970", ["x"])]
    assert "--start_method has no effect here" in got.stderr


@pytest.mark.timeout(90)
def test_run_elastic_flags(tmp_path):
    """--max_restarts / --rdzv_backend c10d / --rdzv_id: torch elastic's agent, torchrun's environment."""
    from bagua_core.launcher.ports import free_master_ports

    show = SHOW.replace('"BAGUA_AUTOTUNE")', '"BAGUA_AUTOTUNE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")')
    flags = ["--nproc_per_node", 2, "--max_restarts", 3, "--rdzv_backend", "c10d", "--rdzv_id", "job9"]
    flags += ["--rdzv_endpoint", f"127.0.0.1:{free_master_ports()}", "--default_bucket_size", 8192]
    got = _run("bagua.distributed.run", *flags, _script(tmp_path, show), "x", timeout=80)
    assert got.returncode == 0, got.stderr
    envs = _envs(got.stdout)
    assert [(e["RANK"], e["WORLD_SIZE"], e["argv"]) for e in envs] == [("0", "2", ["x"]), ("1", "2", ["x"])]
    assert all(e["TORCHELASTIC_RUN_ID"] == "job9" and e["TORCHELASTIC_RESTART_COUNT"] == "0" for e in envs), envs
    assert all(e["BAGUA_DEFAULT_BUCKET_SIZE"] == "8192" for e in envs), envs
    assert "has no effect" not in got.stderr


@pytest.mark.timeout(60)
def test_launch_bad_flags(tmp_path):
    got = _run("bagua.distributed.launch", "--nproc_per_node", 0, _script(tmp_path, SHOW), timeout=50)
    assert got.returncode == 2 and "--nproc_per_node must be >= 1" in got.stderr
    got = _run("bagua.distributed.launch", "missing.py", timeout=50)
    assert got.returncode == 2 and "not found" in got.stderr


@pytest.mark.timeout(120)
def test_info_log_says_layout_algorithm_and_buckets():
    env_extra = {"BAGUA_LOG_LEVEL": "INFO"}
    env = _env()
    env.update(env_extra)
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "bagua.distributed.launch",
            "--nproc_per_node",
            "2",
            MNIST,
            "--epochs",
            "1",
            "--algorithm",
            "bytegrad",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=100,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    for r in range(2):
        for text in (
            f"bagua INFO rank {r}: rank {r} of 2: 1 node(s), ranks per node [2]",
            f"bagua INFO rank {r}: engine on 'world': hierarchical",
            f"bagua INFO rank {r}: algorithm step 'bytegrad' (average=true;hierarchical=true)",
            f"bagua INFO rank {r}: 1 bucket(s), bytes [",
        ):
            assert got.stderr.count(text) == 1, (text, got.stderr[-3000:])
