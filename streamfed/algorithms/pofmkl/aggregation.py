"""What a POF-MKL aggregator, shard or reducer runs: eq. (10), `θ ← θ − ΣΔ/|C|` (docs/algorithms.md §3).

Lock-step: a round is every expected client's seq-`r` update, added in the fleet's client order (so the
global equals the replay's bit for bit). Asynchronous: whatever arrives within a window is one round with
`C` = the clients heard, a client's several updates in one window summed per kernel as they arrive.
Sharded, asynchronous: a shard sends a dense `ΣΔ`; the reducer applies `θ ← θ − ΣΔ/|C|` with `|C|` the clients
in it. Sharded, lock-step: a shard sends its clients' updates themselves (:class:`RoundUpdates`), and the reducer
adds every update of the round in the fleet's client order and divides by `|C|` — the single aggregator's own
operations, so the global is the same bit for bit (floating-point addition is not associative: pre-summed
partials would differ in the last bits).

Bounded influence (docs/algorithms.md §3.9, always on): :class:`StepBound` is the largest row an honest
client can send, from the configuration alone (θ is projected onto a configured radius); `check`
refuses anything beyond it. Robust aggregation (`[fleet.robust] aggregation = "robust"`, :class:`RobustRule`):
rows clipped to `clip_factor ×` the round's median row norm, then per kernel a coordinate-wise trimmed mean
over the clients that sent that row, scaled by their share of the `|C|` reporting clients.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from streamfed.algorithms.base import BaseAggregation, NonFiniteError
from streamfed.algorithms.pofmkl._layout import STEP_CAP
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.row_scan import CLEAR_MARGIN, scan_rows
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.algorithms.pofmkl.wire import ROUND, global_message
from streamfed.algorithms.robust_mean import clip_rows, clip_threshold, row_norms, trimmed_mean
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["ClientSteps", "POFMKLAggregation", "RobustRule", "RoundUpdates", "StepBound", "WindowSum"]

log = logging.getLogger(__name__)


@durable("pofmkl.WindowSum")
class WindowSum:
    """One client's updates within an asynchronous window, summed per kernel as they arrive: exactly
    what :func:`~streamfed.algorithms.pofmkl.messages.merge_updates` gives for the same updates (each row
    starts at 0.0 and takes the deltas in arrival order), at a few µs per update.

    >>> from streamfed.algorithms.pofmkl.messages import merge_updates
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


@durable("pofmkl.RoundUpdates")
class RoundUpdates:
    """Lock-step updates of one round from one or several shards' `pofmkl.round` partials: one per client,
    in the order they will be added (:meth:`POFMKLAggregation.combine_partials` puts them in the fleet's order).

    >>> r = RoundUpdates({"b": KernelUpdate(np.array([0]), np.ones((1, 2)))})
    >>> r.merged([RoundUpdates({"a": KernelUpdate(np.array([1]), np.ones((1, 2)))})], {"a": 0, "b": 1}).clients()
    ['a', 'b']
    """

    __slots__ = ("updates",)

    def __init__(self, updates: Mapping[str, KernelUpdate]) -> None:
        self.updates = dict(updates)

    def clients(self) -> list[str]:
        return list(self.updates)

    def merged(self, others: Sequence[RoundUpdates], order: Mapping[str, int]) -> RoundUpdates:
        """These and `others`' updates, ranked by `order` (then by name); `ValueError` for a client twice."""
        out = dict(self.updates)
        for o in others:
            for c, u in o.updates.items():
                if c in out:
                    raise ValueError(f"client {c!r} twice in one lock-step round")
                out[c] = u
        rank = len(order)
        return RoundUpdates({c: out[c] for c in sorted(out, key=lambda c: (order.get(c, rank), c))})

    def dense(self, n_kernels: int, dim: int) -> np.ndarray:
        """Their sum `Σ Δ (N, 2D)`, added in their order."""
        total = np.zeros((n_kernels, dim))
        for u in self.updates.values():
            total[u.kernels] += u.delta
        return total

    def __getstate__(self) -> dict:
        return {"updates": self.updates}

    def __setstate__(self, state: dict) -> None:
        self.updates = state["updates"]


