"""The baselines in the plug-in contract: a learner around their client halves, an aggregation around
their servers (`θ ← θ − ΣΔ/|C|`, plus the fleet-wide kernel log-weights of vM/eM-KOFL)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from streamfed.algorithms.base import BaseAggregation, BaseLearner, Update
from streamfed.algorithms.kofl.learner import KOFLGlobal, KOFLServer, KOFLUpdate
from streamfed.algorithms.pofmkl.agent import POFMKLLearner
from streamfed.algorithms.pofmkl.learner import GlobalTheta, KernelUpdate, POFMKLServer, merge_updates
from streamfed.wire.message import Message, writable_copy
from streamfed.wire.schema import ArraySpec, MessageSchema
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["KOFLAggregation", "KOFLLearner", "schemas"]


def schemas(name: str, n: int, m: int, dim: int, *, losses: bool, cfg: FleetConfig) -> list[MessageSchema]:
    update = [ArraySpec("kernels", "int64", ("m",), index_bound=n, distinct=True),
              ArraySpec("delta", "float64", ("m", dim))]
    glob = [ArraySpec("theta", "float64", (n, dim))]
    if losses:
        update.append(ArraySpec("losses", "float64", (n,)))
        glob += [ArraySpec("logv", "float64", (n,)), ArraySpec("chosen", "int64", ())]
    return [MessageSchema(f"{name}.update", Channel.UPDATES, tuple(update), {"m": (1, m)}),
            MessageSchema(f"{name}.global", Channel.GLOBAL, tuple(glob), max_included=cfg.max_clients),
            MessageSchema(f"{name}.partial", Channel.PARTIALS, (ArraySpec("sum", "float64", (n, dim)),))]


class KOFLLearner(POFMKLLearner):
    """A baseline client in the :class:`~streamfed.algorithms.base.Learner` contract (one upload per step;
    introspection as POF-MKL's, whose clients they mirror).

    >>> from streamfed.core.features import RFFBank, gaussian_dictionary
    >>> from streamfed.algorithms.kofl.learner import OFMKLAvgClient
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


class KOFLAggregation(BaseAggregation):
    """A baseline server in the :class:`~streamfed.algorithms.base.Aggregation` contract; a client's several
    uploads within an asynchronous window are merged (Δ summed per kernel, losses summed). The paper's baselines
    run in the replay only: not in a sharded fleet."""

    shardable = False

    def __init__(self, server: POFMKLServer | KOFLServer, name: str, *, max_abs: float = 1e100) -> None:
        self.server = server
        self.name = name
        self.max_abs = float(max_abs)
        self._heard: dict[str, list[KOFLUpdate]] = {}
        self._applied: dict[str, int] = {}

    @property
    def version(self) -> int:
        return int(self.server.version)

    def included(self) -> dict[str, int]:
        return dict(sorted(self._applied.items()))

    def check(self, msg: Message) -> KOFLUpdate:
        delta = msg.arrays["delta"]
        if delta.size and not np.abs(delta).max() <= self.max_abs:
            raise ValueError(f"a delta value is beyond ±{self.max_abs:g}")
        losses = msg.arrays.get("losses")
        return KOFLUpdate(msg.arrays["kernels"], delta, losses, msg.n_samples)

    def _add(self, u: KOFLUpdate) -> None:
        self.server.add(u if isinstance(self.server, KOFLServer) else KernelUpdate(u.kernels, u.delta, u.n_samples))

    def take(self, client: str, seq: int, item: KOFLUpdate) -> None:
        self._heard.setdefault(client, []).append(item)

    def pending(self) -> bool:
        return bool(self._heard)

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        if not self._heard:
            return False
        for c in sorted(self._heard, key=lambda c: order.get(c, len(order))):
            ups = self._heard[c]
            if len(ups) == 1:
                self._add(ups[0])
            else:
                m = merge_updates([KernelUpdate(u.kernels, u.delta, u.n_samples) for u in ups])
                losses = None if ups[0].losses is None else np.sum([u.losses for u in ups], axis=0)
                self._add(KOFLUpdate(m.kernels, m.delta, losses, m.n_samples))
            self._applied[c] = mark(c)
        self._heard.clear()
        self.server.finish_round()
        return True

    def apply_round(self, round: int, items: Sequence[tuple[str, KOFLUpdate]]) -> None:
        for c, u in items:
            self._add(u)
            self._applied[c] = max(self._applied.get(c, 0), round)
        self.server.finish_round()

    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        v = self.version
        arrays: dict[str, np.ndarray] = {"theta": self.server.theta}
        if isinstance(self.server, KOFLServer):
            arrays.update(logv=self.server.logv.copy(), chosen=np.asarray(self.server.chosen, dtype=np.int64))
        return Message(fleet, sender, f"{self.name}.global", v, v, kernel_version, 0, time.time(), arrays, {},
                       self.included())
