"""POF-MKL: personalized online federated multi-kernel learning (docs/algorithms.md §3).

The learner is split the way it is deployed:

* :class:`POFMKLClient` — the client half: predicts with the global parameters `θ` and its personal
  kernel weights, samples one bin of at most `M` kernels, updates its weights multiplicatively (in the
  log domain) and returns a :class:`KernelUpdate` of at most `M·2D` numbers.
* :class:`POFMKLServer` — the server half: sums the updates of a round and applies
  `θ_p ← θ_p - (1/|C_t|) Σ Δ_{c,p}`, dividing by the number of reporting clients (eq. 10).
* :class:`POFMKLRegressor` — a River regressor (`learn_one`/`predict_one` on dicts) that is a fleet
  of one: a client and a server in the same object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from river import base

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
from streamfed.core.features import KernelSpec, RFFBank, gaussian_dictionary, standardised_dictionary
from streamfed.core.standardise import StreamScales

# the compiled kernels (ahead-of-time build or numba JIT: see ._compiled)
accumulate_checked = _kern.accumulate_checked
pofmkl_predict = _kern.pofmkl_predict
pofmkl_step_packed = _kern.pofmkl_step_packed
row_sq_norms = _kern.row_sq_norms

__all__ = [
    "GlobalTheta",
    "KernelUpdate",
    "NonFiniteError",
    "POFMKLClient",
    "POFMKLRegressor",
    "POFMKLServer",
    "merge_updates",
    "reset_overflowed_rows",
    "run_lockstep",
]

_F64 = np.dtype(np.float64)
_new_update = tuple.__new__  # KernelUpdate(k, d) without the NamedTuple's Python-level __new__


class KernelUpdate(NamedTuple):
    """A client's upload for one step: `Δ_p` for the kernels it selected.

    >>> u = KernelUpdate(np.array([3]), np.zeros((1, 4)))
    >>> u.n_numbers
    4
    """

    kernels: np.ndarray  # int64 (m,), distinct kernel indices
    delta: np.ndarray  # float64 (m, 2D)
    n_samples: int = 1

    @property
    def n_numbers(self) -> int:
        """Model numbers carried (the `M·2D` of the paper; indices are not counted)."""
        return int(self.delta.size)


class GlobalTheta(NamedTuple):
    """A validated global `θ` with its row norms `‖θ_p‖²`, computed once per round for all clients.
    Build it with :meth:`of`, which checks finiteness.

    >>> g = GlobalTheta.of(np.ones((2, 3)))
    >>> g.theta_sq.tolist()
    [3.0, 3.0]
    """

    theta: np.ndarray
    theta_sq: np.ndarray

    @classmethod
    def of(cls, theta: np.ndarray) -> GlobalTheta:
        theta = np.array(theta, dtype=np.float64, order="C")  # a private copy, then frozen
        if theta.ndim != 2:
            raise ValueError(f"global theta must be 2-D (N, 2D), got shape {theta.shape}")
        sq = np.empty(theta.shape[0])
        if not row_sq_norms(theta, sq):
            raise NonFiniteError("global theta contains a non-finite value")
        theta.setflags(write=False)  # shared by every client: nobody may modify it
        return cls(theta, sq)


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


class POFMKLServer:
    """Server half of POF-MKL: owns `θ`, applies a round of updates (eq. 10).

    >>> server = POFMKLServer(n_kernels=3, dim=4)
    >>> server.apply_round([KernelUpdate(np.array([1]), np.ones((1, 4))),
    ...                     KernelUpdate(np.array([2]), np.ones((1, 4)))])
    1
    >>> server.theta[1].tolist()
    [-0.5, -0.5, -0.5, -0.5]
    """

    def __init__(self, n_kernels: int, dim: int) -> None:
        self.theta = np.zeros((n_kernels, dim))
        self.version = 0
        self.kernel_resets = 0  # rows of θ reset to 0 because they overflowed (see finish_round)
        self.last_resets: list[int] = []
        self._global: GlobalTheta | None = None
        self._global_version = -1
        self._sum = np.zeros((n_kernels, dim))
        self._reporting = 0

    def add(self, update: KernelUpdate) -> None:
        """Add one client's update to the round in progress (validated: shapes, indices, finiteness)."""
        k, d = update.kernels, update.delta
        dim = self.theta.shape[1]
        if d.ndim != 2 or d.shape[1] != dim or k.shape != (d.shape[0],):
            raise ValueError(f"update shapes {k.shape}, {d.shape} do not match theta {self.theta.shape}")
        status = accumulate_checked(self._sum, k.astype(np.int64, copy=False), d)
        if status == 1:
            raise ValueError(f"update names invalid or repeated kernels: {k.tolist()}")
        if status == 2:
            raise NonFiniteError("update contains a non-finite value")
        self._reporting += 1

    def finish_round(self) -> int:
        """`θ ← θ - (Σ Δ) / |C_t|`, start a new round, return the new version.

        A kernel whose row would overflow (a non-finite value, or `‖θ_p‖²` beyond float64) is reset to
        0 instead — counted in `kernel_resets`, listed in `last_resets` — so one runaway kernel can
        neither publish a non-finite global nor stall the fleet; the other kernels take the round."""
        self.last_resets = []
        if self._reporting:
            new = self.theta - self._sum / self._reporting
            self.last_resets = reset_overflowed_rows(new)
            self.kernel_resets += len(self.last_resets)
            self.theta = new
        self._sum[:] = 0.0
        self._reporting = 0
        self.version += 1
        return self.version

    def global_params(self) -> GlobalTheta:
        """What is broadcast: the current `θ` (a fresh read-only array each round) and its norms."""
        if self._global is None or self._global_version != self.version:
            self._global = GlobalTheta.of(self.theta)
            self._global_version = self.version
        return self._global

    def apply_round(self, updates: Iterable[KernelUpdate]) -> int:
        """Add every update of one round and finish it."""
        for u in updates:
            self.add(u)
        return self.finish_round()


