"""Rank 0's search for a bucket plan: the sampler loop and its bookkeeping.

A plan is a bucket size (``2**bucket_size_2p`` bytes, ``bucket_size_2p`` in
[10, 31] as in Bagua 0.9, but at most the first power of two that holds every
gradient: larger sizes all make one bucket) applied to the tensors in the order they became
ready in backward. The first sample is the plan training started with (the
default size, registration order); the next ones are asked of optuna (TPE,
seeded, so a run is reproducible up to the measured speeds). A size whose
buckets are the same as an already measured size's gets that score without
being measured again, and does not count as a sample. After ``max_samples``
measured plans, or once every size was asked (or optuna asked
``10 * max_samples`` times), the search is over. Its samples were measured one
after the other while the load may have changed, so they only nominate a
candidate, the best one. The candidate replaces the default only on fresh,
paired evidence: the two are measured ``confirm_pairs`` times each,
alternately (ABBA order, so a steady drift of the load favours neither), and
the candidate is kept only if the lower end of a one-sided 95% confidence
interval of its speed-up (Student's t over the pairs' log ratios of median
step times) is above 1: its gain exceeds the noise measured between the
pairs. Otherwise training goes on with the default plan (:attr:`Tuner.verdict`
says which and why). So the kept plan is never a plan that only looked faster
by chance; a real gain smaller than the noise is given up.

Timing (as Bagua 0.9): nothing is measured during the first ``warmup_s``
seconds; then each plan is measured for at least ``confidence_s`` seconds
(and two steps) from its decision on; the caller does not feed the step
that switched plans, so the re-bucketing itself is not counted. Score: gradient bytes per second of the
median step, in GB/s. The tuner is fed times and step numbers; it never
reads a clock or a store itself.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from typing import Callable, Dict, Hashable, List, NamedTuple, Optional, Tuple

MIN_2P = 10
MAX_2P = 31
DEFAULT, CANDIDATE = "default", "candidate"  # the two plans of the confirmation


class Sample(NamedTuple):
    train_iter: int  # step at which the measurement ended
    plan_id: int  # -1: not measured, the buckets are those of an earlier sample (its score and step time)
    bucket_bytes: int
    num_buckets: int
    score_gbps: float
    median_step_s: float


class Verdict(NamedTuple):
    """How the search's candidate fared against the default, measured in pairs."""

    default_bytes: int
    candidate_bytes: int
    switched: bool  # the candidate replaced the default
    pairs: int  # 0: no candidate (the search's best makes the default's buckets)
    speedup: float  # exp(mean log ratio) of the default's median step over the candidate's
    low: float  # one-sided 95% confidence bounds of the speed-up
    high: float
    reason: str


# One-sided 95% quantiles of Student's t by degrees of freedom; between two
# entries the smaller df's (larger, so more cautious) value is used.
_T95 = (
    (1, 6.314),
    (2, 2.920),
    (3, 2.353),
    (4, 2.132),
    (5, 2.015),
    (6, 1.943),
    (7, 1.895),
    (8, 1.860),
    (9, 1.833),
    (10, 1.812),
    (12, 1.782),
    (15, 1.753),
    (20, 1.725),
    (30, 1.697),
    (60, 1.671),
    (120, 1.658),
)


def one_sided_t95(df: int) -> float:
    if df < 1:
        raise ValueError("a confidence interval needs at least 2 pairs")
    return [t for d, t in _T95 if d <= df][-1]


