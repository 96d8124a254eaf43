"""Online tuning of the bucket plan (``BAGUA_AUTOTUNE=1``), framework-free.

Bagua 0.9 ran an HTTP service on rank 0; here rank 0 tunes in-process and
shares each decision through the job's rendezvous store, so every rank
switches plans at the same step (:mod:`bagua_core.autotune.session`). What
is tuned, and how it is scored: :mod:`bagua_core.autotune.tuner` (optuna).
A frontend builds an :class:`AutotuneSession` per wrapped model, calls
``on_step_start`` before each step and re-buckets when it returns a plan.
``python -m bagua_core.autotune.plot LOG -o out.png`` plots a log written
with ``BAGUA_IS_OUTPUT_AUTOTUNE_LOG=1``.
"""

from bagua_core.autotune.session import AutotuneMismatchError, AutotuneSession, Plan, log_path

__all__ = ["AutotuneMismatchError", "AutotuneSession", "Plan", "log_path"]
