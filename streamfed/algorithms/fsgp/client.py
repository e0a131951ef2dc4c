"""The client half of FSGP (docs/algorithms.md, "FSGP").

A client keeps, all under the current version's `(θ, σ, Z)`:

* *pending* — statistics of samples not uploaded yet (they leave once there are `min_upload` of them);
* *unacked* — its uploads no global includes yet, by sequence number;
* a working posterior `global + unacked + pending` (:class:`~.posterior.SparsePosterior`); per sample,
  one compiled call (:mod:`._kernels`) predicts and makes the rank-one update of its augmented Cholesky
  factor (`O(M²)`), and stages the sample's `[k, y]` row, which joins the sums `STAGE_ROWS` rows at a time;
* a bounded reservoir of raw samples (Vitter's algorithm R), which never leaves the device: after
  `fit_every` samples, then at intervals doubling up to `fit_every_max`, it runs a few Adam steps on Titsias'
  bound from the global's hyperparameters (FedAvg's local update) and attaches the result to its next upload
  as a proposal;
* personalised (`personal`): the statistics of its own samples alone, and the fixed-share weights of two
  experts, the working posterior and its own samples' posterior (:meth:`FSGPClient.mixture_weights`).

A global of a newer version `(θ', σ', Z')` carries everything the client holds to the new inducing inputs
by the projection of Bui et al. (:mod:`.projection`) — pending and unacked statistics — so no statistics
of two versions are ever added, and nothing learned is discarded. (The regret's comparator keeps its own
statistics under the initial version, never carried: a fixed comparator class.)

Forgetting (`half_life_s`, :mod:`streamfed.core.discount`): the client has a clock on the fleet's time base (the
readings' times, :meth:`FSGPClient.advance`); moving it forward by `Δ` multiplies the pending, the working
posterior's and the own-samples expert's statistics by `2^(−Δ/h)`, so each is the discounted statistics of its
samples at the clock. A discount scales `P` but not the prior `C`, so the factors of `C + σ⁻²P` are refactorised
(`O(M³/3)` each per advance, exact). Uploads carry their time and raw sample count (unacked ones keep theirs);
a global and the unacked uploads are brought to the later of its time and the clock when it is installed. The
regret's comparator stays undiscounted: the best fixed predictor in hindsight on every own sample, not a drifting
one.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
from scipy.linalg import cho_solve

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.fixed_share import FixedShare
from streamfed.algorithms.fsgp._compiled import kern
from streamfed.algorithms.fsgp.declared import clamp_to_declared
from streamfed.algorithms.fsgp.elbo import fit_hyper
from streamfed.algorithms.fsgp.kernels import KIND_CODES, Hyper
from streamfed.algorithms.fsgp.messages import GlobalModel, Upload
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats, cholesky, lower_solve
from streamfed.algorithms.fsgp.projection import ProjectionMap
from streamfed.core.discount import Discount
from streamfed.core.durable import durable

__all__ = ["OWN_PRIOR_WEIGHT", "STAGE_ROWS", "FSGPClient", "finite_target"]

OWN_PRIOR_WEIGHT = 0.1  # the own-samples expert's initial mixture weight (personalised clients)
STAGE_ROWS = 32  # samples staged before they join the sums: one (32×M)ᵀ(32×M) product instead of 32 outer products


def _finite_input(x: np.ndarray, d: int) -> np.ndarray:
    if type(x) is np.ndarray and x.dtype == np.float64 and x.shape == (d,) and x.flags.c_contiguous:
        return x  # the per-sample path: the compiled step checks finiteness itself
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    if x.shape != (d,):
        raise ValueError(f"expected an input of {d} values, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise NonFiniteError("input contains a non-finite value")
    return x


def _log_density(y: float, mean: float, var: float) -> float:
    return -0.5 * (math.log(2.0 * math.pi * var) + (y - mean) ** 2 / var)


def _augmented_factor(post: SparsePosterior, what: str, factored: tuple[Stats, np.ndarray] | None = None
                      ) -> np.ndarray:
    """`Rₐ = [[L_Bᵀ, u], [0, ρ]]` of a posterior (:mod:`._kernels`): `u = σ⁻² L_B⁻¹ r`, `ρ² = σ⁻² q - uᵀu`
    (`factored`: of these statistics and factor of `B` under the posterior's `(θ, σ, Z)` instead)."""
    h, m = post.hyper, post.hyper.m
    stats, L_B = (post.stats, post.L_B) if factored is None else factored
    ra = np.zeros((m + 1, m + 1))
    ra[:m, :m] = L_B.T
    u = lower_solve(L_B, stats.r) / h.noise_var
    ra[:m, m] = u
    ra[m, m] = math.sqrt(max(stats.q / h.noise_var - float(u @ u), 0.0))
    if not np.all(np.isfinite(ra)):
        raise NonFiniteError(f"{what} factor is not finite")
    return ra


def finite_target(y: float) -> float:
    try:
        y = float(y)
    except (TypeError, ValueError) as e:
        raise ValueError(f"target {y!r} is not a number") from e
    if not (math.isfinite(y) and math.isfinite(y * y)):  # a Python float overflows to inf, never raises
        raise NonFiniteError(f"target {y!r} (or its square) is not finite")
    return y


@durable("fsgp.FSGPClient")
class FSGPClient:
    """One client: prequential predictions, per-sample statistics, uploads, globals, local fits.

    >>> from streamfed.algorithms.fsgp.design import gaussian_design
    >>> h = Hyper.initial("se", gaussian_design(4, 1), sigma=0.5)
    >>> c = FSGPClient(h, min_upload=2, learn_hyperparameters=False)
    >>> c.learn(np.array([0.1]), 1.0)
    (0.0, 1.25)
    >>> c.make_upload() is None
    True
    >>> c.learn(np.array([0.2]), 1.0)[0] > 0.0
    True
    >>> up = c.make_upload()
    >>> up.seq, up.stats.n, c.n_pending
    (1, 2.0, 0)

    With a half-life, samples are discounted by the time on the clock (:meth:`advance`):

    >>> c = FSGPClient(h, min_upload=2, learn_hyperparameters=False, half_life_s=3600.0)
    >>> c.advance(0.0); _ = c.learn(np.array([0.1]), 1.0)
    >>> c.advance(3600.0); _ = c.learn(np.array([0.2]), 1.0)
    >>> up = c.make_upload()
    >>> up.stats.n, up.count, up.time
    (1.5, 2, 3600.0)
    """

    # forgetting on the time base (class defaults: a client stored before it existed restores without)
    half_life_s: float | None = None
    discount: Discount | None = None
    _clock = -math.inf
    _n_raw = 0  # with forgetting: the raw count of the folded pending samples (their `n` is discounted)
    unacked_time: dict[int, float] = {}  # noqa: RUF012 (replaced, never mutated, on a client stored before it)
    # personalised: (n, global version, x bytes, global expert's, own expert's, mixture's prediction) of the last
    # predict (a class default: a client stored before it has none)
    _cache: tuple[Any, ...] | None = None

    def __init__(self, hyper: Hyper, *, epoch: int = 0, jitter: float = 1e-6, min_upload: int = 32,
                 client_id: str = "client", learn_hyperparameters: bool = True, reservoir: int = 256,
                 fit_every: int = 128, fit_steps: int = 10, learning_rate: float = 0.05, seed: int = 0,
                 fit_every_max: int | None = None,
                 label_bound: float | None = None, z_box: float | None = None, personal: bool = False,
                 switch_rate: float = 0.01, half_life_s: float | None = None) -> None:
        if min_upload < 1 or reservoir < 1 or fit_every < 1 or fit_steps < 1:
            raise ValueError("min_upload, reservoir, fit_every and fit_steps must be >= 1")
        self.hyper = hyper
        self.epoch = int(epoch)
        self.jitter = float(jitter)
        self.min_upload = int(min_upload)
        self.client_id = str(client_id)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.fit_every, self.fit_steps, self.learning_rate = int(fit_every), int(fit_steps), float(learning_rate)
        # fits at n = f, 3f, 7f, …: the interval doubles from fit_every up to fit_every_max (None: constant)
        self.fit_every_max = max(self.fit_every, int(fit_every_max if fit_every_max is not None else fit_every))
        self._fit_interval, self._next_fit = self.fit_every, self.fit_every
        # the aggregator's declared bounds (docs/algorithms.md §6.13): carried pending statistics are clamped to
        # them, local fits keep Z within the box
        self.label_bound = None if label_bound is None else float(label_bound)
        self.z_box = None if z_box is None else float(z_box)
        m = hyper.m
        self.post = SparsePosterior(hyper, Stats.zeros(m, self.epoch), self.jitter)
        self._pending = Stats.zeros(m, self.epoch)
        # every own sample under the *initial* (θ, σ, Z), never projected: the regret's fixed comparator class
        self._hyper0 = hyper
        self._own0 = SparsePosterior(hyper, Stats.zeros(m, self.epoch), self.jitter)
        self.unacked: dict[int, Stats] = {}
        self.unacked_time: dict[int, float] = {}  # with forgetting: the time each unacked upload is discounted to
        self.global_model: GlobalModel | None = None
        self.next_seq = 1
        self.proposal: tuple[Hyper, float] | None = None
        self.n_fits = 0
        self.n_clamped = 0  # carried pending statistics scaled down to the declared bounds (.declared)
        # the reservoir: raw samples stay on the device; its RNG is the client's own, from the fleet seed
        self._res_x = np.zeros((int(reservoir), hyper.d))
        self._res_y = np.zeros(int(reservoir))
        self._res_n = 0
        self._seen = 0
        self._w_keep, self._next_keep = 1.0, 0  # algorithm L's state once the reservoir is full
        self._rng = np.random.default_rng([int(seed), zlib.crc32(self.client_id.encode())])
        self.n, self.loss = 0, 0.0
        # the per-sample path (see _kernels): staged rows, and the comparator's own rows once (θ, Z) moved on
        self._stage = np.zeros((STAGE_ROWS, m + 1))
        self._stage0 = np.zeros((STAGE_ROWS, m + 1))
        self._staged = 0
        self._staged_y2 = 0.0  # Σ y² and Σ |y| of the staged rows: cheap bounds on what the sums will hold
        self._staged_ay = 0.0
        self._r_max = 0.0  # max |r| of the working and pending sums at the last fold
        self._work = np.empty(3 * (m + 1))
        self._out = np.empty(2)
        self._Z0 = np.ascontiguousarray(hyper.Z)
        self._inv_ls0 = np.exp(-hyper.log_ls)
        self._a2_0, self._kind0 = hyper.amplitude ** 2, KIND_CODES[hyper.kind]
        # personalisation (:meth:`mixture_weights`): every own sample under the current version, and the
        # fixed-share weights of the two experts [global, own] on the client's own prequential densities
        self.personal = bool(personal)
        self.own_post = SparsePosterior(hyper, Stats.zeros(m, self.epoch), self.jitter)
        # from (0.9, 0.1): a client joining a running fleet predicts with the fleet's posterior until its own
        # samples earn their weight (its own expert is the bare prior at first); log 10 nats of regret, once
        self.mix = FixedShare(2, switch_rate, prior=np.array([1.0 - OWN_PRIOR_WEIGHT, OWN_PRIOR_WEIGHT]))
        self.expert_loss = [0.0, 0.0]  # each expert's prequential squared loss (diagnostics)
        self._hyp_own = np.zeros(3)
        self._out_own = np.empty(2)
        self.half_life_s = None if half_life_s is None else float(half_life_s)
        self.discount = None if half_life_s is None else Discount(half_life_s)
        self._clock = -math.inf
        self._n_raw = 0
        self._sync()

    # ------------------------------------------------------------------ reading
    @property
    def global_version(self) -> int:
        return 0 if self.global_model is None else int(self.global_model.version)

    @property
    def pending(self) -> Stats:
        """The statistics of samples not uploaded yet."""
        self._fold()
        return self._pending

    @property
    def n_pending(self) -> int:
        """Samples learned since the last upload (a raw count, with forgetting too)."""
        if self.discount is not None:
            return self._n_raw + self._staged
        return int(self._pending.n) + self._staged

    @property
    def clock(self) -> float:
        """With a half-life: the time (seconds) of the latest sample or global (−∞ before any)."""
        return self._clock

    def advance(self, time: float) -> None:
        """Move the clock to `time` (with a half-life; a no-op otherwise): everything held — the pending statistics,
        the working posterior's and the own-samples expert's — is multiplied by `2^(−Δ/h)` and their factors rebuilt
        (`O(M³/3)` each, exact); unacked uploads keep their own times (:attr:`unacked_time`) until a global reads
        them. A time before the clock counts as the clock (statistics never move back
        in time); a time that is not finite is refused (`ValueError`, nothing changed)."""
        d = self.discount
        if d is None:
            return
        time = float(time)
        if not math.isfinite(time):
            raise ValueError(f"time must be finite, got {time!r}")
        if not time > self._clock:
            return
        g = d.factor(self._clock, time)
        first = not math.isfinite(self._clock)  # the first time: nothing learned yet to discount
        if g == 1.0 or first:
            self._clock = time
            return
        # the factors first (they may fail — an overflowing refactorisation — with nothing changed), then commit
        self._fold()  # staged rows were learned at the clock: into the sums before they are discounted
        work = self.post.discounted(g)
        ra = _augmented_factor(self.post, "the working posterior's", work)
        own, ra_own = None, None
        if getattr(self, "personal", False):
            own = self.own_post.discounted(g)
            ra_own = _augmented_factor(self.own_post, "the own posterior's", own)
        self._clock = time
        self.post.set_factored(*work)
        self._ra = ra
        if own is not None and ra_own is not None:
            self.own_post.set_factored(*own)
            self._ra_own = ra_own
        self._pending.scale(g)  # (unacked uploads stay as sent, at their own times: a global shifts them when read)
        self._r_max *= g  # (still a bound on |r| of the sums)
        self._cache = None

    @property
    def reservoir(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples the local fit sees (copies)."""
        return self._res_x[: self._res_n].copy(), self._res_y[: self._res_n].copy()

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        x = _finite_input(x, self.hyper.d)
        if not getattr(self, "personal", False):
            self._step(x, 0.0, -1, True)
            return self._prediction()
        c = getattr(self, "_cache", None)
        key = x.tobytes()
        if c is not None and c[0] == self.n and c[1] == self.global_version and c[2] == key:
            return c[5]  # the same x again, nothing learned since (an agent's predict, then learn)
        self._step(x, 0.0, -1, True)
        self._step_own(x, 0.0, -1, True)
        glob, own = self._prediction(), self._prediction_own()
        mix = self._mixture(glob, own)
        # learn(x, y, this prediction) next reuses both experts' predictions (same state, same x)
        self._cache = (self.n, self.global_version, key, glob, own, mix)
        return mix

    def expert_predictions(self, x: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
        """`((mean, var) global, (mean, var) own)` at `x`: what the mixture of :meth:`predict` combines (without
        personalisation both are the working posterior's)."""
        x = _finite_input(x, self.hyper.d)
        self._step(x, 0.0, -1, True)
        glob = self._prediction()
        if not getattr(self, "personal", False):
            return glob, glob
        self._step_own(x, 0.0, -1, True)
        return glob, self._prediction_own()

    def mixture_weights(self) -> tuple[float, float]:
        """The weights of the experts `(global, own)`: the working posterior (the fleet's global with this
        client's samples not in it yet) and the posterior of this client's own samples alone, both under the
        current `(θ, σ, Z)` — fixed share (:mod:`streamfed.algorithms.fixed_share`) on this client's
        prequential Gaussian densities of each. `(1, 0)` when the client is not personalised."""
        if not getattr(self, "personal", False):
            return 1.0, 0.0
        lw = self.mix.log_weights
        wg = 1.0 / (1.0 + math.exp(min(float(lw[1] - lw[0]), 700.0)))
        return wg, 1.0 - wg

    def _mixture(self, g: tuple[float, float], o: tuple[float, float]) -> tuple[float, float]:
        """The mixture's mean and exact variance (within-expert variance plus the spread of the means)."""
        wg = getattr(self, "_w_global", None)
        if wg is None:
            wg = self._w_global = self.mixture_weights()[0]
        wo = 1.0 - wg
        mean = wg * g[0] + wo * o[0]
        var = wg * (g[1] + (g[0] - mean) ** 2) + wo * (o[1] + (o[0] - mean) ** 2)
        if not (math.isfinite(mean) and math.isfinite(var) and var > 0.0):
            return g
        return mean, var

    def predict_many(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances; where rounding overflowed, the prior's `(0, a² + σ²)` instead
        (no non-finite value leaves the learner)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.hyper.d or not np.all(np.isfinite(X)):
            raise ValueError(f"expected finite inputs of shape (T, {self.hyper.d}), got {X.shape}")
        self._fold()
        with np.errstate(over="ignore", invalid="ignore"):
            mg, vg = self._guarded(*self.post.predict_many(X))
            if not getattr(self, "personal", False):
                return mg, vg
            mo, vo = self._guarded(*self.own_post.predict_many(X))
            wg, wo = self.mixture_weights()
            mean = wg * mg + wo * mo
            return mean, wg * (vg + (mg - mean) ** 2) + wo * (vo + (mo - mean) ** 2)

    def _guarded(self, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bad = ~(np.isfinite(mean) & np.isfinite(var))
        if np.any(bad):
            prior = self.hyper.amplitude ** 2 + self.hyper.noise_var
            mean, var = np.where(bad, 0.0, mean), np.where(bad, prior, var)
        return mean, var

    # ------------------------------------------------------------------ learning
    def learn(self, x: np.ndarray, y: float, prediction: tuple[float, float] | None = None) -> tuple[float, float]:
        """Learn one sample; returns the prediction made before it (`prediction` if the caller made it).
        A `ValueError` leaves everything unchanged."""
        x = _finite_input(x, self.hyper.d)
        y = finite_target(y)
        if self.discount is not None and not math.isfinite(self._clock):
            raise ValueError("a client that forgets learns on a clock: advance(time) first")
        ay = abs(y)
        # every running sum must stay finite (Python floats: overflow gives inf, never an exception)
        q_add = self._staged_y2 + y * y
        if not (math.isfinite(self.post.stats.q + q_add) and math.isfinite(self._pending.q + q_add)
                and math.isfinite(self._own0.stats.q + q_add)
                and math.isfinite(self._r_max + self._a2_max * (self._staged_ay + ay))):
            raise NonFiniteError("a running sum would overflow")
        row = self._staged
        if self.hyper is not self._hyper0:  # the comparator's features under the initial (θ, σ, Z)
            k0 = self._stage0[row]
            if not kern.covariance_column(self._Z0, self._inv_ls0, self._a2_0, self._kind0, x, k0[:-1]):
                raise NonFiniteError("input contains a non-finite value")
            k0[-1] = y
        if prediction is not None and not math.isfinite(self.loss + (prediction[0] - y) ** 2):
            raise NonFiniteError("the running loss would overflow")
        personal = getattr(self, "personal", False)
        self._hyp[2] = self.loss
        if personal:
            glob, own, pred = self._experts_before(x, y, prediction)  # checks everything; changes nothing
            self._step(x, y, row, False)  # fails (changing nothing) only on y², k·y
            self._step_own(x, y, row, False)  # the same k, y: cannot fail where that did not
            self.mix.update_floats((_log_density(y, *glob), _log_density(y, *own)))
            lw = self.mix.log_weights
            self._w_global = 1.0 / (1.0 + math.exp(min(float(lw[1] - lw[0]), 700.0)))
            self.expert_loss[0] += (glob[0] - y) ** 2
            self.expert_loss[1] += (own[0] - y) ** 2
        else:
            self._step(x, y, row, prediction is None)  # raises before changing anything
            pred = self._prediction() if prediction is None else prediction
        self._staged += 1
        self._staged_y2 += y * y
        self._staged_ay += ay
        if self._staged == STAGE_ROWS:
            self._fold()
        self.n += 1
        self.loss += (pred[0] - y) ** 2
        self._keep(x, y)
        if self.learn_hyperparameters and self._fit_due():
            self.fit()
        return pred

    def _step(self, x: np.ndarray, y: float, row: int, predict: bool) -> None:
        status = kern.step(self._Z, self._inv_ls, self._hyp, self._kind, x, y, self._uc, self._ra, self._stage,
                           row, int(predict), self._work, self._out)
        if status == 1:
            raise NonFiniteError("input contains a non-finite value")
        if status == 2:
            raise NonFiniteError("the target's square, the target times a feature or the running loss is not finite")

    def _experts_before(self, x: np.ndarray, y: float, prediction: tuple[float, float] | None
                        ) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
        """Both experts' predictions of `x` before `(x, y)` is learned (those :meth:`predict` just made, when
        the caller passes its prediction back), and the published one; `NonFiniteError` if any running loss
        would overflow. Changes nothing."""
        cached = self._cached(x) if prediction is not None else None
        if cached is not None:
            glob, own = cached
        else:
            self._step_own(x, y, -1, True)
            self._step(x, y, -1, True)
            glob, own = self._prediction(), self._prediction_own()
        pred = self._mixture(glob, own) if prediction is None else prediction
        if not (math.isfinite(self.loss + (pred[0] - y) ** 2)
                and math.isfinite(self.expert_loss[0] + (glob[0] - y) ** 2)
                and math.isfinite(self.expert_loss[1] + (own[0] - y) ** 2)):
            raise NonFiniteError("the running loss would overflow")
        return glob, own, pred

    def _cached(self, x: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """The experts' predictions :meth:`predict` made of this `x` in the current state, if it did."""
        c = getattr(self, "_cache", None)
        if c is not None and c[0] == self.n and c[1] == self.global_version and c[2] == x.tobytes():
            return c[3], c[4]
        return None

    def _step_own(self, x: np.ndarray, y: float, row: int, predict: bool) -> None:
        """The own-samples expert's step (its own factor; the staged row is the working posterior's)."""
        status = kern.step(self._Z, self._inv_ls, self._hyp_own, self._kind, x, y, self._uc, self._ra_own,
                           self._stage, row, int(predict), self._work, self._out_own)
        if status != 0:
            raise NonFiniteError("input, target or the own expert's prediction is not finite")

    def _prediction_own(self) -> tuple[float, float]:
        m, v = float(self._out_own[0]), float(self._out_own[1])
        if math.isfinite(m) and math.isfinite(v):
            return m, v
        return 0.0, self.hyper.amplitude ** 2 + self.hyper.noise_var

    def _prediction(self) -> tuple[float, float]:
        m, v = float(self._out[0]), float(self._out[1])
        if math.isfinite(m) and math.isfinite(v):
            return m, v
        return 0.0, self.hyper.amplitude ** 2 + self.hyper.noise_var  # the prior: nothing non-finite leaves

    def _fold(self) -> None:
        """The staged rows into the working, pending (and comparator's) sums; one matrix product."""
        n = self._staged
        if n == 0:
            return
        m = self.hyper.m
        rows = self._stage[:n]
        add = Stats.from_samples(rows[:, :m], rows[:, m], self.epoch)
        self.post.absorb(add)
        self._pending.absorb(add)
        self._n_raw = getattr(self, "_n_raw", 0) + n
        if getattr(self, "personal", False):
            self.own_post.absorb(add)
        if self.hyper is self._hyper0:
            self._own0.stats.absorb(add)
        else:
            rows0 = self._stage0[:n]
            self._own0.stats.absorb(Stats.from_samples(rows0[:, :m], rows0[:, m], self._own0.stats.epoch))
        self._staged, self._staged_y2, self._staged_ay = 0, 0.0, 0.0
        self._r_max = max(float(np.max(np.abs(self.post.stats.r))), float(np.max(np.abs(self._pending.r))))

    def _sync(self) -> None:
        """The per-sample path's arrays from `hyper` and the working posterior (after either changed):
        `U_C = L_Cᵀ`, and `Rₐ = [[L_Bᵀ, u], [0, ρ]]` with `u = σ⁻² L_B⁻¹ r`, `ρ² = σ⁻² q - uᵀu`."""
        h, post = self.hyper, self.post
        self._Z = np.ascontiguousarray(h.Z)
        self._inv_ls = np.exp(-h.log_ls)
        self._kind = KIND_CODES[h.kind]
        self._hyp = np.array([h.amplitude ** 2, h.noise_var, 0.0])
        self._hyp_own = np.array([h.amplitude ** 2, h.noise_var, 0.0])
        self._a2_max = max(h.amplitude ** 2, self._hyper0.amplitude ** 2)
        self._uc = np.ascontiguousarray(post.L_C.T)
        self._ra = _augmented_factor(post, "the working posterior's")
        if getattr(self, "personal", False):
            self._ra_own = _augmented_factor(self.own_post, "the own posterior's")

    def _keep(self, x: np.ndarray, y: float) -> None:
        """A uniform sample of the stream (Li's algorithm L: once the reservoir is full, the gap to the next
        sample kept is drawn when the last one is kept, so a sample not kept costs no random draw)."""
        self._seen += 1
        cap = self._res_y.size
        if self._res_n < cap:
            i = self._res_n
            self._res_n += 1
            if self._res_n == cap:
                self._w_keep = math.exp(math.log(self._uniform()) / cap)
                self._next_keep = self._seen + self._gap()
        elif self._seen == self._next_keep:
            i = int(self._rng.integers(cap))
            self._w_keep *= math.exp(math.log(self._uniform()) / cap)
            self._next_keep = self._seen + self._gap()
        else:
            return
        self._res_x[i], self._res_y[i] = x, y

    def _uniform(self) -> float:
        return float(self._rng.random()) or 1e-300  # (0, 1): log of it is finite

    def _gap(self) -> int:
        w = min(self._w_keep, 1.0 - 1e-16)
        return int(math.log(self._uniform()) / math.log1p(-w)) + 1

    def _fit_due(self) -> bool:
        """Whether the local fit runs now (after sample `n`), moving the schedule on when it does."""
        nxt = getattr(self, "_next_fit", None)
        if nxt is None:  # state from before the growing schedule: every fit_every samples
            return self.n % self.fit_every == 0
        if self.n < nxt:
            return False
        self._fit_interval = min(2 * self._fit_interval, self.fit_every_max)
        self._next_fit = nxt + self._fit_interval
        return True

    def fit(self) -> bool:
        """FedAvg's local update: Adam on Titsias' bound over the reservoir, from the current version's
        hyperparameters. The result waits for the next upload (the client keeps predicting with the
        global's until a new version arrives)."""
        if self._res_n < 2:
            return False
        X, y = self.reservoir
        new = fit_hyper(self.hyper, X, y, steps=self.fit_steps, learning_rate=self.learning_rate, jitter=self.jitter,
                        z_box=getattr(self, "z_box", None))
        if new is None:
            return False
        self.proposal = (new, float(self._res_n))
        self.n_fits += 1
        return True

    def make_upload(self) -> Upload | None:
        """The pending statistics (and the latest proposal) as the next upload, once there are at least
        `min_upload` pending samples; `None` before (the privacy floor)."""
        if self.n_pending < self.min_upload:
            return None
        self._fold()
        prop, weight = self.proposal if self.proposal is not None else (None, 0.0)
        if self.discount is None:
            up = Upload(self.client_id, self.next_seq, self.global_version, self._pending.copy(), prop, weight)
        else:  # discounted to the clock: its time, and the raw count (what the privacy floor and rate limits count)
            up = Upload(self.client_id, self.next_seq, self.global_version, self._pending.copy(), prop, weight,
                        self._clock, self.n_pending)
        self.unacked[self.next_seq] = self._pending
        if self.discount is not None:
            self.unacked_time[self.next_seq] = self._clock
        self._pending = Stats.zeros(self.hyper.m, self.epoch)
        self._n_raw = 0
        self._r_max = float(np.max(np.abs(self.post.stats.r)))
        self.proposal = None
        self.next_seq += 1
        return up

    # ------------------------------------------------------------------ globals
    def apply_global(self, g: GlobalModel) -> bool:
        """Install a global; `False` (nothing changed) for one not newer than the installed one. A newer
        `(θ, σ, Z)` version first carries pending, unacked and own statistics over (Bui et al.)."""
        if g.hyper.m != self.hyper.m or g.hyper.d != self.hyper.d or g.hyper.kind != self.hyper.kind:
            raise ValueError(f"global has M={g.hyper.m}, d={g.hyper.d}, {g.hyper.kind}; this client "
                             f"M={self.hyper.m}, d={self.hyper.d}, {self.hyper.kind}")
        if not g.stats.is_finite() or g.stats.epoch != g.epoch:
            raise ValueError("global statistics are non-finite or of another version")
        if self.global_model is not None and g.version <= self.global_model.version:
            return False
        if g.epoch < self.epoch:
            return False  # an older (θ, Z): never go back
        if g.epoch == self.epoch and not g.hyper.same_as(self.hyper):
            raise ValueError(f"global version {g.version} changes (θ, σ, Z) without a new epoch")
        d = self.discount
        if d is not None and not math.isfinite(g.time):
            raise ValueError(f"global time {g.time!r} is not finite")
        self._fold()  # staged rows are of the current version: into the sums before anything moves
        pending, unacked = self._pending, dict(self.unacked)
        glob, own_stats, clock = g.stats, None, self._clock
        if d is not None:
            # everything to the later of the clock and the global's time (a scalar each; the projection below is
            # linear, so discounting before carrying is carrying before discounting)
            clock = g.time if not math.isfinite(self._clock) else max(self._clock, g.time)
            glob = d.shift(g.stats, g.time, clock)
            fac = d.factor(self._clock, clock) if math.isfinite(self._clock) else 1.0
            times = self.unacked_time
            unacked = {s: d.shift(st, times.get(s, self._clock), clock) for s, st in unacked.items()}
            if fac != 1.0:
                pending = pending.scaled(fac)
                own_stats = self.own_post.stats.scaled(fac)
        if g.epoch != self.epoch:
            carry = ProjectionMap(self.hyper, g.hyper, g.epoch, self.jitter)
            # pending samples leave in the next upload, which must obey the aggregator's declared bounds for
            # fresh samples of the new version: the projection can amplify them (its W is bounded by the
            # jitter only), so what it carries is clamped to them (.declared; a no-op for honest samples)
            carried = carry(pending)
            pending = clamp_to_declared(carried, g.hyper, getattr(self, "label_bound", None))
            if pending is not carried:
                self.n_clamped = getattr(self, "n_clamped", 0) + 1
            unacked = {s: carry(st) for s, st in unacked.items()}
        inc = int(g.included.get(self.client_id, 0))
        unacked = {s: st for s, st in unacked.items() if s > inc}
        work = glob + pending
        for st in unacked.values():
            work = work + st
        post = SparsePosterior(g.hyper, work, self.jitter)  # raises before anything changes
        own_post = self.own_post
        if getattr(self, "personal", False) and (g.epoch != self.epoch or own_stats is not None):
            own = own_post.stats if own_stats is None else own_stats
            own_post = SparsePosterior(g.hyper, carry(own) if g.epoch != self.epoch else own, self.jitter)
        if g.epoch != self.epoch:
            self.proposal = None  # fitted from an older version: FedAvg averages from the new one
        self.hyper, self.epoch, self.post, self.own_post = g.hyper, int(g.epoch), post, own_post
        self._pending, self.unacked = pending, unacked
        if d is not None:
            self.unacked_time = dict.fromkeys(unacked, clock)
        self._clock = clock
        self._cache = None
        self._sync()
        self._r_max = max(float(np.max(np.abs(post.stats.r))), float(np.max(np.abs(pending.r))))
        self.next_seq = max(self.next_seq, inc + 1)
        self.global_model = g
        return True

    # ------------------------------------------------------------------ regret
    def regret(self) -> dict[str, float]:
        """Prequential loss, and the loss of the best fixed predictor `kᵀw` in hindsight on the client's own
        samples, `k = c(Z₀, x)` under the initial `(θ, σ, Z)` (a fixed comparator class, whatever versions
        came since) — the same ridge problem as the posterior mean, `w = (P + σ²C)⁻¹ r`, loss
        `q - 2wᵀr + wᵀPw`, from those statistics alone. With forgetting the comparator is still undiscounted:
        every own sample weighs 1, the regret is against the best *fixed* predictor."""
        self._fold()
        own = self._own0.stats
        best = 0.0
        if own.n > 0:
            A = own.P + self._hyper0.noise_var * self._own0.C
            try:
                w = cho_solve((cholesky(0.5 * (A + A.T), "P + σ²C"), True), own.r, check_finite=False)
                best = max(float(own.q - 2.0 * w @ own.r + w @ own.P @ w), 0.0)
            except ValueError:
                best = 0.0  # cannot happen (C is positive definite); never a non-finite value
        return {"n": float(self.n), "loss": float(self.loss), "best_loss": best}
