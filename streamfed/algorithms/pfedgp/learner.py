"""What a pFedGP agent runs: the client half behind the :class:`~streamfed.algorithms.base.Learner` contract.

The contract's prediction is `(mean, variance)` of a number; a classifier's is the most probable class as the
"mean" and no variance. Its class probabilities are read through the optional `class_probabilities(x)`
(and `n_classes`) — it declares `classifier` — which a shell that knows classification can publish and score
(accuracy, log loss, calibration).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import Regret, Update
from streamfed.algorithms.pfedgp.client import PFedGPClient
from streamfed.algorithms.pfedgp.wire import read_global
from streamfed.algorithms.staged import PredictThenLearn
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["PFedGPLearner"]


@durable("pfedgp.PFedGPLearner")
class PFedGPLearner(PredictThenLearn):
    """`predict` is `(most probable class, None)`; `class_probabilities` the whole vector; `begin_learn`
    predicts (and stages the probabilities), `end_learn` learns.

    >>> from streamfed.algorithms.urk.network import URKArch
    >>> from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
    >>> layout = Layout(URKArch(n_inputs=1, widths=(), n_omega=4))
    >>> learner = PFedGPLearner(PFedGPClient(layout, initial_theta(layout, 0), omega_of(layout, 0), n_classes=2,
    ...                                      learn_kernel=False))
    >>> learner.learn(np.array([0.5]), 1.0), learner.take_update()
    ((0.0, None), None)
    >>> learner.predict(np.array([0.5])), learner.class_probabilities(np.array([0.5])).round(6).tolist()
    ((1.0, None), [1e-06, 0.999999])
    """

    classifier = True

    def __init__(self, client: PFedGPClient) -> None:
        super().__init__(client)
        self.last_probabilities: np.ndarray | None = None  # of the last prediction made while learning

    @property
    def n_classes(self) -> int:
        return self.client.n_classes

    @property
    def kernel_names(self) -> Sequence[str]:
        return ("pfedgp",)

    def class_probabilities(self, x: np.ndarray) -> np.ndarray:
        return self.client.predict(x)

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return float(np.argmax(self.client.predict(x))), None

    def _target(self, y: float) -> float:
        from streamfed.algorithms.pfedgp.client import class_label

        class_label(y, self.client.n_classes)  # refuse a bad label before anything is staged
        return float(y)

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        y = self._target(y)
        p = self.client.predict(x)  # the class probabilities are what the client's learn takes
        self._stage(x, y, p)
        self.last_probabilities = p
        return float(np.argmax(p)), None

    def take_update(self) -> Update | None:
        return self.client.take_update()

    def install_global(self, msg: Message) -> bool:
        return self.client.apply_global(read_global(msg))

    def regret(self) -> Regret:
        r = self.client.regret()
        return Regret(r["n"], r["loss"], r["best_loss"])

    def diagnostics(self) -> dict[str, float]:
        c = self.client
        return {"epoch": float(c.epoch), "accuracy": c.correct / c.n if c.n else 0.0,
                "log_loss": c.loss / c.n if c.n else 0.0, "classes_seen": float(len(c.budget.classes)),
                "budget": float(len(c.budget)), "local_fits": float(c.n_fits), "proposals": float(c.n_proposals),
                "chunks_queued": float(len(c.queue))}
