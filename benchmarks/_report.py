"""What the benchmark drivers write besides their measurements: the machine's load, and the JSON,
markdown table and plots of a run (the table also printed)."""

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


def write_outputs(doc, out_dir, stem, table, plots):
    """``stem``.json (``doc``), ``stem``.md (``table``, also printed) and each plot of ``plots``
    ({file name: function(doc, path)}) in ``out_dir``."""
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(table + "\n")
    for name, plot in plots.items():
        plot(doc, os.path.join(out_dir, name))
    print()
    print(table)
    print(f"\nwritten: {os.path.join(out_dir, stem)}.json, .md; " + ", ".join(plots), flush=True)
