"""Summed statistics: the wire and the server half of a family whose update is a sum of arrays.

Many families upload sums over their new samples (FedBNR its `S, b, n, q`; a federated mean `Σy` and a count)
and the server's global is the sum over every upload, applied once and in each client's seq order
(:func:`~streamfed.algorithms.in_order.apply_in_order`), published when a window closes
(:class:`~streamfed.algorithms.summing_window.SummingWindow`); a shard's partial is the sum of its uploads, and
the reducer adds partials. A :class:`SummedStatistics` spec — the arrays' names and shapes — gives all of it:
the three message kinds (:meth:`SummedStatistics.schemas`), the learner's :class:`~streamfed.algorithms.base.Update`
and the reading of a global, and :class:`SummedAggregation`, whose `check`, `take`, `partial`, `read_partial`,
`apply_partial` and `global_message` follow from the spec. A family adds only the arrays its global derives from
the sums (:meth:`SummedAggregation.derived`).

>>> from streamfed.fleet.config import FleetConfig
>>> spec = SummedStatistics("demo", {"sum": ()})
>>> [s.kind for s in spec.schemas(FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=1))]
['demo.update', 'demo.global', 'demo.partial']
>>> agg = SummedAggregation(spec)
>>> up = spec.update({"sum": 3.0}, 2, global_version=0)
>>> msg = Message("f", "a", "demo.update", 1, 0, "", 2, 0.0, dict(up.arrays))
>>> agg.take("a", 1, agg.check(msg)); agg.close_window({}, lambda c: 0)
True
>>> g = agg.global_message("f", "agg", "")
>>> float(g.arrays["sum"]), float(g.arrays["count"]), g.included
(3.0, 2.0, {'a': 1})
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from streamfed.algorithms.base import NonFiniteError, Update
from streamfed.algorithms.in_order import apply_in_order, check_room
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.core.durable import durable
from streamfed.wire.message import Message
from streamfed.wire.schema import ArraySpec, MessageSchema, MetaSpec, contributor_arrays, contributor_dims
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = ["SummedAggregation", "SummedItem", "SummedStatistics", "Sums"]

MAX_WHOLE = 2.0**53  # beyond this a float no longer counts samples exactly


@durable("algorithms.Sums")
class Sums(dict):  # type: ignore[type-arg]
    """Array name → summed float64 array; `+` adds two (what the reducer does with partials).

    >>> (Sums(a=np.ones(2), count=np.asarray(1.0)) + Sums(a=np.ones(2), count=np.asarray(2.0)))["a"].tolist()
    [2.0, 2.0]
    """

    def __add__(self, other: Mapping[str, np.ndarray]) -> Sums:  # type: ignore[override]
        return Sums({k: self[k] + other[k] for k in self})


@durable("algorithms.SummedStatistics")
@dataclass(frozen=True)
class SummedStatistics:
    """The spec of a summed-statistics family: its name (the kinds are `<family>.update`, `.global` and `.partial`),
    the arrays summed (`name → shape`, float64), the array counting samples (`count`: a whole number, at least 1
    in an update) and the arrays the global derives from the sums (`derived`, `name → shape`)."""

    family: str
    sums: Mapping[str, tuple[int, ...]]
    derived: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    count: str = "count"

    @property
    def kinds(self) -> tuple[str, str, str]:
        return f"{self.family}.update", f"{self.family}.global", f"{self.family}.partial"

    def _specs(self, count: ArraySpec) -> tuple[ArraySpec, ...]:
        return (*(ArraySpec(n, "float64", tuple(s)) for n, s in self.sums.items()), count)

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        """Its three message kinds: the sums and a positive count on `updates`; the derived arrays, the sums and
        the count on `global`; the sums, the count and the contributors on `partials`."""
        update, glob, partial = self.kinds
        one = self._specs(ArraySpec(self.count, "float64", (), positive=True))
        derived = tuple(ArraySpec(n, "float64", tuple(s)) for n, s in self.derived.items())
        return [
            MessageSchema(update, Channel.UPDATES, one),
            MessageSchema(glob, Channel.GLOBAL, derived + self._specs(ArraySpec(self.count, "float64", (),
                                                                                nonnegative=True)),
                          max_included=cfg.max_clients),
            MessageSchema(partial, Channel.PARTIALS, one + contributor_arrays(), contributor_dims(cfg),
                          meta=(MetaSpec("round"),), max_included=cfg.max_clients),
        ]

    def zeros(self) -> Sums:
        return Sums({**{n: np.zeros(s) for n, s in self.sums.items()}, self.count: np.zeros(())})

    # ---------------------------------------------------------------- the learner's side
    def update(self, sums: Mapping[str, Any], count: int, global_version: int, seq: int | None = None) -> Update:
        """An upload of `sums` over `count` samples, computed against global `global_version`."""
        arrays = {n: np.asarray(sums[n], dtype=np.float64).reshape(s) for n, s in self.sums.items()}
        arrays[self.count] = np.asarray(float(count))
        return Update(arrays, int(count), int(global_version), seq)

    def read_global(self, msg: Message, version: int) -> dict[str, np.ndarray] | None:
        """The arrays of a global newer than `version` (None for one that is not); `ValueError` for another kind,
        :class:`NonFiniteError` for a non-finite value."""
        if msg.kind != self.kinds[1]:
            raise ValueError(f"expected a {self.kinds[1]!r} message, got {msg.kind!r}")
        if msg.global_version <= version:
            return None
        out = {k: np.array(v, dtype=np.float64) for k, v in msg.arrays.items()}
        for k, v in out.items():
            if not np.isfinite(v).all():
                raise NonFiniteError(f"global {k!r}")
        return out

    # ---------------------------------------------------------------- the server's side
    def read(self, arrays: Mapping[str, np.ndarray], max_abs: float) -> Sums:
        """Checked sums: every value finite and within `±max_abs`, the count a whole number of samples >= 1."""
        out = Sums()
        for n, s in self.sums.items():
            a = np.array(arrays[n], dtype=np.float64).reshape(s)
            if not (np.isfinite(a).all() and (a.size == 0 or float(np.max(np.abs(a))) <= max_abs)):
                raise ValueError(f"{n} is not finite or beyond ±{max_abs:g}")
            out[n] = a
        c = float(arrays[self.count])
        if not (1.0 <= c <= MAX_WHOLE and c == math.floor(c)):
            raise ValueError(f"{self.count} = {c!r} is not a positive whole number")
        out[self.count] = np.asarray(c)
        return out


@durable("algorithms.SummedItem")
@dataclass(frozen=True)
class SummedItem:
    """A checked upload: seq `seq` of `client`, its sums."""

    client: str
    seq: int
    sums: Sums


@durable("algorithms.SumServer")
class SumServer:
    """The running sums (every upload once, in each client's seq order) and the last published ones."""

    def __init__(self, spec: SummedStatistics, max_buffered: int) -> None:
        self.spec = spec
        self.max_buffered = int(max_buffered)
        self.sums = spec.zeros()
        self.included: dict[str, int] = {}
        self.held: dict[str, dict[int, SummedItem]] = {}  # uploads waiting for an earlier seq
        self.version = 0
        self.published, self.published_included = spec.zeros(), {}

    def apply(self, item: SummedItem) -> bool:
        return apply_in_order(self.included, self.held, item.client, item.seq, item, self._add, self.max_buffered)

    def _add(self, item: SummedItem) -> None:
        self.sums = self.sums + item.sums

    def publish(self) -> None:
        self.version += 1
        self.published, self.published_included = Sums(self.sums), dict(self.included)


@durable("algorithms.SummedAggregation")
class SummedAggregation(SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of a summed-statistics family (`spec`; the class
    attribute `statistics` for a subclass that fixes it). Values beyond `±max_abs` are refused; at most
    `max_buffered` uploads of a client wait for an earlier seq. A subclass adds the derived arrays of its
    global (:meth:`derived`)."""

    statistics: ClassVar[SummedStatistics | None] = None

    def __init__(self, spec: SummedStatistics | None = None, *, max_abs: float = 1e100, max_buffered: int = 64) -> None:
        spec = spec or self.statistics
        if spec is None:
            raise ValueError("a SummedAggregation needs its SummedStatistics spec")
        self.spec = spec
        self.max_abs = float(max_abs)
        self.server = SumServer(spec, max_buffered)
        self._dirty = False

    def derived(self, sums: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The global's arrays beyond the sums, from the published sums (default: none)."""
        return {}

    def check(self, msg: Message) -> SummedItem:
        sums = self.spec.read(msg.arrays, self.max_abs)
        if msg.n_samples != float(sums[self.spec.count]):
            raise ValueError(f"n_samples {msg.n_samples} but {self.spec.count} {float(sums[self.spec.count]):g}")
        s = self.server
        check_room(s.included, s.held, msg.client, int(msg.seq), s.max_buffered)
        return SummedItem(msg.client, int(msg.seq), sums)

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[SummedItem]) -> tuple[dict[str, np.ndarray], int, int]:
        total = self.spec.zeros()
        for item in items:
            total = total + item.sums
        return dict(total), int(total[self.spec.count]), 0

    def read_partial(self, msg: Message) -> Sums:
        return self.spec.read(msg.arrays, self.max_abs)

    checks_sums = True

    def check_sum(self, total: Sums, n_samples: int) -> None:
        """The count of a sum is what its members said in the clear (each upload's count is its `n_samples`)."""
        if float(total[self.spec.count]) != float(n_samples):
            raise ValueError(f"the sum counts {self.spec.count} = {float(total[self.spec.count]):g}, its members said "
                             f"{n_samples}")

    def apply_partial(self, total: Sums, n_clients: int, included: Mapping[str, int]) -> None:
        self.server.sums = self.server.sums + total
        self.server.included = dict(included)
        self.server.publish()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        s = self.server
        sums = s.published
        arrays = {**self.derived(sums), **sums}
        return Message(fleet, sender, self.spec.kinds[1], s.version, s.version, kernel_version,
                       int(sums[self.spec.count]), time.time(), arrays, {}, dict(s.published_included), 0)
