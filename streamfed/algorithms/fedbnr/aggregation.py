"""What a FedBNR aggregator, shard or reducer runs (docs/algorithms.md §4): every valid upload summed
exactly once (out-of-order ones wait for the gap), a new global — σ, λ refitted by the evidence — at the
end of a window in which something was summed. Sums split exactly across shards.

An upload is validated completely before anything changes: values bounded by `max_abs`, and the
statistics must be statistics of some samples — `n` a positive whole number equal to the envelope's
`n_samples` (which the core's token bucket charges), `[[S, b], [bᵀ, q]]` positive semi-definite,
`n·min‖φ‖² <= tr S_k <= n·max‖φ‖²` (features are bounded, RFF features have a constant norm), and with
labels clipped to `±B` at the agent, `q <= n·B²` and `‖b_k‖² <= tr S_k · q` — so one hostile upload cannot
make the global posterior improper for everyone, nor claim more samples or larger labels than it has
(docs/algorithms.md §4.11).

With `[fleet.robust] aggregation = "robust"` (docs/algorithms.md §4.13) the global is no longer the exact
sum: an upload whose residuals under the current global are implausible is taken with weight 0, and no
client's samples may exceed `share_cap` of the global's — an upload that would put its client over the
cap is taken with the fraction that fits (a tempered contribution). Each member's whole sums then count with the
weight of the systematic screen (how far its own fit sits from the members' geometric median), and σ is fitted
no lower than the median member's residual level (:mod:`.robust_evidence`; docs/reliability.md §7.2.1).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from streamfed.algorithms.fedbnr import packed_check
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters
from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
from streamfed.algorithms.fedbnr.packed_check import Scan, scan_upload
from streamfed.algorithms.fedbnr.robust_evidence import MIN_MEMBERS, noise_floored_fit, robust_centre
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.algorithms.fedbnr.wire import global_message
from streamfed.algorithms.in_order import check_room
from streamfed.algorithms.shares import Robust, RobustShares, share_allowance
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.core.discount import MAX_CLOCK_SKEW_S, add_at_latest
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats, check_labelled_scatter, unpack_upper
from streamfed.wire.message import Message

__all__ = ["FedBNRAggregation", "RobustFedBNRServer", "Robust", "TemperedUpload", "check_statistics", "checked_upload",
           "residual_ratio", "share_allowance", "upload_of"]

_MAX_WHOLE = 2.0**53  # beyond this a float no longer counts samples exactly
_REL = 1e-9  # relative slack of every inequality: far above rounding of honest sums, far below any attack


def check_statistics(st: SufficientStats, *, max_abs: float, phi_sq: float | None, whole_n: bool = True,
                     label_bound: float | None = None, phi_sq_min: float | None = None) -> None:
    """`ValueError` unless `st` could be the statistics of `n` samples with `phi_sq_min <= ‖φ‖² <= phi_sq`
    and `|y| <= label_bound` (None: only the count and the bound are checked — for noised or masked
    uploads; `label_bound` / `phi_sq_min` None: those checks are skipped). Every inequality holds for
    non-negative sample weights too (time-weighted statistics, `whole_n=False`).

    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3))
    >>> check_statistics(st, max_abs=1e100, phi_sq=2.0, label_bound=1.0, phi_sq_min=2.0)
    >>> check_statistics(st, max_abs=1e100, phi_sq=1.0)
    Traceback (most recent call last):
    ...
    ValueError: tr S exceeds n·max‖φ‖²: not the scatter of n feature vectors
    >>> check_statistics(st, max_abs=1e100, phi_sq=2.0, label_bound=0.5)
    Traceback (most recent call last):
    ...
    ValueError: q = 3 exceeds n·B² = 0.75: labels beyond the label bound ±0.5
    """
    n, q = float(st.n), float(st.q)
    _check_count(n, whole_n)
    bound = max_abs
    if (abs(q) > bound or st.S.max() > bound or st.S.min() < -bound
            or (st.b.size and (st.b.max() > bound or st.b.min() < -bound))):
        raise ValueError(f"a statistic is beyond ±{bound:g}")
    if phi_sq is None:
        return
    trace = np.trace(st.S, axis1=-2, axis2=-1)
    if np.any(trace > n * phi_sq * (1.0 + _REL) + _REL):
        raise ValueError("tr S exceeds n·max‖φ‖²: not the scatter of n feature vectors")
    # RFF features have one norm for every input (algorithms.md §2.1): tr S = n‖φ‖², so the trace pins the count —
    # a claim of more samples than the scatter holds (the n = 2^53) is refused here
    if phi_sq_min is not None and np.any(trace < n * phi_sq_min * (1.0 - _REL) - _REL):
        raise ValueError(f"tr S = {float(np.min(trace)):g} is below n·min‖φ‖² = {n * phi_sq_min:g}: "
                         f"n = {n:g} claims more samples than the scatter holds")
    # labels within ±B (q <= nB²), Cauchy–Schwarz on b, and Σ [φ; y][φ; y]ᵀ positive semi-definite (algorithms.md §4.11)
    check_labelled_scatter(st.S, st.b, q, n, label_bound)


def _check_count(n: float, whole_n: bool) -> None:
    # time-weighted statistics (forgetting) count samples with weights: a positive total, not a whole number
    if not (0.0 < n <= _MAX_WHOLE and (n == math.floor(n) and n >= 1.0 if whole_n else True)):
        raise ValueError(f"n = {n!r} is not a count of samples")


def _refusal(code: int, scan: Scan, n: float, q: float, max_abs: float, phi_sq_min: float | None,
             label_bound: float | None) -> str:
    """`check_statistics`' message (and `check_labelled_scatter`'s) for what :func:`scan_upload` found first."""
    if code == packed_check.BEYOND_MAX_ABS:
        return f"a statistic is beyond ±{max_abs:g}"
    if code == packed_check.TRACE_HIGH:
        return "tr S exceeds n·max‖φ‖²: not the scatter of n feature vectors"
    if code == packed_check.TRACE_LOW:
        assert phi_sq_min is not None
        return (f"tr S = {float(np.min(scan.trace)):g} is below n·min‖φ‖² = {n * phi_sq_min:g}: "
                f"n = {n:g} claims more samples than the scatter holds")
    if code == packed_check.LABELS:
        assert label_bound is not None
        bound2 = float(n) * (float(label_bound) * float(label_bound))
        return f"q = {q:g} exceeds n·B² = {bound2:g}: labels beyond the label bound ±{label_bound:g}"
    if code == packed_check.B_ROW:
        return "|b_i| exceeds √(S_ii·q): b is not Σ φ_i y of these samples"
    return "‖b‖² exceeds tr S · q: b is not Σ φ y of these samples"


def checked_upload(msg: Message, *, max_abs: float, phi_sq: float | None, whole_n: bool = True,
                   label_bound: float | None = None, phi_sq_min: float | None = None) -> Upload:
    """`upload_of(msg)` after `check_statistics` of its statistics — the same verdicts and messages, the same
    statistics — from the packed triangle in one compiled pass (:mod:`.packed_check`) and one factorisation.
    It runs for every upload an aggregator takes in.

    >>> from streamfed.algorithms.fedbnr.wire import stats_update_message
    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3), kernel_version="v").to_packed()
    >>> msg = stats_update_message("f", "a", 1, st["S_upper"], st["b"], st["n"], st["q"], global_version=0,
    ...                            kernel_version="v", created=0.0)
    >>> checked_upload(msg, max_abs=1e100, phi_sq=2.0, label_bound=1.0) == upload_of(msg)
    True
    >>> checked_upload(msg, max_abs=1e100, phi_sq=2.0, label_bound=0.5)
    Traceback (most recent call last):
    ...
    ValueError: q = 3 exceeds n·B² = 0.75: labels beyond the label bound ±0.5
    """
    n, q = float(msg.arrays["n"]), float(msg.arrays["q"])
    _check_count(n, whole_n)
    scan = scan_upload(msg.arrays["S_upper"], msg.arrays["b"], n, q, max_abs=max_abs, phi_sq=phi_sq,
                       phi_sq_min=phi_sq_min, label_bound=label_bound)
    if scan.code != packed_check.OK:
        raise ValueError(_refusal(scan.code, scan, n, q, max_abs, phi_sq_min, label_bound))
    if phi_sq is not None:
        # [[S, b], [bᵀ, q]] + jitter positive semi-definite: LinAlgError (a ValueError) when it is not
        np.linalg.cholesky(scan.aug)
    return _upload(msg, scan.S, scan.b, n, q)


def _upload(msg: Message, S: np.ndarray, b: np.ndarray, n: float, q: float) -> Upload:
    stats = _new(SufficientStats)  # its __init__ would copy S and b once more
    stats.__dict__.update(S=S, b=b, n=n, q=q, kernel_version=str(msg.kernel_version), epoch=int(msg.epoch))
    if "time" in msg.arrays:  # with forgetting: the statistics' reference time and the raw sample count
        return Upload(str(msg.client), int(msg.seq), int(msg.global_version), stats,
                      float(msg.arrays["time"]), int(msg.n_samples))
    return Upload(str(msg.client), int(msg.seq), int(msg.global_version), stats)


def upload_of(msg: Message) -> Upload:
    """The :class:`Upload` a decoded update carries: `Upload.from_message(stats_fields(msg))`, built with one copy
    of each array instead of three (the scatter unpacked straight from the message's read-only view into a new
    array the statistics own; the codec has checked its shapes and dtypes, which `SufficientStats` would check
    again). It runs for every upload an aggregator takes in.

    >>> from streamfed.algorithms.fedbnr.wire import stats_fields, stats_update_message
    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3), kernel_version="v").to_packed()
    >>> msg = stats_update_message("f", "a", 1, st["S_upper"], st["b"], st["n"], st["q"], global_version=0,
    ...                            kernel_version="v", created=0.0)
    >>> upload_of(msg) == Upload.from_message(stats_fields(msg))
    True
    """
    s_upper, b = msg.arrays["S_upper"], msg.arrays["b"]
    return _upload(msg, unpack_upper(s_upper, b.shape[-1]), np.array(b, dtype=np.float64), float(msg.arrays["n"]),
                   float(msg.arrays["q"]))


_new = object.__new__


# ============================================================================ robust aggregation


@durable("fedbnr.TemperedUpload")
@dataclass(frozen=True, eq=False)
class TemperedUpload(Upload):
    """An upload summed with `weight` ∈ [0, 1] (its `stats` are what the client declared; the server sums
    `weight · stats`). `weight = 0`: accepted — its sequence number counts as included — but nothing summed.

    >>> s = SufficientStats.zeros(2, (1,), kernel_version="v")
    >>> TemperedUpload("a", 1, 0, s, weight=0.5).weight
    0.5
    """

    weight: float = 1.0


@durable("fedbnr.RobustFedBNRServer")
class RobustFedBNRServer(FedBNRServer):
    """A :class:`FedBNRServer` that sums a :class:`TemperedUpload` with its weight (everything else as the
    exact server: validation of what the client declared, order, duplicates).

    >>> srv = RobustFedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False)
    >>> d = SufficientStats.from_samples(np.ones((4, 1, 2)), np.ones(4), kernel_version="v")
    >>> srv.apply(TemperedUpload("a", 1, 0, d, weight=0.25)), srv.stats.n
    (True, 1.0)
    """

    # the noise floor of the evidence fit (:mod:`.robust_evidence`): on by default; class defaults let a server
    # pickled before it restore (its members' sums then start empty and fill as they upload)
    noise_floor: str | bool = "fit"  # "fit", "leave_out" or "off" (the aggregation sets it from Robust.noise_floor)
    _members: dict[str, tuple[SufficientStats, float]] | None = None
    floors: np.ndarray | None = None  # per kernel, the median member's residual level at the last refit

    def _sum(self, up: Upload) -> None:
        w = float(getattr(up, "weight", 1.0))
        st = up.stats if w == 1.0 else up.stats.scaled(w)
        self._add(st, up.time)
        if w > 0.0:
            self._add_member(up.client, st, up.time)

    def _add_member(self, client: str, st: SufficientStats, time: float) -> None:
        """Each member's own (tempered) sums, held at its latest upload's time: the evidence's votes."""
        if self._members is None:
            self._members = {}
        self._members[client] = add_at_latest(self._members.get(client), st, time, self.discount)

    def refit(self) -> bool:
        """The evidence fit of the sums with `σ` floored at the median member's residual level
        (:func:`~.robust_evidence.noise_floored_fit`): fewer than half the members cannot make the fleet's
        kernel fit their labels by pulling `σ` down."""
        members = self._members or {}
        mode = self.noise_floor if isinstance(self.noise_floor, str) else ("fit" if self.noise_floor else "off")
        if mode == "off" or len(members) < MIN_MEMBERS:
            return super().refit()
        st = self.stats
        if st.n <= 0 or st.q <= 0:
            return False
        held = [m for m in self.member_sums().values() if m.n > 0]
        floors = np.zeros(self.n_kernels)
        for k in range(self.n_kernels):
            sig, lam, value, floors[k] = noise_floored_fit(
                st.S[k], st.b[k], st.n, st.q, [(m.S[k], m.b[k], m.q, m.n) for m in held], search=self.search,
                leave_out=mode == "leave_out")
            self.sigma[k], self.lam[k], self.log_evidence[k] = sig, lam, value
        self.floors = floors
        self._n_fitted = st.n
        return True

    def member_sums(self) -> dict[str, SufficientStats]:
        """Each member's own sums as taken (tempered), held at the server's time: what the evidence's noise floor
        and the systematic re-weighting read."""
        d = self.discount
        return {c: (m if d is None else d.shift(m, t, self.time)) for c, (m, t) in (self._members or {}).items()}

    def rebase(self, version: int, epoch: int) -> None:
        super().rebase(version, epoch)
        self._members = {}
        self.member_weights = {}
        self._reweighted = False

    # per member, the weight its whole sums count with in the next global (the aggregation's systematic screen);
    # a member not named counts fully
    member_weights: dict[str, float] | None = None
    _reweighted = False

    def publish(self) -> GlobalModel:
        """As the exact server's, after the sums are rebuilt as `Σ_c ω_c · (member c's sums)` when some member's
        weight `ω_c` (:attr:`member_weights`) is below 1, or was at the last publish: a member's influence is its
        weight times everything it ever sent, so a member cannot bank influence while it looked honest."""
        weights = self.member_weights or {}
        members = self._members or {}
        if members and (self._reweighted or any(w < 1.0 for w in weights.values())):
            total = SufficientStats.zeros(self.dim, (self.n_kernels,), self.kernel_version, self.epoch)
            for c, held in self.member_sums().items():
                w = float(weights.get(c, 1.0))
                total += held if w == 1.0 else held.scaled(w)
            self.stats = total
            self._reweighted = any(w < 1.0 for w in weights.values())
        return super().publish()


