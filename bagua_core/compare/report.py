"""What ``bagua-compare`` prints and writes: losses side by side, the largest
divergence, time per step; ``compare.json`` and ``compare.png``."""

from __future__ import annotations

import json
import os
from typing import Dict, List

# steps left out of the time per step: the first ones compile (JAX) and warm caches
WARMUP_STEPS = 3


def median(values: List[float]) -> float:
    v = sorted(values)
    n = len(v)
    return (v[n // 2] + v[(n - 1) // 2]) / 2 if n else float("nan")


def summarise(torch_run: dict, jax_run: dict) -> dict:
    """One algorithm's comparison: divergence of the loss curves and step times."""
    lt, lj = torch_run["losses"], jax_run["losses"]
    diffs = [abs(a - b) for a, b in zip(lt, lj)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    rel = diffs[worst] / max(abs(lt[worst]), 1e-12)
    tt = median(torch_run["step_times_s"][WARMUP_STEPS:])
    tj = median(jax_run["step_times_s"][WARMUP_STEPS:])
    return {
        "max_abs_divergence": diffs[worst],
        "max_rel_divergence": rel,
        "at_step": worst,
        "torch_step_ms": tt * 1e3,
        "jax_step_ms": tj * 1e3,
        "jax_over_torch_time": tj / tt,
    }


def print_report(results: Dict[str, dict], every: int, problem) -> None:
    for name, r in results.items():
        t, j, s = r["torch"], r["jax"], r["summary"]
        print(f"\n== {name} ({t['world_size']} processes, {problem.dtype}) ==")
        print(f"{'step':>6}{'torch loss':>14}{'jax loss':>14}{'|diff|':>12}")
        for i in range(0, len(t["losses"]), every):
            a, b = t["losses"][i], j["losses"][i]
            print(f"{i:>6}{a:>14.6f}{b:>14.6f}{abs(a - b):>12.2e}")
        print(
            f"largest divergence {s['max_abs_divergence']:.3e} (relative {s['max_rel_divergence']:.2e}) "
            f"at step {s['at_step']}"
        )
        if name == "async" and problem.async_average_every == 0:
            print(
                "(asynchronous model average averages at wall-clock times: after its warm-up the curves differ "
                "from run to run, in either framework)"
            )
        elif name == "async":
            print(
                f"(asynchronous model average: averaged by abort() + resume() every "
                f"{problem.async_average_every} steps after the warm-up, its timer off)"
            )
        print(
            f"time per step (median): torch {s['torch_step_ms']:.2f} ms, jax {s['jax_step_ms']:.2f} ms "
            f"(jax/torch {s['jax_over_torch_time']:.2f})"
        )


def write(results: Dict[str, dict], out_dir: str) -> List[str]:
    """Writes compare.json and compare.png to ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "compare.json")
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    png_path = os.path.join(out_dir, "compare.png")
    plot(results, png_path)
    return [json_path, png_path]


def plot(results: Dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 6.4), squeeze=False)
    for col, name in enumerate(names):
        r = results[name]
        ax = axes[0][col]
        ax.plot(r["torch"]["losses"], label="torch", lw=2)
        ax.plot(r["jax"]["losses"], label="jax", lw=1, ls="--")
        ax.set_title(f"{name}\nmax |diff| {r['summary']['max_abs_divergence']:.1e}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (mean over ranks)")
        ax.legend()
        ax = axes[1][col]
        ax.plot([t * 1e3 for t in r["torch"]["step_times_s"]], label="torch", lw=1)
        ax.plot([t * 1e3 for t in r["jax"]["step_times_s"]], label="jax", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("step time (ms)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
