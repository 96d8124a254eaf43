"""bagua_core.state_relayout against the engine's own bucket plan
(bagua_core.engine.plan_buckets, C++): the saved buckets it recovers from
padded sizes alone are the plan's whenever only one split gives those sizes,
an ambiguous or impossible saved layout is an error, and the moves carry
every tensor's numbers (numpy, per span) to its place under another bucket
size. The transforms' use of it, across real processes:
tests/core/test_local_steps_compression.py."""

from __future__ import annotations

import numpy as np
import pytest

from bagua_core.engine import plan_buckets
from bagua_core.state_relayout import moves, saved_buckets


def padded_plan(decls, bucket_bytes, alignment):
    plan = plan_buckets(decls, bucket_bytes)
    numel = {k: n for k, n, _ in decls}
    dtype = {k: d for k, _, d in decls}
    sizes = [(dtype[b[0]], -(-sum(numel[k] for k in b) // alignment) * alignment) for b in plan]
    return plan, sizes


def random_decls(rng, count):
    return [(f"t{i}", int(rng.integers(1, 40)), "float32" if rng.random() < 0.8 else "float16") for i in range(count)]


def test_recovers_the_plan_from_padded_sizes():
    rng = np.random.default_rng(7)
    recovered = ambiguous = 0
    for _ in range(400):
        decls = random_decls(rng, int(rng.integers(1, 12)))
        alignment = int(rng.integers(1, 5))
        plan, sizes = padded_plan(decls, int(rng.integers(4, 200)), alignment)
        try:
            got = saved_buckets(decls, sizes, alignment)
        except ValueError as e:
            assert "more than one split" in str(e), e
            ambiguous += 1
            continue
        assert got == plan, (decls, sizes)
        recovered += 1
    assert recovered > 300 and ambiguous > 0, (recovered, ambiguous)


def test_moves_carry_each_tensor_to_its_new_bucket():
    rng = np.random.default_rng(11)
    decls = random_decls(rng, 9)
    numel = {k: n for k, n, _ in decls}
    values = {k: rng.standard_normal(n) for k, n, _ in decls}
    spans, alignment = 3, 4

    def blocks(plan, sizes):  # each bucket: spans x (its tensors, then zero padding); span s scaled by s + 1
        out = []
        for keys, (_, padded) in zip(plan, sizes):
            flat = np.concatenate([values[k] for k in keys])
            row = np.concatenate([flat, np.zeros(padded - flat.size)])
            out.append(np.concatenate([(s + 1) * row for s in range(spans)]))
        return out

    old_plan, old_sizes = padded_plan(decls, 64, alignment)
    new_plan, new_sizes = padded_plan(decls, 24, alignment)
    assert len(new_plan) > len(old_plan)
    saved = blocks(old_plan, old_sizes)
    want = blocks(new_plan, new_sizes)
    for bucket_moves, (_, padded), expected in zip(moves(old_plan, new_plan, numel), new_sizes, want):
        got = np.zeros(spans * padded)
        for s in range(spans):
            for m in bucket_moves:
                start = s * old_sizes[m.source][1] + m.source_offset
                got[s * padded + m.target_offset : s * padded + m.target_offset + m.count] = saved[m.source][
                    start : start + m.count
                ]
        np.testing.assert_array_equal(got, expected)


def test_a_layout_no_plan_gives_is_refused():
    decls = [("a", 5, "float32"), ("b", 7, "float32")]
    with pytest.raises(ValueError, match=r"no split of the float32 tensors .* sizes \[8, 4\]"):
        saved_buckets(decls, [("float32", 8), ("float32", 4)], 4)
    with pytest.raises(ValueError, match="more than one split"):  # b fits a's padding or its own bucket
        saved_buckets([("a", 6, "float32"), ("b", 1, "float32"), ("c", 6, "float32")], [("float32", 8)] * 2, 8)
    with pytest.raises(ValueError, match=r"dtypes \['float16'\], these tensors of \['float32'\]"):
        saved_buckets(decls, [("float16", 12)], 4)
