"""The client half of POF-MKL (docs/algorithms.md §3): predicts with the global parameters `θ` and its personal
kernel weights, samples one bin of at most `M` kernels, updates its weights multiplicatively (in the log domain)
and returns a :class:`~streamfed.algorithms.pofmkl.messages.KernelUpdate` of at most `M·2D` numbers."""

from __future__ import annotations

import math

import numpy as np

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.pofmkl._compiled import kern as _kern
from streamfed.algorithms.pofmkl._layout import (
    N_DRAWS,
    STEP_BAD_INPUT,
    STEP_BAD_LABEL,
    STEP_BAD_SHAPE,
    STEP_NEED_DRAWS,
    STEP_OK,
    packed_layout,
)
from streamfed.algorithms.pofmkl.messages import GlobalTheta, KernelUpdate
from streamfed.core.durable import durable
from streamfed.core.features import RFFBank, gaussian_dictionary  # noqa: F401  (the doctest builds a bank)

__all__ = ["NonFiniteError", "POFMKLClient"]

# the compiled kernels (ahead-of-time build or numba JIT: see ._compiled)
pofmkl_predict = _kern.pofmkl_predict
pofmkl_step_packed = _kern.pofmkl_step_packed

_F64 = np.dtype(np.float64)
_new_update = tuple.__new__  # KernelUpdate(k, d) without the NamedTuple's Python-level __new__


