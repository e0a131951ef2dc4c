"""Applying each client's uploads once and in sequence order, whatever order they arrive in.

Order-free servers (FedBNR, personalised FedBNR, FSGP) sum uploads; a global's `included[client]` must mean
"every seq of this client up to here is in the sum", so an upload whose predecessor has not arrived waits
(at most `max_buffered` per client) and is applied when the gap fills. The servers keep the two maps
(`included`, and the waiting uploads) as their own state; this function is the one rule over them.

>>> included, waiting, summed = {}, {}, []
>>> [apply_in_order(included, waiting, "a", s, s, summed.append, 4) for s in (2, 1, 1, 3)]
[True, True, False, True]
>>> summed, included, waiting
([1, 2, 3], {'a': 3}, {})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from typing import Any, TypeVar

__all__ = ["apply_in_order", "check_room"]

T = TypeVar("T")


def apply_in_order(included: dict[str, int], waiting: dict[str, dict[int, Any]], client: str, seq: int, item: T,
                   apply: Callable[[T], None], max_buffered: int) -> bool:
    """Apply `item` (seq `seq` of `client`) once, in order. Returns `False` for a duplicate (applied or
    already waiting); `ValueError` when `max_buffered` uploads of the client already wait for a gap."""
    mark = included.get(client, 0)
    held = waiting.setdefault(client, {})
    if seq <= mark or seq in held:
        return False
    if seq > mark + 1:
        if len(held) >= max_buffered:
            raise ValueError(f"client {client!r} has {len(held)} uploads waiting for seq {mark + 1}")
        held[seq] = item
        return True
    apply(item)
    mark = seq
    while mark + 1 in held:
        mark += 1
        apply(held.pop(mark))
    included[client] = mark
    if not held:
        del waiting[client]
    return True


def check_room(included: Mapping[str, int], waiting: Mapping[str, Sized], client: str, seq: int,
               max_buffered: int) -> None:
    """`ValueError` for an upload that would have to wait for a gap while `max_buffered` of its client's already
    do — what :func:`apply_in_order` would refuse, said by an aggregation's `check` before anything changes.

    >>> check_room({"a": 1}, {"a": [3, 4]}, "a", 2, max_buffered=2)  # it fills the gap: no wait
    >>> check_room({"a": 1}, {"a": [3, 4]}, "a", 5, max_buffered=2)
    Traceback (most recent call last):
    ...
    ValueError: client 'a' has 2 uploads waiting for an earlier seq
    """
    held = len(waiting.get(client, ()))
    if held >= max_buffered and seq > included.get(client, 0) + 1:
        raise ValueError(f"client {client!r} has {held} uploads waiting for an earlier seq")
