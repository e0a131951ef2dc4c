"""A client's local factor between refinements (docs/algorithms.md, "PVI", "Between refinements"): the
predictive of the current `q` with every sample since the client's last refinement absorbed one at a time.

At each draw `(Z, β)` of the predictive mixture the conditional `q(u | Z, β)` is kept as in
:mod:`.posterior`, through `Σ = (K + B)⁻¹` and `w = Σ b` (`E[u] = K w`, `Cov[u] = K Σ K`). A sample
`(x, y)` with `k = k(Z, x)` multiplies `q(u)` by a Gaussian site in `f(x) = kᵀK⁻¹u` of precision `λ` and
score `r` at the current mean `μ = kᵀw`, which adds `λ k kᵀ` to `B` and `λ k μ + k r` to `b`; by
Sherman–Morrison, with `g = Σ k` and `v = kᵀ g`,

    Σ ← Σ - λ g gᵀ / (1 + λ v),    w ← w + g r / (1 + λ v).

* ``gaussian``: `λ = 1/σ²`, `r = (y - μ)/σ²` — the exact conjugate update: the natural parameters of `q(u)`
  gain `K⁻¹k kᵀK⁻¹/σ²` and `K⁻¹k y/σ²` (`B += k kᵀ/σ²`, `b += k y/σ²`, FSGP's `σ⁻²P`, `σ⁻²r`), so after
  `n` samples the state is the batch conjugate posterior, in any order;
* ``bernoulli``: one Newton step on `log sigmoid((2y - 1) f)` at `μ` (the Laplace site): `p = sigmoid(μ)`,
  `λ = p(1 - p)`, `r = y - p`.

The draws are :class:`~.predictive.Predictor`'s (the same `(Z, β)` per state), so with nothing absorbed the
predictions are the Predictor's. Cost per sample: `O(S M²)` (`S` draws, `M` inducing inputs), vectorised over
the draws. NumPy only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from streamfed.algorithms.pvi.likelihoods import predictive_y
from streamfed.algorithms.pvi.predictive import Predictor
from streamfed.algorithms.pvi.state import GlobalQ
from streamfed.core.durable import durable

__all__ = ["Local", "StreamedPredictor", "batched_cov"]

_S3, _S5 = math.sqrt(3.0), math.sqrt(5.0)
_MIN_CURVATURE = 1e-12  # a Bernoulli site's precision p(1 - p) at least this (|μ| ≲ 27): never 0 or negative


def batched_cov(kind: str, log_amp: np.ndarray, log_ls: np.ndarray, Z: np.ndarray, X: np.ndarray) -> np.ndarray:
    """FSGP's covariances (:func:`streamfed.algorithms.fsgp.kernels.cov`) for `S` draws at once: `log_amp (S,)`,
    `log_ls (S, d)`, `Z (S, M, d)`, `X (T, d)` → `c(Z_s, X)` as `(S, M, T)`.

    >>> from streamfed.algorithms.fsgp.kernels import Hyper, cov
    >>> h = Hyper("matern32", 0.1, np.array([0.2, -0.1]), 0.0, np.array([[0.0, 1.0], [0.5, 0.5]]))
    >>> X = np.array([[0.3, 0.2]])
    >>> c = batched_cov("matern32", np.array([0.1]), h.log_ls[None], h.Z[None], X)
    >>> bool(np.allclose(c[0], cov(h, h.Z, X), rtol=1e-14, atol=0))
    True
    """
    return _profile(kind, np.exp(2.0 * log_amp)[:, None, None], np.exp(-log_ls)[:, None, None, :], Z, X)


def _profile(kind: str, a2: np.ndarray, inv_ls: np.ndarray, Z: np.ndarray, X: np.ndarray) -> np.ndarray:
    """:func:`batched_cov` from `a² (S, 1, 1)` and `1/ℓ (S, 1, 1, d)`."""
    delta = (X[None, None, :, :] - Z[:, :, None, :]) * inv_ls
    rho2 = np.einsum("smtd,smtd->smt", delta, delta)
    if kind == "se":
        return a2 * np.exp(-0.5 * rho2)
    rho = np.sqrt(rho2)
    if kind == "matern32":
        return a2 * (1.0 + _S3 * rho) * np.exp(-_S3 * rho)
    if kind == "matern52":
        return a2 * (1.0 + _S5 * rho + (5.0 / 3.0) * rho2) * np.exp(-_S5 * rho)
    raise ValueError(f"unknown covariance {kind!r}")


class Local(NamedTuple):
    """One input `x (d,)`, its `k (S, M)`, `g = Σ k (S, M)` and `f`'s mean and variance `(S,)`, per draw."""

    x: np.ndarray
    k: np.ndarray
    g: np.ndarray
    mean: np.ndarray
    var: np.ndarray


