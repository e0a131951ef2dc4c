"""GP-Tree's structure (pFedGP appendix A.2): class prototypes — the mean embedding of each class — split
recursively in two by k-means (k = 2, k-means++ seeding) until every leaf holds one class. Node `v` decides
"left" (`y_v = 1`) or "right" (`y_v = 0`) for the samples whose class lies below it; a class's probability is
the product of the decisions along its path (eq. 15).

>>> import numpy as np
>>> protos = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])
>>> tree = build_tree([3, 4, 7, 8], protos, np.random.default_rng(0))
>>> sorted(map(sorted, (tree.nodes[0].left, tree.nodes[0].right)))
[[3, 4], [7, 8]]
>>> probs = tree.class_probabilities(np.array([[0.9, 0.5, 0.5]]))  # p(left) at each of the 3 nodes
>>> sorted(probs[0].round(3).tolist()), float(probs.sum())
([0.05, 0.05, 0.45, 0.45], 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamfed.core.durable import durable

__all__ = ["Node", "Tree", "build_tree", "two_means"]


@durable("pfedgp.Node")
@dataclass(frozen=True)
class Node:
    """An internal node: the classes going `left` and `right` (each non-empty)."""

    left: tuple[int, ...]
    right: tuple[int, ...]

    @property
    def classes(self) -> tuple[int, ...]:
        return self.left + self.right

    def labels(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For class labels `y`: which samples reach this node (a mask) and their node labels (1 = left)."""
        y = np.asarray(y)
        mask = np.isin(y, self.classes)
        return mask, np.isin(y[mask], self.left).astype(np.float64)


@durable("pfedgp.Tree")
@dataclass
class Tree:
    """The internal nodes (root first) and, per class, its path: `(node index, goes left)` pairs."""

    classes: tuple[int, ...]
    nodes: list[Node] = field(default_factory=list)
    paths: dict[int, list[tuple[int, bool]]] = field(default_factory=dict)

    def class_probabilities(self, p_left: np.ndarray) -> np.ndarray:
        """`(T, n_nodes)` probabilities of "left" at each node → `(T, n_classes)` class probabilities (in
        `classes` order; each row sums to 1). One class: probability 1."""
        p_left = np.asarray(p_left, dtype=np.float64)
        out = np.ones((p_left.shape[0], len(self.classes)))
        for j, c in enumerate(self.classes):
            for v, left in self.paths[c]:
                out[:, j] *= p_left[:, v] if left else 1.0 - p_left[:, v]
        return out

    def class_log_probabilities(self, log_left: np.ndarray, log_right: np.ndarray) -> np.ndarray:
        """Eq. 15 in the log domain: `(T, n_nodes)` log-probabilities of "left" and of "right" at each node →
        `(T, n_classes)` sums along the paths (no product underflows to 0)."""
        log_left, log_right = np.asarray(log_left, dtype=np.float64), np.asarray(log_right, dtype=np.float64)
        out = np.zeros((log_left.shape[0], len(self.classes)))
        for j, c in enumerate(self.classes):
            for v, left in self.paths[c]:
                out[:, j] += log_left[:, v] if left else log_right[:, v]
        return out


def two_means(points: np.ndarray, rng: np.random.Generator, iters: int = 50) -> np.ndarray:
    """A 2-means partition (k-means++ seeding, then Lloyd's iterations) of `points (n ≥ 2, D)`: a boolean
    mask of one side, never empty nor full (coincident points are split by their order)."""
    P = np.asarray(points, dtype=np.float64)
    n = P.shape[0]
    first = int(rng.integers(n))
    d2 = np.sum((P - P[first]) ** 2, axis=1)
    second = int(rng.choice(n, p=d2 / d2.sum())) if d2.sum() > 0 else (first + 1) % n
    centres = P[[first, second]].copy()
    side = np.zeros(n, dtype=bool)
    for _ in range(int(iters)):
        dist = np.sum((P[:, None, :] - centres[None]) ** 2, axis=2)
        new = dist[:, 0] <= dist[:, 1]
        if new.all() or not new.any():
            break
        if np.array_equal(new, side):
            break
        side = new
        centres = np.stack([P[side].mean(axis=0), P[~side].mean(axis=0)])
    if side.all() or not side.any():
        side = np.arange(n) < n // 2
    return side


def build_tree(classes: Sequence[int], prototypes: np.ndarray, rng: np.random.Generator) -> Tree:
    """GP-Tree over `classes` (prototype `prototypes[i]` for `classes[i]`), by recursive 2-means."""
    classes = tuple(int(c) for c in classes)
    P = np.asarray(prototypes, dtype=np.float64)
    if len(classes) == 0 or P.shape[0] != len(classes) or len(set(classes)) != len(classes):
        raise ValueError("one prototype per distinct class, at least one class")
    tree = Tree(classes, [], {c: [] for c in classes})

    def split(idx: np.ndarray) -> None:
        if idx.size < 2:
            return
        side = two_means(P[idx], rng)
        left, right = idx[side], idx[~side]
        v = len(tree.nodes)
        tree.nodes.append(Node(tuple(classes[i] for i in left), tuple(classes[i] for i in right)))
        for i in left:
            tree.paths[classes[i]].append((v, True))
        for i in right:
            tree.paths[classes[i]].append((v, False))
        split(left)
        split(right)

    split(np.arange(len(classes)))
    return tree
