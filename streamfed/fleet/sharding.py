"""Sharded aggregation: several aggregator shards and one reducer (docs/architecture.md). Pure cores,
no I/O; the MQTT shells are in :mod:`streamfed.runtime.shard`.

Aggregation is a sum (FedBNR statistics) or a sum plus a count (POF-MKL: ``θ ← θ − ΣΔ/|C|``), so it
splits exactly; the algorithm's :class:`~streamfed.algorithms.base.Aggregation` says how (``partial``,
``read_partial``, ``combine_partials``, ``apply_partial``) and these cores never ask which algorithm they run.
An aggregation with a ``round_kind`` (POF-MKL) has lock-step shards send a round as its updates themselves
(``round_partial``), which the reducer adds in the fleet's client order. Shards share the
update stream through an MQTT v5 shared subscription (``$share/<group>/streamfed/v1/<fleet>/updates/+``):
the broker hands each update to one shard. A :class:`ShardCore` validates it exactly as the single
aggregator does (same codec, same checks, same reject reasons), deduplicates, and adds it to a
*partial*: the algorithm's sum of the updates (a dense ``Σ Δ``, summed statistics) plus the list of
``(client, seq)`` pairs it contains. Every tick it publishes its partials on ``…/partials/<shard>``. The
:class:`ReducerCore` adds partials and closes rounds exactly as the single aggregator would: a lock-step
round when every expected client's seq-`r` update is in (from whichever shard), an asynchronous window
by the clock. It publishes the global (retained, versioned, with `included`) that agents and shards both
read.

Exactly once: a client may send an update twice (after a reconnect, or because an ack listed it as
missing) and the copies may reach different shards. The reducer therefore knows every `(client, seq)`
it has applied and refuses a partial that repeats one; its ``partial.ack`` lists the repeated pairs and
the shard, which keeps the updates of each partial until it is acknowledged, sends a new partial
without them. A partial sent again after a reconnect (same shard, same partial seq) is acknowledged
without being added twice.

The result equals the single aggregator's: bit for bit for an aggregation with a ``round_kind`` in lock-step
(POF-MKL: the same additions in the same order), otherwise up to the order of floating-point additions
(tested: FedBNR, relative difference below 1e-12).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from streamfed import algorithms
from streamfed.algorithms.base import Mode, aggregation_diagnostics
from streamfed.core.durable import durable
from streamfed.fleet.admission import Admission
from streamfed.fleet.aggregator import note_status, roster
from streamfed.fleet.config import FleetConfig, same_fleet
from streamfed.fleet.sequences import SeqTracker
from streamfed.fleet.telemetry import AggregatorStats
from streamfed.wire.message import Message, ProtocolError, ack_message, decode

__all__ = ["Contribution", "ShardCore", "ReducerCore", "contributors_fields", "contributors_of"]

log = logging.getLogger(__name__)
REDUCER_STATE_FORMAT = 2


# =========================================================================== contributor lists


def contributors_fields(pairs: Iterable[tuple[str, int]]) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
    """`(client, seq)` pairs as a message carries them: `included` = {client: highest seq} (its sorted
    names are what `owner` indexes), `owner` and `seqs` int64 arrays.

    >>> inc, owner, seqs = contributors_fields([("b", 3), ("a", 1), ("b", 2)])
    >>> inc, owner.tolist(), seqs.tolist()
    ({'a': 1, 'b': 3}, [0, 1, 1], [1, 2, 3])
    >>> contributors_of(Message("f", "s", "partial.ack", 0, included=inc,
    ...                         arrays={"owner": owner, "seqs": seqs}))
    [('a', 1), ('b', 2), ('b', 3)]
    """
    pairs = sorted(set(pairs))  # by client, then seq: a client's last pair holds its highest seq
    included = dict(pairs)
    index = {c: i for i, c in enumerate(included)}  # dict order is sorted order here
    owner = np.fromiter((index[c] for c, _ in pairs), dtype=np.int64, count=len(pairs))
    seqs = np.fromiter((s for _, s in pairs), dtype=np.int64, count=len(pairs))
    return included, owner, seqs


def contributors_of(msg: Message) -> list[tuple[str, int]]:
    """The `(client, seq)` pairs of a partial or partial ack, sorted; `ProtocolError`-free `ValueError` when
    the lists are inconsistent (an owner out of range, a repeated pair, a name without pairs, a wrong max).
    Checked with array operations (a partial holds hundreds of pairs); only the returned list is per pair."""
    names = sorted(msg.included)
    owner = np.asarray(msg.arrays["owner"], dtype=np.int64)
    seqs = np.asarray(msg.arrays["seqs"], dtype=np.int64)
    if owner.shape != seqs.shape or owner.ndim != 1:
        raise ValueError("owner and seqs differ in shape")
    if owner.size and (int(owner.min()) < 0 or int(owner.max()) >= len(names)):
        raise ValueError(f"owner index out of the range of the {len(names)} names")
    order = np.lexsort((seqs, owner))  # by name (owner indexes sorted names), then seq
    o, q = owner[order], seqs[order]
    if o.size > 1 and bool(np.any((o[1:] == o[:-1]) & (q[1:] == q[:-1]))):
        raise ValueError("a (client, seq) pair is repeated")
    # each name's last pair (sorted) holds its highest seq; every name needs pairs, with that maximum
    last = np.flatnonzero(np.append(o[1:] != o[:-1], True)) if o.size else o
    if o[last].tolist() != list(range(len(names))) or q[last].tolist() != [msg.included[c] for c in names]:
        raise ValueError("included does not match the highest seq of each contributor")
    return [(names[i], s) for i, s in zip(o.tolist(), q.tolist(), strict=True)]


# =========================================================================== shard


@dataclass
class Contribution:
    """One validated update held by a shard until the reducer acknowledges the partial holding it."""

    client: str
    seq: int
    item: Any  # what the algorithm's Aggregation.check returned


@durable("fleet.Partial")
@dataclass
class _Partial:
    seq: int
    round: int
    items: list[Contribution]
    sent_at: float


@dataclass
class _Counters:
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    partials: int = 0
    resent: int = 0


class ShardCore:
    """One aggregator shard: validates updates, sums them into partials, resends refused parts.

    >>> import numpy as np
    >>> from streamfed.fleet.config import FleetConfig
    >>> from streamfed.wire.message import encode
    >>> from streamfed.algorithms.pofmkl.wire import update_message
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=1)
    >>> shard = ShardCore(cfg, "s1", clients=["a", "b"])
    >>> up = encode(update_message("f", "a", 1, np.array([0]), np.ones((1, 2)),
    ...                            global_version=0, kernel_version=shard.kernel_version))
    >>> shard.on_update("a", up, now=0.0), shard.on_update("a", up, now=0.0), shard.rejected
    ([], [], {'stale_seq': 1})
    >>> [(m.kind, m.meta["round"], m.arrays["kernels"].tolist(), m.arrays["delta"].tolist())
    ...  for m in shard.flush(now=0.0)]  # a lock-step POF-MKL round travels as its updates (round_kind)
    [('pofmkl.round', 1, [0], [[1.0, 1.0]])]
    """

    def __init__(self, cfg: FleetConfig, name: str, clients: Sequence[str] | None = None,
                 mode: Mode = "lockstep", *, max_abs: float = 1e100, check_stats: bool = True,
                 stats: AggregatorStats | None = None, max_unacked: int = 10_000, resend_after: float = 5.0) -> None:
        if cfg.secure_aggregation:  # a shard would see masked vectors it cannot sum apart from the others
            raise ValueError("secure aggregation runs with a single aggregator, not sharded (docs/privacy.md)")
        if cfg.robust.aggregation == "robust":  # a robust rule needs each client's upload, not partial sums
            raise ValueError("robust aggregation runs with a single aggregator, not sharded (docs/reliability.md)")
        self.cfg = cfg
        self.name = name
        self.resend_after = float(resend_after)  # a partial not acknowledged by then is sent again
        self.algorithm = algorithms.get(cfg.algorithm)
        self.mode: Mode = mode if self.algorithm.lockstep else "async"
        # The single aggregator's validation (same checks, same reasons); this aggregation is only asked to
        # check updates and to sum them into partials, never to fold anything into a global.
        self.aggregation = self.algorithm.aggregation(cfg, max_abs=max_abs,
                                                      check_stats=check_stats and cfg.dp_epsilon is None)
        self.aggregation.for_partials("shard")
        self.stats = stats or AggregatorStats(cfg.fleet)
        self.admission = Admission(cfg.robust)  # each shard holds the clients it hears from to their rates
        self.clients = list(clients or [])
        self.order = {c: i for i, c in enumerate(self.clients)}
        self.kernel_version = self.algorithm.kernel_version(cfg)
        self.schema = cfg.protocol_schema
        self._kinds = (cfg.update_kind,)
        # a lock-step round whose sum depends on the order of additions goes as its updates (round_kind)
        self._rounds_as_updates = self.mode == "lockstep" and self.aggregation.round_kind is not None
        self.partial_kind = self.aggregation.round_kind if self._rounds_as_updates else cfg.partial_kind
        # a partial holds at most as many contributors as its kind's contributor lists may (a longer round: several)
        self._per_partial = self.schema.kinds[self.partial_kind].dims.get("c", (0, 1 << 62))[1]
        self.version = 0  # of the newest global seen
        self._mark: dict[str, int] = {}  # per client: every seq up to it is in the reducer's global
        self._seen: dict[str, set[int]] = defaultdict(set)  # seqs this shard holds (pending or unacknowledged)
        self._pending: dict[int, list[Contribution]] = defaultdict(list)  # round (0: async) → not yet sent
        self._unacked: dict[int, _Partial] = {}  # partial seq → what it holds
        self._next_seq = 1
        self._held = 0  # updates in _pending and _unacked (checked on every update: kept, not recounted)
        self.max_unacked = int(max_unacked)
        self.counters = _Counters()

    @property
    def rejected(self) -> dict[str, int]:
        return dict(self.counters.rejected)

    def reject(self, reason: str) -> None:
        self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1
        self.stats.rejected(reason)

    @property
    def held(self) -> int:
        """Updates held: pending or in partials not acknowledged yet."""
        return self._held

    # ------------------------------------------------------------------ inputs
    def on_update(self, topic_client: str, payload: bytes, now: float | None = None) -> list[Message]:
        """Validate one update and hold it for the next partial (never raises; rejects are counted)."""
        try:
            msg = decode(payload, self.schema, kernel_version=self.kernel_version, client=topic_client,
                         kinds=self._kinds)
        except ProtocolError as e:
            self.reject(e.reason.value)
            return []
        if self.clients and msg.client not in self.order:
            self.reject("unknown_client")
            return []
        mark = self._mark.get(msg.client, 0)
        if msg.seq <= mark or msg.seq in self._seen[msg.client]:
            self.reject("stale_seq")
            return []
        if msg.seq - mark > self.cfg.seq_window or msg.seq < 1:
            self.reject("invalid_update")
            return []
        if self.mode == "lockstep" and msg.seq <= self.version:
            self.reject("late")
            return []
        try:
            item = self.aggregation.check(msg)
        except ValueError as e:
            self.reject("invalid_update")
            log.debug("shard %s: update from %r seq %d rejected: %s", self.name, msg.client, msg.seq, e)
            return []
        if self.held >= self.max_unacked:  # the reducer is gone: refuse rather than grow; agents resend
            self.reject("shard_full")
            return []
        if not self.admission.admit(msg.client, msg.n_samples, time.time() if now is None else now):
            self.reject("rate_limited")  # as the single aggregator (fleet/admission.py); agents resend
            return []
        self._seen[msg.client].add(msg.seq)
        rnd = msg.seq if self.mode == "lockstep" else 0
        self._pending[rnd].append(Contribution(msg.client, msg.seq, item))
        self._held += 1
        self.counters.accepted += 1
        self.stats.accepted(msg.client)
        return []

    def on_global(self, msg: Message) -> None:
        """A global from the reducer (decoded): its version, and per client the mark every seq up to which is
        in it (an update at or below the mark is refused before `_seen` is consulted)."""
        self.version = max(self.version, int(msg.global_version))
        for c, s in msg.included.items():
            if s > self._mark.get(c, 0):
                self._mark[c] = int(s)

    def on_ack(self, msg: Message, now: float | None = None) -> list[Message]:
        """A `partial.ack`: drop an applied partial; rebuild a refused one without the repeated pairs."""
        now = time.time() if now is None else now
        part = self._unacked.pop(int(msg.meta["partial"]), None)
        if part is None:
            return []
        self._held -= len(part.items)
        # From here the reducer is the authority on these pairs (it refuses repeats): forget them, so that an
        # agent's resend after a reducer restart (which may have lost them) is taken in again, not dropped.
        for c in part.items:
            self._seen[c.client].discard(c.seq)
        if msg.meta["applied"]:
            return []
        try:
            dup = set(contributors_of(msg))
        except ValueError as e:
            log.warning("shard %s: malformed partial ack (%s); sending partial %d again", self.name, e, part.seq)
            dup = set()
        rest = [c for c in part.items if (c.client, c.seq) not in dup]
        self._held += len(rest)
        for c in rest:
            self._seen[c.client].add(c.seq)
        self.counters.resent += 1
        return [self._send(part.round, rest, now)] if rest else []

    # ------------------------------------------------------------------ outputs
    def flush(self, now: float | None = None) -> list[Message]:
        """Everything pending as partials (one per lock-step round), kept until acknowledged, and partials
        waiting for an acknowledgement longer than `resend_after`."""
        now = time.time() if now is None else now
        # Not acknowledged in time (the reducer restarted before taking it, say): the same partial again; the
        # reducer acknowledges a repeat of one it has without adding it twice.
        out = []
        for part in self._unacked.values():
            if now - part.sent_at >= self.resend_after:
                part.sent_at = now
                self.counters.resent += 1
                out.append(self._message(part))
        cap = self._per_partial
        out += [self._send(r, items[i:i + cap], now) for r, items in sorted(self._pending.items())
                for i in range(0, len(items), cap)]
        self._pending.clear()
        return out

    def unacked(self) -> list[Message]:
        """The partials not acknowledged yet, again (after a reconnect): the reducer dedupes them."""
        return [self._message(p) for _, p in sorted(self._unacked.items())]

    def _send(self, rnd: int, items: list[Contribution], now: float) -> Message:
        part = _Partial(self._next_seq, rnd, items, now)
        self._next_seq += 1
        self._unacked[part.seq] = part
        self.counters.partials += 1
        return self._message(part)

    def _message(self, part: _Partial) -> Message:
        included, owner, seqs = contributors_fields((c.client, c.seq) for c in part.items)
        if self._rounds_as_updates:  # each update's arrays, in the order of owner/seqs (sorted pairs)
            items = sorted(part.items, key=lambda c: (c.client, c.seq))
            arrays, n, epoch = self.aggregation.round_partial([c.item for c in items])
        else:
            arrays, n, epoch = self.aggregation.partial([c.item for c in part.items])
        arrays = {**arrays, "owner": owner, "seqs": seqs}
        return Message(self.cfg.fleet, self.name, self.partial_kind, part.seq, global_version=self.version,
                       kernel_version=self.kernel_version, n_samples=min(n, 2**63 - 1), created=part.sent_at,
                       arrays=arrays, meta={"round": part.round}, included=included, epoch=epoch)


# =========================================================================== reducer


class ReducerCore:
    """Combines the shards' partials into the global, round by round or window by window.

    >>> import numpy as np
    >>> from streamfed.fleet.config import FleetConfig
    >>> from streamfed.wire.message import encode
    >>> from streamfed.algorithms.pofmkl.wire import update_message
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=1)
    >>> s1, s2 = ShardCore(cfg, "s1", ["a", "b"]), ShardCore(cfg, "s2", ["a", "b"])
    >>> red = ReducerCore(cfg, clients=["a", "b"])
    >>> def up(c): return encode(update_message("f", c, 1, np.array([1]), np.ones((1, 2)),
    ...                          global_version=0, kernel_version=red.kernel_version))
    >>> _ = s1.on_update("a", up("a")), s2.on_update("b", up("b"))
    >>> [m.kind for p in s1.flush() for m in red.on_partial("s1", encode(p), now=0.0)]
    ['partial.ack']
    >>> [m.kind for p in s2.flush() for m in red.on_partial("s2", encode(p), now=0.0)]
    ['partial.ack', 'pofmkl.global']
    >>> red.version, red.global_message().arrays["theta"][1].tolist()
    (1, [-1.0, -1.0])
    """

    def __init__(self, cfg: FleetConfig, clients: Sequence[str] | None = None, mode: Mode = "lockstep", *,
                 window: float = 0.5, sender: str = "reducer", offline: Literal["drop", "wait"] = "drop",
                 stats: AggregatorStats | None = None, shards: Sequence[str] | None = None) -> None:
        if cfg.secure_aggregation:  # a shard would see masked vectors it cannot sum apart from the others
            raise ValueError("secure aggregation runs with a single aggregator, not sharded (docs/privacy.md)")
        if cfg.robust.aggregation == "robust":  # a robust rule needs each client's upload, not partial sums
            raise ValueError("robust aggregation runs with a single aggregator, not sharded (docs/reliability.md)")
        self.cfg = cfg
        self.algorithm = algorithms.get(cfg.algorithm)
        self.mode, self.clients, self.order, self.expected = roster(clients, mode, offline, self.algorithm.lockstep)
        self.offline = offline  # see note_status
        self.window = window
        self.sender = sender
        self.shards = set(shards) if shards else None  # None: any shard name
        self.aggregation = self.algorithm.aggregation(cfg)
        self.aggregation.for_partials("reducer")
        self.kernel_version = self.algorithm.kernel_version(cfg)
        self.schema = cfg.protocol_schema
        # what the shards send (ShardCore.partial_kind): a lock-step round of a round_kind family as its updates
        round_kind = self.aggregation.round_kind if self.mode == "lockstep" else None
        self.partial_kind = round_kind or cfg.partial_kind
        self._kinds = (self.partial_kind,)
        self.stats = stats or AggregatorStats(cfg.fleet)
        self.applied = SeqTracker(cfg.seq_window)  # (client, seq) pairs summed (in a round or window)
        self.partials = SeqTracker(1 << 20)  # (shard, partial seq) pairs applied
        self.rejected: dict[str, int] = {}
        self.accepted = 0  # updates applied, over all partials
        self.rounds = 0
        self._round: dict[int, tuple[Any, set[str]]] = {}  # lock-step round → (Σ, clients)
        self._round_pairs: dict[int, set[tuple[str, int]]] = defaultdict(set)
        self._win_sum: Any = None  # the open window's sum (the aggregation's partial sum type)
        self._win_clients: set[str] = set()
        self._win_started: float | None = None
        # Write-ahead durability: the shell sets it; called with this core before each new global is built.
        self.checkpoint: Callable[[ReducerCore], None] | None = None

    @property
    def version(self) -> int:
        return self.aggregation.version

    # ------------------------------------------------------------------ durable state
    def snapshot(self) -> dict[str, Any]:
        """Everything needed to resume exactly here (:meth:`restore`); taken before each new global.

        What it does not hold comes back by itself: partial sums acknowledged after the last global are
        lost with the process, and the agents send those updates again (they keep every update until a
        global includes it, and the restarted reducer's acks say which it holds); shards hold no
        acknowledged update, so they take the resends in again."""
        return {
            "format": REDUCER_STATE_FORMAT, "fleet_config": self.cfg.model_dump(mode="json"),
            "mode": self.mode, "clients": list(self.clients), "aggregation": self.aggregation,
            "applied": self.applied.to_dict(), "partials": self.partials.to_dict(),
            "rejected": dict(self.rejected), "accepted": self.accepted, "rounds": self.rounds,
            "round": {r: (total, sorted(who)) for r, (total, who) in self._round.items()},
            "round_pairs": {r: sorted(p) for r, p in self._round_pairs.items()},
            "window": None if self._win_sum is None else (self._win_sum, sorted(self._win_clients)),
            "expected": sorted(self.expected),
        }

    def restore(self, state: Mapping[str, Any], now: float | None = None) -> None:
        """Resume from a :meth:`snapshot`; `ValueError` (nothing changed) for another format, fleet
        configuration, mode or client list. An open window restarts its clock at `now`."""
        if state.get("format") != REDUCER_STATE_FORMAT:
            raise ValueError(f"reducer state format {state.get('format')!r}, expected {REDUCER_STATE_FORMAT}")
        if not same_fleet(state.get("fleet_config"), self.cfg):
            raise ValueError("reducer state was written for a different fleet configuration")
        if (state.get("mode"), list(state.get("clients", []))) != (self.mode, self.clients):
            raise ValueError(f"reducer state is for mode {state.get('mode')!r} and clients {state.get('clients')}, "
                             f"this reducer runs {self.mode!r} with {self.clients}")
        if type(state["aggregation"]) is not type(self.aggregation):
            raise ValueError(f"reducer state holds a {type(state['aggregation']).__name__}")
        applied, partials = SeqTracker.from_dict(state["applied"]), SeqTracker.from_dict(state["partials"])
        self.aggregation, self.applied, self.partials = state["aggregation"], applied, partials
        self.rejected, self.accepted = dict(state["rejected"]), int(state["accepted"])
        self.rounds = int(state["rounds"])
        self._round = {int(r): (total, set(who)) for r, (total, who) in state["round"].items()}
        self._round_pairs = defaultdict(set, {int(r): {(str(c), int(q)) for c, q in p}
                                              for r, p in state["round_pairs"].items()})
        win = state["window"]
        self._win_sum, self._win_clients = (None, set()) if win is None else (win[0], set(win[1]))
        self._win_started = None if win is None else (time.time() if now is None else now)
        self.expected = set(state["expected"])

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.stats.rejected(reason)

    def included(self) -> dict[str, int]:
        """Per client, every seq up to this one is in the current global."""
        return {c: self.applied.mark(c) for c in self.applied.clients}

    # ------------------------------------------------------------------ inputs
    def on_partial(self, shard: str, payload: bytes, now: float | None = None) -> list[Message]:
        """Take one partial; returns its `partial.ack` and any global it completes. Never raises."""
        now = time.time() if now is None else now
        if self.shards is not None and shard not in self.shards:
            self.reject("unknown_shard")
            return []
        try:
            msg = decode(payload, self.schema, kernel_version=self.kernel_version, client=shard, kinds=self._kinds)
            pairs = contributors_of(msg)
            rnd = msg.meta["round"]
            if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
                raise ValueError(f"round must be a whole number >= 0, got {rnd!r}")
            total = self.aggregation.read_partial(msg)
        except ProtocolError as e:
            self.reject(e.reason.value)
            return []
        except ValueError as e:
            self.reject("invalid_partial")
            log.warning("partial %s from shard %r rejected: %s", getattr(msg, "seq", "?"), shard, e)
            return []
        if self.clients and any(c not in self.order for c, _ in pairs):
            self.reject("unknown_client")
            return []
        try:
            self.partials.check(shard, msg.seq)
        except ProtocolError:  # sent again after a reconnect: it is in, say so again
            return [self._ack(shard, msg.seq, True)]
        lockstep = self.mode == "lockstep"
        if lockstep and (rnd < 1 or any(s != rnd for _, s in pairs)):
            self.reject("invalid_partial")
            return []
        if lockstep and rnd <= self.version:
            # its round is closed, so every pair in it is a repeat (rounds close only when complete)
            self.partials.record(shard, msg.seq)
            return [self._ack(shard, msg.seq, False, pairs)]
        dup = [p for p in pairs if self.applied.has(*p) or p in self._round_pairs.get(rnd, ())]
        if dup:
            self.partials.record(shard, msg.seq)
            self.reject("duplicate")
            return [self._ack(shard, msg.seq, False, dup)]
        # combined first (in the fleet's order where the aggregation needs one): nothing is recorded unless it is in
        acc = self._round.get(rnd, (None, set()))[0] if lockstep else self._win_sum
        try:
            combined = self.aggregation.combine_partials([total] if acc is None else [acc, total], self.order)
        except ValueError as e:
            self.reject("invalid_partial")
            log.warning("partial %d from shard %r rejected: %s", msg.seq, shard, e)
            return []
        self.partials.record(shard, msg.seq)
        out = [self._ack(shard, msg.seq, True)]
        self.accepted += len(pairs)
        clients = {c for c, _ in pairs}
        if lockstep:
            self._round[rnd] = (combined, self._round.get(rnd, (None, set()))[1] | clients)
            self._round_pairs[rnd].update(pairs)
            return out + self._close_ready_rounds(now)
        self._win_sum = combined
        for c, s in pairs:
            self.applied.record(c, s)
        self._win_clients |= clients
        if self._win_started is None:
            self._win_started = now
        if self.window <= 0:
            out += self._close_window(now)
        return out

    def on_status(self, client: str, state: str, now: float | None = None) -> list[Message]:
        """An agent went offline (or came back): who a lock-step round waits for."""
        if client not in self.order:
            return []
        note_status(self.expected, self.offline, client, state)
        if self.mode != "lockstep":
            return []
        return self._close_ready_rounds(time.time() if now is None else now)

    def tick(self, now: float | None = None) -> list[Message]:
        """Close an asynchronous window whose time is up."""
        now = time.time() if now is None else now
        if self.mode == "lockstep" or self._win_started is None or now - self._win_started < self.window:
            return []
        return self._close_window(now)

    # ------------------------------------------------------------------ rounds
    def _close_ready_rounds(self, now: float) -> list[Message]:
        out: list[Message] = []
        while True:
            r = self.version + 1
            total, who = self._round.get(r, (None, set()))
            if total is None or not who or not self.expected <= who:
                return out
            for c in who:
                if not self.applied.has(c, r):
                    self.applied.record(c, r)
            self.aggregation.apply_partial(total, len(who), self.included())
            del self._round[r]
            self._round_pairs.pop(r, None)
            out += self._published()

    def _close_window(self, now: float) -> list[Message]:
        total, clients = self._win_sum, self._win_clients
        # the window is emptied before the global is published (and checkpointed): applied exactly once
        self._win_sum, self._win_clients, self._win_started = None, set(), None
        if total is None:
            return []
        self.aggregation.apply_partial(total, len(clients), self.included())
        return self._published()

    # ------------------------------------------------------------------ outputs
    def _ack(self, shard: str, seq: int, applied: bool, pairs: Iterable[tuple[str, int]] = ()) -> Message:
        included, owner, seqs = contributors_fields(pairs)
        return Message(self.cfg.fleet, shard, "partial.ack", seq, global_version=self.version,
                       arrays={"owner": owner, "seqs": seqs}, meta={"partial": int(seq), "applied": applied},
                       included=included)

    def _published(self) -> list[Message]:
        self.rounds += 1
        if self.checkpoint is not None:  # write-ahead: on disk before any global reflecting it exists
            self.checkpoint(self)
        self.stats.round_completed(self.version, 0.0, aggregation_diagnostics(self.aggregation))
        out = [self.global_message()]
        for c in self.applied.clients:  # tell clients with gaps which seqs are missing
            missing = self.applied.missing(c)
            if missing:
                out.append(ack_message(self.cfg.fleet, c, self.applied.mark(c), missing[: self.cfg.seq_window],
                                       seq=self.version, global_version=self.version))
        return out

    def global_message(self) -> Message:
        """The current global, in the same message the single aggregator publishes."""
        return self.aggregation.global_message(self.cfg.fleet, self.sender, self.kernel_version)

    def hello(self) -> list[Message]:
        """On (re)connect: per known client, which seqs the reducer holds (agents resend the rest)."""
        return [ack_message(self.cfg.fleet, c, self.applied.mark(c), self.applied.missing(c)[: self.cfg.seq_window],
                            seq=self.version, global_version=self.version)
                for c in sorted(set(self.clients) | set(self.applied.clients))]
