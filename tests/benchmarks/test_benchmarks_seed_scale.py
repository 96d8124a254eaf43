"""benchmarks/seed_scale.py and its pieces: the GPU-time replay (benchmarks/_replay.py) against a real
backward, the memory estimates that refuse a run up front, the --quick smoke run over loopback with
every configuration, bad input, and, as root, a shaped run that counts the bytes on the wire and
leaves no namespace, process or shared-memory file behind, also when interrupted."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import _replay  # benchmarks/_replay.py
import _seed_models  # benchmarks/_seed_models.py
import torch
from seed_scale import CONFIGS

from tests.harness.benchmark_scripts import (
    REPO,
    _hosts,
    driver_env,
    explain,
    needs_netns,
    run_script,
    script_path,
    start_script,
)

SCRIPT = "seed_scale.py"
SLOW_GPU = {"name": "slow", "device": "a test GPU", "peak_tflops": 1e-4, "mfu": 1.0, "source": "the test"}


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )


X, Y = torch.randn(5, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3, 0])


def _loss(model):
    return torch.nn.functional.cross_entropy(model(X), Y)


# ------------------------------------------------------------ the replay ---


def test_record_keeps_layers_in_backward_order_with_their_flops_and_gradients():
    model = _mlp()
    rec = _replay.record(model, _loss, batch_scale=2.0)
    assert [layer.name for layer in rec.layers] == ["4", "2", "0"]  # backward meets the last layer first
    assert rec.layers[2].params == ["0.weight", "0.bias"]
    # a Linear's forward is 2 * batch * in * out FLOPs (the bias add is not counted), at twice the batch
    assert [layer.forward_flops for layer in rec.layers] == [2 * 2 * 5 * i * o for i, o in ((32, 4), (64, 32), (8, 64))]
    assert rec.forward_flops == sum(layer.forward_flops for layer in rec.layers)
    assert rec.layers[0].backward_flops == 2 * rec.layers[0].forward_flops  # input and weight gradients
    assert rec.layers[2].backward_flops == rec.layers[2].forward_flops  # no gradient for the input
    reference = _mlp()
    _loss(reference).backward()
    for name, p in reference.named_parameters():
        assert torch.equal(rec.grads[name], p.grad), name
    assert all(p.grad is None for p in model.parameters())


def test_timeline_splits_the_profile_time_by_flops():
    rec = _replay.record(_mlp(), _loss)
    times = _replay.timeline(rec, {**SLOW_GPU, "peak_tflops": 2.0, "mfu": 0.5})
    rate = 1e12
    assert sum(f for f, _ in times) == pytest.approx(rec.forward_flops / rate)
    assert sum(b for _, b in times) == pytest.approx(rec.backward_flops / rate)
    for layer, (f, b) in zip(rec.layers, times):
        assert f == pytest.approx(layer.forward_flops / rate) and b == pytest.approx(layer.backward_flops / rate)


def test_replay_hands_each_layer_its_recorded_gradients_at_its_deadline():
    model = _mlp()
    rec = _replay.record(model, _loss)
    times = _replay.timeline(rec, SLOW_GPU)  # slow enough that the deadlines dominate (tens of ms)
    net = _replay.ReplayNet(model, rec, times)
    ready = {}
    for name, p in net.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, n=name: ready.__setitem__(n, time.perf_counter()))
    for _ in range(2):
        ready.clear()
        t0 = time.perf_counter()
        loss = net()
        t_backward = time.perf_counter()
        loss.backward()
        assert t_backward - t0 >= sum(f for f, _ in times)
        deadline = 0.0
        for layer, (_, b) in zip(rec.layers, times):
            deadline += b
            for name in layer.params:
                assert ready[f"model.{name}"] - t_backward >= deadline - 1e-3, (name, deadline)
        for name, p in model.named_parameters():
            assert torch.equal(p.grad, rec.grads[name]), name
        net.zero_grad(set_to_none=True)
    assert net.compute_seconds == pytest.approx(sum(f + b for f, b in times))


def test_gpu_timed_step_waits_and_leaves_the_weights():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    seconds = _replay.optimizer_gpu_seconds({"hbm_gbytes_per_s": 1e-6}, 10, "sgd-momentum")  # 5 passes of 40 B
    assert seconds == pytest.approx(0.2)
    _replay.gpu_timed_step(opt, seconds)
    _loss(model).backward()
    t0 = time.perf_counter()
    opt.step()
    assert time.perf_counter() - t0 >= 0.2
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_gpu_timed_step_still_runs_the_optimizers_step_hooks():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))  # torchft's DiLoCo syncs in one
    _replay.gpu_timed_step(opt, 0.01)
    opt.step()
    assert calls == ["pre", "post"]


def test_record_gives_a_tied_weight_to_its_first_module_once():
    spec = _seed_models.model_spec("tiny-gpt")
    torch.manual_seed(0)
    model = spec.build()
    model.eval()  # no dropout: the reference below sees the same step
    ids = spec.make_batch(0, 2)
    rec = _replay.record(model, lambda m: spec.loss(m, ids))
    names = [n for layer in rec.layers for n in layer.params]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each once, lm_head's is wte's
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    reference = spec.build()
    reference.load_state_dict(model.state_dict())
    reference.eval()
    spec.loss(reference, ids).backward()
    assert torch.equal(rec.grads["transformer.wte.weight"], reference.transformer.wte.weight.grad)  # both uses


def test_fragments_cut_the_model_in_equal_shares_of_its_parameters():
    spec = _seed_models.model_spec("tiny-gpt")
    model = spec.build()
    total = _seed_models.PARAMETERS["tiny-gpt"]
    for count in (1, 2, 4):
        parts = _seed_models.fragments(model, count)
        ids = [id(p) for part in parts for p in part.parameters()]
        assert len(parts) == count and len(ids) == len(set(ids)) and len(ids) == len(list(model.parameters()))
        assert max(sum(p.numel() for p in part.parameters()) for part in parts) <= total / count + 4096  # +wte
    with pytest.raises(ValueError, match="fewer than 1000 fragments"):
        _seed_models.fragments(model, 1000)
    with torch.device("meta"):
        gpt = _seed_models.model_spec("gpt-124m").build()
    assert sum(p.numel() for p in gpt.parameters()) == _seed_models.PARAMETERS["gpt-124m"]


def test_profiles_load_and_bad_ones_are_refused(tmp_path):
    assert {"a100", "h100", "v100"} <= set(_replay.profile_names())
    for name in _replay.profile_names():
        p = _replay.load_profile(name)
        assert p["peak_tflops"] > 0 and 0 < p["mfu"] <= 1 and p["source"] and p["hbm_gbytes_per_s"] > 0
    assert _replay.load_profile("a100", mfu=0.25)["mfu"] == 0.25
    bad = tmp_path / "bad.json"
    cases = {
        "{": "does not parse as JSON",
        "[1]": "expected a JSON object",
        json.dumps({**SLOW_GPU, "peak_tflops": "fast"}): "'peak_tflops' missing or not a number",
        json.dumps({**SLOW_GPU, "mfu": 1.5}): "mfu in",
    }
    for text, message in cases.items():
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            _replay.load_profile(str(bad))
    with pytest.raises(ValueError, match="unknown GPU profile 'tpu'"):
        _replay.load_profile("tpu")


# ------------------------------------------------------------ memory ---


def test_memory_estimates_refuse_what_does_not_fit():
    budget = 21 * _seed_models.GIB
    fits = _seed_models.refusal("bert-large", "DDP", "device-time", 6, 1, 0.9, 4, budget)
    assert fits is None
    why = _seed_models.refusal("bert-large", "Bagua LocalSteps+8bit", "device-time", 6, 1, 0.9, 4, budget)
    assert why.startswith("needs about") and "GiB per rank x 4 ranks" in why and "> 21.0 GiB" in why
    assert _seed_models.refusal("bert-large", "Bagua LocalSteps+8bit", "device-time", 6, 1, 0.9, 2, budget) is None
    # a real step keeps its activations: BERT-large at SQuAD's batch and length does not fit 4 ranks here
    assert _seed_models.refusal("bert-large", "DDP", "real", 6, 1, 0.9, 4, budget) is not None
    gib = [_seed_models.per_rank_bytes("vgg16", c, "device-time", 32, 1, 0.9) for c in CONFIGS]
    assert min(gib) > 4 * _seed_models.PARAMETERS["vgg16"]  # at least weights, gradients and their recording


def test_the_written_out_vgg16_is_torchvisions():
    with torch.device("meta"):
        model = _seed_models.model_spec("vgg16").build()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert sum(p.numel() for p in model.parameters()) == _seed_models.PARAMETERS["vgg16"] == 138_357_544
    assert shapes["features.0.weight"] == (64, 3, 3, 3) and shapes["features.28.weight"] == (512, 512, 3, 3)
    assert shapes["classifier.0.weight"] == (4096, 25088) and shapes["classifier.6.weight"] == (1000, 4096)
    tv = _seed_models.torchvision_or_none()
    if tv is not None:
        with torch.device("meta"):
            theirs = tv.models.vgg16(weights=None)
        assert shapes == {n: tuple(p.shape) for n, p in theirs.named_parameters()}
    with torch.device("meta"):
        bert = _seed_models.model_spec("bert-large").build()
    assert sum(p.numel() for p in bert.parameters()) == _seed_models.PARAMETERS["bert-large"]


# ------------------------------------------------------------ the script ---


def _shm_files():
    return sorted(glob.glob("/dev/shm/bagua-seed-*"))


@pytest.mark.timeout(240)
def test_quick_run_unshaped_runs_every_configuration_and_writes_its_outputs(tmp_path):
    p = run_script(SCRIPT, "--quick", "--no-shaping", "--out-dir", str(tmp_path), "--timeout", "200", timeout=230)
    assert p.returncode == 0, explain(p)
    doc = json.loads((tmp_path / "seed_scale.json").read_text())
    assert doc["mode"] == "device-time" and doc["profile"]["name"] == "a100" and doc["shaping"] is False
    assert [r["model"] for r in doc["runs"]] == ["tiny-vgg", "tiny-bert"]
    for run in doc["runs"]:
        assert run["world_size"] == 2 and run["compute_ms"] > 0 and 0 < run["backward_fraction"] < 1
        assert set(run["results"]) == set(CONFIGS), run["model"]
        for config, r in run["results"].items():
            if "refused" in r:
                assert config.startswith("Horovod") or "hierarchical" in config or "JAX" in config, (config, r)
                continue
            assert r["ms_per_step"] > 0 and r["samples_per_s"] > 0 and r["peak_rss_mib"] > 100, (config, r)
            assert r["estimate_mib"] > 0 and r["optimizer_ms"] > 0 and r["wire_bytes_per_step"] is None
            assert 0 <= r["utilization"] <= 1, (config, r)
        assert run["results"]["DDP"]["ratio_to_ddp"] == 1.0
        for config in ("Bagua LocalSteps", "Bagua Streaming+fp4", "torchft DiLoCo", "torchft Streaming DiLoCo"):
            assert run["results"][config]["timed_steps"] % 8 == 0, config  # whole outer rounds
        assert run["results"]["Bagua ByteGrad"]["compression_cpu_ms"] > 0
    assert doc["runs"][0]["results"]["JAX Bagua GradientAllReduce"]["ms_per_step"] > 0  # the Flax VGG's stand-in
    assert "Flax VGG16 only" in doc["runs"][1]["results"]["JAX Bagua GradientAllReduce"]["refused"]
    for name in ("seed_scale.md", "memory.md"):
        assert "| DDP |" in (tmp_path / name).read_text() or "| tiny-vgg | DDP |" in (tmp_path / name).read_text()
    for name in ("tiny-vgg.png", "tiny-bert.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _shm_files() == []


@pytest.mark.timeout(60)
def test_bad_input_gets_a_clear_message(tmp_path):
    cases = [
        (("--models", "resnet50"), "unknown model(s) ['resnet50']"),
        (("--configs", "DDP,Bagua Magic"), "unknown configuration(s) ['Bagua Magic']"),
        (("--configs", "Bagua ByteGrad"), "'DDP' is the baseline"),
        (("--profile", "tpu"), "unknown GPU profile 'tpu'"),
        (("--links", "3 parsecs"), "expected a number followed by kbit, mbit or gbit"),
        (("--hosts", "1"), "--hosts: 2 to 8"),
        (("--sync-interval", "10", "--fragments", "4"), "--fragments must divide --sync-interval"),
        (("--sync-interval", "8", "--fragments", "4", "--overlap-steps", "2"), "--overlap-steps must be in [0, "),
        (("--mixing", "1.5"), "--mixing must be in [0, 1]"),
    ]
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    cases.append((("--profile", str(bad)), "does not parse as JSON"))
    for args, message in cases:
        p = run_script(SCRIPT, *args, "--no-shaping", timeout=30)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, explain(p)
    p = run_script(SCRIPT, "--quick", "--no-shaping", "--memory-gib", "0.01", "--out-dir", str(tmp_path), timeout=30)
    assert p.returncode == 2 and "every configuration was refused" in p.stderr, explain(p)
    assert "refused: tiny-vgg, DDP: needs about" in p.stdout and not (tmp_path / "seed_scale.json").exists()


@pytest.mark.timeout(30)
def test_without_root_it_says_so(tmp_path):
    cmd = [sys.executable, script_path(SCRIPT), "--models", "vgg16", "--out-dir", str(tmp_path)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and setpriv (util-linux) is missing to drop CAP_NET_ADMIN")
        cmd = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", *cmd]
    p = subprocess.run(
        cmd, cwd=REPO, env=driver_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=25
    )
    assert p.returncode == 2 and "--no-shaping" in p.stderr, explain(p)
    assert "CAP_NET_ADMIN" in p.stderr or "root" in p.stderr, explain(p)


# ------------------------------------------------------------ as root ---


def _own_netns(pid):
    return sorted(n for n in _hosts.list_netns() if n.startswith(f"{_hosts.NETNS_PREFIX}{pid}-"))


QUICK_SHAPED = ("--quick", "--models", "tiny-vgg", "--links", "1gbit")


@needs_netns
@pytest.mark.timeout(120)
def test_shaped_run_counts_the_bytes_on_the_wire_and_removes_its_hosts(tmp_path):
    p = run_script(
        SCRIPT,
        *QUICK_SHAPED,
        "--configs",
        "DDP,Bagua ByteGrad,Bagua LocalSteps,no communication",
        "--steps",
        "2",
        "--out-dir",
        str(tmp_path),
        "--timeout",
        "100",
        timeout=115,
    )
    assert p.returncode == 0, explain(p)
    run = json.loads((tmp_path / "seed_scale.json").read_text())["runs"][0]
    sent = {c: r["wire_bytes_per_step"] for c, r in run["results"].items()}
    grad = run["grad_bytes"]
    assert sent["DDP"] >= grad, sent  # a 2-host ring sends the whole gradient, plus headers
    assert sent["no communication"] < 0.5 * sent["DDP"], sent  # the barriers around each step only
    assert not [n for n in _hosts.list_netns() if n.startswith(_hosts.NETNS_PREFIX)]
    assert _shm_files() == []


@needs_netns
@pytest.mark.timeout(90)
def test_interrupted_run_leaves_nothing_behind(tmp_path):
    proc = start_script(SCRIPT, *QUICK_SHAPED, "--steps", "100000", "--out-dir", str(tmp_path), "--timeout", "80")
    try:
        deadline = time.monotonic() + 60
        while "[1gbit] tiny-vgg:" not in (line := proc.stdout.readline()) and time.monotonic() < deadline:
            assert line or proc.poll() is None, "the run ended before its configurations started"
        pids = [
            int(x)
            for n in _own_netns(proc.pid)
            for x in subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()
        ]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=40)
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-4000:]
    assert _own_netns(proc.pid) == [] and _shm_files() == []
    assert not glob.glob(os.path.join(_hosts.NETNS_ETC, f"{_hosts.NETNS_PREFIX}{proc.pid}-*"))
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
