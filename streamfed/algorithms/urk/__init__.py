"""URK-FedBNR — learned kernels (the thesis's FedBNR, §3.1, phase 1) under the exact Bayesian last layer of
FedBNR (phase 2), online (docs/algorithms.md, "URK-FedBNR").

Features: the unifying random kernel of a small network, `[cos(h(ω_i)ᵀ f(x)), sin(h(ω_i)ᵀ f(x))] / √(m−1)`,
`ω ~ N(0, I)` drawn once from the fleet seed. Phase 2 sums FedBNR's statistics of those features exactly
across clients. Phase 1 learns the network, `σ` and `λ`: each client, every `fit_every` samples, takes a few
Adam steps on the log evidence of its reservoir and uploads the delta in chunks of at most `max_chunk_bytes`;
the server averages the deltas (FedAvg, weighted by reservoir sizes) or distils them on a server-held set
(thesis eq. 3.4), and publishes a new kernel version: a new statistics epoch, into which clients re-embed
their reservoirs.

* :mod:`.network` — the network and its features in numpy (no torch: enough to predict and contribute);
* :mod:`.training` — torch: the evidence, local fits, distillation (only where kernels are trained);
* :mod:`.client` / :mod:`.server` — the two halves; :mod:`.messages`, :mod:`.wire` — what they exchange;
* :mod:`.learner`, :mod:`.aggregation` — the plug-in contract; :mod:`.estimator` — River. Chunks:
  :mod:`streamfed.algorithms.chunks`.

>>> import numpy as np
>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="urk-fedbnr", n_inputs=2, params={"n_omega": 8, "sigma": 0.5})
>>> learner = ALGORITHM.learner(cfg, "a1", 0)
>>> mean, var = learner.predict(np.zeros(2))
>>> mean, round(var, 12)  # the prior predictive: σ² + λ²‖s(x)‖² = 0.25 + 8/7
(0.0, 1.392857142857)
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from streamfed.algorithms.base import Algorithm, Mode, Params, ReplayVariant, params_of

if TYPE_CHECKING:
    from streamfed.algorithms.calibration import CalibratedLearner
    from streamfed.algorithms.urk.aggregation import URKAggregation
    from streamfed.algorithms.urk.learner import URKLearner
    from streamfed.algorithms.urk.network import URKArch, URKWeights
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "URKFedBNR", "URKParams", "arch_of", "initial_of"]


class URKParams(Params):
    """URK-FedBNR's settings: the network, the last layer's initial `σ, λ`, the privacy floor, phase 1 (local
    fits, aggregation, chunk size) and the server's quorum for a new kernel version.

    >>> URKParams(widths=(16,), n_omega=64).n_omega
    64
    """

    # f: hidden widths then the latent size k. Empty (the default): the identity, k = d — one lengthscale per input
    # learned across clients (ARD), what a fixed RFF bandwidth cannot do; (32, 8) is the thesis's network, which
    # its few Adam steps per fit do not train far enough on a stream (docs/results.md, "URK-FedBNR")
    widths: tuple[int, ...] = ()
    n_omega: int = Field(32, ge=2, le=1024)  # m: F = 2m features
    shifter_width: int = Field(0, ge=0, le=1024)  # h's residual MLP (0: h is the per-dimension scaling ω/ℓ)
    # "thesis": [cos; sin]/√(m−1) (eq. 3.2); "rff": [sin; cos]/√m, docs/algorithms.md §2 exactly
    normalisation: Literal["thesis", "rff"] = "thesis"
    lengthscale: float | None = Field(None, gt=0, allow_inf_nan=False)  # initial ℓ (None: √(2k))
    sigma: float = Field(0.5, gt=0, allow_inf_nan=False)  # initial noise σ
    lam: float = Field(1.0, gt=0, allow_inf_nan=False)  # initial prior scale λ of the last layer
    min_upload: int = Field(32, ge=1)  # privacy floor: never publish statistics of fewer samples
    fit_hyperparameters: bool = True  # phase 2: the server refits σ, λ on the sums by the exact evidence
    # scale the predictive variance by a conformal factor of the client's own prequential residuals
    # (streamfed.algorithms.calibration): the 95% interval covers ~95%; the mean and every upload are unchanged
    calibrate: bool = True
    learn_kernel: bool = True  # phase 1 (agents without torch only predict and contribute statistics)
    reservoir: int = Field(256, ge=2)
    # a new kernel version: re-embed the reservoir and carry every other sample by a projection (urk/carry.py);
    # False: the reservoir alone (the statistics of the samples that left it are lost at each version). None (the
    # default): carry, except under [fleet.robust] aggregation = "robust" — a version pushed by hostile proposers
    # would leave its loss in the statistics carried through it (worst honest MSE ×1.19 against ×1.04 with 3 of 10
    # attackers, tests/test_robust_nets.py), while restarting from the reservoirs sheds it
    carry: bool | None = None
    fit_every: int = Field(64, ge=1)
    fit_steps: int = Field(10, ge=1)  # J
    # Adam's step (None: 0.1 without widths — only log-lengthscales, log σ, log λ move, by at most ~1 per fit —
    # and 0.01 with a network, whose weights a large step throws about)
    learning_rate: float | None = Field(None, gt=0, allow_inf_nan=False)
    aggregation: Literal["fedavg", "distill"] = "fedavg"
    distill_inputs: tuple[tuple[float, ...], ...] | None = None  # the server-held set (learners' input units)
    distill_targets: tuple[float, ...] | None = None
    distill_alpha: float = Field(1.0, ge=0, allow_inf_nan=False)
    distill_steps: int = Field(20, ge=1)
    max_chunk_bytes: int = Field(4096, ge=8)  # a proposal travels in chunks of at most this many bytes
    min_proposal_weight: float = Field(256.0, gt=0)  # a new version needs proposals of this many samples ...
    proposal_quorum: float = Field(0.5, gt=0, le=1)  # ... from this share of the clients heard since the last
    # [fleet.robust] aggregation = "robust" only (docs/algorithms.md §8.11): samples any client may hold in a
    # version's statistics whatever the share cap (None: 4 × min_upload, FedBNR's cold start)
    robust_share_floor: int | None = Field(None, ge=1)
    # forgetting on the fleet's time base (FedBNR's, docs/algorithms.md §8): the last layer's statistics weigh a
    # sample 2^(−Δ/half_life_s) in the clients, their uploads and the globals; None: off. Fixed networks only
    # (learn_kernel = false): a new kernel version re-embeds the reservoir, whose samples' times are not kept
    half_life_s: float | None = Field(None, gt=0, allow_inf_nan=False)

    @property
    def rate(self) -> float:
        """Adam's learning rate of the local fits and the distillation (`learning_rate`, or its default).

        >>> URKParams().rate, URKParams(widths=(8,)).rate, URKParams(learning_rate=0.3).rate
        (0.1, 0.01, 0.3)
        """
        if self.learning_rate is not None:
            return float(self.learning_rate)
        return 0.01 if self.widths else 0.1

    @model_validator(mode="after")
    def _distill_set(self) -> URKParams:
        xs, ys = self.distill_inputs, self.distill_targets
        if (xs is None) != (ys is None) or (xs is not None and ys is not None and (len(xs) != len(ys) or len(xs) < 2)):
            raise ValueError("distill_inputs and distill_targets go together, with the same number (>= 2) of rows")
        if self.aggregation == "distill" and self.learn_kernel and xs is None:
            raise ValueError("aggregation 'distill' needs the server-held set (distill_inputs, distill_targets)")
        if self.half_life_s is not None and self.learn_kernel:
            raise ValueError("half_life_s needs learn_kernel = false: a new kernel version re-embeds the reservoir, "
                             "whose samples' times are not kept")
        return self


def arch_of(cfg: FleetConfig) -> URKArch:
    """The network's shapes for a fleet."""
    from streamfed.algorithms.urk.network import URKArch

    p = params_of(cfg, URKParams)
    return URKArch(cfg.n_inputs, tuple(int(w) for w in p.widths), int(p.n_omega), int(p.shifter_width),
                   p.normalisation)


