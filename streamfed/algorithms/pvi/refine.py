"""A client's local step of PVI (docs/algorithms.md §7): maximise its local free energy
(:mod:`.free_energy`) over its own factor with Adam, against the cavity of the state it last received,
and return the new factor `t_k = q / q_\\k`.

Initialisation (warm start): the client's previous factor when it has one, its pseudo-variances divided
by the growth `N_k / n_prev` of the samples it stands for; otherwise DPO pseudo-inputs at a random subset of
its reservoir's inputs with `m = y`, `s = σ² M_k / N_k` (Gaussian: the exact factor of those samples, scaled
to stand for all `N_k`) or `m = 4(y − ½)`, `s = 4 M_k / N_k` (Bernoulli: each sample's Laplace site at the
prior mean `f = 0`, scaled alike); CPO `m = 0`, `s = 1`.
`t_k(φ)` (a precision >= 0) starts at the previous one — or, for a first factor, with precision 100 (the
paper's initial precisions) and `q(φ)`'s mean at the initial design `Z` and configured `β`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.pvi.factors import DiagGauss, Factor
from streamfed.algorithms.pvi.free_energy import Cavity, FreeEnergy
from streamfed.algorithms.pvi.settings import RefineSettings
from streamfed.algorithms.pvi.state import GlobalQ

__all__ = ["RefineSettings", "refine"]

_INIT_PRECISION = 100.0  # a first factor t_k(φ)'s precision (the paper's initial precisions)


def _t(a: np.ndarray | float) -> torch.Tensor:
    return torch.as_tensor(np.array(a, dtype=np.float64))  # a copy: factors' arrays are read-only


def _initial(g: GlobalQ, warm: Factor | None, X: np.ndarray, y: np.ndarray, n_total: float, s: RefineSettings,
             rng: np.random.Generator) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    mk = g.m if s.parameterisation == "cpo" else s.n_pseudo
    if warm is not None and warm.n_pseudo == mk and (warm.V is None) == (s.parameterisation == "cpo"):
        # the factor now stands for n_total samples, not warm.n: its precision starts scaled by the growth (a
        # factor's information grows with its samples; Adam's few steps at a small rate could not close it)
        grow = math.log(max(n_total, 1.0) / max(warm.n, 1.0)) if n_total > warm.n else 0.0
        return (None if warm.V is None else warm.V.copy()), warm.m.copy(), np.clip(warm.log_s - grow, -20.0, 20.0)
    if s.parameterisation == "cpo":
        return None, np.zeros(mk), np.zeros(mk)
    idx = rng.choice(len(y), size=mk, replace=len(y) < mk)
    if s.likelihood == "gaussian":
        sigma2 = math.exp(2.0 * float(g.beta[-1]))
        return X[idx].copy(), y[idx].copy(), np.full(mk, math.log(sigma2 * mk / max(n_total, 1.0)))
    # Bernoulli: each pseudo-observation the Laplace site of its sample at the prior mean f = 0 (one Newton step:
    # target (y - ½)/¼, variance 1/¼), scaled like the Gaussian one to stand for all N_k
    return X[idx].copy(), 4.0 * (y[idx] - 0.5), np.full(mk, math.log(4.0 * mk / max(n_total, 1.0)))


def _initial_phi(g: GlobalQ, warm: Factor | None, cav: DiagGauss) -> tuple[np.ndarray, np.ndarray]:
    """The mean of `q(φ)` and the precision of `t_k(φ)` to start from: the previous factor's, or `q(φ)` at the
    initial design `Z` and configured `β` with `t_k(φ)` of precision 100."""
    cav_prec = -2.0 * cav.nat2
    if warm is not None and warm.phi is not None and warm.phi.size == g.phi_size:
        t_prec = np.maximum(-2.0 * warm.phi.nat2, 0.0)
        return (cav.nat1 + warm.phi.nat1) / (cav_prec + t_prec), t_prec
    mean = np.concatenate((g.Z.ravel()[: g.n_z], g.beta if g.learn_beta else np.zeros(0)))
    return mean, np.full(g.phi_size, _INIT_PRECISION)


def refine(g: GlobalQ, client: str, X: np.ndarray, y: np.ndarray, *, n_total: float, seq: int,
           settings: RefineSettings, warm: Factor | None = None, seed: int = 0) -> Factor:
    """Client `client`'s new factor (its `seq`-th) from its samples `X, y` standing for `n_total` samples,
    against the cavity of `g`. `NonFiniteError` (nothing produced) when the cavity is improper or the
    optimisation leaves the finite numbers. Run on one torch thread (restored after): the matrices are
    `M × M`, and on two shared cores torch's own threads made a refinement 6× slower (2.2 s against 0.35 s,
    PVIRegressor's defaults).

    >>> g = GlobalQ.initial("se", np.array([[-1.0], [0.0], [1.0]]), np.array([0.0, 0.0, np.log(0.1)]), "fixed")
    >>> X = np.linspace(-1, 1, 20)[:, None]; y = np.sin(2 * X[:, 0])
    >>> f = refine(g, "a", X, y, n_total=20, seq=1, settings=RefineSettings(n_pseudo=5, steps=20))
    >>> f.n_pseudo, f.V.shape, f.phi is None
    (5, (5, 1), True)
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _refine(g, client, X, y, n_total=n_total, seq=seq, settings=settings, warm=warm, seed=seed)
    finally:
        torch.set_num_threads(threads)


