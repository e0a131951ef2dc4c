"""PVIRegressor: PVI as a River regressor (a client with a private server)."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import numpy as np
import pytest
from river import checks, proba

from streamfed import algorithms
from streamfed.algorithms.pvi import initial_state, refine_settings
from streamfed.algorithms.pvi.client import PVIClient
from streamfed.algorithms.pvi.estimator import PVIRegressor
from streamfed.algorithms.pvi.server import PVIServer
from streamfed.fleet.config import FleetConfig

SMALL = {"n_inducing": 5, "n_pseudo": 5, "steps": 4, "predict_draws": 2}


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.5, 1.5, (n, 2))
    return X, np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("params", list(PVIRegressor._unit_test_params()))  # noqa: SLF001
def test_river_check_estimator(params: dict) -> None:
    checks.check_estimator(PVIRegressor(**params))


def test_the_algorithm_exposes_it_as_its_estimator() -> None:
    est = algorithms.get("pvi").estimator(n_inducing=4, n_pseudo=4)
    assert isinstance(est, PVIRegressor) and est.n_inducing == 4
    with pytest.raises(ValueError):
        PVIRegressor(n_inducing=0)


def test_a_bernoulli_likelihood_is_refused_with_the_classifiers_name() -> None:
    """Before: `PVIRegressor(likelihood='bernoulli')` raised `TypeError` (an unknown keyword)."""
    with pytest.raises(ValueError, match=r"'bernoulli'.*use PVIClassifier"):
        PVIRegressor(likelihood="bernoulli")
    assert PVIRegressor(likelihood="gaussian").likelihood == "gaussian"  # its one likelihood, as a River param
    assert "likelihood" in PVIRegressor()._get_params()


def test_river_regressor_is_a_plain_client_and_server_and_returns_gaussian() -> None:
    pytest.importorskip("torch")
    X, y = make_data(40, seed=3)
    model = PVIRegressor(**SMALL, refine_every=10, standardise=False)
    for xi, yi in zip(X, y, strict=True):
        model.learn_one({"zeta": xi[1], "alpha": xi[0]}, yi)  # sorted keys: alpha, zeta
    # the same samples through a plain client and server, synchronised after each refinement
    cfg = FleetConfig(fleet="f", algorithm="pvi", n_inputs=2, params={**SMALL, "refine_every": 10})
    p = cfg.params
    client = PVIClient(initial_state(cfg), refine_settings(p), client_id="local", reservoir=p.reservoir,
                       refine_every=10, predict_draws=p.predict_draws, seed=cfg.seed, jitter=p.jitter)
    server = PVIServer(initial_state(cfg), n_pseudo=p.n_pseudo, parameterisation=p.parameterisation, max_factors=1)
    for xi, yi in zip(X, y, strict=True):
        client.learn(xi, yi)
        f = client.take_factor()
        if f is not None:
            assert server.receive(f)
            client.install(server.publish())
    assert client.n_refined == 4 and model.client is not None and model.client.n_refined == 4
    assert model.server is not None and model.server.version == server.version == 4
    dist = model.predict_one({"alpha": 0.2, "zeta": -0.3, "unknown": 5.0}, with_dist=True)
    em, ev = client.predict(np.array([0.2, -0.3]))
    assert isinstance(dist, proba.Gaussian)
    assert dist.mu == pytest.approx(em, abs=1e-12) and dist.sigma == pytest.approx(math.sqrt(ev), abs=1e-12)
    assert model.predict_one({"alpha": 0.2, "zeta": -0.3}) == pytest.approx(em, abs=1e-12)
    mean, var = model.predict_dist_many(np.array([[0.2, -0.3]]))
    assert mean[0] == pytest.approx(em, abs=1e-12) and var[0] == pytest.approx(ev, abs=1e-12)
    # it learned: better than the prior mean on its own samples
    assert np.mean((model.predict_many(X) - y) ** 2) < np.var(y)


def test_river_array_path_equals_the_dict_path() -> None:
    X, y = make_data(70, seed=4)
    a = PVIRegressor(**SMALL, refine_every=16)
    b = PVIRegressor(**SMALL, refine_every=16)
    for xi, yi in zip(X, y, strict=True):
        a.learn_one({0: xi[0], 1: xi[1]}, yi)
    b.learn_many(X, y)
    assert a.client is not None and b.client is not None and a.client.n == b.client.n == 68  # 2 warm the scales
    assert a.client.n_refined + a.n_skipped == 4
    ma, va = a.predict_dist_many(X[:5])
    mb, vb = b.predict_dist_many(X[:5])
    assert np.array_equal(ma, mb) and np.array_equal(va, vb)
    assert [a.predict_one({0: r[0], 1: r[1]}) for r in X[:5]] == pytest.approx(ma.tolist(), abs=1e-12)


def test_a_nan_target_is_refused_and_changes_nothing() -> None:
    fresh = PVIRegressor(**SMALL)
    with pytest.raises(ValueError, match="target"):
        fresh.learn_one({"a": 1.0}, float("nan"))
    assert fresh.client is None and fresh._keys is None  # noqa: SLF001 — nothing was built
    X, y = make_data(30, seed=5)
    model = PVIRegressor(**SMALL, refine_every=10)
    model.learn_many(X, y)
    before = copy.deepcopy(model)
    probe = np.array([[0.3, -0.2], [1.0, 1.0]])
    for bad in (float("nan"), math.inf, None, "1.0"):
        with pytest.raises(ValueError, match="target"):
            model.learn_one({0: 0.1, 1: 0.2}, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        model.learn_many(np.array([[0.1, 0.2], [0.3, 0.4]]), np.array([1.0, np.nan]))
    assert model.client is not None and before.client is not None
    assert model.client.n == before.client.n and model.n_skipped == before.n_skipped
    assert model._scales.y.count == before._scales.y.count  # noqa: SLF001
    for got, want in zip(model.predict_dist_many(probe), before.predict_dist_many(probe), strict=True):
        assert np.array_equal(got, want)


def test_without_torch_it_learns_and_predicts_the_refinement_skipped() -> None:
    code = """
import importlib.abc
import sys


class NoTorch(importlib.abc.MetaPathFinder):  # torch unimportable (not a None in sys.modules: scipy reads those)
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"no {name} here")
        return None


sys.meta_path.insert(0, NoTorch())
import math
import numpy as np
from streamfed.algorithms.pvi.estimator import PVIRegressor
model = PVIRegressor(n_inducing=4, n_pseudo=4, refine_every=10)
rng = np.random.default_rng(0)
for t in range(42):
    model.learn_one({"a": float(rng.normal()), "b": 50.0 + t}, float(rng.normal()))
d = model.predict_one({"a": 0.1, "b": 60.0}, with_dist=True)
assert model.client.n == 40 and model.n_skipped == 4 and model.client.n_refined == 0
assert math.isfinite(d.mu) and d.sigma > 0 and "torch" not in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
