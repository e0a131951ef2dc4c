"""The GP kernel on pFedGP's GP inputs, in numpy (float64).

The deep kernel (pFedGP §3, "Deep kernel learning") is the RBF on the embedding `g_θ(x)`,
`k(a, b) = s · exp(−‖a − b‖² / (2ℓ²))` (the paper fixes `ℓ = 1` and the output scale `s = 8`). With a linear
part (`Layout.linear`), a GP input is the embedding followed by `z(x) = √(c / (d + 1)) · (1, x)` (`x` the
`d` standardised inputs, `c` the linear part's learned scale), and the kernel is the sum

    k(a, b) = s · exp(−‖g_a − g_b‖² / (2ℓ²)) + ⟨z_a, z_b⟩

— an RBF GP plus Bayesian logistic regression with a bias, weights `~ N(0, c / (d + 1))`: a linear boundary
needs no network to learn it. `dim` says where the embedding ends (None: every column is the embedding).

>>> import numpy as np
>>> rbf(np.zeros((1, 2)), np.array([[0.0, 0.0], [1.0, 0.0]]), lengthscale=1.0, outputscale=2.0).round(4).tolist()
[[2.0, 1.2131]]
>>> a = np.array([[0.0, 0.0, 1.0, 2.0]])  # embedding (0, 0), linear part (1, 2)
>>> gp_kernel(a, a, dim=2, lengthscale=1.0, outputscale=2.0).tolist(), gp_kernel_diag(a, dim=2, outputscale=2.0)
([[7.0]], array([7.]))
"""

from __future__ import annotations

import numpy as np

__all__ = ["gp_kernel", "gp_kernel_diag", "rbf", "sq_dist"]


def sq_dist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """`‖a_i − b_j‖²` for the rows of `A (n, D)` and `B (m, D)`, clipped at 0 (rounding)."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    d = np.sum(A * A, axis=1)[:, None] + np.sum(B * B, axis=1)[None, :] - 2.0 * A @ B.T
    return np.maximum(d, 0.0)


def rbf(A: np.ndarray, B: np.ndarray, *, lengthscale: float, outputscale: float) -> np.ndarray:
    """The RBF kernel matrix `(n, m)` between the rows of `A` and `B`."""
    return float(outputscale) * np.exp(-0.5 * sq_dist(A, B) / float(lengthscale) ** 2)


def gp_kernel(A: np.ndarray, B: np.ndarray, *, dim: int | None, lengthscale: float, outputscale: float
              ) -> np.ndarray:
    """The kernel matrix `(n, m)` on GP inputs: RBF on the first `dim` columns plus the dot product of the rest."""
    if dim is None:
        return rbf(A, B, lengthscale=lengthscale, outputscale=outputscale)
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    return rbf(A[:, :dim], B[:, :dim], lengthscale=lengthscale, outputscale=outputscale) + A[:, dim:] @ B[:, dim:].T


def gp_kernel_diag(A: np.ndarray, *, dim: int | None, outputscale: float) -> np.ndarray:
    """`k(a, a)` for the rows of `A` → `(n,)`: the prior variances."""
    A = np.asarray(A, dtype=np.float64)
    out = np.full(A.shape[0], float(outputscale))
    return out if dim is None else out + np.sum(A[:, dim:] ** 2, axis=1)