class Tuner:
    """``partition(bucket_bytes)`` gives the buckets a size makes, as a tuple
    (one hashable entry per bucket; equal tuples: the same plan)."""

    LOG_FIELDS = (
        "train_iter",
        "plan_id",
        "bucket_size_2p",
        "bucket_bytes",
        "num_buckets",
        "score_gbps",
        "median_step_s",
    )

    def __init__(
        self,
        default_bucket_bytes: int,
        payload_bytes: int,
        max_samples: int,
        warmup_s: float,
        confidence_s: float,
        partition: Callable[[int], Tuple[Hashable, ...]],
        log_path: Optional[str] = None,
        seed: int = 0,
        confirm_pairs: int = 5,
    ):
        import optuna  # only rank 0 of an autotuned run needs it

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        self.payload_bytes = int(payload_bytes)
        self.max_2p = min(MAX_2P, max(MIN_2P, math.ceil(math.log2(max(1, self.payload_bytes)))))
        self.max_samples = int(max_samples)
        self.warmup_s = float(warmup_s)
        self.confidence_s = float(confidence_s)
        self.partition = partition
        self.log_path = log_path
        self.samples: List[Sample] = []
        self.completed = False
        self.current_bytes = int(default_bucket_bytes)
        self.current_id = 0
        self._trial = None  # the optuna trial of the current plan (None: the default plan)
        self._scores: Dict[Hashable, Sample] = {}  # measured plans by their buckets
        self._since: Optional[float] = None  # start of the current measurement
        self._warm = self.warmup_s <= 0
        self._steps: List[float] = []
        self._asked = set()  # bucket_size_2p values optuna asked for
        self.current_is_default = True  # the current plan is the default (not a size asked of optuna)
        self._candidate: Optional[Sample] = None  # the search's best, being confirmed
        self._confirm: Optional[List[str]] = None  # DEFAULT / CANDIDATE: confirmation windows still to measure
        if int(confirm_pairs) < 2:
            raise ValueError(f"confirm_pairs must be >= 2, got {confirm_pairs}")
        self.confirm_pairs = int(confirm_pairs)
        # (DEFAULT or CANDIDATE, its measurement): the two measured again, alternately
        self.confirmations: List[Tuple[str, Sample]] = []
        self.chosen: Optional[Sample] = None  # the plan kept (a confirmation window of it, when confirmed)
        self.verdict: Optional[Verdict] = None  # set when the search is over
        if log_path:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
            with open(log_path, "w", newline="") as f:
                csv.writer(f).writerow(self.LOG_FIELDS)

    # ---- feeding ----
    def started(self, now: float) -> None:
        """Training (with the default plan) starts at ``now`` (seconds)."""
        self._since = now

    def observe_step(self, seconds: float) -> None:
        """The duration of one training step of the current plan (not the
        step that switched to it: re-bucketing is not the plan's cost)."""
        self._steps.append(float(seconds))

    # ---- deciding ----
    def decide(self, now: float, train_iter: int) -> Optional[int]:
        """At a decision point: the bucket size of the next plan to apply, or
        None to keep the current one. Sets :attr:`completed` once the best plan
        is chosen (its size is returned, once)."""
        if self.completed:
            return None
        if self._since is None:
            self._since = now
        if not self._warm:
            if now - self._since < self.warmup_s:
                return None
            self._warm = True
            self._restart(now)
            return None
        if now - self._since < self.confidence_s or len(self._steps) < 2:
            return None
        if self._confirm is not None:
            return self._confirm_next(now, train_iter)
        self._record(train_iter)
        sizes = self.max_2p - MIN_2P + 1
        while (
            self.measured < self.max_samples
            and len(self._asked) < sizes
            and len(self.study.trials) < 10 * self.max_samples
        ):
            size = self._ask()
            cached = self._scores.get(self.partition(size))
            if cached is None:
                return self._apply(size, now)
            self.study.tell(self._trial, cached.score_gbps)  # the same buckets: no need to measure again
            self._trial = None
            sample = cached._replace(train_iter=train_iter, plan_id=-1, bucket_bytes=size)
            self.samples.append(sample)
            self._log(sample)
        return self._start_confirming(now, train_iter)

    def _start_confirming(self, now: float, train_iter: int) -> Optional[int]:
        best, default = self.best(), self.samples[0]
        if best is default or self.partition(best.bucket_bytes) == self.partition(default.bucket_bytes):
            self.verdict = Verdict(
                default.bucket_bytes,
                best.bucket_bytes,
                False,
                0,
                1.0,
                1.0,
                1.0,
                "the search found no plan faster than the default",
            )
            return self._finish(DEFAULT, now)
        self._candidate = best
        running_candidate = not self.current_is_default and self.partition(self.current_bytes) == self.partition(
            best.bucket_bytes
        )
        first, other = (CANDIDATE, DEFAULT) if running_candidate else (DEFAULT, CANDIDATE)
        self._confirm = []
        for k in range(self.confirm_pairs):  # ABBA...: consecutive windows of one plan need no switch
            self._confirm += [first, other] if k % 2 == 0 else [other, first]
        return self._switch_to(self._confirm[0], now)

    def _confirm_next(self, now: float, train_iter: int) -> Optional[int]:
        median = statistics.median(self._steps)
        sample = Sample(
            train_iter,
            self.current_id,
            self.current_bytes,
            len(self.partition(self.current_bytes)),
            self.payload_bytes / median / 1e9 if median > 0 else 0.0,
            median,
        )
        self.confirmations.append((self._confirm.pop(0), sample))
        self._log(sample)
        if self._confirm:
            return self._switch_to(self._confirm[0], now)
        return self._judge(now)

    # Pair k = confirmation windows 2k and 2k+1 (one of each plan, measured
    # back to back). Speed-up of pair k: default's median step / candidate's.
    def _judge(self, now: float) -> Optional[int]:
        default_bytes, candidate_bytes = self.samples[0].bucket_bytes, self._candidate.bucket_bytes
        logs = []
        for (la, a), (_, b) in zip(self.confirmations[0::2], self.confirmations[1::2]):
            d, c = (a, b) if la == DEFAULT else (b, a)
            logs.append(math.log(max(d.median_step_s, 1e-12) / max(c.median_step_s, 1e-12)))
        n = len(logs)
        mean = statistics.fmean(logs)
        half = one_sided_t95(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        low, high = math.exp(mean - half), math.exp(mean + half)
        switch = low > 1.0
        measured = f"speed-up {math.exp(mean):.3f}x over {n} pairs, 95% lower bound {low:.3f}x"
        reason = (
            f"faster beyond the noise ({measured} > 1)"
            if switch
            else f"not shown faster than the default ({measured} <= 1)"
        )
        self.verdict = Verdict(default_bytes, candidate_bytes, switch, n, math.exp(mean), low, high, reason)
        return self._finish(CANDIDATE if switch else DEFAULT, now)

    def _finish(self, which: str, now: float) -> Optional[int]:
        self.completed = True
        kept = sorted((s for label, s in self.confirmations if label == which), key=lambda s: s.score_gbps)
        self.chosen = kept[len(kept) // 2] if kept else self.samples[0]
        return self._switch_to(which, now)

    def _switch_to(self, which: str, now: float) -> Optional[int]:
        """Runs the default or the candidate plan from now on: its size, or None if it runs already."""
        if which == DEFAULT:
            if self.current_is_default:
                self._restart(now)
                return None
            return self._apply(self.samples[0].bucket_bytes, now, default=True)
        if not self.current_is_default and self.partition(self.current_bytes) == self.partition(
            self._candidate.bucket_bytes
        ):
            self._restart(now)
            return None
        return self._apply(self._candidate.bucket_bytes, now)

    @property
    def measured(self) -> int:
        """Plans measured so far (the samples that count against ``max_samples``)."""
        return sum(1 for s in self.samples if s.plan_id >= 0)

    def best(self) -> Optional[Sample]:
        """The best sample of the search (before the confirmation)."""
        return max(self.samples, key=lambda s: s.score_gbps) if self.samples else None

    # ---- internals ----
    def _restart(self, now: float) -> None:
        self._since = now
        self._steps = []

    def _apply(self, size: int, now: float, default: bool = False) -> int:
        self.current_bytes = size
        self.current_is_default = default
        self.current_id += 1
        self._restart(now)
        return size

    def _ask(self) -> int:
        self._trial = self.study.ask()
        p = self._trial.suggest_int("bucket_size_2p", MIN_2P, self.max_2p)
        self._asked.add(p)
        return 2**p

    def _record(self, train_iter: int) -> None:
        median = statistics.median(self._steps)
        score = self.payload_bytes / median / 1e9 if median > 0 else 0.0
        size = self.current_bytes
        if self._trial is not None:
            self.study.tell(self._trial, score)
            self._trial = None
        else:  # the default plan: tell optuna about it too, at its nearest power of two
            p = min(self.max_2p, max(MIN_2P, round(math.log2(size))))
            dist = {"bucket_size_2p": self._optuna.distributions.IntDistribution(MIN_2P, self.max_2p)}
            self.study.add_trial(
                self._optuna.trial.create_trial(params={"bucket_size_2p": p}, distributions=dist, value=score)
            )
        sample = Sample(train_iter, self.current_id, size, len(self.partition(size)), score, median)
        self._scores[self.partition(size)] = sample
        self.samples.append(sample)
        self._log(sample)

    def _log(self, s: Sample) -> None:
        if not self.log_path:
            return
        with open(self.log_path, "a", newline="") as f:
            csv.writer(f).writerow(
                [
                    s.train_iter,
                    s.plan_id,
                    int(round(math.log2(s.bucket_bytes))),
                    s.bucket_bytes,
                    s.num_buckets,
                    f"{s.score_gbps:.6g}",
                    f"{s.median_step_s:.6g}",
                ]
            )
