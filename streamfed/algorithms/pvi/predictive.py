"""Predictions from the current `q` (docs/algorithms.md, "PVI"): the mixture over `S` draws of
`(Z, β) ~ q(φ)` of `q(f | Z, β)`, mapped through the likelihood (:func:`.likelihoods.predictive_y`).
The draws are fixed per state (seeded by the version), so predictions between two states are
deterministic; `S = 0` uses the mean of `q(φ)`. NumPy only.
"""

from __future__ import annotations

import numpy as np

from streamfed.algorithms.pvi.likelihoods import predictive_y
from streamfed.algorithms.pvi.posterior import ConditionalQ, beta_hyper
from streamfed.algorithms.pvi.state import GlobalQ
from streamfed.core.durable import durable

__all__ = ["Predictor"]


@durable("pvi.Predictor")
class Predictor:
    """The predictive of state `g`.

    >>> g = GlobalQ.initial("se", np.zeros((2, 1)), np.array([0.0, 0.0, np.log(0.5)]), "fixed")
    >>> mean, var = Predictor(g).predict_many(np.zeros((1, 1)))  # no factor: the prior, a² + σ²
    >>> float(mean[0]), round(float(var[0]), 12)
    (0.0, 1.25)
    """

    def __init__(self, g: GlobalQ, likelihood: str = "gaussian", n_draws: int = 8, seed: int = 0,
                 jitter: float = 1e-6) -> None:
        self.state = g
        self.likelihood = likelihood
        rng = np.random.default_rng([int(seed), int(g.version)])
        self.points = g.points(int(n_draws), rng)
        factors = g.others(None)
        self.conds = [ConditionalQ(beta_hyper(g.kind, beta, Z), factors, jitter) for Z, beta in self.points]
        self.log_sigmas = np.array([float(beta[-1]) for _, beta in self.points])

    def predict_many(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances of `y` at `X (T, d)`."""
        X = np.asarray(X, dtype=np.float64)
        parts = [c.predict_f(X) for c in self.conds]
        means = np.stack([p[0] for p in parts])
        variances = np.stack([p[1] for p in parts])
        return predictive_y(self.likelihood, means, variances, self.log_sigmas)

    def log_lik(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-sample predictive log-density of `y`: Gaussian, `log (1/S) Σ_s N(y; μ_s, v_s + σ_s²)` (the
        mixture itself); Bernoulli, `log P(y)`."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if self.likelihood == "gaussian":
            parts = [c.predict_f(X) for c in self.conds]
            logs = np.stack([-0.5 * (np.log(2 * np.pi * (v + np.exp(2 * ls))) + (y - m) ** 2 / (v + np.exp(2 * ls)))
                             for (m, v), ls in zip(parts, self.log_sigmas, strict=True)])
            top = logs.max(axis=0)
            return top + np.log(np.mean(np.exp(logs - top), axis=0))
        mean, _ = self.predict_many(X)
        p = np.clip(mean, 1e-300, 1 - 1e-16)
        return np.where(y > 0.5, np.log(p), np.log1p(-p))
