"""What a FedBNR client may make its own (docs/algorithms.md §4.7, §4.9): how much it trusts the other
clients, and its own `σ, λ`. Uploads and globals are never touched by either: the server's sums stay exact.

**Power prior** (`others_weight = α`). A client may temper the *other* clients' statistics in its working
posterior, `p(w) ∝ N(0, λ²I) · L_own(w) · L_others(w)^α`: `S_work = S_own + α (S_global - S_own∩global)`,
likewise `b, n, q`. `α = 1` (default) is exact FedBNR — the centralised posterior; `α = 0` is local-only.
`others_weight="auto"` picks α from :data:`OTHERS_WEIGHT_GRID` at every new global by maximising the
evidence of the client's own data under that prior, `log Z(α·others + own) - log Z(α·others)` (empirical
Bayes): :func:`choose_others_weight`.

**Local hyperparameters** (`local_hyperparameters=True`): at every global the client fits `σ_k, λ_k` on its
own working statistics instead of taking the global's (:func:`fit_local`).

>>> own = SufficientStats.from_samples(np.ones((4, 1, 2)), np.ones(4))
>>> others = SufficientStats.from_samples(np.ones((8, 1, 2)), -np.ones(8))
>>> choose_others_weight(others, own, np.ones(1), np.ones(1), 1.0)  # the others contradict it: ignore them
0.0
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters, log_evidence
from streamfed.core.stats import SufficientStats

__all__ = ["OTHERS_WEIGHT_GRID", "choose_others_weight", "fit_local"]

#: Candidate power-prior weights of the other clients' statistics for `others_weight="auto"`.
OTHERS_WEIGHT_GRID: tuple[float, ...] = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def choose_others_weight(others: SufficientStats, own: SufficientStats, sigma: np.ndarray, lam: np.ndarray,
                         current: float) -> float:
    """The α of :data:`OTHERS_WEIGHT_GRID` maximising the evidence of a client's own data under the
    power prior `N(0, λ²I) × L_others^α`: `log Z(α·others + own) - log Z(α·others)`, with the
    kernels' evidences combined as an equal-prior mixture (`current` when no score is finite).
    `O(F³)` per grid point and kernel."""
    best, best_score = current, -np.inf
    for alpha in OTHERS_WEIGHT_GRID:
        prior = others.scaled(alpha)
        scores = (np.atleast_1d(log_evidence(prior + own, sigma, lam))
                  - np.atleast_1d(log_evidence(prior, sigma, lam)))
        top = float(scores.max())
        score = top + math.log(float(np.exp(scores - top).sum()))
        if score > best_score:
            best, best_score = alpha, score
    return float(best)


def fit_local(s_mat: np.ndarray, b: np.ndarray, n: float, q: float, sigma: np.ndarray,
              lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Type-II ML of `σ_k, λ_k` on a client's working statistics `S (K, F, F), b (K, F), n, q` (decayed ones
    with forgetting: then the evidence is a heuristic, the prior there being only `λ⁻²I` on average). Falls
    back to the given `sigma, lam (K,)` while there is nothing to fit."""
    if not (n > 1.0 and q > 0.0):
        return sigma, lam
    out_s, out_l = np.array(sigma, dtype=np.float64), np.array(lam, dtype=np.float64)
    for k in range(out_s.shape[0]):
        sym = np.triu(s_mat[k]) + np.triu(s_mat[k], 1).T  # S may carry rounding asymmetry
        out_s[k], out_l[k], _ = fit_hyperparameters(sym, b[k], n, q)
    return out_s, out_l
