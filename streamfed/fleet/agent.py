"""The agent's pure core: a learner's client half plus sequence numbers, error feedback, label joins
and message building. No I/O: the MQTT shell (`streamfed.runtime.agent`) feeds it inputs and
publishes what it returns; a test can drive it directly.

The algorithm is a plug-in (:mod:`streamfed.algorithms`): the core holds its
:class:`~streamfed.algorithms.base.Learner` and never asks which one it is. Modes:

* ``lockstep`` — the paper's protocol over a network (algorithms with ``lockstep``, e.g. POF-MKL): the
  agent learns sample `t` with global version `t` and publishes its update as seq `t + 1`; it must not
  take the next sample before global version `t + 1` arrives (:attr:`AgentCore.waiting_for`). The
  aggregator closes round `r` when every expected client's seq `r` is in. The result equals
  :func:`streamfed.evaluation.replay.replay`.
* ``async`` — samples are learned as they come; the learner decides when it has an upload (POF-MKL: error
  feedback, at most `M` kernels per message; FedBNR: once `min_upload` samples are pending), the agent asks
  for one after every `upload_every` samples unless the transport holds uploads back.

Exactly-once effect over at-least-once delivery: every update message stays in :attr:`AgentCore.outbox`
until a global that *includes* it (its `included` map; lock-step: any global of a later round) has been
installed. Until then the shell may send it again (after a reconnect, when an `ack` says it is missing,
after a restart): the aggregator drops what it already has by `(client, seq)`. :meth:`AgentCore.snapshot`
/ :meth:`AgentCore.restore` carry everything a restarted agent needs to resume exactly where it was.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from streamfed import algorithms
from streamfed.algorithms.base import (
    Learner,
    Mode,
    NonFiniteError,
    Update,
    WrappedLearner,
)
from streamfed.core.durable import durable
from streamfed.core.standardise import DeclaredScales
from streamfed.fleet.bounded_labels import BoundedLabels
from streamfed.fleet.config import FleetConfig, same_fleet
from streamfed.fleet.secure_aggregation import Contribution, SecAggAgent
from streamfed.fleet.sources import Label, LabelJoin, Reading, Skip, SkipReason
from streamfed.fleet.standardised import NEEDS_PUBLIC_SCALES, StandardisedLearner
from streamfed.fleet.telemetry import AgentStats
from streamfed.wire.message import Message, ProtocolError, decode, encode, prediction_message
from streamfed.wire.schema import MAX_META_STR

if TYPE_CHECKING:
    from streamfed.fleet.private_learner import PrivateLearner

__all__ = ["AGENT_STATE_FORMAT", "AgentCore", "GlobalResult", "PendingLearn", "Prediction"]

log = logging.getLogger(__name__)
AGENT_STATE_FORMAT = 2  # layout of AgentCore.snapshot(); restore() refuses any other
# skip reason of samples learned but still below the upload floor when a stream ends without durable state
BELOW_PRIVACY_FLOOR = "below_privacy_floor"


@dataclass(frozen=True, slots=True)
class Prediction:
    """What an agent publishes for a reading."""

    reading_id: str
    mean: float
    var: float | None
    global_version: int
    latency_s: float
    epoch: int = 0  # the global's epoch (kernel version of learned-kernel families): nothing mixes versions
    proba: np.ndarray | None = None  # a classifier's class probabilities (`mean` is their argmax); None: regressor


class PendingLearn(NamedTuple):
    """A labelled reading between :meth:`AgentCore.begin_reading` and :meth:`AgentCore.finish_reading`."""

    reading: Reading
    y: float
    now: float
    predicted: bool  # predicted before (a delayed label): not counted as a new sample
    mean: float
    var: float | None
    global_version: int  # the global the step saw
    proba: np.ndarray | None = None  # a classifier's class probabilities of the reading, taken at begin_learn


@durable("fleet.AgentCounters")
@dataclass
class AgentCounters:
    """Plain counters (the metrics layer reads them)."""

    samples: int = 0  # readings predicted
    learned: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    updates: int = 0
    bytes_uploaded: int = 0
    rejected_globals: int = 0
    rejected_globals_by: dict[str, int] = field(default_factory=dict)  # reason → count
    ignored_globals: int = 0  # valid but not newer than the one in use (a redelivery)
    resent: int = 0  # update messages queued again (not yet included in a global)
    sq_loss: float = 0.0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def reject_global(self, reason: str) -> None:
        self.rejected_globals += 1
        self.rejected_globals_by[reason] = self.rejected_globals_by.get(reason, 0) + 1


class GlobalResult(NamedTuple):
    """What became of a global payload: `installed`, or the rejection `reason` and its `detail`.

    >>> GlobalResult(False, "non_finite", "theta").installed
    False
    """

    installed: bool
    reason: str | None = None
    detail: str = ""


def _private_part(learner: object) -> PrivateLearner | None:
    """The :class:`PrivateLearner` in a chain of wrappers (each holding the next as `inner`), if any."""
    module = sys.modules.get("streamfed.fleet.private_learner")
    if module is None:  # never imported: no learner of this process (restored ones included) can be one
        return None
    PrivateLearner = module.PrivateLearner  # noqa: N806
    for _ in range(8):  # wrappers are few; a bound instead of trusting a cycle-free chain
        if isinstance(learner, PrivateLearner):
            return learner
        if not isinstance(learner, WrappedLearner):
            return None
        learner = learner.inner
    return None


class AgentCore:
    """One agent's state and logic, transport-free.

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=4, n_features=5, standardise="none")
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
        self.algorithm = algorithms.get(cfg.algorithm)
        if mode == "lockstep" and not self.algorithm.lockstep:
            raise ValueError(f"lock-step mode is not {cfg.algorithm}'s protocol: it is order-free (use async)")
        lcfg = cfg
        if cfg.dp_epsilon is not None and mode == "async" and getattr(cfg.params, "min_upload", None) is not None:
            # under DP's public schedule the window is the floor (each upload counts dp_window arrivals): the learner
            # gives what it holds at every close, else one refused reading would carry a window into the next
            lcfg = cfg.model_copy(update={"params": cfg.params.model_copy(update={"min_upload": 1})})
        self.learner: Learner = self.algorithm.learner(lcfg, client_id, index, mode)
        # differential privacy wraps the learner itself: labels are clipped in the learner's units (inside
        # the standardiser), uploads noised as they leave it (docs/privacy.md)
        self.privacy: PrivateLearner | None = None
        if cfg.dp_epsilon is not None:
            # lazy: the accountant's dp_accounting pulls in scipy, which a fleet without DP does not need
            from streamfed.fleet.private_learner import PrivateLearner

            self.learner = self.privacy = PrivateLearner(
                self.learner, epsilon=cfg.dp_epsilon, delta=cfg.dp_delta, budget=cfg.dp_budget,
                label_bound=cfg.clip_label, clip_norm=cfg.clip_norm, client=client_id,
                noise_share=1.0 / (cfg.dp_round_clients or 1),
                clip_labels=self.algorithm.task_of(cfg) == "regression",
                # the public schedule: one upload per window of arrivals (lock-step: one per arrival, refused or not)
                window=cfg.dp_upload_window if mode == "async" else 1, n_inputs=cfg.n_inputs,
                schema=cfg.protocol_schema.kinds.get(cfg.update_kind))  # noised values kept within its signs
        self.status_changed = False  # something the status message says changed (the budget ran out)
        regression = self.algorithm.task_of(cfg) == "regression"  # a class label is never standardised
        if regression:  # a classifier's label is a class index, checked by the learner itself
            self.learner = BoundedLabels(self.learner, cfg.robust.label_bound)
        if cfg.standardise == "online":
            if self.privacy is not None and cfg.public_scales is None:
                raise ValueError(NEEDS_PUBLIC_SCALES)
            ps = cfg.public_scales
            self.learner = StandardisedLearner(self.learner, cfg.n_inputs, target=regression,
                                               label_bound=cfg.robust.label_bound if regression else None,
                                               private=self.privacy is not None,
                                               scales=None if ps is None else DeclaredScales(
                                                   ps.x_mean, ps.x_scale, ps.y_mean, ps.y_scale))
        self.kernel_version = self.algorithm.kernel_version(cfg)
        self._update_kind = cfg.update_kind  # resolved once: read for every update message
        self.upload_every = max(1, int(upload_every))
        self.join = LabelJoin(join_capacity)
        self.seq = 0  # last update seq published
        # seq → update message not yet included in an installed global (to resend until it is)
        self.outbox: dict[int, Message] = {}
        self.pred_seq = 0
        self.steps = 0  # samples learned
        self.counters = AgentCounters()
        self.global_version = 0
        self.global_epoch = 0  # the epoch of the global in use, in every prediction and metric
        self.global_received_at: float | None = None
        # Set by the transport when its outgoing buffer is full: learning goes on, but updates stay in
        # the learner (error feedback, pending statistics) instead of becoming messages.
        self.hold_uploads = False
        # Prometheus-facing numbers (read at scrape time); learner-side ones refreshed every `stats_every`
        # samples, or per upload when the learner's regret is costly (FedBNR: O(K·F³)).
        self.stats = stats or AgentStats(client_id, fleet=cfg.fleet, algorithm=cfg.algorithm)
        self.stats_every = max(1, int(stats_every))
        self.stats.update_from_learner(self.learner, regret=self.algorithm.cheap_regret)
        self._note_privacy()
        # secure aggregation: updates stay in the outbox and leave only masked, summed in SecAgg+ rounds
        self.secagg: SecAggAgent | None = None
        if cfg.secure_aggregation:
            self._local_sum = self.algorithm.aggregation(cfg, check_stats=False)
            self.secagg = SecAggAgent(cfg, client_id, self._contribution)

    # ------------------------------------------------------------------ secure aggregation
    def _contribution(self) -> Contribution | None:
        """What this agent adds in a secure-aggregation round: every update not yet in a global, summed in
        its algorithm's partial form, with the oldest and newest seq, the samples and the epoch."""
        if not self.outbox:
            return None
        msgs = [self.outbox[s] for s in sorted(self.outbox)]
        arrays, n, epoch = self._local_sum.partial([self._local_sum.check(m) for m in msgs])
        return Contribution(dict(arrays), msgs[0].seq, msgs[-1].seq, n, max(int(epoch), max(m.epoch for m in msgs)))

    def on_secagg(self, msg: Message, now: float | None = None) -> list[Message]:
        """A `secagg.*` message from the aggregator: the replies to publish on the updates topic."""
        if self.secagg is None:
            return []
        return self.secagg.on_message(msg, time.time() if now is None else now)

    def secagg_tick(self, now: float | None = None) -> list[Message]:
        """Start (or restart, after a stalled round) a secure-aggregation round when updates wait."""
        if self.secagg is None:
            return []
        return self.secagg.tick(time.time() if now is None else now, pending=bool(self.outbox))

    # ------------------------------------------------------------------ privacy
    def _note_privacy(self) -> None:
        """Copy the privacy spent to the metrics; note when the budget has just run out (the status says so)."""
        p = self.privacy
        if p is None:
            return
        was = self.stats.dp_exhausted
        self.stats.set_privacy(p.epsilon, p.delta, p.exhausted, p.budget)
        if p.exhausted and not was:
            self.status_changed = True

    def status_meta(self) -> dict[str, float | bool]:
        """What a `status` message says of this agent besides its state: the `(ε, δ)` spent and whether the
        privacy budget is exhausted (with differential privacy on; else nothing)."""
        p = self.privacy
        if p is None:
            return {}
        return {"dp_epsilon": float(min(p.epsilon, 1e300)), "dp_delta": float(p.delta),
                "dp_exhausted": bool(p.exhausted)}

    # ------------------------------------------------------------------ inputs
    @property
    def waiting_for(self) -> int | None:
        """Lock-step: the global version needed before the next sample may be learned (else None): the round of
        the last update sent. Rounds count uploads, not samples — a sample that makes no update (the online
        standardiser's first two only set its scales) opens no round, and waiting for one would wait forever."""
        if self.mode == "lockstep" and self.global_version < self.seq:
            return self.seq
        return None

    def on_reading(self, reading: Reading, now: float | None = None) -> tuple[Prediction | None, list[Message]]:
        """Predict a reading; learn at once if it carries its label, else keep it for its label."""
        pred, pending = self.begin_reading(reading, now)
        return pred, self.finish_reading(pending)

    def begin_reading(self, reading: Reading, now: float | None = None
                      ) -> tuple[Prediction | None, PendingLearn | None]:
        """The first half of :meth:`on_reading`: the prediction, as soon as it exists, and what is left
        to do (:meth:`finish_reading`, which must follow before the next reading: the learner may have
        moved on already). A transport publishes the prediction in between, so that learning, the update
        and its encoding never delay it (the learner's `begin_learn` / `end_learn` split says what runs
        before: POF-MKL's fused step, FedBNR's prediction alone)."""
        now = time.time() if now is None else now
        if reading.y is None:
            proba = self._class_probabilities(reading.x)
            if proba is None:
                mean, var = self.learner.predict(reading.x)
            else:  # one prediction: the class is the vector's argmax (the learner's own rule)
                mean, var = float(np.argmax(proba)), None
            if self.join.add(reading) is not None:  # the oldest unlabelled reading was dropped
                self.on_skip(Skip(SkipReason.LABEL_EVICTED))
            self.counters.samples += 1
            return self._prediction(reading, mean, var, now, proba), None
        pending = self._learn_begin(reading, reading.y, now)
        if pending is None:
            return None, None
        return self._prediction(reading, pending.mean, pending.var, now, pending.proba), pending

    def finish_reading(self, pending: PendingLearn | None) -> list[Message]:
        """The rest of a labelled reading begun with :meth:`begin_reading`: learn, take the update, count.
        Returns the update messages to publish."""
        return self._released() if pending is None else self._learn_finish(pending)

    def on_label(self, label: Label, now: float | None = None) -> list[Message]:
        """A delayed label: learn from the reading it names (unknown → skipped and counted)."""
        reading = self.join.match(label)
        if reading is None:
            self._arrival()
            self.on_skip(Skip(SkipReason.UNKNOWN_READING))
            return self._released()
        _, msgs = self._learn(reading, label.y, time.time() if now is None else now, predicted=True)
        return msgs

    def on_skip(self, skip: Skip) -> None:
        self.counters.skip(skip.reason)
        self.stats.skip(skip.reason)

    def on_global(self, msg: Message, now: float | None = None) -> bool:
        """Install a decoded global if it is newer than the one in use. Returns whether it was."""
        return self.install_global(msg, now).installed

    def install_global(self, msg: Message, now: float | None = None) -> GlobalResult:
        """:meth:`on_global`, saying why a global was not installed (its rejection is counted by reason)."""
        if msg.global_version <= self.global_version:
            self.counters.ignored_globals += 1
            return GlobalResult(False)
        try:
            installed = self.learner.install_global(msg)
        except ValueError as e:  # non-finite / wrong shape / not positive definite: keep the model we have
            reason = "non_finite" if isinstance(e, NonFiniteError) or "finite" in str(e) else "invalid_global"
            self.counters.reject_global(reason)
            self.stats.saw_version(msg.global_version)
            return GlobalResult(False, reason, str(e)[:200])
        if not installed:
            self.counters.ignored_globals += 1
            return GlobalResult(False)
        self.global_version = msg.global_version
        self.global_epoch = int(msg.epoch)
        self.global_received_at = time.time() if now is None else now
        self.stats.global_received(msg.global_version, epoch=msg.epoch)
        self._prune_outbox(msg)
        done = msg.global_version if self.mode == "lockstep" else int(msg.included.get(self.client_id, 0))
        if self.secagg is not None and 0 < self.secagg.sent_seq <= done:
            self.secagg.done()  # the round's sum is in: the next tick starts another if updates wait
        inc = msg.included.get(self.client_id, 0)
        if self.mode == "async" and inc > self.seq:
            # a restarted agent without its state must not reuse sequence numbers already applied
            self.seq = inc
        return GlobalResult(True)

    def on_global_payload(self, payload: bytes, now: float | None = None) -> GlobalResult:
        """Decode (strictly) and install a global payload; every rejection is counted by reason."""
        try:
            msg = decode(payload, self.cfg, kernel_version=self.kernel_version, kinds=(self.cfg.global_kind,))
        except ProtocolError as e:
            self.counters.reject_global(e.reason.value)
            return GlobalResult(False, e.reason.value, e.detail)
        return self.install_global(msg, now)

    def _prune_outbox(self, msg: Message) -> None:
        """Forget updates the installed global contains (lock-step: every update of a closed round —
        a round closed without an update, after a timeout, will never take it)."""
        done = msg.global_version if self.mode == "lockstep" else int(msg.included.get(self.client_id, 0))
        # and updates of an older epoch: never summed with the new one (a new kernel version, or an aggregator
        # that lost its state and asked for everyone's totals again)
        for s in [s for s, m in self.outbox.items() if s <= done or m.epoch < msg.epoch]:
            del self.outbox[s]

    def on_ack(self, msg: Message) -> list[Message]:
        """An `ack` from the aggregator: the updates above its `included` mark, to send again (the
        aggregator lost them in a crash, or they are missing; it drops any duplicate)."""
        mark = int(msg.included.get(self.client_id, 0))
        if self.secagg is not None:
            # an update never leaves unmasked; those up to the mark are summed (the aggregator says so when a masked
            # input reached back into them): a round must not add them again
            for s in [s for s in self.outbox if s <= mark]:
                del self.outbox[s]
            return []
        return [m for s, m in sorted(self.outbox.items()) if s > mark]

    def unacknowledged(self) -> list[Message]:
        """Every update not yet included in an installed global, in seq order (none to send with secure
        aggregation: updates leave only masked)."""
        if self.secagg is not None:
            return []
        return [self.outbox[s] for s in sorted(self.outbox)]

    # ------------------------------------------------------------------ durable state
    def snapshot(self) -> dict[str, Any]:
        """Everything needed to resume exactly here (see :meth:`restore`): the learner (its weights,
        accumulators, random generator and position in its block of draws, global, unsent updates),
        sequence counters, counters, the label join and the outbox (encoded). Cheap enough to take per
        update message."""
        return {
            "format": AGENT_STATE_FORMAT,
            "fleet_config": self.cfg.model_dump(mode="json"),
            "client": self.client_id, "index": self.index, "mode": self.mode,
            "learner": self.learner, "join": self.join,
            "seq": self.seq, "pred_seq": self.pred_seq, "steps": self.steps,
            "global_version": self.global_version, "global_epoch": self.global_epoch, "counters": self.counters,
            "outbox": [encode(self.outbox[s]) for s in sorted(self.outbox)],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume from a :meth:`snapshot`. `ValueError` if it belongs to another format, fleet
        configuration, client or mode (nothing is changed then)."""
        if state.get("format") != AGENT_STATE_FORMAT:
            raise ValueError(f"agent state format {state.get('format')!r}, expected {AGENT_STATE_FORMAT}")
        if not same_fleet(state.get("fleet_config"), self.cfg):
            raise ValueError("agent state was written for a different fleet configuration")
        mine = (self.client_id, self.index, self.mode)
        theirs = (state.get("client"), state.get("index"), state.get("mode"))
        if theirs != mine:
            raise ValueError(f"agent state is for (client, index, mode) {theirs}, this agent is {mine}")
        learner = state["learner"]
        if type(learner) is not type(self.learner):
            raise ValueError(f"agent state holds a {type(learner).__name__}, expected {type(self.learner).__name__}")
        outbox = {}
        for payload in state["outbox"]:
            m = decode(payload, self.cfg, kernel_version=self.kernel_version, client=self.client_id,
                       kinds=(self.cfg.update_kind,))
            outbox[m.seq] = m
        self.learner, self.join = learner, state["join"]
        self.seq, self.pred_seq, self.steps = int(state["seq"]), int(state["pred_seq"]), int(state["steps"])
        self.global_version = int(state["global_version"])
        self.global_epoch = int(state.get("global_epoch", 0))
        self.counters = state["counters"]
        self.outbox = outbox
        self.privacy = _private_part(learner)
        self.stats.update_from_learner(self.learner, regret=self.algorithm.cheap_regret)
        self._note_privacy()

    # ------------------------------------------------------------------ the work
    def _prediction(self, reading: Reading, mean: float, var: float | None, now: float,
                    proba: np.ndarray | None = None) -> Prediction:
        return Prediction(reading.id, mean, var, self.global_version, max(0.0, time.time() - now), self.global_epoch,
                          proba)

    def _class_probabilities(self, x: np.ndarray) -> np.ndarray | None:
        """A classifier's probabilities of `x` (None for a regressor: it is never asked)."""
        if not self.learner.classifier:
            return None
        p = self.learner.class_probabilities(x)
        return None if p is None else np.asarray(p, dtype=np.float64)

    def _learn(self, reading: Reading, y: float, now: float, predicted: bool = False
               ) -> tuple[Prediction | None, list[Message]]:
        pending = self._learn_begin(reading, y, now, predicted)
        if pending is None:
            return None, self._released()
        msgs = self._learn_finish(pending)
        return (None if predicted else self._prediction(reading, pending.mean, pending.var, now, pending.proba)), msgs

    def _learn_begin(self, reading: Reading, y: float, now: float, predicted: bool = False) -> PendingLearn | None:
        wait = self.waiting_for
        if wait is not None:
            raise RuntimeError(f"lock-step agent {self.client_id!r} must wait for global version {wait}")
        try:
            if not math.isfinite(y * y):  # beyond any range, and its squared error would overflow every metric
                raise ValueError(f"label {y!r} is too large: its square overflows")
            # the reading's time is the fleet's one time base (forgetting in time discounts by it)
            self.learner.observe_time(reading.ts)
            mean, var = self.learner.begin_learn(reading.x, y)
        except ValueError as e:  # the learner refused the sample and changed nothing: counted, not fatal
            self._refused(reading, e)
            return None
        # a classifier staged the probabilities of this very prediction: read, not predicted again
        proba = self.learner.last_probabilities if self.learner.classifier else None
        proba = None if proba is None else np.asarray(proba, dtype=np.float64)
        # quality is measured against the label as learned: one reading far outside the stream's range is clipped
        # (counted in labels_clipped / targets_winsorised), not left to dominate the MSE forever
        if self.learner.label_in_use is not None:
            y = float(self.learner.label_in_use)
        # the global this step saw: an update computed from it says so even if a newer one is installed
        # before the update message is built
        return PendingLearn(reading, y, now, predicted, mean, var, self.global_version, proba)

    def _learn_finish(self, p: PendingLearn) -> list[Message]:
        try:
            self.learner.end_learn()
        except ValueError as e:  # predicted, but the sample cannot be learned
            self._refused(p.reading, e)
            return []
        self._arrival()
        try:
            msgs = self._messages(self._take_updates())
        except ValueError as e:
            self._refused(p.reading, e, arrived=True)
            return []
        self.steps += 1
        self.counters.learned += 1
        if not p.predicted:
            self.counters.samples += 1
        self.counters.sq_loss += (p.mean - p.y) ** 2
        self.stats.observe_prediction(p.y, p.mean, max(0.0, time.time() - p.now), p.var, p.proba)
        if self.algorithm.cheap_regret:
            if self.steps % self.stats_every == 0:
                self.stats.update_from_learner(self.learner)
        elif msgs:
            self.stats.update_from_learner(self.learner)
        return msgs

    def _released(self) -> list[Message]:
        """What DP's schedule closed on a refused reading, leaving now as it would have on a learned one (when it
        leaves must not say which it was)."""
        if self.privacy is None or not getattr(self.privacy, "ready", None) or self.hold_uploads:
            return []
        return self._messages(self._learner_update())

    def _arrival(self) -> None:
        """DP's public schedule counts every labelled reading, learned or refused (docs/privacy.md)."""
        if self.privacy is not None:
            self.privacy.arrival()

    def _refused(self, reading: Reading, error: ValueError, arrived: bool = False) -> None:
        if not arrived:
            self._arrival()
        reason = SkipReason.NON_FINITE if isinstance(error, NonFiniteError) else SkipReason.UNLEARNABLE
        self.on_skip(Skip(reason))
        if self.counters.skipped.get(reason, 0) <= 3 or self.counters.skipped[reason] % 1000 == 0:
            log.warning("agent %s: reading %r not learned (%s, %d so far): %s", self.client_id, reading.id[:64],
                        reason, self.counters.skipped[reason], str(error)[:200])

    def _take_updates(self) -> list[Update]:
        """Lock-step: this step's update, always. Otherwise: one, if the learner has it, after every
        `upload_every` samples, unless the transport holds uploads back. Under DP's schedule, whatever it closed
        (counting learned samples would make the time it leaves depend on which readings were refused)."""
        scheduled = getattr(self.privacy, "window", None) is not None
        if self.mode != "lockstep" and (self.hold_uploads or (
                not scheduled and self.steps % self.upload_every != self.upload_every - 1)):
            return []
        return self._learner_update()

    def _learner_update(self) -> list[Update]:
        """The learner's upload, if it has one (the privacy spent noted)."""
        up = self.learner.take_update()
        ups = [] if up is None else [up]
        if self.privacy is not None:
            # DP's schedule may have closed more than one window since (a refused reading closes one too)
            while getattr(self.privacy, "ready", None) and (up := self.learner.take_update()) is not None:
                ups.append(up)
            self._note_privacy()
        return ups

    def _messages(self, updates: list[Update]) -> list[Message]:
        """Updates as messages to publish; with secure aggregation they stay in the outbox and what leaves is a
        round's messages."""
        msgs = [self._update_message(up) for up in updates]
        if self.secagg is not None:
            return self.secagg_tick() if msgs else []
        return msgs

    def take_held(self, *, ignore_hold: bool = False) -> list[Message]:
        """What the learner kept while the transport held uploads back, now that it takes them again (async
        only): the upload the next sample would have made, so a stream that pauses (or has ended) does not
        keep its samples from the fleet until its next reading. `ignore_hold`: even while uploads are held."""
        if self.mode == "lockstep" or (self.hold_uploads and not ignore_hold):
            return []
        return self._messages(self._learner_update())

    def flush(self) -> list[Message]:
        """Everything the learner still carries forward that may leave it, as messages (POF-MKL: its error
        feedback, at most `M` kernels each; FedBNR: nothing below the privacy floor)."""
        out = [self._update_message(up) for up in self.learner.flush()]
        self.stats.update_from_learner(self.learner)
        self._note_privacy()
        if self.secagg is not None:
            return self.secagg_tick() if out else []
        return out

    def end_of_stream(self, durable: bool) -> tuple[list[Message], int]:
        """A finite stream has ended: :meth:`flush`, plus what stays behind. Returns the messages and the
        number of samples the learner still holds below its upload floor (FedBNR's `min_upload`): they
        never leave the device on their own. With durable state (`durable`) they are kept and join the
        next upload when the stream resumes; without, they are lost with the process, so they are counted
        as skipped (`below_privacy_floor`) and logged — never silently."""
        # the last upload goes out even while the transport holds uploads back (flow control is about pace;
        # what is left now would otherwise wait for a sample that never comes)
        msgs = self.take_held(ignore_hold=True) + self.flush()
        held = int(self.learner.pending_samples)
        if held:
            if durable:
                log.info("agent %s: stream ended with %d samples below the upload floor; kept in the state "
                         "directory, they join the next upload when the stream resumes", self.client_id, held)
            else:
                for _ in range(held):
                    self.on_skip(Skip(BELOW_PRIVACY_FLOOR))
                log.warning("agent %s: stream ended with %d samples below the upload floor: they never leave "
                            "this device and, without --state-dir, are dropped (counted as %s)",
                            self.client_id, held, BELOW_PRIVACY_FLOOR)
        return msgs, held

    def _update_message(self, up: Update) -> Message:
        self.seq = self.seq + 1 if up.seq is None else int(up.seq)
        msg = Message(self.cfg.fleet, self.client_id, self._update_kind, self.seq, int(up.global_version),
                      self.kernel_version, int(up.n_samples), time.time(), dict(up.arrays), epoch=int(up.epoch))
        self.outbox[msg.seq] = msg
        return msg

    def prediction_message(self, pred: Prediction) -> Message:
        """The `prediction` message of one reading (`meta`: the reading id and the latency so far)."""
        self.pred_seq += 1
        return prediction_message(
            self.cfg.fleet, self.client_id, self.pred_seq, np.array([pred.mean]),
            None if pred.var is None else np.array([pred.var]), global_version=pred.global_version,
            kernel_version=self.kernel_version, epoch=pred.epoch,
            meta={"reading": pred.reading_id[:MAX_META_STR], "latency_s": float(pred.latency_s)},
            proba=None if pred.proba is None else pred.proba[None, :])

    def warm_up(self) -> None:
        """Run the per-sample path once on throw-away copies (numba dispatch and cache loading, the codec),
        so that the first real sample does not pay for it. Changes nothing here."""
        # numba specialises on writability: sensor readings arrive writable, dataset rows read-only
        writable = np.zeros(self.cfg.n_inputs)
        readonly = np.zeros(self.cfg.n_inputs)
        readonly.flags.writeable = False
        try:
            for x in (writable, readonly):
                self.learner.warm_up(x)
                twin = copy.deepcopy(self.learner)
                twin.learn(x, 0.0)
                for up in [u for u in [twin.take_update()] if u is not None] + twin.flush():
                    encode(Message(self.cfg.fleet, self.client_id, self.cfg.update_kind, 1, 0, self.kernel_version,
                                   int(up.n_samples), 0.0, dict(up.arrays), epoch=int(up.epoch)))
            encode(prediction_message(self.cfg.fleet, self.client_id, 1, np.zeros(1), global_version=0,
                                      kernel_version=self.kernel_version, meta={"reading": "w", "latency_s": 0.0}))
        except ValueError:  # an input the learner refuses: nothing to warm then
            pass

    # ------------------------------------------------------------------ regret
    @property
    def regret(self) -> float:
        return float(self.learner.regret().regret)
