"""What an FSGP agent runs (docs/algorithms.md, "FSGP"): the client half behind the
:class:`~streamfed.algorithms.base.Learner` contract. Order-free; the learner numbers its own uploads and
keeps them until a global includes them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import ObservedClock, Regret, Update, UploadSensitivity
from streamfed.algorithms.fsgp.client import finite_target
from streamfed.algorithms.fsgp.wire import read_global, update_arrays
from streamfed.algorithms.staged import PredictThenLearn
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["FSGPLearner"]


@durable("fsgp.FSGPLearner")
class FSGPLearner(ObservedClock, PredictThenLearn):
    """`predict` is the sparse-GP predictive (mean, variance); `begin_learn` predicts (and checks the
    target), `end_learn` makes the rank-one update, so a prediction is published before the `O(M²)` work.

    >>> import numpy as np
    >>> from streamfed.algorithms.fsgp.client import FSGPClient
    >>> from streamfed.algorithms.fsgp.kernels import Hyper
    >>> h = Hyper.initial("se", np.array([[0.0], [1.0]]))
    >>> learner = FSGPLearner(FSGPClient(h, min_upload=2, learn_hyperparameters=False))
    >>> learner.learn(np.array([0.5]), 1.0), learner.take_update()
    ((0.0, 1.25), None)
    >>> _ = learner.learn(np.array([0.6]), 1.0)
    >>> up = learner.take_update()
    >>> up.seq, up.n_samples, up.epoch, float(up.arrays["weight"])
    (1, 2, 0, 0.0)
    """

    @property
    def kernel_names(self) -> Sequence[str]:
        return (self.client.hyper.kind,)

    @property
    def pending_samples(self) -> int:
        """Samples below the privacy floor `min_upload` (they never leave the device on their own)."""
        return self.client.n_pending

    def _target(self, y: float) -> float:
        return finite_target(y)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        if getattr(self.client, "discount", None) is not None:
            y = self._target(y)  # a bad label moves no clock
            self.client.advance(self.now())
        return super().begin_learn(x, y)

    def take_update(self) -> Update | None:
        up = self.client.make_upload()
        if up is None:
            return None
        # with forgetting n is discounted: n_samples (what rate limits charge) is the raw count
        count = up.count if up.count else int(up.stats.n)
        return Update(update_arrays(up, self.client.hyper.d), count, int(up.base_version), seq=up.seq,
                      epoch=up.epoch)

    def install_global(self, msg: Message) -> bool:
        return self.client.apply_global(read_global(msg, self.client.hyper.kind))

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        """No per-sample bound (uploads are clipped whole under DP); the statistics' `n` is their count: set by DP's
        public schedule, never noised — the aggregator checks it against `n_samples` (docs/privacy.md). With
        forgetting the upload's `time` is public too (as its timing is): neither clipped nor noised."""
        if getattr(self.client, "discount", None) is not None:
            return UploadSensitivity(("P_upper", "r", "q", "theta", "log_sigma", "Z", "weight"), count="n")
        return UploadSensitivity(count="n")

    def regret(self) -> Regret:
        r = self.client.regret()
        return Regret(r["n"], r["loss"], r["best_loss"])

    def diagnostics(self) -> dict[str, float]:
        """The version, `σ`, local fits, clamped carries; personalised, also the experts' mixture weights
        (`mixture_weight_global`, `mixture_weight_own`) and each expert's prequential MSE."""
        c = self.client
        out = {"epoch": float(c.epoch), "sigma": c.hyper.sigma, "local_fits": float(c.n_fits),
               "carried_clamped": float(getattr(c, "n_clamped", 0))}
        if getattr(c, "personal", False):
            wg, wo = c.mixture_weights()
            out.update({"mixture_weight_global": wg, "mixture_weight_own": wo})
            if c.n > 0:
                out.update({"expert_mse_global": c.expert_loss[0] / c.n, "expert_mse_own": c.expert_loss[1] / c.n})
        return out
