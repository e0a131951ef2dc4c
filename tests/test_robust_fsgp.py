"""FSGP's bounded influence (issue 15): the declared bounds on an upload (statistics and proposal), always
on, and the robust aggregation (per-client share cap, residual screening) of `[fleet.robust] aggregation =
"robust"` (docs/algorithms.md §11)."""

import math

import numpy as np
import pytest

from streamfed.algorithms.fsgp import ALGORITHM, initial_hyper
from streamfed.algorithms.fsgp.kernels import cov
from streamfed.algorithms.fsgp.messages import Upload
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats
from streamfed.algorithms.fsgp.wire import UPDATE, update_arrays
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.protocol import Message
from streamfed.fleet.robustness import Robustness

B = 10.0  # Robustness().label_bound


def cfg_of(d=3, **robust):
    return FleetConfig(fleet="t", algorithm="fsgp", n_inputs=d, standardise="none", robust=Robustness(**robust),
                       params={"n_inducing": 6, "min_upload": 8, "learn_hyperparameters": False})


def message(up: Upload, d: int, *, n_samples=None, version=0) -> Message:
    return Message("t", up.client, UPDATE, up.seq, version, "kv", int(up.stats.n if n_samples is None else n_samples),
                   0.0, update_arrays(up, d), epoch=up.epoch)


def stats_of(h, X, y, epoch=0):
    return Stats.from_samples(cov(h, np.asarray(X), h.Z), np.asarray(y, dtype=np.float64), epoch)


# ------------------------------------------------------------------ declared bounds (always on)
def test_huge_label_upload_is_refused_and_moves_no_one():
    """The attack: 64 real inputs with every label 1e6 (far beyond ±B) — its statistics are those of real
    samples, [[P, r], [rᵀ, q]] is positive semi-definite, so before the declared bounds it was accepted and
    every client's prediction moved towards 1e6."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    h = initial_hyper(cfg)
    rng = np.random.default_rng(0)
    X, y = rng.uniform(-1, 1, (64, 3)), rng.uniform(-1, 1, 64)
    honest = Upload("a", 1, 0, stats_of(h, X, y))
    agg.take("a", 1, agg.check(message(honest, 3)))
    agg.close_window({}, lambda c: 0)
    Xs = rng.uniform(-1, 1, (5, 3))
    before, _ = SparsePosterior(h, agg.server.stats).predict_many(Xs)
    bad = Upload("m", 1, 0, stats_of(h, X, np.full(64, 1e6)))
    try:
        up = agg.check(message(bad, 3))
    except ValueError as e:
        assert "label bound" in str(e)
    else:
        agg.take("m", 1, up)
        agg.close_window({}, lambda c: 0)
    after, _ = SparsePosterior(h, agg.server.stats).predict_many(Xs)
    assert np.max(np.abs(after - before)) == 0.0, f"predictions moved by {np.max(np.abs(after - before)):.3g}"
