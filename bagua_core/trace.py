"""A Chrome trace (JSON, opens in Perfetto or chrome://tracing) of the engine's
per-bucket timings, with the framework's own phases on the same timeline.

``BAGUA_TRACE=path.json``: every rank writes its own file,
``path.rank<r>.json`` (:func:`rank_path`), appending as training runs and
closing the JSON array when the process exits (or :func:`close`). A file cut
short by a crash still opens in Perfetto (the trace format allows a missing
``]``). ``python -m bagua_core.trace merge out.json path.rank*.json`` joins
the ranks into one file (each rank is its own process row, ``pid`` = rank).

Per wrapped model, step and bucket the engine records (``Engine.timings()``,
monotonic clock, ns) when the bucket's last tensor became **ready**, when it
**launched** (ready and every earlier bucket launched), when the comm thread
**started** its ops and when they **ended**. Rows of a rank:

* ``<model> comm thread``: one slice per bucket, start -> end;
* ``<model> bucket <i>``: "waits for earlier buckets" (ready -> launch) and
  "queued" (launch -> start);
* ``<model> framework``: spans the frontend adds (torch: forward start ->
  backward end, and backward from its first gradient to its end).

Every slice carries ``args`` with the model, step, bucket and the four raw
times. Ranks on one host share the clock; across hosts the clocks are not
aligned. Off (``BAGUA_TRACE`` unset) nothing here is created and the engine
reads no clock for readiness.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from bagua_core import config

_FLUSH_EVENTS = 2000


def rank_path(path: str, rank: int) -> str:
    """``run/trace.json`` -> ``run/trace.rank3.json`` (suffix kept; none -> ``.json``)."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.json'}"


class TraceWriter:
    """Appends trace events of one process (``pid`` = its rank) to one file."""

    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = int(rank)
        self._lock = threading.Lock()
        self._pending: List[str] = []
        self._tids: Dict[Tuple[str, str], int] = {}
        self._first = True
        self._closed = False
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._file = open(path, "w", encoding="utf-8")
        self._file.write("[\n")
        self._emit({"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}})
        self._emit({"name": "process_sort_index", "ph": "M", "pid": self.rank, "args": {"sort_index": self.rank}})

    def _emit(self, event: dict) -> None:
        self._pending.append(json.dumps(event, separators=(",", ":")))

    def _tid(self, model: str, lane: str) -> int:
        key = (model, lane)
        tid = self._tids.get(key)
        if tid is None:
            tid = self._tids[key] = len(self._tids) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                        "args": {"name": f"{model} {lane}"}})
            self._emit({"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid,
                        "args": {"sort_index": tid}})
        return tid

    def _slice(self, model: str, lane: str, name: str, start_ns: int, end_ns: int, args: dict) -> None:
        self._emit({"name": name, "cat": "bagua", "ph": "X", "pid": self.rank, "tid": self._tid(model, lane),
                    "ts": start_ns / 1000.0, "dur": max(0, end_ns - start_ns) / 1000.0, "args": args})

    def engine_step(self, model: str, step: int, bucket_names: Sequence[str], timings: Sequence[tuple]) -> None:
        """One engine step: ``timings[i]`` = (ready, launch, start, end) ns of bucket i."""
        with self._lock:
            if self._closed:
                return
            for i, (name, (ready, launch, start, end)) in enumerate(zip(bucket_names, timings)):
                args = {"model": model, "step": int(step), "bucket": i, "bucket_name": name, "ready_ns": ready,
                        "launch_ns": launch, "start_ns": start, "end_ns": end}
                lane = f"bucket {i}"
                if 0 <= ready <= launch:
                    self._slice(model, lane, "waits for earlier buckets", ready, launch, args)
                if 0 <= launch <= start:
                    self._slice(model, lane, "queued", launch, start, args)
                if 0 <= start <= end:
                    self._slice(model, "comm thread", f"bucket {i}", start, end, args)
            self._maybe_flush()

    def span(self, model: str, name: str, start_ns: int, end_ns: int, **args) -> None:
        """A framework phase on the model's ``framework`` row."""
        with self._lock:
            if self._closed or start_ns < 0 or end_ns < start_ns:
                return
            self._slice(model, "framework", name, start_ns, end_ns, {"model": model, **args})
            self._maybe_flush()

    def _maybe_flush(self) -> None:
        if len(self._pending) >= _FLUSH_EVENTS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        text = ",\n".join(self._pending)
        self._file.write(text if self._first else ",\n" + text)
        self._first = False
        self._pending.clear()
        self._file.flush()

    def close(self) -> None:
        """Writes what is pending and closes the JSON array. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._flush()
            self._file.write("\n]\n")
            self._file.close()


_writer: Optional[TraceWriter] = None
_writer_lock = threading.Lock()


def writer(settings: Optional[config.Settings] = None) -> Optional[TraceWriter]:
    """This process's writer for ``BAGUA_TRACE`` (created on first use and
    closed at exit), or None when tracing is off."""
    global _writer
    s = settings or config.load()
    if not s.trace_path:
        return None
    with _writer_lock:
        if _writer is None or _writer._closed:
            _writer = TraceWriter(rank_path(s.trace_path, s.rank), s.rank)
            atexit.register(_writer.close)
        return _writer


def close() -> None:
    """Closes this process's trace file (also done at exit)."""
    with _writer_lock:
        if _writer is not None:
            _writer.close()


def load(path: str) -> list:
    """The events of a trace file, also one cut short by a crash."""
    with open(path, encoding="utf-8") as f:
        text = f.read().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


def merge(out: str, inputs: Sequence[str]) -> int:
    """Joins per-rank trace files into one; returns the number of events."""
    events = []
    for p in inputs:
        events.extend(load(p))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(events, f)
    return len(events)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "merge":
        print("usage: python -m bagua_core.trace merge OUT.json RANK_TRACE.json...", file=sys.stderr)
        return 2
    n = merge(argv[1], argv[2:])
    print(f"{argv[1]}: {n} events from {len(argv) - 2} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
