"""A Chrome trace (JSON, opens in Perfetto or chrome://tracing) of the engine's
per-bucket timings, with the framework's own phases on the same timeline.

``BAGUA_TRACE=path.json``: every rank writes its own file,
``path.rank<r>.json`` (:func:`rank_path`), appending as training runs and
closing the JSON array when the process exits (or :func:`close`). A file cut
short by a crash still opens in Perfetto (the trace format allows a missing
``]``). ``python -m bagua_core.trace merge out.json path.rank*.json`` joins
the ranks into one file (each rank is its own process row, ``pid`` = rank);
``python -m bagua_core.trace summary path.rank*.json`` prints, per rank and
model, the median per step of the communication time and of the share of it
that ran before backward ended (the overlap the engine buys).

Per wrapped model, step and bucket the engine records (``Engine.timings()``,
monotonic clock, ns) when the bucket's last tensor became **ready**, when it
**launched** (ready and every earlier bucket launched), when its lane's comm thread
**started** its ops and when they **ended**. Rows of a rank:

* ``<model> comm thread`` (``<model> comm lane <l>`` for an engine with
  several lanes, bucket i on lane i % lanes): one slice per bucket, start -> end;
* ``<model> bucket <i>``: "waits for earlier buckets" (ready -> launch) and
  "queued" (launch -> start);
* ``<model> framework``: spans the frontend adds (torch: forward start ->
  backward end, and backward from its first gradient to its end).

Every slice carries ``args`` with the model, step, bucket and the four raw
times. Ranks on one host share the clock; across hosts the clocks are not
aligned. Off (``BAGUA_TRACE`` unset) nothing here is created and the engine
reads no clock for readiness.

JAX (``bagua_jax.transform``, whose buckets run as ``bagua_step`` calls inside
the jitted program): the same rows and files, the model being the transform's
``name`` and the step its ``BaguaState.step``; :func:`follow_ffi_steps` moves
the calls' times into the trace from a background thread. There, **ready** is
when XLA called the step (its leaves computed *and* the previous bucket's step
completed: the steps are chained), **launch** when it was queued on the step
thread, **start**/**end** the step thread's work (gather, communicate,
scatter). What the JAX trace lacks: no ``framework`` row (XLA runs forward
and backward as one program and tells no one when backward ends, so there is
no overlap share in :func:`summary`), and no wait for earlier buckets: it is
folded into ready (XLA only calls a step once the previous one completed), so
"waits for earlier buckets" only spans checking the call.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from bagua_core import config, log

_FLUSH_RECORDS = 512  # steps and spans kept before they are formatted and written
_FFI_DRAIN_S = 0.5  # how often the JAX step timings are moved into the trace


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
        self._pending: List[str] = []  # formatted events
        self._records: list = []  # raw steps and spans
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
            self._emit(
                {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": f"{model} {lane}"}}
            )
            self._emit(
                {"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": tid, "args": {"sort_index": tid}}
            )
        return tid

    # The step path only appends raw numbers; events are formatted when written.
    def engine_step(
        self,
        model: str,
        step: int,
        bucket_names: Sequence[str],
        timings: Sequence[tuple],
        first_bucket: int = 0,
        lanes: int = 1,
    ) -> None:
        """One engine step: ``timings[i]`` = (ready, launch, start, end) ns of
        bucket ``first_bucket + i``, run on lane ``(first_bucket + i) % lanes``."""
        with self._lock:
            if not self._closed:
                self._records.append(
                    (
                        model,
                        int(step),
                        tuple(bucket_names),
                        [tuple(t) for t in timings],
                        int(first_bucket),
                        max(1, int(lanes)),
                    )
                )
                self._maybe_flush()

    def span(self, model: str, name: str, start_ns: int, end_ns: int, **args) -> None:
        """A framework phase on the model's ``framework`` row."""
        with self._lock:
            if not self._closed and 0 <= start_ns <= end_ns:
                self._records.append((model, name, start_ns, end_ns, args))
                self._maybe_flush()

    def _maybe_flush(self) -> None:
        if len(self._records) >= _FLUSH_RECORDS:
            self._flush()

    def _format(self, record: tuple) -> None:
        pid = self.rank
        if isinstance(record[1], str):  # a framework span
            model, name, start, end, args = record
            self._emit(
                {
                    "name": name,
                    "cat": "bagua",
                    "ph": "X",
                    "pid": pid,
                    "tid": self._tid(model, "framework"),
                    "ts": start / 1000.0,
                    "dur": (end - start) / 1000.0,
                    "args": {"model": model, **args},
                }
            )
            return
        model, step, names, timings, first, lanes = record
        quoted = json.dumps(model)
        comm_tids = [self._tid(model, "comm thread" if lanes == 1 else f"comm lane {lane}") for lane in range(lanes)]
        out = self._pending
        for i, (name, (ready, launch, start, end)) in enumerate(zip(names, timings), start=first):
            comm_tid = comm_tids[i % lanes]
            args = (
                f'{{"model":{quoted},"step":{step},"bucket":{i},"bucket_name":{json.dumps(name)},'
                f'"ready_ns":{ready},"launch_ns":{launch},"start_ns":{start},"end_ns":{end}}}'
            )
            tid = self._tid(model, f"bucket {i}")
            head = f'{{"cat":"bagua","ph":"X","pid":{pid},'
            if 0 <= ready <= launch:
                out.append(
                    f'{head}"tid":{tid},"name":"waits for earlier buckets","ts":{ready / 1000.0},'
                    f'"dur":{(launch - ready) / 1000.0},"args":{args}}}'
                )
            if 0 <= launch <= start:
                out.append(
                    f'{head}"tid":{tid},"name":"queued","ts":{launch / 1000.0},'
                    f'"dur":{(start - launch) / 1000.0},"args":{args}}}'
                )
            if 0 <= start <= end:
                out.append(
                    f'{head}"tid":{comm_tid},"name":"bucket {i}","ts":{start / 1000.0},'
                    f'"dur":{(end - start) / 1000.0},"args":{args}}}'
                )

    def _flush(self) -> None:
        for record in self._records:
            self._format(record)
        self._records.clear()
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


