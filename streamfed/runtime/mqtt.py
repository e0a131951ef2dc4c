"""Every use of aiomqtt's and paho's internals, in one place.

aiomqtt (2.x) is the MQTT client of the runtime; a few things the runtime needs are not in its public API:
the paho client it wraps (to write a QoS 0 prediction to the socket at once, to turn Nagle off, to watch
PUBACK reason codes, which `publish()` does not surface), its table of pending publishes (to wait for
PUBACKs without a task per message), its incoming queue (to take the messages already waiting in one
step), and the texts of MQTT 3.1.1 CONNACK codes. Each accessor degrades to `None` (or a plain text)
when a later aiomqtt moves them, so the runtime falls back to the public API instead of breaking; this
module is the one to revisit on an aiomqtt upgrade (pinned `>=2.5,<3`).

Bounded input. aiomqtt puts every received message into an `asyncio.Queue` that is unbounded unless
`max_queued_incoming_messages` is set — and then it discards the message with a warning per message and
counts nothing. paho reads the socket from a loop callback whatever the consumer does, so a publisher
faster than the consumer grows that queue without end (a 15 s sensor flood: 64 MB → 1.3 GB). Instead:

* :class:`Lane` — a bounded FIFO (items *and* bytes) with a stated policy when full (drop the oldest or
  the newest), counting what it received and dropped, and telling the owner of every drop;
* :class:`IncomingQueue` — aiomqtt's `queue_type`: it hands the messages a `divert` function claims to
  their lane as they arrive (e.g. sensor readings, which the learner takes at its own pace) and keeps the
  rest (globals, acks) for `client.messages` — bounded too, the oldest dropped and counted;
* :func:`burst_reads` — paho reads one packet per readable event (its `loop_read` ignores its
  `max_packets`), one per turn of the event loop, so a busy loop read slower than a flood arrives and the
  broker queued, then dropped (visible only in `$SYS`), globals and acks included; with it a readable
  socket is read up to `packets` packets at a time.

>>> paho_of(object()) is None, incoming_drain(object()) is None
(True, True)
>>> connect_refusal_text(5)
'Not authorised'
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["IncomingQueue", "Lane", "burst_reads", "connect_refusal_text", "incoming_drain", "paho_of",
           "pending_publishes"]

QUEUE_FULL = "queue_full"  # the reason a lane gives for a message it dropped
Policy = Literal["drop_oldest", "drop_newest"]


def paho_of(client: Any) -> Any | None:
    """The paho `Client` inside an aiomqtt client (None if there is none)."""
    return getattr(client, "_client", None)


def pending_publishes(client: Any) -> dict[int, Any]:
    """aiomqtt's table mid → the event its `on_publish` callback sets when the PUBACK arrives."""
    table = getattr(client, "_pending_publishes", None)
    if not isinstance(table, dict):
        raise RuntimeError("this aiomqtt has no table of pending publishes (aiomqtt >= 2.5, < 3 expected)")
    return table


def incoming_drain(client: Any) -> Callable[[], Any] | None:
    """A function returning the next message already received (`asyncio.QueueEmpty` when none), or None."""
    return getattr(getattr(client, "_queue", None), "get_nowait", None)


def connect_refusal_text(rc: int) -> str:
    """The text of an MQTT 3.1.1 CONNACK return code."""
    import aiomqtt

    table = getattr(aiomqtt.exceptions, "_CONNECT_RC_STRINGS", {})
    return str(table.get(rc, f"return code {rc}"))



def _size(item: Any) -> int:
    """What an item costs a lane's byte bound: its payload's length (raw bytes, or an aiomqtt message's)."""
    if isinstance(item, bytes | bytearray | memoryview | str):
        return len(item)
    payload = getattr(item, "payload", None)
    return len(payload) if isinstance(payload, bytes | bytearray | str) else 0


