"""The GP kernel on embeddings: RBF, `k(a, b) = s · exp(−‖a − b‖² / (2ℓ²))` (pFedGP §3, "Deep kernel
learning"; the paper fixes `ℓ = 1` and the output scale `s = 8`), in numpy (float64).

>>> import numpy as np
>>> rbf(np.zeros((1, 2)), np.array([[0.0, 0.0], [1.0, 0.0]]), lengthscale=1.0, outputscale=2.0).round(4).tolist()
[[2.0, 1.2131]]
"""

from __future__ import annotations

import numpy as np

__all__ = ["rbf", "sq_dist"]


def sq_dist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """`‖a_i − b_j‖²` for the rows of `A (n, D)` and `B (m, D)`, clipped at 0 (rounding)."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    d = np.sum(A * A, axis=1)[:, None] + np.sum(B * B, axis=1)[None, :] - 2.0 * A @ B.T
    return np.maximum(d, 0.0)


def rbf(A: np.ndarray, B: np.ndarray, *, lengthscale: float, outputscale: float) -> np.ndarray:
    """The RBF kernel matrix `(n, m)` between the rows of `A` and `B`."""
    return float(outputscale) * np.exp(-0.5 * sq_dist(A, B) / float(lengthscale) ** 2)
