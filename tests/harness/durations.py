"""Measured test durations, which decide the ``slow`` mark (tests/conftest.py).

``tests/durations.json`` maps node ids (relative to ``tests/``) to seconds
(setup + call + teardown) as the last recording run measured them: ``make
durations`` runs the whole suite with ``BAGUA_RECORD_DURATIONS=1``, and each
test run then replaces its entry. The tests of one session (``mp.session_tests``)
share its processes, so their cost is counted together: a session is fast or
slow as a whole.
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Dict, Optional

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "durations.json")
RECORD_ENV = "BAGUA_RECORD_DURATIONS"


def load(path: str = PATH) -> Dict[str, float]:
    try:
        with open(path) as f:
            return dict(json.load(f)["seconds"])
    except FileNotFoundError:
        return {}


def group_of(node: str, starts_processes: bool) -> str:
    """The unit whose cost counts: a module's multi-process tests together
    (sessions, module fixtures and cached launches share processes among
    them, so the cost lands on whichever test comes first), else the test."""
    return node.split("::", 1)[0] + "::<multiprocess>" if starts_processes else node


def group_seconds(nodes, seconds: Dict[str, float]) -> Dict[str, Optional[float]]:
    """Each group's measured total, from (node, starts_processes) pairs; None
    when a test of it has no measurement."""
    totals: Dict[str, Optional[float]] = {}
    for node, starts in nodes:
        group = group_of(node, starts)
        value = seconds.get(node)
        if group in totals and totals[group] is None:
            continue
        totals[group] = None if value is None else (totals.get(group) or 0.0) + value
    return totals


class Recorder:
    """A pytest plugin: sums each test's phases and merges them into the file at the end."""

    def __init__(self, node_of: Dict[str, str], path: str = PATH):
        self.node_of, self.path, self.seconds = node_of, path, {}

    def pytest_runtest_logreport(self, report):
        node = self.node_of.get(report.nodeid)
        if node is not None:
            self.seconds[node] = self.seconds.get(node, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        if not self.seconds:
            return
        merged = load(self.path)
        merged.update({k: round(v, 2) for k, v in self.seconds.items()})
        record = {
            "recorded": f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {platform.machine()}",
            "seconds": dict(sorted(merged.items())),
        }
        with open(self.path, "w") as f:
            json.dump(record, f, indent=0)
            f.write("\n")
