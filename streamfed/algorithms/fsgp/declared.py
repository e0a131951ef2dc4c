"""What an honest FSGP upload can hold, from the configuration alone (docs/algorithms.md §6.13, "Declared
bounds"; issue 15).

Every covariance here is `c(x, x') = a² g(ρ)` with `0 < g ≤ 1`, so a sample's features `k = c(Z, x)` have
`|k_i| ≤ a²` and `‖k‖² ≤ M a⁴` whatever `x` is; agents clip labels to `±B` (`[fleet.robust] label_bound`, the
learner's units). So the statistics of `n` fresh samples under `(θ, σ, Z)` obey `tr P ≤ n·M·a⁴`, `q ≤ n·B²`.

Carried statistics (a client's pending samples carried to a new version by Bui et al.'s projection) need not:
the projection scales by `σ_b²/σ_a²` and multiplies by `W = c_b(Z_b, Z_a) C_a⁻¹`, whose norm the jitter alone
bounds (by `M a_b² / (ε a_a²)`). A client therefore *clamps* what it carries — scales `(P, r, q)` of its carried
pending samples by the largest `s ≤ 1` that puts them within the fresh bounds (:func:`clamp_to_declared`) — so
that every upload it sends obeys them. Scaling keeps `[[P, r], [rᵀ, q]]` positive semi-definite; `n` stays the
count. Honest carried samples are far inside `M a⁴` (that needs `x` next to all `M` inducing inputs at once),
so the clamp changes nothing in practice; when it does, those few samples (fewer than `min_upload`: pending
statistics leave as soon as there are that many) weigh less, never more.

>>> from streamfed.algorithms.fsgp.kernels import Hyper
>>> h = Hyper.initial("se", np.zeros((4, 1)), amplitude=2.0)
>>> feature_sq_bound(h)  # M a⁴
64.0
"""

from __future__ import annotations

import numpy as np

from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.fsgp.posterior import Stats

__all__ = ["clamp_to_declared", "feature_sq_bound", "within_box"]


def feature_sq_bound(hyper: Hyper) -> float:
    """`M a⁴`: the largest `‖c(Z, x)‖²` of any input `x` (`|c| ≤ a²` for every covariance here).

    >>> from streamfed.algorithms.fsgp.kernels import Hyper, cov
    >>> h = Hyper.initial("matern32", np.zeros((3, 2)), amplitude=1.5)
    >>> k = cov(h, h.Z, np.zeros((1, 2)))[:, 0]  # x on every inducing input: the bound is reached
    >>> bool(abs(k @ k - feature_sq_bound(h)) < 1e-12)
    True
    """
    return float(hyper.m) * hyper.amplitude ** 4


def clamp_to_declared(st: Stats, hyper: Hyper, label_bound: float | None) -> Stats:
    """`st` (of `n` samples, under `hyper`) scaled by the largest `s ≤ 1` with `tr(sP) ≤ n·M·a⁴` and (`label_bound`
    `B` given) `s·q ≤ n·B²`; `st` itself when it is within both.

    >>> from streamfed.algorithms.fsgp.kernels import Hyper
    >>> h = Hyper.initial("se", np.zeros((1, 1)))
    >>> s = Stats(np.array([[4.0]]), np.array([2.0]), 1.0, 1.0)  # ‖k‖² = 4 > M a⁴ = 1
    >>> t = clamp_to_declared(s, h, None); t.P.tolist(), t.r.tolist(), t.q, t.n
    ([[1.0]], [0.5], 0.25, 1.0)
    >>> clamp_to_declared(t, h, None) is t
    True
    """
    n = float(st.n)
    if n <= 0:
        return st
    scale = 1.0
    tr = float(np.trace(st.P))
    cap = n * feature_sq_bound(hyper)
    if tr > cap:
        scale = cap / tr
    if label_bound is not None and st.q > n * label_bound ** 2:
        scale = min(scale, n * label_bound ** 2 / st.q)
    if scale >= 1.0:
        return st
    return Stats(st.P * scale, st.r * scale, st.n, st.q * scale, st.epoch)


def within_box(Z: np.ndarray, box: float | None) -> bool:
    """Every inducing input within `±box` per coordinate (`box` None: anywhere finite).

    >>> within_box(np.array([[1.0, -2.0]]), 2.0), within_box(np.array([[2.5]]), 2.0)
    (True, False)
    """
    return box is None or bool(np.all(np.abs(Z) <= box))
