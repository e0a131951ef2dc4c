"""The window of an order-free statistics server, shared by the aggregations that sum uploads (FedBNR,
personalised FedBNR, FSGP): `server.apply` sums an upload once (buffering out-of-order ones), and a window
that summed something publishes (`server.publish`) when it closes.

>>> class Server:
...     def __init__(self): self.sums, self.globals = 0, 0
...     def apply(self, up): self.sums += 1; return True
...     def publish(self): self.globals += 1
>>> class Agg(SummingWindow):
...     def __init__(self): self.server = Server()
>>> agg = Agg(); agg.take("a", 1, object()); agg.close_window({}, lambda c: 0), agg.close_window({}, lambda c: 0)
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamfed.algorithms.base import BaseAggregation

__all__ = ["SummingWindow"]


class SummingWindow(BaseAggregation):
    """The window of an order-free statistics server (`server.apply` sums an upload once, buffering
    out-of-order ones; `server.publish` makes the next global; `server.version`, `server.included`): a window
    that summed something publishes when it closes."""

    server: Any
    _dirty: bool = False  # something summed since the last global

    @property
    def version(self) -> int:
        return int(self.server.version)

    def included(self) -> dict[str, int]:
        """Per client, every seq up to this one is in the sums (the server's own map)."""
        return dict(self.server.included)

    def take(self, client: str, seq: int, item: Any) -> None:
        if self.server.apply(item):
            self._dirty = True

    def pending(self) -> bool:
        return self._dirty

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        if not self._dirty:
            return False
        self.server.publish()
        self._dirty = False
        return True

    def apply_round(self, round: int, items: Sequence[tuple[str, Any]]) -> None:
        for client, up in items:  # sequence numbers come from the uploads themselves
            self.take(client, up.seq, up)
        self.close_window({}, lambda c: 0)
