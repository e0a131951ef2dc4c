"""The receiving half of the agent service (:class:`Receiving`, a part of
:class:`~streamfed.runtime.agent.service.AgentService`): what comes in — globals, acks, sensor messages
or the items of a source — and the stream of samples it makes for the core. The settings named here are
:class:`~streamfed.runtime.agent.settings.AgentSettings` fields.

Incoming (bounded; memory never grows with the input rate): every message the broker delivers is taken
off the socket at once (:func:`~streamfed.runtime.mqtt.burst_reads`: many packets per readable event,
so the broker never has to queue — and drop — globals and acks behind a flood of readings), and put
in one of two bounded queues (:class:`~streamfed.runtime.mqtt.IncomingQueue`):

* sensor messages wait in a lane of at most `sensor_queue` messages and `sensor_queue_bytes` payload
  bytes for the learner, which takes them at its own pace. When it is full the **oldest reading is
  dropped**: a sensor stream wants its newest readings (a prediction of a stale reading is late), and
  after a flood the backlog — and the delay of every prediction — is at most `sensor_queue` readings.
  Each drop is counted as a skipped sample with reason ``queue_full`` (`core.counters.skipped`,
  ``streamfed_agent_samples_skipped_total{reason="queue_full"}``) and in :attr:`AgentService.dropped`,
  and logged as a warning at most every `drop_log_interval` seconds. A sensor message over
  :data:`~streamfed.fleet.sources.MAX_MESSAGE_BYTES` is skipped as ``malformed`` without being queued.
  What the lane still holds when the agent stops is counted too (reason ``stopped``), so every message
  received is learned, skipped or dropped by reason: :meth:`AgentService.input_accounting`;
* globals and acks (the aggregator's) wait for the receiver, at most `control_queue` of them, the
  oldest dropped and counted (a newer global supersedes an older one; a lost ack is made good by the
  resend timer); those left when a session ends are counted as ``disconnected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any

import aiomqtt

from streamfed.fleet.secure_aggregation import DOWN_KINDS as SECAGG_DOWN
from streamfed.fleet.sources import MAX_MESSAGE_BYTES, Label, Reading, Skip, SkipReason
from streamfed.runtime.mqtt import IncomingQueue, Lane
from streamfed.runtime.shared_globals import install_global
from streamfed.wire.message import ProtocolError, decode
from streamfed.wire.topics import acks_topic, global_topic, sensor_topic

if TYPE_CHECKING:
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.persistence import StateStore
    from streamfed.fleet.sources import ReadingParser, SkipWatch
    from streamfed.runtime.agent.settings import AgentSettings

__all__ = ["Receiving"]

log = logging.getLogger(__name__)
# The feeder learns for at most this long before it lets the socket reader, the receiver and the sender
# in: a backlog of readings is learned in slices, and globals, acks and PUBACKs are not held up behind it.
_FEED_SLICE = 0.002


class Receiving:
    """What an :class:`~streamfed.runtime.agent.service.AgentService` takes in: the messages its session
    receives (globals installed, acks answered, sensor messages queued), and the stream of items — from its
    source or its sensor lane — that it feeds to the core, with every input dropped unread counted.

    A part of the service, not an object of its own: :meth:`_init_receiving` sets up the state below; the
    stream hands what the core makes to the sending half (:class:`~streamfed.runtime.agent.sending.Sending`)
    and checkpoints through the service."""

    # the service's, read here
    core: AgentCore
    fleet: str
    client_id: str
    parser: ReadingParser | None
    skip_watch: SkipWatch
    source: Any
    source_pos: int
    store: StateStore | None
    connect_timeout: float
    wait_for_global: float
    _skip_items: int
    _dirty: bool
    _work: asyncio.Event
    _stop: asyncio.Event
    _prior_ready: asyncio.Event
    _source_done: asyncio.Event
    source_finished: bool
    _source_done_at: float | None
    _sent_at: dict[int, float]

    def _init_receiving(self, s: AgentSettings) -> None:
        # ---- bounded input (see the module docstring)
        self._sensor_topic = sensor_topic(self.fleet, self.client_id, self.core.cfg.sensor_topic)
        self._global_topic, self._acks_topic = global_topic(self.fleet), acks_topic(self.fleet, self.client_id)
        self.sensor_lane: Lane | None = (
            Lane(s.sensor_queue, s.sensor_queue_bytes, "drop_oldest", self._dropped_reading)
            if self.parser is not None else None)
        self.control_queue = max(1, int(s.control_queue))
        self._incoming: IncomingQueue | None = None  # the current session's queue of globals and acks
        self.received: dict[str, int] = {}  # channel (sensor, global, ack) → messages taken off the socket
        self.dropped: dict[str, dict[str, int]] = {}  # channel → reason → messages dropped unread
        self.drop_log_interval = s.drop_log_interval
        self._drops_unlogged: dict[str, int] = {}
        self._drop_log_due = 0.0  # (monotonic) the next drop warning may not come before this
        self._drop_log_timer: asyncio.TimerHandle | None = None
        # ---- globals and acks
        self._global_event = asyncio.Event()  # a global was installed
        self.rejected_acks = 0
        # the acks topic also carries the aggregator's secure-aggregation steps when the fleet uses them
        self._ack_kinds: tuple[str, ...] = ("ack", *(SECAGG_DOWN if self.core.secagg is not None else ()))
        # An ack lists what the aggregator holds when it makes it; updates sent just before it arrives are
        # most likely on their way, not lost (e.g. the ack an aggregator sends when this agent comes
        # online): they are resent on an ack only once this old, or when the ack names them missing.
        self.ack_grace = s.ack_grace

    # ------------------------------------------------------------------ receiving
    def _divert(self, message: Any) -> tuple[Lane, Any] | None:
        """Called for every message paho reads (inside its read callback): a sensor message goes to the
        sensor lane — its payload only, a few hundred bytes instead of aiomqtt's message with its
        properties; an oversized one as the skip it will be, without its bytes. Counts what arrives."""
        topic = message.topic.value
        channel = ("sensor" if topic == self._sensor_topic else "global" if topic == self._global_topic
                   else "ack" if topic == self._acks_topic else "other")
        self.received[channel] = self.received.get(channel, 0) + 1
        if channel != "sensor" or self.sensor_lane is None:
            # Nothing here reads a message's MQTT 5 properties, which paho builds as some fifty objects: let them
            # go now, not when the receiver gets to the message. A secure-aggregation stage queues one message at
            # each of a thousand simulated agents at once, and the collector walked those objects again and again.
            if getattr(message, "properties", None) is not None:
                message.properties = None
            return None
        payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
        if len(payload) > MAX_MESSAGE_BYTES:
            return self.sensor_lane, Skip(SkipReason.MALFORMED, f"a message of {len(payload)} bytes "
                                                                f"(at most {MAX_MESSAGE_BYTES})")
        return self.sensor_lane, payload

    async def _receive(self, client: aiomqtt.Client) -> None:
        gtopic, atopic = self._global_topic, self._acks_topic
        async for message in client.messages:
            topic = message.topic.value
            payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
            if topic == gtopic:
                result = install_global(self.core, bytes(payload))
                if result.installed:
                    self._dirty = True  # the outbox shrank, the learner changed
                    self._global_event.set()
                    self._sync_hold()
                    self._work.set()
                elif result.reason is not None:
                    log.warning("agent %s: global rejected (%s): %s", self.client_id, result.reason, result.detail)
            elif topic == atopic:
                self._ack(bytes(payload))
            # sensor messages never come here: IncomingQueue hands them to `sensor_lane` (see _divert)
            # Not kept while waiting for the next one: paho's MQTT 5 properties of a message are some fifty
            # objects, and a thousand simulated agents each holding its last secure-aggregation step made every
            # full collection of the round walk them (issue 29)
            del message, payload

    def _ack(self, payload: bytes) -> None:
        try:
            msg = decode(payload, self.core.cfg, client=self.client_id, kinds=self._ack_kinds)
        except ProtocolError as e:
            self.rejected_acks += 1
            log.warning("agent %s: ack rejected: %s", self.client_id, e)
            return
        if msg.kind != "ack":  # a secure-aggregation step: the replies go out with the updates
            self._secagg(self.core.on_secagg(msg))
            return
        now = time.monotonic()
        missing = set(msg.arrays["missing"].tolist()) if "missing" in msg.arrays else set()
        held = self.core.on_ack(msg)
        n = self.resend([m for m in held if m.seq in missing
                         or now - self._sent_at.get(m.seq, -math.inf) >= self.ack_grace])
        if n:
            log.info("agent %s: the aggregator holds seqs up to %d; %d updates sent again", self.client_id,
                     msg.included.get(self.client_id, 0), n)

    # ------------------------------------------------------------------ the stream
    async def _feed(self) -> None:
        try:
            if self.wait_for_global > 0 and not self.core.global_version:
                # a joining agent starts from the fleet's global; offline, it starts alone after the wait
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._prior_ready.wait(), self.connect_timeout + self.wait_for_global)
            if self.source is not None:
                async for item in self.source:
                    if self._stop.is_set():
                        break
                    if self._skip_items:  # a restarted agent with a plain iterator: learned already
                        self._skip_items -= 1
                        continue
                    await self._take_async(item)
                self.source_finished = not self._stop.is_set()  # ended on its own: the run's summary is due
                msgs, _ = self.core.end_of_stream(durable=self.store is not None)
                self._queue(None, msgs)
                self._dirty = True
                if self.store is not None:
                    self.checkpoint()
            elif self.sensor_lane is not None:
                await self._feed_sensor(self.sensor_lane)
        finally:
            if self.sensor_lane is not None:
                self.sensor_lane.clear("stopped")  # received, never learned: counted (input_accounting)
                self._log_drops()
            self.skip_watch.close()
            self._source_done_at = time.monotonic()
            self._source_done.set()
            self._work.set()

    async def _feed_sensor(self, lane: Lane) -> None:
        """Learn the sensor lane's messages in order, yielding to the event loop every `_FEED_SLICE`
        seconds of work (the lane's `get()` does not yield while messages wait)."""
        assert self.parser is not None
        loop = asyncio.get_running_loop()
        turn = loop.time()
        while not self._stop.is_set():
            if lane:
                item = lane.get_nowait()
            else:
                item = await lane.get()
                turn = loop.time()
                if item is None:  # closed
                    break
            await self._take_now(item if isinstance(item, Skip) else self.parser.parse(item))
            if loop.time() - turn >= _FEED_SLICE:
                await asyncio.sleep(0)
                turn = loop.time()

    async def _take_async(self, item: Any) -> None:
        if isinstance(item, Reading) and item.y is not None:
            while (need := self.core.waiting_for) is not None and not self._stop.is_set():
                self._global_event.clear()
                if self.core.global_version >= need:
                    break
                await self._global_event.wait()
            while self._backpressure() and not self._stop.is_set():  # back-pressure from the broker
                await asyncio.sleep(0.01)
        await self._take_now(item, from_source=True)

    async def _take_now(self, item: Any, from_source: bool = False) -> None:
        """A reading's prediction is published before anything else is done with it: the core predicts
        (POF-MKL: its fused predict-and-update step), the prediction goes out, and only then is the
        sample learned (FedBNR), the update taken and built, the state checkpointed."""
        self.skip_watch.observe(item)
        self.core.stats.recent_skip_ratio = self.skip_watch.share
        if not isinstance(item, Reading) or (item.y is not None and self.core.waiting_for is not None):
            self._take(item, from_source)
            return
        if from_source:
            self.source_pos += 1
        pred, pending = self.core.begin_reading(item)
        try:
            if pred is not None:
                self._emit(pred)
        finally:  # a POF-MKL step taken must reach the error feedback whatever happened
            self._queue(None, self.core.finish_reading(pending))
            self._dirty = True
            self._maybe_checkpoint()

    def _take(self, item: Any, from_source: bool = False) -> None:
        if from_source:
            self.source_pos += 1
        if isinstance(item, Reading):
            if item.y is not None and self.core.waiting_for is not None:
                self.core.on_skip(Skip("lockstep_busy"))  # MQTT-fed lock-step agent got ahead of its round
                return
            pred, msgs = self.core.on_reading(item)
            self._queue(pred, msgs)
        elif isinstance(item, Label):
            if self.core.waiting_for is not None:  # as a labelled reading: a lock-step agent learns in its round
                self.core.on_skip(Skip("lockstep_busy"))
                return
            self._queue(None, self.core.on_label(item))
        elif isinstance(item, Skip):
            self.core.on_skip(item)
        self._dirty = True
        self._maybe_checkpoint()

    # ------------------------------------------------------------------ dropped input
    def _dropped_reading(self, item: Any, reason: str) -> None:
        """A sensor message the lane dropped: a skipped sample with that reason, counted at once."""
        self.core.on_skip(Skip(reason))
        self._note_drop("sensor", reason)

    def _dropped_control(self, message: Any, reason: str) -> None:
        topic = getattr(getattr(message, "topic", None), "value", None)
        self._note_drop("global" if topic == self._global_topic else "ack" if topic == self._acks_topic
                        else "other", reason)

    def _note_drop(self, channel: str, reason: str) -> None:
        by_reason = self.dropped.setdefault(channel, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1
        key = f"{channel} {reason}"
        self._drops_unlogged[key] = self._drops_unlogged.get(key, 0) + 1
        if reason == "stopped":
            return  # said once, by the summary at the end of the feeder
        now = time.monotonic()
        if now >= self._drop_log_due:
            self._log_drops()
        elif self._drop_log_timer is None:
            # drops after a warning are said at the next one, also when the flood stops before it
            with contextlib.suppress(RuntimeError):  # no running loop (a test calling in directly)
                self._drop_log_timer = asyncio.get_running_loop().call_later(
                    self._drop_log_due - now, self._log_drops)

    def _log_drops(self) -> None:
        """One warning for the drops since the last one (rate-limited: see `drop_log_interval`)."""
        if self._drop_log_timer is not None:
            self._drop_log_timer.cancel()
            self._drop_log_timer = None
        if not self._drops_unlogged:
            return
        since = ", ".join(f"{n} {key}" for key, n in sorted(self._drops_unlogged.items()))
        self._drops_unlogged.clear()
        self._drop_log_due = time.monotonic() + self.drop_log_interval
        lane = self.sensor_lane
        held = (f"; the sensor queue holds {len(lane)} of at most {lane.limit} messages, the oldest dropped when "
                f"full" if lane is not None else "")
        log.warning("agent %s: input dropped unread: %s (in all: %s)%s", self.client_id, since,
                    self.input_accounting(), held)

    def input_accounting(self) -> dict[str, Any]:
        """What became of the sensor messages received (`received`): `learned` samples, `skipped` ones
        by reason (the parser's and the core's; the drops below not included), `dropped` ones by reason
        (``queue_full``; ``stopped``: still waiting when the agent stopped), and `waiting` (in the lane now);
        `other`: drops of globals and acks by channel and reason. For a stream of labelled readings
        `received = learned + Σ skipped + Σ dropped + waiting` exactly; a reading whose label comes later
        is two messages and one sample (it waits in the label join, `core.join`, meanwhile).

        >>> from streamfed.fleet.agent import AgentCore
        >>> from streamfed.fleet.config import BrokerConfig, FleetConfig
        >>> from streamfed.runtime.agent import AgentService
        >>> svc = AgentService(AgentCore(FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=1, n_kernels=2,
        ...                    n_features=3), "a1", 0), BrokerConfig(), sensor_features=["x"])
        >>> svc.input_accounting()["received"]
        0
        """
        dropped = dict(self.dropped.get("sensor", {}))
        skipped = {r: n for r, n in self.core.counters.skipped.items() if r not in dropped and n}
        return {"received": self.received.get("sensor", 0), "learned": self.core.counters.learned,
                "skipped": skipped, "dropped": dropped,
                "waiting": len(self.sensor_lane) if self.sensor_lane is not None else 0,
                "other": {ch: by for ch, by in self.dropped.items() if ch != "sensor"}}
