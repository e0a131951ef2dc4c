"""The :class:`~streamfed.algorithms.base.Learner` of personalised FedBNR — what an agent runs
(docs/algorithms.md §10): the learner around `FedBNRHierClient` (or the `τ`-mixture's client), and the
decoding of the global it installs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import BaseLearner, ObservedClock, Regret, Update
from streamfed.algorithms.fedbnr.metrics import ridge_loss
from streamfed.algorithms.fedbnr_personal.client import FedBNRHierClient
from streamfed.algorithms.fedbnr_personal.experts import EXPERTS, FedBNRExpertsClient
from streamfed.algorithms.fedbnr_personal.messages import HierGlobal
from streamfed.algorithms.fedbnr_personal.mixture import FedBNRHierMixClient
from streamfed.algorithms.fedbnr_personal.wire import GLOBAL, SCALARS
from streamfed.core.durable import durable
from streamfed.core.stats import pack_upper, unpack_upper
from streamfed.wire.message import Message, writable_copy

__all__ = ["PersonalLearner", "global_from_message"]


@durable("fedbnr-personal.PersonalLearner")
class PersonalLearner(ObservedClock, BaseLearner):
    """The :class:`~streamfed.algorithms.base.Learner` of personalised FedBNR: the exact posterior of this
    client's own weights `w + δ_k` given the shared posterior and all its own data.

    >>> learner = PersonalLearner(FedBNRHierClient(n_inputs=1, n_features=4, min_upload=2))
    >>> _ = learner.learn(np.array([0.1]), 1.0); _ = learner.learn(np.array([0.2]), 1.0)
    >>> up = learner.take_update()
    >>> up.seq, up.n_samples, float(up.arrays["time"])
    (1, 2, 2.0)
    """

    # class-level default: a learner pickled before the readings' time base learns on per-sample time
    timed = False

    def __init__(self, client: FedBNRHierClient | FedBNRHierMixClient | FedBNRExpertsClient,
                 kernel_names: Sequence[str] = (), timed: bool = False) -> None:
        self.client = client
        # timed: the clients' clock is the readings' time (seconds; `half_life_s`), else one unit per sample
        self.timed = bool(timed)
        self.mixture = isinstance(client, FedBNRHierMixClient)
        self.experts = isinstance(client, FedBNRExpertsClient)
        # with the τ-mixture its "kernels" are the models of the grid, its weights their mixture weights
        self._names = tuple(f"tau={t:g}" for t in client.tau_grid) if self.mixture else tuple(kernel_names)
        self._version = 0

    @property
    def kernel_names(self) -> Sequence[str]:
        return self._names

    @property
    def kernel_weights(self) -> np.ndarray | None:
        return self.client.weights() if self.mixture else None

    def _models(self) -> list[FedBNRHierClient]:
        c = self.client
        if isinstance(c, FedBNRHierMixClient):
            return list(c.models)
        if isinstance(c, FedBNRExpertsClient):
            return list(c.experts)
        return [c]

    def regret(self) -> Regret:
        """Against the best fixed ridge predictor on this client's own samples, at the prior scale of its
        weights without sharing (`√(λ² + τ²)`; with a mixture, the best over its models)."""
        c = self.client
        own = c.own_stats()
        if own.n == 0:
            return Regret(0.0, 0.0, 0.0)
        models = self._models()
        ridge = [float(ridge_loss(own, m.sigma, math.hypot(m.lam, m.tau))) for m in models]
        return Regret(float(own.n), float(c.metrics.sq_loss), min(ridge), int(np.argmin(ridge)))

    def diagnostics(self) -> dict[str, float]:
        """Shared vs personal evidence: the exact log evidence of the whole fleet's hierarchical model (from the
        installed global; the best model of the grid with the mixture) and this client's own prequential log
        evidence, `Σ_t log p(y_t | y_<t)` of the predictions it made. With the experts' mixture also each
        expert's weight (`mixture_weight_local`, `..._pooled`, `..._personal`)."""
        c = self.client
        models = [c.personal] if isinstance(c, FedBNRExpertsClient) else self._models()
        shared = [g.log_evidence for m in models if (g := m.installed_global) is not None]
        out = {"own_log_evidence": -float(c.metrics.nlpd_sum)}
        if shared:
            out["shared_log_evidence"] = float(max(shared))
        if isinstance(c, FedBNRExpertsClient):
            out.update({f"mixture_weight_{name}": float(w) for name, w in zip(EXPERTS, c.weights(), strict=True)})
        return out

    def expert_predictions(self) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
        """Each expert's predictions of every learned sample, where the client keeps them (the experts' mixture
        with `trace_experts`); else None."""
        c = self.client
        return c.expert_predictions() if isinstance(c, FedBNRExpertsClient) else None

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        mean, var = self.client.predict(x)
        return float(mean), float(var)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        # the client's learning step returns the prediction it made before learning: one pass instead of a
        # prediction and a step that predicts again (the published prediction waits for the O(F²) update)
        t = None
        if self.timed and self._observed is not None:
            # a reading older than the clock (sensors' clocks disagree a little) is learned at the clock's time:
            # statistics never move back in time
            t = max(self._observed, self.client.time) if math.isfinite(self.client.time) else self._observed
        mean, var = self.client.learn(x, y, t)
        return float(mean), float(var)

    def take_update(self) -> Update | None:
        up = self.client.make_upload()
        if up is None:
            return None
        st = up.stats
        arrays = {"S_upper": pack_upper(st.S), "b": np.array(st.b, dtype=np.float64), "n": np.asarray(float(st.n)),
                  "q": np.asarray(float(st.q)), "time": np.asarray(float(up.time))}
        return Update(arrays, int(up.count), self._version, seq=int(up.seq), epoch=int(st.epoch))

    @property
    def pending_samples(self) -> int:
        """Samples learned but not yet uploadable: below the privacy floor `min_upload`."""
        return int(self.client.n_pending)

    def install_global(self, msg: Message) -> bool:
        gs = global_from_message(msg)
        expected = len(self.client.models) if self.mixture else 1
        if len(gs) != expected:
            raise ValueError(f"global carries {len(gs)} models, this learner has {expected}")
        c = self.client
        installed = bool(c.apply_global(gs) if isinstance(c, FedBNRHierMixClient) else c.apply_global(gs[0]))
        if installed:
            self._version = msg.global_version
        return installed


def global_from_message(msg: Message) -> list[HierGlobal]:
    """The :class:`HierGlobal` of each model of a decoded global (writable copies)."""
    if msg.kind != GLOBAL:
        raise ValueError(f"expected a {GLOBAL!r} message, got {msg.kind!r}")
    hs = writable_copy(msg.arrays["h"], "float64")
    a_upper = writable_copy(msg.arrays["A_upper"], "float64")
    scalars = {k: np.asarray(msg.arrays[k], dtype=np.float64).reshape(-1) for k in SCALARS}
    out = []
    for j in range(hs.shape[0]):
        s = {k: float(v[j]) for k, v in scalars.items()}
        out.append(HierGlobal(msg.global_version, msg.kernel_version, msg.epoch, s["time"], s["forgetting"],
                              s["sigma"], s["lam"], s["tau"], unpack_upper(a_upper[j], hs.shape[1]), hs[j],
                              s["log_evidence"], dict(msg.included)))
    return out
