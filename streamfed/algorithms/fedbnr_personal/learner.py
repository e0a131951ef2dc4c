"""Hierarchical (shared + personal) online FedBNR: exact Bayesian inference from sufficient statistics.

Model (one feature map `φ`, `F` features). Client `k`'s samples follow

    y = φ(x)ᵀ(w + δ_k) + ε,    w ~ N(0, λ²I) (shared),   δ_k ~ N(0, τ²I) (personal),   ε ~ N(0, σ²)

`τ → 0` is exact (pooled) FedBNR, `λ → 0` is local-only learning; in between, every client borrows
strength from the others exactly as much as the evidence says the clients resemble each other.

**Marginalised contributions.** With `δ_k` integrated out, client `k`'s data are `y_k ~ N(Φ_k w, C_k)`,
`C_k = σ²I + τ²Φ_kΦ_kᵀ`. As a function of `w` this likelihood is

    log p(y_k | w) = -½ wᵀP_k w + r_kᵀ w + log Z_k,      B_k = τ⁻²I + σ⁻²S_k,
    P_k = Φ_kᵀC_k⁻¹Φ_k = τ⁻²σ⁻² B_k⁻¹ S_k,   r_k = Φ_kᵀC_k⁻¹y_k = τ⁻²σ⁻² B_k⁻¹ b_k,
    log Z_k = log N(y_k; 0, C_k) = the FedBNR evidence of (S_k, b_k, n_k, q_k) with prior scale τ

(Woodbury on `C_k⁻¹`; `P_k = σ⁻²S_k - σ⁻⁴S_kB_k⁻¹S_k` written without the cancellation). All of it depends
only on the client's statistics `(S_k, b_k, n_k, q_k)`. In the eigenbasis `S_k = U diag(e) Uᵀ`, `z = Uᵀb_k`:
`P_k = U diag(e / (σ² + τ²e)) Uᵀ` and `r_k = U (z / (σ² + τ²e))`.

**Shared posterior.** `w | all data ~ N(A⁻¹h, A⁻¹)` with `A = λ⁻²I + Σ_k P_k`, `h = Σ_k r_k`, and the exact
log evidence of the whole hierarchical model is

    log p(y) = Σ_k log Z_k  - F log λ - ½ log|A| + ½ hᵀA⁻¹h

The server keeps each client's statistics (it dedupes uploads by `(client, seq)` anyway), computes the
`P_k, r_k`, publishes `(A, h)` and fits `σ, λ, τ` by maximising that evidence (type-II ML). Summing
per client makes the result independent of how a client's samples were split into uploads and of the
order uploads arrive (to rounding).

**Client prediction.** Client `k`'s own data depend on `v_k = w + δ_k` only, so the exact posterior of
`v_k` given everything is a Bayesian linear regression on the client's *own* statistics with the prior
`v_k ~ N(μ₋ₖ, A₋ₖ⁻¹ + τ²I)`, where `A₋ₖ = A - P_k`, `h₋ₖ = h - r_k`, `μ₋ₖ = A₋ₖ⁻¹h₋ₖ` is the shared
posterior without the client's own (marginalised) contribution — the client computes `P_k, r_k` of its
own included statistics itself, no per-client message is needed. Prior precision and shift without
cancellation: `Λ₀ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹A₋ₖ`, `Λ₀μ₋ₖ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹h₋ₖ`. Between globals every own
sample is one rank-one update of the augmented Cholesky factor (as in :mod:`.fedbnr`): `O(F²)`.

**Forgetting (`γ < 1`, drifting streams), on both levels.** Every statistic is time-weighted: a sample
observed at time `t` counts `γ^(T - t)` at time `T` (a weighted likelihood). Uploads carry deltas
decayed to their time stamp; the server holds `S_k(T) = Σ_u γ^(T - t_u) ΔS_u` (order-free), so the shared
part carries what is happening *now* across all clients, the personal part what is happening now at
this client. At each global the client's posterior is rebuilt exactly from the decayed statistics.
Between globals (a round), the whole working precision decays by `γ` per time unit — the cavity prior
included, which is right for the other clients' data in it (it ages like data) and a heuristic for
the structural part (`λ, τ`); the next global makes it exact again.

**τ by prequential evidence** (:class:`FedBNRHierMixClient` / :class:`FedBNRHierMixServer`): under drift
the static evidence of the time-weighted window measures how alike the clients are *within* the window,
not how fast each drifts; on the Beijing streams it picks a nearly pooled model (`τ ≪ λ`). The mixture
runs one model per `τ` of a fixed grid (each with `σ, λ` by the exact evidence at that `τ`) and averages
them per client with weights from each model's discounted prequential log predictive density — the
marginal likelihood of the sequential model (dynamic model averaging).

Local-only baseline: the same learner with a private server per client. With one client the model is
Bayesian linear regression with prior variance `λ² + τ²` (`λ`, `τ` not separately identifiable), so the
server fits `(σ, √(λ²+τ²))` by the evidence and splits the prior variance evenly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from scipy import linalg, optimize

from streamfed.algorithms.fedbnr import _kernels as kern
from streamfed.algorithms.fedbnr.checks import check_positive
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters, spectral_log_evidence
from streamfed.algorithms.fedbnr.features import _DefaultFeatures, _MapList
from streamfed.algorithms.fedbnr.metrics import PrequentialMetrics
from streamfed.algorithms.in_order import apply_in_order
from streamfed.core.features import FeatureMap
from streamfed.core.stats import SufficientStats, pack_upper, unpack_upper

__all__ = [
    "HierUpload",
    "HierGlobal",
    "marginal_contribution",
    "hierarchical_log_evidence",
    "FedBNRHierClient",
    "FedBNRHierServer",
    "FedBNRHierMixClient",
    "FedBNRHierMixServer",
    "fit_hierarchical",
]


# ============================================================================ maths


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + a.T)


def marginal_contribution(stats: SufficientStats, sigma: float, tau: float) -> tuple[np.ndarray, np.ndarray, float]:
    """`(P, r, log Z)` of one client's statistics: its likelihood of the shared `w` with its personal
    `δ ~ N(0, τ²I)` integrated out is `exp(-½wᵀPw + rᵀw + log Z)` (module docstring).

    >>> rng = np.random.default_rng(0)
    >>> phi, y = rng.standard_normal((5, 2)), rng.standard_normal(5)
    >>> p, r, log_z = marginal_contribution(SufficientStats.from_samples(phi, y), 0.5, 2.0)
    >>> c = 0.25 * np.eye(5) + 4.0 * phi @ phi.T  # C = σ²I + τ²ΦΦᵀ
    >>> bool(np.allclose(p, phi.T @ np.linalg.solve(c, phi)) and np.allclose(r, phi.T @ np.linalg.solve(c, y)))
    True
    """
    s2, t2 = sigma * sigma, tau * tau
    f = stats.dim
    s_mat = _sym(stats.S)
    b_mat = s_mat / s2 + np.eye(f) / t2
    chol = np.linalg.cholesky(b_mat)
    rhs = np.concatenate([s_mat, stats.b[:, None]], axis=1) / (t2 * s2)
    sol = np.linalg.solve(chol.T, np.linalg.solve(chol, rhs))  # B⁻¹[S | b] τ⁻²σ⁻²
    p = _sym(sol[:, :f])
    r = sol[:, f]
    # log Z: FedBNR evidence with prior scale τ, from the same factor (|I + τ²σ⁻²S| = τ^{2F}|B|).
    u = np.linalg.solve(chol, stats.b / s2)
    logdet = 2.0 * np.log(np.diag(chol)).sum() + f * math.log(t2)
    log_z = -0.5 * stats.n * math.log(2 * math.pi * s2) - 0.5 * logdet - 0.5 * (stats.q / s2 - u @ u)
    return p, r, float(log_z)


def hierarchical_log_evidence(
    client_stats: Sequence[SufficientStats], sigma: float, lam: float, tau: float
) -> tuple[float, np.ndarray, np.ndarray]:
    """`(log p(y), A, h)`: exact log evidence of the hierarchical model and the shared posterior's
    natural parameters (`w | y ~ N(A⁻¹h, A⁻¹)`), from each client's statistics."""
    f = client_stats[0].dim
    a = np.eye(f) / (lam * lam)
    h = np.zeros(f)
    total = 0.0
    for st in client_stats:
        p, r, log_z = marginal_contribution(st, sigma, tau)
        a += p
        h += r
        total += log_z
    chol = np.linalg.cholesky(a)
    u = np.linalg.solve(chol, h)
    total += -f * math.log(lam) - np.log(np.diag(chol)).sum() + 0.5 * u @ u
    return float(total), a, h


