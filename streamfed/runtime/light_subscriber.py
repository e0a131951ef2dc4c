"""A light MQTT v5 subscriber of our own: the aggregator's (and a shard's) update stream without paho.

paho, under aiomqtt, costs ~80 µs of Python per received message (its packet reader, a `MQTTMessage`, a
callback, aiomqtt's queue and task per `async for` step), more than the aggregator's whole validation of a
POF-MKL update: a bare aiomqtt subscriber takes ~8–12k messages/s where `mosquitto_sub` takes 50–90k
(benchmarks/results/ingest.md). This connection does only what a QoS 1 subscriber needs, on an asyncio
`Protocol`:

* CONNECT (MQTT v5, clean start off and a session expiry for a persistent session, user name and password,
  Receive Maximum, Maximum Packet Size left to the broker) and the CONNACK: a refusal the broker means
  (bad credentials, not authorised, banned: the MQTT v5 reason codes
  :data:`streamfed.runtime.session` treats as fatal) raises
  :class:`~streamfed.runtime.session.BrokerRefused`, any other failure :class:`IngestLost`;
* SUBSCRIBE at QoS 1 and its SUBACK (a refused filter: :class:`~streamfed.runtime.session.BrokerRefused`);
* **many PUBLISH packets per socket read**: every complete packet in the bytes read is parsed (topic,
  packet id, properties skipped, payload), the whole batch handed to `on_batch` in order, and then the
  PUBACKs of the batch written in one `write` — after the batch was handled, so a message is never
  acknowledged before the aggregator took it in. While the handler is busy nothing is read, so the kernel's
  socket buffer and then the broker's queue for this session hold the rest (TCP back-pressure), instead
  of an unbounded queue in this process;
* a PUBLISH larger than `max_packet` is not buffered: its topic and packet id are read, the rest skipped as
  it arrives, `on_oversized(topic, size)` is told (the aggregator rejects it as ``too_large``, counted) and
  it is acknowledged — redelivering it would not make it smaller;
* PINGREQ every `keepalive / 2` seconds; no PINGRESP (or anything else) for `keepalive` seconds, a
  DISCONNECT from the broker, a malformed packet, or a closed socket end the connection:
  :meth:`LightSubscriber.wait_closed` raises :class:`IngestLost` (an `aiomqtt.MqttError`, so the service's
  reconnect loop treats it as any lost connection). The broker redelivers what was not acknowledged
  when the persistent session is taken up again.

QoS 2, topic aliases and MQTT 3.1.1 are out of scope (the caller falls back to aiomqtt for a v3.1.1 broker).

>>> p = LightSubscriber(lambda batch: None)
>>> p.feed(publish_packet("a/b", b"xy", packet_id=7))  # what the broker would send
>>> p.received, p.pending_acks
(1, [7])
>>> remaining_length(encode_varint(321)[0:]), encode_varint(127), encode_varint(128)
((321, 2), b'\\x7f', b'\\x80\\x01')
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Callable

import aiomqtt

from streamfed.fleet.config import BrokerConfig
from streamfed.runtime.session import BrokerRefused

__all__ = ["IngestLost", "LightSubscriber", "encode_varint", "publish_packet", "remaining_length"]

log = logging.getLogger(__name__)

_CONNECT, _CONNACK, _PUBLISH, _PUBACK = 1, 2, 3, 4
_SUBSCRIBE, _SUBACK, _PINGREQ, _PINGRESP, _DISCONNECT = 8, 9, 12, 13, 14
_PINGREQ_PACKET = b"\xc0\x00"
_DISCONNECT_PACKET = b"\xe0\x00"
_FATAL_CONNACK = {0x84: "Unsupported protocol version", 0x85: "Client identifier not valid",
                  0x86: "Bad user name or password", 0x87: "Not authorized", 0x8A: "Banned",
                  0x8C: "Bad authentication method"}
_PUBACKS = {i: struct.pack("!BBH", 0x40, 2, i) for i in range(1, 4097)}  # the common packet ids, prebuilt


class IngestLost(aiomqtt.MqttError):
    """The light subscriber's connection ended (lost, timed out, closed by the broker, malformed input).

    >>> isinstance(IngestLost("keepalive"), aiomqtt.MqttError)
    True
    """


def encode_varint(n: int) -> bytes:
    """MQTT's variable byte integer (remaining length, property lengths)."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def remaining_length(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """`(value, bytes used)` of the variable byte integer at `buf[pos:]`; None when it is not all there yet.
    Raises :class:`IngestLost` for one longer than four bytes (malformed)."""
    value, shift, i = 0, 0, pos
    n = len(buf)
    while i < n:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i - pos
        shift += 7
        if shift > 21:
            raise IngestLost("malformed packet: remaining length over four bytes")
    return None


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + encode_varint(len(body)) + body


def publish_packet(topic: str, payload: bytes, packet_id: int = 0, *, qos: int = 1, dup: bool = False,
                   retain: bool = False) -> bytes:
    """A PUBLISH packet as a broker sends it (MQTT v5, no properties) — for tests and this module's example."""
    body = _string(topic) + (struct.pack("!H", packet_id) if qos else b"") + b"\x00" + payload
    return _packet(0x30 | (dup << 3) | (qos << 1) | retain, body)


