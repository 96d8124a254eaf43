"""Exceptions raised by the engine.

Every engine failure is a :class:`BaguaError` (a ``RuntimeError``); its
subclasses tell a timeout from a dead peer from a disagreement between ranks.
Bad arguments raise the built-in ``ValueError`` / ``TypeError``.
"""

from bagua_core._loader import _C

BaguaError = _C.BaguaError
CommTimeoutError = _C.CommTimeoutError
PeerError = _C.PeerError
MismatchError = _C.MismatchError

BaguaError.__doc__ = "Base of every engine error (a RuntimeError)."
CommTimeoutError.__doc__ = (
    "A blocking call (collective, rendezvous, store request) did not finish within the timeout (BAGUA_TIMEOUT)."
)
PeerError.__doc__ = "A peer process went away (connection closed or reset) during an operation."
MismatchError.__doc__ = (
    "Ranks disagree on the operation, shape or dtype of a collective "
    "(operation, dtype, element count or root are checked before every collective; "
    "BAGUA_DEBUG_CHECKS=1 also checks send/recv pairs)."
)


class ConcurrentUseError(BaguaError):
    """Two threads called into one process group at the same time (see
    :mod:`bagua_core.one_caller`)."""


__all__ = ["BaguaError", "CommTimeoutError", "PeerError", "MismatchError", "ConcurrentUseError"]
