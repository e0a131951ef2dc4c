"""The agent's asyncio/MQTT shell around :class:`streamfed.agent.AgentCore`.

Connection: MQTT v5 by default (v3.1.1 accepted), QoS 1 throughout, a persistent session (fixed
client id ``<fleet>.<client>``, ``clean_start=False``, ``SessionExpiryInterval > 0``), a retained
status topic with an ``offline`` last will, and reconnection with exponential backoff (0.1 s … 10 s).

Outgoing buffer (bounded; memory never grows without bound):

* predictions wait in a ring of `prediction_buffer` entries — when it is full the **oldest
  prediction is dropped** and counted (`dropped_predictions`): a late prediction is worth little;
* updates are **never dropped**: at most `update_buffer` messages wait; while that is full the agent
  stops taking updates out of the learner — POF-MKL (async) keeps accumulating them in its
  error-feedback buffer (fixed size `N·2D`), FedBNR keeps its pending statistics (fixed size `K·F²`),
  a lock-step POF-MKL agent has at most one update in flight by construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import aiomqtt

from ..agent import AgentCore, Prediction
from ..config import BrokerConfig
from ..protocol import Message, ProtocolError, decode, encode, status_message
from ..sources import Label, Reading, ReadingParser, Skip
from ..topics import acks_topic, global_topic, predictions_topic, sensor_topic, status_topic, updates_topic

__all__ = ["AgentService"]

log = logging.getLogger("streamfed.agent")
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 10.0


class AgentService:
    """Runs one agent against a broker until its source ends (or `stop()`).

    `source` is an async iterator of :class:`Reading`/:class:`Label`/:class:`Skip`; with
    `sensor_features` instead, the agent subscribes to its sensor topic and parses JSON readings there.
    """

    def __init__(self, core: AgentCore, broker: BrokerConfig, source: AsyncIterator[Any] | None = None,
                 sensor_features: list[str] | None = None, prediction_buffer: int = 1000,
                 update_buffer: int = 64, linger: float = 0.0, max_inflight: int = 32) -> None:
        if source is None and sensor_features is None:
            raise ValueError("an agent needs a source or the features of its MQTT sensor topic")
        self.core = core
        self.broker = broker
        self.source = source
        self.parser = ReadingParser(sensor_features) if sensor_features is not None else None
        self.fleet, self.client_id = core.cfg.fleet, core.client_id
        self.predictions: deque[Message] = deque(maxlen=prediction_buffer)
        self.updates: deque[Message] = deque()
        self.update_buffer = update_buffer
        self.max_inflight = max_inflight
        self.dropped_predictions = 0
        self.linger = linger  # seconds to stay connected after the source ends (to receive a last global)
        self._work = asyncio.Event()
        self._global_event = asyncio.Event()
        self._stop = asyncio.Event()
        self._source_done = asyncio.Event()
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.latencies: deque[float] = deque(maxlen=10_000)  # sample arrival → prediction published
        self.on_prediction = None  # optional callback(Prediction) for live views

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()
        self._work.set()

    async def run(self) -> None:
        feeder = asyncio.create_task(self._feed(), name=f"feed-{self.client_id}")
        backoff = _BACKOFF_MIN
        try:
            while not self._stop.is_set():
                try:
                    await self._session()
                    backoff = _BACKOFF_MIN
                    if self._finished():
                        break
                except aiomqtt.MqttError as e:
                    self.connected.clear()
                    self.reconnects += 1
                    log.warning("agent %s: connection lost (%s); retrying in %.1fs", self.client_id, e, backoff)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder

    def _finished(self) -> bool:
        return self._source_done.is_set() and not self.updates and not self.predictions

    async def _session(self) -> None:
        offline = encode(status_message(self.fleet, self.client_id, "offline"))
        kw = self.broker.aiomqtt_kwargs(f"{self.fleet}.{self.client_id}", persistent=True)
        will = aiomqtt.Will(status_topic(self.fleet, self.client_id), offline, qos=1, retain=True)
        async with aiomqtt.Client(**kw, will=will) as client:
            await client.subscribe(global_topic(self.fleet), qos=1)
            await client.subscribe(acks_topic(self.fleet, self.client_id), qos=1)
            if self.parser is not None:
                await client.subscribe(sensor_topic(self.fleet, self.client_id, self.core.cfg.sensor_topic), qos=1)
            await client.publish(status_topic(self.fleet, self.client_id),
                                 encode(status_message(self.fleet, self.client_id, "online")), qos=1, retain=True)
            self.connected.set()
            receiver = asyncio.create_task(self._receive(client))
            try:
                await self._send(client)
                if self._finished():
                    await self._last_global()
                    await client.publish(status_topic(self.fleet, self.client_id), offline, qos=1, retain=True)
            finally:
                receiver.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiver

    async def _last_global(self) -> None:
        """Before leaving: a lock-step agent waits for the global of its last round; any agent may
        linger a moment to pick up the global that includes its last update."""
        deadline = asyncio.get_running_loop().time() + max(self.linger, 30.0 if self.core.mode == "lockstep" else 0)
        while self.core.waiting_for is not None and asyncio.get_running_loop().time() < deadline:
            self._global_event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._global_event.wait(), 0.1)
        if self.linger and self.core.mode != "lockstep":
            await asyncio.sleep(self.linger)

    # ------------------------------------------------------------------ sending
    async def _send(self, client: aiomqtt.Client) -> None:
        """Publish buffered messages, updates first, with up to `max_inflight` QoS 1 publishes awaiting
        their PUBACK at once (one at a time would cap an agent at one message per round trip). A message
        leaves its buffer only when acknowledged; on a lost connection the unacknowledged ones go back
        to the front, in order, and are sent again (the aggregator drops duplicates by seq)."""
        inflight: dict[asyncio.Task[None], tuple[deque[Message], Message, int]] = {}
        try:
            while True:
                while (self.updates or self.predictions) and len(inflight) < self.max_inflight:
                    queue = self.updates if self.updates else self.predictions
                    msg = queue.popleft()
                    payload = encode(msg)
                    topic = (updates_topic if queue is self.updates else predictions_topic)(self.fleet, self.client_id)
                    task = asyncio.create_task(client.publish(topic, payload, qos=1))
                    inflight[task] = (queue, msg, len(payload))
                if inflight:
                    done, _ = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        queue, msg, nbytes = inflight.pop(task)
                        task.result()  # raises MqttError on a lost connection
                        self._sent(queue is self.updates, msg, nbytes)
                    continue
                if self._finished() or self._stop.is_set():
                    return
                self._work.clear()
                await self._work.wait()
        finally:
            for task, (queue, msg, _) in sorted(inflight.items(), key=lambda kv: -kv[1][1].seq):
                task.cancel()
                queue.appendleft(msg)  # back to the front, lowest seq first

    def _sent(self, is_update: bool, msg: Message, nbytes: int) -> None:
        if is_update:
            self.core.counters.updates += 1
            self.core.counters.bytes_uploaded += nbytes
            self.core.stats.uploaded(nbytes)
            self.core.hold_uploads = len(self.updates) >= self.update_buffer
        else:
            self.latencies.append(max(0.0, time.time() - msg.created + float(msg.meta.get("latency_s", 0.0))))

    def _queue(self, pred: Prediction | None, msgs: list[Message]) -> None:
        if pred is not None:
            if len(self.predictions) == self.predictions.maxlen:
                self.dropped_predictions += 1  # deque(maxlen) drops the oldest on append
            self.predictions.append(self.core.prediction_message(pred))
            if self.on_prediction is not None:
                self.on_prediction(pred)
        self.updates.extend(msgs)
        self.core.hold_uploads = len(self.updates) >= self.update_buffer
        self._work.set()

    # ------------------------------------------------------------------ receiving
    async def _receive(self, client: aiomqtt.Client) -> None:
        gtopic = global_topic(self.fleet)
        atopic = acks_topic(self.fleet, self.client_id)
        async for message in client.messages:
            topic = message.topic.value
            payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
            if topic == gtopic:
                try:
                    msg = decode(payload, self.core.cfg, kernel_version=self.core.kernel_version,
                                 kinds=(self.core.cfg.global_kind,))
                except ProtocolError as e:
                    self.core.counters.rejected_globals += 1
                    log.warning("agent %s: global rejected: %s", self.client_id, e)
                    continue
                if self.core.on_global(msg):
                    self._global_event.set()
            elif topic == atopic:
                continue  # the global's `included` map carries the same information for now
            elif self.parser is not None:
                self._take(self.parser.parse(payload))

    # ------------------------------------------------------------------ the stream
    async def _feed(self) -> None:
        try:
            if self.source is not None:
                async for item in self.source:
                    if self._stop.is_set():
                        break
                    await self._take_async(item)
                self._queue(None, self.core.flush())
            else:
                await self._stop.wait()
        finally:
            self._source_done.set()
            self._work.set()

    async def _take_async(self, item: Any) -> None:
        if isinstance(item, Reading) and item.y is not None:
            while (need := self.core.waiting_for) is not None and not self._stop.is_set():
                self._global_event.clear()
                if self.core.global_version >= need:
                    break
                await self._global_event.wait()
            while self.core.hold_uploads and not self._stop.is_set():  # back-pressure from the broker
                await asyncio.sleep(0.01)
        self._take(item)

    def _take(self, item: Any) -> None:
        if isinstance(item, Reading):
            if item.y is not None and self.core.waiting_for is not None:
                self.core.on_skip(Skip("lockstep_busy"))  # MQTT-fed lock-step agent got ahead of its round
                return
            pred, msgs = self.core.on_reading(item)
            self._queue(pred, msgs)
        elif isinstance(item, Label):
            self._queue(None, self.core.on_label(item))
        elif isinstance(item, Skip):
            self.core.on_skip(item)
