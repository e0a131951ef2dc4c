"""The client half of hierarchical (shared + personal) FedBNR (docs/algorithms.md §5.5): it predicts with the
exact posterior of its own weights `w + δ_k` given the latest shared posterior and all its own data.

**Client prediction.** Client `k`'s own data depend on `v_k = w + δ_k` only, so the exact posterior of
`v_k` given everything is a Bayesian linear regression on the client's *own* statistics with the prior
`v_k ~ N(μ₋ₖ, A₋ₖ⁻¹ + τ²I)`, where `A₋ₖ = A - P_k`, `h₋ₖ = h - r_k`, `μ₋ₖ = A₋ₖ⁻¹h₋ₖ` is the shared
posterior without the client's own (marginalised) contribution — the client computes `P_k, r_k` of its
own included statistics itself, no per-client message is needed. Prior precision and shift without
cancellation: `Λ₀ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹A₋ₖ`, `Λ₀μ₋ₖ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹h₋ₖ`. Between globals every own
sample is one rank-one update of the augmented Cholesky factor (as in
:mod:`streamfed.algorithms.fedbnr.client`; the loop is :func:`_hier_learn_batch`): `O(F²)`.

**Forgetting (`γ < 1`, drifting streams), on both levels.** Every statistic is time-weighted: a sample
observed at time `t` counts `γ^(T - t)` at time `T` (a weighted likelihood). Uploads carry deltas
decayed to their time stamp; the server holds `S_k(T) = Σ_u γ^(T - t_u) ΔS_u` (order-free), so the shared
part carries what is happening *now* across all clients, the personal part what is happening now at
this client. At each global the client's posterior is rebuilt exactly from the decayed statistics.
Between globals (a round), the whole working precision decays by `γ` per time unit — the cavity prior
included, which is right for the other clients' data in it (it ages like data) and a heuristic for
the structural part (`λ, τ`); the next global makes it exact again.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from scipy import linalg, optimize

from streamfed.algorithms.fedbnr import _kernels as kern
from streamfed.algorithms.fedbnr.checks import check_positive
from streamfed.algorithms.fedbnr.features import _DefaultFeatures, _MapList
from streamfed.algorithms.fedbnr.metrics import PrequentialMetrics
from streamfed.algorithms.fedbnr_personal.evidence import marginal_contribution, sym
from streamfed.algorithms.fedbnr_personal.messages import HierGlobal, HierUpload
from streamfed.core.durable import durable
from streamfed.core.features import FeatureMap
from streamfed.core.stats import SufficientStats

__all__ = ["FedBNRHierClient"]


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


@durable("fedbnr-personal.FedBNRHierClient")
class FedBNRHierClient:
    """Client half of hierarchical FedBNR (module docstring): predicts with the exact posterior of its own
    weights `w + δ_k` given the latest shared posterior and all its own data.

    Build it with a feature map (one) or the default Gaussian RFF + bias map (`n_inputs`, `n_features`
    `= D`, `bandwidth`, `seed`). `times` (any increasing clock, e.g. hours) drive the forgetting; without
    them each sample advances the clock by one.

    >>> rng = np.random.default_rng(0)
    >>> clients = [FedBNRHierClient(n_inputs=1, n_features=10, client_id=c, min_upload=10) for c in "ab"]
    >>> from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
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

    prior_tau: float | None = None  # (a class default: a state written before it existed restores without)

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
        prior_tau: float | None = None,
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
        # The personal scale of this client's own prior instead of the global's τ (the global's τ still removes
        # its own contribution from the shared posterior): a tiny one makes the pooled expert of .experts.
        self.prior_tau = None if prior_tau is None else check_positive("prior_tau", prior_tau)
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
        self._prior = (np.eye(f) / (self.lam**2 + self._tau_of_prior**2), np.zeros(f), 0.0)
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
    def _tau_of_prior(self) -> float:
        return self.tau if self.prior_tau is None else self.prior_tau

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
    def learn_many(self, xs: np.ndarray, ys: np.ndarray, times: np.ndarray | None = None, *,
                   phis: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Prequential pass: the predictive means and variances made before each row is learned. `times`
        (non-decreasing, ≥ the client's clock) default to one time unit per row. `phis`: the rows' features
        when the caller already has them from this client's map (:meth:`features_many`; the experts share one)."""
        ys = np.ascontiguousarray(ys, dtype=np.float64)
        phis = self.features_many(xs) if phis is None else phis
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
        a_cav = sym(g.A - p)
        h_cav = g.h - r
        t2 = self._tau_of_prior**2
        # Λ₀ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹A₋ₖ,  Λ₀μ₋ₖ = τ⁻²(A₋ₖ + τ⁻²I)⁻¹h₋ₖ,  c₀ = μ₋ₖᵀΛ₀μ₋ₖ
        chol = np.linalg.cholesky(a_cav + np.eye(f) / t2)
        sol = np.linalg.solve(chol.T, np.linalg.solve(chol, np.concatenate([a_cav, h_cav[:, None]], axis=1))) / t2
        prec, shift = sym(sol[:, :f]), sol[:, f]
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

