"""The aggregator's pure core: validate, deduplicate, aggregate, version. No I/O — the MQTT shell
(`streamfed.runtime.aggregator`) feeds it payloads and a clock and publishes what it returns.

POF-MKL
    ``lockstep``: round `r` is the set of seq-`r` updates; it closes when every expected client's is
    in (clients that announced `offline` are no longer expected), or — with a `quorum` — when the
    round timeout has passed and at least `quorum` are in. Updates are added in the fleet's client
    order, so the global equals the replay's bit for bit. Updates for later rounds wait (bounded by
    the sequence window). ``async``: whatever arrives within a window is one round, `C` = the clients
    heard, a client's several messages in one window are summed (:func:`merge_updates`).
FedBNR
    every valid upload is summed once (the server buffers out-of-order seqs); a new global is
    published at the end of a window in which something was summed.

Every rejection has a reason (a :class:`~streamfed.protocol.Reason` value, or ``invalid_update`` /
``unknown_client`` / ``late``) counted in :attr:`AggregatorCore.rejected`; nothing rejected reaches
the model.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .config import FleetConfig
from .fleet import kernel_version, make_server
from .learners.fedbnr import Upload
from .learners.pofmkl import KernelUpdate, merge_updates
from .metrics import AggregatorStats
from .protocol import (
    Message,
    ProtocolError,
    SeqTracker,
    ack_message,
    decode,
    fedbnr_global_message,
    pofmkl_global_message,
    stats_fields,
)

__all__ = ["AggregatorCore"]

Mode = Literal["lockstep", "async"]


@dataclass
class AggregatorCounters:
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    last_round_at: float = 0.0
    aggregation_seconds: list[float] = field(default_factory=list)  # recent, bounded

    stats: AggregatorStats | None = None

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if self.stats is not None:
            self.stats.rejected(reason)


class AggregatorCore:
    """Transport-free aggregator of one fleet.

    >>> import numpy as np
    >>> from streamfed.config import FleetConfig
    >>> from streamfed.protocol import encode, pofmkl_update_message
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=1)
    >>> agg = AggregatorCore(cfg, clients=["a", "b"], mode="lockstep")
    >>> def up(c): return encode(pofmkl_update_message("f", c, 1, np.array([0]), np.ones((1, 2)),
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
                 sender: str = "aggregator", stats: AggregatorStats | None = None) -> None:
        self.cfg = cfg
        self.pofmkl = cfg.algorithm == "pofmkl"
        self.mode: Mode = mode if self.pofmkl else "async"
        if self.mode == "lockstep" and not clients:
            raise ValueError("lock-step rounds need the list of the fleet's clients")
        self.clients = list(clients or [])
        self.order = {c: i for i, c in enumerate(self.clients)}
        self.expected = set(self.clients)
        self.quorum = quorum
        self.round_timeout = round_timeout
        self.window = window
        self.sender = sender
        self.server = make_server(cfg)
        self.kernel_version = kernel_version(cfg)
        self.tracker = SeqTracker(cfg.seq_window)
        self.schema = cfg.protocol_schema  # resolved once: decode runs for every payload
        self._update_kinds = (cfg.update_kind,)
        self.counters = AggregatorCounters()
        self.stats = stats or AggregatorStats(cfg.fleet)
        self.counters.stats = self.stats
        self._round: dict[int, dict[str, KernelUpdate]] = defaultdict(dict)  # lock-step: round → client → upd
        self._round_started: float | None = None
        self._heard: dict[str, list[KernelUpdate]] = defaultdict(list)  # async POF-MKL window
        self._window_started: float | None = None
        self._dirty = False  # FedBNR: something summed since the last global
        self.last_seen: dict[str, float] = {}
        self._applied: dict[str, int] = {}  # POF-MKL: per client, the highest seq in the global

    # ------------------------------------------------------------------ state
    @property
    def version(self) -> int:
        return int(self.server.version)

    @property
    def rejected(self) -> dict[str, int]:
        return dict(self.counters.rejected)

    def included(self) -> dict[str, int]:
        """Per client, every seq up to this one is in the current global."""
        if self.pofmkl:
            return {c: self._applied.get(c, 0) for c in sorted(self._applied)}
        return dict(self.server.included)

    # ------------------------------------------------------------------ inputs
    def on_update(self, topic_client: str, payload: bytes, now: float | None = None) -> list[Message]:
        """Validate and take in one update payload; returns messages to publish (globals, acks)."""
        now = time.time() if now is None else now
        try:
            msg = decode(payload, self.schema, kernel_version=self.kernel_version, client=topic_client,
                         kinds=self._update_kinds)
            if self.clients and msg.client not in self.order:
                self.counters.reject("unknown_client")
                return []
            self.tracker.check(msg.client, msg.seq)
        except ProtocolError as e:
            self.counters.reject(e.reason.value)
            return []
        self.last_seen[msg.client] = now
        try:
            out = self._take_pofmkl(msg, now) if self.pofmkl else self._take_stats(msg, now)
        except ValueError:  # well-formed but unusable (e.g. below the privacy floor)
            self.counters.reject("invalid_update")
            return []
        self.counters.accepted += 1
        self.stats.accepted(msg.client)
        return out

    def on_status(self, client: str, state: str, now: float | None = None) -> list[Message]:
        """An agent went offline (or came back): adjust who a lock-step round waits for."""
        if client not in self.order:
            return []
        self.stats.heard(client)
        if state == "offline":
            self.expected.discard(client)
        else:
            self.expected.add(client)
        return self._close_ready_rounds(time.time() if now is None else now)

    def tick(self, now: float | None = None) -> list[Message]:
        """Close what a clock closes: lock-step rounds past their timeout (with a quorum), windows."""
        now = time.time() if now is None else now
        if self.mode == "lockstep":
            return self._close_ready_rounds(now)
        if self._window_started is None or now - self._window_started < self.window:
            return []
        return self._close_window(now)

    # ------------------------------------------------------------------ POF-MKL
    def _take_pofmkl(self, msg: Message, now: float) -> list[Message]:
        # the decoded read-only views are enough: the server only reads an update (no copy per message)
        update = KernelUpdate(msg.arrays["kernels"], msg.arrays["delta"], msg.n_samples)
        if self.mode == "lockstep":
            r = msg.seq
            if r <= self.version:  # its round is closed (it was left out after a timeout)
                self.counters.reject("late")
                return []
            self.tracker.record(msg.client, msg.seq)
            self._round[r][msg.client] = update
            if self._round_started is None:
                self._round_started = now
            return self._close_ready_rounds(now)
        self.tracker.record(msg.client, msg.seq)
        self._heard[msg.client].append(update)
        if self._window_started is None:
            self._window_started = now
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
            for c in sorted(got, key=self.order.__getitem__):  # the fleet's order: same sums as the replay
                self.server.add(got[c])
                self._applied[c] = max(self._applied.get(c, 0), r)
            self.server.finish_round()
            del self._round[r]
            self._round_started = now if self._round.get(r + 1) else None
            out += self._published(now, t0)

    def _close_window(self, now: float) -> list[Message]:
        t0 = time.perf_counter()
        out: list[Message] = []
        if self.pofmkl and self._heard:
            clients = sorted(self._heard, key=lambda c: self.order.get(c, len(self.order)))
            for c in clients:
                self.server.add(merge_updates(self._heard[c]))
                self._applied[c] = self.tracker.mark(c)
            self._heard.clear()
            self.server.finish_round()
            out = self._published(now, t0)
        elif not self.pofmkl and self._dirty:
            self.server.publish()
            self._dirty = False
            out = self._published(now, t0, already=True)
        self._window_started = None
        return out

    # ------------------------------------------------------------------ FedBNR
    def _take_stats(self, msg: Message, now: float) -> list[Message]:
        up = Upload.from_message(stats_fields(msg))
        if self.server.apply(up):
            self.tracker.record(msg.client, msg.seq)
            self._dirty = True
        if self._window_started is None:
            self._window_started = now
        if self.window <= 0:
            return self._close_window(now)
        return []

    # ------------------------------------------------------------------ output
    def global_message(self) -> Message:
        """The current global as a message (retained on the global topic)."""
        if self.pofmkl:
            return pofmkl_global_message(self.cfg.fleet, self.sender, self.server.theta, self.version,
                                         kernel_version=self.kernel_version, included=self.included())
        s = self.server
        packed = s.stats.to_packed()
        return fedbnr_global_message(self.cfg.fleet, self.sender, s.version, packed["S_upper"], packed["b"],
                                     packed["n"], packed["q"], s.sigma, s.lam, s.log_evidence, dict(s.included),
                                     kernel_version=self.kernel_version, epoch=s.epoch)

    def _published(self, now: float, t0: float, already: bool = False) -> list[Message]:
        self.counters.rounds += 1
        self.counters.last_round_at = now
        lat = self.counters.aggregation_seconds
        lat.append(time.perf_counter() - t0)
        self.stats.round_completed(self.version, lat[-1])
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
        return {"version": self.version, "accepted": self.counters.accepted, "rejected": self.rejected,
                "rounds": self.counters.rounds}