class _Spectra:
    """Eigendecompositions of every client's `S_k`, for `O(K F²)`-per-point evidence evaluations."""

    def __init__(self, client_stats: Sequence[SufficientStats]) -> None:
        es, us, zs = [], [], []
        self.n = np.array([st.n for st in client_stats])
        self.q = np.array([st.q for st in client_stats])
        for st in client_stats:
            e, u = np.linalg.eigh(_sym(st.S))
            es.append(np.clip(e, 0.0, None))
            us.append(u)
            zs.append(u.T @ st.b)
        self.e = np.stack(es)  # (K, F)
        self.z = np.stack(zs)  # (K, F)
        self.u_cat = np.concatenate(us, axis=1)  # (F, K F): [U_1 | U_2 | ...]
        self.f = self.e.shape[1]

    def log_evidence(self, log_sigma: float, log_lam: float, log_tau: float) -> float:
        s2, l2, t2 = math.exp(2 * log_sigma), math.exp(2 * log_lam), math.exp(2 * log_tau)
        denom = s2 + t2 * self.e  # (K, F)
        per_client = spectral_log_evidence(self.e, self.z**2, self.n, self.q, np.full(len(self.n), log_sigma),
                                           np.full(len(self.n), log_tau))
        d = (self.e / denom).ravel()
        a = (self.u_cat * d) @ self.u_cat.T
        a[np.diag_indices(self.f)] += 1.0 / l2
        h = self.u_cat @ (self.z / denom).ravel()
        try:
            chol = np.linalg.cholesky(a)
        except np.linalg.LinAlgError:
            return -math.inf
        u = np.linalg.solve(chol, h)
        return float(per_client.sum() - self.f * log_lam - np.log(np.diag(chol)).sum() + 0.5 * u @ u)


