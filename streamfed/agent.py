"""The agent's pure core: a learner's client half plus sequence numbers, error feedback, label joins
and message building. No I/O: the MQTT shell (`streamfed.runtime.agent`) feeds it inputs and
publishes what it returns; a test can drive it directly.

Modes (POF-MKL):

* ``lockstep`` — the paper's protocol over a network: the agent learns sample `t` with global version
  `t` and publishes its update as seq `t + 1`; it must not take the next sample before global version
  `t + 1` arrives (:attr:`AgentCore.waiting_for`). The aggregator closes round `r` when every
  expected client's seq `r` is in. The result equals :func:`streamfed.replay.replay`.
* ``async`` — samples are learned as they come; per-kernel deltas accumulate in an
  :class:`ErrorFeedback` buffer and each message carries at most `M` kernels (the largest accumulated
  ones), the rest is carried forward: no update mass is ever dropped, and a message's size never
  exceeds `M·2D` numbers.

FedBNR is order-free: the agent learns every sample, and publishes the delta statistics whenever at
least `min_upload` samples are pending (the privacy floor).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .config import MAX_META_STR, FleetConfig
from .fleet import kernel_version, make_learner
from .learners.fedbnr import GlobalModel
from .learners.pofmkl import KernelUpdate, NonFiniteError, POFMKLClient
from .metrics import AgentStats
from .protocol import (
    Message,
    fedbnr_global_fields,
    global_theta,
    pofmkl_update_message,
    prediction_message,
    stats_update_message,
)
from .sources import Label, LabelJoin, Reading, Skip, SkipReason

__all__ = ["AgentCore", "ErrorFeedback", "Prediction"]

Mode = Literal["lockstep", "async"]


class ErrorFeedback:
    """Per-kernel accumulated deltas; :meth:`take` removes at most `M` kernels (largest first).

    Invariant: everything added = everything taken + :attr:`residual` (exactly, up to the rounding of
    the additions).

    >>> ef = ErrorFeedback(n_kernels=3, dim=2, bin_size=1)
    >>> ef.add(KernelUpdate(np.array([0, 2]), np.array([[1.0, 0.0], [3.0, 0.0]])))
    >>> ef.take().kernels.tolist(), ef.take().kernels.tolist(), ef.take()
    ([2], [0], None)
    """

    def __init__(self, n_kernels: int, dim: int, bin_size: int) -> None:
        self.residual = np.zeros((n_kernels, dim))
        self.bin_size = bin_size
        self._samples = 0

    def add(self, update: KernelUpdate) -> None:
        self.residual[update.kernels] += update.delta
        self._samples += update.n_samples

    def pending(self) -> bool:
        return bool(np.any(self.residual))

    def take(self) -> KernelUpdate | None:
        norms = np.einsum("pi,pi->p", self.residual, self.residual)
        nonzero = np.flatnonzero(norms)
        if nonzero.size == 0:
            return None
        chosen = nonzero[np.argsort(-norms[nonzero], kind="stable")[: self.bin_size]]
        chosen.sort()
        delta = self.residual[chosen].copy()
        self.residual[chosen] = 0.0
        n, self._samples = self._samples, 0  # samples summarised since the last take
        return KernelUpdate(chosen.astype(np.int64), delta, max(n, 1))


@dataclass(frozen=True, slots=True)
class Prediction:
    """What an agent publishes for a reading."""

    reading_id: str
    mean: float
    var: float | None
    global_version: int
    latency_s: float


@dataclass
class AgentCounters:
    """Plain counters (the metrics layer reads them)."""

    samples: int = 0  # readings predicted
    learned: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    updates: int = 0
    bytes_uploaded: int = 0
    rejected_globals: int = 0
    sq_loss: float = 0.0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


class AgentCore:
    """One agent's state and logic, transport-free.

    >>> from streamfed.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=4, n_features=5)
    >>> agent = AgentCore(cfg, "a1", index=0, mode="async")
    >>> pred, msgs = agent.on_reading(Reading("r1", np.array([0.1, 0.2]), 0.0, y=0.5))
    >>> pred.mean, [m.kind for m in msgs], msgs[0].arrays["delta"].shape
    (0.0, ['pofmkl.update'], (1, 10))
    """

    def __init__(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async",
                 upload_every: int = 1, join_capacity: int = 10_000, stats: AgentStats | None = None,
                 stats_every: int = 16) -> None:
        self.cfg = cfg
        self.client_id = client_id
        self.index = index
        self.mode: Mode = mode
        self.learner = make_learner(cfg, client_id, index)
        self.kernel_version = kernel_version(cfg)
        self.pofmkl = isinstance(self.learner, POFMKLClient)
        if mode == "lockstep" and not self.pofmkl:
            raise ValueError("lock-step mode is POF-MKL's protocol; FedBNR is order-free (use async)")
        self.upload_every = max(1, int(upload_every))
        self.ef = ErrorFeedback(cfg.n_kernels, 2 * cfg.n_features, cfg.bin_size) if self.pofmkl else None
        self.join = LabelJoin(join_capacity)
        self.seq = 0  # last update seq published
        self.pred_seq = 0
        self.steps = 0  # samples learned
        self.counters = AgentCounters()
        self.global_version = 0
        self.global_received_at: float | None = None
        # Set by the transport when its outgoing buffer is full: learning goes on, but updates stay in
        # the learner (POF-MKL error feedback, FedBNR pending statistics) instead of becoming messages.
        self.hold_uploads = False
        # Prometheus-facing numbers (read at scrape time); learner-side ones refreshed every
        # `stats_every` samples (FedBNR's regret costs O(K·F³): refreshed per upload instead).
        self.stats = stats or AgentStats(client_id, fleet=cfg.fleet, algorithm=cfg.algorithm)
        self.stats_every = max(1, int(stats_every))
        self.stats.update_from_learner(self.learner, regret=self.pofmkl)

    # ------------------------------------------------------------------ inputs
    @property
    def waiting_for(self) -> int | None:
        """Lock-step: the global version needed before the next sample may be learned (else None)."""
        if self.mode == "lockstep" and self.global_version < self.steps:
            return self.steps
        return None

    def on_reading(self, reading: Reading, now: float | None = None) -> tuple[Prediction | None, list[Message]]:
        """Predict a reading; learn at once if it carries its label, else keep it for its label."""
        now = time.time() if now is None else now
        if reading.y is None:
            mean, var = self._predict(reading.x)
            if self.join.add(reading) is not None:  # the oldest unlabelled reading was dropped
                self.on_skip(Skip(SkipReason.LABEL_EVICTED))
            self.counters.samples += 1
            return self._prediction(reading, mean, var, now), []
        return self._learn(reading, reading.y, now)

    def on_label(self, label: Label, now: float | None = None) -> list[Message]:
        """A delayed label: learn from the reading it names (unknown → skipped and counted)."""
        reading = self.join.match(label)
        if reading is None:
            self.on_skip(Skip(SkipReason.UNKNOWN_READING))
            return []
        _, msgs = self._learn(reading, label.y, time.time() if now is None else now, predicted=True)
        return msgs

    def on_skip(self, skip: Skip) -> None:
        self.counters.skip(skip.reason)
        self.stats.skip(skip.reason)

    def on_global(self, msg: Message, now: float | None = None) -> bool:
        """Install a decoded global if it is newer than the one in use. Returns whether it was."""
        if msg.global_version <= self.global_version:
            return False
        try:
            if self.pofmkl:
                theta, version = global_theta(msg)
                self.learner.set_global(theta, version)
            else:
                g = GlobalModel.from_message(fedbnr_global_fields(msg))
                if not self.learner.apply_global(g):
                    return False
        except ValueError:  # non-finite / wrong shape: keep the model we have
            self.counters.rejected_globals += 1
            self.stats.saw_version(msg.global_version)
            return False
        self.global_version = msg.global_version
        self.global_received_at = time.time() if now is None else now
        self.stats.global_received(msg.global_version)
        return True

    # ------------------------------------------------------------------ the work
    def _predict(self, x: np.ndarray) -> tuple[float, float | None]:
        if self.pofmkl:
            return self.learner.predict(x), None
        mean, var = self.learner.predict(x)
        return float(mean), float(var)

    def _prediction(self, reading: Reading, mean: float, var: float | None, now: float) -> Prediction:
        return Prediction(reading.id, mean, var, self.global_version, max(0.0, time.time() - now))

    def _learn(self, reading: Reading, y: float, now: float, predicted: bool = False
               ) -> tuple[Prediction | None, list[Message]]:
        wait = self.waiting_for
        if wait is not None:
            raise RuntimeError(f"lock-step agent {self.client_id!r} must wait for global version {wait}")
        msgs: list[Message] = []
        try:
            if self.pofmkl:
                mean, update = self.learner.step(reading.x, y)
                var = None
                msgs = self._pofmkl_uploads(update)
            else:
                mean, var = self.learner.predict(reading.x)
                self.learner.learn(reading.x, y)
                up = None if self.hold_uploads else self.learner.make_upload()
                if up is not None:
                    msgs = [self._stats_message(up)]
        except NonFiniteError:
            self.on_skip(Skip(SkipReason.NON_FINITE))
            return None, []
        self.steps += 1
        self.counters.learned += 1
        if not predicted:
            self.counters.samples += 1
        self.counters.sq_loss += (mean - y) ** 2
        self.stats.observe_prediction(y, mean, max(0.0, time.time() - now), var)
        if self.pofmkl and self.steps % self.stats_every == 0:
            self.stats.update_from_learner(self.learner)
        elif not self.pofmkl and msgs:
            self.stats.update_from_learner(self.learner)
        return (None if predicted else self._prediction(reading, mean, var, now)), msgs

    def _pofmkl_uploads(self, update: KernelUpdate) -> list[Message]:
        if self.mode == "lockstep":
            return [self._update_message(update)]
        assert self.ef is not None
        self.ef.add(update)
        if self.hold_uploads or self.steps % self.upload_every != self.upload_every - 1:
            return []
        taken = self.ef.take()
        return [] if taken is None else [self._update_message(taken)]

    def flush(self) -> list[Message]:
        """Async POF-MKL: everything still carried forward, as messages of at most `M` kernels each."""
        out = []
        while self.ef is not None and (taken := self.ef.take()) is not None:
            out.append(self._update_message(taken))
        self.stats.update_from_learner(self.learner)
        return out

    def _update_message(self, update: KernelUpdate) -> Message:
        self.seq += 1
        return pofmkl_update_message(self.cfg.fleet, self.client_id, self.seq, update.kernels, update.delta,
                                     global_version=self.global_version, kernel_version=self.kernel_version,
                                     n_samples=update.n_samples)

    def _stats_message(self, up: Any) -> Message:
        fields = up.to_message()
        self.seq = up.seq
        return stats_update_message(self.cfg.fleet, self.client_id, up.seq, fields["S_upper"], fields["b"],
                                    fields["n"], fields["q"], global_version=up.base_version,
                                    kernel_version=self.kernel_version, epoch=int(fields.get("epoch", 0)))

    def prediction_message(self, pred: Prediction) -> Message:
        """The `prediction` message of one reading (`meta`: the reading id and the latency so far)."""
        self.pred_seq += 1
        msg = prediction_message(
            self.cfg.fleet, self.client_id, self.pred_seq, np.array([pred.mean]),
            None if pred.var is None else np.array([pred.var]), global_version=pred.global_version,
            kernel_version=self.kernel_version)
        return replace(msg, meta={"reading": pred.reading_id[:MAX_META_STR], "latency_s": float(pred.latency_s)})

    # ------------------------------------------------------------------ regret
    @property
    def regret(self) -> float:
        if self.pofmkl:
            return self.learner.regret
        return float(self.learner.regret()["regret"])
