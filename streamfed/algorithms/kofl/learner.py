"""The baselines' :class:`~streamfed.algorithms.base.Learner`: POF-MKL's learner around their client halves
(docs/algorithms.md §3.7)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.base import BaseLearner, Update
from streamfed.algorithms.kofl.messages import KOFLGlobal, KOFLUpdate
from streamfed.algorithms.pofmkl.learner import POFMKLLearner
from streamfed.algorithms.pofmkl.messages import GlobalTheta
from streamfed.core.durable import durable
from streamfed.wire.message import Message, writable_copy

if TYPE_CHECKING:
    pass

__all__ = ["KOFLLearner"]


@durable("kofl.KOFLLearner")
class KOFLLearner(POFMKLLearner):
    """A baseline client in the :class:`~streamfed.algorithms.base.Learner` contract (one upload per step;
    introspection as POF-MKL's, whose clients they mirror).

    >>> from streamfed.core.features import RFFBank, gaussian_dictionary
    >>> from streamfed.algorithms.kofl.client import OFMKLAvgClient
    >>> learner = KOFLLearner(OFMKLAvgClient(RFFBank(gaussian_dictionary(2), 3, 1, seed=0)))
    >>> learner.learn(np.zeros(1), 1.0), learner.take_update().n_numbers
    ((0.0, None), 12)
    """

    def __init__(self, client: Any) -> None:
        super().__init__(client, "lockstep")  # every step's update is the upload: no error feedback
        self._step: KOFLUpdate | None = None  # type: ignore[assignment]
        self._version = 0

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        yhat, self._step = self.client.step(x, y)
        self._version = self.global_version
        return yhat, None

    end_learn = BaseLearner.end_learn  # one fused step: no error feedback to add to
    diagnostics = BaseLearner.diagnostics  # the baselines' clients count no kernel overflows (POF-MKL's do)
    warm_up = BaseLearner.warm_up  # a step on a copy (POF-MKL's installs a θ-only global)

    def take_update(self) -> Update | None:
        u, self._step = self._step, None
        if u is None:
            return None
        arrays = {"kernels": u.kernels, "delta": u.delta}
        if u.losses is not None:
            arrays["losses"] = u.losses
        return Update(arrays, int(u.n_samples), self._version)

    def install_global(self, msg: Message) -> bool:
        theta = GlobalTheta.of(msg.arrays["theta"])
        if "logv" in msg.arrays:
            params: Any = KOFLGlobal(theta, writable_copy(msg.arrays["logv"], "float64"), int(msg.arrays["chosen"]))
        else:
            params = theta
        self.client.set_global(params, msg.global_version)
        return True