@durable("pofmkl.POFMKLClient")
class POFMKLClient:
    """Client half of POF-MKL: personal log-weights plus a read-only view of the global `θ`.

    Default `η = 0.005` (the paper's `η ∝ 1/√T` for `T ≈ 35,000`). Stability: the selected kernel's
    step is `2η/q_J` with `‖z‖ = 1`, so `η < q_min = ξ/B` keeps it contractive even when a client is
    its own server; federated averaging divides it by `|C_t|` on top.

    `rng` is the injected random source of the bin draws (one uniform per step, drawn in blocks from
    `rng.random`), so a test can replay identical draws in an independent implementation.

    >>> bank = RFFBank(gaussian_dictionary(4), n_features=10, n_inputs=2, seed=0)
    >>> client = POFMKLClient(bank, bin_size=1, rng=0)
    >>> yhat, update = client.step(np.array([0.1, 0.2]), 0.5)
    >>> yhat, update.kernels.shape, update.delta.shape
    (0.0, (1,), (1, 20))
    """

    def __init__(
        self,
        bank: RFFBank,
        eta: float = 0.005,
        lam: float = 1e-4,
        xi: float = 0.1,
        bin_size: int = 1,
        rng: np.random.Generator | int | None = None,
        theta: np.ndarray | None = None,
    ) -> None:
        if not (eta > 0 and math.isfinite(eta)):
            raise ValueError(f"eta must be finite and > 0, got {eta!r}")
        if not (lam >= 0 and math.isfinite(lam)):
            raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
        if not 0.0 <= xi <= 1.0:
            raise ValueError(f"xi must be in [0, 1], got {xi!r}")
        if not 1 <= bin_size <= bank.n_kernels:
            raise ValueError(f"bin_size (M) must be in [1, N={bank.n_kernels}], got {bin_size!r}")
        self.bank = bank
        self.eta, self.lam, self.xi, self.bin_size = float(eta), float(lam), float(xi), int(bin_size)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        n = bank.n_kernels
        self.global_version = 0
        # All float state in one buffer (hyperparameters, the block of uniform draws, θ, ‖θ‖², log w,
        # loss accumulators, scratch, the upload Δ) and the integers in another (N, D, M, the kernel
        # order kept between steps as the sort's warm start, the selected kernels); the attributes
        # below are views of them. A step passes numba five arguments and allocates only the upload.
        self._layout = packed_layout(n, bank.n_features, self.bin_size)
        self._state = np.zeros(self._layout["delta"][1])
        self._state[slice(*self._layout["hyper"])] = (self.eta, self.lam, self.xi, bank.angle_bound)
        self._state[self._layout["draws"][0]] = N_DRAWS  # block used up: the first step draws one
        self._ints = np.zeros(3 + n + self.bin_size, dtype=np.int64)
        self._ints[:3] = (n, bank.n_features, self.bin_size)
        self._ints[3 : 3 + n] = np.arange(n)
        self._bind_views()
        if theta is not None:
            self.set_global(theta, 0)

    def _bind_views(self) -> None:
        n, dim, m = self.bank.n_kernels, self.bank.dim, self.bin_size
        lay, st = self._layout, self._state
        self._wt = self.bank.frequency_matrix
        self.theta = st[slice(*lay["theta"])].reshape(n, dim)
        self._theta_sq = st[slice(*lay["theta_sq"])]
        self.logw = st[slice(*lay["logw"])]
        # [Σ(ŷ-y)², Σ_t Σ_p w̄_p ℓ_p, steps, kernel overflows, Σ(f_p-y)² per kernel, Σ ℓ_p per kernel]
        self.acc = st[slice(*lay["acc"])]
        self._draws = st[slice(*lay["draws"])]  # [number used, N_DRAWS uniforms]
        self._scratch = st[slice(*lay["scratch"])]
        self._delta = st[slice(*lay["delta"])].reshape(m, dim)
        self._order = self._ints[3 : 3 + n]
        self._sel = self._ints[3 + n :]

    _VIEWS = ("_wt", "theta", "_theta_sq", "logw", "acc", "_draws", "_scratch", "_delta", "_order", "_sel")

    def __getstate__(self) -> dict:
        # the views are rebuilt on load: pickling them would copy each and cut them off the buffer
        state = dict(self.__dict__)
        for k in self._VIEWS:
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        if "_uniforms" in state:  # written before the draws and the integers moved into the buffers
            state = _migrate_client_state(state)
        self.__dict__.update(state)
        self._bind_views()

    # -- global parameters -------------------------------------------------------------------
    def set_global(self, theta: np.ndarray | GlobalTheta, version: int) -> None:
        """Use a new global `θ` (shape `(N, 2D)`, finite) from now on."""
        g = theta if isinstance(theta, GlobalTheta) else GlobalTheta.of(theta)
        if g.theta.shape != self.theta.shape:
            raise ValueError(f"global theta has shape {g.theta.shape}, expected {self.theta.shape}")
        self.theta[:] = g.theta
        self._theta_sq[:] = g.theta_sq
        self.global_version = int(version)

    # -- the step ----------------------------------------------------------------------------
    def step(self, x: np.ndarray, y: float) -> tuple[float, KernelUpdate]:
        """Predict `x`, learn from `y`, and return `(ŷ, the update to upload)`.

        `x` must be a float64 vector of length `d`. On bad input or a non-finite result a
        `ValueError` (:class:`NonFiniteError`) is raised and no state changes. The update's arrays
        are the caller's own (copies, never reused by the client).
        """
        if x.__class__ is not np.ndarray or x.dtype is not _F64 or x.ndim != 1:
            x = self.bank.check_input(x)
        status, n_sel, yhat = pofmkl_step_packed(self._wt, x, y, self._state, self._ints)
        if status == STEP_NEED_DRAWS:  # once every N_DRAWS steps: refill the block, then the step runs
            self._draws[1:] = self.rng.random(N_DRAWS)  # one block; the same stream as single draws
            self._draws[0] = 0
            status, n_sel, yhat = pofmkl_step_packed(self._wt, x, y, self._state, self._ints)
        if status != STEP_OK:
            self._raise(status, x, y)
        if n_sel == self.bin_size:
            return yhat, _new_update(KernelUpdate, (self._sel.copy(), self._delta.copy(), 1))
        return yhat, _new_update(KernelUpdate, (self._sel[:n_sel].copy(), self._delta[:n_sel].copy(), 1))

    def _raise(self, status: int, x: np.ndarray, y: float) -> None:
        if status == STEP_BAD_SHAPE:
            self.bank.check_input(x)  # raises, saying why
        if status == STEP_BAD_INPUT:
            raise ValueError(f"input contains a non-finite value: {x!r}")
        if status == STEP_BAD_LABEL:
            raise ValueError(f"label is not finite: {y!r}")
        raise NonFiniteError(
            "POF-MKL step produced a non-finite value (learning rate too large for this data?); "
            "state left unchanged, nothing uploaded"
        )

    def predict(self, x: np.ndarray) -> float:
        """`ŷ = Σ_p w̄_p θ_pᵀ z_p(x)` (eq. 6) without learning."""
        x = self.bank.check_input(x)
        nd = self.bank.n_kernels * self.bank.n_features
        n = self.bank.n_kernels
        sc = self._scratch
        return float(pofmkl_predict(self._wt, x, self.theta, self.logw, sc[:nd], sc[nd : 2 * nd],
                                    sc[2 * nd : 2 * nd + n], sc[2 * nd + n : 2 * nd + 2 * n], self.bank.angle_bound))

    # -- introspection -----------------------------------------------------------------------
    @property
    def kernel_weights(self) -> np.ndarray:
        """Normalised personal weights `w̄_p`."""
        w = np.exp(self.logw - self.logw.max())
        return w / w.sum()

    @property
    def n_steps(self) -> int:
        return int(self.acc[2])

    @property
    def kernel_overflows(self) -> int:
        """Per-kernel losses that overflowed (each taken as `LOSS_CAP`, its kernel's weight then ~0)."""
        return int(self.acc[3])

    @property
    def cumulative_loss(self) -> float:
        """`Σ_t (ŷ_t - y_t)²`."""
        return float(self.acc[0])

    @property
    def kernel_losses(self) -> np.ndarray:
        """`Σ_t (f_p(x_t) - y_t)²` per kernel."""
        n = self.bank.n_kernels
        return self.acc[4 : 4 + n].copy()

    @property
    def regret(self) -> float:
        """`R_c(T) = Σ_t (ŷ_t - y_t)² - min_p Σ_t (f_p(x_t) - y_t)²` (eq. 11, squared loss)."""
        n = self.bank.n_kernels
        return float(self.acc[0] - self.acc[4 : 4 + n].min())

    @property
    def best_kernel(self) -> int:
        """The kernel with the smallest cumulative squared loss so far."""
        n = self.bank.n_kernels
        return int(np.argmin(self.acc[4 : 4 + n]))

    @property
    def regret_regularised(self) -> float:
        """Regret on the paper's regularised loss `ℓ_p = (f_p - y)² + λ‖θ_p‖²`:
        `Σ_t Σ_p w̄_{p,t} ℓ_{p,t} - min_p Σ_t ℓ_{p,t}` (the quantity Theorem 1 bounds)."""
        n = self.bank.n_kernels
        return float(self.acc[1] - self.acc[4 + n : 4 + 2 * n].min())



