"""A small base for the fleet's server-side MQTT services (aggregator shards and the reducer).

Each runs one persistent QoS 1 session (fixed client id, ``clean_start=False``,
``SessionExpiryInterval > 0``) through :func:`~streamfed.runtime.session.reconnect_loop` (backoff, refusal
counting), and inside a session four tasks: a receiver that hands every message to :meth:`handle`
(taking already-queued messages in batches), a publisher that sends what the pure core returned, in
order, one QoS 1 publish at a time, a ticker that calls :meth:`on_tick`, and the stop event. A refused
publish (an MQTT v5 PUBACK reason code >= 0x80, e.g. an ACL) stops the service with
:class:`~streamfed.runtime.session.BrokerRefused`, as a refused subscription does.

Subclasses say what to subscribe to, what to send on (re)connect, how to route a core's
:class:`~streamfed.wire.message.Message` to a topic, and how to handle a message.

Loud failures (issue 15). Two faults used to pass in silence; each now ends in a
:class:`ServiceFailed` out of :meth:`MqttService.run` (a one-line message and its `exit_code`):

* **A checkpoint that cannot be written** (a full disk, a read-only or vanished state directory): the
  core calls `checkpoint` before it hands out a global (write-ahead), so the error surfaces inside a
  message handler, the ticker or a timer. The service then holds back every global (none leaves that
  is not on disk, also not on a reconnect), reports itself unhealthy — the log, the core's
  :class:`~streamfed.fleet.telemetry.AggregatorStats` (``values["healthy"] = 0``, exported as
  ``streamfed_aggregator_value{name="healthy"}``; `global_version` back to the version on disk) and its
  status topic (see below) — and retries the write every `checkpoint_retry` seconds. It keeps taking
  updates in meanwhile (in memory only; the agents keep theirs until a global includes them). A
  write that succeeds publishes the current global at once and the service is healthy again; one
  still failing after `checkpoint_deadline` seconds stops the service with :class:`CheckpointFailed`.
* **A second instance under the same client id** (two aggregators on copies of one state directory):
  the broker hands the session to whichever connected last and closes the other's connection (Mosquitto
  2.0.11 sends no DISCONNECT reason 0x8E "Session taken over" first: the kicked one sees a plain lost
  connection), so both used to reconnect and kick each other off forever. A service with a
  :class:`Lease` (the aggregator) claims its status topic ``…/status/<name>`` with a retained
  `status` naming its instance and start time; it reads that topic through its ``status/+``
  subscription. A claim by another instance that started later ends this one with
  :class:`DuplicateService` ("another aggregator connected as <client id>"); an older claim (the
  instance before a restart, a broker that restored old retained messages) is overwritten. A broker
  restart or a lost network changes no claim and triggers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiomqtt

from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.fleet.persistence import StateStore
from streamfed.fleet.telemetry import AggregatorStats
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.light_subscriber import LightSubscriber
from streamfed.runtime.mqtt import IncomingQueue, incoming_drain, paho_of
from streamfed.runtime.session import (
    OP_TIMEOUT,
    BrokerRefused,
    PubackWatch,
    check_subscription,
    reconnect_loop,
    until_lost,
)
from streamfed.wire.message import Message, ProtocolError, decode, encode, status_message
from streamfed.wire.topics import ParsedTopic, status_topic, try_parse_topic

__all__ = ["CheckpointFailed", "DuplicateService", "Lease", "MqttService", "Outgoing", "ServiceFailed",
           "receive_batches"]

_BATCH = 256  # queued messages taken per receive step
_TOPIC_CACHE = 4096  # parsed topics remembered (one per client and channel)
# publishes to per-client topics handed to paho at once, and paho's in-flight window (its default 20 is raised to
# it), so that each is on the wire at once and its OP_TIMEOUT times the broker's answer, not a wait in paho's queue
# (64 at once behind paho's 20 timed out on a loaded machine and the session was dropped). With 16 a stage of
# 1,000 members still went out in batches of 16, each waiting for its slowest PUBACK on a busy loop.
PUBLISH_WINDOW = 128


def freeze_heap() -> None:
    """Move every object alive now — the imported modules, the compiled kernels, a restored state — to the
    cyclic collector's permanent generation (`gc.freeze`, O(1)): a long-running service's collections then walk
    what it created since, not the whole process again and again. On the aggregator's ingest path they cost about
    a third of the rate (docs/benchmarks.md, "Aggregator ingest"). Once per process, after start-up; what is
    frozen is never collected (a cycle already garbage then stays), so not in a process that starts services
    over and over.

    >>> freeze_heap(); gc.get_freeze_count() > 0
    True
    >>> gc.unfreeze()  # (a doctest shares its process: give the objects back)
    """
    gc.freeze()


class ServiceFailed(RuntimeError):
    """A server-side service stopped on a fault that retrying in-process cannot fix; `exit_code` is the
    status its process should exit with (2 is a refused connection, :class:`~streamfed.runtime.session.BrokerRefused`).

    >>> e = CheckpointFailed("f.aggregator: cannot write its state")
    >>> isinstance(e, ServiceFailed), e.exit_code, DuplicateService("x").exit_code
    (True, 3, 4)
    """

    exit_code = 3


class CheckpointFailed(ServiceFailed):
    """The state could not be written for longer than the service's `checkpoint_deadline` (or at the stop).

    >>> str(CheckpointFailed("f.aggregator: cannot write /s/aggregator-f.state: disk full"))
    'f.aggregator: cannot write /s/aggregator-f.state: disk full'
    """

    exit_code = 3


class DuplicateService(ServiceFailed):
    """Another instance (started later) connected under this service's client id. A supervisor should not
    restart a process that exits with this status: the restart would take the session over again
    (systemd: ``RestartPreventExitStatus=2 4``).

    >>> DuplicateService("another aggregator connected as f.aggregator").exit_code
    4
    """

    exit_code = 4


class _NotDurable(Exception):  # noqa: N818 - internal signal, never leaves this module
    """Raised through the core by the checkpoint callback while the state cannot be written: the core's
    write-ahead rule then drops the global it was about to hand out."""


class Lease:
    """Which instance holds a service's client id, judged from the claims on its status topic.

    Each instance claims the topic with a retained ``status`` (``meta``: `instance`, `since` = its start,
    Unix time, its health, and `version` = the version of the durable state it holds, when it has one).
    Fencing first (issue 30): the instance holding the newer state keeps the lease — a claim with a higher
    `version` than ours makes this one exit (:meth:`observe` raises :class:`DuplicateService`), one with a
    lower version is stale and ours goes over it, whatever the start times (an instance started from a stale
    copy of the state must not take the fleet over). At equal versions, claims are ordered by
    ``(since, instance)``: a newer one than ours means another instance took the client id over (a fail-over
    from the same state); an older one is stale (the instance before a restart) and ours is published again
    over it (:attr:`must_claim`). Another instance's ``offline`` claims nothing.

    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2)
    >>> lease = Lease(cfg, "aggregator", instance="b", since=100.0)
    >>> lease.must_claim, lease.topic
    (True, 'streamfed/v1/f/status/aggregator')
    >>> lease.observe(lease.claim(healthy=True))  # our own claim, back through the broker
    >>> lease.must_claim
    False
    >>> lease.observe(Lease(cfg, "aggregator", instance="a", since=50.0).claim(True)); lease.must_claim
    True
    >>> try:
    ...     lease.observe(Lease(cfg, "aggregator", instance="c", since=150.0).claim(True))
    ... except DuplicateService as e:
    ...     print(str(e)[:73])
    another aggregator connected as f.aggregator (instance c, started 50 s af
    >>> at = {"v": 5}
    >>> fenced = Lease(cfg, "aggregator", instance="d", since=10.0, version=lambda: at["v"])
    >>> fenced.observe(Lease(cfg, "aggregator", instance="e", since=99.0, version=lambda: 3).claim(True))
    >>> fenced.must_claim  # a later start from an older state: stale, ours goes over it
    True
    >>> try:
    ...     fenced.observe(Lease(cfg, "aggregator", instance="f", since=1.0, version=lambda: 7).claim(True))
    ... except DuplicateService as e:
    ...     print(str(e)[:60])
    another aggregator connected as f.aggregator holds a newer s
    """

    def __init__(self, cfg: FleetConfig, name: str, *, instance: str | None = None,
                 since: float | None = None, client_id: str | None = None,
                 version: Callable[[], int] | None = None) -> None:
        self.cfg = cfg
        self.version = version  # the durable state's version now (None: a service without one)
        self.name = name
        self.client_id = client_id or f"{cfg.fleet}.{name}"
        self.topic = status_topic(cfg.fleet, name)
        self.instance = instance or uuid.uuid4().hex[:12]
        self.since = time.time() if since is None else float(since)
        self.enabled = True  # False once the broker refused the claim (see MqttService)
        self.must_claim = True  # our claim is not (or no longer) what the topic holds

    def claim(self, healthy: bool, problem: str | None = None) -> Message:
        """Our retained status: the claim, and what the service says of its health."""
        meta: dict[str, bool | float | str] = {"instance": self.instance, "since": self.since, "healthy": healthy}
        if self.version is not None:
            meta["version"] = float(self.version())
        if problem:
            meta["problem"] = problem[:200]
        return status_message(self.cfg.fleet, self.name, "online", meta=meta)

    def observe(self, msg: Message) -> None:
        """A status on our topic (retained or live). Raises :class:`DuplicateService` for a newer claim."""
        instance, since = msg.meta.get("instance"), msg.meta.get("since")
        if instance == self.instance:
            self.must_claim = False
            return
        if msg.meta.get("state") != "online" or not isinstance(since, int | float) or not math.isfinite(since):
            return  # an offline word, or a status without a claim: it holds nothing
        theirs = msg.meta.get("version")
        if self.version is not None and isinstance(theirs, int | float) and math.isfinite(theirs):
            ours = self.version()
            if theirs > ours:
                raise DuplicateService(
                    f"another {self.name} connected as {self.client_id} holds a newer state (v{theirs:.0f}) than "
                    f"this one (v{ours}; instance {self.instance}, perhaps started from a stale copy): this one "
                    f"exits — start it from the newest state file, or stop the other first")
            if theirs < ours:
                self.must_claim = True  # the stale one: ours (with our version) goes over it, and it exits
                return
        if (float(since), str(instance)) > (self.since, self.instance):
            raise DuplicateService(
                f"another {self.name} connected as {self.client_id} (instance {instance}, started "
                f"{float(since) - self.since:.0f} s after this one, {self.instance}): this one exits, so that the "
                f"two stop taking each other's session")
        self.must_claim = True  # a stale claim: ours goes over it


async def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until every one has ended; their errors are retrieved, not raised (what ended
    the session was raised already). A cancellation can be swallowed: before Python 3.12, `asyncio.wait_for`
    (aiomqtt's publish) returns its result when the awaited thing completes as the cancel arrives — the
    publisher then went back to its queue and waited there for ever (seen when another instance took the
    session over during a publish). So the ones still running are cancelled again."""
    pending = set(tasks)
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)
    for t in tasks:
        if not t.cancelled():
            t.exception()


