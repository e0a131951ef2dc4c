"""The aggregator's asyncio/MQTT shell around :class:`streamfed.aggregator.AggregatorCore`.

A persistent QoS 1 session (fixed id ``<fleet>.aggregator``, ``clean_start=False``,
``SessionExpiryInterval > 0``) subscribed to every client's update and status topics; each global
is published retained with QoS 1 (a late or reconnecting agent gets the newest at once). A ticker
closes timed-out rounds and asynchronous windows. Reconnects with backoff; a connection the broker
refuses is logged with its MQTT reason, counted in :attr:`AggregatorService.refusals`, and after
`max_refusals` refusals in a row `run()` raises :class:`~streamfed.runtime.agent.BrokerRefused`.

On every (re)connect it publishes the current global and an `ack` to every known client saying which
sequence numbers it holds, so agents send again whatever it does not (lost in a crash, say).

Durability (`state_dir`): the core's state goes to ``<state_dir>/aggregator-<fleet>.state``
(:mod:`streamfed.persistence`) atomically **before** each global that reflects it is published, and on
stop; a restarted aggregator resumes from it (version, θ or statistics, pending rounds or window,
sequence tracker). Updates it had taken in but not checkpointed are sent again by their agents.

`shared_group` subscribes through an MQTT v5 shared subscription (``$share/<group>/…``) so several
aggregator processes can split the update stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

import aiomqtt

from ..aggregator import AggregatorCore
from ..config import BrokerConfig
from ..persistence import StateError, StateStore
from ..protocol import Message, ProtocolError, decode, encode
from ..topics import (
    Channel,
    ParsedTopic,
    acks_topic,
    global_topic,
    shared_filter,
    topic_filter,
    try_parse_topic,
)
from .agent import OP_TIMEOUT, PubackWatch, check_subscription, reconnect_loop, until_lost

__all__ = ["AggregatorService"]

log = logging.getLogger("streamfed.aggregator")
_BATCH = 256  # queued messages taken per receive step
_TOPIC_CACHE = 4096  # parsed topics remembered (one per client and channel)


class AggregatorService:
    """Runs one fleet's aggregator against a broker until `stop()`.

    >>> from streamfed.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    >>> svc = AggregatorService(AggregatorCore(cfg, mode="async"), BrokerConfig())
    >>> svc.client_id, svc.store is None
    ('f.aggregator', True)
    """

    def __init__(self, core: AggregatorCore, broker: BrokerConfig, tick: float = 0.05,
                 shared_group: str | None = None, client_id: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, max_refusals: int = 3,
                 connect_timeout: float = 5.0) -> None:
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
        self.max_refusals = max(1, int(max_refusals))
        self.connect_timeout = connect_timeout  # see streamfed.runtime.agent.OP_TIMEOUT
        self.refusals: dict[str, int] = {}
        self.store: StateStore | None = None
        self._watch: PubackWatch | None = None
        self.restored = False
        self._topics: dict[str, ParsedTopic | str] = {}  # topic → try_parse_topic's answer
        if state_dir is not None:
            self.store = StateStore(Path(state_dir) / f"aggregator-{self.fleet}.state", kind="aggregator")
            self._restore()
            core.checkpoint = self._save

    # ------------------------------------------------------------------ durable state
    def _restore(self) -> None:
        assert self.store is not None
        try:
            state = self.store.load()
            if state is None:
                return
            self.core.restore(state["core"])
        except StateError:
            self.store.close()
            raise
        except (ValueError, KeyError, TypeError) as e:
            self.store.close()
            raise StateError(self.store.path, f"cannot resume from it: {e}") from None
        self.restored = True
        log.info("aggregator %s: resumed from %s at global version %d", self.fleet, self.store.path,
                 self.core.version)

    def _save(self, core: AggregatorCore) -> None:
        assert self.store is not None
        # An OSError here propagates and stops the service: a global that is not on disk is never published.
        self.store.save({"core": core.snapshot(), "saved_at": time.time()})

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()

    def _lost(self) -> None:
        self.connected.clear()
        self.reconnects += 1

    async def run(self) -> None:
        self.core.warm_up()
        try:
            await reconnect_loop(self._session, name=f"aggregator {self.fleet}", stop=self._stop,
                                 refusals=self.refusals, max_refusals=self.max_refusals, on_lost=self._lost,
                                 logger=log)
        finally:
            if self.store is not None:
                with contextlib.suppress(OSError):
                    self._save(self.core)
                self.store.close()

    async def _publisher(self, client: aiomqtt.Client, outbox: asyncio.Queue[Message]) -> None:
        """Publishes what the core returns, in order. Apart from the receiver, so that the receiver keeps
        reading (and notices a lost connection at once) while a publish waits for its PUBACK."""
        while True:
            m = await outbox.get()
            if m.kind == "ack":
                await client.publish(acks_topic(self.fleet, m.client), encode(m), qos=1, timeout=OP_TIMEOUT)
            else:
                await client.publish(global_topic(self.fleet), encode(m), qos=1, retain=True, timeout=OP_TIMEOUT)
            if self._watch is not None:
                self._watch.check()  # e.g. this user may not write the global topic
            self.published += 1

    async def _session(self) -> None:
        kw = self.broker.aiomqtt_kwargs(self.client_id, persistent=True)
        async with aiomqtt.Client(**kw, max_queued_incoming_messages=0, timeout=self.connect_timeout) as client:
            self._watch = PubackWatch(client)
            outbox: asyncio.Queue[Message] = asyncio.Queue()
            receiver = asyncio.create_task(self._receive(client, outbox))
            tasks = [receiver]
            try:
                upd = (shared_filter(self.shared_group, self.fleet) if self.shared_group
                       else topic_filter(Channel.UPDATES, self.fleet))
                for topic in (upd, topic_filter(Channel.STATUS, self.fleet)):
                    check_subscription(topic, await until_lost(
                        client.subscribe(topic, qos=1, timeout=OP_TIMEOUT), receiver))
                # the current global, retained, then what we hold per client (agents resend the rest)
                for m in [self.core.global_message(), *self.core.hello()]:
                    outbox.put_nowait(m)
                tasks += [asyncio.create_task(self._publisher(client, outbox)),
                          asyncio.create_task(self._ticker(outbox))]
                self.connected.set()
                stopper = asyncio.create_task(self._stop.wait())
                tasks.append(stopper)
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            finally:
                for t in tasks:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                        await t

    async def _ticker(self, outbox: asyncio.Queue[Message]) -> None:
        while True:
            await asyncio.sleep(self.tick)
            for m in self.core.tick(time.time()):
                outbox.put_nowait(m)

    async def _receive(self, client: aiomqtt.Client, outbox: asyncio.Queue[Message]) -> None:
        # aiomqtt hands out one message per `async for` step, at the price of a task and an
        # `asyncio.wait` each; the messages already waiting behind it are taken in the same step
        # (at most `_BATCH`, so the ticker and publisher still get their turn). Same order, same handling.
        queue = getattr(client, "_queue", None)  # aiomqtt < 3: the incoming queue `messages` reads
        drain = getattr(queue, "get_nowait", None)
        async for message in client.messages:
            self._take(message, outbox)
            if drain is None:
                continue
            for _ in range(_BATCH):
                try:
                    message = drain()
                except asyncio.QueueEmpty:
                    break
                self._take(message, outbox)

    def _take(self, message: aiomqtt.Message, outbox: asyncio.Queue[Message]) -> None:
        topic = message.topic.value
        parsed = self._topics.get(topic)
        if parsed is None:
            parsed = try_parse_topic(topic)
            if len(self._topics) >= _TOPIC_CACHE:
                self._topics.clear()
            self._topics[topic] = parsed
        if isinstance(parsed, str) or parsed.fleet != self.fleet or parsed.client is None:
            self.core.counters.reject("bad_topic")
            return
        payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
        if parsed.channel == Channel.UPDATES:
            self.ingested += 1
            out = self.core.on_update(parsed.client, bytes(payload))
        elif parsed.channel == Channel.STATUS:
            try:
                st = decode(payload, self.core.cfg, client=parsed.client, kinds=("status",))
            except ProtocolError as e:
                self.core.counters.reject("bad_status")
                log.debug("status on %s rejected: %s", topic, e)
                return
            out = self.core.on_status(parsed.client, str(st.meta.get("state")))
        else:
            return
        for m in out:
            outbox.put_nowait(m)
