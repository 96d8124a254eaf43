"""Copies a worker's output to the launcher's, one whole line at a time, prefixed with its rank."""

from __future__ import annotations

import threading
from typing import BinaryIO, TextIO

# A line longer than this is copied in pieces (each prefixed) rather than held in memory.
MAX_LINE_BYTES = 1 << 20


class LineSink:
    """One destination stream (the launcher's stdout or stderr), shared by all workers.

    Whole lines are written under a lock, so lines of different workers never
    mix. If the destination goes away (a closed pipe), output is discarded but
    still read, so that no worker blocks on a full pipe.
    """

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()
        self._broken = False

    def write_line(self, data: bytes) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                buf = getattr(self._stream, "buffer", None)
                if buf is not None:
                    self._stream.flush()  # keep order with text the launcher itself printed
                    buf.write(data)
                    buf.flush()
                else:
                    self._stream.write(data.decode("utf-8", errors="replace"))
                    self._stream.flush()
            except (OSError, ValueError):
                self._broken = True


def pump(pipe: BinaryIO, prefix: bytes, sink: LineSink) -> None:
    """Reads ``pipe`` to its end; a last line without a newline is completed with one."""
    with pipe:
        while True:
            line = pipe.readline(MAX_LINE_BYTES)
            if not line:
                return
            if not line.endswith(b"\n"):
                line += b"\n"
            sink.write_line(prefix + line)


def start_pump(pipe: BinaryIO, prefix: str, sink: LineSink, name: str) -> threading.Thread:
    t = threading.Thread(target=pump, args=(pipe, prefix.encode(), sink), name=name, daemon=True)
    t.start()
    return t