def _clamped(arch: URKArch) -> tuple[int, ...]:
    """Indices of the flat vector the local fits clamp into `LOG_BOUNDS` after every step: the
    log-lengthscales, `log σ`, `log λ` (`training._clamp_logs`)."""
    out, i = [], 0
    for name, shape in arch.shapes():
        size = math.prod(shape)
        if name == "log_ls":
            out += range(i, i + size)
        i += size
    return (*out, i, i + 1)


def initial_of(cfg: FleetConfig) -> URKWeights:
    """Kernel version 0: the network initialised from the fleet seed, the configured `ℓ, σ, λ`."""
    from streamfed.algorithms.urk.network import initial_weights

    arch, p = arch_of(cfg), params_of(cfg, URKParams)
    ls = p.lengthscale if p.lengthscale is not None else math.sqrt(2.0 * arch.latent)
    return initial_weights(arch, cfg.seed, lengthscale=ls, sigma=p.sigma, lam=p.lam)


class URKFedBNR(Algorithm):
    """URK-FedBNR: order-free (no lock-step), Bayesian (predictions carry a variance)."""

    name = "urk-fedbnr"
    title = "URK-FedBNR (learned kernel network by FedAvg or distillation; exact federated Bayesian last layer)"
    Params = URKParams
    bayesian = True
    cheap_regret = False  # O(F³): read per upload

    def feature_dim(self, cfg: FleetConfig) -> int:
        return 2 * int(params_of(cfg, URKParams).n_omega)

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.urk.wire import schemas

        return schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        from streamfed.algorithms.urk.network import omega

        arch, w = arch_of(cfg), initial_of(cfg)
        digest = hashlib.sha256(w.to_vector().tobytes() + omega(arch, cfg.seed).tobytes()).hexdigest()[:12]
        widths = "x".join(str(v) for v in arch.widths) or "id"
        norm = "" if arch.normalisation == "thesis" else "-rff"
        return f"urk-d{arch.n_inputs}-w{widths}-m{arch.n_omega}-h{arch.shifter_width}{norm}-{digest}"

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async"
                ) -> URKLearner | CalibratedLearner:
        from streamfed.algorithms.calibration import CalibratedLearner
        from streamfed.algorithms.urk.client import URKClient
        from streamfed.algorithms.urk.learner import URKLearner
        from streamfed.algorithms.urk.network import omega
        from streamfed.algorithms.urk.wire import max_chunk_numbers

        if mode == "lockstep":
            raise ValueError("URK-FedBNR is order-free (use async)")
        p = params_of(cfg, URKParams)
        learner = URKLearner(URKClient(
            initial_of(cfg), omega(arch_of(cfg), cfg.seed), self.kernel_version(cfg), client_id=client_id,
            min_upload=p.min_upload, learn_kernel=p.learn_kernel, reservoir=p.reservoir, fit_every=p.fit_every,
            fit_steps=p.fit_steps, learning_rate=p.rate,
            max_chunk_numbers=max_chunk_numbers(p.max_chunk_bytes), seed=cfg.seed,
            carry=p.carry if p.carry is not None else cfg.robust.aggregation != "robust", half_life_s=p.half_life_s))
        return CalibratedLearner(learner) if p.calibrate else learner

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True) -> URKAggregation:
        """The aggregation, with the declared bounds (docs/algorithms.md §8.11, §10.3: statistics of labels within
        `cfg.robust.label_bound`, `n` pinned by `tr S = n‖φ‖²`; proposals within what `fit_steps` Adam steps at
        `learning_rate` can move, weights within a reservoir) and, with `cfg.robust.aggregation = "robust"`,
        proposals combined by a clipped trimmed mean and each client's statistics held to `share_cap`."""
        import numpy as np

        from streamfed.algorithms.urk.aggregation import URKAggregation
        from streamfed.algorithms.urk.network import omega
        from streamfed.algorithms.urk.robust_proposals import ProposalBound, RobustProposals
        from streamfed.algorithms.urk.server import LOG_BOUNDS, URKServer

        p, r = params_of(cfg, URKParams), cfg.robust
        kd = None
        if p.distill_inputs is not None and p.distill_targets is not None:
            X = np.array(p.distill_inputs, dtype=np.float64)
            if X.ndim != 2 or X.shape[1] != cfg.n_inputs:
                raise ValueError(f"distill_inputs must be rows of {cfg.n_inputs} values")
            kd = (X, np.array(p.distill_targets, dtype=np.float64))
        server = URKServer(initial_of(cfg), omega(arch_of(cfg), cfg.seed), self.kernel_version(cfg),
                           min_samples=p.min_upload, fit=p.fit_hyperparameters, learn_kernel=p.learn_kernel,
                           aggregation=p.aggregation, distill_set=kd, distill_alpha=p.distill_alpha,
                           distill_steps=p.distill_steps, distill_learning_rate=p.rate,
                           min_proposal_weight=p.min_proposal_weight, proposal_quorum=p.proposal_quorum,
                           max_proposal_weight=float(p.reservoir),
                           robust=RobustProposals(r.trim, r.clip_factor) if r.aggregation == "robust" else None,
                           share=(r.share_cap, float(p.robust_share_floor if p.robust_share_floor is not None
                                                     else 4 * p.min_upload)) if r.aggregation == "robust" else None,
                           half_life_s=p.half_life_s)
        bound = ProposalBound(int(p.fit_steps), p.rate, float(p.reservoir),
                              _clamped(arch_of(cfg)), LOG_BOUNDS)
        # noised uploads (differential privacy: every floating array of a chunk, its weight too) are bounded by
        # the privacy layer's clipping, not per Adam step: no declared bound on them (as POF-MKL, algorithms.md §3.9)
        return URKAggregation(server, max_abs=max_abs, check_stats=check_stats, label_bound=r.label_bound,
                              bound=bound if check_stats else None)

    def replay_variants(self) -> list[ReplayVariant]:
        return [ReplayVariant(self.name, self.title),
                ReplayVariant("urk-fedbnr-local", "URK-FedBNR without federation (each client its own server)",
                              "local")]

    def estimator(self, **params: Any) -> Any:
        from streamfed.algorithms.urk.estimator import URKRegressor

        return URKRegressor(**params)

    def demo_settings(self) -> dict[str, Any]:
        return {"params": {"widths": [16, 4], "n_omega": 16, "min_upload": 32, "fit_every": 64,
                           "min_proposal_weight": 64}}


ALGORITHM = URKFedBNR()
