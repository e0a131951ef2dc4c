"""A client's personal GP-Tree classifier on embeddings (pFedGP §4.1 full model, §4.3 FITC): the tree over
the classes it has seen, one Pólya–Gamma Gibbs posterior per node, and class probabilities as products along
the paths (eq. 15) of each node's predictive (eq. 18, averaged over the Gibbs samples).

Samples carry ids, so a refresh continues each node's chains where it left them: a kept sample keeps its `ω`,
a new one starts from a `PG(1, 0)` draw. A class never seen before rebuilds the tree (and restarts chains).

Probabilities are computed in the log domain (eq. 15 as a sum of each node's `log p(left)` or `log p(right)`,
both sides of eq. 18 evaluated on their own) and each node's decision is kept within `[NODE_FLOOR,
1 − NODE_FLOOR]`, so no class probability is exactly 0 or 1 (a Gibbs average can round to 1 in float64).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> E = np.concatenate([rng.normal(-1, 0.3, (10, 2)), rng.normal(1, 0.3, (10, 2)), rng.normal([1, -1], 0.3, (10, 2))])
>>> y = np.repeat([0, 4, 7], 10)
>>> model = GPTree(lengthscale=1.0, outputscale=4.0, chains=4, steps=10, seed=0)
>>> work = model.fit(E, y, ids=np.arange(30))
>>> p = model.proba(np.array([[1.0, 1.0]]))
>>> model.classes, int(model.classes[int(np.argmax(p[0]))]), bool(abs(p.sum() - 1) < 1e-12)
((0, 4, 7), 4, True)
"""

from __future__ import annotations

import numpy as np

from streamfed.algorithms.pfedgp.cost import refresh_work
from streamfed.algorithms.pfedgp.fitc import FITCPosterior, fitc_gibbs
from streamfed.algorithms.pfedgp.gibbs import FullPosterior, gibbs
from streamfed.algorithms.pfedgp.kernels import gp_kernel, gp_kernel_diag
from streamfed.algorithms.pfedgp.polya_gamma import sample_pg
from streamfed.algorithms.pfedgp.quadrature import chain_log_probs
from streamfed.algorithms.pfedgp.tree import Tree, build_tree
from streamfed.core.durable import durable

__all__ = ["NODE_FLOOR", "GPTree", "prototypes"]

#: A node's "left" and "right" probabilities are at least this (float64 keeps `1 − NODE_FLOOR` below 1).
NODE_FLOOR = 1e-12


def prototypes(E: np.ndarray, y: np.ndarray, classes: tuple[int, ...]) -> np.ndarray:
    """The mean embedding of each class (rows in `classes` order)."""
    return np.stack([np.mean(E[y == c], axis=0) for c in classes])


