"""What a POF-MKL aggregator, shard or reducer runs: eq. (10), `θ ← θ − ΣΔ/|C|` (docs/algorithms.md §2).

Lock-step: a round is every expected client's seq-`r` update, added in the fleet's client order (so the
global equals the replay's bit for bit). Asynchronous: whatever arrives within a window is one round with
`C` = the clients heard, a client's several updates in one window summed per kernel as they arrive.
Sharded: a shard sends a dense `ΣΔ`; the reducer applies `θ ← θ − ΣΔ/|C|` with `|C|` the clients in it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.pofmkl.learner import KernelUpdate, POFMKLServer, reset_overflowed_rows
from streamfed.algorithms.pofmkl.wire import global_message
from streamfed.fleet.protocol import Message

__all__ = ["POFMKLAggregation", "WindowSum"]

log = logging.getLogger("streamfed.algorithms.pofmkl")


class WindowSum:
    """One client's updates within an asynchronous window, summed per kernel as they arrive: exactly
    what :func:`~streamfed.algorithms.pofmkl.learner.merge_updates` gives for the same updates (each row
    starts at 0.0 and takes the deltas in arrival order), at a few µs per update.

    >>> from streamfed.algorithms.pofmkl.learner import merge_updates
    >>> ups = [KernelUpdate(np.array([2]), np.ones((1, 2))), KernelUpdate(np.array([0, 2]), np.full((2, 2), 2.0))]
    >>> acc = WindowSum(2)
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

    def __getstate__(self) -> dict:
        return {"dim": self.dim, "rows": self.rows, "n_samples": self.n_samples}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class POFMKLAggregation:
    """The :class:`~streamfed.algorithms.base.Aggregation` of POF-MKL.

    >>> agg = POFMKLAggregation(n_kernels=2, dim=2)
    >>> agg.apply_round(1, [("a", KernelUpdate(np.array([0]), np.ones((1, 2)))),
    ...                     ("b", KernelUpdate(np.array([0]), np.full((1, 2), 3.0)))])
    >>> agg.version, agg.server.theta[0].tolist(), agg.included()
    (1, [-2.0, -2.0], {'a': 1, 'b': 1})
    """

    def __init__(self, n_kernels: int, dim: int, *, max_abs: float = 1e100) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.server = POFMKLServer(n_kernels, dim)
        self.max_abs = float(max_abs)
        self.dim = dim
        self._heard: dict[str, WindowSum] = {}  # async window: per client heard, its updates summed
        self._applied: dict[str, int] = {}  # per client, the highest seq in the global

    @property
    def version(self) -> int:
        return int(self.server.version)

    def included(self) -> dict[str, int]:
        return {c: self._applied[c] for c in sorted(self._applied)}

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> KernelUpdate:
        # the decoded read-only views are enough: the server only reads an update (no copy per message)
        delta = msg.arrays["delta"]
        # one reduction (|Δ| <= max_abs, NaN compares False); the codec already refused non-finite values
        if delta.size and not np.abs(delta).max() <= self.max_abs:
            raise ValueError(f"a delta value is beyond ±{self.max_abs:g}")
        return KernelUpdate(msg.arrays["kernels"], delta, msg.n_samples)

    def take(self, client: str, seq: int, item: KernelUpdate) -> None:
        acc = self._heard.get(client)
        if acc is None:
            acc = self._heard[client] = WindowSum(self.dim)
        acc.add(item)

    def pending(self) -> bool:
        return bool(self._heard)

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        if not self._heard:
            return False
        clients = sorted(self._heard, key=lambda c: order.get(c, len(order)))
        self._aggregate([self._heard[c].merged() for c in clients])
        for c in clients:
            self._applied[c] = mark(c)
        self._heard.clear()
        return True

    def apply_round(self, round: int, items: Sequence[tuple[str, KernelUpdate]]) -> None:
        self._aggregate([u for _, u in items])
        for c, _ in items:
            self._applied[c] = max(self._applied.get(c, 0), round)

    def _aggregate(self, updates: list[KernelUpdate]) -> None:
        """One round. Updates were validated (indices, shapes, |Δ| <= max_abs), so this cannot fail; a kernel
        whose row of θ overflows is reset to 0 by the server (logged, counted) and the rest of the round is
        applied: one runaway kernel never blocks the fleet or publishes a non-finite global."""
        try:
            for u in updates:
                self.server.add(u)
            self.server.finish_round()
        except (NonFiniteError, ValueError) as e:
            log.error("round %d discarded (%s): its %d updates are dropped", self.version + 1, e, len(updates))
            self.server.finish_round()  # finish_round reset the partial sums; this one adds nothing
        self._log_resets()

    def _log_resets(self) -> None:
        if self.server.last_resets:
            log.warning("round %d: kernel(s) %s overflowed and were reset to 0 (%d resets so far)", self.version,
                        self.server.last_resets, self.server.kernel_resets)

    def diagnostics(self) -> dict[str, float]:
        """Named numbers worth watching: rows of θ reset because they overflowed."""
        return {"kernel_resets": float(self.server.kernel_resets)}

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[KernelUpdate]) -> tuple[dict[str, np.ndarray], int, int]:
        total = np.zeros_like(self.server.theta)
        for u in items:  # Σ Δ in arrival order, as the single aggregator sums
            delta = u.delta
            for i, k in enumerate(u.kernels.tolist()):  # row by row: cheaper than fancy indexing
                total[k] += delta[i]
        return {"sum": total}, sum(int(u.n_samples) for u in items), 0

    def read_partial(self, msg: Message) -> np.ndarray:
        total = np.array(msg.arrays["sum"], dtype=np.float64)
        if not np.all(np.isfinite(total)):
            raise ValueError("non-finite partial sum")
        return total

    def apply_partial(self, total: np.ndarray, n_clients: int, included: Mapping[str, int]) -> None:
        # eq. (10), as POFMKLServer.finish_round: θ ← θ − (Σ_{c ∈ C} Δ_c) / |C|
        with np.errstate(over="ignore", invalid="ignore"):
            new = self.server.theta - total / n_clients
        self.server.last_resets = reset_overflowed_rows(new)  # as finish_round: never a non-finite global
        self.server.kernel_resets += len(self.server.last_resets)
        self.server.theta = new
        self.server.version += 1
        self._applied = dict(included)
        self._log_resets()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        return global_message(fleet, sender, self.server.theta, self.version, kernel_version=kernel_version,
                              included=self.included())

    def warm_up(self) -> None:
        twin = copy.deepcopy(self.server)
        acc = WindowSum(self.dim)
        acc.add(KernelUpdate(np.zeros(1, dtype=np.int64), np.zeros((1, self.dim))))
        twin.add(acc.merged())
        twin.finish_round()
