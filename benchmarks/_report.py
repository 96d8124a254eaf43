"""What the benchmark drivers write besides their measurements: the machine's load, name and
commit, and the JSON, markdown table and plots of a run (the table also printed)."""

from __future__ import annotations

import json
import os
import subprocess


def uptime() -> str:
    """``uptime``'s line (the load averages), to record how busy the machine was."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "load average: %.2f, %.2f, %.2f" % os.getloadavg()


def machine() -> str:
    """The host's name, CPU model and count, and kernel, to record where a result was measured."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()}: {os.cpu_count()} x {cpu}, {platform.system()} {platform.release()}"


def commit() -> str:
    """The checkout's commit (with "+changes" when files differ from it), or "unknown"."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def write_outputs(doc, out_dir, stem, table, plots):
    """``stem``.json (``doc``, with the ``machine`` and ``commit`` it ran on added), ``stem``.md
    (``table``, also printed) and each plot of ``plots`` ({file name: function(doc, path)}) in
    ``out_dir``."""
    doc.setdefault("machine", machine())
    doc.setdefault("commit", commit())
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(table + "\n")
    for name, plot in plots.items():
        plot(doc, os.path.join(out_dir, name))
    print()
    print(table)
    print(f"\nwritten: {os.path.join(out_dir, stem)}.json, .md; " + ", ".join(plots), flush=True)
