"""Telemetry: plain stats objects the agent and aggregator cores update on the hot path.

One :class:`AgentStats` per edge agent and one :class:`AggregatorStats` per aggregator, updated with plain
attribute arithmetic (no Prometheus calls, no locks, no allocation per sample). The Prometheus exporter
(:mod:`streamfed.runtime.exporter`) reads a live set of them only when Prometheus scrapes.

Concurrency: the stats are written by the runtime's thread and read by the HTTP server's thread.
Every field is a Python number or a list of numbers, so a scrape may see one sample's update half
applied across fields (e.g. a count one ahead of a sum) but never a torn value; histograms derive
their count from the bucket counts, so `_count` always equals the `+Inf` bucket.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from streamfed.algorithms.base import Learner

__all__ = [
    "Z95",
    "PREDICTION_BUCKETS",
    "AGGREGATION_BUCKETS",
    "DEFAULT_SKIP_REASONS",
    "DEFAULT_REJECT_REASONS",
    "DP_PUBLIC_VALUES",
    "LatencyHistogram",
    "WindowedMSE",
    "ClassificationStats",
    "AgentStats",
    "AggregatorStats",
]

Z95 = 1.959963984540054  # standard normal quantile of 0.975: the central 95% interval is mean ± Z95·sd
# The learner values a private learner reports that depend on the number of uploads alone (a function of the
# public schedule and the budget), not on the data: the only ones exported while data statistics are withheld.
DP_PUBLIC_VALUES: frozenset[str] = frozenset({"dp_epsilon", "dp_uploads"})
# Prediction: numba steps take ~10 µs, a Python-level round trip up to milliseconds.
PREDICTION_BUCKETS: tuple[float, ...] = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Aggregation: one merge of a round's updates, from sub-millisecond to a slow refit.
AGGREGATION_BUCKETS: tuple[float, ...] = (
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Reason series created at zero up front: rate()/increase() cannot see the first increment of a
# series that appears with value 1, so an alert on "rejections > 0" would miss a lone first one.
# Kept literal (this module imports nothing of the runtime); tests/test_telemetry.py checks that they
# cover streamfed.fleet.sources.SkipReason and streamfed.wire.message.Reason.
DEFAULT_SKIP_REASONS: tuple[str, ...] = (
    "malformed", "missing_feature", "non_numeric", "non_finite", "out_of_order", "future_timestamp",
    "unknown_reading",
    "label_evicted", "duplicate", "unlearnable", "too_large",
    "bad_boolean", "bad_timestamp", "unknown_level",  # values declared input columns refuse (fleet/columns.py)
    "below_privacy_floor",  # learned, but the stream ended below the upload floor and nothing keeps them
    "queue_full", "stopped",  # dropped unread by the agent's bounded sensor queue (runtime/agent/receiving.py)
)
DEFAULT_REJECT_REASONS: tuple[str, ...] = (
    "too_large", "not_msgpack", "bad_schema", "unknown_kind", "wrong_fleet", "bad_client", "bad_array",
    "wrong_shape", "wrong_dtype", "non_finite", "bad_index", "bad_seq", "stale_seq", "wrong_kernel_version",
    "unknown_client", "invalid_update", "late",  # the aggregator's own, beyond the codec's
    "rate_limited", "ahead_of_state",  # over its rate (fleet/admission.py); ahead of a lost state
    "invalid_secagg", "invalid_sum",  # a secure-aggregation message refused; a round's unmasked sum beyond its bounds
)

_INF = math.inf
ECE_BINS = 15  # equal-width bins of the top probability for the expected calibration error
PROBA_FLOOR = 1e-12  # log loss floor: a class a client never saw has probability 0 under pFedGP


# =========================================================================== building blocks


class LatencyHistogram:
    """A fixed-bucket histogram of durations in seconds: `observe` is one bisect and two additions.

    `bounds` are the finite upper bounds (`le`), increasing; a `+Inf` bucket is implied. Negative or
    non-finite observations are ignored (a clock that went backwards says nothing about latency).

    >>> h = LatencyHistogram((0.001, 0.01))
    >>> for s in (0.0005, 0.001, 0.002, 3.0):
    ...     h.observe(s)
    >>> h.count, h.cumulative(), round(h.sum, 4)
    (4, [2, 3, 4], 3.0035)
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = PREDICTION_BUCKETS) -> None:
        b = tuple(float(x) for x in bounds)
        if not b or any(not math.isfinite(x) for x in b) or any(x >= y for x, y in zip(b, b[1:], strict=False)):
            raise ValueError(f"bucket bounds must be finite and strictly increasing, got {bounds!r}")
        self.bounds = b
        self.counts = [0] * (len(b) + 1)  # per bucket (not cumulative); the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        if not 0.0 <= seconds < _INF:  # also false for NaN
            return
        # bisect_left: the first bound >= value, i.e. Prometheus' `le` (upper bound inclusive)
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """Cumulative counts per `le` bound, `+Inf` last (a copy: safe to read while observing)."""
        return list(accumulate(list(self.counts)))


