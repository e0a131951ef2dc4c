"""Learners built from a :class:`~streamfed.fleet.config.FleetConfig`: every agent and the aggregator of a
fleet derive identical feature maps and hyperparameters from it (nothing else is exchanged).

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=4, n_features=5)
>>> c = make_learner(cfg, "a1", 0)
>>> type(c).__name__, kernel_version(cfg) == c.bank.version
('POFMKLClient', True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfed.algorithms.fedbnr.learner import FedBNRClient, FedBNRServer
from streamfed.algorithms.pofmkl.learner import POFMKLClient, POFMKLServer
from streamfed.core.features import KernelSpec, RFFBank, RFFMap
from streamfed.fleet.config import FleetConfig

__all__ = ["kernel_version", "make_learner", "make_server", "pofmkl_bank"]


def pofmkl_bank(cfg: FleetConfig) -> RFFBank:
    return RFFBank([KernelSpec.parse(s) for s in cfg.kernel_specs], cfg.n_features, cfg.n_inputs, seed=cfg.seed)


def _fedbnr_maps(cfg: FleetConfig) -> list[RFFMap]:
    return [RFFMap(RFFBank([KernelSpec.parse(s)], cfg.n_features, cfg.n_inputs, seed=cfg.seed),
                   bias=cfg.fedbnr_bias) for s in cfg.kernel_specs]


def make_learner(cfg: FleetConfig, client_id: str, index: int) -> Any:
    """The client half for agent `client_id`, the `index`-th client of the fleet (its bin draws use
    `default_rng([seed, index])`, as in :func:`streamfed.evaluation.replay.replay`)."""
    if cfg.algorithm == "pofmkl":
        p = cfg.pofmkl
        return POFMKLClient(pofmkl_bank(cfg), p.eta, p.lam, p.xi, cfg.bin_size,
                            rng=np.random.default_rng([cfg.seed, index]))
    p2 = cfg.fedbnr
    return FedBNRClient(_fedbnr_maps(cfg), sigma=p2.sigma, lam=p2.lam, min_upload=p2.min_upload,
                        forgetting=p2.forgetting, client_id=client_id)


def make_server(cfg: FleetConfig) -> Any:
    """The server half of the fleet's learner."""
    if cfg.algorithm == "pofmkl":
        return POFMKLServer(cfg.n_kernels, 2 * cfg.n_features)
    probe = FedBNRClient(_fedbnr_maps(cfg), sigma=cfg.fedbnr.sigma, lam=cfg.fedbnr.lam,
                         min_upload=cfg.fedbnr.min_upload)
    return FedBNRServer.for_client(probe, fit_hyperparameters=cfg.fedbnr.fit_hyperparameters)


def kernel_version(cfg: FleetConfig) -> str:
    """The feature-map version every message of this fleet carries."""
    if cfg.algorithm == "pofmkl":
        return pofmkl_bank(cfg).version
    return FedBNRClient(_fedbnr_maps(cfg)).kernel_version