class POFMKLRegressor(base.Regressor):
    """POF-MKL as a River regressor: a client and its server in one object (a fleet of one).

    Features are read in sorted key order, so the frequencies never depend on the order in which
    features are first seen. The schema is fixed by the first `learn_one`; a feature missing later
    reads as 0 and an unseen one is ignored (both counted in `n_missing` / `n_unknown`).

    Parameters
    ----------
    n_kernels
        Size of the Gaussian bandwidth dictionary (ignored when `kernels` is given): with `standardise`,
        :func:`~streamfed.core.features.standardised_dictionary` (bandwidths around `√(2d)`, from the
        number of inputs `d`), else bandwidths over `[0.05, 5]` (the paper's normalised inputs).
    n_features
        Random features `D` per kernel (each kernel has `2D` parameters).
    kernels
        Explicit kernel specs such as `("gaussian:0.5", "laplacian:1.0")`.
    eta, lam, xi
        Learning rate, regularisation `λ` and exploration rate `ξ`.
    bin_size
        `M`, kernels updated (and uploaded) per step.
    seed
        Fleet seed: frequencies and bin draws derive from it.
    standardise
        Standardise every input and the target online, from past samples only
        (:class:`~streamfed.core.standardise.OnlineStandardiser`), and map predictions back. On by
        default: the kernels' bandwidths and `θ = 0` assume unit scales, which a user's stream rarely
        has. The first two samples only set the scales (the prediction is then the running mean).

    The step along a sample's features, `η/q_J`, is capped at 1/2 (docs/algorithms.md §3.5), so no `η`
    can make it diverge; below `ξ/(2B)` the cap never acts.

    Examples
    --------
    >>> from river import datasets, evaluate, metrics
    >>> model = POFMKLRegressor(n_kernels=4, n_features=20, seed=1)
    >>> evaluate.progressive_val_score(datasets.TrumpApproval(), model, metrics.MAE())
    MAE: ...
    """

    def __init__(
        self,
        n_kernels: int = 8,
        n_features: int = 50,
        kernels: tuple[str, ...] | None = None,
        eta: float = 0.005,
        lam: float = 1e-4,
        xi: float = 0.1,
        bin_size: int = 1,
        seed: int = 0,
        standardise: bool = True,
    ) -> None:
        self.n_kernels = n_kernels
        self.n_features = n_features
        self.kernels = kernels
        self.eta = eta
        self.lam = lam
        self.xi = xi
        self.bin_size = bin_size
        self.seed = seed
        self.standardise = standardise
        self._specs: list[KernelSpec] = (
            [KernelSpec.parse(k) for k in kernels] if kernels else gaussian_dictionary(n_kernels)
        )
        if not 1 <= bin_size <= len(self._specs):
            raise ValueError(f"bin_size must be in [1, {len(self._specs)}], got {bin_size}")
        self._keys: tuple = ()
        self._client: POFMKLClient | None = None
        self._server: POFMKLServer | None = None
        self._scales: StreamScales | None = None
        self.n_missing = 0
        self.n_unknown = 0

    @classmethod
    def _unit_test_params(cls) -> Iterable[dict]:
        yield {"n_kernels": 4, "n_features": 10}
        yield {"kernels": ("gaussian:0.5", "laplacian:2.0", "matern32:1.0"), "bin_size": 2, "xi": 1.0,
               "standardise": False}

    @property
    def _is_stochastic(self) -> bool:
        return True

    @property
    def client(self) -> POFMKLClient | None:
        return self._client

    def _vector(self, x: dict) -> np.ndarray:
        v = np.zeros(len(self._keys))
        seen = 0
        for i, k in enumerate(self._keys):
            if k in x:
                v[i] = _as_float(k, x[k])
                seen += 1
        self.n_missing += len(self._keys) - seen
        self.n_unknown += len(x) - seen
        return v

    def learn_one(self, x: dict, y: base.typing.RegTarget) -> None:
        y = _as_float("target", y)
        if self._client is None:
            self._keys = tuple(sorted(x, key=str))
            vals = [_as_float(k, x[k]) for k in self._keys]  # validate before creating state
            d = max(len(self._keys), 1)
            if self.standardise and not self.kernels:  # bandwidths for unit-variance inputs, from d alone
                self._specs = standardised_dictionary(self.n_kernels, d)
            bank = RFFBank(self._specs, self.n_features, d, seed=self.seed)
            rng = np.random.default_rng([self.seed, 0x50F])
            self._client = POFMKLClient(bank, self.eta, self.lam, self.xi, self.bin_size, rng)
            self._server = POFMKLServer(bank.n_kernels, bank.dim)
            if self.standardise:  # inputs winsorised at ±INPUT_CLIP (never the target)
                self._scales = StreamScales(bank.n_inputs)
            xv = np.array(vals) if vals else np.zeros(1)
        else:
            xv = self._vector(x) if self._keys else np.zeros(1)
        if self._scales is None:
            self._learn(xv, y)
        else:  # scales from the past only, folded on copies: a refused sample changes nothing
            self._scales.learn(xv, y, self._learn)

    def _learn(self, xv: np.ndarray, y: float) -> None:
        assert self._client is not None and self._server is not None
        _, update = self._client.step(xv, y)
        self._server.add(update)
        self._server.finish_round()
        self._client.set_global(self._server.theta, self._server.version)

    def predict_one(self, x: dict) -> float:
        if self._client is None:
            return 0.0
        missing, unknown = self.n_missing, self.n_unknown
        xv = self._vector(x) if self._keys else np.zeros(1)
        self.n_missing, self.n_unknown = missing, unknown  # predicting does not count
        client = self._client
        if self._scales is None:
            yhat = client.predict(xv)
            return yhat if math.isfinite(yhat) else 0.0  # never a NaN out: the prior's prediction instead
        return self._scales.predict(xv, lambda z: (client.predict(z), None))[0]


