"""Plots an autotune log (``BAGUA_IS_OUTPUT_AUTOTUNE_LOG=1``): the score of
each sampled plan over training steps, and score against bucket size.

    python -m bagua_core.autotune.plot /tmp/bagua_autotune_<model>.log -o autotune.png
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import List, Optional, Sequence


def read_log(path: str) -> List[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("train_iter", "plan_id", "bucket_size_2p", "bucket_bytes", "num_buckets"):
            r[k] = int(r[k])
        for k in ("score_gbps", "median_step_s"):
            r[k] = float(r[k])
    return rows


def plot(log: str, out: str) -> str:
    """Writes a PNG of the log to ``out``; returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_log(log)
    if not rows:
        raise ValueError(f"{log}: the autotune log has no sample yet")
    best = max(rows, key=lambda r: r["score_gbps"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([r["train_iter"] for r in rows], [r["score_gbps"] for r in rows], "o-")
    a.set_xlabel("training step")
    a.set_ylabel("score (GB/s of gradients)")
    a.set_title("samples in order")
    b.scatter([r["bucket_size_2p"] for r in rows], [r["score_gbps"] for r in rows])
    b.scatter(
        [best["bucket_size_2p"]],
        [best["score_gbps"]],
        color="red",
        label=f"best: 2^{best['bucket_size_2p']} B, {best['num_buckets']} bucket(s)",
    )
    b.set_xlabel("bucket size (log2 bytes)")
    b.set_ylabel("score (GB/s)")
    b.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("-o", "--output", default="autotune.png")
    args = p.parse_args(argv)
    print(plot(args.log, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