# Relative slack on the declared bound: it covers the rounding of ‖z_p‖ = 1 (fdlibm sin/cos, ≤ 2.2e-16 each),
# of f_p = θ_pᵀz_p and of the error-feedback sums — orders of magnitude below 1e-9 — and nothing else.
BOUND_SLACK = 1e-9
ROBUST_SHARDED = ("robust aggregation (trimmed mean) cannot be computed from partial sums: run a single "
                  "aggregator, or aggregation = \"exact\" with shards")


def _clearly_within(squares: np.ndarray, kernels: list[int], allowed: np.ndarray, per_step: list[float]) -> bool:
    """Every row's norm (from its `Σ Δ²`) below its limit `allowed · per_step · (1 + BOUND_SLACK)` by the margin
    :data:`~.row_scan.CLEAR_MARGIN`: accepted whichever way the squares were summed. False: judge it exactly."""
    keep = 1.0 - CLEAR_MARGIN
    for sq, p, k in zip(squares.tolist(), kernels, allowed.tolist(), strict=True):
        if not math.sqrt(sq) <= k * per_step[p] * (1.0 + BOUND_SLACK) * keep:  # NaN: not clear
            return False
    return True


@durable("pofmkl.StepBound")
@dataclass(frozen=True)
class StepBound:
    """The largest row `‖Δ_p‖` one honest step can produce (docs/algorithms.md §3.9).

    A step uploads `Δ_p = g (2(f_p − y) z_p + 2λθ_p)` (docs/algorithms.md §3.2 step 4) with `g = min(η/q_J, 1/2)` and
    `q_J ≥ ξ/B_bins` (eq. 8, `B_bins = ⌈N/M⌉`), so `g ≤ step = min(η·B_bins/ξ, 1/2)` (1/2 when `ξ = 0`);
    `‖z_p‖ = 1` (`D` sin/cos pairs scaled by `1/√D`), `|f_p| = |θ_pᵀz_p| ≤ ‖θ_p‖ ≤ R`, and `|y| ≤ B` (agents
    clip labels to `label_bound`). Hence `‖Δ_p‖ ≤ step · (2(R + B) + 2λR)` per step. `R = radius` is a number
    of the configuration (`theta_radius`, by default `B/√λ`: the regularised comparator's norm), and the server
    projects every row of θ onto `‖θ_p‖ ≤ R`: nothing a client sends can raise the bound. (`radius = inf`:
    a state written before the radius, whose bound used the largest `‖θ_p‖` ever published.)

    >>> b = StepBound.of(eta=0.005, lam=1e-4, xi=0.1, n_kernels=16, bin_size=1, label_bound=10.0)
    >>> b.step, float(b.per_step(np.array([0.0]))[0])
    (0.5, 10.0)
    >>> StepBound.of(eta=0.001, lam=0.0, xi=0.5, n_kernels=4, bin_size=2, label_bound=1.0).step
    0.004
    """

    step: float
    label_bound: float
    lam: float
    radius: float = math.inf

    @classmethod
    def of(cls, eta: float, lam: float, xi: float, n_kernels: int, bin_size: int, label_bound: float,
           radius: float = math.inf) -> StepBound:
        n_bins = -(-int(n_kernels) // int(bin_size))
        step = STEP_CAP if xi <= 0.0 else min(eta * n_bins / xi, STEP_CAP)
        return cls(float(step), float(label_bound), float(lam), float(radius))

    def per_step(self, radius: np.ndarray) -> np.ndarray:
        """The bound on one step's row `p`, for `‖θ_p‖ ≤ radius[p]`."""
        return self.step * (2.0 * (radius + self.label_bound) + 2.0 * self.lam * radius)


@durable("pofmkl.RobustRule")
@dataclass(frozen=True)
class RobustRule:
    """Robust combination of a round's rows (docs/algorithms.md §3.9): clip each row to `clip_factor ×` the
    median norm of the round's rows, then per kernel `p` a coordinate-wise mean with `trim` off each side over
    the clients `S_p` that sent row `p`, times `|S_p|/|C|` (`C`: the clients reporting in the round).

    >>> RobustRule(trim=0.25, clip_factor=2.0).trim
    0.25
    """

    trim: float
    clip_factor: float


@durable("pofmkl.ClientSteps")
class ClientSteps:
    """Per client, the steps its uploads summarise — what bounds a row that error feedback carried forward.

    An asynchronous agent's row `p` may hold every step since that row last left it (docs/algorithms.md §3.6),
    so a row of seq `s` is allowed `k_p` steps: the client's samples recorded so far plus this upload's,
    minus those up to the last upload that carried `p`. Repeats of a recorded seq get the allowance of the
    first copy (an honest resend is identical); an upload below a newer one that carried `p` (out of order)
    is allowed all the client's steps. Missing uploads below `s` can only make `k_p` too small, never too large:
    such an update is refused and taken when the agent sends it again after the gap.

    >>> cs = ClientSteps(3)
    >>> cs.allowance(1, 2, [0]).tolist(), cs.record(1, 2, [0], [2]), cs.allowance(2, 3, [0, 1]).tolist()
    ([2], None, [3, 5])
    """

    KEEP = 64  # recorded seqs remembered for repeats (an honest agent resends within its sequence window)

    def __init__(self, n_kernels: int) -> None:
        self.total = 0  # Σ n_samples of the recorded uploads
        self.top = 0  # highest recorded seq
        self.mark_seq = np.zeros(n_kernels, dtype=np.int64)  # per kernel: highest recorded seq that carried it
        self.mark_cum = np.zeros(n_kernels, dtype=np.int64)  # ... and the client's steps up to that seq
        self.recent: dict[int, tuple[int, dict[int, int]]] = {}  # seq → (n_samples, {kernel: steps allowed})

    def allowance(self, seq: int, n: int, kernels: Sequence[int]) -> np.ndarray:
        """Steps each row of an upload `(seq, n)` may hold (`ValueError`: a repeat that differs)."""
        got = self.recent.get(seq)
        if got is not None:
            n0, allowed = got
            if n0 != n or any(p not in allowed for p in kernels):
                raise ValueError(f"seq {seq} sent again with other samples or kernels than its first copy")
            return np.array([allowed[p] for p in kernels], dtype=np.int64)
        out = np.empty(len(kernels), dtype=np.int64)
        for i, p in enumerate(kernels):
            newer = seq <= self.mark_seq[p]  # a newer upload carried p: everything recorded may be in this row
            out[i] = self.total + n - (0 if newer else self.mark_cum[p])
        return out

    def record(self, seq: int, n: int, kernels: Sequence[int], allowed: Sequence[int]) -> None:
        """Count an accepted upload (a repeat of a recorded seq counts once)."""
        if seq in self.recent:
            return
        self.total += n
        later = [j for j in self.recent if j > seq] if seq < self.top else []  # nothing recorded is above top
        # steps up to and including seq: known when every recorded later seq is still remembered
        exact = seq > self.top - self.KEEP
        cum = self.total - sum(self.recent[j][0] for j in later)
        for p in kernels:
            if exact and seq > self.mark_seq[p]:
                self.mark_seq[p], self.mark_cum[p] = seq, cum
        self.recent[seq] = (int(n), {int(p): int(k) for p, k in zip(kernels, allowed, strict=True)})
        self.top = max(self.top, seq)
        if len(self.recent) > self.KEEP:
            if len(self.recent) == self.KEEP + 1:  # the usual case, one over: its smallest seq goes
                del self.recent[min(self.recent)]
            else:
                for j in sorted(self.recent)[: len(self.recent) - self.KEEP]:
                    del self.recent[j]

    def forget(self, seq: int) -> None:
        """An upload was folded into the global: its seq can no longer come again (the cores refuse it)."""
        recent = self.recent
        if len(recent) == 1 and seq in recent:  # the usual case: the upload just recorded, alone
            recent.clear()
            return
        for j in [j for j in recent if j <= seq]:
            del recent[j]


@durable("pofmkl.POFMKLAggregation")
class POFMKLAggregation(BaseAggregation):
    """The :class:`~streamfed.algorithms.base.Aggregation` of POF-MKL.

    >>> agg = POFMKLAggregation(n_kernels=2, dim=2)
    >>> agg.apply_round(1, [("a", KernelUpdate(np.array([0]), np.ones((1, 2)))),
    ...                     ("b", KernelUpdate(np.array([0]), np.full((1, 2), 3.0)))])
    >>> agg.version, agg.server.theta[0].tolist(), agg.included()
    (1, [-2.0, -2.0], {'a': 1, 'b': 1})

    With a declared bound (:class:`StepBound`; the factory always gives one) and robust aggregation:

    >>> from streamfed.algorithms.pofmkl.wire import update_message
    >>> agg = POFMKLAggregation(2, 2, bound=StepBound(0.5, 1.0, 0.0), robust=RobustRule(0.25, 2.0))
    >>> def up(c, v): return update_message("f", c, 1, np.array([0]), np.full((1, 2), v), global_version=0,
    ...                                     kernel_version="k")
    >>> agg.check(up("a", 0.5)).delta.tolist()
    [[0.5, 0.5]]
    >>> try:
    ...     agg.check(up("evil", 1e3))
    ... except ValueError as e:
    ...     print(str(e).split(" (")[0])
    kernel 0: ‖Δ‖ = 1.41e+03 is beyond the declared bound 1
    """

    recoverable = True  # rebase: θ is learned again from version `version` on

    rebased = False  # set by rebase: clients absent from `steps` are on their first upload since a lost state

    round_kind = ROUND  # lock-step shards send their clients' updates; the reducer adds them in the fleet's order

    bin_size: int | None = None  # M, the rows an update may carry (None: a state from before; N then bounds them)

    def __init__(self, n_kernels: int, dim: int, *, max_abs: float = 1e100, bound: StepBound | None = None,
                 robust: RobustRule | None = None, bin_size: int | None = None) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        r = bound.radius if bound is not None else math.inf
        self.server = POFMKLServer(n_kernels, dim, radius=r)
        self.max_abs = float(max_abs)
        self.dim = dim
        self.bound = bound
        self.robust = robust
        self.bin_size = None if bin_size is None else int(bin_size)
        # per kernel, the ‖θ_p‖ the bound assumes: the configured radius (θ is projected onto it); without one
        # (a state from before it), the largest ‖θ_p‖ ever published
        self.radius = np.full(n_kernels, r) if math.isfinite(r) else np.zeros(n_kernels)
        self.steps: dict[str, ClientSteps] = {}  # per client, the samples its uploads summarised
        self.lockstep = False  # apply_round was called: uploads carry one step each, nothing carried forward
        self.role = "aggregator"  # "shard" once it builds a partial: it holds no θ, so it bounds nothing
        self._heard: dict[str, WindowSum] = {}  # async window: per client heard, its updates summed
        self._applied: dict[str, int] = {}  # per client, the highest seq in the global
        # robust mode: per kernel, the latest clipped row of each recent client (the sliding reference set)
        self._recent: dict[int, dict[str, np.ndarray]] = {}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_recent", {})  # a state from before the sliding reference set
        # pickled before bounds and robust aggregation: no bound, exact (what that aggregator did)
        if "radius" not in state:
            self.bound, self.robust, self.lockstep, self.role = None, None, False, "aggregator"
            self.radius = row_norms(self.server.theta)
            self.steps = {}

    @property
    def version(self) -> int:
        return int(self.server.version)

    def included(self) -> dict[str, int]:
        return {c: self._applied[c] for c in sorted(self._applied)}

    def rebase(self, version: int, epoch: int) -> None:
        """Start over after the state was lost (docs/reliability.md § Lost state): θ = 0 as version `version`,
        nothing included. θ is not a sum of per-client totals, so it is learned again, not rebuilt (`epoch` is not
        used). A client's first upload after this may carry error-feedback residual of steps the lost state
        counted: it is held to `max_abs` only, the client's later uploads to the declared bound again."""
        if int(version) <= self.version:
            raise ValueError(f"rebase to version {version} from {self.version}")
        self.server = POFMKLServer(self.server.theta.shape[0], self.dim, radius=self.server.radius)
        self.server.version = int(version)
        if math.isinf(self.server.radius):
            self.radius = np.zeros_like(self.radius)
        self.steps, self._heard, self._applied = {}, {}, {}
        self.rebased = True

    def for_partials(self, role: str) -> None:
        """Say this aggregation serves a shard or the reducer (`role`): robust aggregation is refused there,
        and a shard, which never sees θ, leaves the declared bound to an aggregator that does."""
        if role not in ("shard", "reducer"):
            raise ValueError(f"role must be 'shard' or 'reducer', got {role!r}")
        if self.robust is not None:
            raise ValueError(ROBUST_SHARDED)
        self.role = role

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> KernelUpdate:
        # the decoded read-only views are enough: the server only reads an update (no copy per message)
        delta = msg.arrays["delta"]
        squares = None
        if not delta.size:
            largest = 0.0
        elif delta.ndim == 2 and delta.dtype == np.float64:  # as decoded: max |Δ| and Σ Δ² per row in one pass
            squares = np.empty(delta.shape[0])
            largest = scan_rows(delta, squares)
        else:
            largest = np.abs(delta).max()
        # |Δ| <= max_abs (NaN compares False); the codec already refused non-finite values
        if not largest <= self.max_abs:
            raise ValueError(f"a delta value is beyond ±{self.max_abs:g}")
        item = KernelUpdate(msg.arrays["kernels"], delta, msg.n_samples)
        if self.bound is not None and self.role == "aggregator" and delta.size:
            self._check_bound(msg.client, int(msg.seq), item, largest, squares)
        return item

    def _per_step(self) -> np.ndarray:
        """`bound.per_step(radius)` for every kernel, worked out again only when `radius` is a new array (it is
        rebound, never changed in place): elementwise, so indexing it is `per_step(radius[kernels])` exactly."""
        cached = self.__dict__.get("_per_step_cache")
        if cached is None or cached[0] is not self.radius:
            assert self.bound is not None
            cached = self.__dict__["_per_step_cache"] = (self.radius, self.bound.per_step(self.radius))
        return cached[1]

    def _per_step_list(self) -> list[float]:
        """:meth:`_per_step` as a list (cached with it): indexed per row in plain Python."""
        per_step = self._per_step()
        cached = self.__dict__.get("_per_step_list_cache")
        if cached is None or cached[0] is not per_step:
            cached = self.__dict__["_per_step_list_cache"] = (per_step, per_step.tolist())
        return cached[1]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_per_step_cache", None)  # derived: not part of the durable state
        state.pop("_per_step_list_cache", None)
        return state

    def _check_bound(self, client: str, seq: int, item: KernelUpdate, largest: float = math.inf,
                     squares: np.ndarray | None = None) -> None:
        """Refuse a row beyond `k_p × StepBound.per_step(R_p)`; record the accepted upload's samples (a refused
        one leaves no trace). `largest`: `max |Δ|` when the caller knows it; `squares`: each row's `Σ Δ²`
        (:func:`~.row_scan.scan_rows`), which accept an upload whose rows are all clearly within their limits."""
        assert self.bound is not None
        kernels = item.kernels.tolist()
        n = int(item.n_samples)
        steps = self.steps.get(client)
        if steps is None:
            steps = ClientSteps(self.radius.shape[0])
            if self.rebased:  # its first upload since a lost state: residual of unknown age
                steps.record(seq, int(item.n_samples), kernels, [int(item.n_samples)] * len(kernels))
                self.steps[client] = steps
                return
        if self.lockstep:  # a lock-step upload is one step's Δ, whatever n_samples it claims; nothing older
            allowed = np.ones(len(kernels), dtype=np.int64)
        else:
            allowed = steps.allowance(seq, n, kernels)
        if squares is not None and _clearly_within(squares, kernels, allowed, self._per_step_list()):
            steps.record(seq, n, kernels, allowed.tolist())
            self.steps[client] = steps
            return
        per_step = self._per_step()[item.kernels]
        limit = allowed * per_step * (1.0 + BOUND_SLACK)
        # below 1e150 no square overflows (a row holds far fewer than 1e8 values): the norms without row_norms'
        # floating-point error state, which costs as much as the einsum; the same numbers
        delta = item.delta
        norms = row_norms(delta) if not largest <= 1e150 else np.sqrt(np.einsum("ij,ij->i", delta, delta))
        within = norms <= limit  # NaN compares False: refused
        if not within.all():
            i = int(np.flatnonzero(~within)[0])
            p = kernels[i]
            b = self.bound
            raise ValueError(f"kernel {p}: ‖Δ‖ = {norms[i]:.3g} is beyond the declared bound {limit[i]:.3g} "
                             f"({allowed[i]} step(s) × {per_step[i]:.3g} per step: g = {b.step:g}, "
                             f"R = {self.radius[p]:.3g}, B = {b.label_bound:g}, λ = {b.lam:g})")
        steps.record(seq, n, kernels, allowed.tolist())
        self.steps[client] = steps

    def take(self, client: str, seq: int, item: KernelUpdate) -> None:
        acc = self._heard.get(client)
        if acc is None:
            acc = self._heard[client] = WindowSum(self.dim)
        acc.add(item)
        steps = self.steps.get(client)
        if steps is not None:
            steps.forget(seq)

    def pending(self) -> bool:
        return bool(self._heard)

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        if not self._heard:
            return False
        clients = sorted(self._heard, key=lambda c: order.get(c, len(order)))
        merged = [self._heard[c].merged() for c in clients]
        if self.robust is None:
            self._aggregate(merged)
        else:
            self._aggregate_robust(merged, clients)
        for c in clients:
            self._applied[c] = mark(c)
        self._heard.clear()
        return True

    def apply_round(self, round: int, items: Sequence[tuple[str, KernelUpdate]]) -> None:
        self.lockstep = True
        if self.robust is None:
            self._aggregate([u for _, u in items])
        else:
            self._aggregate_robust([u for _, u in items])
        for c, _ in items:
            self._applied[c] = max(self._applied.get(c, 0), round)
            steps = self.steps.get(c)
            if steps is not None:
                steps.forget(round)

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
        self._published()

    # the sliding reference set: per kernel, the latest row of at most this many recent clients
    RECENT_CLIENTS = 32

    def _aggregate_robust(self, updates: list[KernelUpdate], clients: Sequence[str] | None = None) -> None:
        """One round by :class:`RobustRule` (docs/algorithms.md §3.9): `θ_p ← θ_p − (|S_p|/|C|)·TM_trim(Δ̃_{c,p} :
        c ∈ S_p)`, `S_p` the clients that sent row `p`, `Δ̃` the rows clipped to `clip_factor × median ‖Δ_{c,q}‖`
        over every row of the round. With `trim = 0` and no clipping this is eq. (10), `Σ_{c∈S_p} Δ_{c,p}/|C|`.

        Asynchronous windows (`clients` given) are judged against the **sliding reference set** too — per kernel,
        the latest row of each of the last `RECENT_CLIENTS` clients that sent it, in any window: the clip norm is
        the median over the round's rows and those, and each kernel's step is clamped coordinate-wise to the
        `trim … 1 − trim` quantiles of the reference rows with the round's. A client alone in its window (or a few
        colluders in theirs) is held to what the fleet's recent rows span instead of being the whole trimmed mean."""
        assert self.robust is not None
        n = len(updates)
        if n:
            recent = self._recent if clients is not None else {}
            others = [r for p_rows in recent.values() for c, r in p_rows.items() if c not in (clients or ())]
            norms = np.concatenate([row_norms(u.delta) for u in updates] + ([row_norms(np.array(others))]
                                                                            if others else []))
            tau = clip_threshold(norms, self.robust.clip_factor)
            by_kernel: dict[int, list[np.ndarray]] = {}
            for j, u in enumerate(updates):
                clipped = clip_rows(u.delta, tau)
                for i, p in enumerate(u.kernels.tolist()):
                    by_kernel.setdefault(p, []).append(clipped[i])
                    if clients is not None:
                        self._remember(p, clients[j], clipped[i])
            step = np.zeros_like(self.server.theta)
            for p, rows in by_kernel.items():
                # over the senders S_p of row p, scaled by |S_p|/|C|: untrimmed, Σ_{S_p} Δ̃/|C| (eq. 10's estimate)
                mean = trimmed_mean(np.array(rows), self.robust.trim)
                ref = [r for c, r in recent.get(p, {}).items() if c not in (clients or ())]
                if ref and self.robust.trim > 0.0:
                    span = np.array(ref + rows)
                    lo, hi = np.quantile(span, [self.robust.trim, 1.0 - self.robust.trim], axis=0)
                    mean = np.clip(mean, lo, hi)
                step[p] = mean * (len(rows) / n)
            self.server.descend(step)  # as finish_round: never a non-finite global, never beyond the radius
        self.server.version += 1
        self._published()

    def _remember(self, kernel: int, client: str, row: np.ndarray) -> None:
        """`row` as `client`'s latest of `kernel` in the sliding reference set (the oldest client leaves)."""
        rows = self._recent.setdefault(kernel, {})
        rows.pop(client, None)
        rows[client] = np.array(row, dtype=np.float64)
        while len(rows) > self.RECENT_CLIENTS:
            rows.pop(next(iter(rows)))

    def _published(self) -> None:
        """After a new θ. Without a configured radius (a state from before it): the largest norm each row ever had
        (what a client may still be computing with)."""
        if math.isinf(self.server.radius):
            self.radius = np.maximum(self.radius, row_norms(self.server.theta))
        self._log_resets()

    def _log_resets(self) -> None:
        if self.server.last_resets:
            log.warning("round %d: kernel(s) %s overflowed and were reset to 0 (%d resets so far)", self.version,
                        self.server.last_resets, self.server.kernel_resets)

    def diagnostics(self) -> dict[str, float]:
        """Named numbers worth watching: rows of θ reset because they overflowed; the largest `‖θ_p‖` ever
        published, or the configured radius θ is projected onto."""
        return {"kernel_resets": float(self.server.kernel_resets),
                "bound_radius": float(self.radius.max()) if self.radius.size else 0.0}

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[KernelUpdate]) -> tuple[dict[str, np.ndarray], int, int]:
        if self.robust is not None:
            raise ValueError(ROBUST_SHARDED)
        self.role = "shard"  # from now on: this aggregation never sees θ (see for_partials)
        total = np.zeros_like(self.server.theta)
        for u in items:  # Σ Δ in arrival order, as the single aggregator sums
            delta = u.delta
            for i, k in enumerate(u.kernels.tolist()):  # row by row: cheaper than fancy indexing
                total[k] += delta[i]
        return {"sum": total}, sum(int(u.n_samples) for u in items), 0

    def round_partial(self, items: Sequence[KernelUpdate]) -> tuple[dict[str, np.ndarray], int, int]:
        """A lock-step shard's round (`pofmkl.round`): each update's rows as sent, `rows[i]` of them for the
        `i`-th item (items in the order of the partial's `(client, seq)` pairs)."""
        if self.robust is not None:
            raise ValueError(ROBUST_SHARDED)
        self.role = "shard"
        rows = np.array([u.kernels.shape[0] for u in items], dtype=np.int64)
        kernels = np.concatenate([u.kernels for u in items]).astype(np.int64) if items else np.zeros(0, np.int64)
        delta = (np.concatenate([u.delta for u in items]).astype(np.float64) if items
                 else np.zeros((0, self.dim)))
        return {"rows": rows, "kernels": kernels, "delta": delta}, sum(int(u.n_samples) for u in items), 0

    def read_partial(self, msg: Message) -> np.ndarray | RoundUpdates:
        if self.robust is not None:
            raise ValueError(ROBUST_SHARDED)
        if msg.kind == ROUND:
            return self._read_round(msg)
        total = np.array(msg.arrays["sum"], dtype=np.float64)
        if not np.all(np.isfinite(total)):
            raise ValueError("non-finite partial sum")
        return total

    def _read_round(self, msg: Message) -> RoundUpdates:
        """A `pofmkl.round`'s updates, each held to what `check` and the codec hold an update to: 1 to `M`
        rows, distinct kernels in range, finite, within ±`max_abs`; one update per client."""
        names = sorted(msg.included)
        owner = np.asarray(msg.arrays["owner"], dtype=np.int64)
        rows = np.asarray(msg.arrays["rows"], dtype=np.int64)
        kernels = np.asarray(msg.arrays["kernels"], dtype=np.int64)
        delta = np.asarray(msg.arrays["delta"], dtype=np.float64)
        n = self.server.theta.shape[0]
        most = n if self.bin_size is None else min(self.bin_size, n)
        if rows.shape != owner.shape:
            raise ValueError("rows and the contributor lists differ in length")
        if rows.size and (int(rows.min()) < 1 or int(rows.max()) > most):
            raise ValueError(f"an update of a round carries 1 to {most} rows")
        if int(rows.sum()) != kernels.shape[0] or delta.shape != (kernels.shape[0], self.dim):
            raise ValueError(f"rows add up to {int(rows.sum())}, the round carries {kernels.shape[0]} rows "
                             f"of delta {delta.shape}")
        if kernels.size and (int(kernels.min()) < 0 or int(kernels.max()) >= n):
            raise ValueError(f"a kernel index is outside [0, {n})")
        if not np.all(np.isfinite(delta)):
            raise ValueError("non-finite delta in a round")
        if delta.size and not np.abs(delta).max() <= self.max_abs:
            raise ValueError(f"a delta value is beyond ±{self.max_abs:g}")
        if owner.size and (int(owner.min()) < 0 or int(owner.max()) >= len(names)):
            raise ValueError("owner index out of range")
        updates: dict[str, KernelUpdate] = {}
        ends = np.cumsum(rows).tolist()
        for i, (o, end) in enumerate(zip(owner.tolist(), ends, strict=True)):
            start = end - int(rows[i])
            k = kernels[start:end].copy()
            if np.unique(k).size != k.size:
                raise ValueError(f"an update repeats a kernel: {k.tolist()}")
            client = names[o]
            if client in updates:
                raise ValueError(f"client {client!r} twice in one lock-step round")
            updates[client] = KernelUpdate(k, delta[start:end].copy())
        return RoundUpdates(updates)

    def combine_partials(self, totals: Sequence[np.ndarray | RoundUpdates], order: Mapping[str, int]
                         ) -> np.ndarray | RoundUpdates:
        """Dense sums added; a lock-step round's updates gathered, in the fleet's `order`. A round that holds a
        dense sum as well (one opened by a build whose shards sent sums, restored from its state) is summed densely:
        the same global up to the order of additions, and the rounds after it bit for bit again."""
        rounds = [t for t in totals if isinstance(t, RoundUpdates)]
        if len(rounds) == len(totals):
            return rounds[0].merged(rounds[1:], order)
        if rounds:
            log.warning("a lock-step round holds dense partial sums: summed densely, not in the fleet's order")
        n, dim = self.server.theta.shape
        return super().combine_partials([t.dense(n, dim) if isinstance(t, RoundUpdates) else t for t in totals], order)

    def apply_partial(self, total: np.ndarray | RoundUpdates, n_clients: int, included: Mapping[str, int]) -> None:
        if self.robust is not None:
            raise ValueError(ROBUST_SHARDED)
        if isinstance(total, RoundUpdates):
            # the single aggregator's lock-step round, operation for operation: each update added in the order
            # given (the fleet's, by combine_partials), then θ ← θ − Σ/|C| in POFMKLServer.finish_round
            self._aggregate(list(total.updates.values()))
        else:
            # eq. (10), as POFMKLServer.finish_round: θ ← θ − (Σ_{c ∈ C} Δ_c) / |C|
            self.server.descend(total / n_clients)
            self.server.version += 1
            self._published()
        self._applied = dict(included)

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
        rows = np.zeros((1, self.dim))
        rows.flags.writeable = False  # as decoded: numba specialises on writability
        scan_rows(rows, np.empty(1))
        if self.robust is not None:  # the robust path's numpy calls, once
            trimmed_mean(clip_rows(np.zeros((2, self.dim)), 0.0), self.robust.trim)
