"""Copies a worker's output to the launcher's, one whole line at a time, prefixed with its rank.

A line ends at ``\n`` or at ``\r``. Progress bars (tqdm) redraw their line
after a ``\r``: each redraw is passed on as it comes, with the prefix, so the
bar stays live and still shows its rank (such lines may mix with other ranks'
output; whole lines never do)."""

from __future__ import annotations

import re
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


_AFTER_LINE_END = re.compile(rb"(?<=\n)|(?<=\r)(?!\n)")


def _split_lines(buf: bytes):
    """(complete lines, each ending with \n, \r\n or \r; the rest)."""
    *lines, rest = _AFTER_LINE_END.split(buf)
    return lines, rest


def pump(pipe: BinaryIO, prefix: bytes, sink: LineSink) -> None:
    """Reads ``pipe`` to its end; a last line without a newline is completed with one."""
    pending = b""
    after_cr = False  # the last line ended with \r (a progress bar redraws)
    open_line = False  # part of a redrawn line is out already, with its prefix
    with pipe:
        while True:
            chunk = pipe.read1(MAX_LINE_BYTES)  # what is there now, without waiting for more
            if not chunk:
                break
            lines, pending = _split_lines(pending + chunk)
            for line in lines:
                # a \n alone after \r completes a \r\n split across reads
                bare = open_line or (after_cr and line == b"\n")
                sink.write_line(line if bare else prefix + line)
                open_line, after_cr = False, line.endswith(b"\r")
            if pending and (after_cr or open_line):
                # a redraw: show it now, not at the next \r (other lines still wait for their end)
                sink.write_line(pending if open_line else prefix + pending)
                pending, open_line = b"", True
            elif len(pending) >= MAX_LINE_BYTES:
                sink.write_line(prefix + pending + b"\n")
                pending = b""
    if pending:
        sink.write_line(prefix + pending + b"\n")
    elif after_cr or open_line:
        sink.write_line(b"\n")  # leave the terminal on a fresh line


def start_pump(pipe: BinaryIO, prefix: str, sink: LineSink, name: str) -> threading.Thread:
    t = threading.Thread(target=pump, args=(pipe, prefix.encode(), sink), name=name, daemon=True)
    t.start()
    return t
