"""Helpers used inside worker processes started by tests.mp.launch."""

from __future__ import annotations

import json
import sys
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
