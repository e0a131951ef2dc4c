"""The POF-MKL paper's baselines (docs/algorithms.md §3.7), the client halves.

All of them learn `θ_p` by plain online gradient steps `Δ_p = η (2 (f_p - y) z_p + 2 λ θ_p)` that the
server averages over the reporting clients (`θ_p ← θ_p - (1/|C_t|) Σ_c Δ_{c,p}`, i.e. the mean of the
clients' updated parameters). They differ in what is uploaded and how kernels are combined:

| baseline | uploads per client step | prediction |
|---|---|---|
| OFSKL | one pre-selected kernel: `2D` | `f_p0` |
| OFMKL-Avg | all kernels: `N·2D` | plain mean of the `f_p` |
| vM-KOFL | all kernels and their losses: `N·2D + N` | `Σ v̄_p f_p`, fleet-wide weights `v ∝ exp(-η Σ_{c,t} ℓ_{c,p})` |
| eM-KOFL | the server-chosen kernel `I_t` and all losses: `2D + N` | `f_{I_t}` |

For vM-KOFL and eM-KOFL clients upload their per-step losses `ℓ_{c,p}`; the server keeps the
running sums `Σ_c L_{c,p}` (the same quantity as uploading the cumulative `L_{c,p}` every step).
eM-KOFL's server draws `I_{t+1}` with probability `∝ exp(-η Σ_c L_{c,k})` after each round.
Local-only and centralised runs are fleet arrangements of POF-MKL, built in `streamfed.evaluation.replay`.
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.kofl._kernels import kernel_gradients
from streamfed.algorithms.kofl.messages import KOFLGlobal, KOFLUpdate
from streamfed.algorithms.pofmkl.messages import GlobalTheta
from streamfed.core.durable import durable
from streamfed.core.features import RFFBank

__all__ = ["EMKOFLClient", "OFMKLAvgClient", "OFSKLClient", "VMKOFLClient"]


class _GradientClient:
    """Shared state of the baseline clients: global `θ`, buffers, loss accumulators for regret."""

    upload_all = True  # upload Δ for every kernel (else only for the one chosen by `_chosen`)
    upload_losses = False

    def __init__(self, bank: RFFBank, eta: float = 0.005, lam: float = 1e-4) -> None:
        if not (eta > 0 and math.isfinite(eta)) or not (lam >= 0 and math.isfinite(lam)):
            raise ValueError(f"eta must be > 0 and lam >= 0 (finite), got {eta!r}, {lam!r}")
        self.bank, self.eta, self.lam = bank, float(eta), float(lam)
        n, dim = bank.n_kernels, bank.dim
        self.theta = np.zeros((n, dim))
        self._theta_sq = np.zeros(n)
        self.global_version = 0
        self._angles = np.empty(2 * n * bank.n_features)  # angles, then cosines
        self._z = np.empty((n, dim))
        self._f = np.empty(n)
        self._loss = np.empty(n)
        self._delta = np.empty((n if self.upload_all else 1, dim))
        self.cumulative_loss = 0.0
        self.kernel_losses = np.zeros(n)
        self.n_steps = 0

    def set_global(self, params: np.ndarray | GlobalTheta | KOFLGlobal, version: int) -> None:
        g = params.theta if isinstance(params, KOFLGlobal) else params
        g = g if isinstance(g, GlobalTheta) else GlobalTheta.of(g)
        if g.theta.shape != self.theta.shape:
            raise ValueError(f"global theta has shape {g.theta.shape}, expected {self.theta.shape}")
        self.theta, self._theta_sq = g.theta, g.theta_sq
        self.global_version = int(version)
        self._on_global(params)

    def _on_global(self, params: np.ndarray | KOFLGlobal) -> None:
        pass

    def _chosen(self) -> int:
        return -1

    def _combine(self, f: np.ndarray) -> float:
        raise NotImplementedError

    def step(self, x: np.ndarray, y: float) -> tuple[float, KOFLUpdate]:
        """Predict `x`, learn from `y`; return `(ŷ, upload)`. Bad input → `ValueError`, no change."""
        x = self.bank.check_input(x)
        if not math.isfinite(y):
            raise ValueError(f"label is not finite: {y!r}")
        only = -1 if self.upload_all else self._chosen()
        ok = kernel_gradients(self.bank.frequency_matrix, x, y, self.theta, self._theta_sq, self.eta, self.lam, only,
                              self._angles, self._z, self._f, self._loss, self._delta)
        yhat = self._combine(self._f)
        if not (ok and math.isfinite(yhat)):
            raise NonFiniteError("baseline step produced a non-finite value; nothing changed")
        self.cumulative_loss += (yhat - y) ** 2
        self.kernel_losses += (self._f - y) ** 2
        self.n_steps += 1
        kernels = np.arange(self.bank.n_kernels) if only < 0 else np.array([only])
        losses = self._loss.copy() if self.upload_losses else None
        return yhat, KOFLUpdate(kernels, self._delta.copy(), losses)

    def predict(self, x: np.ndarray) -> float:
        x = self.bank.check_input(x)
        z = self.bank.transform_one(x)
        return self._combine(np.einsum("pi,pi->p", self.theta, z))

    @property
    def regret(self) -> float:
        """`Σ_t (ŷ_t - y_t)² - min_p Σ_t (f_p(x_t) - y_t)²` over this client's dictionary."""
        return float(self.cumulative_loss - self.kernel_losses.min())

    @property
    def kernel_weights(self) -> np.ndarray:
        n = self.bank.n_kernels
        return np.full(n, 1.0 / n)