def _refine(g: GlobalQ, client: str, X: np.ndarray, y: np.ndarray, *, n_total: float, seq: int,
            settings: RefineSettings, warm: Factor | None = None, seed: int = 0) -> Factor:
    """:func:`refine`'s work."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape != (y.size, g.d) or y.size < 1:
        raise ValueError(f"expected X (N, {g.d}) and y (N,), got {X.shape} and {y.shape}")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise NonFiniteError("a sample is not finite")
    rng = np.random.default_rng(seed)
    s = settings
    cav_phi = g.q_phi(exclude=client)
    if g.phi_size and not cav_phi.proper:
        raise NonFiniteError("the cavity q_\\k(φ) is improper (a negative precision)")
    cav_n1 = cav_phi.nat1
    cav_prec = -2.0 * cav_phi.nat2
    if g.phi_size:
        q_mean0, t_prec = _initial_phi(g, warm, cav_phi)
        cav_mean, cav_var = cav_phi.mean, cav_phi.var
    else:
        q_mean0, t_prec, cav_mean, cav_var = (np.zeros(0),) * 4
    cav = Cavity([(None if f.V is None else _t(f.V), _t(f.m), _t(f.log_s)) for f in g.others(client)],
                 _t(cav_mean), _t(cav_var))
    V0, m0, log_s0 = _initial(g, warm, X, y, n_total, s, rng)
    fe = FreeEnergy(g.kind, s.likelihood, cav, _t(g.Z), _t(g.beta), n_z=g.n_z, learn_beta=g.learn_beta,
                    X=_t(X), y=_t(y), scale=float(n_total) / y.size, kl_weights=_t(g.kl_weights(s.alpha)),
                    jitter=s.jitter, n_quadrature=s.n_quadrature)
    V = None if V0 is None else _t(V0).requires_grad_(True)
    m, log_s = _t(m0).requires_grad_(True), _t(log_s0).requires_grad_(True)
    # t_k(φ)'s precision is the variable, kept >= 0: then q = q_\k · t_k is at least as
    # precise as its cavity and every cavity of every client stays a density (the product of the prior and
    # factors of non-negative precision). Without it, factors of negative precision make other clients'
    # cavities improper after a few communications (measured on the synthetic experiment).
    # (q's mean is the other variable: Adam's steps are then in the units of Z and log β)
    q_mean = _t(q_mean0).requires_grad_(True)
    # as a log-precision: Adam moves it by ~lr per step whatever its scale (a softplus stalled near 0)
    t_raw = _t(np.log(np.maximum(t_prec, 1e-8))).requires_grad_(True)
    c_prec = _t(cav_prec)

    def q_moments() -> tuple[torch.Tensor, torch.Tensor]:
        return q_mean, -0.5 * torch.log(c_prec + torch.exp(t_raw))

    Z = _t(g.Z).requires_grad_(True) if g.inducing == "fedavg" else None
    params = [p for p in (V, m, log_s, q_mean, t_raw, Z) if p is not None and p.numel()]
    opt = torch.optim.Adam(params, lr=s.learning_rate)
    n_draws = s.n_samples if g.phi_size else 1
    for _ in range(s.steps):
        opt.zero_grad()
        eps = _t(rng.standard_normal((n_draws, g.phi_size)))
        try:
            loss = -fe((V, m, log_s), *q_moments(), eps, Z)
        except torch.linalg.LinAlgError as e:
            raise NonFiniteError(f"local free energy: {e}") from None
        if not torch.isfinite(loss):
            raise NonFiniteError("the local free energy is not finite")
        loss.backward()
        opt.step()
        with torch.no_grad():
            log_s.clamp_(-20.0, 20.0)  # within Factor's e^±50, and K + B stays factorisable
            t_raw.clamp_(-18.0, 18.0)  # a factor's precision within e^±18
    with torch.no_grad():
        vals = [p.detach().numpy().copy() for p in (m, log_s, q_mean, torch.exp(t_raw))]
        Vn = None if V is None else V.detach().numpy().copy()
        Zn = None if Z is None else Z.detach().numpy().copy()
    if not all(np.all(np.isfinite(v)) for v in vals) or (Vn is not None and not np.all(np.isfinite(Vn))):
        raise NonFiniteError("the refined factor is not finite")
    phi = None
    if g.phi_size:
        # t_k = q / q_\k: η₁ = μ_q (λ_\k + λ_t) - η₁_\k, η₂ = -λ_t / 2
        phi = DiagGauss(vals[2] * (cav_prec + vals[3]) - cav_n1, -0.5 * vals[3])
    return Factor(client, int(seq), float(n_total), Vn, vals[0], vals[1], phi, Zn)