class Lane:
    """A bounded FIFO of received items: at most `limit` items and `max_bytes` payload bytes.

    When an item does not fit, `policy` decides: ``"drop_oldest"`` evicts the oldest items until it fits
    (a sensor stream wants its newest readings: a prediction of a stale reading is late, and after a
    flood the lane holds the most recent `limit` readings, so the backlog and its delay are bounded),
    ``"drop_newest"`` refuses the new one (the right thing for a stream whose first items matter). Every
    item offered is counted in `received`, every one dropped in `dropped` and passed to `on_drop(item,
    reason)` at once (reason ``"queue_full"``); `high_water` is the largest length seen. An item larger
    than `max_bytes` on its own is dropped whatever the policy. `get()` waits for an item; after
    `close()` it returns None once the lane is empty.

    >>> lane = Lane(limit=2)
    >>> for item in (b"r1", b"r2", b"r3"):
    ...     lane.offer(item)
    >>> list(lane), lane.received, lane.dropped, lane.high_water
    ([b'r2', b'r3'], 3, 1, 2)
    >>> keep_first = Lane(limit=1, policy="drop_newest")
    >>> keep_first.offer(b"a"); keep_first.offer(b"b"); list(keep_first), keep_first.dropped
    ([b'a'], 1)
    >>> asyncio.run(lane.get())
    b'r2'
    """

    def __init__(self, limit: int, max_bytes: int = 1 << 30, policy: Policy = "drop_oldest",
                 on_drop: Callable[[Any, str], None] | None = None) -> None:
        if limit < 1 or max_bytes < 1:
            raise ValueError(f"a lane holds at least one item and one byte, got limit={limit}, max_bytes={max_bytes}")
        if policy not in ("drop_oldest", "drop_newest"):
            raise ValueError(f"policy is drop_oldest or drop_newest, got {policy!r}")
        self.limit, self.max_bytes, self.policy = int(limit), int(max_bytes), policy
        self.on_drop = on_drop
        self.received = 0
        self.dropped = 0
        self.high_water = 0
        self.nbytes = 0
        self._items: deque[tuple[Any, int]] = deque()
        self._ready = asyncio.Event()  # set while items wait (or the lane is closed)
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Any:
        return (item for item, _ in self._items)

    def _drop(self, item: Any, reason: str = QUEUE_FULL) -> None:
        self.dropped += 1
        if self.on_drop is not None:
            self.on_drop(item, reason)

    def offer(self, item: Any) -> None:
        """Take `item` in, or drop what the policy says (counted, `on_drop` told). Never blocks or raises."""
        self.received += 1
        size = _size(item)
        if size > self.max_bytes:
            self._drop(item)
            return
        items = self._items
        while items and (len(items) >= self.limit or self.nbytes + size > self.max_bytes):
            if self.policy == "drop_newest":
                self._drop(item)
                return
            old, old_size = items.popleft()
            self.nbytes -= old_size
            self._drop(old)
        items.append((item, size))
        self.nbytes += size
        if len(items) > self.high_water:
            self.high_water = len(items)
        self._ready.set()

    def get_nowait(self) -> Any:
        """The oldest item; raises `asyncio.QueueEmpty` when there is none."""
        if not self._items:
            raise asyncio.QueueEmpty
        item, size = self._items.popleft()
        self.nbytes -= size
        if not self._items and not self._closed:
            self._ready.clear()
        return item

    async def get(self) -> Any:
        """The oldest item, waiting for one; None once the lane is closed and empty."""
        while not self._items:
            if self._closed:
                return None
            await self._ready.wait()
        return self.get_nowait()

    def close(self) -> None:
        """No more waiting: `get()` returns what is left, then None."""
        self._closed = True
        self._ready.set()

    def clear(self, reason: str) -> int:
        """Drop everything waiting (counted under `reason`); returns how many."""
        n = len(self._items)
        while self._items:
            item, _ = self._items.popleft()
            self._drop(item, reason)
        self.nbytes = 0
        if not self._closed:
            self._ready.clear()
        return n