def _migrate_client_state(old: dict) -> dict:
    """A pickled :class:`POFMKLClient` from before the draws moved into the state buffer (its buffer
    was `θ, ‖θ‖², log w, acc, hyper, scratch, z` and the draws were `_uniforms[_upos:]`), in the
    current layout. The model, the accumulators and the remaining draws carry over exactly."""
    state = {k: v for k, v in old.items() if k not in ("_uniforms", "_upos", "_order", "_layout", "_state")}
    bank = old["bank"]
    n, dim, m = bank.n_kernels, bank.dim, int(old["bin_size"])
    buf = old["_state"]
    lay = packed_layout(n, bank.n_features, m)
    new = np.zeros(lay["delta"][1])
    o = 0
    for name, size in (("theta", n * dim), ("theta_sq", n), ("logw", n), ("acc", 4 + 2 * n), ("hyper", 3)):
        new[lay[name][0] : lay[name][0] + size] = buf[o : o + size]
        o += size
    new[lay["hyper"][0] + 3] = bank.angle_bound
    left = np.asarray(old["_uniforms"][old["_upos"] :], dtype=np.float64)
    if left.size > N_DRAWS:
        raise ValueError(f"cannot migrate a client state holding {left.size} pending draws")
    d0 = lay["draws"][0]
    new[d0] = N_DRAWS - left.size  # the remaining draws end the block, so they come next
    new[d0 + 1 + N_DRAWS - left.size : d0 + 1 + N_DRAWS] = left
    ints = np.zeros(3 + n + m, dtype=np.int64)
    ints[:3] = (n, bank.n_features, m)
    ints[3 : 3 + n] = old["_order"]
    state.update(_layout=lay, _state=new, _ints=ints)
    return state

