"""What POF-MKL's two halves exchange, before the envelope (:mod:`.wire` puts them in messages): a client's
:class:`KernelUpdate` (`Δ_p` for the kernels of its sampled bin) and the server's :class:`GlobalTheta`
(docs/algorithms.md §3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.pofmkl._compiled import kern as _kern
from streamfed.core.durable import durable

__all__ = ["GlobalTheta", "KernelUpdate", "merge_updates"]

row_sq_norms = _kern.row_sq_norms


@durable("pofmkl.KernelUpdate")
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


@durable("pofmkl.GlobalTheta")
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