def residual_ratio(st: SufficientStats, mean: np.ndarray, cov: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Per kernel `k`, an upload's mean squared residual under the posterior mean `μ_k`, exactly from its
    statistics — `r_k = (q − 2b_kᵀμ_k + μ_kᵀS_kμ_k)/n` = `(1/n) Σ (y − φ_kᵀμ_k)²` — divided by what the
    global's predictive expects of it, `v_k = σ_k² + tr(Σ_k S_k)/n` (the mean of `σ² + φᵀΣφ` over its
    samples). About 1 for fresh samples from the global's model; `mean (K, F)`, `cov (K, F, F)`, `sigma (K,)`.

    >>> s = SufficientStats.from_samples(np.ones((2, 1, 1)), np.array([1.0, 3.0]))
    >>> residual_ratio(s, np.array([[2.0]]), np.zeros((1, 1, 1)), np.ones(1))  # residuals ±1
    array([1.])
    """
    n = float(st.n)
    bm = np.einsum("kf,kf->k", st.b, mean)
    msm = np.einsum("kf,kfg,kg->k", mean, st.S, mean)
    r = np.maximum(float(st.q) - 2.0 * bm + msm, 0.0) / n  # ≥ 0 exactly; the clip removes rounding only
    v = sigma**2 + np.einsum("kfg,kfg->k", cov, st.S) / n
    return r / v


@durable("fedbnr.FedBNRAggregation")
class FedBNRAggregation(RobustShares, SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of FedBNR.

    >>> server = FedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False)
    >>> agg = FedBNRAggregation(server, phi_sq=2.0)
    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3), kernel_version="v")
    >>> agg.take("a", 1, Upload("a", 1, 0, st)); agg.pending()
    True
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    recoverable = True  # rebase: the clients upload their totals again on a new epoch
    # class-level defaults: an aggregation pickled before these existed restores as the exact one
    label_bound: float | None = None
    phi_sq_min: float | None = None
    robust: Robust | None = None

    def __init__(self, server: FedBNRServer, *, phi_sq: float, max_abs: float = 1e100,
                 check_stats: bool = True, label_bound: float | None = None, phi_sq_min: float | None = None,
                 robust: Robust | None = None, roster: int | None = None) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.server = server
        self.max_abs = float(max_abs)
        # off only for clients that add DP noise or secure-aggregation masks to their deltas, which make
        # single deltas improper (docs/algorithms.md §12)
        self.check_stats = bool(check_stats)
        self.phi_sq = float(phi_sq)
        self.phi_sq_min = None if phi_sq_min is None else float(phi_sq_min)
        self.label_bound = None if label_bound is None else float(label_bound)
        self._dirty = False  # something summed since the last global
        self.robust = robust
        if robust is not None and not isinstance(server, RobustFedBNRServer):
            raise ValueError("robust aggregation needs a RobustFedBNRServer (it sums tempered uploads)")
        if isinstance(server, RobustFedBNRServer) and robust is not None:
            if robust.noise_floor not in ("fit", "leave_out", "off"):
                raise ValueError(f"noise_floor must be 'fit', 'leave_out' or 'off', got {robust.noise_floor!r}")
            server.noise_floor = robust.noise_floor
        self._start_robust(roster)

    def _start_robust(self, roster: int | None) -> None:
        super()._start_robust(roster)
        self._reference: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def rebase(self, version: int, epoch: int) -> None:
        """Start over after the state was lost (docs/reliability.md § Lost state): the global becomes version
        `version` of epoch `epoch` with nothing summed; the clients join the epoch and upload their totals again,
        so the sums are rebuilt exactly. Robust mode starts cold again."""
        self.server.rebase(version, epoch)
        self._checked = None
        self.server.publish()
        self._dirty = False
        self._start_robust(self._roster)

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> Upload:
        checked = self.check_stats
        timed = self.server.discount is not None
        # check_statistics (discounted statistics — a half-life — are statistics of samples with weights in
        # (0, 1]: every bound holds), on the packed triangle in one pass
        up = checked_upload(msg, max_abs=self.max_abs, phi_sq=self.phi_sq if checked else None,
                            label_bound=self.label_bound if checked else None,
                            phi_sq_min=self.phi_sq_min if checked else None, whole_n=not timed)
        # n is public even in noised uploads (DP noises S, b, q only): the core's token bucket charges
        # n_samples, which bounds the real n only if they are one number (discounted: n ≤ the raw count, which
        # the server checks against n_samples)
        if timed and int(msg.n_samples) != up.count:
            raise ValueError(f"n_samples = {msg.n_samples} but the upload counts {up.count} samples")
        # an upload stamped in the future would discount everyone's statistics when the sums move to its time
        if timed and math.isfinite(up.time) and up.time > self.now() + MAX_CLOCK_SKEW_S:  # (∞: validate says)
            raise ValueError(f"upload time {up.time:.0f} is more than {MAX_CLOCK_SKEW_S:g} s ahead of this "
                             f"aggregator's clock")
        if not timed and int(msg.n_samples) != up.stats.n:
            raise ValueError(f"n_samples = {msg.n_samples} but the statistics count n = {up.stats.n:g}")
        # the server's own checks (kernel version/epoch, shapes, privacy floor, seq >= 1), without applying
        self.server.validate(up)
        self._check_cold_start(up.client)
        check_room(self.server.included, self.server.waiting(), up.client, up.seq, self.server.max_buffered)
        self._checked = up
        return up

    # the upload `check` last validated against the server, until it is taken (or the server starts over)
    _checked: Upload | None = None

    def take(self, client: str, seq: int, item: Upload) -> None:
        if item is self._checked and self.robust is None:
            # validated by `check` against the server as it still is (only `rebase` changes what validate
            # compares with, and it forgets this): summed without the server's second `validate`
            self._checked = None
            if self.server.apply(item, validated=True):
                self._dirty = True
            return
        super().take(client, seq, item)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_checked", None)  # a reference to an upload in flight: not part of the durable state
        return state

    def warm_up(self) -> None:
        """Load (or compile) the compiled check once, on empty statistics of the server's shape: not in the first
        window of a live run."""
        f, k = self.server.dim, self.server.n_kernels
        s_upper, b = np.zeros((k, f * (f + 1) // 2)), np.zeros((k, f))
        s_upper.flags.writeable = b.flags.writeable = False  # as decoded: numba specialises on writability
        scan_upload(s_upper, b, 1.0, 0.0, max_abs=self.max_abs, phi_sq=self.phi_sq, phi_sq_min=self.phi_sq_min,
                    label_bound=self.label_bound)
        if self.server.fit:  # and the evidence's compiled search, which the first refit runs
            fit_hyperparameters(np.eye(f), np.full(f, 0.1), float(f + 1), 1.0)

    def now(self) -> float:
        """The aggregator's clock (seconds since the epoch): no upload may be stamped far beyond it."""
        return time.time()

    # what the robust state machine (algorithms/shares.py) asks of FedBNR
    def _samples(self, item: Upload) -> float:
        """The upload's weight in the sums: its `n`, with a half-life as the server would hold it now."""
        d = self.server.discount
        return float(item.stats.n) * (1.0 if d is None else d.factor(item.time, self.server.time))

    def _apply(self, client: str, item: Upload, w: float) -> None:
        d = self.server.discount
        if d is not None and item.time > self.server.time:  # the sums move to a later time: so do the shares
            self.scale_held(d.factor(self.server.time, item.time))
        super()._apply(client, item, w)

    def _tempered(self, item: Upload, w: float) -> TemperedUpload:
        return TemperedUpload(item.client, item.seq, item.base_version, item.stats, item.time, item.count, weight=w)

    def _ratio(self, item: Upload) -> float:
        """The upload's residual ratio under the current global, kernels weighted as the global predicts."""
        if self._reference is None or self._reference[0] != self.server.version:
            self._refresh_reference()
        assert self._reference is not None
        _, mean, cov, sigma, weights = self._reference
        return float(weights @ residual_ratio(item.stats, mean, cov, sigma))

    _declared: dict[str, tuple[SufficientStats, float]] | None = None

    def _systematic(self, client: str, item: Upload) -> float | None:
        """The client's systematic level: with `D` the sums of everything it has sent (this upload included,
        whatever weight each was taken with), per kernel `gᵀ(S + ρI)⁻¹g / (n σ²)` with `g = b − Sμ` its
        residuals' correlation with its features under the global's mean `μ` and `ρ = σ²/λ²` the global's prior
        ratio — the mean squared residual a correction of the model fitted to its own samples would remove, over
        the noise level; kernels weighted as the global predicts. Noise contributes about `dof/n` of it."""
        if self._declared is None:
            self._declared = {}
        tot, _ = self._declared[client] = add_at_latest(self._declared.get(client), item.stats, item.time,
                                                        self.server.discount)
        if self._reference is None or self._reference[0] != self.server.version:
            self._refresh_reference()
        assert self._reference is not None
        _, mean, _, sigma, weights = self._reference
        centre = self._centre if self._centre is not None else mean
        lam = self.server.lam
        n = float(tot.n)
        if not n > 0:
            return None
        levels = np.zeros(len(sigma))
        basis = self._basis
        for k in range(len(sigma)):
            g = tot.b[k] - tot.S[k] @ centre[k]
            s_k = tot.S[k]
            if basis is not None:  # the fleet's leading directions: noise explains r/n of it there, not F/n
                g, s_k = basis[k].T @ g, basis[k].T @ s_k @ basis[k]
            a = s_k + (sigma[k] / lam[k]) ** 2 * np.eye(g.shape[0])
            levels[k] = float(g @ np.linalg.solve(a, g)) / (n * sigma[k] ** 2)
        return float(weights @ levels)

    def _refresh_reference(self) -> None:
        """The current global's posterior per kernel (mean, covariance), σ and the kernels' weights."""
        s = self.server
        k, f = s.n_kernels, s.dim
        mean, cov = np.zeros((k, f)), np.empty((k, f, f))
        for i in range(k):
            a = s.stats.S[i] / s.sigma[i] ** 2 + np.eye(f) / s.lam[i] ** 2
            cov[i] = np.linalg.inv(a)
            cov[i] = 0.5 * (cov[i] + cov[i].T)
            mean[i] = cov[i] @ (s.stats.b[i] / s.sigma[i] ** 2)
        le = np.asarray(s.log_evidence, dtype=np.float64) if s.stats.n > 0 else np.zeros(k)
        w = np.exp(le - np.max(le))
        self._reference = (s.version, mean, cov, s.sigma.copy(), w / w.sum())
        self._centre = None
        declared = {c: m for c, (m, _) in (self._declared or {}).items() if m.n > 0}
        if self.robust is not None and self.robust.systematic > 0.0 and len(declared) >= MIN_MEMBERS:
            rho = (s.sigma / s.lam) ** 2
            # the members' own means at ρ rounded to a quarter octave: a refit moves ρ a little at most versions,
            # and would otherwise make every member's means be solved again at every global (a robust centre does
            # not need ρ to more than that)
            means = self._own_means(declared, np.exp2(np.round(4.0 * np.log2(rho)) / 4.0))
            held = list(declared.values())
            self._centre = np.array([robust_centre(s.stats.S[i], [(m.S[i], m.b[i], m.q, m.n) for m in held],
                                                   float(rho[i]), means=means[:, i]) for i in range(k)])

        self._basis = None
        rank = int(getattr(self.robust, "systematic_rank", 0) or 0) if self.robust is not None else 0
        if self._centre is not None and 0 < rank < s.dim:
            self._basis = np.array([np.linalg.eigh(s.stats.S[i])[1][:, -rank:] for i in range(k)])

    _centre: np.ndarray | None = None  # per kernel, the geometric median of the members' own posterior means
    # per member: a fingerprint of its sums (n, q, Σb, versions), the prior ratios ρ = σ²/λ² per kernel and its
    # own posterior means (K, F); a member's means are solved again only when it sent more or a refit moved ρ — at
    # a thousand members, solving every member's at every global would cost the aggregator seconds per version
    _means_cache: dict[str, tuple[tuple, np.ndarray, np.ndarray]] | None = None

    def _own_means(self, declared: Mapping[str, SufficientStats], rho: np.ndarray) -> np.ndarray:
        """`μ_c = (S_c + ρ_k I)⁻¹ b_c` per member and kernel, `(members, K, F)` in `declared`'s order."""
        cache = self._means_cache if self._means_cache is not None else {}
        fresh: dict[str, tuple[tuple, np.ndarray, np.ndarray]] = {}
        out = []
        for c, m in declared.items():
            key = (float(m.n), float(m.q), float(m.b.sum()), m.kernel_version, m.epoch)
            hit = cache.get(c)
            if hit is None or hit[0] != key or not np.array_equal(hit[1], rho):
                eye = np.eye(m.S.shape[-1])
                hit = (key, rho.copy(), np.array([np.linalg.solve(m.S[i] + rho[i] * eye, m.b[i])
                                                  for i in range(rho.shape[0])]))
            fresh[c] = hit
            out.append(hit[2])
        self._means_cache = fresh  # members gone since are dropped
        return np.array(out)
    _basis: np.ndarray | None = None  # per kernel, the leading eigenvectors of the global scatter

    def _systematic_weight(self, client: str, item: Upload) -> float:
        """The systematic screen weighs a member's whole sums (:meth:`RobustFedBNRServer.publish`), not this
        upload: its level is recorded here and every member's weight set before the next global."""
        super()._systematic_weight(client, item)
        return 1.0

    def _member_weights(self) -> dict[str, float]:
        """`ω_c = min(1, systematic · median of the others' levels / level_c)` for every member with a level."""
        assert self.robust is not None
        levels = getattr(self, "_sys_level", None) or {}
        out: dict[str, float] = {}
        if self.robust.systematic <= 0.0:
            return out
        if len(levels) - 1 < self.robust.screen_clients:
            return out
        names = list(levels)
        values = np.array([levels[c] for c in names], dtype=np.float64)
        order = np.argsort(values, kind="stable")
        ranked = values[order]
        rank = np.empty(len(names), dtype=np.int64)
        rank[order] = np.arange(len(names))
        for c, level, r in zip(names, values, rank, strict=True):
            if level > 0.0:  # the median of the others: the sorted levels without this one (O(1) each, not O(m))
                out[c] = min(1.0, self.robust.systematic * _median_without(ranked, int(r)) / float(level))
        return out

    def systematic_levels(self) -> dict[str, float]:
        """Robust mode: each member's latest systematic level (:meth:`_systematic`)."""
        return dict(getattr(self, "_sys_level", None) or {})

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        if self.robust is not None and isinstance(self.server, RobustFedBNRServer):
            self.server.member_weights = self._member_weights()
        changed = super().close_window(order, mark)
        if changed and self.robust is not None:
            self._refresh_reference()  # screen against the global just published, not later running sums
        return changed

    def diagnostics(self) -> dict[str, float]:
        """Robust mode: uploads screened out, uploads taken with weight < 1, the largest client share of the sums."""
        return self.robust_diagnostics()

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[Upload]) -> tuple[dict[str, np.ndarray], int, int]:
        self._no_time_base("shard")
        st = items[0].stats.copy()
        for up in items[1:]:
            st += up.stats
        packed = st.to_packed()
        return ({k: np.asarray(packed[k], dtype=np.float64) for k in ("S_upper", "b", "n", "q")},
                int(st.n), int(self.server.epoch))

    def _no_time_base(self, role: str) -> None:
        if self.server.discount is not None:  # a partial carries no time: its sums could not be discounted exactly
            raise ValueError(f"a FedBNR {role} cannot sum discounted statistics (half_life_s) yet: run one aggregator")

    def read_partial(self, msg: Message) -> SufficientStats:
        self._no_time_base("reducer")
        fields = {k: np.array(msg.arrays[k], dtype=np.float64) for k in ("S_upper", "b", "n", "q")}
        fields.update(kernel_version=msg.kernel_version, epoch=msg.epoch)
        st = SufficientStats.from_packed(fields)
        if st.tag != (self.server.kernel_version, self.server.epoch):
            raise ValueError(f"partial for kernel version/epoch {st.tag}")
        n = float(st.n)
        if not (n >= 1 and n == math.floor(n)):
            raise ValueError(f"n = {n!r} is not a count of samples")
        return st

    checks_sums = True

    def check_sum(self, total: SufficientStats, n_samples: int) -> None:
        """The upload checks, on a sum: every bound of `check_statistics` is linear in the samples, or a positive
        semi-definite cone, so it holds for a sum of honest uploads, with the count their clear `n_samples`."""
        if float(total.n) != float(n_samples):
            raise ValueError(f"the sum counts n = {float(total.n):g} samples, its members said {n_samples}")
        checked = self.check_stats
        # no per-value cap on a sum (the fixed-point range of secure aggregation bounds each member's values)
        check_statistics(total, max_abs=math.inf, phi_sq=self.phi_sq if checked else None,
                         label_bound=self.label_bound if checked else None,
                         phi_sq_min=self.phi_sq_min if checked else None)

    def apply_partial(self, total: SufficientStats, n_clients: int, included: Mapping[str, int]) -> None:
        self.server.stats += total
        self.server.included = dict(included)
        self.server.publish()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        s = self.server
        packed = s.stats.to_packed()
        return global_message(fleet, sender, s.version, packed["S_upper"], packed["b"], packed["n"], packed["q"],
                              s.sigma, s.lam, s.log_evidence, dict(s.included), kernel_version=kernel_version,
                              epoch=s.epoch, time_base=None if s.discount is None else s.time)


def _median_without(ranked: np.ndarray, i: int) -> float:
    """`np.median` of the sorted `ranked` with its entry `i` left out (at least one entry remains)."""
    m = ranked.shape[0] - 1

    def at(j: int) -> float:  # entry j of the others, in order
        return float(ranked[j if j < i else j + 1])

    if m % 2:
        return at(m // 2)
    return (at(m // 2 - 1) + at(m // 2)) / 2.0
