"""Bagua's logger: ``logging.getLogger("bagua")``.

Applications configure it like any other logger. ``BAGUA_LOG_LEVEL`` (read by
:mod:`bagua_core.config`) sets its level and, when the logger has no handler
of its own, adds one writing ``bagua <LEVEL> rank <r>: <message>`` to stderr
(and stops propagation, so each message shows once).
At INFO it says the layout found at initialisation (nodes, local sizes), each
engine (hierarchical or flat), its algorithm step and its buckets.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("bagua")


def configure(settings) -> None:
    """Applies ``settings.log_level`` (None: leave the logger as the application set it)."""
    if settings.log_level is None:
        return
    logger.setLevel(settings.log_level)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"bagua %(levelname)s rank {settings.rank}: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # once, not again through the application's root handlers
