"""The aggregator's pure core: validate, deduplicate, aggregate, version. No I/O — the MQTT shell
(`streamfed.runtime.aggregator`) feeds it payloads and a clock and publishes what it returns.

POF-MKL
    ``lockstep``: round `r` is the set of seq-`r` updates; it closes when every expected client's is
    in (clients that announced `offline` are no longer expected), or — with a `quorum` — when the
    round timeout has passed and at least `quorum` are in. Updates are added in the fleet's client
    order, so the global equals the replay's bit for bit. Updates for later rounds wait (bounded by
    the sequence window). ``async``: whatever arrives within a window is one round, `C` = the clients
    heard, a client's several messages in one window are summed (as
    :func:`~streamfed.algorithms.pofmkl.learner.merge_updates` would, but per kernel as they arrive: no list of
    updates waits for the window to close).
FedBNR
    every valid upload is summed once (the server buffers out-of-order seqs); a new global is
    published at the end of a window in which something was summed.

Every rejection has a reason (a :class:`~streamfed.fleet.protocol.Reason` value, or ``invalid_update`` /
``unknown_client`` / ``late``) counted in :attr:`AggregatorCore.rejected`; nothing rejected reaches
the model, and :meth:`AggregatorCore.on_update` never raises. Beyond the codec's checks (schema,
shapes, dtypes, finiteness, indices, sequence numbers) an update is validated *before* anything is
changed: every value is bounded by `max_abs` (1e100: a θ built from accepted updates cannot reach values
whose squared norms overflow in any feasible number of rounds, so every global is usable), and FedBNR
statistics must be statistics of some samples — `n` a positive whole number, `[[S, b], [bᵀ, q]]`
positive semi-definite and `tr S_k <= n·max‖φ‖²` (features are bounded) — so one hostile upload cannot
make the global posterior improper for everyone.

Durability: the shell sets :attr:`AggregatorCore.checkpoint` (a callable); it is called with the new
state *before* any global reflecting it is returned for publishing, so a published global is always
on disk. :meth:`AggregatorCore.snapshot` / :meth:`AggregatorCore.restore` carry the server state
(θ and version, or the summed statistics with σ, λ, version, `included` and out-of-order uploads),
pending lock-step rounds or the open window, the :class:`~streamfed.fleet.protocol.SeqTracker` and counters.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from streamfed.algorithms.fedbnr.learner import FedBNRServer, Upload
from streamfed.algorithms.pofmkl.learner import KernelUpdate, NonFiniteError, POFMKLServer
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.factory import kernel_version, make_learner, make_server
from streamfed.fleet.protocol import (
    Message,
    ProtocolError,
    SeqCheck,
    SeqTracker,
    ack_message,
    decode,
    encode,
    fedbnr_global_message,
    pofmkl_global_message,
    stats_fields,
)
from streamfed.fleet.telemetry import AggregatorStats

__all__ = ["AGGREGATOR_STATE_FORMAT", "AggregatorCore", "global_message_for", "note_status", "roster"]

log = logging.getLogger("streamfed.fleet.aggregator")
Mode = Literal["lockstep", "async"]
AGGREGATOR_STATE_FORMAT = 1  # layout of AggregatorCore.snapshot(); restore() refuses any other
_MAX_WHOLE = 2.0**53  # beyond this a float no longer counts samples exactly


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


class _WindowSum:
    """One client's updates within an asynchronous window, summed per kernel as they arrive: exactly
    what :func:`~streamfed.algorithms.pofmkl.learner.merge_updates` gives for the same updates (each row starts at
    0.0 and takes the deltas in arrival order), at a few µs per update and none left for the window close.

    >>> from streamfed.algorithms.pofmkl.learner import merge_updates
    >>> ups = [KernelUpdate(np.array([2]), np.ones((1, 2))), KernelUpdate(np.array([0, 2]), np.full((2, 2), 2.0))]
    >>> acc = _WindowSum(2)
    >>> for u in ups: acc.add(u)
    >>> m, ref = acc.merged(), merge_updates(ups)
    >>> m.kernels.tolist() == ref.kernels.tolist(), np.array_equal(m.delta, ref.delta), m.n_samples
    (True, True, 2)
    """

    __slots__ = ("dim", "rows", "n_samples")

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.rows: dict[int, np.ndarray] = {}
        self.n_samples = 0

    def add(self, update: KernelUpdate) -> None:
        rows, delta = self.rows, update.delta
        for i, k in enumerate(update.kernels.tolist()):
            row = rows.get(k)
            if row is None:
                rows[k] = row = np.zeros(self.dim)
            row += delta[i]
        self.n_samples += int(update.n_samples)

    def merged(self) -> KernelUpdate:
        kernels = sorted(self.rows)
        delta = np.stack([self.rows[k] for k in kernels]) if kernels else np.zeros((0, self.dim))
        return KernelUpdate(np.array(kernels, dtype=np.int64), delta, self.n_samples)


class _WindowSums(dict):  # type: ignore[type-arg]
    """client → :class:`_WindowSum`, created on first use."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def __missing__(self, client: str) -> _WindowSum:
        acc = self[client] = _WindowSum(self.dim)
        return acc