def fit_hierarchical(
    client_stats: Sequence[SufficientStats], start: tuple[float, float, float] | None = None,
    *, max_evals: int = 300, fixed_tau: float | None = None,
) -> tuple[float, float, float, float]:
    """Type-II ML `(σ, λ, τ, log p(y))` of the hierarchical model (Nelder-Mead on the logs, from `start`
    or from the pooled FedBNR fit; search box relative to the data scale as in `fit_hyperparameters`)."""
    total = client_stats[0].copy()
    for st in client_stats[1:]:
        total += st
    sig0, lam0, _ = fit_hyperparameters(_sym(total.S), total.b, total.n, total.q)
    if len(client_stats) == 1:  # λ, τ not identifiable: split the prior variance λ² + τ² evenly
        lam, tau = lam0 / math.sqrt(2.0), lam0 / math.sqrt(2.0)
        if fixed_tau is not None:
            tau = float(fixed_tau)
            lam = math.sqrt(max(lam0**2 - tau**2, 1e-6 * lam0**2))
        return sig0, lam, tau, float(spectral_log_evidence(
            *_one_spectrum(total), total.n, total.q, np.log(sig0), np.log(math.hypot(lam, tau))))
    spectra = _Spectra(client_stats)
    y_scale = math.sqrt(total.q / total.n)
    f_scale = math.sqrt(max(float(np.trace(total.S)) / total.n, 1e-300))
    lo = [math.log(y_scale * 1e-4), math.log(y_scale / f_scale * 1e-4), math.log(y_scale / f_scale * 1e-5)]
    hi = [math.log(y_scale * 10.0), math.log(y_scale / f_scale * 1e3), math.log(y_scale / f_scale * 1e3)]
    x0 = np.log(start) if start is not None else np.log([sig0, lam0, lam0 / 3.0])
    if fixed_tau is not None:
        x0, lo, hi = x0[:2], lo[:2], hi[:2]
    x0 = np.clip(x0, np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    log_tau = None if fixed_tau is None else math.log(fixed_tau)

    def neg(theta: np.ndarray) -> float:
        v = spectra.log_evidence(*theta) if log_tau is None else spectra.log_evidence(theta[0], theta[1], log_tau)
        return -v if math.isfinite(v) else 1e300

    m = len(x0)
    res = optimize.minimize(neg, x0, method="Nelder-Mead", bounds=list(zip(lo, hi, strict=True)),
                            options={"xatol": 1e-3, "fatol": 1e-4, "maxfev": max_evals,
                                     "initial_simplex": x0 + np.vstack([np.zeros(m), 0.2 * np.eye(m)])})
    sig, lam = math.exp(res.x[0]), math.exp(res.x[1])
    tau = math.exp(res.x[2]) if fixed_tau is None else float(fixed_tau)
    return sig, lam, tau, -float(res.fun)


def _one_spectrum(st: SufficientStats) -> tuple[np.ndarray, np.ndarray]:
    e, u = np.linalg.eigh(_sym(st.S))
    return np.clip(e, 0.0, None), (u.T @ st.b) ** 2


# ============================================================================ messages


@dataclass(frozen=True)
class HierUpload:
    """Delta statistics of at least `min_upload` samples, time-weighted to `time` (`γ^(time - t_i)` per
    sample; plain sums without forgetting), plus the raw sample `count` (for the privacy floor).

    >>> up = HierUpload("a", 1, 5.0, 32, SufficientStats.zeros(2, (), "v"))
    >>> HierUpload.from_message(up.to_message()) == up
    True
    """

    client: str
    seq: int
    time: float
    count: int
    stats: SufficientStats

    def to_message(self) -> dict[str, Any]:
        msg = {"client": self.client, "seq": int(self.seq), "time": float(self.time), "count": int(self.count)}
        msg.update(self.stats.to_packed())
        return msg

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> HierUpload:
        return cls(str(msg["client"]), int(msg["seq"]), float(msg["time"]), int(msg["count"]),
                   SufficientStats.from_packed(msg))


@dataclass(frozen=True)
class HierGlobal:
    """The shared posterior `w ~ N(A⁻¹h, A⁻¹)` at `time`, the hyperparameters and who is included.

    >>> g = HierGlobal(1, "v", 0, 3.0, 1.0, 0.5, 1.0, 0.2, np.eye(2), np.ones(2), -1.0, {"a": 2})
    >>> g2 = HierGlobal.from_message(g.to_message())
    >>> bool(np.array_equal(g2.A, g.A)) and g2.included == {"a": 2} and g2.tau == 0.2
    True
    """

    version: int
    kernel_version: str
    epoch: int
    time: float
    forgetting: float
    sigma: float
    lam: float
    tau: float
    A: np.ndarray
    h: np.ndarray
    log_evidence: float
    included: dict[str, int] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        return {"version": int(self.version), "kernel_version": self.kernel_version, "epoch": int(self.epoch),
                "time": float(self.time), "forgetting": float(self.forgetting), "sigma": float(self.sigma),
                "lam": float(self.lam), "tau": float(self.tau), "A_upper": pack_upper(self.A),
                "h": np.array(self.h, dtype=np.float64), "log_evidence": float(self.log_evidence),
                "included": {str(k): int(v) for k, v in self.included.items()}}

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> HierGlobal:
        h = np.asarray(msg["h"], dtype=np.float64)
        return cls(int(msg["version"]), str(msg["kernel_version"]), int(msg["epoch"]), float(msg["time"]),
                   float(msg["forgetting"]), float(msg["sigma"]), float(msg["lam"]), float(msg["tau"]),
                   unpack_upper(np.asarray(msg["A_upper"], dtype=np.float64), h.shape[0]), h,
                   float(msg["log_evidence"]), {str(k): int(v) for k, v in dict(msg["included"]).items()})


# ============================================================================ numba client loop


@numba.njit(cache=True)
def _hier_learn_batch(
    ra: np.ndarray, s_pend: np.ndarray, b_pend: np.ndarray, s_own: np.ndarray, b_own: np.ndarray,
    acc: np.ndarray, phis: np.ndarray, ys: np.ndarray, times: np.ndarray, gamma: float, gamma_own: float,
    sigma: float, work: np.ndarray, out_mean: np.ndarray, out_var: np.ndarray,
) -> None:
    """Prequential loop: for each row, decay to its time, predict, then learn.

    `acc = [time, n_pend, q_pend, n_own, q_own]` (running scalars, updated in place). `s_pend, b_pend`
    (upper triangle of the scatter): pending statistics weighted with `γ` (uploaded); `s_own, b_own`: all
    own statistics weighted with `γ_own` (the working posterior's memory); the working factor `ra`
    decays with `γ_own`.
    """
    f = phis.shape[1]
    inv_sigma = 1.0 / sigma
    for t in range(phis.shape[0]):
        dt = times[t] - acc[0]
        if dt > 0.0:
            if gamma != 1.0 and math.isfinite(acc[0]):  # (no decay before the first sample)
                g = gamma**dt
                for i in range(f):
                    row = s_pend[i, i:]
                    for j in range(f - i):
                        row[j] *= g
                    b_pend[i] *= g
                acc[1] *= g
                acc[2] *= g
            if gamma_own != 1.0 and math.isfinite(acc[0]):
                g = gamma_own**dt
                sg = math.sqrt(g)
                for i in range(f + 1):
                    row = ra[i, i:]
                    for j in range(f + 1 - i):
                        row[j] *= sg
                for i in range(f):
                    row = s_own[i, i:]
                    for j in range(f - i):
                        row[j] *= g
                    b_own[i] *= g
                acc[3] *= g
                acc[4] *= g
            acc[0] = times[t]
        phi = phis[t]
        y = ys[t]
        kern.solve_rt(ra, phi, work, f)
        mean = 0.0
        quad = 0.0
        for i in range(f):
            mean += work[i] * ra[i, f]
            quad += work[i] * work[i]
        out_mean[t] = mean
        out_var[t] = sigma * sigma + quad
        for i in range(f):
            pi = phi[i]
            row = s_pend[i, i:]
            row_own = s_own[i, i:]
            tail = phi[i:]
            for j in range(f - i):
                row[j] += pi * tail[j]
                row_own[j] += pi * tail[j]
            b_pend[i] += pi * y
            b_own[i] += pi * y
        acc[1] += 1.0
        acc[2] += y * y
        acc[3] += 1.0
        acc[4] += y * y
        for i in range(f):
            work[i] = phi[i] * inv_sigma
        work[f] = y * inv_sigma
        kern.chol_update(ra, work)


# ============================================================================ client


class FedBNRHierClient:
    """Client half of hierarchical FedBNR (module docstring): predicts with the exact posterior of its own
    weights `w + δ_k` given the latest shared posterior and all its own data.

    Build it with a feature map (one) or the default Gaussian RFF + bias map (`n_inputs`, `n_features`
    `= D`, `bandwidth`, `seed`). `times` (any increasing clock, e.g. hours) drive the forgetting; without
    them each sample advances the clock by one.

    >>> rng = np.random.default_rng(0)
    >>> clients = [FedBNRHierClient(n_inputs=1, n_features=10, client_id=c, min_upload=10) for c in "ab"]
    >>> server = FedBNRHierServer.for_client(clients[0])
    >>> for k, c in enumerate(clients):
    ...     x = rng.uniform(-2, 2, (100, 1))
    ...     _ = c.learn_many(x, np.sin(2 * x[:, 0]) + 0.3 * k + 0.1 * rng.standard_normal(100))
    ...     _ = server.apply(c.make_upload())
    >>> g = server.publish()
    >>> [c.apply_global(g) for c in clients]
    [True, True]
    >>> m_a, m_b = (c.predict(np.array([0.5]))[0] for c in clients)
    >>> bool(abs(m_b - m_a - 0.3) < 0.15)  # each keeps its own offset
    True
    """

    def __init__(
        self,
        feature_map: FeatureMap | None = None,
        *,
        n_inputs: int | None = None,
        n_features: int = 64,
        bandwidth: float = 1.0,
        seed: int = 0,
        sigma: float = 1.0,
        lam: float = 1.0,
        tau: float = 1.0,
        forgetting: float = 1.0,
        own_forgetting: float | None = None,
        fit_sigma: bool = False,
        min_upload: int = 32,
        client_id: str = "client",
    ) -> None:
        if feature_map is None:
            if n_inputs is None:
                raise ValueError("give a feature_map or n_inputs to build the default RFF map")
            self._features: _DefaultFeatures | _MapList = _DefaultFeatures(int(n_inputs), int(n_features),
                                                                          [float(bandwidth)], int(seed))
        else:
            self._features = _MapList([feature_map])
        if not (0.0 < float(forgetting) <= 1.0):
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        if int(min_upload) < 1:
            raise ValueError(f"min_upload must be >= 1, got {min_upload!r}")
        self.dim = f = self._features.dim
        self.kernel_version = self._features.version
        self.epoch = 0
        self.client_id = str(client_id)
        self.forgetting = float(forgetting)
        self.own_forgetting = self.forgetting if own_forgetting is None else float(own_forgetting)
        if not (0.0 < self.own_forgetting <= 1.0):
            raise ValueError(f"own_forgetting must be in (0, 1], got {own_forgetting!r}")
        self.fit_sigma = bool(fit_sigma)
        self.min_upload = int(min_upload)
        self.sigma = check_positive("sigma", sigma)
        self.lam = check_positive("lam", lam)
        self.tau = check_positive("tau", tau)
        self._s_pend = np.zeros((f, f))  # upper triangle
        self._b_pend = np.zeros(f)
        self._s_own = np.zeros((f, f))  # upper triangle: all own samples, weighted with own_forgetting
        self._b_own = np.zeros(f)
        self._acc = np.array([-math.inf, 0.0, 0.0, 0.0, 0.0])  # [time, n_pend, q_pend, n_own, q_own]
        self._count_pend = 0
        self._own_in = self._zero()  # own statistics contained in the installed global, at _t_in
        self._t_in = -math.inf
        self._unacked: dict[int, HierUpload] = {}
        self._next_seq = 1
        self._global: HierGlobal | None = None
        # Prior of v = w + δ (precision, shift, constant): N(0, (λ² + τ²)I) until a global arrives.
        self._prior = (np.eye(f) / (self.lam**2 + self.tau**2), np.zeros(f), 0.0)
        self._ra = np.zeros((f + 1, f + 1))
        self._work = np.empty(f + 1)
        self.metrics = PrequentialMetrics()
        self._rebuild()

    # ------------------------------------------------------------------ helpers
    def _zero(self) -> SufficientStats:
        return SufficientStats.zeros(self.dim, (), self.kernel_version, self.epoch)

    def _decay(self, st: SufficientStats, t_from: float, t_to: float) -> SufficientStats:
        if self.forgetting == 1.0 or not math.isfinite(t_from) or t_to <= t_from:
            return st.copy()
        return st.scaled(self.forgetting ** (t_to - t_from))

    @property
    def time(self) -> float:
        """The client's clock: time of its latest sample (or installed global)."""
        return float(self._acc[0])

    @property
    def n_pending(self) -> int:
        return self._count_pend

    @property
    def installed_global(self) -> HierGlobal | None:
        """The shared posterior in use (None before the first)."""
        return self._global

    @property
    def unacked(self) -> list[HierUpload]:
        return [self._unacked[s] for s in sorted(self._unacked)]

    def _pending_stats(self) -> SufficientStats:
        s = np.triu(self._s_pend) + np.triu(self._s_pend, 1).T
        return SufficientStats(s, self._b_pend, self._acc[1], self._acc[2], self.kernel_version, self.epoch)

    def own_stats(self, time: float | None = None) -> SufficientStats:
        """All own (time-weighted) statistics at `time` (default: the client's clock)."""
        t = self.time if time is None else float(time)
        total = self._decay(self._pending_stats(), self.time, t)
        total += self._decay(self._own_in, self._t_in, t)
        for up in self._unacked.values():
            total += self._decay(up.stats, up.time, t)
        return total

    def working_own_stats(self) -> SufficientStats:
        """All own statistics weighted with `own_forgetting` (what the working posterior holds)."""
        s = np.triu(self._s_own) + np.triu(self._s_own, 1).T
        return SufficientStats(s, self._b_own, self._acc[3], self._acc[4], self.kernel_version, self.epoch)

    def _fit_own_sigma(self) -> float:
        """`σ` maximising the evidence of the own (own-forgetting-weighted) statistics under the installed
        prior `N(μ₀, Λ₀⁻¹)`: `y ~ N(Φμ₀, σ²I + ΦΛ₀⁻¹Φᵀ)`, from the statistics alone (`O(F³)` per point)."""
        own = self.working_own_stats()
        if not (own.n > 1.0 and own.q > 0.0):
            return self.sigma
        prec, shift, _ = self._prior
        mu0 = np.linalg.solve(prec, shift)
        b_res = own.b - own.S @ mu0  # statistics of the residuals y - φᵀμ₀
        q_res = max(own.q - 2.0 * own.b @ mu0 + mu0 @ own.S @ mu0, 1e-300)
        logdet_prec = 2.0 * np.log(np.diag(np.linalg.cholesky(prec))).sum()

        def neg(log_sigma: float) -> float:
            s2 = math.exp(2.0 * log_sigma)
            try:
                chol = np.linalg.cholesky(prec + own.S / s2)
            except np.linalg.LinAlgError:
                return 1e300
            u = np.linalg.solve(chol, b_res / s2)
            logdet = 2.0 * np.log(np.diag(chol)).sum() - logdet_prec
            return 0.5 * (own.n * math.log(2 * math.pi * s2) + logdet + q_res / s2 - u @ u)

        scale = math.sqrt(own.q / own.n)
        res = optimize.minimize_scalar(neg, bounds=(math.log(1e-3 * scale), math.log(10.0 * scale)),
                                       method="bounded", options={"xatol": 1e-4})
        return math.exp(float(res.x))

    def features_many(self, xs: np.ndarray) -> np.ndarray:
        xs = np.asarray(xs, dtype=np.float64)
        if xs.ndim != 2 or not np.all(np.isfinite(xs)):
            raise ValueError(f"inputs must be a finite (T, d) array, got shape {xs.shape}")
        phis = self._features.transform_many(xs)[:, 0, :] if xs.shape[0] else np.empty((0, self.dim))
        if not np.all(np.isfinite(phis)):
            raise ValueError("the feature map produced non-finite features")
        return np.ascontiguousarray(phis)

    # ------------------------------------------------------------------ posterior
    def _rebuild(self) -> None:
        """Refactorise `M = [[Λ₀ + σ⁻²S, h₀ + σ⁻²b], [., c₀ + σ⁻²q]]` from the prior and all own statistics."""
        f = self.dim
        prec, shift, const = self._prior
        own = self.working_own_stats()
        s2 = self.sigma**2
        m = np.empty((f + 1, f + 1))
        m[:f, :f] = prec + own.S / s2
        m[:f, f] = m[f, :f] = shift + own.b / s2
        m[f, f] = const + own.q / s2
        try:
            chol = np.linalg.cholesky(m[:f, :f])
        except np.linalg.LinAlgError as exc:
            raise ValueError("working precision is not positive definite") from exc
        ra = np.zeros((f + 1, f + 1))
        ra[:f, :f] = chol.T
        u = np.linalg.solve(chol, m[:f, f])
        ra[:f, f] = u
        ra[f, f] = math.sqrt(max(m[f, f] - u @ u, 0.0))
        if not np.all(np.isfinite(ra)):
            raise ValueError("refactorisation produced a non-finite factor")
        self._ra = ra

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of this client's weights `v = w + δ_k` (working posterior)."""
        f = self.dim
        r_inv = np.linalg.solve(self._ra[:f, :f], np.eye(f))
        return r_inv @ self._ra[:f, f], r_inv @ r_inv.T

    def predict_many(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances (no learning)."""
        phis = self.features_many(xs)
        f = self.dim
        r = self._ra[:f, :f]
        v = linalg.solve_triangular(r, phis.T, trans="T")  # (F, T): R is upper triangular, O(F²) per row
        return v.T @ self._ra[:f, f], self.sigma**2 + (v * v).sum(axis=0)

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        m, v = self.predict_many(np.atleast_2d(np.asarray(x, dtype=np.float64)))
        return float(m[0]), float(v[0])

    # ------------------------------------------------------------------ learning
    def learn_many(self, xs: np.ndarray, ys: np.ndarray, times: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Prequential pass: the predictive means and variances made before each row is learned. `times`
        (non-decreasing, ≥ the client's clock) default to one time unit per row."""
        ys = np.ascontiguousarray(ys, dtype=np.float64)
        phis = self.features_many(xs)
        t_now = self.time if math.isfinite(self.time) else 0.0
        if times is None:
            times = t_now + np.arange(1, ys.shape[0] + 1, dtype=np.float64)
        times = np.ascontiguousarray(times, dtype=np.float64)
        if phis.shape[0] != ys.shape[0] or times.shape != ys.shape:
            raise ValueError("xs, ys and times must have the same number of rows")
        with np.errstate(over="ignore", invalid="ignore"):
            ok = np.all(np.isfinite(ys * ys)) and np.all(np.isfinite(times))
        if not ok or (times.size and (np.any(np.diff(times) < 0) or times[0] < self.time)):
            raise ValueError("targets must be finite and times finite, non-decreasing and not in the past")
        means, variances = np.empty(ys.shape[0]), np.empty(ys.shape[0])
        _hier_learn_batch(self._ra, self._s_pend, self._b_pend, self._s_own, self._b_own, self._acc, phis, ys,
                          times, self.forgetting, self.own_forgetting, self.sigma, self._work, means, variances)
        self._count_pend += ys.shape[0]
        self.metrics.update_many(means, variances, ys)
        return means, variances

    def learn(self, x: np.ndarray, y: float, time: float | None = None) -> tuple[float, float]:
        """One prequential step; returns the prediction made before learning."""
        m, v = self.learn_many(np.atleast_2d(np.asarray(x, dtype=np.float64)), np.array([float(y)]),
                               None if time is None else np.array([float(time)]))
        return float(m[0]), float(v[0])

    # ------------------------------------------------------------------ federation
    def make_upload(self) -> HierUpload | None:
        """The pending statistics (time-weighted to the client's clock) once `min_upload` samples wait."""
        if self._count_pend < self.min_upload:
            return None
        stats = self._pending_stats().check_finite()
        up = HierUpload(self.client_id, self._next_seq, self.time, self._count_pend, stats)
        self._unacked[up.seq] = up
        self._next_seq += 1
        self._s_pend[...] = 0.0
        self._b_pend[...] = 0.0
        self._acc[1:3] = 0.0
        self._count_pend = 0
        return up

    def apply_global(self, g: HierGlobal) -> bool:
        """Install a shared posterior: the prior of `w + δ_k` becomes `N(μ₋ₖ, A₋ₖ⁻¹ + τ²I)` (own included
        contribution removed), and the working posterior is rebuilt exactly from all own statistics.
        `False` for a global not newer than the installed one."""
        if g.kernel_version != self.kernel_version or g.epoch != self.epoch:
            raise ValueError("global is for another kernel version or epoch")
        if g.A.shape != (self.dim, self.dim) or g.h.shape != (self.dim,):
            raise ValueError("global has the wrong dimension")
        if not (np.all(np.isfinite(g.A)) and np.all(np.isfinite(g.h)) and min(g.sigma, g.lam, g.tau) > 0):
            raise ValueError("global contains non-finite values or non-positive hyperparameters")
        if self._global is not None and g.version <= self._global.version:
            return False
        if g.forgetting != self.forgetting:
            raise ValueError(f"global uses forgetting {g.forgetting}, this client {self.forgetting}")
        inc = int(g.included.get(self.client_id, 0))
        own_in = self._decay(self._own_in, self._t_in, g.time)
        for seq in sorted(s for s in self._unacked if s <= inc):
            up = self._unacked.pop(seq)
            own_in += self._decay(up.stats, up.time, g.time)
        self._own_in, self._t_in = own_in, g.time
        self.sigma, self.lam, self.tau = float(g.sigma), float(g.lam), float(g.tau)
        f = self.dim
        if own_in.n > 0:
            p, r, _ = marginal_contribution(own_in, self.sigma, self.tau)
        else:
            p, r = np.zeros((f, f)), np.zeros(f)
        a_cav = _sym(g.A - p)
        h_cav = g.h - r
        t2 = self.tau**2
        # Λ₀ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹A₋ₖ,  Λ₀μ₋ₖ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹h₋ₖ,  c₀ = μ₋ₖᵀΛ₀μ₋ₖ
        chol = np.linalg.cholesky(a_cav + np.eye(f) / t2)
        sol = np.linalg.solve(chol.T, np.linalg.solve(chol, np.concatenate([a_cav, h_cav[:, None]], axis=1))) / t2
        prec, shift = _sym(sol[:, :f]), sol[:, f]
        mu = np.linalg.solve(a_cav, h_cav)
        self._prior = (prec, shift, float(mu @ shift))
        if g.time > self.time:  # the clock moves to the global's time (pending statistics decay to it)
            if self.forgetting != 1.0 and math.isfinite(self.time):
                decay = self.forgetting ** (g.time - self.time)
                self._s_pend *= decay
                self._b_pend *= decay
                self._acc[1:3] *= decay
            if self.own_forgetting != 1.0 and math.isfinite(self.time):
                decay = self.own_forgetting ** (g.time - self.time)
                self._s_own *= decay
                self._b_own *= decay
                self._acc[3:5] *= decay
            self._acc[0] = g.time
        if self.fit_sigma:
            self.sigma = self._fit_own_sigma()
        self._rebuild()
        self._next_seq = max(self._next_seq, inc + 1)
        self._global = g
        return True


# ============================================================================ server


class FedBNRHierServer:
    """Server half: keeps each client's time-weighted statistics (uploads summed once per `(client, seq)`,
    in sequence order), publishes the shared posterior `(A, h)` and fits `σ, λ, τ` by the exact evidence.

    >>> server = FedBNRHierServer(dim=2, min_samples=1, fit_hyperparameters=False)
    >>> up = HierUpload("a", 1, 3.0, 3, SufficientStats.from_samples(np.ones((3, 2)), np.ones(3)))
    >>> server.apply(up), server.apply(up)
    (True, False)
    >>> server.publish().included
    {'a': 1}
    """

    def __init__(
        self,
        dim: int,
        kernel_version: str | None = "",
        epoch: int = 0,
        *,
        forgetting: float = 1.0,
        sigma: float = 1.0,
        lam: float = 1.0,
        tau: float = 1.0,
        fit_hyperparameters: bool = True,
        fit_tau: bool = True,
        min_samples: int = 32,
        max_buffered: int = 256,
    ) -> None:
        self.fit_tau = bool(fit_tau)
        self.dim = int(dim)
        self.kernel_version = kernel_version
        self.epoch = int(epoch)
        self.forgetting = float(forgetting)
        self.sigma = check_positive("sigma", sigma)
        self.lam = check_positive("lam", lam)
        self.tau = check_positive("tau", tau)
        self.fit = bool(fit_hyperparameters)
        self.min_samples = int(min_samples)
        self.max_buffered = int(max_buffered)
        self.clients: dict[str, tuple[SufficientStats, float]] = {}  # statistics at their time
        self.included: dict[str, int] = {}
        self._buffer: dict[str, dict[int, HierUpload]] = {}
        self.version = 0
        self.log_evidence = math.nan
        self._fitted = False
        self._last: HierGlobal | None = None

    @classmethod
    def for_client(cls, client: FedBNRHierClient, **kwargs: Any) -> FedBNRHierServer:
        kwargs.setdefault("min_samples", client.min_upload)
        kwargs.setdefault("forgetting", client.forgetting)
        for name in ("sigma", "lam", "tau"):
            kwargs.setdefault(name, getattr(client, name))
        return cls(client.dim, client.kernel_version, client.epoch, **kwargs)

    def validate(self, up: HierUpload) -> None:
        st = up.stats
        if self.kernel_version is not None and st.tag != (self.kernel_version, self.epoch):
            raise ValueError(f"upload from {up.client!r} is for kernel version/epoch {st.tag}")
        if st.S.shape != (self.dim, self.dim) or not st.is_finite() or not math.isfinite(up.time):
            raise ValueError(f"upload from {up.client!r} has a wrong shape or a non-finite value")
        if up.count < self.min_samples:
            raise ValueError(f"upload summarises {up.count} samples, below the privacy floor {self.min_samples}")
        if up.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {up.seq}")

    def add_statistics(self, up: HierUpload) -> None:
        """Add a client's statistics (already deduplicated elsewhere, e.g. by a sharded fleet's reducer),
        time-weighted with what is held for that client; `included` is the caller's to set."""
        self._add(up)

    def last_global(self) -> HierGlobal:
        """The latest published global (before any: the prior, version 0)."""
        if self._last is not None:
            return self._last
        return HierGlobal(0, self.kernel_version or "", self.epoch, 0.0, self.forgetting, self.sigma, self.lam,
                          self.tau, np.eye(self.dim) / self.lam**2, np.zeros(self.dim), 0.0, {})

    def _add(self, up: HierUpload) -> None:
        old = self.clients.get(up.client)
        if old is None:
            self.clients[up.client] = (up.stats.copy(), up.time)
            return
        st, t = old
        g = self.forgetting
        if up.time >= t:
            new = (st.scaled(g ** (up.time - t)) if g != 1.0 else st.copy()) + up.stats
            self.clients[up.client] = (new, up.time)
        else:  # an upload stamped earlier than what is held: add it decayed to the held time
            self.clients[up.client] = (st + (up.stats.scaled(g ** (t - up.time)) if g != 1.0 else up.stats), t)

    def apply(self, up: HierUpload) -> bool:
        """Sum an upload once (`False` for a duplicate); out-of-order ones wait for the gap."""
        self.validate(up)
        return apply_in_order(self.included, self._buffer, up.client, up.seq, up, self._add, self.max_buffered)

    def waiting(self) -> dict[str, list[int]]:
        """Sequence numbers received out of order and not summed yet, per client."""
        return {c: sorted(w) for c, w in self._buffer.items() if w}

    def stats_at(self, time: float) -> dict[str, SufficientStats]:
        """Each client's statistics time-weighted to `time`."""
        g = self.forgetting
        return {c: (st.scaled(g ** (time - t)) if g != 1.0 and time > t else st.copy())
                for c, (st, t) in sorted(self.clients.items())}

    def publish(self, time: float | None = None) -> HierGlobal:
        """The shared posterior at `time` (default: the latest client time), `σ, λ, τ` refitted first."""
        t = max((tc for _, tc in self.clients.values()), default=0.0) if time is None else float(time)
        stats = list(self.stats_at(t).values())
        usable = [st for st in stats if st.n > 0]
        if self.fit and usable and sum(st.q for st in usable) > 0:
            start = (self.sigma, self.lam, self.tau) if self._fitted else None
            self.sigma, self.lam, self.tau, self.log_evidence = fit_hierarchical(
                usable, start, fixed_tau=None if self.fit_tau else self.tau)
            self._fitted = True
        if usable:
            lev, a, h = hierarchical_log_evidence(usable, self.sigma, self.lam, self.tau)
            self.log_evidence = lev
        else:
            a, h = np.eye(self.dim) / self.lam**2, np.zeros(self.dim)
        self.version += 1
        # no evidence before any data: 0 rather than NaN (no non-finite value leaves a process)
        lev = float(self.log_evidence) if math.isfinite(self.log_evidence) else 0.0
        self._last = HierGlobal(self.version, self.kernel_version or "", self.epoch, t, self.forgetting, self.sigma,
                                self.lam, self.tau, a, h, lev, dict(self.included))
        return self._last


# ============================================================================ τ dictionary


class FedBNRHierMixServer:
    """One hierarchical model per personal scale `τ_j` of a fixed grid (each with its own `σ_j, λ_j`
    fitted by the exact evidence at that `τ_j`), all fed the same uploads. `publish` returns one
    :class:`HierGlobal` per `τ_j` (for :class:`FedBNRHierMixClient`)."""

    def __init__(self, dim: int, kernel_version: str | None = "", epoch: int = 0, *,
                 tau_grid: Sequence[float], **kwargs: Any) -> None:
        if not tau_grid:
            raise ValueError("tau_grid needs at least one value")
        self.tau_grid = tuple(float(t) for t in tau_grid)
        kwargs.pop("tau", None)
        self.servers = [FedBNRHierServer(dim, kernel_version, epoch, tau=t, fit_tau=False, **kwargs)
                        for t in self.tau_grid]

    @classmethod
    def for_client(cls, client: FedBNRHierMixClient, **kwargs: Any) -> FedBNRHierMixServer:
        sub = client.models[0]
        kwargs.setdefault("min_samples", sub.min_upload)
        kwargs.setdefault("forgetting", sub.forgetting)
        kwargs.setdefault("sigma", sub.sigma)
        kwargs.setdefault("lam", sub.lam)
        return cls(sub.dim, sub.kernel_version, sub.epoch, tau_grid=client.tau_grid, **kwargs)

    @property
    def included(self) -> dict[str, int]:
        return self.servers[0].included

    @included.setter
    def included(self, value: dict[str, int]) -> None:
        for s in self.servers:
            s.included = dict(value)

    @property
    def clients(self) -> dict[str, tuple[SufficientStats, float]]:
        return self.servers[0].clients

    @property
    def version(self) -> int:
        return self.servers[0].version

    @property
    def forgetting(self) -> float:
        return self.servers[0].forgetting

    @property
    def kernel_version(self) -> str | None:
        return self.servers[0].kernel_version

    @property
    def epoch(self) -> int:
        return self.servers[0].epoch

    @property
    def max_buffered(self) -> int:
        return self.servers[0].max_buffered

    def waiting(self) -> dict[str, list[int]]:
        return self.servers[0].waiting()

    def validate(self, up: HierUpload) -> None:
        self.servers[0].validate(up)

    def apply(self, up: HierUpload) -> bool:
        out = [s.apply(up) for s in self.servers]
        return out[0]

    def add_statistics(self, up: HierUpload) -> None:
        for s in self.servers:
            s.add_statistics(up)

    def publish(self, time: float | None = None) -> list[HierGlobal]:
        return [s.publish(time) for s in self.servers]

    def last_global(self) -> list[HierGlobal]:
        return [s.last_global() for s in self.servers]


class FedBNRHierMixClient:
    """Hierarchical FedBNR over a fixed grid of personal scales `τ_j`, combined by Bayesian model
    averaging with weights from each model's *prequential* evidence on this client's own stream,
    `log p_j(y_1..y_t) = Σ_s log p_j(y_s | y_<s)` (the marginal likelihood of a sequential model is the
    product of its one-step-ahead predictive densities), discounted by the same forgetting `γ` per time
    unit as the statistics (dynamic model averaging) — so the personal/shared balance is chosen by
    evidence of the drifting model, not by the static-window evidence. The prediction is the moment-
    matched mixture. Every sample enters each model once; one upload serves all models.
    """

    def __init__(self, tau_grid: Sequence[float], **kwargs: Any) -> None:
        if not tau_grid:
            raise ValueError("tau_grid needs at least one value")
        self.tau_grid = tuple(float(t) for t in tau_grid)
        kwargs.pop("tau", None)
        self.models = [FedBNRHierClient(tau=t, **kwargs) for t in self.tau_grid]
        self.log_score = np.zeros(len(self.models))  # discounted prequential log evidence per model
        self.metrics = PrequentialMetrics()

    @property
    def client_id(self) -> str:
        return self.models[0].client_id

    @property
    def kernel_version(self) -> str:
        return self.models[0].kernel_version

    @property
    def n_pending(self) -> int:
        return self.models[0].n_pending

    def weights(self) -> np.ndarray:
        w = np.exp(self.log_score - self.log_score.max())
        return w / w.sum()

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        """The moment-matched mixture of the models' predictive distributions, at the current weights."""
        preds = [m.predict(x) for m in self.models]
        mu = np.array([p[0] for p in preds])
        var = np.array([p[1] for p in preds])
        w = self.weights()
        mean = float(w @ mu)
        return mean, max(float(w @ (var + mu**2)) - mean**2, 1e-300)

    def learn(self, x: np.ndarray, y: float, time: float | None = None) -> tuple[float, float]:
        """One prequential step; returns the mixture's prediction made before learning."""
        m, v = self.learn_many(np.atleast_2d(np.asarray(x, dtype=np.float64)), np.array([float(y)]),
                               None if time is None else np.array([float(time)]))
        return float(m[0]), float(v[0])

    def own_stats(self, time: float | None = None) -> SufficientStats:
        return self.models[0].own_stats(time)

    def learn_many(self, xs: np.ndarray, ys: np.ndarray, times: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        ys = np.asarray(ys, dtype=np.float64)
        t_before = self.models[0].time
        preds = [m.learn_many(xs, ys, times) for m in self.models]
        mu = np.stack([p[0] for p in preds])  # (J, T)
        var = np.stack([p[1] for p in preds])
        lp = -0.5 * (np.log(2 * np.pi * var) + (ys - mu) ** 2 / var)
        if times is None:
            start = t_before if math.isfinite(t_before) else 0.0
            times = start + np.arange(1, ys.shape[0] + 1, dtype=np.float64)
        times = np.asarray(times, dtype=np.float64)
        g = self.models[0].forgetting
        means, variances = np.empty(ys.shape[0]), np.empty(ys.shape[0])
        prev = t_before
        for t in range(ys.shape[0]):
            if g != 1.0 and math.isfinite(prev) and times[t] > prev:
                self.log_score *= g ** (times[t] - prev)
            prev = times[t]
            w = self.weights()
            means[t] = w @ mu[:, t]
            variances[t] = w @ (var[:, t] + mu[:, t] ** 2) - means[t] ** 2
            self.log_score += lp[:, t]
        variances = np.maximum(variances, 1e-300)
        self.metrics.update_many(means, variances, ys)
        return means, variances

    def make_upload(self) -> HierUpload | None:
        ups = [m.make_upload() for m in self.models]  # identical statistics; each model tracks its own
        return ups[0]

    def apply_global(self, gs: Sequence[HierGlobal | None]) -> bool:
        """Install one global per model (`None`: that model keeps what it has)."""
        if len(gs) != len(self.models):
            raise ValueError(f"expected {len(self.models)} globals, one per τ, got {len(gs)}")
        out = [m.apply_global(g) for m, g in zip(self.models, gs, strict=True) if g is not None]
        return bool(out) and out[0]
