"""What an FSGP aggregator, shard or reducer runs (docs/algorithms.md, "FSGP"): every valid upload summed
exactly once under the current `(θ, σ, Z)`, a new global — after adopting averaged proposals when enough
came — at the end of a window in which something was summed.

An upload is validated completely before anything changes (docs/algorithms.md §6.13, "Declared bounds"):
values bounded by `max_abs`, `n` a whole number equal to the envelope's `n_samples` (which the core's token
bucket charges), and (unless `check_stats=False`) the statistics must be those of some samples under the
upload's version: `tr P ≤ n·M·a⁴` (every covariance is at most `a²`), `q ≤ n·B²` (agents clip labels to
`±B`), `r_i² ≤ P_ii·q` and `‖r‖² ≤ tr P·q` (Cauchy–Schwarz over the samples) and `[[P, r], [rᵀ, q]]` positive
semi-definite. Carried statistics obey the same bounds: clients clamp what they carry (:mod:`.declared`). A
proposal weighs at most a reservoir (`reservoir`), keeps `a, ℓ, σ` in `[1e-3, 1e3]` and `Z` within the box
the inputs allow. So one hostile upload cannot make the global posterior improper, claim labels beyond `±B`
or features beyond the covariance, nor move the next version's `Z` out of the inputs' range.

With `[fleet.robust] aggregation = "robust"` (docs/algorithms.md §6.13, "Robust aggregation"; §10.2) the global is no
longer the exact sum: an upload whose residuals under the current global are implausible is taken with weight
0, and no client's samples may exceed `share_cap` of the global's (tempered contributions `w·stats`, a
cold-start quorum) — :class:`~streamfed.algorithms.shares.RobustShares`.

Sharding sums exactly while the version does not move (fixed hyperparameters); a shard
cannot carry uploads across versions it has not seen, so with learned hyperparameters run one aggregator.

Forgetting (`half_life_s`, :mod:`streamfed.core.discount`): an upload's statistics are discounted to its `time`,
so `n` is a weighted count in `(0, count]`, `count` its raw samples (the envelope's `n_samples`, what the rate
limit charges and the privacy floor counts). Every bound above is homogeneous in the sample weights, so it holds
for weighted samples with the weighted `n`. An upload stamped more than `MAX_CLOCK_SKEW_S` ahead of this
aggregator's clock is refused (it would move the sums there and discount every other client's statistics to
nothing). Robust shares are each client's weight in the discounted sums; partials carry their reference time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve

from streamfed.algorithms.fsgp.declared import feature_sq_bound, within_box
from streamfed.algorithms.fsgp.messages import TemperedUpload, Upload
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats
from streamfed.algorithms.fsgp.server import FSGPServer, RobustFSGPServer
from streamfed.algorithms.fsgp.wire import global_message, read_update
from streamfed.algorithms.in_order import check_room
from streamfed.algorithms.shares import Robust, RobustShares
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.core.discount import MAX_CLOCK_SKEW_S, Discount, is_discounted_count
from streamfed.core.durable import durable
from streamfed.core.stats import check_labelled_scatter
from streamfed.wire.message import Message

__all__ = ["FSGPAggregation", "PartialSum", "check_statistics", "residual_ratio"]

_MAX_WHOLE = 2.0**53
_REL = 1e-9  # relative slack of every inequality: far above rounding of honest sums, far below any attack


def check_statistics(st: Stats, *, max_abs: float, psd: bool = True, label_bound: float | None = None,
                     feat_sq: float | None = None, count: int | None = None) -> None:
    """`ValueError` unless `n` counts samples, every value is within `±max_abs` and (`psd`) the statistics
    could be those of `n` samples with `|y| ≤ label_bound` and `‖k‖² ≤ feat_sq` (either None: not checked):
    `tr P ≤ n·feat_sq`, `q ≤ n·B²`, Cauchy–Schwarz for `r`, and the augmented statistic positive
    semi-definite (`psd=False`: the count and the bound only, for noised or masked uploads). `count` given
    (discounted statistics, forgetting): `n` is a weighted count in `(0, count]` — every bound holds for samples
    with weights in `(0, 1]` and their weighted `n`.

    >>> s = Stats.zeros(2); s.add(np.array([0.5, 0.5]), 1.0)
    >>> check_statistics(s, max_abs=1e100, label_bound=1.0, feat_sq=0.5)
    >>> check_statistics(s, max_abs=1e100, label_bound=0.5)
    Traceback (most recent call last):
    ...
    ValueError: q = 1 exceeds n·B² = 0.25: labels beyond the label bound ±0.5
    >>> check_statistics(s, max_abs=1e100, feat_sq=0.25)
    Traceback (most recent call last):
    ...
    ValueError: tr P = 0.5 exceeds n·M·a⁴ = 0.25: features beyond the covariance's amplitude
    >>> s.P[0, 1] = s.P[1, 0] = 5.0
    >>> check_statistics(s, max_abs=1e100)
    Traceback (most recent call last):
    ...
    numpy.linalg.LinAlgError: Matrix is not positive definite
    """
    n = float(st.n)
    if count is not None:
        if not (is_discounted_count(n, count) and count <= _MAX_WHOLE):
            raise ValueError(f"discounted count n = {n!r} is not in (0, {count}]")
    elif not (1.0 <= n <= _MAX_WHOLE and n == math.floor(n)):
        raise ValueError(f"n = {n!r} is not a count of samples")
    if max(abs(st.q), float(np.max(np.abs(st.P))), float(np.max(np.abs(st.r)))) > max_abs:
        raise ValueError(f"a statistic is beyond ±{max_abs:g}")
    if not psd:
        return
    q = float(st.q)
    trace = float(np.trace(st.P))
    if feat_sq is not None and trace > n * feat_sq * (1.0 + _REL) + _REL:
        raise ValueError(f"tr P = {trace:g} exceeds n·M·a⁴ = {n * feat_sq:g}: features beyond the covariance's "
                         f"amplitude")
    # labels within ±B (carried statistics are clamped to it), Cauchy–Schwarz on r — each sample a rank-one
    # [k; y][k; y]ᵀ, carried or not — and the augmented matrix positive semi-definite
    check_labelled_scatter(st.P, st.r, q, n, label_bound, names=("P", "r", "k"))


def residual_ratio(st: Stats, post: SparsePosterior) -> float:
    """An upload's mean squared residual under the predictive mean `kᵀw` of `post` (`w = σ⁻²B⁻¹r`), exactly
    from its statistics — `(q − 2wᵀr + wᵀPw)/n` = `(1/n) Σ (y − kᵀw)²` — over the mean predictive variance of
    its samples, `a² + σ² − tr(C⁻¹P)/n + tr(B⁻¹P)/n` (the mean of `c(x,x) + σ² − kᵀC⁻¹k + kᵀB⁻¹k`). About 1
    for fresh samples of the global's model. `st` must be of `post`'s version.

    >>> from streamfed.algorithms.fsgp.kernels import Hyper
    >>> post = SparsePosterior(Hyper.initial("se", np.zeros((1, 1)), sigma=1.0), Stats.zeros(1))
    >>> s = Stats.zeros(1); s.add(np.array([1.0]), 1.0); s.add(np.array([1.0]), -1.0)
    >>> residual_ratio(s, post)  # residuals ±1 under the prior mean 0, predictive variance a² + σ² = 2
    0.5
    """
    n = float(st.n)
    w = post.weights()
    res = max(float(st.q - 2.0 * w @ st.r + w @ st.P @ w), 0.0) / n  # ≥ 0 exactly; the clip removes rounding
    tr_c = float(np.trace(cho_solve((post.L_C, True), st.P, check_finite=False)))
    tr_b = float(np.trace(cho_solve((post.L_B, True), st.P, check_finite=False)))
    h = post.hyper
    v = max(h.amplitude ** 2 + h.noise_var - (tr_c - tr_b) / n, h.noise_var)
    return res / v


@durable("fsgp.PartialSum")
@dataclass(frozen=True)
class PartialSum:
    """A shard's sums: statistics and weighted sums of proposals. `+` adds two."""

    stats: Stats
    prop_sum: np.ndarray
    weight: float
    time: float = 0.0  # with forgetting: the reference time of `stats` (0 and ignored without)

    def __add__(self, other: PartialSum) -> PartialSum:
        return PartialSum(self.stats + other.stats, self.prop_sum + other.prop_sum, self.weight + other.weight,
                          self.time)

    def add_at(self, other: PartialSum, discount: Discount | None) -> PartialSum:
        """The sum of two partials, with forgetting both brought to the later of their times first."""
        if discount is None:
            return self + other
        t = max(self.time, other.time)
        return PartialSum(discount.shift(self.stats, self.time, t) + discount.shift(other.stats, other.time, t),
                          self.prop_sum + other.prop_sum, self.weight + other.weight, t)


