"""benchmarks/time_to_accuracy.py: the tuning schedule, the target and summary arithmetic (pure
functions), a smoke run over loopback (no root) that writes the table, JSON and plots and says the
bytes were not counted, and, as root with network namespaces, a tiny shaped run whose bytes on the
wire are counted on 2 and 4 emulated hosts."""

from __future__ import annotations

import json
import math

import pytest
import time_to_accuracy as tta  # benchmarks/time_to_accuracy.py (benchmarks/ is on pytest's pythonpath)

from tests.harness.benchmark_scripts import _hosts, explain, needs_netns, run_script


def _run(*args, timeout=60):
    return run_script("time_to_accuracy.py", *args, timeout=timeout)


# ------------------------------------------------------------ pure logic ---


def _tune(lr_grid, grid, budget, score):
    tuner, seen = tta.Tuner(lr_grid, grid, budget), []
    while (hp := tuner.next()) is not None:
        seen.append(hp)
        tuner.record(hp, score(hp))
    return tuner.best(), seen


def test_every_method_gets_the_same_number_of_trials():
    args = tta.parse_args([])
    for method in tta.METHODS:
        grid = tta.knob_grid(method, args)
        _, seen = _tune(args.lr_grid["sgd"], grid, args.tune_trials, lambda hp: -abs(math.log(hp["lr"] / 0.05)))
        assert len(seen) == args.tune_trials == 12, (method, seen)
        assert len({json.dumps(hp, sort_keys=True) for hp in seen}) == len(seen), (method, seen)  # no repeats
        assert [hp["lr"] for hp in seen[:4]] == [0.3, 0.1, 0.03, 0.01], method  # stage 1: the grid


def test_tuning_finds_the_best_knobs_at_the_best_lr_then_refines_the_lr():
    grid = [{"sync_interval": h} for h in (4, 8, 16, 32)]
    best, seen = _tune(
        [0.3, 0.1, 0.03, 0.01],
        grid,
        12,
        lambda hp: -abs(math.log(hp["lr"] / 0.05)) - abs(math.log(hp["sync_interval"] / 32)),
    )
    assert all(hp["sync_interval"] == 16 for hp in seen[:4])  # the middle of the grid while the lr is tuned
    assert seen[4:7] == [{"lr": 0.03, "sync_interval": h} for h in (4, 8, 32)]  # stage 2 at the best lr
    assert all(hp["sync_interval"] == 32 for hp in seen[7:])  # stage 3: lr refined with the best knobs
    assert best["sync_interval"] == 32 and abs(math.log(best["lr"] / 0.05)) < abs(math.log(0.03 / 0.05))
    # a larger grid than the budget: an evenly spaced part of it
    big = [{"rank": r, "start_iter": s} for r in (1, 2, 4, 8) for s in (10, 100)]
    _, seen = _tune([0.1, 0.01], big, 5, lambda hp: hp["lr"])
    assert [(hp["rank"], hp["start_iter"]) for hp in seen[2:]] == [(1, 10), (2, 100), (8, 100)]


def test_target_time_and_metric_at_budget():
    curve = [(1.0, 10, 0.5, 1.0), (2.0, 20, 0.8, 0.5), (3.0, 30, 0.9, 0.4)]
    assert tta.time_to_target(curve, 0.8) == 2.0 and tta.time_to_target(curve, 0.95) is None
    assert tta.metric_at(curve, 2.5) == 0.8 and tta.metric_at(curve, 0.5) is None
    assert tta.median_time([3.0, None, 1.0]) == 3.0 and tta.median_time([None, None, 1.0]) is None

    def run(times_metrics, bytes_per_step=None):
        return {
            "curve": [(t, 10 * (i + 1), m, 0.0) for i, (t, m) in enumerate(times_metrics)],
            "bytes": None if bytes_per_step is None else 1,
            "bytes_per_step": bytes_per_step,
        }

    cases = {
        "DDP": {"tuned": {"lr": 0.1}, "runs": [run([(2, 0.5), (4, 1.0)], 100)] * 3},
        "DDP+PowerSGD": {"tuned": {"lr": 0.1}, "runs": [run([(1, 0.5), (8, 0.99)], 10)] * 3},
        "Bagua ByteGrad": {"tuned": {"lr": 0.1}, "runs": [run([(1, 0.995)], 25)] * 2 + [run([(1, 0.2)], 25)]},
        "Bagua LowRank": {"skipped": "no LowRankAlgorithm"},
    }
    s = tta.summarize(cases, list(cases), 0.99, budget=5.0)
    assert s["target"] == pytest.approx(0.99)
    m = s["methods"]
    assert m["DDP"]["median_seconds_to_target"] == 4 and m["DDP"]["speedup_vs_ddp"] == 1.0
    assert m["DDP+PowerSGD"]["metric_at_budget"] == 0.5  # 0.99 came after the 5 s budget
    assert m["DDP+PowerSGD"]["speedup_vs_ddp"] == 0.5 and m["Bagua ByteGrad"]["reached"] == 2
    assert m["Bagua ByteGrad"]["speedup_vs_powersgd"] == 8.0 and m["Bagua ByteGrad"]["bytes_per_step"] == 25
    assert m["Bagua LowRank"] == {"skipped": "no LowRankAlgorithm"}


