"""How well a FedBNR client predicts its own stream (docs/algorithms.md §4.10): the running prequential
metrics of its Gaussian predictions (:class:`PrequentialMetrics`), and the loss of the best fixed ridge
predictor in hindsight they are compared with — from statistics (:func:`ridge_loss`, one solve per kernel), or
maintained sample by sample (:class:`RidgeComparator`, what a client's regret reads)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streamfed.algorithms.fedbnr._compiled import kern
from streamfed.algorithms.fedbnr.factor import factorise
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["Z95", "PrequentialMetrics", "RidgeComparator", "ridge_loss"]

Z95 = 1.959963984540054  # central 95% interval of a standard normal: ±Z95


@durable("fedbnr.PrequentialMetrics")
@dataclass
class PrequentialMetrics:
    """Running prequential (predict, then learn) metrics of a Gaussian predictive.

    >>> m = PrequentialMetrics()
    >>> m.update(0.0, 1.0, 0.5)
    >>> m.count, m.mse, m.coverage95
    (1, 0.25, 1.0)
    >>> round(m.mean_nlpd, 6)
    1.043939
    """

    count: int = 0
    sq_loss: float = 0.0
    covered: int = 0
    nlpd_sum: float = 0.0

    def update(self, mean: float, var: float, y: float) -> None:
        r = y - mean
        self.count += 1
        self.sq_loss += r * r
        self.covered += int(abs(r) <= Z95 * math.sqrt(var))
        self.nlpd_sum += 0.5 * math.log(2.0 * math.pi * var) + 0.5 * r * r / var

    def update_many(self, mean: np.ndarray, var: np.ndarray, y: np.ndarray) -> None:
        r = y - mean
        self.count += int(r.shape[0])
        self.sq_loss += float(r @ r)
        self.covered += int(np.count_nonzero(np.abs(r) <= Z95 * np.sqrt(var)))
        self.nlpd_sum += float((0.5 * np.log(2.0 * np.pi * var) + 0.5 * r * r / var).sum())

    @property
    def mse(self) -> float:
        return self.sq_loss / self.count if self.count else math.nan

    @property
    def coverage95(self) -> float:
        """Fraction of targets inside the central 95% predictive interval."""
        return self.covered / self.count if self.count else math.nan

    @property
    def mean_nlpd(self) -> float:
        """Mean negative log predictive density."""
        return self.nlpd_sum / self.count if self.count else math.nan


def ridge_loss(stats: SufficientStats, sigma: float | np.ndarray, lam: float | np.ndarray) -> np.ndarray:
    """Loss of the best fixed ridge predictor in hindsight, per kernel:
    `min_w Σ(y - φᵀw)² + (σ²/λ²)‖w‖² = q - bᵀ(S + (σ²/λ²)I)⁻¹b`."""
    s_mat = stats.S.reshape((-1, stats.dim, stats.dim))
    b = stats.b.reshape((-1, stats.dim))
    kk = s_mat.shape[0]
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (kk,))
    lam_ = np.broadcast_to(np.asarray(lam, dtype=np.float64), (kk,))
    out = np.array([stats.q - b[k] @ np.linalg.solve(s_mat[k] + (sig[k] / lam_[k]) ** 2 * np.eye(stats.dim),
                                                      b[k]) for k in range(kk)])
    return out.reshape(stats.batch_shape) if stats.batch_shape else out[0]


@durable("fedbnr.RidgeComparator")
class RidgeComparator:
    """The best fixed ridge predictor in hindsight, kept up to date one sample at a time (docs/algorithms.md
    §4.10). Per kernel, with `r = σ²/λ²`, the augmented matrix of the samples seen,

        [ rI + Σφφᵀ   Σφy ]  =  CᵀC,     C = [ R  u ]
        [ Σyφᵀ        Σy² ]                 [ 0  ρ ]

    has the upper Cholesky factor `C` whose last pivot gives the comparator's loss: `ρ² = q - uᵀu =
    q - bᵀ(S + rI)⁻¹b` (:func:`ridge_loss`). A sample `(φ, y)` is one rank-one update of `C` (`O(F²)`, no
    solve); a new `r` (the client's `σ, λ` changed) costs a refactorisation (`O(F³)`) from the statistics — only
    of the kernels that can still be the best (:meth:`best`). `n` counts the samples folded in.

    >>> phi, y = np.array([[[1.0, 0.0]], [[0.0, 2.0]]]), np.array([1.0, -1.0])
    >>> c = RidgeComparator.of(SufficientStats.zeros(2, (1,)), np.ones(1))
    >>> c.fold_samples(phi, y)
    >>> c.n, bool(np.allclose(c.loss(), ridge_loss(SufficientStats.from_samples(phi, y), 1.0, 1.0)))
    (2, True)
    """

    def __init__(self, factor: np.ndarray, reg: np.ndarray, n: int) -> None:
        self.factor = factor
        self.reg = reg
        self.n = int(n)

    @classmethod
    def of(cls, stats: SufficientStats, reg: np.ndarray) -> RidgeComparator:
        """The comparator of statistics `stats` (batch `(K,)`) with regularisers `reg (K,)` (`O(K·F³)`)."""
        reg = np.array(reg, dtype=np.float64).reshape(-1)
        kk, f = reg.shape[0], stats.dim
        s_mat, b = stats.S.reshape((kk, f, f)), stats.b.reshape((kk, f))
        # factorise's working precision σ⁻²S + λ⁻²I at σ = 1, λ = r^-½ is S + rI
        factor = factorise(s_mat, b, stats.q, np.ones(kk), 1.0 / np.sqrt(reg), np.ones((kk, f)))
        return cls(factor, reg, int(round(stats.n)))

    def fold_rows(self, stage: np.ndarray, stage_y: np.ndarray, start: int, stop: int) -> None:
        """Take the staged rows `start..stop-1` of a client's stage (`(K, F, B)`, `(B,)`)."""
        if stop > start:
            kern.fold_rows(self.factor, stage, stage_y, start, stop)
            self.n += stop - start

    def fold_samples(self, phis: np.ndarray, ys: np.ndarray) -> None:
        """Take samples `phis (T, K, F)`, `ys (T,)`."""
        if ys.shape[0]:
            kern.fold_samples(self.factor, np.ascontiguousarray(phis, dtype=np.float64),
                              np.ascontiguousarray(ys, dtype=np.float64))
            self.n += int(ys.shape[0])

    def best(self, reg: np.ndarray, stats: Callable[[], SufficientStats]) -> tuple[float, int]:
        """`(loss, kernel)` of the best kernel at regularisers `reg (K,)`, exactly. A kernel whose factor is at
        another `r` is refactorised (from `stats()`, the statistics of the `n` samples folded in) only if it can
        be the best: the loss `L(r)` is non-decreasing in `r` and `L(r)/r` non-increasing (both objectives are
        compared point by point), so `L(r') ∈ [min(1, r'/r), max(1, r'/r)]·L(r)`, and a kernel whose lower bound
        is above another's upper bound is left at its old `r` (it keeps taking samples there, which is all the
        bound needs)."""
        reg = np.asarray(reg, dtype=np.float64)
        loss = self.loss()
        ratio = reg / self.reg
        exact = ratio == 1.0
        lo = np.where(exact, loss, np.minimum(ratio, 1.0) * loss)
        hi = np.where(exact, loss, np.maximum(ratio, 1.0) * loss)
        stale = np.flatnonzero(~exact & (lo <= hi.min() * (1.0 + 1e-9)))  # (slack: rounding of the losses)
        if stale.size:
            st = stats()
            if int(round(st.n)) != self.n:
                raise ValueError(f"statistics of {st.n:g} samples for a comparator of {self.n}")
            f = st.dim
            s_mat, b = st.S.reshape((-1, f, f))[stale], st.b.reshape((-1, f))[stale]
            self.factor[stale] = factorise(s_mat, b, st.q, np.ones(stale.size), 1.0 / np.sqrt(reg[stale]),
                                           np.ones((stale.size, f)))
            self.reg[stale] = reg[stale]
            loss = self.loss()
        candidates = np.flatnonzero(self.reg == reg)  # the best kernel is among these (see above)
        k = int(candidates[np.argmin(loss[candidates])])
        return float(loss[k]), k

    def loss(self) -> np.ndarray:
        """`min_w Σ(y - φᵀw)² + r‖w‖²` per kernel, `(K,)`."""
        rho = self.factor[:, -1, -1]
        return rho * rho