@durable("pvi.StreamedPredictor")
class StreamedPredictor:
    """The predictive of state `g` with samples absorbed since (:meth:`absorb`).

    >>> g = GlobalQ.initial("se", np.zeros((1, 1)), np.array([0.0, 0.0, np.log(0.5)]), "fixed")
    >>> p = StreamedPredictor(g)
    >>> p.predict_many(np.zeros((1, 1)))[1].round(12).tolist()  # the prior: a² + σ²
    [1.25]
    >>> p.absorb(np.zeros(1), 2.0)  # one sample at Z: E[u] = 2 a²/(a² + σ²) (jitter aside)
    >>> round(float(p.predict_many(np.zeros((1, 1)))[0][0]), 5), p.n_absorbed
    (1.6, 1)
    """

    def __init__(self, g: GlobalQ, likelihood: str = "gaussian", n_draws: int = 8, seed: int = 0,
                 jitter: float = 1e-6) -> None:
        base = Predictor(g, likelihood, n_draws, seed, jitter)
        self.base = base
        self.likelihood = likelihood
        self.kind = g.kind
        d = g.d
        self.Z = np.stack([c.hyper.Z for c in base.conds])  # (S, M, d)
        betas = np.stack([beta for _, beta in base.points])
        self.log_amp, self.log_ls = betas[:, 0].copy(), betas[:, 1:1 + d].copy()
        self.log_sigmas = base.log_sigmas
        self.noise = np.exp(2.0 * self.log_sigmas)
        self._min_noise = float(self.noise.min())
        eye = np.eye(g.m)
        # R = L_K⁻¹ (kᵀK⁻¹k = ‖R k‖²), Σ = (K + B)⁻¹ = L⁻ᵀ L⁻¹, w: per draw, from the base's factorisations
        self.K = np.stack([c.K for c in base.conds])
        self.R = np.stack([_lower_inverse(c.L_K, eye) for c in base.conds])
        Linv = np.stack([_lower_inverse(c.L, eye) for c in base.conds])
        self.Sigma = np.einsum("skm,skn->smn", Linv, Linv)
        self.w = np.stack([c.w for c in base.conds])
        self.n_absorbed = 0

    def __getstate__(self) -> dict:
        """The state without the last input's cache (recomputed on demand; a stored state need not carry it)."""
        state = dict(self.__dict__)
        for cache in ("_last", "_a2", "_inv_ls"):
            state.pop(cache, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def n_draws(self) -> int:
        return int(self.w.shape[0])

    # ------------------------------------------------------------------ f given (Z, β), per draw
    def _f_moments(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`k (S, M, T)`, `g = Σ k (S, M, T)`, mean `kᵀw (S, T)` and variance of `f (S, T)` per draw."""
        a2 = getattr(self, "_a2", None)
        if a2 is None:  # fixed per state: computed once (the per-sample path)
            a2 = self._a2 = np.exp(2.0 * self.log_amp)[:, None, None]
            self._inv_ls = np.exp(-self.log_ls)[:, None, None, :]
        k = _profile(self.kind, a2, self._inv_ls, self.Z, X)
        Rk = self.R @ k
        g = self.Sigma @ k
        mean = np.einsum("sm,smt->st", self.w, k)
        # k(x,x) - kᵀK⁻¹k + kᵀΣk; k(x,x) - kᵀK⁻¹k >= 0 exactly, rounding must not make a variance negative
        var = a2[:, :, 0] - np.einsum("smt,smt->st", Rk, Rk) + np.einsum("smt,smt->st", k, g)
        return k, g, mean, np.maximum(var, 0.0)

    def predict_many(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances of `y` at `X (T, d)`."""
        X = np.asarray(X, dtype=np.float64)
        if self.n_absorbed == 0:
            return self.base.predict_many(X)  # the state itself, by its triangular solves
        _, _, mean, var = self._f_moments(X)
        return predictive_y(self.likelihood, mean, var, self.log_sigmas)

    def local(self, x: np.ndarray) -> Local:
        """What :meth:`absorb` and :meth:`predict_local` need of one input `x (d,)` (the last one is kept: a
        prediction then the learning of the same input compute it once)."""
        x = np.asarray(x, dtype=np.float64).reshape(1, -1)
        key = (x.tobytes(), self.n_absorbed)
        last = getattr(self, "_last", None)
        if last is not None and last[0] == key:
            return last[1]
        k, g, mean, var = self._f_moments(x)
        loc = Local(x[0], k[:, :, 0], g[:, :, 0], mean[:, 0], var[:, 0])
        self._last = (key, loc)
        return loc

    def predict_local(self, loc: Local) -> tuple[float, float]:
        """Mean and variance of `y` at the input of `loc` (as :meth:`predict_many`, for one input)."""
        if self.n_absorbed == 0:  # the state itself, by its triangular solves (as predict_many)
            m, v = self.base.predict_many(loc.x[None, :])
            return float(m[0]), float(v[0])
        if self.likelihood != "gaussian":
            m, v = predictive_y(self.likelihood, loc.mean[:, None], loc.var[:, None], self.log_sigmas)
            return float(m[0]), float(v[0])
        # the mixture's moments (predictive_y's Gaussian case, inlined: this is the per-sample path)
        s = loc.mean.size
        mean = float(loc.mean.sum()) / s
        var = (float((loc.var + self.noise).sum()) + float(loc.mean @ loc.mean)) / s - mean * mean
        return mean, max(var, self._min_noise)

    def absorb(self, x: np.ndarray, y: float, loc: Local | None = None) -> None:
        """Fold the sample `(x, y)` into every draw's `q(u | Z, β)` (`loc`: :meth:`local` of `x`, if already
        computed); `ValueError` (and nothing changed) when a result would not be finite."""
        if loc is None:
            loc = self.local(x)
        k, g, mu = loc.k, loc.g, loc.mean
        v = np.einsum("sm,sm->s", k, g)  # kᵀΣk
        if self.likelihood == "gaussian":
            lam = 1.0 / self.noise
            r = (float(y) - mu) * lam
        else:
            p = 0.5 * (1.0 + np.tanh(0.5 * mu))  # sigmoid, overflow-free
            lam = np.maximum(p * (1.0 - p), _MIN_CURVATURE)
            r = float(y) - p
        denom = 1.0 + lam * np.maximum(v, 0.0)
        with np.errstate(over="ignore", invalid="ignore"):  # refused below, not warned about
            w = self.w + g * (r / denom)[:, None]
            Sigma = self.Sigma - (g * (lam / denom)[:, None])[:, :, None] * g[:, None, :]
            finite = math.isfinite(float(w.sum()) + float(Sigma.sum()))  # one reduction each: a NaN or ∞ shows
        if not finite:
            raise ValueError("absorbing the sample would make the local posterior non-finite")
        self.w, self.Sigma = w, Sigma
        self.n_absorbed += 1

    def u_moments(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per draw, `E[u] = K w` and `Cov[u] = K Σ K` of `q(u | Z, β)`."""
        return [(K @ w, K @ S @ K) for K, S, w in zip(self.K, self.Sigma, self.w, strict=True)]


def _lower_inverse(L: np.ndarray, eye: np.ndarray) -> np.ndarray:
    from scipy.linalg import solve_triangular

    # C order, as a state restored from a file has it: a matmul's rounding may depend on the layout
    return np.ascontiguousarray(solve_triangular(L, eye, lower=True, check_finite=False))
