"""A client's local update of the shared parameters (pFedGP §4.1, the client side of FedAvg), in torch.

Per Adam step: embed the client's samples with the current network, run each node's Gibbs chains on the
detached kernel (numpy, :mod:`.gibbs` / :mod:`.fitc`), then ascend the objective for those `ω` (Fisher's
identity, eq. 2 / eq. 4) through URK's differentiable features (:func:`streamfed.algorithms.urk.training.
features_t`, reused). The tree is rebuilt once per local update from the current embeddings (the paper
rebuilds it every round). `objective="predictive"` conditions each node on a random half of its samples and
scores the other half (eq. 3); `"marginal"` scores all of them (eq. 1). The loss is divided by the number of
samples. Log-lengthscales stay within URK's `LOG_BOUNDS`. With the kernel's linear part (`Layout.linear`) its
scale `log c` is learned with the network (within `LINEAR_BOUNDS`): the GP inputs are `g_θ(x)` then
`√(c / (d + 1)) · (1, x)`, differentiable in `log c`.

>>> from streamfed.algorithms.urk.network import URKArch
>>> from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
>>> layout = Layout(URKArch(n_inputs=2, widths=(4,), n_omega=8))
>>> rng = np.random.default_rng(0)
>>> X = np.concatenate([rng.normal(-1, 0.5, (12, 2)), rng.normal(1, 0.5, (12, 2))]); y = np.repeat([0, 1], 12)
>>> theta = initial_theta(layout, 0)
>>> new = fit_local(layout, theta, omega_of(layout, 0), X, y, steps=3, rng=rng)
>>> new.shape == theta.shape and bool(np.any(new != theta))
True
"""

from __future__ import annotations

import math

import numpy as np
import torch

from streamfed.algorithms.pfedgp.fitc import fitc_gibbs
from streamfed.algorithms.pfedgp.gibbs import gibbs
from streamfed.algorithms.pfedgp.kernels import gp_kernel
from streamfed.algorithms.pfedgp.network import LINEAR_BOUNDS, Layout, gp_inputs, inducing_of
from streamfed.algorithms.pfedgp.objectives import (
    gp_kernel_t,
    log_marginal_fitc,
    log_marginal_full,
    log_predictive_fitc,
    log_predictive_full,
)
from streamfed.algorithms.pfedgp.personal import prototypes
from streamfed.algorithms.pfedgp.tree import build_tree
from streamfed.algorithms.urk.training import LOG_BOUNDS, features_t

__all__ = ["fit_local", "local_objective"]


def _log_ls_slice(layout: Layout) -> slice:
    i = 0
    for name, shape in layout.arch.shapes():
        size = math.prod(shape)
        if name == "log_ls":
            return slice(i, i + size)
        i += size
    raise AssertionError("URK's layout has log_ls")


