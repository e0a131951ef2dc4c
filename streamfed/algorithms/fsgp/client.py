"""The client half of FSGP (docs/algorithms.md, "FSGP").

A client keeps, all under the current version's `(θ, σ, Z)`:

* *pending* — statistics of samples not uploaded yet (they leave once there are `min_upload` of them);
* *unacked* — its uploads no global includes yet, by sequence number;
* a working posterior `global + unacked + pending` (:class:`~.posterior.SparsePosterior`), one rank-one
  update per sample;
* a bounded reservoir of raw samples (Vitter's algorithm R), which never leaves the device: every
  `fit_every` samples it runs a few Adam steps on Titsias' bound from the global's hyperparameters
  (FedAvg's local update) and attaches the result to its next upload as a proposal.

A global of a newer version `(θ', σ', Z')` carries everything the client holds to the new inducing inputs
by the projection of Bui et al. (:mod:`.projection`) — pending and unacked statistics — so no statistics
of two versions are ever added, and nothing learned is discarded. (The regret's comparator keeps its own
statistics under the initial version, never carried: a fixed comparator class.)
"""

from __future__ import annotations

import math
import zlib

import numpy as np
from scipy.linalg import cho_solve

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.fsgp.bound import fit_hyper
from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.fsgp.messages import GlobalModel, Upload
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats, cholesky
from streamfed.algorithms.fsgp.projection import ProjectionMap

__all__ = ["FSGPClient", "finite_target"]


