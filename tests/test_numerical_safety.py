"""10⁶ POF-MKL steps on the real Beijing streams with default hyperparameters: all state finite,
no warnings. The client is its own server (no 1/|C| damping), the harshest arrangement."""

import warnings

import numpy as np
import pytest

from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.features import RFFBank
from streamfed.evaluation.datasets import load_beijing
from streamfed.evaluation.replay import AlgorithmConfig

N_STEPS = 1_000_000


@pytest.mark.slow  # a minute on its own: the pure tier is `-m "not broker and not slow"`
def test_million_steps_stay_finite():
    fleet = load_beijing(normalisation="paper", split="station")
    xs = np.concatenate([s.X for s in fleet.streams])
    ys = np.concatenate([s.y for s in fleet.streams])
    cfg, p = AlgorithmConfig(), POFMKLParams()  # the defaults users get
    bank = RFFBank(cfg.specs(), cfg.n_features, xs.shape[1], seed=0)
    client = POFMKLClient(bank, p.eta, p.lam, p.xi, cfg.bin_size, rng=0)
    server = POFMKLServer(bank.n_kernels, bank.dim)
    n = ys.size
    sq_err = 0.0
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        for t in range(N_STEPS):
            i = t % n
            yhat, upd = client.step(xs[i], ys[i])
            sq_err += (yhat - ys[i]) ** 2
            server.add(upd)
            client.set_global(server.global_params(), server.finish_round())
    assert client.n_steps == N_STEPS
    for arr in (server.theta, client.logw, client.acc, client.kernel_weights):
        assert np.all(np.isfinite(arr))
    assert client.kernel_weights.sum() == 1.0 or abs(client.kernel_weights.sum() - 1.0) < 1e-12
    assert np.isfinite(client.regret) and np.isfinite(client.regret_regularised)
    # and it is still a useful predictor (CO scaled to [0, 1]; its variance is ~0.008)
    assert sq_err / N_STEPS < float(np.var(ys))