def local_objective(layout: Layout, v: torch.Tensor, om: torch.Tensor, X: torch.Tensor, y: np.ndarray,
                    rng: np.random.Generator, *, objective: str = "predictive", lengthscale: float = 1.0,
                    outputscale: float = 8.0, chains: int = 5, gibbs_steps: int = 5, tree: object = None
                    ) -> torch.Tensor:
    """The objective (to maximise) of the client's samples at parameters `v`, summed over the tree's nodes,
    per sample; Gibbs samples drawn at `v` (detached)."""
    n_net, fitc = layout.n_net, layout.n_inducing > 0
    theta = v.detach().numpy()
    E = gp_inputs(layout, theta, om.numpy(), X.numpy())
    classes = tuple(int(c) for c in np.unique(y))
    if tree is None:
        tree = build_tree(classes, prototypes(E, y, classes), rng)
    Et = features_t(v[:n_net], layout.arch, om, X)
    dim = layout.gp_dim
    if layout.linear:  # the linear part's inputs, scaled by √(c / (d + 1)), differentiable in log c
        z = torch.cat([torch.ones((X.shape[0], 1), dtype=torch.float64), X], dim=1)
        Et = torch.cat([Et, torch.exp(0.5 * v[layout.linear_index]) / math.sqrt(z.shape[1]) * z], dim=1)
    Zt = v[n_net:].reshape(layout.n_inducing, layout.embed_dim) if fitc else None
    Z = inducing_of(layout, theta) if fitc else None

    def k(A: np.ndarray, B: np.ndarray) -> np.ndarray:
        return gp_kernel(A, B, dim=dim, lengthscale=lengthscale, outputscale=outputscale)

    def kt(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return gp_kernel_t(A, B, dim, lengthscale, outputscale)

    def kss(rows: np.ndarray) -> torch.Tensor:  # the prior variances of the scored samples
        if dim is None:
            return torch.full((rows.size,), outputscale, dtype=torch.float64)
        return outputscale + (Et[rows, dim:] ** 2).sum(1)

    total = torch.zeros((), dtype=torch.float64)
    for node in tree.nodes:  # type: ignore[attr-defined]
        mask, yv = node.labels(y)
        idx = np.flatnonzero(mask)
        if idx.size < 2:
            continue
        if objective == "predictive":
            perm = rng.permutation(idx.size)
            tr, te = np.sort(perm[: idx.size // 2]), np.sort(perm[idx.size // 2:])
        else:
            tr, te = np.arange(idx.size), np.arange(0)
        Etr, ytr = Et[idx[tr]], torch.tensor(yv[tr])
        if fitc:
            assert Z is not None and Zt is not None
            om_s = fitc_gibbs(k(Z, Z), k(E[idx[tr]], Z), np.full(tr.size, outputscale), yv[tr], chains=chains,
                              steps=gibbs_steps, rng=rng).omega
            Kmm, Knm = kt(Zt, Zt), kt(Etr, Zt)
            kd = torch.full((tr.size,), outputscale, dtype=torch.float64)
            if objective == "predictive":
                total = total + log_predictive_fitc(Kmm, Knm, kd, kt(Zt, Et[idx[te]]),
                                                    torch.full((te.size,), outputscale, dtype=torch.float64),
                                                    ytr, torch.tensor(yv[te]), torch.tensor(om_s))
            else:
                total = total + log_marginal_fitc(Kmm, Knm, kd, ytr, torch.tensor(om_s))
        else:
            om_s = gibbs(k(E[idx[tr]], E[idx[tr]]), yv[tr], chains=chains, steps=gibbs_steps, rng=rng).omega
            if objective == "predictive":
                total = total + log_predictive_full(kt(Etr, Etr), kt(Etr, Et[idx[te]]), kss(idx[te]), ytr,
                                                    torch.tensor(yv[te]), torch.tensor(om_s))
            else:
                total = total + log_marginal_full(kt(Etr, Etr), ytr, torch.tensor(om_s))
    return total / max(int(y.size), 1)


def fit_local(layout: Layout, theta: np.ndarray, om: np.ndarray, X: np.ndarray, y: np.ndarray, *,
              rng: np.random.Generator, steps: int = 5, learning_rate: float = 0.01, objective: str = "predictive",
              lengthscale: float = 1.0, outputscale: float = 8.0, chains: int = 5, gibbs_steps: int = 5
              ) -> np.ndarray | None:
    """`steps` Adam steps on the client's objective from `theta`; the new vector, or None when a step would
    leave finite numbers (then nothing is proposed)."""
    if objective not in ("predictive", "marginal"):
        raise ValueError(f"objective must be 'predictive' or 'marginal', got {objective!r}")
    y = np.asarray(y).astype(np.int64)
    if np.unique(y).size < 2:
        return None  # one class: no node, nothing to learn from
    v = torch.tensor(np.asarray(theta, dtype=np.float64), requires_grad=True)
    om_t, X_t = torch.tensor(om, dtype=torch.float64), torch.tensor(X, dtype=torch.float64)
    opt = torch.optim.Adam([v], lr=float(learning_rate))
    E = gp_inputs(layout, theta, om, X)
    classes = tuple(int(c) for c in np.unique(y))
    tree = build_tree(classes, prototypes(E, y, classes), rng)
    ls = _log_ls_slice(layout)
    for _ in range(int(steps)):
        opt.zero_grad()
        try:
            loss = -local_objective(layout, v, om_t, X_t, y, rng, objective=objective, lengthscale=lengthscale,
                                    outputscale=outputscale, chains=chains, gibbs_steps=gibbs_steps, tree=tree)
        except (RuntimeError, ValueError):  # a factorisation failed in rounding
            return None
        if not torch.isfinite(loss):
            return None
        loss.backward()
        if v.grad is None or not torch.all(torch.isfinite(v.grad)):
            return None
        opt.step()
        with torch.no_grad():
            v[ls].clamp_(*LOG_BOUNDS)
            if layout.linear:
                v[layout.linear_index].clamp_(*LINEAR_BOUNDS)
    out = v.detach().numpy().copy()
    return out if np.all(np.isfinite(out)) else None