def _finite_input(x: np.ndarray, d: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.shape != (d,):
        raise ValueError(f"expected an input of {d} values, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise NonFiniteError("input contains a non-finite value")
    return x


def finite_target(y: float) -> float:
    try:
        y = float(y)
    except (TypeError, ValueError) as e:
        raise ValueError(f"target {y!r} is not a number") from e
    with np.errstate(over="ignore"):
        if not (math.isfinite(y) and math.isfinite(y * y)):
            raise NonFiniteError(f"target {y!r} (or its square) is not finite")
    return y


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
    """

    def __init__(self, hyper: Hyper, *, epoch: int = 0, jitter: float = 1e-6, min_upload: int = 32,
                 client_id: str = "client", learn_hyperparameters: bool = True, reservoir: int = 256,
                 fit_every: int = 128, fit_steps: int = 10, learning_rate: float = 0.05, seed: int = 0) -> None:
        if min_upload < 1 or reservoir < 1 or fit_every < 1 or fit_steps < 1:
            raise ValueError("min_upload, reservoir, fit_every and fit_steps must be >= 1")
        self.hyper = hyper
        self.epoch = int(epoch)
        self.jitter = float(jitter)
        self.min_upload = int(min_upload)
        self.client_id = str(client_id)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.fit_every, self.fit_steps, self.learning_rate = int(fit_every), int(fit_steps), float(learning_rate)
        m = hyper.m
        self.post = SparsePosterior(hyper, Stats.zeros(m, self.epoch), self.jitter)
        self.pending = Stats.zeros(m, self.epoch)
        # every own sample under the *initial* (θ, σ, Z), never projected: the regret's fixed comparator class
        self._hyper0 = hyper
        self._own0 = SparsePosterior(hyper, Stats.zeros(m, self.epoch), self.jitter)
        self.unacked: dict[int, Stats] = {}
        self.global_model: GlobalModel | None = None
        self.next_seq = 1
        self.proposal: tuple[Hyper, float] | None = None
        self.n_fits = 0
        # the reservoir: raw samples stay on the device; its RNG is the client's own, from the fleet seed
        self._res_x = np.zeros((int(reservoir), hyper.d))
        self._res_y = np.zeros(int(reservoir))
        self._res_n = 0
        self._seen = 0
        self._rng = np.random.default_rng([int(seed), zlib.crc32(self.client_id.encode())])
        self.n, self.loss = 0, 0.0

    # ------------------------------------------------------------------ reading
    @property
    def global_version(self) -> int:
        return 0 if self.global_model is None else int(self.global_model.version)

    @property
    def n_pending(self) -> int:
        return int(self.pending.n)

    @property
    def reservoir(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples the local fit sees (copies)."""
        return self._res_x[: self._res_n].copy(), self._res_y[: self._res_n].copy()

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        m, v = self.predict_many(_finite_input(x, self.hyper.d)[None, :])
        return float(m[0]), float(v[0])

    def predict_many(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances; where rounding overflowed, the prior's `(0, a² + σ²)` instead
        (no non-finite value leaves the learner)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.hyper.d or not np.all(np.isfinite(X)):
            raise ValueError(f"expected finite inputs of shape (T, {self.hyper.d}), got {X.shape}")
        with np.errstate(over="ignore", invalid="ignore"):
            return self._guarded(*self.post.predict_many(X))

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
        k = self.post.features(x)
        if prediction is None:
            with np.errstate(over="ignore", invalid="ignore"):
                m, v = self._guarded(*self.post.predict_features(k[:, None]))
            prediction = (float(m[0]), float(v[0]))
        pred = prediction
        with np.errstate(over="ignore", invalid="ignore"):  # every running sum must stay finite
            grown = [st.q + y * y for st in (self.post.stats, self.pending, self._own0.stats)]
            grown += [float(np.max(np.abs(st.r))) + float(np.max(np.abs(k))) * abs(y)
                      for st in (self.post.stats, self.pending)]
            grown.append(self.loss + (pred[0] - y) ** 2)
        if not all(math.isfinite(g) for g in grown):
            raise NonFiniteError("a running sum would overflow")
        self.post.add_features(k, y)  # raises before changing anything
        self.pending.add(k, y)
        self._own0.stats.add(k if self.epoch == 0 else self._own0.features(x), y)
        self.n += 1
        self.loss += (pred[0] - y) ** 2
        self._keep(x, y)
        if self.learn_hyperparameters and self.n % self.fit_every == 0:
            self.fit()
        return pred

    def _keep(self, x: np.ndarray, y: float) -> None:
        self._seen += 1
        cap = self._res_y.size
        if self._res_n < cap:
            i = self._res_n
            self._res_n += 1
        else:
            i = int(self._rng.integers(self._seen))
            if i >= cap:
                return
        self._res_x[i], self._res_y[i] = x, y

    def fit(self) -> bool:
        """FedAvg's local update: Adam on Titsias' bound over the reservoir, from the current version's
        hyperparameters. The result waits for the next upload (the client keeps predicting with the
        global's until a new version arrives)."""
        if self._res_n < 2:
            return False
        X, y = self.reservoir
        new = fit_hyper(self.hyper, X, y, steps=self.fit_steps, learning_rate=self.learning_rate, jitter=self.jitter)
        if new is None:
            return False
        self.proposal = (new, float(self._res_n))
        self.n_fits += 1
        return True

    def make_upload(self) -> Upload | None:
        """The pending statistics (and the latest proposal) as the next upload, once there are at least
        `min_upload` pending samples; `None` before (the privacy floor)."""
        if self.pending.n < self.min_upload:
            return None
        prop, weight = self.proposal if self.proposal is not None else (None, 0.0)
        up = Upload(self.client_id, self.next_seq, self.global_version, self.pending.copy(), prop, weight)
        self.unacked[self.next_seq] = self.pending
        self.pending = Stats.zeros(self.hyper.m, self.epoch)
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
        pending, unacked = self.pending, dict(self.unacked)
        if g.epoch != self.epoch:
            carry = ProjectionMap(self.hyper, g.hyper, g.epoch, self.jitter)
            pending = carry(pending)
            unacked = {s: carry(st) for s, st in unacked.items()}
        inc = int(g.included.get(self.client_id, 0))
        unacked = {s: st for s, st in unacked.items() if s > inc}
        work = g.stats + pending
        for st in unacked.values():
            work = work + st
        post = SparsePosterior(g.hyper, work, self.jitter)  # raises before anything changes
        if g.epoch != self.epoch:
            self.proposal = None  # fitted from an older version: FedAvg averages from the new one
        self.hyper, self.epoch, self.post = g.hyper, int(g.epoch), post
        self.pending, self.unacked = pending, unacked
        self.next_seq = max(self.next_seq, inc + 1)
        self.global_model = g
        return True

    # ------------------------------------------------------------------ regret
    def regret(self) -> dict[str, float]:
        """Prequential loss, and the loss of the best fixed predictor `kᵀw` in hindsight on the client's own
        samples, `k = c(Z₀, x)` under the initial `(θ, σ, Z)` (a fixed comparator class, whatever versions
        came since) — the same ridge problem as the posterior mean, `w = (P + σ²C)⁻¹ r`, loss
        `q - 2wᵀr + wᵀPw`, from those statistics alone."""
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
