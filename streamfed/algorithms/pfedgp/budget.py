"""A client's bounded budget of labelled samples: at most `capacity` per class, each class a uniform sample
of that class's stream (Vitter's algorithm R with the client's own generator). Raw inputs are kept — a new
network version re-embeds them — with one id per sample, so a Gibbs chain can follow a sample that stays.

With a `total`, the budget as a whole is bounded too: each of the `k` classes seen keeps at most
`max(1, min(capacity, total // k))`, so a new class shrinks the others — each drops a uniform subset of its rows
(a uniform subset of a uniform sample is a uniform sample, and algorithm R continues from the class's count).
The budget then holds at most `max(total, k)` samples whatever the number of classes.

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

    total: int | None = None  # (a budget stored before the total existed restores unbounded)

    def __init__(self, n_inputs: int, capacity: int, seed: int | list[int] = 0, total: int | None = None) -> None:
        if capacity < 1 or n_inputs < 1 or (total is not None and total < 1):
            raise ValueError("capacity, n_inputs and total must be >= 1")
        self.n_inputs, self.capacity = int(n_inputs), int(capacity)
        self.total = None if total is None else int(total)
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

    def per_class(self, n_classes: int | None = None) -> int:
        """Rows a class may keep when `n_classes` (default: those seen) share the budget."""
        k = max(1, len(self._x) if n_classes is None else int(n_classes))
        return self.capacity if self.total is None else max(1, min(self.capacity, self.total // k))

    def _shrink(self, cap: int) -> None:
        for c in self._x:
            n = self._n[c]
            if n > cap:
                keep = np.sort(self._rng.choice(n, size=cap, replace=False))
                self._x[c][:cap], self._id[c][:cap] = self._x[c][keep], self._id[c][keep]
                self._n[c] = cap

    def add(self, x: np.ndarray, y: int) -> bool:
        """Offer sample `(x, y)` (its id: the count of samples offered before it); whether it was kept."""
        y = int(y)
        sid = self.seen
        self.seen += 1
        if y not in self._x:
            self._shrink(self.per_class(len(self._x) + 1))
            self._x[y] = np.zeros((self.capacity, self.n_inputs))
            self._id[y] = np.zeros(self.capacity, dtype=np.int64)
            self._n[y] = self._seen_c[y] = 0
        self._seen_c[y] += 1
        cap = self.per_class()
        if self._n[y] < cap:
            i = self._n[y]
            self._n[y] += 1
        else:
            i = int(self._rng.integers(self._seen_c[y]))
            if i >= cap:
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
