"""``bagua.torch_api.utils`` (Bagua 0.9.2's helpers), single process: against
numpy and against the original's own test values for StatisticalAverage.
apply_flattened_call with torch.distributed.all_reduce runs across processes
in tests/compat/test_bagua_compat.py."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from bagua.torch_api import utils


def test_flatten_round_trip_and_contiguity():
    ts = [torch.arange(6.0).reshape(2, 3), torch.ones(4), torch.zeros(1, 1)]
    flat = utils.flatten(ts)
    assert flat.shape == (11,) and utils.check_contiguous(list(utils.unflatten(flat, ts)))
    assert all(torch.equal(a, b) for a, b in zip(utils.unflatten(flat, ts), ts))
    assert torch.equal(utils.get_flattened_tensor(ts), flat) and utils.get_flattened_tensor([]) is None
    buf = torch.zeros(8)
    assert utils.check_contiguous([buf[0:3], buf[3:5]]) and not utils.check_contiguous([buf[0:3], buf[4:6]])
    assert utils.check_contiguous([]) and utils.check_contiguous(ts[:1])


def test_apply_flattened_call_per_type():
    a, b, c = torch.ones(3), torch.full((2,), 2.0), torch.ones(2, dtype=torch.float64)
    seen = []

    def call(flat):
        seen.append((flat.dtype, flat.numel()))
        flat.mul_(3)

    utils.apply_flattened_call_all([a, c, b], call)
    assert seen == [(torch.float32, 5), (torch.float64, 2)]
    assert torch.equal(a, torch.full((3,), 3.0)) and torch.equal(b, torch.full((2,), 6.0))
    assert torch.equal(c, torch.full((2,), 3.0, dtype=torch.float64))
    utils.apply_flattened_call([a], lambda flat, k: flat.add_(k), extra_args=[1.0])
    assert torch.equal(a, torch.full((3,), 4.0))


def test_to_bagua_datatype():
    assert [utils.to_bagua_datatype(t) for t in (torch.float32, torch.float16, torch.uint8, torch.long)] == [
        "f32",
        "f16",
        "u8",
        "i64",
    ]
    with pytest.raises(ValueError, match="unsupported data type"):
        utils.to_bagua_datatype(torch.bool)


def test_average_by_removing_extreme_values_against_numpy():
    scores = [100.0, 90.0] + [10.0, 11.0, 9.0, 10.5, 50.0, 10.2, 9.8]
    mean, std, kept = utils.average_by_removing_extreme_values(scores)
    x = np.asarray(scores)[3:]  # the first third is warm-up
    x = x[abs(x - x.mean()) < x.std()]  # the outlier 50 goes
    assert kept == x.tolist() and 50.0 not in kept
    assert mean == pytest.approx(x.mean()) and std == pytest.approx(x.std())


def test_statistical_average_the_original_values():
    """The original's tests/torch_api/test_utils.py, same numbers and tolerance."""
    m = utils.StatisticalAverage(
        last_update_time=time.time(),
        records=[5.0, 4.5005175, 3.5034241850204078],
        record_tail=(2.0166309999999985, 2.499061185570463),
    )
    time.sleep(1)
    m.record(6.0)
    for n, want in [
        (1.0, 6.0),
        (2.0, (6.0 + 5.0) / 2.0),
        (3.0, (6.0 + 4.5005175 * 2.0) / 3.0),
        (5.0, (6.0 + 3.5034241850204078 * 4.0) / 5.0),
        (7.0, (6.0 + 2.499061185570463 * (4.0 + 2.0166309999999985)) / 7.0),
    ]:
        assert np.isclose(m.get_records_mean(n), want, atol=0.1), (n, m.get_records_mean(n), want, str(m))
    assert np.isclose(m.total_recording_time(), 4.0 + 2.0166309999999985 + 1, atol=0.1)


def test_statistical_average_instances_do_not_share_state():
    a, b = utils.StatisticalAverage(), utils.StatisticalAverage()
    a.record(3.0)
    assert b.records == [] and b.record_tail == (0.0, 0.0)
    assert a.get(1e9) == pytest.approx(3.0)  # the last value only: the history started with it