class Outgoing(NamedTuple):
    """Where a core's message goes: topic, and whether it is retained."""

    topic: str
    retain: bool = False


async def receive_batches(client: aiomqtt.Client, take: Callable[[aiomqtt.Message], None]) -> None:
    """Call `take` on every message of `client`, in order.

    aiomqtt hands out one message per `async for` step, at the price of a task and an `asyncio.wait`
    each; the messages already waiting behind it are taken in the same step (at most `_BATCH`, so other
    tasks still get their turn)."""
    drain = incoming_drain(client)  # the incoming queue `messages` reads
    async for message in client.messages:
        take(message)
        if drain is None:
            continue
        for _ in range(_BATCH):
            try:
                message = drain()
            except asyncio.QueueEmpty:
                break
            take(message)


class MqttService:
    """Base of a server-side service: session, receiver, publisher, ticker. See the module doc.

    >>> svc = MqttService(BrokerConfig(), "f.example", tick=0.1)
    >>> svc.client_id, svc.published, svc.connected.is_set()
    ('f.example', 0, False)
    """

    # kinds published in runs of up to PUBLISH_WINDOW, each to its own client's topic, their PUBACKs awaited
    # together (the aggregator's secure-aggregation stages); every other kind goes out one at a time
    pipelined: frozenset[str] = frozenset()
    # kinds that nothing else sends again after a lost connection (no timer, no on_connect): those not yet
    # acknowledged by the broker when a session ends go out first in the next one (the reducer's partial acks: a
    # shard keeps an unacknowledged partial until its resend timer, tests/test_bridges.py)
    carried: frozenset[str] = frozenset()

    log = logging.getLogger(__name__)

    def __init__(self, broker: BrokerConfig, client_id: str, *, tick: float, max_refusals: int = 3,
                 connect_timeout: float = 5.0, checkpoint_retry: float = 1.0,
                 checkpoint_deadline: float = 30.0) -> None:
        self.broker = broker
        self.client_id = client_id
        self.tick = tick
        self.max_refusals = max(1, int(max_refusals))
        self.connect_timeout = connect_timeout
        self.refusals: dict[str, int] = {}
        self.connected = asyncio.Event()
        self.published = 0
        self.superseded = 0  # globals and acks not published because a newer one was waiting (_coalesce)
        # the retained global a subclass publishes: only the newest waiting one goes out (_coalesce), and none that
        # is not on disk (see keep_state)
        self.snapshot_kind: str | None = None
        self.received = 0
        self.reconnects = 0
        self._stop = asyncio.Event()
        self._watch: PubackWatch | None = None
        self._topics: dict[str, ParsedTopic | str] = {}
        self.store: StateStore | None = None  # see keep_state
        self.restored = False
        self._durable: Any = None
        self._outbox: asyncio.Queue[Message] | None = None  # the current session's (see emit)
        self._unsent: list[Message] = []  # the publisher's taken but not acknowledged messages (see carried)
        self._carry: list[Message] = []  # what the last session left of the `carried` kinds
        # messages waiting for handle(): beyond it the oldest is dropped, counted and logged (its agent or shard
        # sends it again: it is not acknowledged) — memory stays bounded whatever the input rate
        self.incoming_limit = 8192
        self.dropped_incoming = 0
        # ---- loud failures (module doc)
        self.checkpoint_retry = max(0.01, float(checkpoint_retry))
        self.checkpoint_deadline = max(0.0, float(checkpoint_deadline))
        self.failing_since: float | None = None  # monotonic time of the first failed write in a row
        self.problem: str | None = None  # why the service is unhealthy (None: healthy)
        self.checkpoint_failures = 0
        self.saved_version: int | None = None  # the version of the state on disk
        self.held_back = 0  # globals not published because they were not on disk
        self._fatal: ServiceFailed | None = None
        self.lease: Lease | None = None  # set by a subclass whose instance must be unique

    # ------------------------------------------------------------------ what subclasses say
    def subscriptions(self) -> list[str]:
        """Topic filters to subscribe to (QoS 1) on every connect."""
        raise NotImplementedError

    def light_subscriptions(self) -> list[str]:
        """Topic filters taken over a :class:`~streamfed.runtime.light_subscriber.LightSubscriber` connection of
        their own (client id ``<client_id>.ingest``, persistent session) instead of aiomqtt: the update stream,
        whose per-message cost in paho was the ceiling of the aggregator's ingest. Only over MQTT v5."""
        return []

    def light_max_packet(self) -> int:
        """The largest PUBLISH the light connection buffers; a larger one is skipped and :meth:`on_oversized`
        told."""
        return 1 << 24

    def on_oversized(self, topic: str, size: int) -> None:
        """A message over :meth:`light_max_packet` bytes was skipped unread (and acknowledged)."""

    def light_refused(self) -> None:
        """The broker refused the light connection: from now on :meth:`subscriptions` takes those filters too."""

    def on_connect(self) -> list[Message]:
        """Messages to send once subscribed (e.g. the current global, or partials not yet acknowledged)."""
        return []

    def route(self, msg: Message) -> Outgoing:
        """The topic of a message the core produced."""
        raise NotImplementedError

    def handle(self, topic: ParsedTopic | str, payload: bytes) -> list[Message]:
        """One received message (its parsed topic, or the reason it did not parse); returns what to send."""
        raise NotImplementedError

    def on_tick(self, now: float) -> list[Message]:
        """Called every `tick` seconds while connected; returns what to send."""
        return []

    def on_published(self, msg: Message, at: float) -> None:
        """Called once the broker acknowledged the publish of `msg` (its PUBACK), at time `at`."""

    @property
    def healthy(self) -> bool:
        """False while the state cannot be written (globals are held back)."""
        return self.failing_since is None

    def emit(self, msgs: list[Message]) -> None:
        """Send what a core returned outside :meth:`handle` and :meth:`on_tick` (from a timer, say); dropped
        while disconnected, as a tick's would not run then."""
        if self._outbox is not None:
            for m in msgs:
                self._outbox.put_nowait(m)

    # ------------------------------------------------------------------ durable state
    def keep_state(self, core: Any, path: Path, kind: str) -> None:
        """Keep `core`'s state in the state file `path` (:mod:`streamfed.fleet.persistence`): resume from it now,
        checkpoint through `core.checkpoint` (the core calls it before handing out each new global: write-ahead),
        and once more when the service stops. `core` has `snapshot()`, `restore(state)`, `checkpoint`, `version`,
        `cfg` and `stats`. Raises :class:`~streamfed.fleet.persistence.StateError` for a damaged, foreign or
        unusable state. A write that fails: see the module doc."""
        self.store = StateStore(path, kind=kind)
        self.restored = self.store.resume(lambda state: core.restore(state["core"])) is not None
        if self.restored:
            self.log.info("%s: resumed from %s at global version %d", self.client_id, path, core.version)
        self._durable = core
        self.snapshot_kind = self.snapshot_kind or core.cfg.global_kind  # what is held back while not on disk
        self.saved_version = int(core.version) if self.restored else None
        core.checkpoint = self._save
        self._note_health()

    def _save(self, core: Any) -> None:
        """The core's checkpoint callback. A global that is not on disk is never published: while the state
        cannot be written this raises :class:`_NotDurable` through the core, which drops that global."""
        if self.failing_since is not None:  # the retries are the watcher's (no write per message meanwhile)
            self._note_health()
            raise _NotDurable
        try:
            self._write(core)
        except OSError as e:
            self._failed(e)
            raise _NotDurable from e

    def _write(self, core: Any) -> None:
        assert self.store is not None
        self.store.save({"core": core.snapshot(), "saved_at": time.time()})
        self.saved_version = int(core.version)
        self._note_health()

    def _failed(self, error: OSError) -> None:
        self.checkpoint_failures += 1
        first = self.failing_since is None
        if first:
            self.failing_since = time.monotonic()
        assert self.store is not None
        self.problem = f"cannot write its state {self.store.path}: {error}"
        if first:
            self.log.error("%s: %s; globals are held back (the last on disk is v%s), retrying every %.3g s, "
                           "exiting after %.3g s", self.client_id, self.problem, self.saved_version,
                           self.checkpoint_retry, self.checkpoint_deadline)
            self.emit(self._claims())  # the status topic says so too
        self._note_health()

    def _recovered(self) -> None:
        assert self.failing_since is not None
        self.log.warning("%s: state written again after %.1f s (%d failed attempts): global v%s published",
                         self.client_id, time.monotonic() - self.failing_since, self.checkpoint_failures,
                         self.saved_version)
        self.failing_since, self.problem = None, None
        self._note_health()
        self.emit([*self._claims(), *self.on_connect()])  # the current global (now on disk), acks

    def _note_health(self) -> None:
        """The core's stats say what is true: healthy or not, and the version of the newest global that may
        have been published (the one on disk while writes fail)."""
        stats = getattr(self._durable, "stats", None)
        if not isinstance(stats, AggregatorStats):
            return
        stats.values["healthy"] = 1.0 if self.failing_since is None else 0.0
        if self.failing_since is not None and self.saved_version is not None:
            stats.set_global_version(self.saved_version)

    async def _watch_checkpoints(self) -> None:
        """Retry a failing write every `checkpoint_retry` seconds; stop the service past the deadline."""
        while True:
            await asyncio.sleep(self.checkpoint_retry)
            if self.failing_since is None:
                continue
            try:
                self._write(self._durable)
            except OSError as e:
                self._failed(e)
                failing = time.monotonic() - self.failing_since
                if failing >= self.checkpoint_deadline:
                    self._fatal = CheckpointFailed(
                        f"{self.client_id}: {self.problem} — failing for {failing:.0f} s ({self.checkpoint_failures} "
                        f"attempts); the last global on disk is v{self.saved_version}")
                    self.stop()
                    return
                continue
            self._recovered()

    def _guarded(self, produce: Callable[[], list[Message]]) -> list[Message]:
        """What a core call returned, or nothing when it stopped at a checkpoint that could not be written."""
        try:
            out = produce()
        except _NotDurable:
            self.held_back += 1
            return []
        if self.store is not None:
            self._note_health()  # the core's round may have replaced the stats' values
        return out

    def _claims(self) -> list[Message]:
        lease = self.lease
        if lease is None or not lease.enabled:
            return []
        return [lease.claim(self.healthy, self.problem)]

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()

    def _lost(self) -> None:
        self.connected.clear()
        self.reconnects += 1

    async def run(self) -> None:
        """Serve until `stop()`, reconnecting as needed; with a state file, save the state at the end.
        Raises :class:`ServiceFailed` for the faults of the module doc, and :class:`CheckpointFailed` when
        the last save fails."""
        watcher = asyncio.create_task(self._watch_checkpoints()) if self.store is not None else None
        unsaved = None
        try:
            await reconnect_loop(self._session, name=self.client_id, stop=self._stop, refusals=self.refusals,
                                 max_refusals=self.max_refusals, on_lost=self._lost, logger=self.log)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if self.store is not None:
                try:
                    self._write(self._durable)
                except OSError as e:
                    unsaved = (f"{self.client_id}: stopped without saving its state {self.store.path} ({e}); the "
                               f"last global on disk is v{self.saved_version}")
                    self.log.error("%s", unsaved)
                self.store.close()
        if self._fatal is not None:
            raise self._fatal
        if unsaved is not None:
            raise CheckpointFailed(unsaved)

    def _dropped_incoming(self, message: Any, reason: str) -> None:
        """An update or partial dropped unread (counted; its agent or shard sends it again, unacknowledged)."""
        self.dropped_incoming += 1
        if self.dropped_incoming in (1, 10, 100) or self.dropped_incoming % 1000 == 0:
            self.log.warning("%s: incoming queue full (%d): %d messages dropped unread", self.client_id,
                             self.incoming_limit, self.dropped_incoming)

    async def _session(self) -> None:
        kw = client_kwargs(self.broker, self.client_id, persistent=True)
        incoming = IncomingQueue(limit=self.incoming_limit, on_drop=self._dropped_incoming)
        async with aiomqtt.Client(**kw, queue_type=lambda maxsize=0: incoming,  # type: ignore[arg-type]
                                  timeout=self.connect_timeout, max_inflight_messages=PUBLISH_WINDOW) as client:
            paho = paho_of(client)
            if paho is not None and not paho.is_connected():
                # Closed between the CONNACK and the end of aiomqtt's __aenter__, which then resets its
                # "disconnected" future: the loss would go unnoticed until the keepalive (45 s). Seen when
                # a second instance took the session at that moment.
                raise aiomqtt.MqttError("connection lost while connecting")
            self._watch = PubackWatch(client)
            outbox: asyncio.Queue[Message] = asyncio.Queue()
            self._outbox = outbox
            receiver = asyncio.create_task(receive_batches(client, lambda m: self._take(m, outbox)))
            tasks = [receiver]
            ingest: LightSubscriber | None = None
            try:
                for topic in self.subscriptions():
                    check_subscription(topic, await until_lost(
                        client.subscribe(topic, qos=1, timeout=OP_TIMEOUT), receiver))
                light = self.light_subscriptions()
                if light:
                    try:
                        ingest = await LightSubscriber.open(
                            self.broker, f"{self.client_id}.ingest", light,
                            lambda batch: self._take_batch(batch, outbox), timeout=self.connect_timeout,
                            max_packet=self.light_max_packet(), on_oversized=self.on_oversized)
                    except BrokerRefused as e:
                        # e.g. an ACL that binds this account to one client id: slower, but it works
                        self.log.warning("%s: the broker refused the light ingest connection %s.ingest (%s); "
                                         "updates are taken over aiomqtt instead (slower): let this account "
                                         "connect as that client id too", self.client_id, self.client_id, e.reason)
                        self.light_refused()
                        for topic in light:
                            check_subscription(topic, await until_lost(
                                client.subscribe(topic, qos=1, timeout=OP_TIMEOUT), receiver))
                    else:
                        tasks.append(asyncio.create_task(ingest.wait_closed()))
                # The claim goes out on every connect (the broker may have lost its retained messages); a newer
                # instance's claim it overwrites still reaches the receiver first, retained, and ends this one.
                carry, self._carry = self._carry, []
                for m in [*self._claims(), *carry, *self.on_connect()]:
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
                self._outbox = None
                if ingest is not None:
                    ingest.close()
                await _cancel_all(tasks)
                self._carry = self._left_over(outbox)

    def _left_over(self, outbox: asyncio.Queue[Message]) -> list[Message]:
        """The messages of the `carried` kinds a session ends with unpublished (or published without a PUBACK:
        at least once), in order: in the publisher's hands, then still queued."""
        left = [*self._carry, *self._unsent]
        self._unsent = []
        while not outbox.empty():
            left.append(outbox.get_nowait())
        return [m for m in left if m.kind in self.carried]

    def _coalesce(self, batch: list[Message]) -> list[Message]:
        """What of `batch` (messages waiting to be published, in order) still needs to go out: a global is
        retained and holds everything the ones before it did, so only the newest waiting global is published,
        and only the newest waiting ack of each client. A publisher behind a burst (a broker slow to
        acknowledge, a loaded machine) then catches up at once instead of sending versions nobody needs."""
        kind = self.snapshot_kind
        newest_global = max((i for i, m in enumerate(batch) if m.kind == kind), default=None)
        newest_ack: dict[str, int] = {m.client: i for i, m in enumerate(batch) if m.kind == "ack"}
        keep = [m for i, m in enumerate(batch)
                if not ((kind is not None and m.kind == kind and i != newest_global)
                        or (m.kind == "ack" and newest_ack[m.client] != i))]
        self.superseded += len(batch) - len(keep)
        return keep

    async def _publisher(self, client: aiomqtt.Client, outbox: asyncio.Queue[Message]) -> None:
        # Apart from the receiver, so that it keeps reading (and notices a lost connection at once)
        # while a publish waits for its PUBACK.
        batch: list[Message] = self._unsent  # shared with _left_over: what was taken and not acknowledged
        while True:
            if not batch:
                batch.append(await outbox.get())
                while not outbox.empty():
                    batch.append(outbox.get_nowait())
                batch[:] = self._coalesce(batch)
            m = batch[0]  # removed from `batch` once the broker acknowledged it (see carried)
            if m.kind == self.snapshot_kind and self.failing_since is not None:
                batch.pop(0)
                self.held_back += 1  # not on disk (or not known to be): never published
                continue
            lease = self.lease
            if lease is not None and m.kind == "status" and m.client == lease.name:
                await self._publish_claim(client, m, lease)
                batch.pop(0)
                continue
            out = self.route(m)
            run = [(m, out)]
            if m.kind in self.pipelined and not out.retain:
                # A run of messages each to one client's topic (a secure-aggregation stage sent to every member):
                # handed to paho together, their PUBACKs awaited together. One at a time, a stage of a thousand
                # members took a thousand round trips of a busy loop (issue 29). paho writes them in this order
                # and MQTT keeps a topic's order, so each client still sees its messages in order. Every other
                # kind stays one at a time: acks sent faster let the publisher reach more intermediate globals,
                # which every agent then installs (a plain round of 1,000 agents took 14.3 s instead of 8.7 s),
                # and a reducer's partial acks in runs across a core broker's restart left a shard's ack behind
                # in a CI run (tests/test_bridges.py)
                while len(run) < min(len(batch), PUBLISH_WINDOW) and batch[len(run)].kind in self.pipelined:
                    nxt = self.route(batch[len(run)])
                    if nxt.retain:
                        break
                    run.append((batch[len(run)], nxt))
            if len(run) == 1:
                await client.publish(out.topic, encode(m), qos=1, retain=out.retain, timeout=OP_TIMEOUT)
            else:
                await asyncio.gather(*(client.publish(o.topic, encode(x), qos=1, retain=False, timeout=OP_TIMEOUT)
                                       for x, o in run))
            if self._watch is not None:
                self._watch.check()
            del batch[:len(run)]
            for x, _ in run:
                self.published += 1
                self.on_published(x, time.time())

    async def _publish_claim(self, client: aiomqtt.Client, msg: Message, lease: Lease) -> None:
        """Publish our status claim; a broker that refuses it (an ACL without the service's status topic) turns
        duplicate detection off, with a warning, rather than stopping the service."""
        await client.publish(lease.topic, encode(msg), qos=1, retain=True, timeout=OP_TIMEOUT)
        watch = self._watch
        refused = [r for r in watch.refused if r[0] == lease.topic] if watch is not None else []
        if watch is not None and refused:
            watch.refused[:] = [r for r in watch.refused if r[0] != lease.topic]
            lease.enabled = False
            self.log.warning("%s: the broker refused its status topic %s (%s): a second instance with this client "
                             "id would not be detected; grant the topic to this account", self.client_id,
                             lease.topic, refused[0][1])

    async def _ticker(self, outbox: asyncio.Queue[Message]) -> None:
        while True:
            await asyncio.sleep(self.tick)
            for m in self._guarded(lambda: self.on_tick(time.time())):
                outbox.put_nowait(m)

    def _take(self, message: aiomqtt.Message, outbox: asyncio.Queue[Message]) -> None:
        payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
        self._take_raw(message.topic.value, bytes(payload), outbox)

    def _take_batch(self, batch: list[tuple[str, bytes]], outbox: asyncio.Queue[Message]) -> None:
        """The messages of one read of the light connection, in order."""
        for topic, payload in batch:
            self._take_raw(topic, payload, outbox)

    def _take_raw(self, topic: str, payload: bytes, outbox: asyncio.Queue[Message]) -> None:
        parsed = self._topics.get(topic)
        if parsed is None:
            parsed = try_parse_topic(topic)
            if len(self._topics) >= _TOPIC_CACHE:
                self._topics.clear()
            self._topics[topic] = parsed
        self.received += 1
        lease = self.lease
        if lease is not None and topic == lease.topic:
            self._on_claim(lease, payload)
            return
        for m in self._guarded(lambda: self.handle(parsed, payload)):
            outbox.put_nowait(m)

    def _on_claim(self, lease: Lease, payload: bytes) -> None:
        try:
            msg = decode(payload, lease.cfg, client=lease.name, kinds=("status",))
        except ProtocolError as e:
            self.log.warning("%s: status on %s refused: %s", self.client_id, lease.topic, e)
            return
        lease.observe(msg)  # DuplicateService stops the session and the service
        if lease.must_claim and lease.enabled:
            self.emit(self._claims())
