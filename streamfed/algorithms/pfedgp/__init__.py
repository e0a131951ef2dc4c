"""pFedGP — a shared deep kernel learned by FedAvg, a personal GP classifier per client (Achituve et al.,
NeurIPS 2021; docs/algorithms.md, "pFedGP"). The engine's first classifier.

Each client embeds its inputs with the shared network `g_θ` (URK's network, :mod:`.network`) and keeps a
GP-Tree classifier on the embeddings (:mod:`.tree`, :mod:`.personal`): one binary GP per node, Pólya–Gamma
augmented, sampled by block Gibbs (:mod:`.gibbs`; :mod:`.fitc` for pFedGP-IP-compute, `inducing > 0` shared
inducing inputs in embedding space). The personal GP never leaves the client. The network (and the inducing
inputs) is refined by periodic local steps on the predictive or marginal likelihood (:mod:`.training`,
:mod:`.objectives`), proposed to the aggregator in chunks and averaged (:mod:`.server`): a new network
version re-embeds every client's budget.

* :mod:`.client` / :mod:`.server` — the two halves; :mod:`.messages`, :mod:`.wire` — what they exchange;
* :mod:`.learner`, :mod:`.aggregation` — the plug-in contract; :mod:`.estimator` — the River classifier;
* :mod:`.softmax` — the FedAvg baseline: the same network with a softmax head.

Labels are class indices `0 … n_classes − 1` carried as floats; a prediction's "mean" is the most probable
class (no variance); the probabilities: ``learner.class_probabilities(x)``.

>>> import numpy as np
>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2, params={"n_classes": 3, "widths": [4], "n_omega": 8})
>>> learner = ALGORITHM.learner(cfg, "a1", 0)
>>> learner.predict(np.zeros(2))  # nothing seen: uniform, the first class
(0.0, None)
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from streamfed.algorithms.base import Algorithm, Mode, Params, ReplayVariant, params_of

if TYPE_CHECKING:
    import numpy as np

    from streamfed.algorithms.pfedgp.aggregation import PFedGPAggregation
    from streamfed.algorithms.pfedgp.learner import PFedGPLearner
    from streamfed.algorithms.pfedgp.network import Layout
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "PFedGP", "PFedGPParams", "initial_of", "layout_of"]


class PFedGPParams(Params):
    """pFedGP's settings: the classes, the network (URK's shapes), the GP (RBF on the embedding, Gibbs),
    the budget, the local updates and the server's quorum.

    >>> PFedGPParams(n_classes=6, inducing=16).inducing
    16
    """

    n_classes: int = Field(10, ge=2, le=1000)
    widths: tuple[int, ...] = (32, 8)  # the MLP f (empty: identity)
    n_omega: int = Field(32, ge=2, le=1024)  # the embedding has D = 2m numbers
    shifter_width: int = Field(0, ge=0, le=1024)
    net_lengthscale: float | None = Field(None, gt=0, allow_inf_nan=False)  # URK's initial ℓ (None: √(2k))
    lengthscale: float = Field(0.5, gt=0, allow_inf_nan=False)  # the GP's RBF on the embedding
    outputscale: float = Field(8.0, gt=0, allow_inf_nan=False)  # (the paper's 8)
    inducing: int = Field(0, ge=0, le=4096)  # M shared inducing inputs (FITC, pFedGP-IP-compute); 0: full GP
    budget: int = Field(32, ge=1, le=100_000)  # samples kept per class
    # the whole budget's bound and the work credit (cost.py); None: as fleets ran before (bounded by n_classes)
    max_budget: int | None = Field(None, ge=1, le=1_000_000)
    work_per_sample: float | None = Field(None, gt=0, allow_inf_nan=False)
    smoothing: float = Field(1e-6, ge=0, lt=1)  # the uniform mixture's weight: no probability exactly 0 or 1
    chains: int = Field(8, ge=1, le=256)
    gibbs_steps: int = Field(2, ge=1, le=1000)  # sweeps per refresh (chains continue)
    burn_in: int = Field(10, ge=1, le=10_000)  # sweeps for fresh chains
    refresh_every: int = Field(1, ge=1)
    learn_kernel: bool = True  # local updates of the network (agents without torch only predict)
    objective: Literal["predictive", "marginal"] = "predictive"
    fit_every: int = Field(64, ge=1)
    fit_steps: int = Field(5, ge=1)
    learning_rate: float = Field(0.01, gt=0, allow_inf_nan=False)
    train_chains: int = Field(4, ge=1, le=256)
    head: Literal["gp", "softmax"] = "gp"  # softmax: the FedAvg baseline (the same network, a softmax head)
    max_chunk_bytes: int = Field(4096, ge=8)
    min_proposal_weight: float = Field(64.0, gt=0)
    proposal_quorum: float = Field(0.5, gt=0, le=1)


def layout_of(cfg: FleetConfig) -> Layout:
    """The shared parameters' layout for a fleet."""
    from streamfed.algorithms.pfedgp.network import Layout
    from streamfed.algorithms.urk.network import URKArch

    p = params_of(cfg, PFedGPParams)
    arch = URKArch(cfg.n_inputs, tuple(int(w) for w in p.widths), int(p.n_omega), int(p.shifter_width))
    extra = 0
    if p.head == "softmax":
        extra = int(p.n_classes) * (arch.dim + 1)
    return Layout(arch, int(p.inducing) if p.head == "gp" else 0, extra)


def _log_ls_indices(layout: Layout) -> tuple[int, ...]:
    """Indices of the log-lengthscales in the shared vector."""
    i = 0
    for name, shape in layout.arch.shapes():
        size = math.prod(shape)
        if name == "log_ls":
            return tuple(range(i, i + size))
        i += size
    return ()


