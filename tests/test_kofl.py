"""Baselines against plain transcriptions (tests/oracles/kofl.py)."""

import numpy as np
import pytest

from streamfed.algorithms.kofl.client import EMKOFLClient, OFMKLAvgClient, OFSKLClient, VMKOFLClient
from streamfed.algorithms.kofl.messages import KOFLUpdate
from streamfed.algorithms.kofl.server import KOFLServer
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.features import RFFBank, gaussian_dictionary
from tests.oracles.kofl import run_fleet
from tests.test_pofmkl import make_streams


def run_ours(kind, bank, xs, ys, eta, lam, server_seed=7):
    cls = {"ofskl": OFSKLClient, "ofmkl-avg": OFMKLAvgClient, "vm-kofl": VMKOFLClient,
           "em-kofl": EMKOFLClient}[kind]
    clients = [cls(bank, eta, lam) for _ in xs]
    if kind in ("vm-kofl", "em-kofl"):
        server = KOFLServer(bank.n_kernels, bank.dim, eta, sample=kind == "em-kofl",
                            rng=np.random.default_rng(server_seed))
        for c in clients:
            c.set_global(server.global_params(), 0)
    else:
        server = POFMKLServer(bank.n_kernels, bank.dim)
    T = ys[0].size
    preds = np.zeros((T, len(xs)))
    sizes = set()
    for t in range(T):
        for c, cl in enumerate(clients):
            preds[t, c], upd = cl.step(xs[c][t], ys[c][t])
            sizes.add(upd.n_numbers)
            server.add(upd)
        v = server.finish_round()
        for cl in clients:
            cl.set_global(server.global_params(), v)
    return preds, server.theta, sizes, clients


@pytest.mark.parametrize("kind", ["ofskl", "ofmkl-avg", "vm-kofl", "em-kofl"])
def test_baseline_matches_transcription(kind):
    xs, ys = make_streams(3, 1500, 3, seed=4)
    bank = RFFBank(gaussian_dictionary(1 if kind == "ofskl" else 5, 0.2, 3.0), 10, 3, seed=1)
    eta, lam = 0.1, 1e-3
    draws = None
    if kind == "em-kofl":
        g = np.random.default_rng(7)
        first = int(g.integers(bank.n_kernels))
        draws = [first] + [g.random() for _ in range(1500)]
    preds, theta, sizes, _ = run_ours(kind, bank, xs, ys, eta, lam)
    preds_o, theta_o = run_fleet(kind, bank.frequencies, xs, ys, eta, lam, draws)
    np.testing.assert_allclose(preds, preds_o, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(theta, theta_o, rtol=1e-9, atol=1e-10)
    n, dim = bank.n_kernels, bank.dim
    expected = {"ofskl": dim, "ofmkl-avg": n * dim, "vm-kofl": n * dim + n, "em-kofl": dim + n}[kind]
    assert sizes == {expected}


def test_em_kofl_prefers_the_better_kernel():
    """With losses strongly favouring one kernel, the server draws it almost always."""
    s = KOFLServer(3, 4, eta=1.0, sample=True, rng=0)
    picks = []
    for _ in range(300):
        s.add(KOFLUpdate(np.array([0]), np.zeros((1, 4)), np.array([1.0, 0.0, 1.0])))
        s.finish_round()
        picks.append(s.chosen)
    assert np.mean(np.array(picks[50:]) == 1) > 0.99


def test_baseline_rejects_bad_input_without_change():
    bank = RFFBank(gaussian_dictionary(3), 6, 2, seed=0)
    c = VMKOFLClient(bank)
    c.step(np.array([0.1, 0.2]), 0.3)
    before = (c.cumulative_loss, c.kernel_losses.copy(), c.n_steps)
    with pytest.raises(ValueError):
        c.step(np.array([np.nan, 0.2]), 0.3)
    with pytest.raises(ValueError):
        c.step(np.array([0.1, 0.2]), float("inf"))
    assert (c.cumulative_loss, c.n_steps) == (before[0], before[2])
    np.testing.assert_array_equal(c.kernel_losses, before[1])
    s = KOFLServer(3, bank.dim)
    with pytest.raises(ValueError, match="losses"):
        s.add(KOFLUpdate(np.array([0]), np.zeros((1, bank.dim)), None))