@durable("fsgp.FSGPAggregation")
class FSGPAggregation(RobustShares, SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of FSGP.

    >>> from streamfed.algorithms.fsgp.kernels import Hyper
    >>> h = Hyper.initial("se", np.zeros((2, 1)))
    >>> agg = FSGPAggregation(FSGPServer(h, min_samples=1, learn_hyperparameters=False))
    >>> s = Stats.zeros(2); s.add(np.array([0.5, 0.5]), 1.0)
    >>> agg.take("a", 1, Upload("a", 1, 0, s)); agg.pending()
    True
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    # class-level defaults: an aggregation pickled before these existed restores as the exact one, unbounded
    label_bound: float | None = None
    max_weight: float | None = None
    z_box: float | None = None

    def __init__(self, server: FSGPServer, *, max_abs: float = 1e100, check_stats: bool = True,
                 label_bound: float | None = None, max_weight: float | None = None, z_box: float | None = None,
                 robust: Robust | None = None, roster: int | None = None) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.server = server
        self.max_abs = float(max_abs)
        # off only for clients that add DP noise or secure-aggregation masks (their single uploads are improper)
        self.check_stats = bool(check_stats)
        self.label_bound = None if label_bound is None else float(label_bound)
        self.max_weight = None if max_weight is None else float(max_weight)  # a proposal weighs at most a reservoir
        self.z_box = None if z_box is None else float(z_box)
        self._dirty = False
        self.robust = robust
        if robust is not None and not isinstance(server, RobustFSGPServer):
            raise ValueError("robust aggregation needs a RobustFSGPServer (it sums tempered uploads)")
        self._reference: tuple[int, SparsePosterior] | None = None
        self._start_robust(roster)

    def diagnostics(self) -> dict[str, float]:
        s = self.server
        return {"epoch": float(s.epoch), "sigma": s.hyper.sigma, "proposal_weight": s.prop_weight,
                "stale_dropped": float(s.stale_dropped), **self.robust_diagnostics()}

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> Upload:
        up = read_update(msg, self.server.hyper.kind)
        timed = self.server.discount is not None
        # n_samples is what the core's token bucket charges: a discounted upload's raw count (read as its `count`,
        # and n ≤ it, checked below), else its n (whether it should be discounted: the server's validate says)
        if not up.count and msg.n_samples != int(up.stats.n):
            raise ValueError(f"n_samples {msg.n_samples} but n = {up.stats.n:g}")
        # an upload stamped in the future would discount everyone's statistics when the sums move to its time
        if timed and math.isfinite(up.time) and up.time > self.now() + MAX_CLOCK_SKEW_S:  # (∞: validate says)
            raise ValueError(f"upload time {up.time:.0f} is more than {MAX_CLOCK_SKEW_S:g} s ahead of this "
                             f"aggregator's clock")
        # the bounds of the upload's own version (an older one the server no longer keeps is dropped as stale
        # when summed: its count and PSD are still checked)
        hyper = self.server.hyper_of(up.epoch)
        checked = self.check_stats
        check_statistics(up.stats, max_abs=self.max_abs, psd=checked,
                         label_bound=self.label_bound if checked else None,
                         feat_sq=feature_sq_bound(hyper) if checked and hyper is not None else None,
                         count=up.count if up.count else None)
        if up.proposal is not None:
            if float(np.max(np.abs(up.proposal.to_vector()))) > self.max_abs:
                raise ValueError(f"a proposed value is beyond ±{self.max_abs:g}")
            if self.max_weight is not None and up.weight > self.max_weight:
                raise ValueError(f"proposal weight {up.weight:g} exceeds the reservoir ({self.max_weight:g} samples) "
                                 f"a local fit runs on")
            if not within_box(up.proposal.Z, self.z_box):
                raise ValueError(f"proposed inducing inputs beyond ±{self.z_box:g} (the inputs' range)")
        self.server.validate(up)
        self._check_cold_start(up.client)
        check_room(self.server.included, self.server.waiting(), up.client, up.seq, self.server.max_buffered)
        return up

    def now(self) -> float:
        """The aggregator's clock (seconds since the epoch): no upload may be stamped far beyond it."""
        return time.time()

    # ---------------------------------------------------------------- robust mode (shares.RobustShares)
    def _samples(self, item: Upload) -> float:
        """The upload's weight in the sums: its `n`, with forgetting as the server would hold it now."""
        d = self.server.discount
        return float(item.stats.n) * (1.0 if d is None else d.factor(item.time, self.server.time))

    def _apply(self, client: str, item: Upload, w: float) -> None:
        d = self.server.discount
        if d is not None and item.time > self.server.time:  # the sums move to a later time: so do the shares
            self.scale_held(d.factor(self.server.time, item.time))
        super()._apply(client, item, w)

    def _tempered(self, item: Upload, w: float) -> TemperedUpload:
        return TemperedUpload(item.client, item.seq, item.base_version, item.stats, item.proposal, item.weight,
                              time=item.time, count=item.count, share=w)

    def _ratio(self, item: Upload) -> float:
        """The upload's residual ratio under the current global (its statistics carried to its version)."""
        s = self.server
        if self._reference is None or self._reference[0] != s.version:
            self._reference = (s.version, SparsePosterior(s.hyper, s.stats, s.jitter))
        st = s.to_current(item.stats)
        if st is None:
            return math.nan  # too old to carry: the server drops its statistics anyway
        return residual_ratio(st, self._reference[1])

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[Upload]) -> tuple[dict[str, np.ndarray], int, int]:
        s = self.server
        d = s.discount
        t_ref = max((up.time for up in items), default=0.0)  # with forgetting: the partial's reference time
        total = PartialSum(Stats.zeros(s.hyper.m, s.epoch), np.zeros(s.hyper.n_numbers), 0.0)
        for up in items:
            st = s.to_current(up.stats)
            if st is None:
                raise ValueError(f"upload of version {up.epoch} cannot be carried to {s.epoch}")
            if d is not None:
                st = d.shift(st, up.time, t_ref)
            w = up.weight if (up.proposal is not None and up.epoch == s.epoch) else 0.0
            vec = up.proposal.to_vector() * w if w > 0 and up.proposal is not None else 0.0
            total = PartialSum(total.stats + st, total.prop_sum + vec, total.weight + w)
        arrays = total.stats.packed()
        if d is not None:
            arrays["time"] = np.asarray(float(t_ref))
        d = s.hyper.d
        v = total.prop_sum
        arrays.update(theta=v[:1 + d].copy(), log_sigma=np.asarray(v[1 + d]), Z=v[2 + d:].reshape(s.hyper.m, d),
                      weight=np.asarray(total.weight))
        # n_samples: the raw count of the members (with forgetting n is discounted)
        return arrays, sum(int(up.n_samples) for up in items) if d is not None else int(total.stats.n), int(s.epoch)

    def read_partial(self, msg: Message) -> PartialSum:
        s = self.server
        if msg.epoch != s.epoch:
            raise ValueError(f"partial of (θ, Z) version {msg.epoch}; the reducer is at {s.epoch}")
        stats = Stats.from_packed(dict(msg.arrays), msg.epoch)
        n = float(stats.n)
        timed = s.discount is not None
        if ("time" in msg.arrays) != timed:
            raise ValueError(f"partial is {'' if 'time' in msg.arrays else 'not '}time-discounted, the reducer "
                             f"{'forgets' if timed else 'does not forget'}")
        t = float(msg.arrays["time"]) if timed else 0.0
        if timed and not (math.isfinite(t) and is_discounted_count(n, msg.n_samples)):
            raise ValueError(f"partial time {t!r} is not finite or its discounted count {n:g} is not in "
                             f"(0, {msg.n_samples}]")
        if not timed and not (n >= 1 and n == math.floor(n)):
            raise ValueError(f"n = {n!r} is not a count of samples")
        vec = np.concatenate((np.asarray(msg.arrays["theta"], dtype=np.float64).ravel(),
                              [float(msg.arrays["log_sigma"])], np.asarray(msg.arrays["Z"], dtype=np.float64).ravel()))
        return PartialSum(stats, vec, float(msg.arrays["weight"]), t)

    def combine_partials(self, totals: Sequence[PartialSum], order: Mapping[str, int]) -> PartialSum:
        """Partials' sums as one (with forgetting each brought to the latest partial's time first)."""
        out = totals[0]
        for t in totals[1:]:
            out = out.add_at(t, self.server.discount)
        return out

    checks_sums = True

    def check_sum(self, total: PartialSum, n_samples: int) -> None:
        """The upload checks on a sum of statistics (linear bounds and the PSD cone hold for sums), with the count
        the members said in the clear (with forgetting: the discounted `n` in `(0, n_samples]`)."""
        timed = self.server.discount is not None
        if not timed and float(total.stats.n) != float(n_samples):
            raise ValueError(f"the sum counts n = {float(total.stats.n):g} samples, its members said {n_samples}")
        hyper = self.server.hyper_of(total.stats.epoch)
        checked = self.check_stats
        # no per-value cap on a sum (each upload's was checked against max_abs by the fixed-point range)
        check_statistics(total.stats, max_abs=math.inf, psd=checked,
                         label_bound=self.label_bound if checked else None,
                         feat_sq=feature_sq_bound(hyper) if checked and hyper is not None else None,
                         count=int(n_samples) if timed else None)

    def apply_partial(self, total: PartialSum, n_clients: int, included: Mapping[str, int]) -> None:
        # a partial does not say which clients proposed (sharding with learned hyperparameters is not supported)
        self.server.add_sums(total.stats, total.prop_sum, total.weight, set(included) if total.weight > 0 else set(),
                             total.time)
        self.server.included = dict(included)
        self.server.publish()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        return global_message(fleet, sender, self.server.global_model(), kernel_version,
                              timed=self.server.discount is not None)
