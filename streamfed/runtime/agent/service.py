"""The agent's asyncio/MQTT shell around :class:`streamfed.fleet.agent.AgentCore`.

Connection: MQTT v5 by default (v3.1.1 accepted), QoS 1 for updates, status and subscriptions, a
persistent session (fixed client id ``<fleet>.<client>``, ``clean_start=False``,
``SessionExpiryInterval > 0``), a retained
status topic with an ``offline`` last will, and reconnection with exponential backoff (0.1 s … 10 s).
A connection the broker *refuses* (bad user name or password, not authorised, banned, a refused
subscription, a TLS certificate that does not verify) is logged with the MQTT reason and counted in
:attr:`AgentService.refusals`; after `max_refusals` such refusals in a row `run()` raises
:class:`~streamfed.runtime.session.BrokerRefused` instead of retrying forever (:mod:`streamfed.runtime.session`).

Predictions are a live stream: by default (`prediction_qos=0`) each is published at QoS 0 the moment
it exists — written to the socket (Nagle off) before its sample is learned (FedBNR) or its update taken
from the error feedback, built, encoded or sent; the agent's :attr:`AgentService.latencies` run from the
sample's arrival to that write. With `prediction_qos=1` they go through the sender like updates and the
latency runs to the PUBACK. Before the stream starts the agent warms its learner up on a copy and
freezes the garbage collector's view of everything alive (`gc_freeze`), so neither compilation nor full
collections land in the sample path.

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

Outgoing buffer (bounded; memory never grows without bound):

* predictions that cannot go out at once (no connection, older ones still waiting, QoS 1) wait in a
  ring of `prediction_buffer` entries — when it is full the **oldest prediction is dropped** and
  counted (`dropped_predictions`): a late prediction is worth little;
* updates are **never dropped**: at most `update_buffer` messages wait; while that is full the agent
  stops taking updates out of the learner — POF-MKL (async) keeps accumulating them in its
  error-feedback buffer (fixed size `N·2D`), FedBNR keeps its pending statistics (fixed size `K·F²`),
  a lock-step POF-MKL agent has at most one update in flight by construction. The same holds while
  `outbox_limit` updates are sent but not yet included in a global.

Delivery: an update stays in the core's outbox until a global that includes it is installed; it is sent
again when an `ack` from the aggregator shows it does not hold it (the aggregator acks every client
when it (re)connects or comes online, and clients with gaps after each global) — at once if the ack
names it missing or it was sent over `ack_grace` seconds before, else it is probably still on its way
and its timer decides — and when it has waited `resend_after` seconds. The aggregator drops
duplicates, so the effect is exactly once. When its source ends the agent stays up to `drain` seconds
for its updates to be included.

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
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt

from streamfed.fleet.agent import AgentCore, Prediction
from streamfed.fleet.config import BrokerConfig
from streamfed.fleet.persistence import StateStore
from streamfed.fleet.secure_aggregation import DOWN_KINDS as SECAGG_DOWN
from streamfed.fleet.sources import MAX_MESSAGE_BYTES, Label, Reading, ReadingParser, Skip, SkipReason, SkipWatch
from streamfed.runtime.agent.settings import AgentSettings
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.mqtt import IncomingQueue, Lane, burst_reads, paho_of, pending_publishes
from streamfed.runtime.session import (
    OP_TIMEOUT,
    PubackWatch,
    check_subscription,
    no_delay,
    publish_now,
    reconnect_loop,
    until_lost,
)
from streamfed.runtime.shared_globals import install_global
from streamfed.wire.message import Message, ProtocolError, decode, encode, status_message
from streamfed.wire.topics import (
    acks_topic,
    global_topic,
    predictions_topic,
    sensor_topic,
    status_topic,
    updates_topic,
)

__all__ = ["AgentService"]

log = logging.getLogger(__name__)
# The feeder learns for at most this long before it lets the socket reader, the receiver and the sender
# in: a backlog of readings is learned in slices, and globals, acks and PUBACKs are not held up behind it.
_FEED_SLICE = 0.002
_WAKE = 0.25  # an idle sender with a partly written prediction looks again this often
# An idle sender sleeps until its next deadline (a resend timer, the drain); in any case it looks again
# this often. (A fixed short wake-up was four timers a second per agent: with a thousand agents in one
# loop, the timer heap alone was a few per cent of the process.)
_IDLE_MAX = 5.0
_DEFAULT_SETTINGS = AgentSettings()  # frozen: one for every agent given none


class _Puback:
    """A publish's completion as the agent's sender sees it: aiomqtt's PUBACK callback calls `set()` on
    what its table of pending publishes holds for the message id; this wakes the sender."""

    __slots__ = ("done", "_wake")

    def __init__(self, wake: asyncio.Event) -> None:
        self.done = False
        self._wake = wake

    def set(self) -> None:
        self.done = True
        self._wake.set()


class AgentService:
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
        self.predictions: deque[Message] = deque(maxlen=s.prediction_buffer)
        self.prediction_qos = s.prediction_qos  # 0 or 1 (AgentSettings checks it)
        self.gc_freeze = s.gc_freeze
        self._client: aiomqtt.Client | None = None  # while a session is up: live predictions go straight out
        self._pred_inflight = 0  # buffered predictions the sender is publishing
        self._writing: deque[tuple[Any, Message, int]] = deque()  # QoS 0 predictions paho has partly written
        # ---- bounded input (see the module docstring)
        self._sensor_topic = sensor_topic(self.fleet, self.client_id, core.cfg.sensor_topic)
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
        self._predictions_topic = predictions_topic(self.fleet, self.client_id)
        self._updates_topic = updates_topic(self.fleet, self.client_id)
        self.updates: deque[Message] = deque()
        self.update_buffer = s.update_buffer
        self.outbox_limit = max(1, int(s.outbox_limit))
        self.max_inflight = s.max_inflight
        self.dropped_predictions = 0
        self.linger = s.linger  # seconds to stay connected after the source ends (to receive a last global)
        self.resend_after = s.resend_after
        # An ack lists what the aggregator holds when it makes it; updates sent just before it arrives are
        # most likely on their way, not lost (e.g. the ack an aggregator sends when this agent comes
        # online): they are resent on an ack only once this old, or when the ack names them missing.
        self.ack_grace = s.ack_grace
        # lock-step: as long as `_last_global` waits for the last round; async: a few windows
        self.drain = s.drain if s.drain is not None else (30.0 if core.mode == "lockstep" else 5.0)
        self.max_refusals = max(1, int(s.max_refusals))
        self.connect_timeout = s.connect_timeout
        self.refusals: dict[str, int] = {}
        self.rejected_acks = 0
        # the acks topic also carries the aggregator's secure-aggregation steps when the fleet uses them
        self._ack_kinds: tuple[str, ...] = ("ack", *(SECAGG_DOWN if core.secagg is not None else ()))
        self._work = asyncio.Event()
        self._global_event = asyncio.Event()
        # Joining a running fleet: before its first sample, wait (at most this long, once connected) for the
        # retained global, so that the first prediction already uses the fleet's model as its prior.
        self.wait_for_global = max(0.0, float(s.wait_for_global))
        self._prior_ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._source_done = asyncio.Event()
        self._source_done_at: float | None = None
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.latencies: deque[float] = deque(maxlen=10_000)  # sample arrival → prediction published
        self.on_prediction = None  # optional callback(Prediction) for live views
        self._sent_at: dict[int, float] = {}  # update seq → when it was last handed to the broker
        self._resend_due = math.inf  # (monotonic) no resend timer expires before this
        self._inflight: set[int] = set()
        self._receiver_error_logged = False
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

    # ------------------------------------------------------------------ sending
    async def _send(self, client: aiomqtt.Client, receiver: asyncio.Task[None] | None = None,
                    watch: PubackWatch | None = None) -> None:
        """Publish buffered messages, oldest first, with up to `max_inflight` QoS 1 publishes awaiting
        their PUBACK at once (one at a time would cap an agent at one message per round trip). A message
        leaves its buffer only when acknowledged; on a lost connection the unacknowledged ones go back
        to the front, in order, and are sent again (the aggregator drops duplicates by seq).

        Each message is handed to paho here and written to the socket at once when nothing else waits
        (:func:`publish_now`), and its PUBACK is a flag that paho's callback sets (through aiomqtt's table
        of pending publishes) — not a task per publish around aiomqtt's `publish()`, which wraps its own
        wait in another task and a timeout, and whose write waits for a socket writer to be added (a
        wake-up of the loop through its self-pipe, two `epoll_ctl`s). With a thousand agents in one
        process that machinery cost more than the messages. A PUBACK not seen within `OP_TIMEOUT`
        seconds still ends the session, as aiomqtt's timeout did."""
        paho: mqtt.Client = paho_of(client)
        pending = pending_publishes(client)  # mid → what aiomqtt's on_publish calls .set() on
        loop = asyncio.get_running_loop()
        inflight: dict[int, tuple[_Puback, deque[Message], Message, int, float]] = {}  # by mid
        if receiver is not None:
            receiver.add_done_callback(lambda _: self._work.set())  # a lost connection wakes the sender
        try:
            while True:
                if receiver is not None and receiver.done() and self._receiver_failed(receiver):
                    return
                for mid in [mid for mid, entry in inflight.items() if entry[0].done]:
                    _, queue, msg, nbytes, _ = inflight.pop(mid)
                    if queue is self.predictions:
                        self._pred_inflight -= 1
                    if watch is not None and watch.refused:
                        queue.appendleft(msg)  # not delivered: it stays ours
                        watch.check()
                    self._sent(queue is self.updates, msg, nbytes)
                while (self.updates or self.predictions) and len(inflight) < self.max_inflight:
                    # oldest first: a sample's prediction (made before its update) goes out ahead of it
                    ups, preds = self.updates, self.predictions
                    queue = ups if ups and (not preds or ups[0].created <= preds[0].created) else preds
                    msg = queue[0]
                    payload = encode(msg)
                    if queue is self.updates:
                        topic, qos = self._updates_topic, 1
                    else:
                        topic, qos = self._predictions_topic, self.prediction_qos
                    info = publish_now(paho, topic, payload, qos)
                    if info.rc != mqtt.MQTT_ERR_SUCCESS:  # the connection is gone: the message stays first
                        raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
                    queue.popleft()
                    if info.is_published():  # QoS 0, written
                        self._sent(queue is self.updates, msg, len(payload))
                        continue
                    done = _Puback(self._work)
                    pending[info.mid] = done
                    inflight[info.mid] = (done, queue, msg, len(payload), loop.time())
                    if queue is self.updates:
                        self._inflight.add(msg.seq)
                    else:
                        self._pred_inflight += 1
                if inflight:
                    if any(entry[0].done for entry in inflight.values()):
                        continue
                    oldest = min(entry[4] for entry in inflight.values())
                    if loop.time() - oldest > OP_TIMEOUT:
                        raise aiomqtt.MqttError("Operation timed out")  # as aiomqtt's publish() would
                    await self._wait_work(OP_TIMEOUT - (loop.time() - oldest) + 0.01)  # PUBACKs wake it
                    continue
                self._check_written()
                if self._finished() or self._stop.is_set():
                    return
                self._resend_overdue()
                if self.core.secagg is not None:  # start or restart a round when updates wait
                    self._secagg(self.core.secagg_tick())
                if self.core.status_changed:  # e.g. the privacy budget ran out: the retained status says so
                    self.core.status_changed = False
                    paho.publish(status_topic(self.fleet, self.client_id), encode(status_message(
                        self.fleet, self.client_id, "online", meta=self.core.status_meta())), 1, True)
                if self.updates or self.predictions:
                    continue
                await self._wait_work(self._idle_timeout())
        finally:
            for mid, (_, queue, msg, _, _) in sorted(inflight.items(), key=lambda kv: -kv[1][2].seq):
                pending.pop(mid, None)
                queue.appendleft(msg)  # back to the front, lowest seq first
            self._inflight.clear()
            self._pred_inflight = 0

    async def _wait_work(self, timeout: float) -> None:
        """Until there is something to do (`_work` set) or `timeout` seconds have passed. A timer handle
        rather than wait_for(), which wraps the wait in a task of its own: with a thousand agents in one
        loop, that was four thousand tasks a second doing nothing."""
        if self._work.is_set():
            self._work.clear()
            return
        timer = asyncio.get_running_loop().call_later(max(0.0, timeout), self._work.set)
        try:
            await self._work.wait()
        finally:
            timer.cancel()
            self._work.clear()

    def _receiver_failed(self, receiver: asyncio.Task[None]) -> bool:
        """A receiver that ended: the connection is gone (raise, to reconnect), or it died of a bug —
        say so once, loudly (it is not restarted: the message that killed it could kill it again)."""
        exc = None if receiver.cancelled() else receiver.exception()
        if isinstance(exc, aiomqtt.MqttError):
            raise exc
        if exc is not None and not self._receiver_error_logged:
            self._receiver_error_logged = True
            log.error("agent %s: the receiver stopped on an error; no globals, acks or sensor readings are "
                      "taken any more", self.client_id, exc_info=exc)
        return False

    def _sent(self, is_update: bool, msg: Message, nbytes: int) -> None:
        if is_update:
            self._inflight.discard(msg.seq)
            now = time.monotonic()
            self._sent_at[msg.seq] = now
            self._resend_due = min(self._resend_due, now + self.resend_after)
            self.core.counters.updates += 1
            self.core.counters.bytes_uploaded += nbytes
            self.core.stats.uploaded(nbytes)
            self._sync_hold()
        else:
            self.latencies.append(max(0.0, time.time() - msg.created + float(msg.meta.get("latency_s", 0.0))))

    def _sync_hold(self) -> None:
        held = self.core.hold_uploads
        self.core.hold_uploads = (len(self.updates) + len(self._fresh) >= self.update_buffer
                                  or len(self.core.outbox) >= self.outbox_limit)
        if held and not self.core.hold_uploads and self.core.steps:
            # room again (a global included some): what the learner kept meanwhile leaves now, not at the next
            # sample (a paused or finished stream would keep it)
            self._queue(None, self.core.take_held())

    def _backpressure(self) -> bool:
        """The broker is not taking updates as fast as they come: stop reading the source for a while."""
        return len(self.updates) >= self.update_buffer

    def _secagg(self, msgs: list[Message]) -> None:
        """Queue secure-aggregation messages (not write-ahead: a round lost in a crash is simply run again)."""
        if msgs:
            self.updates.extend(msgs)
            self._work.set()

    def resend(self, msgs: list[Message]) -> int:
        """Queue updates again unless they are waiting or in flight already; returns how many were."""
        if self.core.secagg is not None:  # an update never leaves unmasked
            return 0
        waiting = {m.seq for m in self.updates} | self._inflight | {m.seq for m in self._fresh}
        again = [m for m in msgs if m.seq not in waiting and m.seq in self.core.outbox]
        if again:
            self.updates.extendleft(reversed(again))  # the oldest first, ahead of newer ones
            self.core.counters.resent += len(again)
            self._work.set()
        return len(again)

    def _idle_timeout(self) -> float:
        """How long an idle sender may sleep: until the next resend timer or the drain deadline (new
        messages, PUBACKs, globals, acks and stop() wake it anyway)."""
        if self._writing:
            return _WAKE
        due = self._resend_due
        if self._source_done_at is not None:
            due = min(due, self._source_done_at + self.drain)
        return min(_IDLE_MAX, max(0.0, due - time.monotonic()))

    def _resend_overdue(self) -> None:
        if not self.core.outbox:
            self._sent_at.clear()
            self._resend_due = math.inf
            return
        now = time.monotonic()
        if now < self._resend_due:  # the scan below is per call: with many agents, it showed
            return
        for seq in [s for s in self._sent_at if s not in self.core.outbox]:
            del self._sent_at[seq]
        overdue = [self.core.outbox[s] for s in sorted(self._sent_at)
                   if now - self._sent_at[s] >= self.resend_after]
        self._resend_due = min(self._sent_at.values(), default=math.inf) + self.resend_after
        if overdue and (n := self.resend(overdue)):
            log.info("agent %s: %d updates not included after %.0fs, sent again", self.client_id, n,
                     self.resend_after)

    def _buffer_prediction(self, msg: Message) -> None:
        if len(self.predictions) == self.predictions.maxlen:
            self.dropped_predictions += 1  # deque(maxlen) drops the oldest on append
        self.predictions.append(msg)
        self._work.set()

    def _emit(self, pred: Prediction) -> None:
        """Publish a prediction now. At QoS 0 it is written to the socket before this returns
        (:func:`publish_now`); if the socket takes only part of it, aiomqtt's writer sends the rest and
        the prediction counts as published when that is seen. Older predictions still waiting, no
        connection, or QoS 1: it joins the ring buffer the sender drains (in order, oldest dropped when
        full)."""
        msg = self.core.prediction_message(pred)
        self._publish_prediction(msg)
        if self.on_prediction is not None:  # a live view: after the publish, whatever it costs
            self.on_prediction(pred)

    def _publish_prediction(self, msg: Message) -> None:
        paho = paho_of(self._client)
        # `_writing` (and paho's queue behind it) is bounded: a socket that takes predictions slower than
        # they come sends them to the ring, which drops the oldest and counts it
        if (paho is None or self.prediction_qos != 0 or self.predictions or self._pred_inflight
                or len(self._writing) >= self.max_inflight or not paho.is_connected()):
            self._buffer_prediction(msg)
            return
        payload = encode(msg)
        info = publish_now(paho, self._predictions_topic, payload)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:  # the connection just went: sent after the reconnect
            self._buffer_prediction(msg)
            return
        self._check_written()
        if info.is_published():
            self._sent(False, msg, len(payload))
        else:
            self._writing.append((info, msg, len(payload)))

    def _check_written(self) -> None:
        """Predictions whose last bytes aiomqtt's socket writer sent since: published now."""
        while self._writing and self._writing[0][0].is_published():
            _, msg, nbytes = self._writing.popleft()
            self._sent(False, msg, nbytes)

    def _queue(self, pred: Prediction | None, msgs: list[Message]) -> None:
        if pred is not None:
            self._buffer_prediction(self.core.prediction_message(pred))
            if self.on_prediction is not None:
                self.on_prediction(pred)
        if msgs:
            if self.store is None:
                self.updates.extend(msgs)
            else:
                self._fresh.extend(msgs)  # write-ahead: sendable once a checkpoint covers them
        self._sync_hold()
        self._work.set()

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

        >>> from streamfed.fleet.config import FleetConfig
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
