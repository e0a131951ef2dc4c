"""Chunked vectors (streamfed.algorithms.chunks): split within the bound, reassembled exactly once, whatever the
order and however often a piece repeats; inconsistent or incomplete pieces never produce a vector."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from streamfed.algorithms.chunks import Chunk, Reassembly, chunk_count, split_vector


@pytest.mark.parametrize(("total", "limit"), [(1, 1), (5, 2), (5, 4), (9, 8), (10, 3), (1000, 64), (64, 64)])
def test_split_respects_the_bound_and_concatenates_back(total: int, limit: int) -> None:
    v = np.random.default_rng(total).standard_normal(total)
    parts = split_vector(3, v, limit)
    assert len(parts) == chunk_count(total, limit) == -(-total // limit)
    assert all(0 < p.data.size <= limit for p in parts)
    assert [(p.seq, p.index, p.count, p.total) for p in parts] == [(3, i, len(parts), total) for i in range(len(parts))]
    assert np.array_equal(np.concatenate([p.data for p in parts]), v)


def test_every_arrival_order_with_repeats_gives_the_vector_once() -> None:
    v = np.arange(7.0)
    parts = split_vector(1, v, 2)
    for order in itertools.permutations(range(len(parts))):
        r = Reassembly()
        out = [r.add("c", parts[i]) for i in order + order]  # each piece twice
        whole = [o for o in out if o is not None]
        assert len(whole) == 1 and np.array_equal(whole[0], v)
        assert r.open_vectors() == {}


def test_clients_and_seqs_are_kept_apart() -> None:
    r = Reassembly()
    a, b = split_vector(1, np.ones(4), 2), split_vector(1, np.zeros(4), 2)
    assert r.add("a", a[0]) is None and r.add("b", b[1]) is None
    assert r.open_vectors() == {"a": [1], "b": [1]}
    assert np.array_equal(r.add("b", b[0]), np.zeros(4))
    assert np.array_equal(r.add("a", a[1]), np.ones(4))


def test_incomplete_vectors_never_count_and_can_be_dropped() -> None:
    r = Reassembly()
    parts = split_vector(5, np.ones(6), 2)
    assert [r.add("a", p) for p in parts[:2]] == [None, None]
    assert r.drop_open() == 1 and r.open_vectors() == {}
    assert r.add("a", parts[2]) is None  # its siblings were dropped: still incomplete


@pytest.mark.parametrize("bad", [
    Chunk(1, 0, 2, 4, np.ones(3)),            # wrong size for its position
    Chunk(1, 1, 3, 4, np.ones(2)),            # another count than its sibling
    Chunk(1, 1, 2, 5, np.ones(2)),            # another total than its sibling
    Chunk(1, 1, 2, 4, np.array([1.0, np.nan])),  # non-finite
])
def test_inconsistent_pieces_are_refused_and_change_nothing(bad: Chunk) -> None:
    r = Reassembly()
    r.add("a", Chunk(1, 0, 2, 4, np.ones(2)))
    with pytest.raises(ValueError):
        r.add("a", bad)
    assert r.open_vectors() == {"a": [1]}
    assert np.array_equal(r.add("a", Chunk(1, 1, 2, 4, np.full(2, 2.0))), [1.0, 1.0, 2.0, 2.0])


def test_bounded_open_vectors_and_non_finite_split() -> None:
    r = Reassembly(max_open=2)
    r.add("a", Chunk(1, 0, 2, 2, np.ones(1)))
    r.add("a", Chunk(2, 0, 2, 2, np.ones(1)))
    with pytest.raises(ValueError, match="open"):
        r.add("a", Chunk(3, 0, 2, 2, np.ones(1)))
    with pytest.raises(ValueError):
        split_vector(1, np.array([1.0, np.inf]), 1)
    with pytest.raises(ValueError):
        Chunk(1, 2, 2, 2, np.ones(1))  # index out of range