class WindowedMSE:
    """Mean of the last `size` squared errors: a ring buffer with a running sum, O(1) per `add`.

    The running sum is recomputed exactly (`math.fsum`) once per lap of the ring, which bounds the
    rounding drift of add/subtract at amortised O(1) cost.

    >>> w = WindowedMSE(3)
    >>> for e2 in (1.0, 4.0, 9.0, 16.0):
    ...     w.add(e2)
    >>> w.value, w.n
    (9.666666666666666, 3)
    """

    __slots__ = ("size", "_buf", "_pos", "_n", "_sum")

    def __init__(self, size: int = 100) -> None:
        if int(size) < 1:
            raise ValueError(f"window size must be >= 1, got {size!r}")
        self.size = int(size)
        self._buf = [0.0] * self.size
        self._pos = 0
        self._n = 0
        self._sum = 0.0

    def add(self, sq_error: float) -> None:
        buf, pos = self._buf, self._pos
        if self._n == self.size:
            self._sum -= buf[pos]
        else:
            self._n += 1
        buf[pos] = sq_error
        self._sum += sq_error
        pos += 1
        if pos == self.size:
            pos = 0
            self._sum = math.fsum(buf)  # once per lap: cancels the drift of the running sum
        self._pos = pos

    @property
    def n(self) -> int:
        """Samples in the window (`size` once full)."""
        return self._n

    @property
    def value(self) -> float:
        """The windowed MSE, NaN while empty."""
        n = self._n
        return max(self._sum, 0.0) / n if n else math.nan

    def values(self) -> list[float]:
        """The squared errors in the window, oldest first."""
        if self._n < self.size:
            return self._buf[: self._n]
        return self._buf[self._pos :] + self._buf[: self._pos]


class ClassificationStats:
    """A classifier's prequential scores, as running sums: accuracy, log loss (the true class's probability
    floored at `PROBA_FLOOR`) and expected calibration error over `ECE_BINS` equal-width bins of the top
    probability (per bin: count, Σ correct, Σ confidence; ECE = Σ_b |Σ correct_b − Σ conf_b| / n).

    >>> c = ClassificationStats()
    >>> c.observe(0, np.array([0.9, 0.1])); c.observe(1, np.array([0.8, 0.2]))
    >>> c.n, c.accuracy, round(c.log_loss, 6), round(c.expected_calibration_error, 6)
    (2, 0.5, 0.857399, 0.45)
    """

    __slots__ = ("n", "correct", "log_loss_sum", "bin_n", "bin_correct", "bin_confidence")

    def __init__(self, bins: int = ECE_BINS) -> None:
        self.n = 0
        self.correct = 0
        self.log_loss_sum = 0.0
        self.bin_n = [0] * bins
        self.bin_correct = [0] * bins
        self.bin_confidence = [0.0] * bins

    def observe(self, y: int, proba: np.ndarray) -> None:
        """Score the probabilities `proba` of a reading whose class turned out to be `y` (made before
        learning it). A class beyond the vector has probability 0."""
        y = int(y)
        k = int(np.argmax(proba))
        conf = float(proba[k])
        p_true = float(proba[y]) if 0 <= y < len(proba) else 0.0
        hit = int(k == y)
        bins = len(self.bin_n)
        b = min(int(conf * bins), bins - 1)  # a confidence of exactly 1 belongs to the top bin
        self.n += 1
        self.correct += hit
        self.log_loss_sum -= math.log(max(p_true, PROBA_FLOOR))
        self.bin_n[b] += 1
        self.bin_correct[b] += hit
        self.bin_confidence[b] += conf

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else math.nan

    @property
    def log_loss(self) -> float:
        return self.log_loss_sum / self.n if self.n else math.nan

    @property
    def expected_calibration_error(self) -> float:
        """Σ_b (n_b / n)·|accuracy_b − confidence_b| (NaN before the first)."""
        if not self.n:
            return math.nan
        return sum(abs(c - s) for c, s in zip(self.bin_correct, self.bin_confidence, strict=True)) / self.n


