"""The client half of online FedBNR (docs/algorithms.md §4): Bayesian linear regression on random features,
`y = φ(x)ᵀw + ε`, prior `w ~ N(0, λ²I)`, noise `ε ~ N(0, σ²)`, whose additive statistics `(S, b, n, q)`
(:mod:`streamfed.core.stats`) are all the fleet needs.

:class:`FedBNRClient` keeps the statistics of samples it has not uploaded yet (*pending*), the uploads the
server has not acknowledged yet (*unacked*) and a working posterior `global + unacked + pending` as the
Cholesky factor of an augmented precision matrix (:mod:`.factor`), updated by one rank-one Cholesky update
per sample (`O(F²)`, the compiled kernels; its state lives in one packed buffer, :mod:`.packed_state`).
:meth:`FedBNRClient.make_upload` turns at least `min_upload` pending samples into an :class:`~.messages.Upload`
(delta statistics + per-client sequence number); :meth:`FedBNRClient.apply_global` installs a
:class:`~.messages.GlobalModel` (one refactorisation) without counting twice the uploads the global already
contains (`GlobalModel.included[client]` is the highest sequence number summed, all lower ones included too).

Kernel dictionary: with `K` feature maps of the same size `F` (:mod:`.features`) all statistics carry a
leading `K` axis; each kernel has its own `σ_k, λ_k`; prediction is the Bayesian model average with weights
`∝ exp(log p_k(y))`, each kernel's evidence of the client's working statistics (computed in the log
domain), moment-matched to one Gaussian.

Lazy kernels (`lazy_gap = g > 0`; without forgetting, whose evidence is the sum of the log predictive densities
of the samples): a kernel whose working evidence is more than `2g` below the best kernel's is left out of the
mixture and its factor is no longer updated per sample (no triangular solve, no rank-one update; its samples
still enter the pending statistics). Each sample adds to an upper bound of its evidence the largest log density
its prediction could have given, `-½ log(2πσ_k²)`; its weight in the full mixture is below `exp(bound - best)`,
so leaving it out changes the prediction by less than `e^-g` of a weight. When the bound comes within `g` of the
best kernel's evidence (or when anything but the packed hot path reads the factors) its factor is rebuilt from
the exact statistics `global + unacked + pending` (`O(F³)`, what a global's install does), so it is again the
eager one; a global rebuilds every kernel anyway.

Forgetting (`forgetting = γ < 1`, for drifting streams) acts on the client's *working posterior only*;
uploads and the global stay exact sums. Before each local sample the augmented precision is multiplied
by `γ` (factor scaled by `√γ`: `A, h, c` and the prior all decay), then the sample is added. So every
piece of information enters the working posterior once — an own sample when observed, other clients'
samples when a global containing them arrives — and then loses a factor `γ` per local sample. To keep
the prior from vanishing with it, the precision it loses on average, `(1-γ)λ⁻²` per coordinate per
sample, is given back as one extra rank-one update `F(1-γ)λ⁻² e_j e_jᵀ` on coordinate `j = t mod F`
(cyclic refresh, still `O(F²)`): the prior stays diagonal, equal to `λ⁻²I` on average, each entry
oscillating within a factor `γ^F` over a cycle. With forgetting, "evidence" (used for the dictionary
weights) is that of the decayed statistics, a heuristic.

Personalisation (optional, :mod:`.personalisation`): a power prior `others_weight = α` on the other clients'
statistics (`"auto"`: α by the evidence of the client's own data), and `local_hyperparameters`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.fedbnr import _layout as lay
from streamfed.algorithms.fedbnr._compiled import kern
from streamfed.algorithms.fedbnr.checks import all_finite_products, all_finite_squares, check_positive, check_target
from streamfed.algorithms.fedbnr.discount import Discount
from streamfed.algorithms.fedbnr.factor import factorise, posterior_of_factor, stats_from_factor
from streamfed.algorithms.fedbnr.features import client_features
from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
from streamfed.algorithms.fedbnr.metrics import Z95, PrequentialMetrics, RidgeComparator
from streamfed.algorithms.fedbnr.packed_state import STAGE, PackedState
from streamfed.algorithms.fedbnr.personalisation import choose_others_weight, fit_local
from streamfed.core.durable import durable
from streamfed.core.features import FeatureMap
from streamfed.core.river_inputs import gaussian
from streamfed.core.stats import SufficientStats

if TYPE_CHECKING:
    from river.proba import Gaussian

__all__ = ["FedBNRClient"]


@durable("fedbnr.FedBNRClient")
class FedBNRClient(PackedState):
    """The client half of online FedBNR.

    Give it a feature map (or a list of maps of equal size for a kernel dictionary), or let it build
    the default Gaussian RFF + bias map from `n_inputs`, `n_features` (`D`, so `F = 2D + 1`),
    `bandwidth` (a float, or a sequence of floats for a Gaussian bandwidth dictionary) and `seed`.

    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-2, 2, (200, 1)); y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(200)
    >>> client = FedBNRClient(n_inputs=1, n_features=20, bandwidth=0.5, sigma=0.1, lam=1.0)
    >>> for xi, yi in zip(X, y):
    ...     client.learn(xi, yi)
    >>> mean, var = client.predict(np.array([0.5]))
    >>> bool(abs(mean - np.sin(1.0)) < 0.1 and 0.1**2 < var < 0.05)
    True
    >>> up = client.make_upload()           # 200 >= min_upload=32 pending samples
    >>> up.seq, up.n_samples, client.n_pending
    (1, 200.0, 0)
    >>> from streamfed.algorithms.fedbnr.server import FedBNRServer
    >>> server = FedBNRServer.for_client(client)
    >>> server.apply(up), server.apply(up)  # the duplicate changes nothing
    (True, False)
    >>> client.apply_global(server.publish())
    True
    >>> bool(abs(client.predict(np.array([0.5]))[0] - mean) < 0.05)  # refitted σ, λ; same data
    True
    """

    # Forgetting on a shared time base (.discount; class defaults: a client pickled before it restores without):
    # the clock (time of the latest sample or global); the pending statistics weighted by `2^((c_i − t_ref)/h)`
    # (`_wpend`, `c_i` the clock when row i was learned; `2^((t_ref − clock)/h) · _wpend` is their discounted
    # value), the weights of the staged rows learned before the last advance (`_stage_w[:_stage_mark]`; the later
    # ones were learned at the clock); all uploads discounted to a time (`_own_disc`).
    half_life_s: float | None = None
    discount: Discount | None = None
    _clock = -math.inf
    _t_ref = -math.inf  # −∞: no clock yet (rows weigh 1, as at the first clock)
    _stage_mark = 0

    # The regret's comparator (.metrics.RidgeComparator): made by the first regret() and from then on given every
    # own sample before the stage is flushed (a class default: a client pickled before it existed has none).
    _comparator: RidgeComparator | None = None

    def __init__(
        self,
        feature_map: FeatureMap | Sequence[FeatureMap] | None = None,
        *,
        n_inputs: int | None = None,
        n_features: int = 64,
        bandwidth: float | Sequence[float] = 1.0,
        seed: int = 0,
        sigma: float = 1.0,
        lam: float = 1.0,
        min_upload: int = 32,
        forgetting: float = 1.0,
        others_weight: float | str = 1.0,
        local_hyperparameters: bool = False,
        client_id: str = "client",
        half_life_s: float | None = None,
        lazy_gap: float = 0.0,
    ) -> None:
        self._features = client_features(feature_map, n_inputs=n_inputs, n_features=n_features,
                                         bandwidth=bandwidth, seed=seed)
        # (frequencies, scratch, n_inputs) of RFF + bias maps (the default, or a fleet's dictionary), for the
        # fused numba prediction path.
        bank = self._features.bank
        self._fast = None if bank is None else (bank.frequency_matrix, bank.scratch, bank.n_inputs)
        if not (0.0 < float(forgetting) <= 1.0):
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        if half_life_s is not None and float(forgetting) != 1.0:
            raise ValueError("forgetting per step and a half-life on the time base are exclusive: choose one")
        if int(min_upload) < 1:
            raise ValueError(f"min_upload must be >= 1, got {min_upload!r}")
        if not (0.0 <= float(lazy_gap) < math.inf):
            raise ValueError(f"lazy_gap must be a finite number of nats >= 0, got {lazy_gap!r}")
        self.auto_weight = others_weight == "auto"
        if not self.auto_weight and not (0.0 <= float(others_weight) <= 1.0):
            raise ValueError(f"others_weight must be in [0, 1] or 'auto', got {others_weight!r}")
        # α of the power prior on the other clients' statistics (see .personalisation).
        self.others_weight = 1.0 if self.auto_weight else float(others_weight)
        # Refit σ, λ on this client's working statistics at every global instead of taking the global's.
        self.local_hyperparameters = bool(local_hyperparameters)
        self.client_id = str(client_id)
        self.min_upload = int(min_upload)
        self.forgetting = float(forgetting)
        self.kernel_version = self._features.version
        self.epoch = 0
        kk, f = self._features.n_kernels, self._features.dim
        self.n_kernels, self.dim = kk, f
        sigma0, lam0 = check_positive("sigma", sigma), check_positive("lam", lam)
        # All per-sample state in one packed float64 buffer (see .packed_state): the prequential step is then
        # one numba call with three arguments. `_ra`, `sigma`, `lam`, ... are views of it.
        self._allocate()
        # Lazy kernels (module doc): only without forgetting, whose evidence is the sum of the predictive densities.
        lazy_ok = float(forgetting) == 1.0 and half_life_s is None and kk > 1
        self._buf[lay.H_LAZY_GAP] = float(lazy_gap) if lazy_ok else 0.0
        self._pdiag[...] = 1.0  # prior precision / λ⁻², per coordinate (≠ 1 only with forgetting)
        self.sigma[:] = sigma0
        self.lam[:] = lam0
        # Pending statistics: upper triangle of S only, kept exact and undecayed (they are uploaded);
        # rows are staged and folded into the scatter STAGE at a time (see _kernels.flush).
        # Working posterior: augmented upper factor per kernel (`_ra`), and the working n, q.
        self._unacked: dict[int, Upload] = {}
        self._own_uploaded = SufficientStats.zeros(f, (kk,), self.kernel_version, self.epoch)
        self._global: GlobalModel | None = None
        self._next_seq = 1
        self._cache: tuple[np.ndarray, float, float] | None = None  # (x, mean, variance) of the last predict
        self.metrics = PrequentialMetrics()
        self.half_life_s = None if half_life_s is None else float(half_life_s)
        self.discount = None if half_life_s is None else Discount(half_life_s)
        if self.discount is not None:
            self._clock = -math.inf
            zero = self._zero_stats
            self._wpend, self._own_disc = zero(), (zero(), -math.inf)
            self._stage_w = np.zeros(STAGE)
        self._rebuild(np.zeros((kk, f, f)), np.zeros((kk, f)), 0.0, self.sigma, self.lam, self._pdiag)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if self.discount is not None and "_wpend" not in state:
            # Pickled with the pending statistics discounted to the clock (`_dpend`) plus the raw ones since the last
            # advance (`_plast`, every earlier row flushed): the same statistics, weighted relative to t_ref = clock.
            dp, pl = self.__dict__.pop("_dpend"), self.__dict__.pop("_plast")
            self.__dict__.pop("_scratch", None)
            # (the counts include the staged rows, the scatter does not: they are weighed when the stage is folded)
            ys = self._stage_y[:self._staged]
            w = SufficientStats(self._s_pend - pl.S, self._b_pend - pl.b, float(self._n_pend - self._staged) - pl.n,
                                self._q_pend - float(ys @ ys) - pl.q, self.kernel_version, self.epoch) + dp
            kern.symmetric_from_upper(w.S, w.S)
            self._wpend, self._stage_w, self._t_ref = w, np.zeros(STAGE), self._clock

    # ------------------------------------------------------------------ introspection
    @property
    def kernel_names(self) -> list[str]:
        return list(self._features.names)

    @property
    def n_pending(self) -> int:
        """Samples learned since the last upload."""
        return self._n_pend

    @property
    def unacked(self) -> list[Upload]:
        """Uploads not yet contained in the latest global (e.g. to resend after a reconnect)."""
        return [self._unacked[s] for s in sorted(self._unacked)]

    @property
    def global_version(self) -> int:
        """Version of the global installed (0: none yet)."""
        return 0 if self._global is None else self._global.version

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def features(self, x: np.ndarray) -> np.ndarray:
        """`φ(x)` for every kernel, shape `(K, F)` (validated: a `ValueError` for bad input)."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 1 or not kern.all_finite(x):
            raise ValueError(f"input must be a finite 1-d vector, got shape {x.shape}"
                             + ("" if x.ndim != 1 else " with a non-finite value"))
        phi = self._features.transform(x)
        if self._features.bank is not None:
            return phi  # shape and finiteness checked inside
        phi = np.ascontiguousarray(phi, dtype=np.float64)
        if phi.shape != (self.n_kernels, self.dim) or not kern.all_finite(phi.reshape(-1)):
            raise ValueError("the feature map produced a non-finite or wrongly shaped feature vector")
        return phi

    def features_many(self, xs: np.ndarray) -> np.ndarray:
        """`φ` of each row of `xs`: `(T, K, F)`."""
        xs = np.asarray(xs, dtype=np.float64)
        if xs.ndim != 2 or not np.all(np.isfinite(xs)):
            raise ValueError(f"inputs must be a finite (T, d) array, got shape {xs.shape}")
        if xs.shape[0] == 0:
            return np.empty((0, self.n_kernels, self.dim))
        phis = self._features.transform_many(xs)
        if phis.shape != (xs.shape[0], self.n_kernels, self.dim) or not np.all(np.isfinite(phis)):
            raise ValueError("the feature map produced non-finite or wrongly shaped features")
        return phis

    # ------------------------------------------------------------------ prediction
    def _wake(self, marked_only: bool = False) -> None:
        """Rebuild the factors of the lazy kernels (those marked to be woken, `lazy = 2`, with `marked_only`) from
        the exact working statistics, as a global's install does (`O(F³)` each); they are active again."""
        lazy = self._lazy
        ks = np.flatnonzero(lazy == 2.0 if marked_only else lazy != 0.0)
        if ks.size == 0:
            return
        w = self._exact_work_stats()
        self._ra[ks] = factorise(w.S[ks], w.b[ks], w.q, self.sigma[ks], self.lam[ks], self._pdiag[ks])
        lazy[ks] = 0.0
        self._logw_dirty = True

    def _log_weights(self) -> np.ndarray:
        self._wake()  # (outside the packed hot path every factor is current)
        if self.n_kernels > 1 and self._logw_dirty:
            for k in range(self.n_kernels):
                self._logw[k] = kern.log_evidence_from_factor(self._ra[k], self._n_work, self.sigma[k],
                                                              self.lam[k])
            self._logw_dirty = False
        return self._logw

    def kernel_weights(self) -> np.ndarray:
        """Bayesian-model-average weights of the kernels (each ∝ its working evidence)."""
        lw = self._log_weights()
        w = np.exp(lw - lw.max())
        return w / w.sum()

    def log_evidence(self) -> np.ndarray:
        """Log evidence of the working statistics per kernel (`O(F)` each, from the factor)."""
        self._wake()
        return np.array([kern.log_evidence_from_factor(self._ra[k], self._n_work, self.sigma[k], self.lam[k])
                         for k in range(self.n_kernels)])

    @property
    def best_kernel(self) -> int:
        """Index of the kernel with the largest working evidence."""
        return int(np.argmax(self.log_evidence()))

    def predict_features(self, phi: np.ndarray) -> tuple[float, float]:
        """Predictive `(mean, variance)` for features `phi` (`(K, F)`, or `(F,)` when `K = 1`)."""
        if phi.ndim != 2 or not phi.flags.c_contiguous or phi.dtype != np.float64:
            phi = np.ascontiguousarray(phi, dtype=np.float64).reshape(self.n_kernels, self.dim)
        return kern.predict_mixture(self._ra, phi, self.sigma, self._log_weights(), self._work,
                                    self._means, self._vars)

    def _fast_input(self, x: Any) -> np.ndarray | None:
        """`x` itself when the packed numba path can take it (RFF + bias maps, float64 vector of the right
        length), else `None`."""
        if (self._fast is not None and type(x) is np.ndarray and x.dtype == np.float64 and x.ndim == 1
                and x.shape[0] == self._fast[2]):
            return x
        return None

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        """Predictive `(mean, variance)` at `x`: `N(φᵀm, σ² + φᵀA⁻¹φ)` (moment-matched over kernels)."""
        xf = self._fast_input(x)
        if xf is not None:
            # Hot path: features and predictive in one numba call on the packed state.
            status, mu, var = kern.packed_predict(self._buf, xf)
            if status == 3:
                self._wake(marked_only=True)
                status, mu, var = kern.packed_predict(self._buf, xf)
            if status:
                raise ValueError("input contains a non-finite value")
            x = xf.copy()  # our own copy (it is cached: the caller may change x before learn)
        else:
            x = np.array(x, dtype=np.float64)
            phi = self.features(x)
            mu, var = kern.predict_mixture(self._ra, phi, self.sigma, self._log_weights(), self._work,
                                           self._means, self._vars)
            self._phi[...] = phi
        # learn(x, y) right after predict(x) reuses this; while it is set, `_phi` holds φ(x).
        self._cache = (x, mu, var)
        return mu, var

    def learn_then_predict(self, x_learn: np.ndarray, y: float, x: np.ndarray) -> tuple[float, float]:
        """:meth:`learn` `(x_learn, y)`, then :meth:`predict` `x` (returned): the same numbers. When `x_learn` is the
        input of the last :meth:`predict` (the River pattern: predict a sample, learn it, predict the next) and the
        packed path takes `x`, without forgetting, each kernel's update and the next prediction are one pass over
        its factor (:func:`._kernels.packed_learn_predict`). Bad `y` raises `ValueError` and changes nothing; a bad
        `x` raises it once `(x_learn, y)` is learned."""
        cache = self._cache
        xf = self._fast_input(x)
        # (the bytes compared: a third of the checked compiled call; a -0.0 for a 0.0 only takes the general path)
        if (cache is None or xf is None or self.forgetting != 1.0 or self.discount is not None
                or not (type(x_learn) is np.ndarray and cache[0].tobytes() == x_learn.tobytes())):
            self.learn(x_learn, y)
            return self.predict(x)
        y = check_target(y)
        _, mu0, var0 = cache
        if self._staged == STAGE:
            self._before_full_stage()  # the step flushes the stage
        status, mu, var = kern.packed_learn_predict(self._buf, y, xf)
        if status == 1:  # x refused before anything changed: the sample is still learned
            self._learn_checked(None, y)
            self.metrics.update(mu0, var0, y)
            raise ValueError("input contains a non-finite value")
        if status == 2:
            self._cache = None
            raise ValueError("features times target overflow")
        self.metrics.update(mu0, var0, y)
        if status == 3:
            self._wake(marked_only=True)
            status, mu, var = kern.packed_predict(self._buf, xf)
        self._cache = (xf.copy(), mu, var)  # (as predict: φ(x) is in _phi)
        return mu, var

    def learn_predict(self, x: np.ndarray, y: float) -> tuple[float, float]:
        """One prequential step: the predictive `(mean, variance)` at `x` made *before* learning, then
        learn `(x, y)` — the same as :meth:`predict` then :meth:`learn`, in one numba call on the default
        RFF map (the per-sample hot path). Bad input raises `ValueError` and changes nothing."""
        if type(y) is not float:
            y = check_target(y)
        xf = self._fast_input(x)
        if xf is None:
            mu, var = self.predict(x)
            self.learn(x, y)
            return mu, var
        if self._staged == STAGE:
            self._before_full_stage()  # the step flushes the stage
        status, mu, var = kern.packed_step(self._buf, xf, y)
        if status == 3:
            self._wake(marked_only=True)
            status, mu, var = kern.packed_step(self._buf, xf, y)
        if status:
            self._cache = None
            raise ValueError("input contains a non-finite value" if status == 1 else
                             f"target must be finite (and |y| < 1e154), got {y!r}, or features times "
                             f"target overflow")
        self._cache = None
        # PrequentialMetrics.update, inlined (per-sample hot path).
        m = self.metrics
        r = y - mu
        m.count += 1
        m.sq_loss += r * r
        m.covered += abs(r) <= Z95 * math.sqrt(var)
        m.nlpd_sum += 0.5 * math.log(2.0 * math.pi * var) + 0.5 * r * r / var
        return mu, var

    def predict_one(self, x: np.ndarray, with_dist: bool = False) -> float | Gaussian:
        """River-style: the predictive mean, or with `with_dist` the predictive `river.proba.Gaussian`
        `N(φᵀm, σ² + φᵀA⁻¹φ)`."""
        mu, var = self.predict(x)
        return gaussian(mu, var) if with_dist else mu

    def learn_one(self, x: np.ndarray, y: float) -> None:
        """Alias of :meth:`learn` (River naming)."""
        self.learn(x, y)

    def predict_kernels(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each kernel's own predictive `(means (K,), variances (K,))`."""
        self.predict_features(self.features(x))
        return self._means.copy(), self._vars.copy()

    def predict_many(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances of each row of `xs` (no learning)."""
        phis = self.features_many(xs)
        means = np.empty(phis.shape[0])
        variances = np.empty(phis.shape[0])
        lw = self._log_weights()
        for t in range(phis.shape[0]):
            means[t], variances[t] = kern.predict_mixture(self._ra, phis[t], self.sigma, lw, self._work,
                                                          self._means, self._vars)
        return means, variances

    # ------------------------------------------------------------------ learning
    def learn(self, x: np.ndarray, y: float) -> None:
        """Predict `x` (prequential metrics), then add `(x, y)`: `O(F²)` per kernel."""
        y = check_target(y)  # a Python float from here on: numpy scalar arithmetic is slow
        cache = self._cache
        if cache is not None:
            x = np.ascontiguousarray(x, dtype=np.float64)
            if x.ndim == 1 and kern.same_vector(cache[0], x):
                _, mu, var = cache  # φ(x) is in _phi
                self._learn_checked(None, y)
                self.metrics.update(mu, var, y)
                return
        self.learn_predict(x, y)

    def learn_features(self, phi: np.ndarray, y: float) -> None:
        """:meth:`learn` for precomputed features `phi` (`(K, F)`, or `(F,)` when `K = 1`)."""
        y = check_target(y)
        phi = np.array(phi, dtype=np.float64)
        if phi.size != self.n_kernels * self.dim or not kern.all_finite(phi.reshape(-1)):
            raise ValueError(f"features must be finite with {self.n_kernels}x{self.dim} values")
        phi = phi.reshape(self.n_kernels, self.dim)
        mu, var = self.predict_features(phi)
        self._learn_checked(phi, y)
        self.metrics.update(mu, var, y)

    def _learn_checked(self, phi: np.ndarray | None, y: float) -> None:
        """Learn features `phi` (`None`: those already in `_phi`) with target `y` (a checked float)."""
        if phi is not None:
            self._phi[...] = phi
        self._cache = None
        if self._staged == STAGE:
            self._before_full_stage()  # the step flushes the stage
        if not kern.packed_learn(self._buf, y):  # checked before anything was touched
            raise ValueError("features times target overflow")

    def _set_hyper(self, sigma: np.ndarray, lam: np.ndarray) -> None:
        self.sigma[:] = np.asarray(sigma, dtype=np.float64)  # in place: views of the packed buffer
        self.lam[:] = np.asarray(lam, dtype=np.float64)
        self._inv_sigma[:] = 1.0 / self.sigma
        self._sqrt_gamma = math.sqrt(self.forgetting)
        self._buf[lay.H_GAMMA] = self.forgetting
        # √(F(1-γ)) / λ_k: the rank-one refresh that returns the prior precision lost to forgetting.
        self._refresh[:] = np.sqrt(self.dim * (1.0 - self.forgetting)) / self.lam

    def _after_learn(self, ys: np.ndarray) -> None:
        # Bookkeeping that mirrors what the numba kernels did to the factor for these targets.
        g = self.forgetting
        t = ys.shape[0]
        y2 = ys * ys
        self._n_pend += t
        self._q_pend += float(y2.sum())
        if g == 1.0:
            self._n_work += t
            self._q_work += float(y2.sum())
        else:
            decay = g ** np.arange(t - 1, -1, -1)  # weight of row i after the last row: γ^(T-1-i)
            self._n_work = g**t * self._n_work + float(decay.sum())
            self._q_work = g**t * self._q_work + float(decay @ y2)
            self._pdiag *= g**t
            cols = (self._refresh_j + np.arange(t)) % self.dim
            np.add.at(self._pdiag, (slice(None), cols), self.dim * (1.0 - g) * decay)  # type: ignore[arg-type]
            self._refresh_j = int((self._refresh_j + t) % self.dim)
        self._cache = None
        self._logw_dirty = True

    def learn_many(self, xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prequential pass over rows: returns the predictive means and variances made *before* each
        row was learned (identical to a loop of :meth:`predict` + :meth:`learn`). All rows are checked
        before any is learned, so bad input leaves the state unchanged."""
        ys = np.asarray(ys, dtype=np.float64)
        xs = np.asarray(xs, dtype=np.float64)
        if xs.ndim != 2 or ys.shape != (xs.shape[0],):
            raise ValueError(f"expected xs (T, d) and ys (T,), got {xs.shape} and {ys.shape}")
        if not all_finite_squares(ys):
            raise ValueError("targets must be finite")
        return self.learn_features_many(self.features_many(xs), ys)

    def learn_features_many(self, phis: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`learn_many` for precomputed features `(T, K, F)`."""
        phis = np.ascontiguousarray(phis, dtype=np.float64)
        ys = np.ascontiguousarray(ys, dtype=np.float64)
        t = ys.shape[0]
        phis = phis.reshape(t, self.n_kernels, self.dim)
        if not (np.all(np.isfinite(phis)) and all_finite_squares(ys)
                and all_finite_products(phis, ys[:, None, None])):
            raise ValueError("features and targets must be finite")
        means = np.empty(t)
        variances = np.empty(t)
        self._wake()  # learn_batch updates every factor
        cmp = self._comparator
        if self.discount is not None:
            self._flush()  # (the batch's rows enter _wpend below, all at the clock's weight)
        elif cmp is not None:
            self._fold_staged()  # the batch may flush the stage
        self._staged = kern.learn_batch(self._ra, self._s_pend, self._b_pend, self._stage, self._stage_y,
                                        self._staged, phis, ys, self.sigma, self.lam, self._n_work,
                                        self._sqrt_gamma, self._refresh, self._refresh_j, self._work,
                                        means, variances)
        self._after_learn(ys)
        if self.discount is not None:
            self._weigh_rows(phis.transpose(1, 2, 0), ys, np.full(t, self._row_weight(self._clock)))
            self._stage_w[:self._staged] = 0.0  # the rows left in the stage are in _wpend already
            self._stage_mark = self._staged
        if cmp is not None:
            cmp.fold_samples(phis, ys)
        self.metrics.update_many(means, variances, ys)
        return means, variances

    # ------------------------------------------------------------------ federation
    def _n_own(self) -> int:
        """Samples this client has learned (uploaded or pending)."""
        return int(round(float(self._own_uploaded.n))) + self._n_pend

    def _fold_staged(self) -> None:
        """Give the regret's comparator the own samples it has not taken yet: the last ones learned, all still in
        the stage (it is given them before every flush)."""
        cmp = self._comparator
        if cmp is not None:
            staged = self._staged
            cmp.fold_rows(self._stage, self._stage_y, staged - (self._n_own() - cmp.n), staged)

    def _before_full_stage(self) -> None:
        """What must see the staged rows before a step flushes the full stage into the raw pending statistics."""
        if self.discount is not None:
            self._flush()
        else:
            self._fold_staged()

    def _flush(self) -> None:
        if self._staged:
            self._fold_staged()
            if self.discount is not None:
                staged, mark = self._staged, self._stage_mark
                w = self._stage_w[:staged].copy()
                w[mark:] = self._row_weight(self._clock)  # rows learned since the last advance: at the clock
                self._weigh_rows(self._stage[:, :, :staged], self._stage_y[:staged], w)
            kern.flush(self._s_pend, self._b_pend, self._stage, self._stage_y, self._staged)
            self._staged = 0
        self._stage_mark = 0

    # With a half-life, rows are weighted relative to `_t_ref`, which is kept ahead of the clock by up to this many
    # half-lives: weights stay in (2^-REBASE, 1] for the rows of the last REBASE half-lives (no overflow, the
    # older ones underflow as their discounted values do), and `_wpend` is rescaled once per REBASE half-lives.
    REBASE_HALF_LIVES = 32.0

    def _row_weight(self, c: float) -> float:
        """`2^((c − t_ref)/h)`: the weight in `_wpend` of a row learned at clock `c` (1 before any clock)."""
        if not math.isfinite(self._t_ref):
            return 1.0
        assert self.discount is not None
        return self.discount.factor(c, self._t_ref)

    def _weigh_rows(self, rows: np.ndarray, ys: np.ndarray, w: np.ndarray) -> None:
        """`_wpend += Σ_t w_t [φ_t φ_tᵀ, φ_t y_t, 1, y_t²]` for rows `(K, F, T)` (one matrix product a kernel)."""
        wp = self._wpend
        scaled = rows * w
        wp.S += scaled @ rows.transpose(0, 2, 1)
        wp.b += scaled @ ys
        wp.n += float(w.sum())
        wp.q += float(w @ (ys * ys))

    def _rebase(self, time: float) -> None:
        """Move `t_ref` to `REBASE_HALF_LIVES` half-lives after `time`: every weight is multiplied by
        `2^((t_ref − t_ref')/h)` (the staged rows' too)."""
        assert self.discount is not None
        new_ref = time + self.REBASE_HALF_LIVES * self.discount.half_life_s
        f = self.discount.factor(time, new_ref) if not math.isfinite(self._t_ref) else \
            self.discount.factor(self._t_ref, new_ref)
        wp = self._wpend
        wp.S *= f
        wp.b *= f
        wp.n *= f
        wp.q *= f
        self._stage_w[:self._stage_mark] *= f
        self._t_ref = new_ref

    def _pending_stats(self) -> SufficientStats:
        self._flush()
        # only the upper triangle is accumulated (and read): mirrored in place, then copied by SufficientStats
        kern.symmetric_from_upper(self._s_pend, self._s_pend)
        return SufficientStats(self._s_pend, self._b_pend, float(self._n_pend), self._q_pend, self.kernel_version,
                               self.epoch)

    @property
    def clock(self) -> float:
        """With a half-life: the time (seconds) of the latest sample or global (−∞ before any)."""
        return self._clock

    def advance(self, time: float) -> None:
        """Move the clock to `time` (with a half-life; a no-op otherwise): what was learned so far is discounted
        by `2^(−Δ/h)` — the pending statistics exactly; the working posterior by the same factor with the prior
        precision it loses given back as one cyclic rank-one refresh (as per-step forgetting does; the next global
        rebuilds it exactly). A time before the clock counts as the clock (statistics never move back in time);
        a time that is not finite is refused (`ValueError`, nothing changed).

        The pending statistics are not touched: their rows carry weights relative to a reference time (`_wpend`,
        scaled to the clock when read; rescaled when the clock passes the reference, at most once per
        `REBASE_HALF_LIVES` half-lives), so a step costs the factor's scale and one rank-one refresh, `O(K·F²)`, not
        the `K×F×F` passes over the statistics it cost before."""
        d = self.discount
        if d is None:
            return
        time = float(time)
        if not math.isfinite(time):
            raise ValueError(f"time must be finite, got {time!r}")
        if not time > self._clock:
            return
        g = d.factor(self._clock, time)
        first = not math.isfinite(self._clock)  # the first sample's time: nothing learned yet to discount
        # The pending statistics: the rows staged since the last advance were learned at the old clock (rows learned
        # before any clock count as learned at the first); nothing else moves unless t_ref must (O(1) a sample).
        staged, mark = self._staged, self._stage_mark
        if first or time > self._t_ref:
            self._rebase(time)
        self._stage_w[mark:staged] = self._row_weight(time if first else self._clock)
        self._stage_mark = staged
        self._clock = time
        if g == 1.0 or first:
            return
        if g < 1e-6:  # (nearly) everything forgotten: rebuild exactly rather than scale the factor towards zero
            s_work, b_work = stats_from_factor(self._ra, self.sigma, self.lam, self._pdiag)
            self._rebuild(g * s_work, g * b_work, g * self._q_work, self.sigma.copy(), self.lam.copy(),
                          np.ones_like(self._pdiag))
            self._n_work *= g
            self._q_work *= g
            return
        lost = self.dim * (1.0 - g)
        j = self._refresh_j
        # Rₐ ← √g Rₐ, then + refresh_k² e_j e_jᵀ: one rank-one update a kernel, fused with the scale
        kern.decay_refresh(self._ra, math.sqrt(g), math.sqrt(lost) / self.lam, j, np.empty(self.dim + 1))
        self._pdiag *= g
        self._pdiag[:, j] += lost
        self._refresh_j = (j + 1) % self.dim
        self._n_work *= g
        self._q_work *= g
        self._cache = None
        self._logw_dirty = True

    def _discounted_pending(self) -> SufficientStats:
        """The pending statistics discounted to the clock (samples learned since the last advance weigh 1):
        `2^((t_ref − clock)/h) · _wpend` (a copy)."""
        self._flush()
        scale = 1.0
        if math.isfinite(self._t_ref):
            scale = math.exp(math.log(2.0) / self.half_life_s * (self._t_ref - self._clock))  # type: ignore[operator]
        out = self._wpend.copy()  # (scaled in place: one K×F×F copy, not `scaled`'s two)
        if scale != 1.0:
            out.S *= scale
            out.b *= scale
            out.n *= scale
            out.q *= scale
        return out

    def make_upload(self) -> Upload | None:
        """The delta statistics of the pending samples as an :class:`Upload`, or `None` while fewer than
        `min_upload` samples are pending (the privacy floor). Raises `ValueError` (and keeps the
        samples pending) if any statistic is not finite."""
        if self._n_pend < self.min_upload:
            return None
        stats = self._pending_stats().check_finite()
        if self.discount is None:
            up = Upload(self.client_id, self._next_seq, self.global_version, stats)
        else:
            disc = self._discounted_pending().check_finite()
            up = Upload(self.client_id, self._next_seq, self.global_version, disc, self._clock, self._n_pend)
            # Own uploads, discounted to this clock, plus this one; pending weights back to zero: in place (the
            # statistics are K×F×F: fresh copies of them were most of an upload's cost).
            own, t_own = self._own_disc
            g = self.discount.factor(t_own, self._clock)
            if g != 1.0:
                own.S *= g
                own.b *= g
                own.n *= g
                own.q *= g
            own += disc
            self._own_disc = (own, self._clock)
            wp = self._wpend
            wp.S[...] = 0.0
            wp.b[...] = 0.0
            wp.n = wp.q = 0.0
        self._unacked[up.seq] = up
        self._own_uploaded += stats
        self._next_seq += 1
        self._s_pend[...] = 0.0
        self._b_pend[...] = 0.0
        self._n_pend = 0
        self._q_pend = 0.0
        return up

    def own_stats(self) -> SufficientStats:
        """Statistics of every sample this client has learned (uploaded or pending)."""
        return self._own_uploaded + self._pending_stats()

    def add_pending(self, stats: SufficientStats) -> None:
        """Add statistics summarised elsewhere — samples learned under an earlier feature map and carried to this
        one (URK-FedBNR's kernel versions, :mod:`streamfed.algorithms.urk.carry`) — to the pending ones: the next
        upload carries them and the working posterior includes them. `ValueError` (nothing changed) with
        forgetting, for another shape, a non-finite value or a count that is not whole."""
        if self.forgetting != 1.0 or self.discount is not None:
            raise ValueError("a client with forgetting keeps no exact totals to add statistics to")
        if stats.S.shape != (self.n_kernels, self.dim, self.dim) or stats.b.shape != (self.n_kernels, self.dim):
            raise ValueError(f"statistics of shape {stats.S.shape}, expected {(self.n_kernels, self.dim, self.dim)}")
        n = float(stats.n)
        if not (stats.is_finite() and n >= 0 and n == math.floor(n) and math.isfinite(float(stats.q))):
            raise ValueError("statistics to add must be finite, of a whole count of samples")
        self._wake()
        self._flush()
        total = self._exact_work_stats() + SufficientStats(stats.S, stats.b, n, float(stats.q), self.kernel_version,
                                                           self.epoch)
        self._rebuild(total.S, total.b, total.q, self.sigma.copy(), self.lam.copy(), self._pdiag.copy())  # may raise
        self._s_pend += stats.S  # the lower triangle of the pending scatter is never read
        self._b_pend += stats.b
        self._n_pend += int(n)
        self._q_pend += float(stats.q)
        self._n_work, self._q_work = total.n, total.q
        self._comparator = None  # the regret's comparator is rebuilt from own_stats() when next read

    def rebase(self, epoch: int) -> None:
        """Join epoch `epoch` of a server that lost its state (docs/reliability.md § Lost state): every sample
        this client has learned, uploaded or pending, becomes pending again under the new epoch, so its next
        upload carries its totals; upload numbers restart at 1. Statistics of older epochs are never summed
        with the new ones. `ValueError` (nothing changed) with forgetting — decayed statistics have no exact
        total to send — or for an epoch that is not newer."""
        if int(epoch) <= self.epoch:
            raise ValueError(f"epoch {epoch} is not newer than this client's {self.epoch}")
        if self.forgetting != 1.0 or self.discount is not None:
            raise ValueError("a client with forgetting has no exact totals to upload again")
        self._wake()  # lazy factors are rebuilt from the statistics this changes the bookkeeping of
        own = self.own_stats()
        self.epoch = int(epoch)
        self._s_pend[...] = own.S
        self._b_pend[...] = own.b
        self._n_pend = int(round(float(own.n)))
        self._q_pend = float(own.q)
        self._unacked = {}
        self._own_uploaded = self._zero_stats()
        self._next_seq = 1
        self._global = None

    def working_stats(self) -> SufficientStats:
        """The statistics behind the working posterior.

        Without forgetting: `global + unacked uploads + pending` (exact sums). With forgetting: the
        decayed statistics recovered from the factor (`σ²(A - λ⁻²P)`, `σ²h`, `σ²c`).
        """
        if self.forgetting == 1.0 and self.discount is None:
            return self._exact_work_stats()
        s, b = stats_from_factor(self._ra, self.sigma, self.lam, self._pdiag)
        return SufficientStats(s, b, self._n_work, self._q_work, self.kernel_version, self.epoch)

    def _zero_stats(self) -> SufficientStats:
        return SufficientStats.zeros(self.dim, (self.n_kernels,), self.kernel_version, self.epoch)

    def _exact_work_stats(self) -> SufficientStats:
        total = self._pending_stats()
        not_in = None  # the unacknowledged uploads (None: none; no zero statistics to add)
        for up in self._unacked.values():
            if not_in is None:
                not_in = up.stats.copy()
            else:
                not_in += up.stats
        if not_in is not None:
            total += not_in
        if self._global is not None:
            own_in = self._own_uploaded if not_in is None else self._own_uploaded - not_in
            total += (self._global.stats - own_in).scaled(self.others_weight) + own_in
        return total

    def choose_others_weight(self, others: SufficientStats, own: SufficientStats, sigma: np.ndarray,
                             lam: np.ndarray) -> float:
        """The α of the grid maximising the evidence of this client's own data under the power prior
        `N(0, λ²I) × L_others^α` (:func:`.personalisation.choose_others_weight`)."""
        return choose_others_weight(others, own, sigma, lam, self.others_weight)

    def _rebuild(self, s_mat: np.ndarray, b: np.ndarray, q: float, sigma: np.ndarray, lam: np.ndarray,
                 pdiag: np.ndarray) -> None:
        """Refactorise the working posterior from statistics `(S (K,F,F), b (K,F), q)`: `O(F³)` per kernel,
        all-or-nothing (a failure changes nothing; :func:`.factor.factorise`)."""
        factorise(s_mat, b, q, sigma, lam, pdiag, out=self._ra)  # (writes only once every factor is made)
        self._lazy[...] = 0.0
        self._set_hyper(sigma, lam)
        self._pdiag[...] = np.array(pdiag, dtype=np.float64)
        self._cache = None
        self._logw_dirty = True

    def apply_global(self, g: GlobalModel) -> bool:
        """Install a global (one refactorisation). Returns `False` (and changes nothing) for a global not
        newer than the installed one. The working posterior becomes `global + own uploads not contained
        in it + pending` (with forgetting: the current decayed posterior plus the other clients'
        statistics that are new in this global; with `others_weight = α < 1`, the other clients' part
        counts α times — α re-chosen here when `"auto"`). `σ, λ` are taken from the global."""
        if g.kernel_version != self.kernel_version or g.epoch != self.epoch:
            raise ValueError(f"global is for kernel version {g.kernel_version!r}/epoch {g.epoch}, "
                             f"this client uses {self.kernel_version!r}/epoch {self.epoch}")
        if g.stats.S.shape != (self.n_kernels, self.dim, self.dim):
            raise ValueError(f"global statistics have shape {g.stats.S.shape}, expected "
                             f"{(self.n_kernels, self.dim, self.dim)}")
        sigma = np.asarray(g.sigma, dtype=np.float64).reshape(-1)
        lam = np.asarray(g.lam, dtype=np.float64).reshape(-1)
        if sigma.shape != (self.n_kernels,) or lam.shape != (self.n_kernels,):
            raise ValueError("global hyperparameters must have one value per kernel")
        if not (g.stats.is_finite() and np.all(np.isfinite(sigma)) and np.all(np.isfinite(lam))
                and np.all(sigma > 0) and np.all(lam > 0)):
            raise ValueError("global contains non-finite statistics or non-positive hyperparameters")
        if self.discount is not None and not math.isfinite(g.time):
            raise ValueError(f"global time {g.time!r} is not finite")
        if self._global is not None and g.version <= self._global.version:
            return False
        inc = int(g.included.get(self.client_id, 0))
        newly_in = [s for s in self._unacked if s <= inc]
        not_in = None  # own uploads the global does not contain (None: none)
        for seq, up in self._unacked.items():
            if seq > inc:
                if not_in is None:
                    not_in = up.stats.copy()
                else:
                    not_in += up.stats
        if self.discount is not None:
            self._apply_discounted(g, inc, sigma, lam)
        else:
            self._apply_global(g, not_in, newly_in, sigma, lam)
        for seq in newly_in:
            del self._unacked[seq]
        # A client that restarted must not reuse sequence numbers the server has already summed.
        self._next_seq = max(self._next_seq, inc + 1)
        self._global = g
        return True

    def _apply_discounted(self, g: GlobalModel, inc: int, sigma: np.ndarray, lam: np.ndarray) -> None:
        """:meth:`apply_global` with a half-life: everything is brought to the clock (moved to the global's time
        if that is later) and the working posterior is rebuilt exactly — `global + own uploads not in it +
        pending`, each discounted to the clock (the tempered and local variants as without forgetting)."""
        d = self.discount
        assert d is not None
        self.advance(g.time)
        t = self._clock if math.isfinite(self._clock) else float(g.time)
        glob = d.shift(g.stats, g.time, t)
        not_in = self._zero_stats()
        for seq, up in self._unacked.items():
            if seq > inc:
                not_in += d.shift(up.stats, up.time, t)
        pending = self._discounted_pending()
        own, t_own = self._own_disc
        own_in = d.shift(own, t_own, t) - not_in
        alpha = self.others_weight
        if self.auto_weight:
            alpha = self.choose_others_weight(glob - own_in, own_in + not_in + pending, sigma, lam)
        total = pending + glob + not_in
        if alpha != 1.0:
            total -= (glob - own_in).scaled(1.0 - alpha)
        if self.local_hyperparameters:
            sigma, lam = fit_local(total.S, total.b, total.n, total.q, sigma, lam)
        self._rebuild(total.S, total.b, total.q, sigma, lam, np.ones_like(self._pdiag))
        self._n_work, self._q_work = total.n, total.q
        self.others_weight = alpha

    def _apply_global(self, g: GlobalModel, not_in: SufficientStats | None, newly_in: list[int],
                      sigma: np.ndarray, lam: np.ndarray) -> None:
        alpha = self.others_weight
        if self.auto_weight or alpha != 1.0:
            not_in = self._zero_stats() if not_in is None else not_in
        if self.auto_weight:
            assert not_in is not None
            own_all = self.own_stats()
            alpha = self.choose_others_weight(g.stats - (self._own_uploaded - not_in), own_all, sigma, lam)
        if self.forgetting == 1.0:
            # Exact: global + own uploads the global does not contain + pending.
            if self._n_pend == 0 and self._q_pend == 0.0 and self._staged == 0 and not_in is None and alpha == 1.0:
                total = g.stats  # nothing to add (what an estimator's sync leaves): read, never written
            else:
                total = self._pending_stats()  # (a fresh copy: summed into in place)
                total += g.stats
                if not_in is not None:
                    total += not_in
            if alpha != 1.0:
                assert not_in is not None
                # Tempered: α × (global - own part of it) + own part of it.
                own_in = self._own_uploaded - not_in
                total -= (g.stats - own_in).scaled(1.0 - alpha)
            if self.local_hyperparameters:
                sigma, lam = fit_local(total.S, total.b, total.n, total.q, sigma, lam)
            self._rebuild(total.S, total.b, total.q, sigma, lam, self._pdiag)
            self._n_work, self._q_work = total.n, total.q
        else:
            # Current decayed posterior + what is new in this global from the *other* clients (own
            # samples newly included entered when they were learned, and have been decaying since).
            s, b = stats_from_factor(self._ra, self.sigma, self.lam, self._pdiag)
            delta = g.stats.copy() if self._global is None else g.stats - self._global.stats
            for seq in newly_in:
                delta -= self._unacked[seq].stats
            delta = delta.scaled(alpha)
            if self.local_hyperparameters:
                sigma, lam = fit_local(s + delta.S, b + delta.b, self._n_work + delta.n,
                                       self._q_work + delta.q, sigma, lam)
            self._rebuild(s + delta.S, b + delta.b, self._q_work + delta.q, sigma, lam, self._pdiag)
            self._n_work += delta.n
            self._q_work += delta.q
        self.others_weight = alpha

    # ------------------------------------------------------------------ posterior and regret
    def posterior(self, kernel: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean `m = σ⁻²A⁻¹b` and covariance `A⁻¹` of one kernel's weights (`O(F³)`)."""
        self._wake()
        return posterior_of_factor(self._ra[kernel])

    def regret(self) -> dict[str, float]:
        """Cumulative squared loss of the prequential predictions vs the best fixed ridge predictor in
        hindsight on this client's own samples (the best kernel's, at the current `σ_k, λ_k`).

        The comparator (:class:`~.metrics.RidgeComparator`) is made by the first call (`O(K·F³)`); after that a
        call costs the rank-one updates of the samples learned since (`O(K·F²)` each, which learning pays from
        then on), plus a refactorisation of the kernels that can still be the best when `σ_k, λ_k` changed (a
        new global)."""
        n = self._n_own()
        if n == 0:
            return {"n": 0.0, "loss": 0.0, "ridge_loss": 0.0, "regret": 0.0, "regret_per_sample": math.nan}
        reg = (self.sigma / self.lam) ** 2  # the comparator's ridge σ²/λ², per kernel
        if self._comparator is None:
            self._comparator = RidgeComparator.of(self.own_stats(), reg)
        else:
            self._fold_staged()
        best, kernel = self._comparator.best(reg, self.own_stats)
        loss = self.metrics.sq_loss
        return {"n": float(n), "loss": loss, "ridge_loss": best, "regret": loss - best,
                "regret_per_sample": (loss - best) / n, "best_ridge_kernel": float(kernel)}
