"""The prequential step most client halves share: predict and stage at `begin_learn`, learn at `end_learn`.

An agent publishes its prediction between the two calls, so the learner must predict first and learn only
when told; a client whose `learn(x, y, prediction)` takes the prediction it made needs nothing more. Used by
FSGP, URK-FedBNR, PVI and pFedGP (which stages its class probabilities instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfed.algorithms.base import BaseLearner

__all__ = ["PredictThenLearn"]


class PredictThenLearn(BaseLearner):
    """The :class:`~streamfed.algorithms.base.BaseLearner` of a family with a `client` whose `predict(x)` gives
    what `learn(x, y, prediction)` takes.

    `_target(y)` checks the label before anything is staged (default: `float(y)`).

    >>> class Client:
    ...     def predict(self, x): return (float(x.sum()), 1.0)
    ...     def learn(self, x, y, pred): self.seen = (y, pred)
    >>> lr = PredictThenLearn(Client())
    >>> lr.begin_learn(np.array([1.0, 2.0]), 4)
    (3.0, 1.0)
    >>> lr.end_learn(); lr.client.seen
    (4.0, (3.0, 1.0))
    """

    client: Any
    _staged: tuple[np.ndarray, float, Any] | None

    def __init__(self, client: Any) -> None:
        self.client = client
        self._staged = None

    # what the contract asks of every such learner, read from its client (a family overrides what differs)
    @property
    def global_version(self) -> int:
        return int(self.client.global_version)

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self.client.predict(x)

    def _target(self, y: float) -> float:
        return float(y)

    def _stage(self, x: np.ndarray, y: float, prediction: Any) -> None:
        self._staged = (np.array(x, dtype=np.float64), y, prediction)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        y = self._target(y)
        pred = self.client.predict(x)
        self._stage(x, y, pred)
        return pred

    def end_learn(self) -> None:
        if self._staged is not None:
            x, y, pred = self._staged
            self._staged = None
            self.client.learn(x, y, pred)