def reset_overflowed_rows(theta: np.ndarray) -> list[int]:
    """Set to 0 every row of `theta` holding a non-finite value or whose squared norm overflows; return
    their indices.

    >>> t = np.array([[1.0, 2.0], [np.inf, 0.0], [1e200, 0.0]])
    >>> reset_overflowed_rows(t), t.tolist()
    ([1, 2], [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    """
    with np.errstate(over="ignore", invalid="ignore"):
        bad = ~np.isfinite(np.einsum("pi,pi->p", theta, theta))
    rows = np.flatnonzero(bad).tolist()
    theta[rows] = 0.0
    return rows


def merge_updates(updates: Sequence[KernelUpdate]) -> KernelUpdate:
    """One update equal to the sum of several (same kernel → deltas added), e.g. a client's uploads
    inside one aggregation window. Kernels come out sorted.

    >>> a = KernelUpdate(np.array([2]), np.ones((1, 2)))
    >>> b = KernelUpdate(np.array([0, 2]), np.full((2, 2), 2.0))
    >>> m = merge_updates([a, b])
    >>> m.kernels.tolist(), m.delta.tolist(), m.n_samples
    ([0, 2], [[2.0, 2.0], [3.0, 3.0]], 2)
    """
    kernels = np.unique(np.concatenate([u.kernels for u in updates]))
    delta = np.zeros((kernels.size, updates[0].delta.shape[1]))
    for u in updates:
        delta[np.searchsorted(kernels, u.kernels)] += u.delta
    return KernelUpdate(kernels, delta, sum(u.n_samples for u in updates))


def _as_float(name: object, v: object) -> float:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"feature {name!r} is not numeric: {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"feature {name!r} is not finite: {v!r}")
    return f


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


def run_lockstep(
    clients: Sequence[POFMKLClient], server: POFMKLServer, xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
) -> np.ndarray:
    """Reference lock-step protocol: at each `t` every client steps, the server aggregates, all
    clients receive the new `θ`. Returns the predictions, shape `(T, C)`."""
    n_steps = min(len(y) for y in ys)
    preds = np.empty((n_steps, len(clients)))
    for t in range(n_steps):
        for c, client in enumerate(clients):
            preds[t, c], upd = client.step(xs[c][t], ys[c][t])
            server.add(upd)
        version = server.finish_round()
        for client in clients:
            client.set_global(server.theta, version)
    return preds
