"""Draws a few training steps of stored Bagua traces (``BAGUA_TRACE`` files,
Chrome trace JSON) as a timeline: one row per rank and trace row (comm
lanes, per-bucket waits, the driver's forward/backward spans), the slices
as Perfetto shows them. The documentation's picture of a trace, made when it
is built from the files under ``benchmarks/results``."""

from __future__ import annotations

import json
from typing import Optional, Sequence


def load_rows(paths: Sequence[str], steps: range) -> dict:
    """{(rank label, row name): [(start us, duration us, slice name)]} of
    the slices of ``steps``."""
    rows: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
        thread = {
            (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
        }
        for e in events:
            if e.get("ph") == "X" and e.get("args", {}).get("step") in steps:
                key = (process.get(e["pid"], str(e["pid"])), thread.get((e["pid"], e["tid"]), str(e["tid"])))
                rows.setdefault(key, []).append((e["ts"], e["dur"], e["name"]))
    return rows


def tightest_steps(paths: Sequence[str], count: int = 3) -> range:
    """The ``count`` consecutive steps that took the least wall-clock time
    together (a benchmark interleaves other work between a model's steps)."""
    spans: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for e in json.load(f):
                step = e.get("args", {}).get("step") if e.get("ph") == "X" else None
                if step is not None:
                    lo, hi = spans.get(step, (e["ts"], e["ts"] + e["dur"]))
                    spans[step] = (min(lo, e["ts"]), max(hi, e["ts"] + e["dur"]))
    candidates = [s for s in sorted(spans) if all(s + i in spans for i in range(count))]
    if not candidates:
        raise ValueError(f"no {count} consecutive traced steps in {list(paths)}")
    best = min(candidates, key=lambda s: spans[s + count - 1][1] - spans[s][0])
    return range(best, best + count)


def draw(paths: Sequence[str], out: str, steps: Optional[range] = None) -> str:
    """Writes the timeline of ``steps`` (default: the tightest three) to the
    PNG ``out``; returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = steps or tightest_steps(paths)
    rows = load_rows(paths, steps)
    if not rows:
        raise ValueError(f"no traced slices of steps {steps.start}..{steps.stop - 1} in {list(paths)}")
    t0 = min(s for slices in rows.values() for s, _, _ in slices)
    names = sorted({n for slices in rows.values() for _, _, n in slices})
    colours = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    keys = sorted(rows)
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(keys) + 1.6))
    for y, key in enumerate(keys):
        for start, dur, name in rows[key]:
            ax.broken_barh(
                [((start - t0) / 1000, max(dur, 1) / 1000)],
                (y - 0.35, 0.7),
                color=colours[name],
                edgecolor="black",
                linewidth=0.3,
            )
    ax.set_yticks(range(len(keys)), [f"{rank}: {row}" for rank, row in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(f"BAGUA_TRACE: steps {steps.start}-{steps.stop - 1}, every rank on one clock", fontsize=10)
    handles = [matplotlib.patches.Patch(color=colours[n], label=n) for n in names]
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
