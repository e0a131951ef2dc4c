"""What a PVI agent runs (docs/algorithms.md, "PVI"): the streaming client behind the
:class:`~streamfed.algorithms.base.Learner` contract. Order-free; the learner numbers its own uploads
(one per refinement: its newest factor, which replaces the previous one at the server)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import Regret, Update, UploadSensitivity
from streamfed.algorithms.pvi.client import PVIClient
from streamfed.algorithms.pvi.wire import factor_arrays, read_global
from streamfed.algorithms.staged import PredictThenLearn
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["PVILearner"]


@durable("pvi.PVILearner")
class PVILearner(PredictThenLearn):
    """`predict` is the current `q`'s predictive (mean, variance); `begin_learn` predicts, `end_learn`
    learns (and refines every `refine_every` samples).

    >>> from streamfed.algorithms.pvi.settings import RefineSettings
    >>> from streamfed.algorithms.pvi.state import GlobalQ
    >>> g = GlobalQ.initial("se", np.zeros((2, 1)), np.array([0.0, 0.0, np.log(0.5)]), "fixed")
    >>> learner = PVILearner(PVIClient(g, RefineSettings(n_pseudo=2, steps=2), client_id="a", refine_every=2))
    >>> learner.learn(np.array([0.5]), 1.0), learner.take_update()
    ((0.0, 1.25), None)
    >>> _ = learner.learn(np.array([0.6]), 1.0)
    >>> up = learner.take_update()
    >>> up.seq, up.n_samples, sorted(up.arrays)
    (1, 2, ['V', 'log_s', 'm', 'n'])
    """

    def __init__(self, client: PVIClient) -> None:
        super().__init__(client)
        self._uploaded = 0  # samples covered by the factors uploaded so far

    @property
    def global_version(self) -> int:
        return self.client.version

    @property
    def kernel_names(self) -> Sequence[str]:
        return (self.client.global_state.kind,)

    def take_update(self) -> Update | None:
        f = self.client.take_factor()
        if f is None:
            return None
        new = max(int(f.n) - self._uploaded, 1)  # samples this factor adds to the previous one's
        self._uploaded = int(f.n)
        return Update(factor_arrays(f), new, self.client.version, seq=f.seq)

    def install_global(self, msg: Message) -> bool:
        return self.client.install(read_global(msg, self.client.global_state))

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        """No per-sample bound (uploads are clipped whole under DP); the factor's `n` is its count: set by DP's
        public schedule, never noised (docs/privacy.md)."""
        return UploadSensitivity(count="n")

    def regret(self) -> Regret:
        r = self.client.regret()
        return Regret(r["n"], r["loss"], r["best_loss"])

    def diagnostics(self) -> dict[str, float]:
        c = self.client
        return {"refinements": float(c.n_refined), "failed_refinements": float(c.n_failed),
                "factors_in_global": float(len(c.global_state.factors))}

    def warm_up(self, x: np.ndarray) -> None:
        copy.deepcopy(self.client).predict(x)
