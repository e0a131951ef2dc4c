"""Splitting a long float vector into bounded chunks and putting it back together, inside the plug-in contract
(URK-FedBNR's network proposals; pFedGP's network too).

A learner turns one vector into `count` :class:`Chunk`\\ s, each at most `max_numbers` long, numbered
`(seq, index, count)`; it sends one per upload. The aggregation feeds what arrives to a :class:`Reassembly`,
which keeps the pieces per `(client, seq)` and hands out the whole vector exactly once, when the last missing
piece arrives — whatever the order, however often a piece is repeated. A vector counts only with all its chunks.

>>> parts = split_vector(7, np.arange(5.0), max_numbers=2)
>>> [(c.seq, c.index, c.count, c.data.tolist()) for c in parts]
[(7, 0, 3, [0.0, 1.0]), (7, 1, 3, [2.0, 3.0]), (7, 2, 3, [4.0])]
>>> r = Reassembly()
>>> [r.add("a", c) for c in (parts[2], parts[0], parts[0])]
[None, None, None]
>>> r.add("a", parts[1]).tolist(), r.add("a", parts[1])
([0.0, 1.0, 2.0, 3.0, 4.0], None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamfed.core.durable import durable

__all__ = ["Chunk", "Reassembly", "chunk_count", "split_vector"]


@durable("algorithms.Chunk")
@dataclass(frozen=True)
class Chunk:
    """Piece `index` of `count` of the vector its sender numbered `seq`; `total` is the whole vector's length
    (every chunk says it, so a receiver can check a piece before the others arrive).

    >>> Chunk(1, 0, 1, 2, np.zeros(2)).data.shape
    (2,)
    """

    seq: int
    index: int
    count: int
    total: int
    data: np.ndarray

    def __post_init__(self) -> None:
        if not (self.seq >= 0 and 0 <= self.index < self.count and self.total >= self.count >= 1):
            raise ValueError(f"chunk {self.index} of {self.count} (seq {self.seq}, {self.total} numbers)")
        if np.ndim(self.data) != 1 or np.size(self.data) == 0:
            raise ValueError("a chunk carries a non-empty 1-D array")


def chunk_count(total: int, max_numbers: int) -> int:
    """How many chunks of at most `max_numbers` a vector of `total` numbers takes."""
    if total < 1 or max_numbers < 1:
        raise ValueError(f"total and max_numbers must be >= 1, got {total}, {max_numbers}")
    return math.ceil(total / max_numbers)


def split_vector(seq: int, vector: np.ndarray, max_numbers: int) -> list[Chunk]:
    """`vector` (1-D, finite) as consecutive chunks of at most `max_numbers` numbers each (copies)."""
    v = np.asarray(vector, dtype=np.float64).ravel()
    if not np.all(np.isfinite(v)):
        raise ValueError("refusing to split a vector with a non-finite value")
    count = chunk_count(v.size, int(max_numbers))
    step = math.ceil(v.size / count)  # balanced: at most max_numbers, every chunk full but the last
    return [Chunk(int(seq), i, count, v.size, v[i * step:(i + 1) * step].copy()) for i in range(count)]


def _expected_size(index: int, count: int, total: int) -> int:
    step = math.ceil(total / count)  # split_vector's chunk length
    return min(step, total - index * step)


@durable("algorithms.Reassembly")
class Reassembly:
    """Pieces received per `(client, seq)` until the whole vector is there; idempotent.

    `check` validates a piece without changing anything (a piece inconsistent with its siblings — another
    count or total, a wrong size — is refused); `add` stores it and returns the whole vector when it was the
    last missing one, else None. A vector is handed out once: its `(client, seq)` is remembered (the last
    `remember` per client) and later copies of its pieces are ignored. At most `max_open` vectors per client
    are open at a time (a sender that never finishes cannot grow the receiver without bound).

    >>> r = Reassembly(max_open=1)
    >>> r.add("a", Chunk(1, 0, 2, 3, np.ones(2)))
    >>> r.add("a", Chunk(2, 0, 2, 3, np.ones(2)))
    Traceback (most recent call last):
    ...
    ValueError: client 'a' already has 1 vectors open
    """

    def __init__(self, *, max_open: int = 4, remember: int = 64) -> None:
        self.max_open, self.remember = int(max_open), int(remember)
        self._open: dict[str, dict[int, dict[int, np.ndarray]]] = {}
        self._shape: dict[tuple[str, int], tuple[int, int]] = {}  # (client, seq) → (count, total)
        self._done: dict[str, list[int]] = {}

    def is_done(self, client: str, seq: int) -> bool:
        return int(seq) in self._done.get(client, [])

    def open_vectors(self) -> dict[str, list[int]]:
        """The `(client → seqs)` still missing pieces."""
        return {c: sorted(v) for c, v in self._open.items() if v}

    def check(self, client: str, chunk: Chunk) -> None:
        """`ValueError` if `chunk` cannot belong to what was received so far (changes nothing)."""
        if chunk.data.size != _expected_size(chunk.index, chunk.count, chunk.total):
            raise ValueError(f"chunk {chunk.index} of {chunk.count} has {chunk.data.size} numbers, expected "
                             f"{_expected_size(chunk.index, chunk.count, chunk.total)} of {chunk.total}")
        if not np.all(np.isfinite(chunk.data)):
            raise ValueError("chunk contains a non-finite value")
        shape = self._shape.get((client, chunk.seq))
        if shape is not None and shape != (chunk.count, chunk.total):
            raise ValueError(f"chunk of seq {chunk.seq} says {chunk.count} chunks / {chunk.total} numbers; "
                             f"its siblings said {shape[0]} / {shape[1]}")
        opened = self._open.get(client, {})
        if shape is None and not self.is_done(client, chunk.seq) and len(opened) >= self.max_open:
            raise ValueError(f"client {client!r} already has {len(opened)} vectors open")

    def add(self, client: str, chunk: Chunk) -> np.ndarray | None:
        """Store `chunk`; the whole vector if it completes one (once), else None."""
        if self.is_done(client, chunk.seq):
            return None
        self.check(client, chunk)
        key = (client, chunk.seq)
        self._shape[key] = (chunk.count, chunk.total)
        pieces = self._open.setdefault(client, {}).setdefault(chunk.seq, {})
        pieces.setdefault(chunk.index, np.array(chunk.data, dtype=np.float64))
        if len(pieces) < chunk.count:
            return None
        whole = np.concatenate([pieces[i] for i in range(chunk.count)])
        del self._open[client][chunk.seq]
        del self._shape[key]
        done = self._done.setdefault(client, [])
        done.append(chunk.seq)
        del done[:-self.remember]
        return whole

    def drop_open(self) -> int:
        """Forget every incomplete vector (say, the pieces of a version that is over); how many were open."""
        n = sum(len(v) for v in self._open.values())
        self._open.clear()
        self._shape.clear()
        return n
