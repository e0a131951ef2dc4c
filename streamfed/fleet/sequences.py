"""Per-client sequence numbers at the aggregator (and shards): duplicates and replays rejected, gaps reported,
so that at-least-once delivery has an exactly-once effect.

>>> SeqTracker().record("a", 1).in_order
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from streamfed.wire.message import INT64_MAX, Reason, fail, is_int

__all__ = ["SeqCheck", "SeqTracker"]


class SeqCheck(NamedTuple):
    """What accepting a sequence number means.

    `in_order`: it is the next one (`mark + 1`); `fills_gap`: it is one of the missing seqs below the
    highest seen (arrived late);
    `new_gap`: the inclusive range it skips over (seqs never seen yet), or `None`; `dropped`: the
    inclusive range given up because the client ran more than `window` ahead, or `None`.

    >>> SeqCheck(True, False, None, None).in_order
    True
    """

    in_order: bool
    fills_gap: bool
    new_gap: tuple[int, int] | None
    dropped: tuple[int, int] | None


_NEXT = SeqCheck(True, False, None, None)  # a seq that is the client's next one, with no gap: shared (a tuple)


class SeqTracker:
    """Per-client monotonic sequence numbers: duplicates and replays are rejected, gaps reported.

    Per client it keeps `mark` (every seq `<= mark` is applied, or was given up) and the set of seqs
    applied above it (out of order, at most `window` ahead). Pure, deterministic, and serialisable with
    :meth:`to_dict` / :meth:`from_dict` for persistence. :meth:`check` only looks; :meth:`record` also
    remembers — so a caller can validate and apply an update between the two.

    >>> t = SeqTracker()
    >>> t.record("a", 1).in_order, t.record("a", 4).new_gap, t.gaps("a")
    (True, (2, 3), [(2, 3)])
    >>> t.record("a", 2).fills_gap, t.mark("a"), t.missing("a")
    (True, 2, [3])
    >>> t.check("a", 2)
    Traceback (most recent call last):
    ...
    streamfed.wire.message.ProtocolError: stale_seq: client 'a' seq 2 already applied (all <= 2 are)
    >>> SeqTracker.from_dict(t.to_dict()).to_dict() == t.to_dict()
    True
    """

    def __init__(self, window: int = 1024, first_seq: int = 1) -> None:
        if window < 1 or first_seq < 0:
            raise ValueError(f"window must be >= 1 and first_seq >= 0, got {window}, {first_seq}")
        self.window = int(window)
        self.first_seq = int(first_seq)
        self._mark: dict[str, int] = {}
        self._above: dict[str, set[int]] = {}

    def mark(self, client: str) -> int:
        """Every seq up to this one is applied (or given up); `first_seq - 1` for an unknown client."""
        return self._mark.get(client, self.first_seq - 1)

    def highest(self, client: str) -> int:
        """The highest seq applied (`mark` when nothing arrived out of order)."""
        above = self._above.get(client)
        return max(above) if above else self.mark(client)

    def missing(self, client: str) -> list[int]:
        """Seqs between `mark` and `highest` not received yet, ascending."""
        above = self._above.get(client, set())
        return [s for s in range(self.mark(client) + 1, self.highest(client)) if s not in above]

    def gaps(self, client: str) -> list[tuple[int, int]]:
        """:meth:`missing` as inclusive ranges."""
        out: list[tuple[int, int]] = []
        for s in self.missing(client):
            if out and out[-1][1] == s - 1:
                out[-1] = (out[-1][0], s)
            else:
                out.append((s, s))
        return out

    @property
    def clients(self) -> list[str]:
        return sorted(self._mark)

    def has(self, client: str, seq: int) -> bool:
        """Whether `seq` is applied (at or below the mark, or recorded above it): :meth:`check` would
        refuse it as `stale_seq`. No exception, no validation: for seqs already known to be integers."""
        if seq <= self._mark.get(client, self.first_seq - 1):
            return True
        above = self._above.get(client)
        return above is not None and seq in above

    def adopt(self, client: str, mark: int) -> None:
        """Start a client not known yet at `mark` (everything up to it given up): a server that lost its state
        takes each client from where it is instead of waiting for seqs the client no longer holds.

        >>> t = SeqTracker()
        >>> t.adopt("a", 5000); t.record("a", 5001).in_order
        True
        """
        if client in self._mark or client in self._above:
            raise ValueError(f"client {client!r} is already known")
        self._mark[client] = int(mark)

    def check(self, client: str, seq: int) -> SeqCheck:
        """What :meth:`record` would report, without changing anything; `ProtocolError` (`stale_seq`)
        for a seq already applied or below the mark, (`bad_seq`) for a non-integer."""
        if not is_int(seq) or not 0 <= seq <= INT64_MAX:
            raise fail(Reason.BAD_SEQ, f"seq must be an integer in [0, 2^63), got {seq!r}")
        mark = self._mark.get(client, self.first_seq - 1)
        if seq == mark + 1 and self.window >= 1 and client not in self._above:
            return _NEXT  # the common case: the next one, nothing above it (what the walk below finds)
        above = self._above.get(client, set())
        if seq <= mark:
            raise fail(Reason.STALE_SEQ, f"client {client!r} seq {seq} already applied (all <= {mark} are)")
        if seq in above:
            raise fail(Reason.STALE_SEQ, f"client {client!r} seq {seq} is a duplicate")
        highest = max(above) if above else mark
        new_gap = (highest + 1, seq - 1) if seq > highest + 1 else None
        fills_gap = seq < highest  # it was one of the missing seqs
        dropped = None
        if seq - mark > self.window:
            dropped = (mark + 1, seq - self.window)
            if new_gap is not None:  # the part of the new gap that is dropped at once is not a gap
                lo = max(new_gap[0], seq - self.window + 1)
                new_gap = (lo, new_gap[1]) if lo <= new_gap[1] else None
        return SeqCheck(seq == mark + 1, fills_gap, new_gap, dropped)

    def record(self, client: str, seq: int) -> SeqCheck:
        """Check `seq` and remember it as applied."""
        return self.commit(client, seq, self.check(client, seq))

    def commit(self, client: str, seq: int, result: SeqCheck) -> SeqCheck:
        """Remember `seq` as applied, `result` being what :meth:`check` said of it just now (nothing
        recorded for `client` since): :meth:`record` without checking twice."""
        if result.in_order and client not in self._above:  # the common case: the next one, no gaps
            self._mark[client] = seq
            return result
        mark = self.mark(client)
        above = self._above.setdefault(client, set())
        if result.dropped is not None:
            mark = result.dropped[1]
            above.difference_update([s for s in above if s <= mark])
        above.add(seq)
        while mark + 1 in above:
            mark += 1
            above.discard(mark)
        self._mark[client] = mark
        if not above:
            del self._above[client]
        return result

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/msgpack-able state."""
        return {
            "window": self.window,
            "first_seq": self.first_seq,
            "clients": {c: {"mark": m, "above": sorted(self._above.get(c, ()))}
                        for c, m in sorted(self._mark.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeqTracker:
        """Inverse of :meth:`to_dict` (`ValueError` for inconsistent state)."""
        t = cls(int(data["window"]), int(data["first_seq"]))
        for c, st in dict(data["clients"]).items():
            mark, above = int(st["mark"]), {int(s) for s in st["above"]}
            if any(s <= mark + 1 or s > mark + t.window for s in above):
                raise ValueError(f"inconsistent tracker state for client {c!r}")
            t._mark[str(c)] = mark
            if above:
                t._above[str(c)] = above
        return t
