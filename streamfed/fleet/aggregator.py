"""The aggregator's pure core: validate, deduplicate, aggregate, version. No I/O — the MQTT shell
(`streamfed.runtime.aggregator`) feeds it payloads and a clock and publishes what it returns.

The algorithm is a plug-in (:mod:`streamfed.algorithms`); this core holds its
:class:`~streamfed.algorithms.base.Aggregation` and knows only two ways of closing a round:

``lockstep`` (algorithms that support it, e.g. POF-MKL)
    round `r` is the set of seq-`r` updates; it closes when every expected client's is in (clients that
    announced `offline` are no longer expected), or — with a `quorum` — when the round timeout has
    passed and at least `quorum` are in. The round's updates go to the aggregation in the fleet's client
    order, so the global equals the replay's bit for bit. Updates for later rounds wait (bounded by the
    sequence window).
``async``
    every accepted update goes to the aggregation's open window as it arrives; the window closes
    `window` seconds after its first update (at once with `window <= 0`), and a new global is published
    when the aggregation says something changed.

Every rejection has a reason (a :class:`~streamfed.wire.message.Reason` value, or ``invalid_update`` /
``unknown_client`` / ``late`` / ``rate_limited`` / ``ahead_of_state``) counted in
:attr:`AggregatorCore.rejected`; nothing rejected reaches the model, and :meth:`AggregatorCore.on_update`
never raises. Beyond the codec's checks (schema, shapes, dtypes, finiteness, indices, sequence numbers) the
aggregation validates an update completely *before* anything is changed (`Aggregation.check`): every value
bounded by `max_abs` (1e100), and whatever else the algorithm knows (the largest update an honest client can
produce from the fleet's configuration; FedBNR: statistics of some samples). Then each client is held to its
rate (:class:`~streamfed.fleet.admission.Admission`: token buckets on samples and uploads, `cfg.robust`); a
refusal is logged at warning at most once a minute per client and reason.

Durability: the shell sets :attr:`AggregatorCore.checkpoint` (a callable); it is called with the new
state *before* any global reflecting it is returned for publishing, so a published global is always
on disk. :meth:`AggregatorCore.snapshot` / :meth:`AggregatorCore.restore` carry the server state
(θ and version, or the summed statistics with σ, λ, version, `included` and out-of-order uploads),
pending lock-step rounds or the open window, the :class:`~streamfed.fleet.sequences.SeqTracker` and counters.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamfed import algorithms
from streamfed.algorithms.base import Aggregation, Mode, aggregation_diagnostics
from streamfed.fleet.admission import Admission
from streamfed.fleet.config import FleetConfig, same_fleet
from streamfed.fleet.secure_aggregation import MASKED as SECAGG_MASKED
from streamfed.fleet.secure_aggregation import UP_KINDS as SECAGG_UP
from streamfed.fleet.secure_aggregation import SecAggCoordinator
from streamfed.fleet.sequences import SeqCheck, SeqTracker
from streamfed.fleet.telemetry import AggregatorStats
from streamfed.wire.message import Message, ProtocolError, ack_message, decode, encode

__all__ = ["AGGREGATOR_STATE_FORMAT", "AggregatorCore", "note_status", "roster"]

LAG_WARNING = 2.0  # seconds an accepted update may have waited before the aggregator says it is behind
log = logging.getLogger(__name__)
AGGREGATOR_STATE_FORMAT = 2  # layout of AggregatorCore.snapshot(); restore() refuses any other


@dataclass
class AggregatorCounters:
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    gaps: int = 0  # updates that skipped over seqs not received yet (the acks list them as missing)
    last_round_at: float = 0.0
    aggregation_seconds: list[float] = field(default_factory=list)  # recent, bounded

    stats: AggregatorStats | None = None

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if self.stats is not None:
            self.stats.rejected(reason)


def roster(clients: Sequence[str] | None, mode: Mode, offline: str, lockstep: bool
           ) -> tuple[Mode, list[str], dict[str, int], set[str]]:
    """`(mode, clients, their order, who a lock-step round waits for)` of an aggregating core (the single
    aggregator, the sharded fleet's reducer). An algorithm without lock-step rounds always aggregates
    asynchronously; lock-step needs the client list; `offline` is "drop" or "wait" (see :func:`note_status`)."""
    mode = mode if lockstep else "async"
    if mode == "lockstep" and not clients:
        raise ValueError("lock-step rounds need the list of the fleet's clients")
    if offline not in ("drop", "wait"):
        raise ValueError(f"offline must be 'drop' or 'wait', got {offline!r}")
    names = list(clients or [])
    return mode, names, {c: i for i, c in enumerate(names)}, set(names)


def note_status(expected: set[str], offline: str, client: str, state: str) -> None:
    """A known client's status: "drop" stops lock-step rounds waiting for a client that went offline (its last
    will, or the end of its stream); "wait" keeps waiting for it to come back (strict lock-step: the result then
    equals the reference protocol even across agent crashes). Back online, it is waited for again."""
    if state != "offline":
        expected.add(client)
    elif offline == "drop":
        expected.discard(client)


class AggregatorCore:
    """Transport-free aggregator of one fleet.

    >>> import numpy as np
    >>> from streamfed.fleet.config import FleetConfig
    >>> from streamfed.algorithms.pofmkl.wire import update_message
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=1)
    >>> agg = AggregatorCore(cfg, clients=["a", "b"], mode="lockstep")
    >>> def up(c): return encode(update_message("f", c, 1, np.array([0]), np.ones((1, 2)),
    ...                          global_version=0, kernel_version=agg.kernel_version))
    >>> agg.on_update("a", up("a"), now=0.0), agg.version
    ([], 0)
    >>> [m.kind for m in agg.on_update("b", up("b"), now=0.0)], agg.version
    (['pofmkl.global'], 1)
    >>> agg.on_update("b", up("b"), now=0.0), agg.rejected
    ([], {'stale_seq': 1})
    """

    def __init__(self, cfg: FleetConfig, clients: Sequence[str] | None = None, mode: Mode = "lockstep",
                 quorum: int | None = None, round_timeout: float = 5.0, window: float = 0.5,
                 sender: str = "aggregator", stats: AggregatorStats | None = None,
                 offline: Literal["drop", "wait"] = "drop", max_abs: float = 1e100,
                 check_stats: bool = True, recover: bool = False) -> None:
        self.cfg = cfg
        self.algorithm = algorithms.get(cfg.algorithm)
        self.mode, self.clients, self.order, self.expected = roster(clients, mode, offline, self.algorithm.lockstep)
        self.offline = offline  # see note_status
        self.quorum = quorum
        self.checkpoint: Callable[[AggregatorCore], None] | None = None
        self.round_timeout = round_timeout
        self.window = window
        self.sender = sender
        # noised uploads are not the statistics of real samples: only bounds and shapes can be checked
        check_stats = check_stats and cfg.dp_epsilon is None
        # the roster given here (`--clients`) is the aggregation's too: robust mode's quorum and share cap count it
        of = cfg if clients is None or cfg.clients is not None else cfg.model_copy(update={"clients": tuple(clients)})
        self.aggregation: Aggregation = self.algorithm.aggregation(of, max_abs=max_abs, check_stats=check_stats)
        self.kernel_version = self.algorithm.kernel_version(cfg)
        self.tracker = SeqTracker(cfg.seq_window)
        self.schema = cfg.protocol_schema  # resolved once: decode runs for every payload
        self._update_kinds = (cfg.update_kind,)
        self.counters = AggregatorCounters()
        self.stats = stats or AggregatorStats(cfg.fleet)
        self.counters.stats = self.stats
        self._round: dict[int, dict[str, Any]] = defaultdict(dict)  # lock-step: round → client → item
        self._round_started: float | None = None
        self.window_started: float | None = None  # when the open asynchronous window took its first update
        self.last_seen: dict[str, float] = {}
        self.admission = Admission(cfg.robust)  # per-client token buckets on samples and uploads
        self.ahead: dict[str, int] = {}  # clients seen at a global newer than this state → the newest they named
        # recovery from a lost state (docs/reliability.md § Lost state): allowed by the operator (`recover`);
        # once started, each client is taken from the first seq it sends (`adopting`)
        self.recover = bool(recover)
        self.adopting = False
        self._ahead_epoch = 0  # the newest epoch an ahead-of-state client named
        self._warned: dict[tuple[str, str], float] = {}  # (client, reason) → when last logged at warning
        self._lag_warned_at = -float("inf")  # when the aggregator last said it is behind its input
        # secure aggregation: rounds of masked uploads; the unmasked sum is folded in as a shard's partial is
        self.secagg: SecAggCoordinator | None = None
        if cfg.secure_aggregation:
            expected = (lambda: set(self.expected)) if self.mode == "lockstep" else (lambda: set(self.clients))
            # distributed DP: each member adds 1/dp_round_clients of the noise, so a round is unmasked only with at
            # least that many inputs in it (a smaller sum would carry less noise than the accountant records)
            self.secagg = SecAggCoordinator(cfg, expected, gather=window if self.mode == "async" else round_timeout,
                                            timeout=round_timeout, min_clients=cfg.dp_round_clients or 2,
                                            summed=lambda c: self.aggregation.included().get(c, 0))

    # ------------------------------------------------------------------ state
    @property
    def version(self) -> int:
        return self.aggregation.version

    @property
    def rejected(self) -> dict[str, int]:
        return dict(self.counters.rejected)

    def included(self) -> dict[str, int]:
        """Per client, every seq up to this one is in the current global."""
        return self.aggregation.included()

    @property
    def window_due(self) -> float | None:
        """When the open asynchronous window closes (the core's clock), None without one."""
        if self.mode != "async" or self.window_started is None:
            return None
        return self.window_started + self.window

    # ------------------------------------------------------------------ inputs
    def on_update(self, topic_client: str, payload: bytes, now: float | None = None) -> list[Message]:
        """Validate and take in one update payload; returns messages to publish (globals, acks)."""
        now = time.time() if now is None else now
        if self.secagg is not None:
            return self._on_secagg(topic_client, payload, now)
        try:
            msg = decode(payload, self.schema, kernel_version=self.kernel_version, client=topic_client,
                         kinds=self._update_kinds)
            if self.clients and msg.client not in self.order:
                self.counters.reject("unknown_client")
                return []
            if msg.global_version > self.version:
                return self._ahead_of_state(msg, now)
            seq_check = self.tracker.check(msg.client, msg.seq)
        except ProtocolError as e:
            self.counters.reject(e.reason.value)
            return []
        adopt = self.adopting and msg.client not in self.tracker.clients and msg.seq > 1
        if seq_check.dropped is not None and not adopt:
            # More than a window ahead: taking it would give up the seqs in between for good (and an order-free
            # server would wait for them forever). An honest agent never gets there: it holds its uploads
            # while a window's worth is outstanding, and sends missing ones again.
            self.counters.reject("invalid_update")
            log.debug("update from %r seq %d is more than %d ahead of %d", msg.client, msg.seq,
                      self.tracker.window, self.tracker.mark(msg.client))
            return []
        try:
            # validated in full before anything changes: a rejected update leaves no trace
            item = self.aggregation.check(msg)
        except ValueError as e:  # well-formed but unusable (out of range, improper, below the privacy floor)
            self.counters.reject("invalid_update")
            self._warn(msg.client, "invalid_update", now, "update from %r seq %d refused: %s", msg.client, msg.seq, e)
            return []
        if self.mode == "lockstep" and msg.seq <= self.version:
            self.counters.reject("late")  # its round is closed (it was left out after a timeout)
            return []
        if not self.admission.admit(msg.client, msg.n_samples, now):
            # over its rate: refused before it counts for anything; an honest agent sends it again later
            self.counters.reject("rate_limited")
            self._warn(msg.client, "rate_limited", now, "client %r is over its rate (%g samples/s, %g uploads/s): "
                       "update seq %d refused for now", msg.client, self.cfg.robust.max_sample_rate,
                       self.cfg.robust.max_upload_rate, msg.seq)
            return []
        client = msg.client
        if adopt:  # valid for the new epoch: everything before it is what the lost state held
            self.tracker.adopt(client, msg.seq - 1)
            seq_check = self.tracker.check(client, msg.seq)
        self.last_seen[client] = now
        self._note_seq(client, msg.seq, seq_check)
        out = self._take(client, msg.seq, item, now)
        self.counters.accepted += 1
        self.stats.accepted(client)
        self._note_lag(now - msg.created, now)
        return self._commit(out) if out else out

    def _ahead_of_state(self, msg: Message, now: float) -> list[Message]:
        """An update computed against a global this aggregator never published: its state was lost, replaced
        or restored from an older copy (globals are checkpointed before they leave, so nothing else gets an
        agent there). Taking it would leave the model waiting for uploads the agents no longer hold; it is
        refused, counted (`ahead_of_state`) and said at error level."""
        self.counters.reject("ahead_of_state")
        first = msg.client not in self.ahead
        self.ahead[msg.client] = max(self.ahead.get(msg.client, 0), int(msg.global_version))
        self._ahead_epoch = max(self._ahead_epoch, int(msg.epoch))
        recoverable = self.aggregation.recoverable
        if not self.recover or not recoverable:
            if first:
                log.error("client %r is at global v%d but this aggregator's state is at v%d: the state was lost, "
                          "replaced or restored from an older copy; nothing from clients ahead of it is taken. %s",
                          msg.client, msg.global_version, self.version,
                          "Restart with --recover: a new epoch in which the agents upload their totals again."
                          if recoverable and not self.recover else
                          f"{self.algorithm.name} cannot rebuild its global from its agents: restore the state "
                          "directory, or start the fleet again under a new name.")
            return []
        # Recovery: a global above every version the agents have seen, of a new epoch, nothing included.
        t0 = time.perf_counter()
        version, epoch = max(self.ahead.values()) + 1, self._ahead_epoch + 1
        self.aggregation.rebase(version, epoch)
        log.warning("recovering a lost state: global v%d, epoch %d; %d client(s) were ahead (up to v%d); each is "
                    "taken from the first update it sends now", self.version, epoch, len(self.ahead), version - 1)
        self.tracker = SeqTracker(self.cfg.seq_window)
        self._round.clear()
        self._round_started = self.window_started = None
        self.ahead.clear()
        self.adopting = True
        return self._commit(self._published(now, t0))

    def _note_lag(self, lag: float, now: float) -> None:
        """How old an accepted update was when taken in. Over `LAG_WARNING` seconds the aggregator is behind
        its input (a machine too busy, a fleet too large for one process): said at warning, once a minute,
        with what to do. Agents slow down by themselves (each has a few updates outstanding at most)."""
        self.stats.ingest_lag_s = lag
        if lag > LAG_WARNING and now - self._lag_warned_at >= 60.0:  # checked here: behind, this runs per update
            self._lag_warned_at = now
            self._warn("*", "behind", now, "aggregator %s is %.1f s behind its input: updates wait that long before "
                       "they are taken in (streamfed_aggregator_ingest_lag_seconds); agents coalesce their uploads "
                       "meanwhile — shard the fleet (docs/sharding.md) if it persists", self.cfg.fleet, lag)

    def _warn(self, client: str, reason: str, now: float, fmt: str, *args: Any) -> None:
        """Log a refusal at warning, at most once a minute per client and reason (debug otherwise): loud enough
        to be seen, bounded whatever a hostile client sends."""
        key = (client, reason)
        if now - self._warned.get(key, -float("inf")) < 60.0:
            log.debug(fmt, *args)
            return
        if len(self._warned) >= 10_000:
            self._warned.clear()
        self._warned[key] = now
        log.warning(fmt, *args)

    def on_status(self, client: str, state: str, now: float | None = None) -> list[Message]:
        """An agent went offline (or came back): adjust who a lock-step round waits for."""
        if client not in self.order:
            return []
        self.stats.heard(client)
        note_status(self.expected, self.offline, client, state)
        if self.mode != "lockstep":
            return []
        return self._commit(self._close_ready_rounds(time.time() if now is None else now))

    def tick(self, now: float | None = None) -> list[Message]:
        """Close what a clock closes: lock-step rounds past their timeout (with a quorum), windows."""
        now = time.time() if now is None else now
        if self.secagg is not None:
            return self._secagg_result(*self.secagg.tick(now), now)
        if self.mode == "lockstep":
            return self._commit(self._close_ready_rounds(now))
        if self.window_started is None or now - self.window_started < self.window:
            return []
        return self._commit(self._close_window(now))

    # ------------------------------------------------------------------ secure aggregation
    def _on_secagg(self, topic_client: str, payload: bytes, now: float) -> list[Message]:
        assert self.secagg is not None
        try:
            msg = decode(payload, self.schema, client=topic_client, kinds=SECAGG_UP)
        except ProtocolError as e:
            self.counters.reject(e.reason.value)
            return []
        if self.clients and msg.client not in self.order:
            self.counters.reject("unknown_client")
            return []
        if msg.kind == SECAGG_MASKED and not self.admission.admit(msg.client, msg.n_samples, now):
            # its sample count travels in the clear: the rate limit holds under secure aggregation too (the input is
            # left out of the round — a dropout, its masks cancel — and its updates come in a later one)
            self.counters.reject("rate_limited")
            self._warn(msg.client, "rate_limited", now, "client %r is over its rate (%g samples/s): masked input "
                       "of seq %d left out of the round", msg.client, self.cfg.robust.max_sample_rate, msg.seq)
            return []
        before = sum(self.secagg.rejected.values())
        summed_before = self.secagg.rejected.get("already_summed", 0)
        out, result = self.secagg.on_message(msg, now)
        if sum(self.secagg.rejected.values()) > before:
            self.counters.reject("invalid_secagg")
        if self.secagg.rejected.get("already_summed", 0) > summed_before:
            # it has not seen the global that holds those updates: say what is summed, so that it stops adding them
            # (each round it joins would otherwise leave it out again, and a round of two would fail with it)
            out = [*out, ack_message(self.cfg.fleet, msg.client, self.aggregation.included().get(msg.client, 0), (),
                                     seq=self.version, global_version=self.version)]
        self.last_seen[msg.client] = now
        return self._secagg_result(out, result, now)

    def _secagg_result(self, out: list[Message], result: Any, now: float) -> list[Message]:
        """Fold a round's unmasked sum in, as the reducer folds a partial; returns the messages to publish."""
        if result is None:
            return out
        arrays, n_clients, included, samples, epoch = result
        t0 = time.perf_counter()
        partial = Message(self.cfg.fleet, self.sender, self.cfg.partial_kind, 0, self.version, self.kernel_version,
                          int(samples), now, arrays, epoch=int(epoch))
        try:
            total = self.aggregation.read_partial(partial)
            # the declared bounds, on the sum: what its members said in the clear (n_samples) must be what they
            # summed, and the sum must be one honest uploads of that many samples can make (issue 30)
            self.aggregation.check_sum(total, int(samples))
        except ValueError as e:  # e.g. a count that is not whole: a member lied about its upload
            self.counters.reject("invalid_sum")
            log.warning("secure aggregation: a round's sum of %d member(s) was refused: %s (one of them lied about "
                        "its upload; which one, masking hides)", n_clients, e)
            return out
        marks = self.aggregation.included()
        for c, s in included.items():
            marks[c] = max(int(s), marks.get(c, 0))
        self.aggregation.apply_partial(total, int(n_clients), marks)
        self.counters.accepted += int(n_clients)
        for c in included:
            self.stats.accepted(c)
        return self._commit(out + self._published(now, t0))

    def hello(self) -> list[Message]:
        """Acks for every known client, sent when the shell (re)connects: each says which seqs this
        aggregator holds (`included`: all up to it) so an agent sends again whatever came after —
        updates lost in a crash before they were checkpointed, or queued nowhere."""
        out = []
        for c in sorted(set(self.clients) | set(self.tracker.clients)):
            missing = self.tracker.missing(c)[: self.cfg.seq_window]
            out.append(ack_message(self.cfg.fleet, c, self.tracker.mark(c), missing, seq=self.version,
                                   global_version=self.version))
        return out

    def _commit(self, out: list[Message]) -> list[Message]:
        """Write-ahead: the state behind a new global is checkpointed before the global is handed out."""
        if self.checkpoint is not None and any(m.kind != "ack" for m in out):
            self.checkpoint(self)
        return out

    def _note_seq(self, client: str, seq: int, checked: SeqCheck | None = None) -> None:
        check = self.tracker.record(client, seq) if checked is None else self.tracker.commit(client, seq, checked)
        if check.new_gap is not None:
            self.counters.gaps += 1
            log.info("client %r: seqs %d..%d missing (got %d)", client, *check.new_gap, seq)

    # ------------------------------------------------------------------ rounds and windows
    def _take(self, client: str, seq: int, item: Any, now: float) -> list[Message]:
        if self.mode == "lockstep":
            self._round[seq][client] = item
            if self._round_started is None:
                self._round_started = now
            return self._close_ready_rounds(now)
        self.aggregation.take(client, seq, item)
        if self.window_started is None:
            self.window_started = now
        if self.window <= 0:
            return self._close_window(now)
        return []

    def _close_ready_rounds(self, now: float) -> list[Message]:
        out: list[Message] = []
        while True:
            r = self.version + 1
            got = self._round.get(r, {})
            complete = bool(got) and self.expected <= set(got)
            timed_out = (self.quorum is not None and len(got) >= self.quorum and self._round_started is not None
                         and now - self._round_started >= self.round_timeout)
            if not (complete or timed_out):
                return out
            t0 = time.perf_counter()
            clients = sorted(got, key=self.order.__getitem__)  # the fleet's order: same sums as the replay
            self.aggregation.apply_round(r, [(c, got[c]) for c in clients])
            del self._round[r]
            self._round_started = now if self._round.get(r + 1) else None
            out += self._published(now, t0)

    def _close_window(self, now: float) -> list[Message]:
        t0 = time.perf_counter()
        changed = self.aggregation.close_window(self.order, self.tracker.mark)
        self.window_started = None
        return self._published(now, t0) if changed else []

    def warm_up(self) -> None:
        """One aggregation on a throw-away copy (numba dispatch and cache loading happen here, not in the
        first window of a live run) and one global encoded. Changes nothing here."""
        self.aggregation.warm_up()
        encode(self.global_message())

    # ------------------------------------------------------------------ output
    def global_message(self) -> Message:
        """The current global as a message (retained on the global topic)."""
        return self.aggregation.global_message(self.cfg.fleet, self.sender, self.kernel_version)

    def _published(self, now: float, t0: float) -> list[Message]:
        self.counters.rounds += 1
        self.counters.last_round_at = now
        lat = self.counters.aggregation_seconds
        lat.append(time.perf_counter() - t0)
        self.stats.round_completed(self.version, lat[-1], aggregation_diagnostics(self.aggregation))
        if len(lat) > 4096:
            del lat[:2048]
        out = [self.global_message()]
        for c in self.tracker.clients:  # tell clients with gaps which seqs are missing
            missing = self.tracker.missing(c)
            if missing:
                out.append(ack_message(self.cfg.fleet, c, self.tracker.mark(c), missing[: self.cfg.seq_window],
                                       seq=self.version, global_version=self.version))
        return out

    def state(self) -> dict[str, Any]:
        missing = {c: m for c in self.tracker.clients if (m := self.tracker.missing(c))}
        return {"version": self.version, "accepted": self.counters.accepted, "rejected": self.rejected,
                "rounds": self.counters.rounds, "gaps": self.counters.gaps, "missing": missing}

    # ------------------------------------------------------------------ durable state
    def snapshot(self) -> dict[str, Any]:
        """Everything needed to resume exactly here (:meth:`restore`); taken before each new global. The
        aggregation travels whole (its global, its open window); pending lock-step rounds hold the
        aggregation's own validated items."""
        c = self.counters
        return {
            "format": AGGREGATOR_STATE_FORMAT,
            "fleet_config": self.cfg.model_dump(mode="json"),
            "mode": self.mode, "clients": list(self.clients),
            "aggregation": self.aggregation,
            "tracker": self.tracker.to_dict(),
            "round": {r: dict(got) for r, got in self._round.items()},
            "expected": sorted(self.expected),
            "counters": {"accepted": c.accepted, "rejected": dict(c.rejected), "rounds": c.rounds, "gaps": c.gaps},
            "admission": self.admission.to_dict(),
            "adopting": self.adopting,
        }

    def restore(self, state: Mapping[str, Any], now: float | None = None) -> None:
        """Resume from a :meth:`snapshot`. `ValueError` if it belongs to another format, fleet
        configuration, mode or client list (nothing is changed then). Pending rounds and an open window
        restart their clocks at `now`."""
        if state.get("format") != AGGREGATOR_STATE_FORMAT:
            raise ValueError(f"aggregator state format {state.get('format')!r}, expected {AGGREGATOR_STATE_FORMAT}")
        if not same_fleet(state.get("fleet_config"), self.cfg):
            raise ValueError("aggregator state was written for a different fleet configuration")
        if (state.get("mode"), list(state.get("clients", []))) != (self.mode, self.clients):
            raise ValueError(f"aggregator state is for mode {state.get('mode')!r} and clients {state.get('clients')}, "
                             f"this aggregator runs {self.mode!r} with {self.clients}")
        aggregation = state["aggregation"]
        if type(aggregation) is not type(self.aggregation):
            raise ValueError(f"aggregator state holds a {type(aggregation).__name__}, "
                             f"expected {type(self.aggregation).__name__}")
        tracker = SeqTracker.from_dict(state["tracker"])
        now = time.time() if now is None else now
        self.aggregation, self.tracker = aggregation, tracker
        self._round = defaultdict(dict, {int(r): dict(got) for r, got in state["round"].items()})
        self.expected = set(state["expected"])
        counters = state["counters"]
        self.counters.accepted, self.counters.rounds = int(counters["accepted"]), int(counters["rounds"])
        self.counters.rejected = dict(counters["rejected"])
        self.counters.gaps = int(counters["gaps"])
        self.admission.load(state.get("admission", {}))
        self.adopting = bool(state.get("adopting", False))
        self._round_started = now if self._round else None
        self.window_started = now if self.aggregation.pending() else None
        self.stats.set_global_version(self.version)
