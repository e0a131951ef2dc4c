"""pFedGP's forest of GP-Trees (`personal.GPForest`): the mixture is the plain average of its members' class
probabilities (each member's eq. 15), the members' structures are distinct, and two classes cost one tree."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.pfedgp.client import PFedGPClient
from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
from streamfed.algorithms.pfedgp.personal import GPForest, splits
from streamfed.algorithms.urk.network import URKArch


def data(k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(k, 2))
    y = np.repeat(np.arange(k), 6)
    return centres[y] + rng.normal(scale=0.5, size=(y.size, 2)), y


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.integers(0, 10**6))
def test_forest_is_the_average_of_distinct_trees(k: int, trees: int, seed: int) -> None:
    E, y = data(k, seed)
    forest = GPForest(trees, lengthscale=1.0, outputscale=4.0, chains=2, steps=3, seed=seed)
    forest.fit(E, y, np.arange(y.size))
    active = forest.active
    structures = [splits(m.tree) for m in active]  # type: ignore[arg-type]
    assert 1 <= len(active) <= trees and len(set(structures)) == len(structures)
    if k == 2:
        assert len(active) == 1  # one possible tree
    xs = np.random.default_rng(seed + 1).normal(scale=3.0, size=(5, 2))
    plain = np.mean([np.exp(m.log_proba(xs)) for m in active], axis=0)
    np.testing.assert_allclose(forest.proba(xs), plain, rtol=1e-10)
    np.testing.assert_allclose(forest.proba(xs).sum(axis=1), 1.0, rtol=1e-12)


def test_three_classes_get_more_than_one_structure() -> None:
    """Three equidistant classes: every split is as good, so 2-means' random seeding draws several."""
    corners = np.array([[0.0, 1.0], [np.sqrt(0.75), -0.5], [-np.sqrt(0.75), -0.5]]) * 3.0
    y = np.repeat(np.arange(3), 6)
    E = corners[y] + np.random.default_rng(7).normal(scale=0.1, size=(y.size, 2))
    forest = GPForest(3, lengthscale=1.0, outputscale=4.0, chains=2, steps=3, seed=0)
    forest.fit(E, y, np.arange(y.size))
    assert len(forest.active) >= 2
    before = [id(m) for m in forest.members]
    forest.fit(E, y, np.arange(y.size))  # a refresh continues the members (no new structures drawn)
    assert len(forest.active) >= 2 and [id(m) for m in forest.members] != before


def test_client_with_a_forest_learns_and_predicts() -> None:
    layout = Layout(URKArch(n_inputs=2, widths=(), n_omega=8))
    c = PFedGPClient(layout, initial_theta(layout, 0), omega_of(layout, 0), n_classes=3, learn_kernel=False,
                     chains=2, trees=3)
    E, y = data(3, 3)
    for x, t in zip(E, y, strict=True):
        c.learn(x, int(t))
    assert isinstance(c.model, GPForest) and len(c.model.active) >= 2
    p = c.predict(E[0])
    assert abs(p.sum() - 1) < 1e-12 and np.all((p > 0) & (p < 1))
