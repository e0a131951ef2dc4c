"""What a POF-MKL agent runs: the client half plus error feedback (docs/algorithms.md §3).

In lock-step mode every step's update is the upload (seq `t + 1` for sample `t`, as in the paper). In
asynchronous mode the per-kernel deltas accumulate in an :class:`ErrorFeedback` buffer and each upload
carries at most `M` kernels — the largest accumulated ones — the rest is carried forward: no update mass is
ever dropped and an upload never exceeds `M·2D` numbers.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import BaseLearner, Mode, NonFiniteError, Regret, Update
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.messages import GlobalTheta, KernelUpdate
from streamfed.algorithms.pofmkl.wire import global_theta
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["ErrorFeedback", "POFMKLLearner"]

log = logging.getLogger(__name__)


@durable("pofmkl.ErrorFeedback")
class ErrorFeedback:
    """Per-kernel accumulated deltas; :meth:`take` removes at most `M` kernels (largest first).

    Invariant: everything added = everything taken + :attr:`residual` (exactly, up to the rounding of
    the additions).

    >>> ef = ErrorFeedback(n_kernels=3, dim=2, bin_size=1)
    >>> ef.add(KernelUpdate(np.array([0, 2]), np.array([[1.0, 0.0], [3.0, 0.0]])))
    >>> ef.take().kernels.tolist(), ef.take().kernels.tolist(), ef.take()
    ([2], [0], None)
    """

    def __init__(self, n_kernels: int, dim: int, bin_size: int) -> None:
        self.residual = np.zeros((n_kernels, dim))
        # ‖residual_p‖² per kernel, kept up to date as rows change (a take then reads N numbers, not N·2D)
        self.norms = np.zeros(n_kernels)
        self.bin_size = bin_size
        self._samples = 0

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "norms" not in state:  # pickled before the norms were kept
            self.norms = np.einsum("pi,pi->p", self.residual, self.residual)

    def add(self, update: KernelUpdate) -> None:
        k = update.kernels
        if k.shape[0] == 1:  # one kernel (M = 1): plain row operations, no fancy indexing
            row = self.residual[int(k[0])]
            row += update.delta[0]
            self.norms[int(k[0])] = row @ row
        else:
            self.residual[k] += update.delta
            rows = self.residual[k]
            self.norms[k] = np.einsum("pi,pi->p", rows, rows)
        self._samples += update.n_samples

    def pending(self) -> bool:
        return bool(np.any(self.residual))

    def take(self) -> KernelUpdate | None:
        norms = self.norms
        if self.bin_size == 1:  # the common case: the largest row (the first of equal ones)
            p = int(norms.argmax())
            if not norms[p] > 0.0:
                return None
            delta = self.residual[p : p + 1].copy()
            self.residual[p] = 0.0
            norms[p] = 0.0
            n, self._samples = self._samples, 0
            return KernelUpdate(np.array([p], dtype=np.int64), delta, max(n, 1))
        else:
            nonzero = np.flatnonzero(norms)
            if nonzero.size == 0:
                return None
            chosen = np.sort(nonzero[np.argsort(-norms[nonzero], kind="stable")[: self.bin_size]]).astype(np.int64)
        delta = self.residual[chosen]  # fancy indexing: a copy
        self.residual[chosen] = 0.0
        norms[chosen] = 0.0
        n, self._samples = self._samples, 0  # samples summarised since the last take
        return KernelUpdate(chosen, delta, max(n, 1))


@durable("pofmkl.POFMKLLearner")
class POFMKLLearner(BaseLearner):
    """The :class:`~streamfed.algorithms.base.Learner` of POF-MKL.

    >>> from streamfed.core.features import RFFBank, gaussian_dictionary
    >>> bank = RFFBank(gaussian_dictionary(4), n_features=5, n_inputs=2, seed=0)
    >>> learner = POFMKLLearner(POFMKLClient(bank, bin_size=1, rng=0), mode="async")
    >>> learner.learn(np.array([0.1, 0.2]), 0.5)
    (0.0, None)
    >>> up = learner.take_update()
    >>> up.arrays["delta"].shape, up.n_samples, learner.take_update()
    ((1, 10), 1, None)
    """

    def __init__(self, client: POFMKLClient, mode: Mode = "async") -> None:
        self.client = client
        self.mode: Mode = mode
        bank = client.bank
        self.ef = ErrorFeedback(bank.n_kernels, bank.dim, client.bin_size) if mode == "async" else None
        self._step: KernelUpdate | None = None  # the last step's update (lock-step: the next upload)
        self._step_version = 0  # the global the last step saw
        self._overflow_steps = 0  # steps in which a kernel's loss overflowed (for rate-limited logging)

    # ---------------------------------------------------------------- introspection
    @property
    def global_version(self) -> int:
        return int(self.client.global_version)

    @property
    def kernel_names(self) -> Sequence[str]:
        return self.client.bank.kernel_names

    @property
    def kernel_weights(self) -> np.ndarray:
        return self.client.kernel_weights

    def regret(self) -> Regret:
        c = self.client
        losses = c.kernel_losses
        return Regret(float(c.n_steps), c.cumulative_loss, float(losses.min()), int(np.argmin(losses)))

    def diagnostics(self) -> dict[str, float]:
        """Its kernel weights are exported as such; besides, how many per-kernel losses overflowed (a
        runaway kernel, taken at weight ~0 instead of refusing the sample: docs/algorithms.md §3)."""
        return {"kernel_overflows": float(self.client.kernel_overflows)}

    # ---------------------------------------------------------------- learning
    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self.client.predict(x), None

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        # predict and update are one fused step (predicting alone costs as much)
        before = self.client.kernel_overflows
        yhat, update = self.client.step(x, y)
        self._step, self._step_version = update, self.global_version
        if self.client.kernel_overflows != before:
            self._say_overflow()
        return yhat, None

    def _say_overflow(self) -> None:
        n = self.client.kernel_overflows
        self._overflow_steps = getattr(self, "_overflow_steps", 0) + 1  # (states pickled before it existed)
        if self._overflow_steps <= 3 or self._overflow_steps % 1000 == 0:  # loud, but not one line a sample
            log.warning("a kernel's loss overflowed (%d so far): taken at weight ~0 until the aggregator resets "
                        "it; see streamfed_agent_learner_value{name=\"kernel_overflows\"}", n)

    def end_learn(self) -> None:
        if self.ef is not None and self._step is not None:
            self.ef.add(self._step)
            self._step = None

    def take_update(self) -> Update | None:
        if self.ef is None:  # lock-step: this step's update, as it is
            update, self._step = self._step, None
        else:
            update = self.ef.take()
        return None if update is None else self._upload(update)

    def flush(self) -> list[Update]:
        out = []
        while self.ef is not None and (update := self.ef.take()) is not None:
            out.append(self._upload(update))
        return out

    def _upload(self, update: KernelUpdate) -> Update:
        return Update({"kernels": update.kernels, "delta": update.delta}, int(update.n_samples), self._step_version)

    # ---------------------------------------------------------------- the global
    def install_global(self, msg: Message) -> bool:
        theta, version = global_theta(msg)
        # finite entries are not enough: ‖θ_p‖² enters every loss, and must not overflow either
        if not np.isfinite(np.einsum("pi,pi->p", theta, theta)).all():
            raise NonFiniteError("global theta: a squared row norm overflows")
        self.client.set_global(theta, version)
        return True

    def warm_up(self, x: np.ndarray) -> None:
        twin = copy.deepcopy(self.client)
        twin.predict(x)
        twin.step(x, 0.0)
        twin.set_global(GlobalTheta.of(twin.theta), 1)  # what installing a global runs