# =========================================================================== agent


class AgentStats:
    """Everything an edge agent reports, as plain numbers the runtime updates in place.

    Hot path, per sample: :meth:`observe_prediction` (squared error, running and windowed MSE,
    95%-interval coverage when a variance is given, latency) or :meth:`skip`; per upload
    :meth:`uploaded`; per received global :meth:`global_received`. Learner-side quantities (cumulative
    loss, best kernel in hindsight, regret `R(T)`, kernel weights, global version) are copied by
    :meth:`update_from_learner` — call it from the thread that steps the learner, at whatever cadence
    suits (every step for POF-MKL costs O(N); FedBNR's regret costs O(K·F³), call it per upload).

    `clock` (monotonic seconds) dates received globals, for the staleness gauge.

    >>> s = AgentStats("a1", fleet="demo", algorithm="pofmkl", window=2)
    >>> for y, yhat in ((1.0, 0.0), (0.0, 0.5), (2.0, 2.5)):
    ...     s.observe_prediction(y, yhat, latency_s=0.001)
    >>> s.samples, s.mse, s.windowed_mse
    (3, 0.5, 0.25)
    >>> s.observe_prediction(0.0, 0.1, var=1.0)     # Bayesian learners pass the predictive variance
    >>> s.interval_hits, s.interval_total, s.coverage
    (1, 1, 1.0)
    >>> s.skip("malformed"); s.uploaded(2048); s.skipped["malformed"], s.upload_bytes
    (1, 2048)
    """

    __slots__ = (
        "client", "fleet", "algorithm", "clock",
        "samples", "skipped", "sq_error_sum", "window", "interval_hits", "interval_total", "latency",
        "learner_steps", "learner_loss", "best_kernel_loss", "regret", "kernel_names", "kernel_weights",
        "learner_values", "recent_skip_ratio",
        "upload_bytes", "upload_messages", "global_version", "global_epoch", "global_received_at", "newest_version",
        "dp_epsilon", "dp_delta", "dp_exhausted", "dp_budget", "classification", "healthy", "unnoised_metrics",
    )

    def __init__(self, client: str, *, fleet: str = "default", algorithm: str = "unknown", window: int = 100,
                 skip_reasons: Iterable[str] = DEFAULT_SKIP_REASONS,
                 latency_buckets: Sequence[float] = PREDICTION_BUCKETS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.fleet, self.algorithm = str(client), str(fleet), str(algorithm)
        self.clock = clock
        self.samples = 0  # scored samples (predicted, then learned); skipped ones are counted apart
        self.skipped: dict[str, int] = {str(r): 0 for r in skip_reasons}
        self.sq_error_sum = 0.0
        self.window = WindowedMSE(window)
        self.interval_hits = 0
        self.interval_total = 0
        self.latency = LatencyHistogram(latency_buckets)
        # learner-side values: None until a learner (or the runtime) reports them
        self.learner_steps: int | None = None
        self.learner_loss: float | None = None
        self.best_kernel_loss: float | None = None
        self.regret: float | None = None
        self.kernel_names: tuple[str, ...] = ()
        self.kernel_weights: list[float] = []
        self.learner_values: dict[str, float] = {}  # the learner's own diagnostics (named numbers)
        self.healthy = 1.0  # 0 while the agent cannot write its state (runtime/agent/): its updates are held back
        self.recent_skip_ratio: float | None = None  # share of the source's recent items skipped (the runtime's)
        self.upload_bytes = 0
        self.upload_messages = 0
        self.global_epoch = 0
        self.global_version: int | None = None
        self.global_received_at: float | None = None
        self.newest_version = 0
        # differential privacy (None while off): ε spent at δ, the budget, and whether uploads stopped for it
        self.dp_epsilon: float | None = None
        self.dp_delta: float | None = None
        self.dp_budget: float | None = None
        self.dp_exhausted = False
        # under DP the quality metrics are statistics of the raw stream, outside the noise: withheld unless the
        # operator opts in (`streamfed agent --dp-unnoised-metrics`; docs/privacy.md § The privacy boundary)
        self.unnoised_metrics = False
        # a classifier's scores: created by its first scored probabilities (a regressor never has them)
        self.classification: ClassificationStats | None = None

    def set_privacy(self, epsilon: float, delta: float, exhausted: bool, budget: float | None = None) -> None:
        """The privacy spent so far: `(epsilon, delta)`, the budget, and whether it stopped the uploads."""
        self.dp_epsilon, self.dp_delta = float(epsilon), float(delta)
        self.dp_budget = None if budget is None else float(budget)
        self.dp_exhausted = bool(exhausted)

    @property
    def withholds_data_statistics(self) -> bool:
        """Whether an exporter must leave out every number computed from the raw stream (MSE, coverage, regret,
        kernel weights, sample, skip and learned counts, latencies, the learner's own values other than
        :data:`DP_PUBLIC_VALUES`): differential privacy is on and the operator has not opted in to
        publishing them un-noised."""
        return self.dp_epsilon is not None and not self.unnoised_metrics

    # ------------------------------------------------------------------ hot path
    def observe_prediction(self, y: float, yhat: float, latency_s: float | None = None,
                           var: float | None = None, proba: np.ndarray | None = None) -> None:
        """Score one prediction `yhat` of target `y` (made before learning `y`): squared error into
        the running and windowed MSE; with `var` (predictive variance) a hit if `y` lies in the
        central 95% interval; with `proba` (a classifier's class probabilities) accuracy, log loss and
        calibration (:class:`ClassificationStats`); `latency_s` into the latency histogram. A non-finite
        error is counted as a skipped sample (reason `non_finite`) instead of poisoning the sums."""
        e = y - yhat
        e2 = e * e
        if not e2 < _INF:  # NaN or overflow
            self.skip("non_finite")
            return
        self.samples += 1
        self.sq_error_sum += e2
        self.window.add(e2)
        if var is not None:
            self.interval_total += 1
            if var >= 0.0 and abs(e) <= Z95 * math.sqrt(var):  # as FedBNR's own PrequentialMetrics
                self.interval_hits += 1
        if proba is not None:
            if self.classification is None:
                self.classification = ClassificationStats()
            self.classification.observe(int(y), proba)
        if latency_s is not None:
            self.latency.observe(latency_s)

    def skip(self, reason: str, n: int = 1) -> None:
        """Count `n` samples dropped before scoring (bad input, non-finite result, ...)."""
        reason = str(getattr(reason, "value", reason))  # an Enum member counts under its value
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def uploaded(self, nbytes: int, messages: int = 1) -> None:
        """Count an upload of `nbytes` payload bytes in `messages` MQTT messages."""
        self.upload_bytes += nbytes
        self.upload_messages += messages

    def global_received(self, version: int, at: float | None = None, epoch: int = 0) -> None:
        """A global of `version` (and `epoch`) was installed at `at` (default: now on `clock`)."""
        self.global_version = int(version)
        self.global_epoch = int(epoch)
        self.global_received_at = self.clock() if at is None else float(at)
        if version > self.newest_version:
            self.newest_version = int(version)

    def saw_version(self, version: int) -> None:
        """A newer global exists (announced, or rejected here) even if it is not installed."""
        if version > self.newest_version:
            self.newest_version = int(version)

    def set_learner_losses(self, steps: int, loss: float, best_loss: float, regret: float | None = None) -> None:
        """Report learner-side totals directly (for learners :meth:`update_from_learner` cannot read):
        `steps` learned, cumulative loss, best-kernel/comparator loss in hindsight, and `R(T)`
        (default `loss - best_loss`)."""
        self.learner_steps = int(steps)
        self.learner_loss = float(loss)
        self.best_kernel_loss = float(best_loss)
        self.regret = float(loss - best_loss if regret is None else regret)

    def set_kernel_weights(self, weights: Sequence[float], names: Sequence[str] | None = None) -> None:
        """Kernel weights (and their names, if not known yet or changed)."""
        if names is not None:
            self.kernel_names = tuple(str(n) for n in names)
        elif len(self.kernel_names) != len(weights):
            self.kernel_names = tuple(f"k{p}" for p in range(len(weights)))
        self.kernel_weights = [float(w) for w in weights]

    # ------------------------------------------------------------------ learners
    def update_from_learner(self, learner: Learner, *, regret: bool = True) -> None:
        """Copy what only the learner knows, through the learner contract
        (:class:`~streamfed.algorithms.base.Learner`):

        * steps, cumulative loss, best comparator in hindsight and regret, from one consistent
          :meth:`~streamfed.algorithms.base.Learner.regret` read — skipped when `regret=False` for learners
          whose regret is costly (FedBNR: O(K·F³)); the previous values stay, and the running MSE comes
          from :meth:`observe_prediction` anyway;
        * kernel weights with their names, where the learner has them;
        * the global version in use (a change is recorded as received now).
        """
        if regret:  # all four from one read, so that R/T pairs R with its own T
            r = learner.regret()
            self.set_learner_losses(int(r.n), r.loss, r.best_loss, r.regret)
            # as costly as the regret (evidences): read at the same cadence; non-finite values never leave
            self.learner_values = {str(k): float(v) for k, v in learner.diagnostics().items() if math.isfinite(v)}
        weights = learner.kernel_weights
        if weights is not None:
            names = None
            if len(self.kernel_names) != len(weights):  # names never change: read them once
                names = list(learner.kernel_names)
            self.set_kernel_weights(np.asarray(weights).tolist(), names)
        version = learner.global_version
        current = self.global_version if self.global_version is not None else 0
        if int(version) != current:  # version 0 without a receipt is the learner's initial model
            self.global_received(int(version))

    @classmethod
    def from_learner(cls, learner: Learner, client: str | None = None, *, fleet: str = "default",
                     algorithm: str = "unknown", **kwargs: Any) -> AgentStats:
        """Stats for `learner` of agent `client`, filled by :meth:`update_from_learner`."""
        if client is None:
            raise ValueError("give a client id: the stats of a learner are those of one agent")
        stats = cls(client, fleet=fleet, algorithm=algorithm, **kwargs)
        stats.update_from_learner(learner)
        return stats

    # ------------------------------------------------------------------ derived values
    @property
    def mse(self) -> float:
        """Running MSE of every scored prediction (NaN before the first)."""
        return self.sq_error_sum / self.samples if self.samples else math.nan

    @property
    def windowed_mse(self) -> float:
        """MSE of the last `window.size` scored predictions (NaN before the first)."""
        return self.window.value

    @property
    def coverage(self) -> float:
        """Fraction of targets inside the central 95% predictive interval (NaN without any)."""
        return self.interval_hits / self.interval_total if self.interval_total else math.nan

    def staleness_seconds(self, now: float | None = None) -> float | None:
        """Seconds since the global in use was received (None before the first)."""
        if self.global_received_at is None:
            return None
        return max((self.clock() if now is None else now) - self.global_received_at, 0.0)

    def versions_behind(self, newest: int = 0) -> int:
        """Versions between the global in use and the newest known (here, or `newest` from elsewhere)."""
        return max(self.newest_version, newest) - (self.global_version or 0)


# =========================================================================== aggregator


class AggregatorStats:
    """What an aggregator reports, as plain numbers the runtime updates in place.

    Per message :meth:`accepted` (the client counts as heard) or :meth:`rejected` with a reason;
    :meth:`heard` for other signs of life (status messages); per finished round or window
    :meth:`round_completed`. A client is *active* if heard within `active_window_s` seconds.

    >>> t = [0.0]
    >>> a = AggregatorStats("demo", active_window_s=60, clock=lambda: t[0])
    >>> a.accepted("a1"); a.accepted("a2"); a.rejected("stale_seq")
    >>> t[0] = 30.0; a.accepted("a1"); a.round_completed(version=1, duration_s=0.002)
    >>> t[0] = 75.0
    >>> a.updates_accepted, a.rejected_by_reason["stale_seq"], a.rounds, a.active_clients()
    (3, 1, 1, 1)
    """

    __slots__ = ("fleet", "active_window_s", "clock", "wall_clock", "updates_accepted", "rejected_by_reason",
                 "last_heard", "rounds", "last_round_wall", "aggregation", "global_version", "values",
                 "ingest_lag_s")

    def __init__(self, fleet: str = "default", *, active_window_s: float = 60.0,
                 reasons: Iterable[str] = DEFAULT_REJECT_REASONS,
                 latency_buckets: Sequence[float] = AGGREGATION_BUCKETS,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not active_window_s > 0:
            raise ValueError(f"active_window_s must be > 0, got {active_window_s!r}")
        self.fleet = str(fleet)
        self.active_window_s = float(active_window_s)
        self.clock, self.wall_clock = clock, wall_clock
        self.updates_accepted = 0
        self.rejected_by_reason: dict[str, int] = {str(r): 0 for r in reasons}
        self.last_heard: dict[str, float] = {}
        self.rounds = 0
        self.last_round_wall: float | None = None  # Unix time, for "time since the last round"
        self.aggregation = LatencyHistogram(latency_buckets)
        self.global_version: int | None = None
        self.values: dict[str, float] = {}  # the aggregation's diagnostics
        # how old the last accepted update was when it was taken in (its sender's clock): an aggregator
        # that falls behind its input says so here (and in its log) before anything is lost
        self.ingest_lag_s: float | None = None

    def accepted(self, client: str, n: int = 1) -> None:
        """`n` updates from `client` were accepted."""
        self.updates_accepted += n
        self.last_heard[client] = self.clock()

    def rejected(self, reason: str, n: int = 1) -> None:
        """`n` updates were rejected for `reason` (e.g. a :class:`streamfed.wire.message.Reason` value)."""
        reason = str(getattr(reason, "value", reason))  # an Enum member counts under its value
        self.rejected_by_reason[reason] = self.rejected_by_reason.get(reason, 0) + n

    def heard(self, client: str) -> None:
        """`client` showed a sign of life other than an accepted update."""
        self.last_heard[client] = self.clock()

    def round_completed(self, version: int | None = None, duration_s: float | None = None,
                        values: Mapping[str, float] | None = None) -> None:
        """A round (or aggregation window) finished, publishing `version`; it took `duration_s`; `values`
        are the aggregation's own diagnostics (named numbers, e.g. POF-MKL's kernel resets)."""
        self.rounds += 1
        if values is not None:
            self.values = {str(k): float(v) for k, v in values.items() if math.isfinite(v)}
        self.last_round_wall = self.wall_clock()
        if version is not None:
            self.global_version = int(version)
        if duration_s is not None:
            self.aggregation.observe(duration_s)

    def set_global_version(self, version: int) -> None:
        """The newest global is `version` without a round here (e.g. restored from a retained message)."""
        self.global_version = int(version)

    def active_clients(self, now: float | None = None) -> int:
        """Clients heard within the last `active_window_s` seconds."""
        since = (self.clock() if now is None else now) - self.active_window_s
        return sum(1 for t in list(self.last_heard.values()) if t >= since)
