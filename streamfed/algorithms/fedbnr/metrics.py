"""How well a FedBNR client predicts its own stream (docs/algorithms.md §4.10): the running prequential
metrics of its Gaussian predictions (:class:`PrequentialMetrics`), and the loss of the best fixed ridge
predictor in hindsight they are compared with (:func:`ridge_loss`, the regret's reference)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["Z95", "PrequentialMetrics", "ridge_loss"]

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
