"""What a URK-FedBNR agent runs: the client half behind the :class:`~streamfed.algorithms.base.Learner`
contract. Order-free; the learner numbers its own uploads (statistics and chunks alike)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import ObservedClock, Regret, Update, UploadSensitivity
from streamfed.algorithms.staged import PredictThenLearn
from streamfed.algorithms.urk.wire import read_global
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["URKLearner"]


@durable("urk.URKLearner")
class URKLearner(ObservedClock, PredictThenLearn):
    """`predict` is the Bayesian last layer's predictive (mean, variance) under the current network;
    `begin_learn` predicts, `end_learn` learns (and, every `fit_every` samples, fits the network locally).

    >>> import numpy as np
    >>> from streamfed.algorithms.urk.client import URKClient
    >>> from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
    >>> arch = URKArch(n_inputs=1, widths=(), n_omega=4)
    >>> learner = URKLearner(URKClient(initial_weights(arch, 0), omega(arch, 0), "v", min_upload=2,
    ...                                learn_kernel=False))
    >>> mean, var = learner.learn(np.array([0.5]), 1.0)  # variance σ² + λ²·m/(m−1) = 0.25 + 4/3
    >>> mean, round(var, 12), learner.take_update()
    (0.0, 1.583333333333, None)
    >>> _ = learner.learn(np.array([0.6]), 1.0)
    >>> up = learner.take_update()
    >>> up.seq, up.n_samples, up.epoch
    (1, 2, 0)
    """

    @property
    def kernel_names(self) -> Sequence[str]:
        return ("urk",)

    @property
    def pending_samples(self) -> int:
        """Samples below the privacy floor `min_upload` (they never leave the device on their own)."""
        return self.client.n_pending

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        if getattr(self.client, "half_life_s", None) is not None:
            self.client.advance(self.now())
        return super().begin_learn(x, y)

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        """No per-sample bound (uploads are clipped whole under DP); with forgetting the upload's `time` is public
        (as its timing is): neither clipped nor noised."""
        if getattr(self.client, "half_life_s", None) is not None:
            return UploadSensitivity(("S_upper", "b", "n", "q", "chunk", "weight"))
        return UploadSensitivity()

    def take_update(self) -> Update | None:
        return self.client.take_update()

    def install_global(self, msg: Message) -> bool:
        return self.client.apply_global(read_global(msg))

    def regret(self) -> Regret:
        r = self.client.regret()
        return Regret(r["n"], r["loss"], r["best_loss"])

    def diagnostics(self) -> dict[str, float]:
        c = self.client
        return {"epoch": float(c.epoch), "sigma": float(c.phase2.sigma[0]), "lam": float(c.phase2.lam[0]),
                "local_fits": float(c.n_fits), "proposals": float(c.n_proposals),
                "chunks_queued": float(len(c.queue))}
