"""A client's bounded budget of labelled samples: at most `capacity` per class, each class a uniform sample
of that class's stream (Vitter's algorithm R with the client's own generator). Raw inputs are kept — a new
network version re-embeds them — with one id per sample, so a Gibbs chain can follow a sample that stays.

>>> import numpy as np
>>> b = ClassBudget(n_inputs=1, capacity=2, seed=0)
>>> [b.add(np.array([float(t)]), t % 2) for t in range(4)][:2]
[True, True]
>>> X, y, ids = b.arrays()
>>> sorted(set(y.tolist())), len(y) == 4, b.seen
([0, 1], True, 4)
"""

from __future__ import annotations

import numpy as np

from streamfed.core.durable import durable

__all__ = ["ClassBudget"]


@durable("pfedgp.ClassBudget")
class ClassBudget:
    """Per-class reservoirs of raw inputs with sample ids (never uploaded)."""

    def __init__(self, n_inputs: int, capacity: int, seed: int | list[int] = 0) -> None:
        if capacity < 1 or n_inputs < 1:
            raise ValueError("capacity and n_inputs must be >= 1")
        self.n_inputs, self.capacity = int(n_inputs), int(capacity)
        self._rng = np.random.default_rng(seed)
        self._x: dict[int, np.ndarray] = {}
        self._id: dict[int, np.ndarray] = {}
        self._n: dict[int, int] = {}  # kept per class
        self._seen_c: dict[int, int] = {}
        self.seen = 0

    @property
    def classes(self) -> tuple[int, ...]:
        return tuple(sorted(self._x))

    def __len__(self) -> int:
        return sum(self._n.values())

    def add(self, x: np.ndarray, y: int) -> bool:
        """Offer sample `(x, y)` (its id: the count of samples offered before it); whether it was kept."""
        y = int(y)
        sid = self.seen
        self.seen += 1
        if y not in self._x:
            self._x[y] = np.zeros((self.capacity, self.n_inputs))
            self._id[y] = np.zeros(self.capacity, dtype=np.int64)
            self._n[y] = self._seen_c[y] = 0
        self._seen_c[y] += 1
        if self._n[y] < self.capacity:
            i = self._n[y]
            self._n[y] += 1
        else:
            i = int(self._rng.integers(self._seen_c[y]))
            if i >= self.capacity:
                return False
        self._x[y][i], self._id[y][i] = x, sid
        return True

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies `(X (N, d), y (N,), ids (N,))`, classes in increasing order."""
        if not self._x:
            return np.zeros((0, self.n_inputs)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        cs = self.classes
        X = np.concatenate([self._x[c][: self._n[c]] for c in cs])
        y = np.concatenate([np.full(self._n[c], c, dtype=np.int64) for c in cs])
        ids = np.concatenate([self._id[c][: self._n[c]] for c in cs])
        return X, y, ids
