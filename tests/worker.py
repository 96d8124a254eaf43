"""Helpers used inside worker processes started by tests.mp.launch."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Callable, Iterable, Tuple

from tests.mp import CASE_PREFIX


def report(case: str, ok: bool, error: str = "", **extra) -> None:
    rec = {"case": case, "ok": ok, "error": error, **extra}
    sys.stdout.write(CASE_PREFIX + json.dumps(rec) + "\n")
    sys.stdout.flush()


def run_cases(cases: Iterable[Tuple[str, Callable[[], None]]]) -> int:
    """Runs each case, reporting success or the exception; returns the failure count.

    Every rank must run the same cases in the same order (they are collectives);
    a failing case on one rank may make its peers fail too, and that is reported.
    """
    failures = 0
    for name, fn in cases:
        try:
            fn()
            report(name, True)
        except Exception as e:  # noqa: BLE001 - the point is to report anything
            failures += 1
            report(name, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}")
    return failures


def threads() -> int:
    """Threads of this process."""
    return len(os.listdir("/proc/self/task"))


def wait_for_threads(expected: int, timeout_s: float = 3.0) -> None:
    """Asserts the thread count falls back to ``expected`` (a thread ends a moment after it is joined)."""
    deadline = time.monotonic() + timeout_s
    while threads() > expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threads() == expected, f"{threads()} threads, {expected} expected"