class IncomingQueue(asyncio.Queue):  # type: ignore[type-arg]
    """aiomqtt's incoming queue (its `queue_type`), bounded, and splitting the stream in two.

    aiomqtt's receive callback calls `put_nowait(message)` for every message paho read. A message that
    `divert(message)` maps to a :class:`Lane` goes there (the lane bounds and counts it); `divert` may also
    return a replacement item for the lane, as `(lane, item)`. Every other message stays here for
    `client.messages`, at most `limit` of them: when full the oldest is dropped and `on_drop(message,
    "queue_full")` told (the queue never refuses, so aiomqtt never logs its per-message warning). Counts:
    `received`, `dropped` (of the messages kept here; a lane counts its own).

    Pass :meth:`factory` as `queue_type`: aiomqtt makes its queue by calling `queue_type(maxsize=...)`.

    >>> sensors = Lane(limit=1)
    >>> q = IncomingQueue(limit=1, divert=lambda m: sensors if m.startswith(b"s") else None)
    >>> for m in (b"s1", b"g1", b"s2", b"g2"):
    ...     q.put_nowait(m)
    >>> q.get_nowait(), list(sensors), q.dropped, sensors.dropped
    (b'g2', [b's2'], 1, 1)
    """

    def __init__(self, maxsize: int = 0, *, limit: int = 1024,
                 divert: Callable[[Any], Lane | tuple[Lane, Any] | None] | None = None,
                 on_drop: Callable[[Any, str], None] | None = None) -> None:
        super().__init__(0)  # never "full" to asyncio: put_nowait must not raise inside paho's callback
        self.limit = max(1, int(maxsize) if maxsize and maxsize > 0 else int(limit))
        self.divert = divert
        self.on_drop = on_drop
        self.received = 0
        self.dropped = 0

    @classmethod
    def factory(cls, **kw: Any) -> Callable[..., IncomingQueue]:
        """A `queue_type` for aiomqtt: makes an :class:`IncomingQueue` with these keyword arguments."""
        def make(maxsize: int = 0) -> IncomingQueue:
            return cls(maxsize, **kw)

        return make

    def put_nowait(self, item: Any) -> None:
        if self.divert is not None:
            target = self.divert(item)
            if target is not None:
                lane, item = target if isinstance(target, tuple) else (target, item)
                lane.offer(item)
                return
        self.received += 1
        if self.qsize() >= self.limit:
            old = self.get_nowait()
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(old, QUEUE_FULL)
        super().put_nowait(item)

    def discard(self, reason: str) -> int:
        """Drop the messages still waiting (a session that ended), telling `on_drop`; returns how many."""
        n = 0
        while True:
            try:
                item = self.get_nowait()
            except asyncio.QueueEmpty:
                return n
            n += 1
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(item, reason)


def burst_reads(client: Any, packets: int = 256) -> bool:
    """Let aiomqtt's socket reader read up to `packets` packets per readable event instead of one.

    aiomqtt calls the paho client's `loop_read()` when the socket is readable, once per turn of the event
    loop, and paho reads one packet per call (its `max_packets` is ignored). An agent that learns between
    turns then reads slower than a flood arrives: the rest waits in the kernel and the broker, which
    drops what its per-client queue cannot hold — globals and acks as well as readings, counted nowhere
    the agent sees. Reading in bursts keeps the socket drained; the cheap, counted drop happens in the
    agent's bounded lane. (A TLS socket with decrypted bytes pending is read on, as aiomqtt does.)
    Returns whether the hook could be installed.

    >>> burst_reads(object())
    False
    """
    paho = paho_of(client)
    read = getattr(paho, "loop_read", None)
    if paho is None or not callable(read) or not callable(getattr(paho, "socket", None)):
        return False
    packets = max(1, int(packets))
    poller: list[Any] = [None, -1]  # a poll object (not select(): descriptors above 1023) and its fd

    def readable(sock: Any) -> bool:
        pending = getattr(sock, "pending", None)
        if callable(pending) and pending() > 0:
            return True
        fd = sock.fileno()
        if fd < 0:
            return False
        if poller[1] != fd:
            poller[0], poller[1] = select.poll(), fd
            poller[0].register(fd, select.POLLIN)
        return bool(poller[0].poll(0))

    def loop_read(max_packets: int = 1) -> Any:
        rc = read(max_packets)
        for _ in range(packets - 1):
            if rc:  # an error (connection lost): paho has handled it
                return rc
            sock = paho.socket()
            try:
                if sock is None or not readable(sock):
                    return rc
            except (OSError, ValueError):  # closed meanwhile
                return rc
            rc = read(max_packets)
        return rc

    paho.loop_read = loop_read
    return True