class _FfiStepFollower:
    """Moves the times of the step calls of jitted JAX programs
    (``csrc/ffi/step_timings.h``, recorded by the engine while this runs) into
    the trace, every ``_FFI_DRAIN_S`` seconds and when stopped. One model's
    calls of one step form one engine step of the trace; bucket names are
    their indices."""

    def __init__(self, settings: config.Settings):
        from bagua_core._loader import _C

        self._C = _C
        self._settings = settings
        self._stop = threading.Event()
        self.dropped = 0
        _C.set_ffi_step_timings(True)
        self._thread = threading.Thread(target=self._loop, name="bagua-trace-ffi", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(_FFI_DRAIN_S):
            self.drain()

    def drain(self) -> None:
        records, dropped = self._C.drain_ffi_step_timings()
        if dropped:
            self.dropped += dropped
            log.logger.warning("BAGUA_TRACE: %d JAX step timings were dropped (not drained in time)", dropped)
        if not records:
            return
        w = writer(self._settings)
        run: list = []
        for r in records:  # (model, bucket, step, ready, launch, start, end)
            if run and not (r[0] == run[-1][0] and r[2] == run[-1][2] and r[1] == run[-1][1] + 1):
                self._write(w, run)
                run = []
            run.append(r)
        self._write(w, run)

    @staticmethod
    def _write(w: TraceWriter, run: list) -> None:
        model, first, step = run[0][0], run[0][1], run[0][2]
        w.engine_step(model, step, [str(r[1]) for r in run], [r[3:] for r in run], first_bucket=first)

    def stop(self) -> None:
        """Stops recording and writes what was recorded. Idempotent."""
        if self._stop.is_set():
            return
        self._C.set_ffi_step_timings(False)
        self._stop.set()
        self._thread.join()
        self.drain()


_follower: Optional[_FfiStepFollower] = None


def follow_ffi_steps(settings: Optional[config.Settings] = None) -> Optional[TraceWriter]:
    """With ``BAGUA_TRACE`` set: records the engine steps that jitted JAX
    programs run (``bagua_jax.transform``) into this process's trace, from now
    until :func:`close` or exit, and returns the writer. Off: does nothing,
    returns None (the step calls then read no clock)."""
    global _follower
    s = settings or config.load()
    w = writer(s)
    if w is None:
        return None
    with _writer_lock:
        if _follower is None:
            _follower = _FfiStepFollower(s)
            atexit.register(_follower.stop)  # registered after the writer's close: runs before it
    return w


def close() -> None:
    """Closes this process's trace file (also done at exit)."""
    global _follower
    with _writer_lock:
        follower, _follower = _follower, None
    if follower is not None:
        follower.stop()
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


def _union(spans: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Disjoint spans covering the same time as ``spans``, in order."""
    out: List[Tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def summary(events: Sequence[dict]) -> Dict[Tuple[int, str], dict]:
    """Per (rank, model): steps, buckets, and the medians over steps of the
    communication time (ms during which some bucket ran, start -> end; buckets
    on different lanes overlap), of its share that ran before backward ended,
    and of forward start -> backward end (ms)."""
    import statistics

    comm: Dict[tuple, List[Tuple[int, int]]] = {}
    backward_end: Dict[tuple, Tuple[int, int]] = {}
    buckets: Dict[tuple, set] = {}
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") != "X" or "model" not in a:
            continue
        key = (e["pid"], a["model"], a.get("step"))
        if "start_ns" in a and e["name"].startswith("bucket "):
            comm.setdefault(key, []).append((a["start_ns"], a["end_ns"]))
            buckets.setdefault(key[:2], set()).add(a["bucket"])
        elif e["name"] == "forward start -> backward end":
            start = int(round(e["ts"] * 1000))
            backward_end[key] = (start, start + int(round(e["dur"] * 1000)))
    per: Dict[Tuple[int, str], dict] = {}
    for key, spans in comm.items():
        spans = _union(spans)
        total = sum(end - start for start, end in spans)
        row = per.setdefault(key[:2], {"comm_ms": [], "overlap": [], "step_ms": []})
        row["comm_ms"].append(total / 1e6)
        if key in backward_end:
            f0, b1 = backward_end[key]
            before = sum(max(0, min(end, b1) - start) for start, end in spans)
            row["overlap"].append(before / total if total else 0.0)
            row["step_ms"].append((b1 - f0) / 1e6)
    out = {}
    for k, row in per.items():
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        out[k] = {
            "steps": len(row["comm_ms"]),
            "buckets": len(buckets[k]),
            "comm_ms": med(row["comm_ms"]),
            "overlap": med(row["overlap"]),
            "forward_backward_ms": med(row["step_ms"]),
        }
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 3 and argv[0] == "merge":
        n = merge(argv[1], argv[2:])
        print(f"{argv[1]}: {n} events from {len(argv) - 2} file(s)")
        return 0
    if len(argv) >= 2 and argv[0] == "summary":
        events = [e for p in argv[1:] for e in load(p)]
        for (rank, model), r in sorted(summary(events).items()):
            print(
                f"rank {rank} {model}: {r['steps']} steps, {r['buckets']} buckets; per step (median): "
                f"communication {r['comm_ms']:.1f} ms, {100 * r['overlap']:.0f}% of it before backward ended; "
                f"forward start -> backward end {r['forward_backward_ms']:.1f} ms"
            )
        return 0
    print(
        "usage: python -m bagua_core.trace merge OUT.json RANK_TRACE.json...\n"
        "       python -m bagua_core.trace summary RANK_TRACE.json...",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