def roster(clients: Sequence[str] | None, mode: Mode, offline: str, pofmkl: bool
           ) -> tuple[Mode, list[str], dict[str, int], set[str]]:
    """`(mode, clients, their order, who a lock-step round waits for)` of an aggregating core (the single
    aggregator, the sharded fleet's reducer). FedBNR always aggregates asynchronously; lock-step needs the
    client list; `offline` is "drop" or "wait" (see :func:`note_status`)."""
    mode = mode if pofmkl else "async"
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


def global_message_for(cfg: FleetConfig, sender: str, server: POFMKLServer | FedBNRServer, included: dict[str, int],
                       kernel_version: str) -> Message:
    """A fleet's global as it is published (retained on the global topic): POF-MKL's θ with the seqs included
    per client, or FedBNR's summed statistics with σ, λ and the evidence (`included` is then the server's)."""
    if cfg.algorithm == "pofmkl":
        return pofmkl_global_message(cfg.fleet, sender, server.theta, int(server.version),
                                     kernel_version=kernel_version, included=included)
    packed = server.stats.to_packed()
    return fedbnr_global_message(cfg.fleet, sender, server.version, packed["S_upper"], packed["b"], packed["n"],
                                 packed["q"], server.sigma, server.lam, server.log_evidence, dict(server.included),
                                 kernel_version=kernel_version, epoch=server.epoch)