def initial_of(cfg: FleetConfig) -> np.ndarray:
    """Network version 0 from the fleet seed."""
    from streamfed.algorithms.pfedgp.network import initial_theta

    layout, p = layout_of(cfg), params_of(cfg, PFedGPParams)
    ls = p.net_lengthscale if p.net_lengthscale is not None else math.sqrt(2.0 * layout.arch.latent)
    return initial_theta(layout, cfg.seed, lengthscale=ls)


class PFedGP(Algorithm):
    """pFedGP: order-free (no lock-step), a classifier (no predictive variance)."""

    name = "pfedgp"
    title = "pFedGP (shared deep kernel by FedAvg, personal Pólya–Gamma GP-Tree classifier per client)"
    Params = PFedGPParams
    bayesian = False
    task = "classification"
    cheap_regret = True

    def feature_dim(self, cfg: FleetConfig) -> int:
        return layout_of(cfg).embed_dim

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.pfedgp.wire import schemas

        return schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        from streamfed.algorithms.pfedgp.network import omega_of

        layout, p = layout_of(cfg), params_of(cfg, PFedGPParams)
        digest = hashlib.sha256(initial_of(cfg).tobytes() + omega_of(layout, cfg.seed).tobytes()).hexdigest()[:12]
        widths = "x".join(str(v) for v in layout.arch.widths) or "id"
        return (f"pfedgp-d{cfg.n_inputs}-w{widths}-m{layout.arch.n_omega}-M{layout.n_inducing}-{p.head}"
                f"-c{p.n_classes}-{digest}")

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> PFedGPLearner:
        from streamfed.algorithms.pfedgp.client import PFedGPClient
        from streamfed.algorithms.pfedgp.learner import PFedGPLearner
        from streamfed.algorithms.pfedgp.network import omega_of
        from streamfed.algorithms.pfedgp.wire import max_chunk_numbers

        if mode == "lockstep":
            raise ValueError("pFedGP is order-free (use async)")
        p = params_of(cfg, PFedGPParams)
        layout = layout_of(cfg)
        args: dict[str, Any] = dict(
            n_classes=p.n_classes, client_id=client_id, budget=p.budget, learn_kernel=p.learn_kernel,
            max_budget=p.max_budget, work_per_sample=p.work_per_sample, smoothing=p.smoothing,
            fit_every=p.fit_every, fit_steps=p.fit_steps, learning_rate=p.learning_rate,
            max_chunk_numbers=max_chunk_numbers(p.max_chunk_bytes), seed=cfg.seed)
        if p.head == "softmax":
            from streamfed.algorithms.pfedgp.softmax import SoftmaxClient

            return PFedGPLearner(SoftmaxClient(layout, initial_of(cfg), omega_of(layout, cfg.seed), **args))
        return PFedGPLearner(PFedGPClient(
            layout, initial_of(cfg), omega_of(layout, cfg.seed), lengthscale=p.lengthscale,
            outputscale=p.outputscale, chains=p.chains, gibbs_steps=p.gibbs_steps, burn_in=p.burn_in,
            refresh_every=p.refresh_every, objective=p.objective, train_chains=p.train_chains, **args))

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True
                    ) -> PFedGPAggregation:
        """The aggregation, with the declared bound (docs/algorithms.md §9.4, §10.3: every coordinate
        of a proposal within what `fit_steps` Adam steps at `learning_rate` can move, its weight within a full
        budget) and,
        with `cfg.robust.aggregation = "robust"`, proposals combined by a clipped trimmed mean per client."""
        from streamfed.algorithms.pfedgp.aggregation import PFedGPAggregation
        from streamfed.algorithms.pfedgp.server import PFedGPServer
        from streamfed.algorithms.urk.robust_proposals import ProposalBound, RobustProposals
        from streamfed.algorithms.urk.training import LOG_BOUNDS

        p, r = params_of(cfg, PFedGPParams), cfg.robust
        max_weight = float(p.budget * p.n_classes)
        server = PFedGPServer(initial_of(cfg), min_proposal_weight=p.min_proposal_weight,
                              proposal_quorum=p.proposal_quorum, max_proposal_weight=max_weight,
                              max_abs=min(max_abs, 1e6),
                              robust=RobustProposals(r.trim, r.clip_factor) if r.aggregation == "robust" else None)
        # the GP head's fit clamps the log-lengthscales after every step (training.fit_local); the softmax
        # baseline's clamps nothing
        clamped = _log_ls_indices(layout_of(cfg)) if p.head == "gp" else ()
        bound = ProposalBound(int(p.fit_steps), float(p.learning_rate), max_weight, clamped, LOG_BOUNDS)
        # noised uploads (differential privacy: every floating array of a chunk, its weight too) are bounded by
        # the privacy layer's clipping, not per Adam step: no declared bound on them (as POF-MKL, algorithms.md §3.9)
        return PFedGPAggregation(server, bound=bound if check_stats else None)

    def replay_variants(self) -> list[ReplayVariant]:
        return [ReplayVariant(self.name, self.title),
                ReplayVariant("pfedgp-local", "pFedGP without federation (each client its own network)", "local")]

    def estimator(self, **params: Any) -> Any:
        from streamfed.algorithms.pfedgp.estimator import PFedGPClassifier

        return PFedGPClassifier(**params)

    def demo_settings(self) -> dict[str, Any]:
        return {"params": {"n_classes": 6, "widths": [16, 4], "n_omega": 16, "budget": 24, "refresh_every": 4,
                           "fit_every": 128, "min_proposal_weight": 64}}


ALGORITHM = PFedGP()
