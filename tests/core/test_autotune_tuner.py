"""The autotuner's bookkeeping on one process: timing rules, sample budget,
the best plan kept, the log, and the settings that drive it."""

from __future__ import annotations

import pytest

from bagua_core import config

optuna = pytest.importorskip("optuna")

from bagua_core.autotune.tuner import Tuner  # noqa: E402

MiB = 2**20


def _partition(size):
    # 8 tensors of 1 MiB: buckets of `size` bytes
    per = max(1, min(8, size // MiB))
    return tuple(tuple(range(i, min(8, i + per))) for i in range(0, 8, per))


def _feed(tuner, step_s, steps=3):
    for _ in range(steps):
        tuner.observe_step(step_s)


def test_warmup_then_confidence_then_samples(tmp_path):
    log = tmp_path / "at.log"
    t = Tuner(10 * MiB, 8 * MiB, max_samples=3, warmup_s=10, confidence_s=2, partition=_partition, log_path=str(log))
    t.started(0.0)
    _feed(t, 0.1)
    assert t.decide(5.0, 10) is None and not t.samples  # warming up
    assert t.decide(10.0, 20) is None  # warm: measuring starts now
    _feed(t, 0.1)
    assert t.decide(11.0, 30) is None  # less than the confidence time
    _feed(t, 0.1)
    size = t.decide(12.5, 40)
    assert size is not None and len(t.samples) == 1 and t.samples[0].bucket_bytes == 10 * MiB
    assert t.samples[0].score_gbps == pytest.approx(8 * MiB / 0.1 / 1e9)
    sizes = [size]
    now, it = 12.5, 40
    while not t.completed:
        now += 3
        it += 10
        _feed(t, 0.05 if t.current_bytes == sizes[0] else 0.2)
        got = t.decide(now, it)
        if got is not None:
            sizes.append(got)
        assert it < 400, "the tuner never completed"
    assert t.measured == 3 and len(sizes) >= 3
    best = t.best()
    assert best.score_gbps == max(s.score_gbps for s in t.samples)
    # the best and the default were measured again, 5 times each, alternately; the best, clearly faster, is kept
    labels = [label for label, _ in t.confirmations]
    assert len(labels) == 10 and labels.count("default") == labels.count("candidate") == 5
    assert all(a != b for a, b in zip(labels[0::2], labels[1::2]))  # every pair holds one of each
    assert {c.bucket_bytes for label, c in t.confirmations if label == "candidate"} == {best.bucket_bytes}
    assert {c.bucket_bytes for label, c in t.confirmations if label == "default"} == {10 * MiB}
    assert _partition(t.current_bytes) == _partition(best.bucket_bytes) == _partition(t.chosen.bucket_bytes)
    assert t.verdict.switched and t.verdict.pairs == 5 and t.verdict.speedup == pytest.approx(4.0)
    rows = log.read_text().splitlines()
    assert rows[0].split(",") == list(Tuner.LOG_FIELDS) and len(rows) == 1 + len(t.samples) + len(t.confirmations)
    assert t.decide(now + 100, it + 10) is None  # completed: no more decisions


def test_same_buckets_are_not_measured_twice():
    t = Tuner(10 * MiB, 8 * MiB, max_samples=12, warmup_s=0, confidence_s=0, partition=_partition)
    t.started(0.0)
    measured = 1
    now = 0.0
    while not t.completed:
        _feed(t, 0.1)
        now += 1
        if t.decide(now, int(now)) is not None:
            measured += 1
    # 8 tensors of 1 MiB make 4 different plans (1, 2, 4 or 8 tensors per bucket; the sizes < 1 MiB
    # all make 8 buckets): at most 4 measured plans, plus the final switch; repeats cost no budget
    assert t.measured <= 4 and measured <= 4 + 3, (t.measured, measured)  # + confirmation and final switches
    assert len(t.samples) > t.measured


def _search_then_confirm(step_s, confirm_pairs=5, max_samples=2):
    """Runs a tuner whose search nominates the first asked plan; ``step_s(label,
    window)`` gives the step time of the confirmation windows. Returns the tuner."""
    t = Tuner(
        10 * MiB,
        8 * MiB,
        max_samples=max_samples,
        warmup_s=0,
        confidence_s=0,
        partition=_partition,
        confirm_pairs=confirm_pairs,
    )
    t.started(0.0)
    _feed(t, 0.3)  # default plan, busy machine
    first = t.decide(1.0, 10)
    assert first is not None and not t.current_is_default
    _feed(t, 0.1)  # the asked plan, idle machine: the search's best by far
    now, it = 1.0, 10
    switches = []
    while not t.completed:
        now += 1
        it += 10
        got = t.decide(now, it)
        if got is not None:
            switches.append((got, t.current_is_default))
        if t.completed:
            break
        label = "default" if t.current_is_default else "candidate"
        _feed(t, step_s(label, len(t.confirmations)))
        assert it < 1000, "the tuner never completed"
    return t, first, switches


def test_load_drift_during_the_search_keeps_the_default():
    """The default is measured while the machine is busy, the candidate while it
    is idle: measured again in pairs, the default is as fast, and stays."""
    t, first, switches = _search_then_confirm(lambda label, k: 0.09 if label == "default" else 0.1)
    assert t.completed and not t.verdict.switched and t.verdict.speedup < 1
    assert t.current_is_default and t.current_bytes == 10 * MiB and t.chosen.bucket_bytes == 10 * MiB
    # the candidate runs first (no switch), then ABBA: c d | d c | c d | d c | c d, then back to the default
    assert [label for label, _ in t.confirmations] == ["candidate", "default", "default", "candidate"] * 2 + [
        "candidate",
        "default",
    ]
    assert [d for _, d in switches] == [True, False, True, False, True]
    assert t.decide(1e6, 10**6) is None


def test_a_gain_within_the_noise_keeps_the_default():
    """The candidate is 2% faster on average, but the pairs scatter by +-10%:
    the gain does not exceed the noise, so the default stays."""
    noise = [1.1, 0.9, 1.08, 0.93, 1.05, 0.95, 0.9, 1.1, 1.0, 1.0]

    def step_s(label, k):
        return (0.1 if label == "default" else 0.098) * noise[k]

    t, _, _ = _search_then_confirm(step_s)
    v = t.verdict
    assert not v.switched and v.low <= 1.0 < v.high and "not shown faster" in v.reason
    assert t.current_is_default and t.chosen.bucket_bytes == 10 * MiB


def test_a_gain_above_the_noise_switches():
    """The candidate is 20% faster, with the same +-10% scatter between the
    pairs: its gain exceeds the noise, so it replaces the default."""
    noise = [1.1, 1.1, 0.9, 0.9, 1.05, 1.05, 0.95, 0.95, 1.0, 1.0]  # both plans of a pair see the same load

    def step_s(label, k):
        return (0.1 if label == "default" else 0.1 / 1.2) * noise[k] * (1.0 + 0.02 * (k % 3))

    t, first, _ = _search_then_confirm(step_s)
    v = t.verdict
    assert v.switched and v.low > 1.0 and v.speedup == pytest.approx(1.2, rel=0.05) and "beyond the noise" in v.reason
    assert not t.current_is_default and t.current_bytes == first == v.candidate_bytes


def test_no_candidate_no_confirmation():
    """The search finds nothing faster than the default: no pairs, no switch back needed."""
    t = Tuner(10 * MiB, 8 * MiB, max_samples=2, warmup_s=0, confidence_s=0, partition=_partition)
    t.started(0.0)
    _feed(t, 0.1)
    assert t.decide(1.0, 10) is not None
    _feed(t, 0.2)
    assert t.decide(2.0, 20) == 10 * MiB and t.completed and t.current_is_default
    assert t.verdict.pairs == 0 and not t.verdict.switched and not t.confirmations


def test_confidence_bound_table():
    from bagua_core.autotune.tuner import one_sided_t95

    assert one_sided_t95(1) == pytest.approx(6.314) and one_sided_t95(4) == pytest.approx(2.132)
    assert one_sided_t95(11) == pytest.approx(1.812) and one_sided_t95(1000) == pytest.approx(1.658)
    with pytest.raises(ValueError):
        one_sided_t95(0)
    with pytest.raises(ValueError, match="confirm_pairs"):
        Tuner(10 * MiB, 8 * MiB, 2, 0, 0, _partition, confirm_pairs=1)


def test_settings_parse():
    env = {
        "BAGUA_AUTOTUNE": "1",
        "BAGUA_AUTOTUNE_MAX_SAMPLES": "7",
        "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S": "0.5",
        "BAGUA_AUTOTUNE_WARMUP_TIME_S": "0",
        "BAGUA_IS_OUTPUT_AUTOTUNE_LOG": "0",
        "BAGUA_AUTOTUNE_INTERVAL_STEPS": "20",
        "BAGUA_TRACE": "/tmp/x.json",
        "BAGUA_AUTOTUNE_CONFIRM_PAIRS": "3",
    }
    s = config.load(env)
    assert (
        s.autotune_level,
        s.autotune_max_samples,
        s.autotune_sampling_confidence_time_s,
        s.autotune_warmup_time_s,
        s.autotune_log,
        s.autotune_interval_steps,
        s.trace_path,
        s.autotune_confirm_pairs,
    ) == (1, 7, 0.5, 0.0, False, 20, "/tmp/x.json", 3)
    d = config.load({})
    assert (
        d.autotune_level,
        d.autotune_max_samples,
        d.autotune_sampling_confidence_time_s,
        d.autotune_warmup_time_s,
        d.autotune_log,
        d.autotune_interval_steps,
        d.trace_path,
        d.autotune_confirm_pairs,
    ) == (0, 60, 5.0, 30.0, False, 100, None, 5)
    for name, bad in (
        ("BAGUA_AUTOTUNE_WARMUP_TIME_S", "-1"),
        ("BAGUA_AUTOTUNE_MAX_SAMPLES", "0"),
        ("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", "maybe"),
        ("BAGUA_AUTOTUNE", "x"),
        ("BAGUA_AUTOTUNE_INTERVAL_STEPS", "0"),
        ("BAGUA_AUTOTUNE_CONFIRM_PAIRS", "1"),
    ):
        with pytest.raises(config.ConfigError, match=name):
            config.load({name: bad})


def test_rank_path():
    from bagua_core.trace import rank_path

    assert rank_path("run/trace.json", 3) == "run/trace.rank3.json"
    assert rank_path("trace", 0) == "trace.rank0.json"
