"""The baselines' :class:`~streamfed.algorithms.base.Aggregation`: their servers (`θ ← θ − ΣΔ/|C|`, plus the
fleet-wide kernel log-weights of vM/eM-KOFL) in the plug-in contract (docs/algorithms.md §3.7)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from streamfed.algorithms.base import BaseAggregation
from streamfed.algorithms.kofl.messages import KOFLUpdate
from streamfed.algorithms.kofl.server import KOFLServer
from streamfed.algorithms.pofmkl.messages import KernelUpdate, merge_updates
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.durable import durable
from streamfed.wire.message import Message

if TYPE_CHECKING:
    pass

__all__ = ["KOFLAggregation"]


@durable("kofl.KOFLAggregation")
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