@durable("kofl.OFSKLClient")
class OFSKLClient(_GradientClient):
    """OFSKL: a single pre-selected kernel (pass a one-kernel bank, e.g. `bank.kernel(p)`).

    >>> from streamfed.core.features import RFFBank
    >>> c = OFSKLClient(RFFBank(["gaussian:1.0"], 8, 2, seed=0))
    >>> c.step(np.array([0.1, 0.2]), 1.0)[1].n_numbers
    16
    """

    def __init__(self, bank: RFFBank, eta: float = 0.005, lam: float = 1e-4) -> None:
        if bank.n_kernels != 1:
            raise ValueError("OFSKL learns one kernel: pass a bank with a single kernel")
        super().__init__(bank, eta, lam)

    def _combine(self, f: np.ndarray) -> float:
        return float(f[0])


@durable("kofl.OFMKLAvgClient")
class OFMKLAvgClient(_GradientClient):
    """OFMKL-Avg: every kernel learned as in OFSKL, prediction the plain mean of the kernels'.

    >>> from streamfed.core.features import RFFBank, gaussian_dictionary
    >>> c = OFMKLAvgClient(RFFBank(gaussian_dictionary(3), 8, 2, seed=0))
    >>> c.step(np.array([0.1, 0.2]), 1.0)[1].n_numbers
    48
    """

    def _combine(self, f: np.ndarray) -> float:
        return float(f.mean())


@durable("kofl.VMKOFLClient")
class VMKOFLClient(_GradientClient):
    """vM-KOFL: all kernels updated and uploaded with their losses; fleet-wide exponential weights.

    >>> from streamfed.core.features import RFFBank, gaussian_dictionary
    >>> c = VMKOFLClient(RFFBank(gaussian_dictionary(3), 8, 2, seed=0))
    >>> c.step(np.array([0.1, 0.2]), 1.0)[1].n_numbers
    51
    """

    upload_losses = True

    def __init__(self, bank: RFFBank, eta: float = 0.005, lam: float = 1e-4) -> None:
        super().__init__(bank, eta, lam)
        self._vbar = np.full(bank.n_kernels, 1.0 / bank.n_kernels)

    def _on_global(self, params: np.ndarray | KOFLGlobal) -> None:
        if isinstance(params, KOFLGlobal):
            v = np.exp(params.logv - params.logv.max())
            self._vbar = v / v.sum()

    def _combine(self, f: np.ndarray) -> float:
        return float(self._vbar @ f)

    @property
    def kernel_weights(self) -> np.ndarray:
        return self._vbar.copy()


@durable("kofl.EMKOFLClient")
class EMKOFLClient(VMKOFLClient):
    """eM-KOFL: predicts with, updates and uploads only the server-chosen kernel `I_t` (+ N losses).

    >>> from streamfed.core.features import RFFBank, gaussian_dictionary
    >>> c = EMKOFLClient(RFFBank(gaussian_dictionary(3), 8, 2, seed=0))
    >>> c.step(np.array([0.1, 0.2]), 1.0)[1].n_numbers
    19
    """

    upload_all = False

    def __init__(self, bank: RFFBank, eta: float = 0.005, lam: float = 1e-4) -> None:
        super().__init__(bank, eta, lam)
        self.chosen = 0

    def _on_global(self, params: np.ndarray | KOFLGlobal) -> None:
        super()._on_global(params)
        if isinstance(params, KOFLGlobal):
            self.chosen = int(params.chosen)

    def _chosen(self) -> int:
        return self.chosen

    def _combine(self, f: np.ndarray) -> float:
        return float(f[self.chosen])
