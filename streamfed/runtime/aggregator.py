"""The aggregator's asyncio/MQTT shell around :class:`streamfed.aggregator.AggregatorCore`.

A persistent QoS 1 session (fixed id ``<fleet>.aggregator``, ``clean_start=False``,
``SessionExpiryInterval > 0``) subscribed to every client's update and status topics; each global
is published retained with QoS 1 (a late or reconnecting agent gets the newest at once). A ticker
closes timed-out rounds and asynchronous windows. Reconnects with backoff.

`shared_group` subscribes through an MQTT v5 shared subscription (``$share/<group>/…``) so several
aggregator processes can split the update stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiomqtt

from ..aggregator import AggregatorCore
from ..config import BrokerConfig
from ..protocol import Message, ProtocolError, decode, encode
from ..topics import Channel, acks_topic, global_topic, shared_filter, topic_filter, try_parse_topic

__all__ = ["AggregatorService"]

log = logging.getLogger("streamfed.aggregator")


class AggregatorService:
    """Runs one fleet's aggregator against a broker until `stop()`."""

    def __init__(self, core: AggregatorCore, broker: BrokerConfig, tick: float = 0.05,
                 shared_group: str | None = None, client_id: str | None = None) -> None:
        self.core = core
        self.broker = broker
        self.tick = tick
        self.shared_group = shared_group
        self.fleet = core.cfg.fleet
        self.client_id = client_id or f"{self.fleet}.aggregator"
        self._stop = asyncio.Event()
        self.connected = asyncio.Event()
        self.published = 0
        self.ingested = 0
        self.reconnects = 0

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                await self._session()
                backoff = 0.1
            except aiomqtt.MqttError as e:
                self.connected.clear()
                self.reconnects += 1
                log.warning("aggregator: connection lost (%s); retrying in %.1fs", e, backoff)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), backoff)
                backoff = min(backoff * 2, 10.0)

    async def _publish(self, client: aiomqtt.Client, msgs: list[Message]) -> None:
        for m in msgs:
            if m.kind == "ack":
                await client.publish(acks_topic(self.fleet, m.client), encode(m), qos=1)
            else:
                await client.publish(global_topic(self.fleet), encode(m), qos=1, retain=True)
            self.published += 1

    async def _session(self) -> None:
        kw = self.broker.aiomqtt_kwargs(self.client_id, persistent=True)
        async with aiomqtt.Client(**kw, max_queued_incoming_messages=0) as client:
            upd = (shared_filter(self.shared_group, self.fleet) if self.shared_group
                   else topic_filter(Channel.UPDATES, self.fleet))
            await client.subscribe(upd, qos=1)
            await client.subscribe(topic_filter(Channel.STATUS, self.fleet), qos=1)
            await self._publish(client, [self.core.global_message()])  # the current global, retained
            self.connected.set()
            ticker = asyncio.create_task(self._ticker(client))
            receiver = asyncio.create_task(self._receive(client))
            stopper = asyncio.create_task(self._stop.wait())
            try:
                done, _ = await asyncio.wait({ticker, receiver, stopper}, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            finally:
                for t in (ticker, receiver, stopper):
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                        await t

    async def _ticker(self, client: aiomqtt.Client) -> None:
        while True:
            await asyncio.sleep(self.tick)
            await self._publish(client, self.core.tick(time.time()))

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            parsed = try_parse_topic(message.topic.value)
            if isinstance(parsed, str) or parsed.fleet != self.fleet or parsed.client is None:
                self.core.counters.reject("bad_topic")
                continue
            payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
            if parsed.channel == Channel.UPDATES:
                self.ingested += 1
                await self._publish(client, self.core.on_update(parsed.client, bytes(payload)))
            elif parsed.channel == Channel.STATUS:
                try:
                    st = decode(payload, self.core.cfg, client=parsed.client, kinds=("status",))
                except ProtocolError:
                    continue
                await self._publish(client, self.core.on_status(parsed.client, str(st.meta.get("state"))))
