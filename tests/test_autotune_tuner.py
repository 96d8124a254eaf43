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
    # the best and the default were measured again, and the best, still faster, is kept
    assert sorted(c.bucket_bytes for c in t.confirmations) == sorted([10 * MiB, best.bucket_bytes])
    assert _partition(t.current_bytes) == _partition(best.bucket_bytes) == _partition(t.chosen.bucket_bytes)
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


def test_load_drift_during_the_search_keeps_the_default():
    """The default is measured while the machine is busy, later plans while it
    is idle: measured again side by side, the default is as fast, and stays."""
    t = Tuner(10 * MiB, 8 * MiB, max_samples=2, warmup_s=0, confidence_s=0, partition=_partition)
    t.started(0.0)
    _feed(t, 0.3)  # default plan, busy machine
    first = t.decide(1.0, 10)
    assert first is not None
    _feed(t, 0.1)  # the asked plan, idle machine
    # search over: the best (the current plan) is measured again, with no switch...
    assert t.decide(2.0, 20) is None and not t.completed
    _feed(t, 0.1)
    assert t.decide(3.0, 30) == 10 * MiB  # ...then the default
    _feed(t, 0.09)
    assert t.decide(4.0, 40) is None  # the default is faster now: it stays
    assert t.completed and t.chosen.bucket_bytes == t.current_bytes == 10 * MiB
    assert [c.bucket_bytes for c in t.confirmations] == [first, 10 * MiB]


def test_settings_parse():
    env = {"BAGUA_AUTOTUNE": "1", "BAGUA_AUTOTUNE_MAX_SAMPLES": "7", "BAGUA_AUTOTUNE_SAMPLING_CONFIDENCE_TIME_S": "0.5",
           "BAGUA_AUTOTUNE_WARMUP_TIME_S": "0", "BAGUA_IS_OUTPUT_AUTOTUNE_LOG": "0",
           "BAGUA_AUTOTUNE_INTERVAL_STEPS": "20", "BAGUA_TRACE": "/tmp/x.json"}
    s = config.load(env)
    assert (s.autotune_level, s.autotune_max_samples, s.autotune_sampling_confidence_time_s,
            s.autotune_warmup_time_s, s.autotune_log, s.autotune_interval_steps, s.trace_path) == \
        (1, 7, 0.5, 0.0, False, 20, "/tmp/x.json")
    d = config.load({})
    assert (d.autotune_level, d.autotune_max_samples, d.autotune_sampling_confidence_time_s,
            d.autotune_warmup_time_s, d.autotune_log, d.autotune_interval_steps, d.trace_path) == \
        (0, 60, 5.0, 30.0, False, 100, None)
    for name, bad in (("BAGUA_AUTOTUNE_WARMUP_TIME_S", "-1"), ("BAGUA_AUTOTUNE_MAX_SAMPLES", "0"),
                      ("BAGUA_IS_OUTPUT_AUTOTUNE_LOG", "maybe"), ("BAGUA_AUTOTUNE", "x"),
                      ("BAGUA_AUTOTUNE_INTERVAL_STEPS", "0")):
        with pytest.raises(config.ConfigError, match=name):
            config.load({name: bad})


def test_rank_path():
    from bagua_core.trace import rank_path

    assert rank_path("run/trace.json", 3) == "run/trace.rank3.json"
    assert rank_path("trace", 0) == "trace.rank0.json"
