"""The server half of POF-MKL (docs/algorithms.md §3): owns `θ` and applies a round of updates,
`θ_p ← θ_p - (1/|C_t|) Σ Δ_{c,p}`, dividing by the number of reporting clients (eq. 10); and the reference
lock-step protocol of the paper."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.pofmkl._compiled import kern as _kern
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.messages import GlobalTheta, KernelUpdate
from streamfed.core.durable import durable

__all__ = ["POFMKLServer", "project_rows", "reset_overflowed_rows", "run_lockstep"]

accumulate_checked = _kern.accumulate_checked


@durable("pofmkl.POFMKLServer")
class POFMKLServer:
    """Server half of POF-MKL: owns `θ`, applies a round of updates (eq. 10).

    >>> server = POFMKLServer(n_kernels=3, dim=4)
    >>> server.apply_round([KernelUpdate(np.array([1]), np.ones((1, 4))),
    ...                     KernelUpdate(np.array([2]), np.ones((1, 4)))])
    1
    >>> server.theta[1].tolist()
    [-0.5, -0.5, -0.5, -0.5]
    """

    radius = math.inf  # ‖θ_p‖ ≤ radius after every round (class default: what a server pickled before it had)

    def __init__(self, n_kernels: int, dim: int, radius: float = math.inf) -> None:
        if not radius > 0:
            raise ValueError(f"radius must be > 0, got {radius!r}")
        self.radius = float(radius)
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
            self.descend(self._sum / self._reporting)
        self._sum[:] = 0.0
        self._reporting = 0
        self.version += 1
        return self.version

    def descend(self, step: np.ndarray) -> None:
        """`θ ← θ − step`, each row kept finite (reset to 0 if it overflows, counted) and within the radius
        (projected): what every way of folding a round into θ ends with (rounds here, the robust rule and the
        reducer's partial sums in the aggregation). The version is the caller's to move."""
        with np.errstate(over="ignore", invalid="ignore"):
            new = self.theta - step
        self.last_resets = reset_overflowed_rows(new)
        self.kernel_resets += len(self.last_resets)
        project_rows(new, self.radius)
        self.theta = new

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



def project_rows(theta: np.ndarray, radius: float) -> None:
    """Scale every row of `theta` whose norm exceeds `radius` back onto the ball `‖θ_p‖ ≤ radius`, in place
    (projected online gradient descent, docs/algorithms.md §3.9: the regularised comparator lies inside, so an
    honest run never meets the ball, and no update can take a row outside it).

    >>> t = np.array([[6.0, 8.0], [0.3, 0.4]])
    >>> project_rows(t, 5.0); t.tolist()
    [[3.0, 4.0], [0.3, 0.4]]
    """
    if math.isinf(radius):
        return
    norms = np.sqrt(np.einsum("pi,pi->p", theta, theta))
    over = np.flatnonzero(norms > radius)
    if over.size:
        theta[over] *= (radius / norms[over])[:, None]


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
