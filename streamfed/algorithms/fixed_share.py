"""Fixed share over experts' predictive densities (Herbster & Warmuth's switching mixture; docs/algorithms.md §5.9):
the prequential mixture that lets a client's loss track the best of its experts at every horizon.

Each step, with weights `w_t` (summing to one) over `K` experts whose predictive densities of the observed `y_t`
are `p_{t,i}`:

* the mixture predicts with `Σ_i w_{t,i} p_i(·)` and pays `−log Σ_i w_{t,i} p_{t,i}`;
* Bayes: `v_i = w_{t,i} p_{t,i} / Σ_j w_{t,j} p_{t,j}`;
* share: `w_{t+1,i} = (1 − α) v_i + α / K`.

`α = 0` is the Bayesian model average (it tracks the best *fixed* expert, and once an expert has lost for a
while it never comes back in time); `α > 0` keeps every weight ≥ `α/K`, so the mixture switches to whichever
expert is best *now*. Regret (log loss, any `p > 0`), over `T` steps, from uniform `w_1` (from other initial
weights, `log K` below becomes `log(1/w_{1,i})` of the expert the sequence starts with):

* against any fixed expert `i`: `L_mix ≤ L_i + log K + T·log(1/(1 − α))`;
* against any sequence of experts with `m` switches: `L_mix ≤ L_seq + log K + m·log(K/α) + (T − 1 − m)·log(1/(1 − α))`.

Everything is kept in the log domain: a density that underflows to 0 or an expert far behind never makes a weight
non-finite.

>>> fs = FixedShare(2, switch_rate=0.0)
>>> loss = fs.update(np.log([0.5, 0.25]))  # Bayes: w ∝ (0.5·0.5, 0.5·0.25)
>>> [round(float(w), 6) for w in fs.weights], round(loss, 6)  # the mixture paid −log(0.375)
([0.666667, 0.333333], 0.980829)
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.core.durable import durable

__all__ = ["FixedShare", "gaussian_log_density", "mixture_moments"]


@durable("fedbnr-personal.FixedShare")
class FixedShare:
    """Fixed-share weights over `n_experts` experts (module docstring), in the log domain.

    >>> fs = FixedShare(3, switch_rate=0.03)
    >>> fs.weights.tolist()
    [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]
    >>> _ = fs.update(np.array([-50.0, 0.0, -1.0]))
    >>> bool(fs.weights.min() >= 0.03 / 3 - 1e-15)  # never below α/K
    True
    """

    def __init__(self, n_experts: int, switch_rate: float = 0.01, prior: np.ndarray | None = None) -> None:
        if int(n_experts) < 1:
            raise ValueError(f"n_experts must be >= 1, got {n_experts!r}")
        a = float(switch_rate)
        if not (0.0 <= a < 1.0):
            raise ValueError(f"switch_rate must be in [0, 1), got {switch_rate!r}")
        self.n_experts = int(n_experts)
        self.switch_rate = a
        if prior is None:
            self.log_weights = np.full(self.n_experts, -math.log(self.n_experts))
        else:  # initial weights w_1 (the regret bounds' log K becomes log(1/w_1,i))
            w1 = np.asarray(prior, dtype=np.float64)
            if w1.shape != (self.n_experts,) or not np.all(np.isfinite(w1)) or np.any(w1 <= 0):
                raise ValueError(f"prior: {self.n_experts} positive finite weights, got {prior!r}")
            self.log_weights = np.log(w1 / w1.sum())
        self.loss = 0.0  # the mixture's cumulative log loss, −Σ_t log Σ_i w_{t,i} p_{t,i}

    @property
    def weights(self) -> np.ndarray:
        w = np.exp(self.log_weights - self.log_weights.max())
        return w / w.sum()

    def update(self, log_p: np.ndarray) -> float:
        """Fold one step's log predictive densities of the observed target (one per expert); returns the
        mixture's log loss of that step. A non-finite entry (a density of 0 or an expert that could not
        predict) counts as −∞ for that expert; a step where no expert has a finite density is refused."""
        lp = np.asarray(log_p, dtype=np.float64)
        if lp.shape != (self.n_experts,):
            raise ValueError(f"expected {self.n_experts} log densities, got shape {lp.shape}")
        lp = np.where(np.isfinite(lp), lp, -np.inf)
        if not np.any(np.isfinite(lp)):
            raise ValueError("no expert has a finite predictive density")
        joint = self.log_weights + lp
        top = float(joint.max())
        log_mix = top + math.log(float(np.exp(joint - top).sum()))
        log_v = joint - log_mix  # the Bayes step, normalised
        a = self.switch_rate
        if a > 0.0:
            # log((1 − α) v + α/K), without leaving the log domain
            share = math.log(a) - math.log(self.n_experts)  # (α/K may underflow where log α does not)
            keep = math.log1p(-a) + log_v
            hi = np.maximum(keep, share)
            self.log_weights = hi + np.log1p(np.exp(np.minimum(keep, share) - hi))
        else:
            self.log_weights = np.where(np.isfinite(log_v), log_v, -1e300)
        self.log_weights -= float(self.log_weights.max())
        self.log_weights -= math.log(float(np.exp(self.log_weights).sum()))
        self.loss -= log_mix
        return -log_mix

    def update_floats(self, log_p: list[float] | tuple[float, ...]) -> float:
        """:meth:`update` for a few experts in Python floats (the same equations, no NumPy per step: a
        per-sample caller with two experts pays a few µs instead of ~30)."""
        k = self.n_experts
        if len(log_p) != k:
            raise ValueError(f"expected {k} log densities, got {len(log_p)}")
        if k == 2 and self.switch_rate > 0.0:
            return self._update_pair(float(log_p[0]), float(log_p[1]))
        joint = [w + (v if math.isfinite(v) else -math.inf)
                 for w, v in zip(self.log_weights.tolist(), map(float, log_p), strict=True)]
        top = max(joint)
        if top == -math.inf:
            raise ValueError("no expert has a finite predictive density")
        log_mix = top + _log_sum_exp_shifted(joint, top)
        a = self.switch_rate
        if a > 0.0:
            share = math.log(a) - math.log(k)
            keep0 = math.log1p(-a) - log_mix
            new = []
            for j in joint:
                keep = keep0 + j
                hi, lo = (keep, share) if keep >= share else (share, keep)
                new.append(hi + math.log1p(math.exp(lo - hi)))
        else:
            new = [j - log_mix if j > -math.inf else -1e300 for j in joint]
        top = max(new)
        norm = top + _log_sum_exp_shifted(new, top)
        self.log_weights = np.array([v - norm for v in new])
        self.loss -= log_mix
        return -log_mix

    def _update_pair(self, lp0: float, lp1: float) -> float:
        """:meth:`update_floats` written out for two experts and `α > 0` (scalars only)."""
        lw = self.log_weights
        j0 = float(lw[0]) + (lp0 if math.isfinite(lp0) else -math.inf)
        j1 = float(lw[1]) + (lp1 if math.isfinite(lp1) else -math.inf)
        top, lo = (j0, j1) if j0 >= j1 else (j1, j0)
        if top == -math.inf:
            raise ValueError("no expert has a finite predictive density")
        log_mix = top + math.log1p(math.exp(lo - top))
        a = self.switch_rate
        share = math.log(a) - math.log(2.0)
        keep0 = math.log1p(-a) - log_mix
        n0, n1 = _log_add(keep0 + j0, share), _log_add(keep0 + j1, share)
        norm = _log_add(n0, n1)
        lw[0], lw[1] = n0 - norm, n1 - norm
        self.loss -= log_mix
        return -log_mix


def _log_add(u: float, v: float) -> float:
    """`log(eᵘ + eᵛ)`."""
    hi, lo = (u, v) if u >= v else (v, u)
    return hi + math.log1p(math.exp(lo - hi))


def _log_sum_exp_shifted(values: list[float], top: float) -> float:
    """`log Σ exp(v - top)` (`top` the largest value); two values: `log1p(exp(lo - top))`."""
    if len(values) == 2:
        return math.log1p(math.exp(min(values) - top))
    return math.log(sum(math.exp(v - top) for v in values))

def gaussian_log_density(y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """`log N(y; mean, var)`, elementwise.

    >>> round(float(gaussian_log_density(np.array(0.0), np.array(0.0), np.array(1.0))), 6)
    -0.918939
    """
    return -0.5 * (np.log(2.0 * np.pi * var) + (y - mean) ** 2 / var)


def mixture_moments(weights: np.ndarray, means: np.ndarray, variances: np.ndarray) -> tuple[float, float]:
    """Mean and variance of the Gaussian mixture `Σ_i w_i N(μ_i, v_i)` (exact moments: the within-expert
    variance plus the spread of the experts' means), the variance floored at 1e-300.

    >>> mixture_moments(np.array([0.5, 0.5]), np.array([-1.0, 1.0]), np.array([1.0, 1.0]))
    (0.0, 2.0)
    """
    mean = float(weights @ means)
    spread = float(weights @ ((means - mean) ** 2))
    return mean, max(float(weights @ variances) + spread, 1e-300)