@durable("pfedgp.GPTree")
class GPTree:
    """The personal classifier. `inducing (M, D)`: FITC with those shared inducing inputs; None: the full GP.
    `chains` parallel Gibbs chains, `steps` sweeps per refresh (`burn_in` when chains start afresh). `dim`:
    where the embedding ends in an input row, the rest being the kernel's linear part (:mod:`.kernels`; None:
    no linear part).
    """

    dim: int | None = None  # a model stored before the linear part existed has none

    def __init__(self, *, lengthscale: float = 1.0, outputscale: float = 8.0, chains: int = 10, steps: int = 5,
                 burn_in: int | None = None, inducing: np.ndarray | None = None, seed: int = 0,
                 dim: int | None = None) -> None:
        if not (lengthscale > 0 and outputscale > 0 and chains >= 1 and steps >= 1):
            raise ValueError("lengthscale, outputscale > 0; chains, steps >= 1")
        if dim is not None and (inducing is not None or dim < 1):
            raise ValueError("a linear part (dim) needs the full GP and dim >= 1")
        self.dim = None if dim is None else int(dim)
        self.lengthscale, self.outputscale = float(lengthscale), float(outputscale)
        self.chains, self.steps = int(chains), int(steps)
        self.burn_in = int(burn_in) if burn_in is not None else 2 * int(steps)
        self.inducing = None if inducing is None else np.array(inducing, dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.tree: Tree | None = None
        self.E = np.zeros((0, 0))
        self.posteriors: list[FullPosterior | FITCPosterior] = []
        self._omega: list[dict[int, np.ndarray]] = []  # per node: sample id → its ω in each chain
        self._masks: list[np.ndarray] = []  # per node: which rows of E reach it

    _paths: tuple[np.ndarray, np.ndarray] | None = None  # the tree's path matrices, a cache (reset by fit)

    @property
    def classes(self) -> tuple[int, ...]:
        return () if self.tree is None else self.tree.classes

    def k(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return gp_kernel(A, B, dim=self.dim, lengthscale=self.lengthscale, outputscale=self.outputscale)

    def kdiag(self, A: np.ndarray) -> np.ndarray:
        return gp_kernel_diag(A, dim=self.dim, outputscale=self.outputscale)

    @property
    def node_sizes(self) -> list[int]:
        """Samples reaching each node (what a refresh's and a prediction's work grow with)."""
        return [int(np.sum(m)) for m in self._masks]

    def fit(self, E: np.ndarray, y: np.ndarray, ids: np.ndarray, *, rebuild: bool = False) -> float:
        """Refresh the posterior on embeddings `E (N, D)` with class labels `y` and sample ids `ids`; the tree is
        rebuilt when the classes changed or `rebuild`. Returns the refresh's work units (:mod:`.cost`)."""
        E, y, ids = np.asarray(E, dtype=np.float64), np.asarray(y).astype(np.int64), np.asarray(ids).astype(np.int64)
        if E.ndim != 2 or y.shape != (E.shape[0],) or ids.shape != y.shape or not np.all(np.isfinite(E)):
            raise ValueError("expected finite embeddings (N, D) with one label and one id per row")
        classes = tuple(int(c) for c in np.unique(y))
        if not classes:
            self.tree, self.posteriors, self._omega, self.E, self._masks = None, [], [], E, []
            return 0.0
        # built aside and installed at the end: a failure (ValueError) leaves the model as it was
        tree, omegas = self.tree, self._omega
        if rebuild or tree is None or tree.classes != classes:
            tree = build_tree(classes, prototypes(E, y, classes), self.rng)
            omegas = [{} for _ in tree.nodes]
        posteriors: list[FullPosterior | FITCPosterior] = []
        new_omegas: list[dict[int, np.ndarray]] = []
        work = 0.0
        for v, node in enumerate(tree.nodes):
            mask, yv = node.labels(y)
            Ev, iv = E[mask], ids[mask]
            known = [omegas[v].get(int(i)) for i in iv]
            fresh = all(w is None for w in known)
            omega0 = np.empty((self.chains, iv.size))
            for j, w in enumerate(known):
                omega0[:, j] = w if w is not None else 0.0
            unknown = np.array([w is None for w in known])
            if unknown.any():
                omega0[:, unknown] = sample_pg(np.zeros((self.chains, int(unknown.sum()))), self.rng)
            steps = self.burn_in if fresh else self.steps
            work += refresh_work([iv.size if self.inducing is None else self._fitc_size(iv.size)],
                                 chains=self.chains, sweeps=steps)
            if self.inducing is None:
                post: FullPosterior | FITCPosterior = gibbs(self.k(Ev, Ev), yv, chains=self.chains, steps=steps,
                                                            rng=self.rng, omega0=omega0)
            else:
                Z = self.inducing
                post = fitc_gibbs(self.k(Z, Z), self.k(Ev, Z), np.full(iv.size, self.outputscale), yv,
                                  chains=self.chains, steps=steps, rng=self.rng, omega0=omega0)
            if not all(np.all(np.isfinite(a)) for a in vars(post).values()):
                raise ValueError(f"node {v}: the Gibbs posterior is not finite")
            new_omegas.append({int(i): post.omega[:, j].copy() for j, i in enumerate(iv)})
            posteriors.append(post)
        self.tree, self._omega, self.posteriors, self.E = tree, new_omegas, posteriors, E
        self._paths = None
        self._masks = [node.labels(y)[0] for node in tree.nodes]
        return work

    def _fitc_size(self, n: int) -> int:
        """FITC's `O(M²N)` sweep as an equivalent full node's `n³`."""
        assert self.inducing is not None
        m = self.inducing.shape[0]
        return int(round((float(m) ** 2 * n + float(m) ** 3) ** (1.0 / 3.0)))

    def node_probabilities(self, Es: np.ndarray) -> np.ndarray:
        """`p(left)` at every node for the rows of `Es` → `(T, n_nodes)`."""
        assert self.tree is not None
        Es = np.asarray(Es, dtype=np.float64)
        out = np.empty((Es.shape[0], len(self.tree.nodes)))
        kss = self.kdiag(Es)
        for v, post in enumerate(self.posteriors):
            base = self.E[self._masks[v]] if self.inducing is None else self.inducing
            out[:, v] = post.prob(self.k(base, Es), kss)
        return out

    def log_proba(self, Es: np.ndarray) -> np.ndarray:
        """Class log-probabilities `(T, len(classes))` of the rows of `Es`, each node within `NODE_FLOOR` of 0
        and 1, normalised in the log domain (empty columns before any sample; one class: log 1 = 0)."""
        if self.tree is None:
            return np.zeros((np.shape(Es)[0], 0))
        Es = np.asarray(Es, dtype=np.float64)
        if not self.posteriors:  # one class: no node, log 1
            return np.zeros((Es.shape[0], len(self.classes)))
        kss = self.kdiag(Es)
        kall = self.k(self.E if self.inducing is None else self.inducing, Es)  # one kernel for every node
        mus, vs = [], []
        for v, post in enumerate(self.posteriors):
            mu, var = post.moments(kall[self._masks[v]] if self.inducing is None else kall, kss)
            mus.append(mu)
            vs.append(var)
        # every node's chains in one quadrature call: (nodes · C, T) → (T, nodes) each side
        left, right = chain_log_probs(np.concatenate(mus), np.concatenate(vs), groups=len(mus))
        left, right = np.atleast_2d(left).reshape(len(mus), -1).T, np.atleast_2d(right).reshape(len(mus), -1).T
        floor = np.log(NODE_FLOOR)
        # each node's pair renormalised (the quadrature's two sides sum to 1 only up to rounding), then floored
        norm = np.logaddexp(left, right)
        left, right = np.maximum(left - norm, floor), np.maximum(right - norm, floor)
        on_left, on_right = self._path_matrices()
        lp = left @ on_left + right @ on_right  # eq. 15's sums along the paths (Tree.class_log_probabilities)
        m = np.max(lp, axis=1, keepdims=True)
        return lp - (m + np.log(np.sum(np.exp(lp - m), axis=1, keepdims=True)))

    def _path_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """0/1 matrices `(nodes, classes)`: node `v` on class `j`'s path going left / going right."""
        assert self.tree is not None
        if self._paths is None:
            n, k = len(self.tree.nodes), len(self.tree.classes)
            on_left, on_right = np.zeros((n, k)), np.zeros((n, k))
            for j, c in enumerate(self.tree.classes):
                for v, left in self.tree.paths[c]:
                    (on_left if left else on_right)[v, j] = 1.0
            self._paths = (on_left, on_right)
        return self._paths

    def proba(self, Es: np.ndarray) -> np.ndarray:
        """Class probabilities `(T, len(classes))` of the rows of `Es` (empty columns before any sample)."""
        return np.exp(self.log_proba(Es))