def test_bad_options_are_refused():
    for bad, says in (
        (["--methods", "Bagua ByteGrad"], "sets the target"),
        (["--links", "3 parsecs"], "kbit"),
        (["--hosts", "3"], "not divisible by 3 hosts"),
        (["--tune-trials", "2"], "cover"),
        (["--powersgd-starts", "1"], "at least 2"),
        (["--workloads", "gan"], "unknown"),
    ):
        p = _run(*bad, timeout=30)
        assert p.returncode == 2 and says in p.stderr, (bad, explain(p))


# ------------------------------------------------------------ smoke runs ---


def _check_outputs(out_dir, tracks=("sgd", "adamw")):
    doc = json.loads((out_dir / "time_to_accuracy.json").read_text())
    for t in tracks:
        assert (out_dir / f"time_to_accuracy_{t}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out_dir / "time_to_accuracy.md").read_text()
    assert not list(out_dir.glob(tta.PARTIAL_PREFIX + "*")), "a launch's partial results outlived the run"
    return doc, table


@pytest.mark.timeout(90)
def test_smoke_run_unshaped(tmp_path):
    p = _run("--smoke", "--no-shaping", "--out-dir", str(tmp_path), "--timeout", "80", timeout=85)
    assert p.returncode == 0, explain(p)
    assert "shaping skipped: --no-shaping given" in p.stdout
    doc, table = _check_outputs(tmp_path)
    run = doc["runs"]["2 hosts, loopback (unshaped)"]
    assert run["complete"] and run["world_size"] == 2 and run["bytes_counted"] is False
    assert "not counted" in run["bytes_note"] and "bytes on the wire not counted" in table
    for track, methods in tta.TRACKS.items():
        cases = run["cases"]["mlp"][track]
        summary = doc["summary"]["2 hosts, loopback (unshaped)"]["mlp"][track]
        assert summary["target"] == pytest.approx(0.99 * summary["ddp_best"])
        assert summary["methods"]["DDP"]["median_seconds_to_target"] is not None  # DDP reaches its own target
        for m in methods:
            rows = [line for line in table.splitlines() if f"| {m} |" in line]
            if "skipped" in cases[m]:  # an algorithm this checkout lacks: a notice, printed and in the JSON
                assert f"{m} skipped: " in p.stdout and "skipped" in summary["methods"][m], m
                continue
            assert "error" not in cases[m], (m, cases[m])
            assert len(cases[m]["tuning"]) == 3, m  # the equal budget: 3 trials each
            assert cases[m]["tuned"] == max(cases[m]["tuning"], key=lambda t: t["score"])["hp"], m
            assert [r["seed"] for r in cases[m]["runs"]] == [1, 2, 3], m
            for r in cases[m]["runs"]:
                assert r["bytes"] is None and r["bytes_per_step"] is None and r["steps"] == 8, (m, r)
                times = [c[0] for c in r["curve"]]
                assert times == sorted(times) and len(times) == 4, (m, r)
            assert rows and all("not counted" in row for row in rows), rows
    assert "Bagua QAdam" not in run["cases"]["mlp"]["sgd"]  # QAdam only on the AdamW track


@needs_netns
@pytest.mark.timeout(120)
def test_tiny_shaped_run_counts_the_bytes_on_the_wire(tmp_path):
    before = set(_hosts.list_netns())
    p = _run(
        "--smoke",
        "--hosts",
        "2,4",
        "--links",
        "1gbit",
        "--tracks",
        "sgd",
        "--methods",
        "DDP,Bagua ByteGrad",
        "--seeds",
        "1",
        "--out-dir",
        str(tmp_path),
        "--timeout",
        "50",
        timeout=115,
    )
    assert p.returncode == 0, explain(p)
    assert set(_hosts.list_netns()) == before  # every namespace, the switch's too, removed
    doc, table = _check_outputs(tmp_path, tracks=("sgd",))
    assert doc["shaping"] is True and set(doc["runs"]) == {"2 hosts, 1gbit", "4 hosts, 1gbit"}
    params = doc["runs"]["2 hosts, 1gbit"]["workloads"]["mlp"]["parameters"]
    for key, run in doc["runs"].items():
        n = run["world_size"]
        ddp = run["cases"]["mlp"]["sgd"]["DDP"]["runs"][0]["bytes_per_step"]
        bytegrad = run["cases"]["mlp"]["sgd"]["Bagua ByteGrad"]["runs"][0]["bytes_per_step"]
        # An allreduce of float32 gradients sends at least 2 (n - 1) / n of them from each of n hosts;
        # headers, acknowledgements, the initial broadcast (over 8 steps) and barriers add a little.
        # (ByteGrad's 8-bit gradients are not smaller here: the tiny model's messages are mostly headers.)
        assert 2 * (n - 1) * params * 4 <= ddp <= 3 * 2 * (n - 1) * params * 4, (key, ddp, params)
        assert bytegrad > 0, (key, bytegrad)
    assert "not counted" not in table