def connect_packet(client_id: str, *, keepalive: int, clean_start: bool, session_expiry: int,
                   receive_maximum: int, username: str | None = None, password: str | None = None) -> bytes:
    """The CONNECT packet (MQTT v5)."""
    flags = (0x02 if clean_start else 0) | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    props = b"\x11" + struct.pack("!I", session_expiry) + b"\x21" + struct.pack("!H", receive_maximum)
    body = _string("MQTT") + bytes([5, flags]) + struct.pack("!H", keepalive) + encode_varint(len(props)) + props
    body += _string(client_id)
    if username is not None:
        body += _string(username)
    if password is not None:
        pw = password.encode()
        body += struct.pack("!H", len(pw)) + pw
    return _packet(0x10, body)


def subscribe_packet(packet_id: int, topics: list[str]) -> bytes:
    """SUBSCRIBE of `topics` at QoS 1 (MQTT v5, no properties)."""
    body = struct.pack("!H", packet_id) + b"\x00" + b"".join(_string(t) + b"\x01" for t in topics)
    return _packet(0x82, body)


class LightSubscriber(asyncio.Protocol):
    """One QoS 1 subscriber connection; see the module doc. `on_batch(list of (topic, payload))` is called with
    the messages of each read, in order; `on_oversized(topic, size)` for a PUBLISH over `max_packet` bytes.

    >>> seen = []
    >>> p = LightSubscriber(seen.extend, max_packet=64)
    >>> p.feed(publish_packet("u/c1", b"ok", 1) + publish_packet("u/c2", b"x" * 100, 2)[:20])
    >>> seen, p.oversized, p.pending_acks
    ([('u/c1', b'ok')], 1, [1, 2])
    """

    def __init__(self, on_batch: Callable[[list[tuple[str, bytes]]], None], *, max_packet: int = 1 << 24,
                 on_oversized: Callable[[str, int], None] | None = None) -> None:
        self.on_batch = on_batch
        self.on_oversized = on_oversized
        self.max_packet = int(max_packet)
        self.received = 0
        self.oversized = 0
        self.pending_acks: list[int] = []  # PUBACKs not yet written (only outside a connection, in `feed`)
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized PUBLISH still to discard
        self._transport: asyncio.Transport | None = None
        self._closed: asyncio.Future[None] | None = None
        self._control: asyncio.Queue[tuple[int, bytes]] | None = None  # CONNACK, SUBACK
        self._heard = 0.0  # loop time anything last arrived
        self._pinger: asyncio.Task[None] | None = None
        self._topics: dict[bytes, str] = {}

    # ------------------------------------------------------------------ connecting
    @classmethod
    async def open(cls, broker: BrokerConfig, client_id: str, topics: list[str],
                   on_batch: Callable[[list[tuple[str, bytes]]], None], *, persistent: bool = True,
                   timeout: float = 5.0, max_packet: int = 1 << 24, receive_maximum: int = 1024,
                   on_oversized: Callable[[str, int], None] | None = None) -> LightSubscriber:
        """Connect to `broker` as `client_id`, subscribe to `topics` (QoS 1) and start taking messages.
        Raises :class:`~streamfed.runtime.session.BrokerRefused` for a refusal, :class:`IngestLost` otherwise."""
        loop = asyncio.get_running_loop()
        proto = cls(on_batch, max_packet=max_packet, on_oversized=on_oversized)
        ctx = _tls_context(broker)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: proto, broker.host, broker.port, ssl=ctx), timeout)
        except (TimeoutError, OSError) as e:
            raise IngestLost(f"cannot connect to {broker.host}:{broker.port}: {e or 'timed out'}") from e
        try:
            await proto._handshake(broker, client_id, topics, persistent, timeout, receive_maximum)
        except BaseException:
            proto.close()
            raise
        return proto

    async def _handshake(self, broker: BrokerConfig, client_id: str, topics: list[str], persistent: bool,
                         timeout: float, receive_maximum: int) -> None:
        assert self._transport is not None and self._control is not None
        password = broker.password.get_secret_value() if broker.password is not None else None
        self._transport.write(connect_packet(
            client_id, keepalive=broker.keepalive, clean_start=not persistent,
            session_expiry=broker.session_expiry if persistent else 0, receive_maximum=receive_maximum,
            username=broker.username, password=password))
        kind, body = await self._reply(timeout, "CONNACK")
        if kind != _CONNACK or len(body) < 2:
            raise IngestLost(f"expected a CONNACK, got packet type {kind}")
        if body[1] >= 0x80:
            text = _FATAL_CONNACK.get(body[1])
            if text is not None:
                raise BrokerRefused(text, 1)
            raise IngestLost(f"the broker refused the connection: reason 0x{body[1]:02x}")
        if self._transport is None:  # lost while the queued messages came in after the CONNACK
            assert self._closed is not None
            self._closed.result()
            raise IngestLost("connection closed during the handshake")
        self._transport.write(subscribe_packet(1, topics))
        kind, body = await self._reply(timeout, "SUBACK")
        if kind != _SUBACK:
            raise IngestLost(f"expected a SUBACK, got packet type {kind}")
        plen = remaining_length(body, 2)
        codes = body[2 + plen[0] + plen[1]:] if plen else b""
        for topic, code in zip(topics, codes, strict=False):
            if code >= 0x80:
                raise BrokerRefused(f"subscription to {topic!r} refused: reason 0x{code:02x}", 1)
        self._pinger = asyncio.get_running_loop().create_task(self._keepalive(broker.keepalive))

    async def _reply(self, timeout: float, what: str) -> tuple[int, bytes]:
        """The next CONNACK or SUBACK. A persistent session's queued messages come first, ahead of the SUBACK,
        and are handled as they come: the wait times out only after `timeout` seconds without any input."""
        assert self._control is not None and self._closed is not None
        loop = asyncio.get_running_loop()
        get = asyncio.ensure_future(self._control.get())
        try:
            while True:
                quiet = loop.time() - self._heard
                if quiet >= timeout:
                    raise IngestLost(f"no {what} within {timeout:g} s")
                await asyncio.wait({get, self._closed}, timeout=timeout - quiet,  # type: ignore[type-var]
                                   return_when=asyncio.FIRST_COMPLETED)
                if get.done():
                    return get.result()
                if self._closed.done():
                    self._closed.result()  # raises why it closed
                    raise IngestLost(f"connection closed before the {what}")
        finally:
            get.cancel()

    async def _keepalive(self, keepalive: int) -> None:
        loop = asyncio.get_running_loop()
        while self._transport is not None:
            await asyncio.sleep(max(0.5, keepalive / 2))
            if loop.time() - self._heard > keepalive * 1.5:
                self._lose(IngestLost(f"nothing from the broker for {keepalive * 1.5:g} s (keepalive)"))
                return
            if self._transport is not None:
                self._transport.write(_PINGREQ_PACKET)

    async def wait_closed(self) -> None:
        """Until the connection ends; raises :class:`IngestLost` saying why (returns after :meth:`close`)."""
        assert self._closed is not None
        await self._closed

    def close(self) -> None:
        """A clean DISCONNECT (the session stays, with what was not acknowledged) and the socket closed."""
        if self._pinger is not None:
            self._pinger.cancel()
        t = self._transport
        if t is not None and not t.is_closing():
            with contextlib.suppress(Exception):
                t.write(_DISCONNECT_PACKET)
            t.close()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._closed = loop.create_future()
        self._control = asyncio.Queue()
        self._heard = loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(6, 1, 1)  # TCP_NODELAY: a PUBACK batch goes out at once

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._lose(IngestLost(f"connection lost: {exc}" if exc else "connection closed by the broker"))

    def _lose(self, error: IngestLost) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        if self._transport is not None:
            self._transport.abort()
            self._transport = None
        if self._closed is not None and not self._closed.done():
            self._closed.set_exception(error)
            self._closed.exception()  # retrieved: nobody may be waiting yet

    def data_received(self, data: bytes) -> None:
        if self._closed is not None:
            self._heard = asyncio.get_running_loop().time()
        try:
            self.feed(data)
        except IngestLost as e:
            log.error("light subscriber: %s", e)
            self._lose(e)
            return
        except Exception as e:  # the handler failed: nothing of this read is acknowledged, the broker sends it again
            log.error("light subscriber: the message handler failed; the connection is dropped unacknowledged",
                      exc_info=e)
            self.pending_acks = []
            self._lose(IngestLost(f"the message handler failed: {e!r}"[:200]))
            return
        if self.pending_acks and self._transport is not None:
            acks = self.pending_acks
            self.pending_acks = []
            self._transport.write(b"".join(_PUBACKS.get(i) or struct.pack("!BBH", 0x40, 2, i) for i in acks))

    # ------------------------------------------------------------------ parsing
    def feed(self, data: bytes) -> None:
        """Parse `data` (bytes as read from the socket): hand the complete PUBLISH packets to `on_batch` and
        note their PUBACKs in :attr:`pending_acks`; keep an incomplete packet for the next read."""
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
            if not data:
                return
        buf = self._buf
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data
        batch: list[tuple[str, bytes]] = []
        acks = self.pending_acks
        pos, end = 0, len(view)
        topics = self._topics
        while pos < end:
            rl = remaining_length(view, pos + 1)
            if rl is None:
                break
            first = view[pos]
            length, used = rl
            start = pos + 1 + used
            kind = first >> 4
            if kind != _PUBLISH and length > 65536:
                raise IngestLost(f"malformed input: a packet of type {kind} claims {length} bytes")
            if kind == _PUBLISH and length > self.max_packet:
                if not self._oversized(view, pos, start, length, first, batch):
                    break  # its topic and id are not all here yet
                taken = end - start
                if taken < length:
                    self._skip = length - taken
                    pos = end
                    break
                pos = start + length
                continue
            stop = start + length
            if stop > end:
                break
            if kind == _PUBLISH:
                tlen = (view[start] << 8) | view[start + 1]
                i = start + 2 + tlen
                tb = bytes(view[start + 2:i])
                topic = topics.get(tb)
                if topic is None:
                    topic = tb.decode("utf-8", "replace")
                    if len(topics) < 65536:
                        topics[tb] = topic
                qos = (first >> 1) & 3
                if qos:
                    acks.append((view[i] << 8) | view[i + 1])
                    i += 2
                plen = remaining_length(view, i)
                if plen is None or i + plen[1] + plen[0] > stop:
                    raise IngestLost("malformed PUBLISH: properties past the end of the packet")
                batch.append((topic, bytes(view[i + plen[1] + plen[0]:stop])))
            elif kind == _PINGRESP:
                pass
            elif kind == _DISCONNECT:
                reason = view[start] if length else 0
                raise IngestLost(f"the broker disconnected this client: reason 0x{reason:02x}")
            elif kind in (_CONNACK, _SUBACK):
                if self._control is not None:
                    self._control.put_nowait((kind, bytes(view[start:stop])))
            else:
                raise IngestLost(f"unexpected packet type {kind} from the broker")
            pos = stop
        if buf:
            del buf[:pos]
        elif pos < end:
            buf += view[pos:]
        if batch:
            self.received += len(batch)
            self.on_batch(batch)

    def _oversized(self, view: bytes | bytearray, pos: int, start: int, length: int, first: int,
                   batch: list[tuple[str, bytes]]) -> bool:
        """An oversized PUBLISH at `pos`: note it and its PUBACK once its topic and packet id are here."""
        if start + 2 > len(view):
            return False
        tlen = (view[start] << 8) | view[start + 1]
        qos = (first >> 1) & 3
        need = start + 2 + tlen + (2 if qos else 0)
        if need > len(view):
            return False
        topic = bytes(view[start + 2:start + 2 + tlen]).decode("utf-8", "replace")
        if batch:  # the messages before it are handled first, in order
            self.received += len(batch)
            self.on_batch(list(batch))
            batch.clear()
        if qos:
            self.pending_acks.append((view[need - 2] << 8) | view[need - 1])
        self.oversized += 1
        log.warning("light subscriber: a message of %d bytes on %s is over the limit of %d: skipped", length,
                    topic, self.max_packet)
        if self.on_oversized is not None:
            self.on_oversized(topic, length)
        return True


def _tls_context(broker: BrokerConfig) -> ssl.SSLContext | None:
    if not broker.use_tls:
        return None
    ctx = ssl.create_default_context(cafile=broker.tls_ca)
    if broker.tls_cert:
        ctx.load_cert_chain(broker.tls_cert, broker.tls_key)
    return ctx