class AggregatorCore:
    """Transport-free aggregator of one fleet.

    >>> import numpy as np
    >>> from streamfed.fleet.config import FleetConfig
    >>> from streamfed.fleet.protocol import encode, pofmkl_update_message
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
                 sender: str = "aggregator", stats: AggregatorStats | None = None,
                 offline: Literal["drop", "wait"] = "drop", max_abs: float = 1e100,
                 check_stats: bool = True) -> None:
        self.cfg = cfg
        self.pofmkl = cfg.algorithm == "pofmkl"
        self.mode, self.clients, self.order, self.expected = roster(clients, mode, offline, self.pofmkl)
        self.offline = offline  # see note_status
        self.quorum = quorum
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.max_abs = float(max_abs)
        # FedBNR statistics must be statistics of samples: off only for clients that add DP noise or
        # secure-aggregation masks to their deltas (ALGORITHMS.md §3), which make single deltas improper.
        self.check_stats = check_stats
        self._phi_sq = 0.0
        if not self.pofmkl:
            probe = make_learner(cfg, "probe", 0)
            self._phi_sq = float(np.max(np.sum(probe.features(np.zeros(cfg.n_inputs)) ** 2, axis=-1)))
        self.checkpoint: Callable[[AggregatorCore], None] | None = None
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
        # async POF-MKL window: per client heard, its updates summed per kernel as they arrive
        self._heard: dict[str, _WindowSum] = _WindowSums(2 * cfg.n_features)
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
            seq_check = self.tracker.check(msg.client, msg.seq)
        except ProtocolError as e:
            self.counters.reject(e.reason.value)
            return []
        if seq_check.dropped is not None:
            # More than a window ahead: taking it would give up the seqs in between for good (and a FedBNR
            # server would wait for them forever). An honest agent never gets there: it holds its uploads
            # while a window's worth is outstanding, and sends missing ones again.
            self.counters.reject("invalid_update")
            log.debug("update from %r seq %d is more than %d ahead of %d", msg.client, msg.seq,
                      self.tracker.window, self.tracker.mark(msg.client))
            return []
        try:
            # validated in full before anything changes: a rejected update leaves no trace
            item = self._check_pofmkl(msg) if self.pofmkl else self._check_stats(msg)
        except ValueError as e:  # well-formed but unusable (out of range, improper, below the privacy floor)
            self.counters.reject("invalid_update")
            log.debug("update from %r seq %d rejected: %s", msg.client, msg.seq, e)
            return []
        if self.pofmkl and self.mode == "lockstep" and msg.seq <= self.version:
            self.counters.reject("late")  # its round is closed (it was left out after a timeout)
            return []
        client = msg.client
        self.last_seen[client] = now
        self._note_seq(client, msg.seq, seq_check)
        out = self._take_pofmkl(client, msg.seq, item, now) if self.pofmkl else self._take_stats(item, now)
        self.counters.accepted += 1
        self.stats.accepted(client)
        return self._commit(out) if out else out

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
        if self.mode == "lockstep":
            return self._commit(self._close_ready_rounds(now))
        if self._window_started is None or now - self._window_started < self.window:
            return []
        return self._commit(self._close_window(now))

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

    # ------------------------------------------------------------------ POF-MKL
    def _check_pofmkl(self, msg: Message) -> KernelUpdate:
        # the decoded read-only views are enough: the server only reads an update (no copy per message)
        delta = msg.arrays["delta"]
        # one reduction (|Δ| <= max_abs, NaN compares False); the codec already refused non-finite values
        if delta.size and not np.abs(delta).max() <= self.max_abs:
            raise ValueError(f"a delta value is beyond ±{self.max_abs:g}")
        return KernelUpdate(msg.arrays["kernels"], delta, msg.n_samples)

    def _take_pofmkl(self, client: str, seq: int, update: KernelUpdate, now: float) -> list[Message]:
        if self.mode == "lockstep":
            self._round[seq][client] = update
            if self._round_started is None:
                self._round_started = now
            return self._close_ready_rounds(now)
        self._heard[client].add(update)
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
            clients = sorted(got, key=self.order.__getitem__)  # the fleet's order: same sums as the replay
            self._aggregate([got[c] for c in clients])
            for c in clients:
                self._applied[c] = max(self._applied.get(c, 0), r)
            del self._round[r]
            self._round_started = now if self._round.get(r + 1) else None
            out += self._published(now, t0)

    def _close_window(self, now: float) -> list[Message]:
        t0 = time.perf_counter()
        out: list[Message] = []
        if self.pofmkl and self._heard:
            clients = sorted(self._heard, key=lambda c: self.order.get(c, len(self.order)))
            self._aggregate([self._heard[c].merged() for c in clients])
            for c in clients:
                self._applied[c] = self.tracker.mark(c)
            self._heard.clear()
            out = self._published(now, t0)
        elif not self.pofmkl and self._dirty:
            self.server.publish()
            self._dirty = False
            out = self._published(now, t0, already=True)
        self._window_started = None
        return out

    def _aggregate(self, updates: list[KernelUpdate]) -> None:
        """One round: θ ← θ - ΣΔ/|C|. Updates were validated (indices, shapes, |Δ| <= max_abs), so this
        cannot fail; should θ still overflow, the round is applied empty (θ kept, version + 1) rather than
        left to block the fleet or publish a non-finite global."""
        try:
            for u in updates:
                self.server.add(u)
            self.server.finish_round()
        except (NonFiniteError, ValueError) as e:
            log.error("round %d discarded (%s): its %d updates are dropped", self.version + 1, e, len(updates))
            self.counters.reject("invalid_update")
            self.server.finish_round()  # finish_round reset the partial sums; this one adds nothing

    # ------------------------------------------------------------------ FedBNR
    def _check_stats(self, msg: Message) -> Upload:
        up = Upload.from_message(stats_fields(msg))
        st = up.stats
        n, q = float(st.n), float(st.q)
        if not (1.0 <= n <= _MAX_WHOLE and n == math.floor(n)):
            raise ValueError(f"n = {n!r} is not a count of samples")
        bound = self.max_abs
        if (abs(q) > bound or st.S.max() > bound or st.S.min() < -bound
                or (st.b.size and (st.b.max() > bound or st.b.min() < -bound))):
            raise ValueError(f"a statistic is beyond ±{bound:g}")
        if self.check_stats:
            f = st.dim
            trace = np.trace(st.S, axis1=-2, axis2=-1)
            if np.any(trace > n * self._phi_sq * (1.0 + 1e-9) + 1e-9):
                raise ValueError("tr S exceeds n·max‖φ‖²: not the scatter of n feature vectors")
            # Σ [φ; y][φ; y]ᵀ is positive semi-definite; jitter far above rounding, far below any signal
            aug = np.empty(st.S.shape[:-2] + (f + 1, f + 1))
            aug[..., :f, :f] = st.S
            aug[..., :f, f] = st.b
            aug[..., f, :f] = st.b
            aug[..., f, f] = q
            jitter = 1e-9 * np.maximum(trace + abs(q), 1.0)
            aug[..., np.arange(f + 1), np.arange(f + 1)] += jitter[..., None]
            np.linalg.cholesky(aug)  # LinAlgError (a ValueError) when not positive semi-definite
        # the server's own checks (kernel version/epoch, shapes, privacy floor, seq >= 1), without applying
        self.server._validate(up)
        waiting = self.server.waiting().get(up.client, [])
        if len(waiting) >= self.server.max_buffered and up.seq > self.server.included.get(up.client, 0) + 1:
            raise ValueError(f"client {up.client!r} has {len(waiting)} uploads waiting for an earlier seq")
        return up

    def _take_stats(self, up: Upload, now: float) -> list[Message]:
        if self.server.apply(up):
            self._dirty = True
        if self._window_started is None:
            self._window_started = now
        if self.window <= 0:
            return self._close_window(now)
        return []

    def warm_up(self) -> None:
        """One aggregation on a throw-away copy of the server (numba dispatch and cache loading happen
        here, not in the first window of a live run) and one global encoded. Changes nothing here."""
        twin = copy.deepcopy(self.server)
        if self.pofmkl:
            dim = 2 * self.cfg.n_features
            acc = _WindowSum(dim)
            acc.add(KernelUpdate(np.zeros(1, dtype=np.int64), np.zeros((1, dim))))
            twin.add(acc.merged())
            twin.finish_round()
        encode(self.global_message())

    # ------------------------------------------------------------------ output
    def global_message(self) -> Message:
        """The current global as a message (retained on the global topic)."""
        return global_message_for(self.cfg, self.sender, self.server, self.included(), self.kernel_version)

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
        missing = {c: m for c in self.tracker.clients if (m := self.tracker.missing(c))}
        return {"version": self.version, "accepted": self.counters.accepted, "rejected": self.rejected,
                "rounds": self.counters.rounds, "gaps": self.counters.gaps, "missing": missing}

    # ------------------------------------------------------------------ durable state
    def snapshot(self) -> dict[str, Any]:
        """Everything needed to resume exactly here (:meth:`restore`); taken before each new global."""
        def plain(u: KernelUpdate) -> tuple[np.ndarray, np.ndarray, int]:
            return np.array(u.kernels, dtype=np.int64), np.array(u.delta, dtype=np.float64), int(u.n_samples)

        c = self.counters
        return {
            "format": AGGREGATOR_STATE_FORMAT,
            "fleet_config": self.cfg.model_dump(mode="json"),
            "mode": self.mode, "clients": list(self.clients),
            "server": self.server,
            "tracker": self.tracker.to_dict(),
            "round": {r: {cl: plain(u) for cl, u in got.items()} for r, got in self._round.items()},
            "heard": {cl: [plain(acc.merged())] for cl, acc in self._heard.items()},
            "dirty": self._dirty, "applied": dict(self._applied), "expected": sorted(self.expected),
            "counters": {"accepted": c.accepted, "rejected": dict(c.rejected), "rounds": c.rounds, "gaps": c.gaps},
        }

    def restore(self, state: Mapping[str, Any], now: float | None = None) -> None:
        """Resume from a :meth:`snapshot`. `ValueError` if it belongs to another format, fleet
        configuration, mode or client list (nothing is changed then). Pending rounds and an open window
        restart their clocks at `now`."""
        if state.get("format") != AGGREGATOR_STATE_FORMAT:
            raise ValueError(f"aggregator state format {state.get('format')!r}, expected {AGGREGATOR_STATE_FORMAT}")
        if state.get("fleet_config") != self.cfg.model_dump(mode="json"):
            raise ValueError("aggregator state was written for a different fleet configuration")
        if (state.get("mode"), list(state.get("clients", []))) != (self.mode, self.clients):
            raise ValueError(f"aggregator state is for mode {state.get('mode')!r} and clients {state.get('clients')}, "
                             f"this aggregator runs {self.mode!r} with {self.clients}")
        server = state["server"]
        if type(server) is not type(self.server):
            raise ValueError(f"aggregator state holds a {type(server).__name__}, expected {type(self.server).__name__}")
        tracker = SeqTracker.from_dict(state["tracker"])
        now = time.time() if now is None else now
        self.server, self.tracker = server, tracker
        self._round = defaultdict(dict, {int(r): {cl: KernelUpdate(*u) for cl, u in got.items()}
                                         for r, got in state["round"].items()})
        heard = _WindowSums(2 * self.cfg.n_features)
        for cl, ups in state["heard"].items():
            for u in ups:
                heard[cl].add(KernelUpdate(*u))
        self._heard = heard
        self._dirty = bool(state["dirty"])
        self._applied = {str(k): int(v) for k, v in state["applied"].items()}
        self.expected = set(state["expected"])
        counters = state["counters"]
        self.counters.accepted, self.counters.rounds = int(counters["accepted"]), int(counters["rounds"])
        self.counters.rejected = dict(counters["rejected"])
        self.counters.gaps = int(counters["gaps"])
        self._round_started = now if self._round else None
        self._window_started = now if (self._heard or self._dirty) else None
        self.stats.set_global_version(self.version)
