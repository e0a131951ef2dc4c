"""The agent service (:class:`AgentService`): one agent's connection, life cycle and durable state. What it
sends is :mod:`~streamfed.runtime.agent.sending`'s, what it takes in :mod:`~streamfed.runtime.agent.receiving`'s;
the settings named here (in backquotes) are :class:`~streamfed.runtime.agent.settings.AgentSettings` fields.

Connection: MQTT v5 by default (v3.1.1 accepted), QoS 1 for updates, status and subscriptions, a
persistent session (fixed client id ``<fleet>.<client>``, ``clean_start=False``,
``SessionExpiryInterval > 0``), a retained
status topic with an ``offline`` last will, and reconnection with exponential backoff (0.1 s … 10 s).
A connection the broker *refuses* (bad user name or password, not authorised, banned, a refused
subscription, a TLS certificate that does not verify) is logged with the MQTT reason and counted in
:attr:`AgentService.refusals`; after `max_refusals` such refusals in a row `run()` raises
:class:`~streamfed.runtime.session.BrokerRefused` instead of retrying forever (:mod:`streamfed.runtime.session`).

Before the stream starts the agent warms its learner up on a copy and freezes the garbage collector's view of
everything alive (`gc_freeze`), so neither compilation nor full collections land in the sample path.

Durability (`state_dir`): the core's snapshot (learner, error feedback, sequence numbers, outbox), the
number of source items consumed and the sensor parser's state go to ``<state_dir>/agent-<fleet>-<client>.state``
(:mod:`streamfed.fleet.persistence`), **before** any update computed from them is published (write-ahead), at
the latest `checkpoint_interval` seconds after it was computed, at the end of the source and on stop. A
restarted agent resumes there: the source continues after the last item the state covers (items
learned after it are learned again, identically), and the outbox is sent again. Predictions are not
held back: after a crash a reading may be predicted twice (same reading id).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiomqtt

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import BrokerConfig
from streamfed.fleet.persistence import StateStore
from streamfed.fleet.sources import ReadingParser, SkipWatch
from streamfed.runtime.agent.receiving import Receiving
from streamfed.runtime.agent.sending import Sending
from streamfed.runtime.agent.settings import AgentSettings
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.mqtt import IncomingQueue, burst_reads
from streamfed.runtime.session import (
    OP_TIMEOUT,
    PubackWatch,
    check_subscription,
    no_delay,
    reconnect_loop,
    until_lost,
)
from streamfed.wire.message import Message, encode, status_message
from streamfed.wire.topics import acks_topic, global_topic, sensor_topic, status_topic

__all__ = ["AgentService"]

log = logging.getLogger(__name__)
_DEFAULT_SETTINGS = AgentSettings()  # frozen: one for every agent given none


class AgentService(Receiving, Sending):
    """Runs one agent against a broker until its source ends (or `stop()`).

    `source` is an async iterator of :class:`Reading`/:class:`Label`/:class:`Skip`, or a callable
    `source(position)` returning one that starts at item `position` (so a restarted agent need not
    replay what it has learned); with `sensor_features` instead, the agent subscribes to its sensor
    topic and parses JSON readings there. `state_dir`: see the module docstring. `settings`: buffers, flow
    control, delivery, connection, durability and input bounds (:class:`AgentSettings`; the service keeps
    the values it uses as attributes of the same names). Every item from the source
    or the sensor topic passes a :class:`~streamfed.fleet.sources.SkipWatch` (`skip_watch`): the first
    skips of each reason are logged, and a warning when more than `settings.max_skip_share` of the last
    `settings.skip_window` items were skipped.

    >>> from streamfed.fleet.config import FleetConfig
    >>> core = AgentCore(FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3), "a1", 0)
    >>> svc = AgentService(core, BrokerConfig(), sensor_features=["x0", "x1"])
    >>> svc.source_pos, svc.store is None
    (0, True)
    """

    def __init__(self, core: AgentCore, broker: BrokerConfig,
                 source: AsyncIterator[Any] | Callable[[int], AsyncIterator[Any]] | None = None, *,
                 settings: AgentSettings = _DEFAULT_SETTINGS, sensor_features: list[str] | None = None,
                 state_dir: str | os.PathLike[str] | None = None) -> None:
        if source is None and sensor_features is None:
            raise ValueError("an agent needs a source or the features of its MQTT sensor topic")
        self.core = core
        self.broker = broker
        self.settings = s = settings
        if sensor_features is not None and len(sensor_features) != core.cfg.n_inputs:
            raise ValueError(f"{len(sensor_features)} sensor features for a fleet with n_inputs={core.cfg.n_inputs}")
        self.parser = ReadingParser(sensor_features) if sensor_features is not None else None
        # logs the first skips of each reason, and a warning when more than `max_skip_share` of the last
        # `skip_window` items from the source / sensor topic were skipped (the counts are the core's)
        self.skip_watch = SkipWatch(s.max_skip_share, s.skip_window, name=f"agent {core.client_id}", log=log)
        self.fleet, self.client_id = core.cfg.fleet, core.client_id
        self.gc_freeze = s.gc_freeze
        self._init_sending(s)
        self._init_receiving(s)
        # ---- connection and life cycle
        self.linger = s.linger  # seconds to stay connected after the source ends (to receive a last global)
        # lock-step: as long as `_last_global` waits for the last round; async: a few windows
        self.drain = s.drain if s.drain is not None else (30.0 if core.mode == "lockstep" else 5.0)
        self.max_refusals = max(1, int(s.max_refusals))
        self.connect_timeout = s.connect_timeout
        self.refusals: dict[str, int] = {}
        # Joining a running fleet: before its first sample, wait (at most this long, once connected) for the
        # retained global, so that the first prediction already uses the fleet's model as its prior.
        self.wait_for_global = max(0.0, float(s.wait_for_global))
        self._prior_ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._source_done = asyncio.Event()
        self._source_done_at: float | None = None
        self.source_finished = False  # a finite source ran to its end (not stopped): see runtime/agent/summary.py
        self.connected = asyncio.Event()
        self.reconnects = 0
        # ---- durable state
        self.source_pos = 0  # items taken from `source` (a restart continues after them)
        self.checkpoint_interval = s.checkpoint_interval
        self._fresh: list[Message] = []  # updates computed since the last checkpoint: not sendable yet
        self._dirty = False
        self._last_checkpoint = 0.0
        self.checkpoints = 0
        # a state that cannot be written (see checkpoint): since when, and how long before the agent stops
        self._failing_since: float | None = None
        self.checkpoint_deadline = max(0.0, float(s.checkpoint_deadline))
        self._fatal: Exception | None = None  # raised by run() once the agent has stopped
        self.store: StateStore | None = None
        self.restored = False
        if state_dir is not None:
            self.store = StateStore(Path(state_dir) / f"agent-{self.fleet}-{self.client_id}.state", kind="agent")
            self._restore()
        self.source = source(self.source_pos) if callable(source) and not hasattr(source, "__anext__") else source
        self._skip_items = self.source_pos if self.source is source else 0  # a plain iterator starts at 0

    # ------------------------------------------------------------------ durable state
    def _restore(self) -> None:
        assert self.store is not None
        state = self.store.resume(lambda st: self.core.restore(st["core"]))
        if state is None:
            return
        self.source_pos = int(state["source_pos"])
        if self.parser is not None and state.get("parser") is not None:
            self.parser = state["parser"]
        self.updates.extend(self.core.unacknowledged())  # sent again: the aggregator drops what it has
        self.restored = True
        log.info("agent %s: resumed from %s at source item %d, %d samples learned, %d updates to send",
                 self.client_id, self.store.path, self.source_pos, self.core.counters.learned, len(self.updates))

    def checkpoint(self) -> None:
        """Write the state now; updates computed before it become sendable. A write that fails (a full disk,
        a read-only directory) holds every update computed since back — none leaves that the state on disk does
        not cover — marks the agent unhealthy (log, `streamfed_agent_healthy` = 0) and is retried
        every second; past `checkpoint_deadline` the agent stops and :meth:`run` raises
        :class:`~streamfed.runtime.service.CheckpointFailed` (the CLI exits 3)."""
        if self.store is None:
            return
        try:
            self.store.save({"core": self.core.snapshot(), "source_pos": self.source_pos, "parser": self.parser,
                             "saved_at": time.time()})
        except OSError as e:
            self._checkpoint_failed(e)
            return
        if self._failing_since is not None:
            log.warning("agent %s: state written again after %.1f s: %d held update(s) released", self.client_id,
                        time.monotonic() - self._failing_since, len(self._fresh))
            self._failing_since = None
            self.core.stats.healthy = 1.0
        self.checkpoints += 1
        self._last_checkpoint = time.monotonic()
        self._dirty = False
        if self._fresh:
            self.updates.extend(self._fresh)
            self._fresh.clear()
            self._work.set()

    def _checkpoint_failed(self, error: OSError) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self.core.stats.healthy = 0.0
            log.error("agent %s: cannot write its state (%s): updates are held back, retrying every second; the "
                      "agent stops after %.0f s", self.client_id, error, self.checkpoint_deadline)
        elif now - self._failing_since >= self.checkpoint_deadline and self._fatal is None:
            from streamfed.runtime.service import CheckpointFailed

            self._fatal = CheckpointFailed(f"agent {self.client_id}: cannot write its state for "
                                           f"{now - self._failing_since:.0f} s: {error}")
            self.stop()

    def _maybe_checkpoint(self) -> None:
        if self._failing_since is not None:  # the checkpointer retries, once a second
            return
        if self._fresh and time.monotonic() - self._last_checkpoint >= self.checkpoint_interval:
            self.checkpoint()

    async def _checkpointer(self) -> None:
        """Checkpoints what the write-ahead rule left waiting (interval > 0), and progress without updates."""
        period = self.checkpoint_interval if self.checkpoint_interval > 0 else 1.0
        while True:
            await asyncio.sleep(min(period, 1.0) if self._failing_since is not None else period)
            if self._fresh or self._dirty or self._failing_since is not None:
                self.checkpoint()

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()
        self._work.set()
        if self.sensor_lane is not None:
            self.sensor_lane.close()

    def _lost(self) -> None:
        self.connected.clear()
        self.reconnects += 1

    async def run(self) -> None:
        self.core.warm_up()
        if self.gc_freeze:
            # Everything alive now (modules, numba dispatchers, the learner) leaves the collector's view:
            # the full collections that would walk it again and again stop pausing the sample path.
            gc.collect()
            gc.freeze()
        feeder = asyncio.create_task(self._feed(), name=f"feed-{self.client_id}")
        saver = asyncio.create_task(self._checkpointer()) if self.store is not None else None
        try:
            await reconnect_loop(self._session, name=f"agent {self.client_id}", stop=self._stop,
                                 refusals=self.refusals, max_refusals=self.max_refusals, on_lost=self._lost,
                                 finished=self._finished, logger=log)
        finally:
            for task in (feeder, saver):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self.store is not None:
                if self._fresh or self._dirty or self._failing_since is not None:
                    self.checkpoint()
                if self._failing_since is not None and self._fatal is None:
                    from streamfed.runtime.service import CheckpointFailed

                    self._fatal = CheckpointFailed(f"agent {self.client_id}: its state could not be written at stop")
                self.store.close()
            if self.sensor_lane is not None:
                # what became of every message received, in one line (a warning if any was dropped)
                acc = self.input_accounting()
                (log.warning if acc["dropped"] or acc["other"] else log.info)(
                    "agent %s: sensor input at stop: %s", self.client_id, json.dumps(acc, sort_keys=True))
        if self._fatal is not None:
            raise self._fatal

    def _finished(self) -> bool:
        if not self._source_done.is_set() or self.updates or self.predictions or self._fresh:
            return False
        if not self.core.outbox or self._stop.is_set():
            return True
        assert self._source_done_at is not None
        if time.monotonic() - self._source_done_at >= self.drain:
            log.warning("agent %s: leaving with %d updates not yet included in a global (seqs %s)",
                        self.client_id, len(self.core.outbox), sorted(self.core.outbox)[:10])
            return True
        return False

    async def _session(self) -> None:
        offline = encode(status_message(self.fleet, self.client_id, "offline"))
        kw = client_kwargs(self.broker, f"{self.fleet}.{self.client_id}", persistent=True)
        will = aiomqtt.Will(status_topic(self.fleet, self.client_id), offline, qos=1, retain=True)
        incoming = IncomingQueue(limit=self.control_queue, divert=self._divert, on_drop=self._dropped_control)
        mqtt_client = aiomqtt.Client(**kw, will=will, timeout=self.connect_timeout,
                                     queue_type=lambda maxsize=0: incoming)  # type: ignore[arg-type]
        burst_reads(mqtt_client)
        self._incoming = incoming
        async with mqtt_client as client:
            watch = PubackWatch(client)
            receiver = asyncio.create_task(self._receive(client))  # first: it notices a lost connection
            try:
                topics = [global_topic(self.fleet), acks_topic(self.fleet, self.client_id)]
                if self.parser is not None:
                    topics.append(sensor_topic(self.fleet, self.client_id, self.core.cfg.sensor_topic))
                for topic in topics:
                    check_subscription(topic, await until_lost(
                        client.subscribe(topic, qos=1, timeout=OP_TIMEOUT), receiver))
                joining = not self._prior_ready.is_set()
                if joining and self.wait_for_global > 0:
                    await self._await_prior(receiver)
                meta = {"prior_version": int(self.core.global_version)} if joining else {}
                meta.update(self.core.status_meta())  # (ε, δ) spent, with differential privacy on
                self.core.status_changed = False
                await until_lost(client.publish(
                    status_topic(self.fleet, self.client_id), encode(status_message(self.fleet, self.client_id,
                                                                                    "online", meta=meta)),
                    qos=1, retain=True, timeout=OP_TIMEOUT), receiver)
                if joining:
                    if self.core.global_version:
                        log.info("agent %s: joined the fleet with global v%d as its prior", self.client_id,
                                 self.core.global_version)
                    self._prior_ready.set()
                watch.check()
                if self.prediction_qos == 0:
                    # Live QoS 0 predictions leave at once. (At QoS 1 it stays on: two PUBACKs back to back
                    # would meet the broker's own Nagle — Mosquitto's `set_tcp_nodelay` is off by default.)
                    no_delay(client)
                self.connected.set()
                self._client = client
                await self._send(client, receiver, watch)
                if self._finished():
                    await self._last_global()
                    # the last word keeps what the agent says of itself (e.g. its privacy budget ran out)
                    last = encode(status_message(self.fleet, self.client_id, "offline",
                                                 meta=self.core.status_meta())) if self.core.privacy else offline
                    await until_lost(client.publish(status_topic(self.fleet, self.client_id), last, qos=1,
                                                    retain=True, timeout=OP_TIMEOUT), receiver)
            except asyncio.CancelledError:
                # Cancelled (Ctrl-C): the clean DISCONNECT that follows makes the broker discard the last
                # will, so say "offline" ourselves first (bounded: the process is on its way out).
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.publish(status_topic(self.fleet, self.client_id), offline,
                                                          qos=1, retain=True), 1.0)
                raise
            finally:
                self._client = None
                self._check_written()
                self.dropped_predictions += len(self._writing)  # QoS 0, cut off mid-write: lost
                self._writing.clear()
                receiver.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await receiver
                incoming.discard("disconnected")  # globals and acks never read: counted, not silently lost

    async def _await_prior(self, receiver: asyncio.Task[None]) -> None:
        """The retained global (if the fleet has one) arrives right after the subscription: wait for it, at most
        `wait_for_global` seconds (a fleet without a global yet costs that wait once)."""
        deadline = asyncio.get_running_loop().time() + self.wait_for_global
        while not self.core.global_version and not receiver.done():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._global_event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._global_event.wait(), min(left, 0.1))

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
