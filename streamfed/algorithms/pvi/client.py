"""The streaming client of PVI for sparse GPs (docs/algorithms.md §7).

A client keeps a bounded reservoir of its samples (Vitter's algorithm R: a uniform sample of everything
it has seen, never uploaded) and, every `refine_every` samples, refines its factor — a few Adam steps on
its local free energy, warm-started from its previous factor, against the cavity of the latest state it
received — and queues the new factor for upload. It predicts (mean, variance) from the current `q`: the
latest global with its own newest factor in place of the one the global holds, and (with `streaming`, the
default) every sample since its last refinement absorbed into its local factor as it arrives
(:mod:`.streaming`: the exact conjugate update for a Gaussian likelihood, one Newton step for a Bernoulli
one). Those samples are kept (at most :data:`PENDING_CAP`) until the next refinement summarises them, so a
new global or refinement takes them again; nothing but refinements is uploaded. With `calibrate` (the
default; Gaussian likelihood) the predictive variance is scaled online by
:mod:`streamfed.algorithms.calibration` (a conformal scale from its own past prequential residuals); the mean never is.

The regret's comparator is the best fixed ridge predictor `kᵀw` in hindsight, `k = k(Z₀, x)` under the
initial `(Z₀, β₀)`, regularised by `σ₀² K(Z₀, Z₀)` (FSGP's comparator, the same for every PVI variant).
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Iterable

import numpy as np
from scipy.linalg import cho_solve

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.calibration import VarianceCalibration
from streamfed.algorithms.fsgp.kernels import cov
from streamfed.algorithms.fsgp.posterior import Stats, cholesky
from streamfed.algorithms.pvi.factors import Factor
from streamfed.algorithms.pvi.posterior import beta_hyper
from streamfed.algorithms.pvi.predictive import Predictor
from streamfed.algorithms.pvi.settings import RefineSettings
from streamfed.algorithms.pvi.state import GlobalQ
from streamfed.algorithms.pvi.streaming import StreamedPredictor
from streamfed.core.durable import durable

__all__ = ["PENDING_CAP", "PVIClient"]

PENDING_CAP = 4096  # samples since the last refinement kept to re-absorb (beyond: the oldest are dropped)


@durable("pvi.PVIClient")
class PVIClient:
    """One streaming client.

    >>> g = GlobalQ.initial("se", np.linspace(-1, 1, 3)[:, None], np.array([0.0, 0.0, np.log(0.2)]), "fixed")
    >>> c = PVIClient(g, RefineSettings(n_pseudo=4, steps=5), client_id="a", refine_every=8)
    >>> preds = [c.learn(np.array([x]), np.sin(x)) for x in np.linspace(-1, 1, 8)]
    >>> preds[0], round(c.predict(np.array([0.5]))[0], 1)  # the prior first; after a refinement, ~sin(0.5)
    ((0.0, 1.04), 0.5)
    >>> f = c.take_factor(); (f.seq, f.n, c.take_factor())
    (1, 8.0, None)
    """

    def __init__(self, g0: GlobalQ, settings: RefineSettings, *, client_id: str = "client", reservoir: int = 256,
                 refine_every: int = 64, predict_draws: int = 8, seed: int = 0, jitter: float = 1e-6,
                 streaming: bool = True, calibrate: bool = True) -> None:
        if reservoir < 2 or refine_every < 1 or predict_draws < 0:
            raise ValueError("reservoir >= 2, refine_every >= 1 and predict_draws >= 0 are required")
        self.settings = settings
        self.client_id = str(client_id)
        self.refine_every, self.predict_draws = int(refine_every), int(predict_draws)
        self.seed, self.jitter = int(seed), float(jitter)
        self.global_state = g0
        self.own: Factor | None = None
        self.outbox: Factor | None = None
        self.n_refined, self.n_failed = 0, 0
        self._res_x = np.zeros((int(reservoir), g0.d))
        self._res_y = np.zeros(int(reservoir))
        self._res_n, self.n = 0, 0
        self._rng = np.random.default_rng([self.seed, zlib.crc32(self.client_id.encode())])
        self.streaming = bool(streaming)
        # a Bernoulli predictive's variance is p(1 - p): nothing to calibrate
        self.calibration = VarianceCalibration() if calibrate and settings.likelihood == "gaussian" else None
        self._pending: deque[tuple[np.ndarray, float]] = deque(maxlen=PENDING_CAP)  # since the last refinement
        self._predictor = self._predictor_of(g0)
        # the regret's comparator: kernel features under the initial (Z₀, β₀), never moved
        self._h0 = beta_hyper(g0.kind, g0.beta, g0.Z)
        self._own0 = Stats.zeros(g0.m)
        self.loss = 0.0

    @property
    def d(self) -> int:
        return self.global_state.d

    @property
    def version(self) -> int:
        return int(self.global_state.version)

    def view(self) -> GlobalQ:
        """The current `q`: the latest global with this client's newest factor."""
        g = self.global_state
        held = g.factors.get(self.client_id)
        if self.own is not None and (held is None or held.seq < self.own.seq):
            return g.with_factor(self.own)
        return g

    # ------------------------------------------------------------------ predictions
    def _predictor_of(self, g: GlobalQ, pending: Iterable[tuple[np.ndarray, float]] | None = None
                      ) -> Predictor | StreamedPredictor:
        """The predictive of `g` with the `pending` samples (default: this client's) absorbed; `ValueError` when
        it cannot be built."""
        if not getattr(self, "streaming", False):
            return Predictor(g, self.settings.likelihood, self.predict_draws, self.seed, self.jitter)
        p = StreamedPredictor(g, self.settings.likelihood, self.predict_draws, self.seed, self.jitter)
        for x, y in self._pending if pending is None else pending:
            p.absorb(x, y)
        return p

    def _x(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.shape != (self.d,):
            raise ValueError(f"expected an input of {self.d} values, got shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise NonFiniteError("input contains a non-finite value")
        return x

    def predict_many(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances (the variances scaled by the calibration, if any); where rounding
        overflowed, the prior's instead (no non-finite value leaves the client)."""
        mean, var = self._model_predict_many(X)
        return mean, var * self._scale()

    def _model_predict_many(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):
            mean, var = self._predictor.predict_many(X)
        bad = ~(np.isfinite(mean) & np.isfinite(var))
        if np.any(bad):
            binary = self.settings.likelihood == "bernoulli"
            prior = 0.25 if binary else math.exp(2 * self._h0.log_amp) + self._h0.noise_var
            mean, var = np.where(bad, 0.5 if binary else 0.0, mean), np.where(bad, prior, var)
        return mean, var

    def _finite(self, mean: float, var: float) -> tuple[float, float]:
        """One prediction as :meth:`predict_many` returns it: the prior's where rounding overflowed."""
        if math.isfinite(mean) and math.isfinite(var):
            return mean, var
        if self.settings.likelihood == "bernoulli":
            return 0.5, 0.25
        return 0.0, math.exp(2 * self._h0.log_amp) + self._h0.noise_var

    def _scale(self) -> float:
        """The calibration's variance scale (1 without one)."""
        c = getattr(self, "calibration", None)
        return 1.0 if c is None else c.scale

    def _model_predict(self, x: np.ndarray) -> tuple[float, float]:
        """The model's own predictive at a checked `x` (no calibration)."""
        if isinstance(self._predictor, StreamedPredictor):
            with np.errstate(over="ignore", invalid="ignore"):
                return self._finite(*self._predictor.predict_local(self._predictor.local(x)))
        m, v = self._model_predict_many(x[None, :])
        return float(m[0]), float(v[0])

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        m, v = self._model_predict(self._x(x))
        return m, v * self._scale()

    # ------------------------------------------------------------------ learning
    def learn(self, x: np.ndarray, y: float, prediction: tuple[float, float] | None = None) -> tuple[float, float]:
        """Learn one sample (refining every `refine_every`); returns the prediction made before it. A
        `ValueError` leaves everything unchanged."""
        x = self._x(x)
        y = float(y)
        if not math.isfinite(y):
            raise NonFiniteError(f"target {y!r} is not finite")
        if self.settings.likelihood == "bernoulli" and y not in (0.0, 1.0):
            raise ValueError(f"target {y!r} is not 0 or 1")
        streamed = self._predictor if isinstance(self._predictor, StreamedPredictor) else None
        loc = None if streamed is None else streamed.local(x)
        scale = self._scale()
        if prediction is not None:
            model_var = prediction[1] / scale  # the prediction was made under the same scale (nothing learned since)
            pred = prediction
        else:
            m, model_var = (self._finite(*streamed.predict_local(loc)) if streamed is not None and loc is not None
                            else self._model_predict(x))
            pred = (m, model_var * scale)
        k = cov(self._h0, self._h0.Z, x[None, :])[:, 0]
        if not (math.isfinite(self.loss + (pred[0] - y) ** 2) and math.isfinite(self._own0.q + y * y)):
            raise NonFiniteError("a running sum would overflow")
        if streamed is not None:
            streamed.absorb(x, y, loc)  # first: a ValueError here leaves everything unchanged
            self._pending.append((x, y))
        self._own0.add(k, y)
        self.loss += (pred[0] - y) ** 2
        calibration = getattr(self, "calibration", None)
        if calibration is not None:
            calibration.update(y - pred[0], model_var)
        self._keep(x, y)
        self.n += 1
        if self.n % self.refine_every == 0:
            self.refine()
        return pred

    def _keep(self, x: np.ndarray, y: float) -> None:
        cap = self._res_y.size
        if self._res_n < cap:
            i = self._res_n
            self._res_n += 1
        else:
            i = int(self._rng.integers(self.n + 1))
            if i >= cap:
                return
        self._res_x[i], self._res_y[i] = x, y

    def refine(self) -> bool:
        """Refine the factor now on the reservoir (standing for all `n` samples); `False` (and the previous
        factor kept) when the refinement failed."""
        from streamfed.algorithms.pvi.refine import refine  # torch: on first use only

        if self._res_n < 1:
            return False
        seq = 1 if self.own is None else self.own.seq + 1
        try:
            f = refine(self.view(), self.client_id, self._res_x[: self._res_n], self._res_y[: self._res_n],
                       n_total=float(self.n), seq=seq, settings=self.settings, warm=self.own,
                       seed=int(self._rng.integers(2**31)))
            # the new factor summarises every sample so far: none is pending under it
            predictor = self._predictor_of(self.global_state.with_factor(f), pending=())
        except ValueError:
            self.n_failed += 1
            return False
        self.own, self.outbox, self._predictor = f, f, predictor
        self._pending = deque(maxlen=PENDING_CAP)
        self.n_refined += 1
        return True

    def take_factor(self) -> Factor | None:
        """The newest factor not uploaded yet (once)."""
        f, self.outbox = self.outbox, None
        return f

    # ------------------------------------------------------------------ globals
    def install(self, g: GlobalQ) -> bool:
        """Install a newer state; `False` (nothing changed) for one not newer."""
        if g.version <= self.global_state.version:
            return False
        if (g.m, g.d, g.kind, g.inducing) != (self.global_state.m, self.d, self.global_state.kind,
                                              self.global_state.inducing):
            raise ValueError("a global of another shape, kernel or inducing mode")
        old = self.global_state
        self.global_state = g
        try:
            self._predictor = self._predictor_of(self.view())
        except ValueError:
            self.global_state = old
            raise
        return True

    # ------------------------------------------------------------------ regret
    def regret(self) -> dict[str, float]:
        own = self._own0
        best = 0.0
        if own.n > 0:
            C = cov(self._h0, self._h0.Z, self._h0.Z) + self.jitter * math.exp(2 * self._h0.log_amp) * np.eye(own.m)
            A = own.P + self._h0.noise_var * C
            try:
                w = cho_solve((cholesky(0.5 * (A + A.T), "P + σ²C"), True), own.r, check_finite=False)
                best = max(float(own.q - 2.0 * w @ own.r + w @ own.P @ w), 0.0)
            except ValueError:
                best = 0.0
        return {"n": float(self.n), "loss": float(self.loss), "best_loss": best}
