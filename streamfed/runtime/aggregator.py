"""The aggregator's asyncio/MQTT shell around :class:`streamfed.fleet.aggregator.AggregatorCore`.

A persistent QoS 1 session (fixed id ``<fleet>.aggregator``, ``clean_start=False``,
``SessionExpiryInterval > 0``) subscribed to every client's update and status topics; each global
is published retained with QoS 1 (a late or reconnecting agent gets the newest at once). A ticker
closes timed-out rounds and asynchronous windows. Reconnects with backoff; a connection the broker
refuses is logged with its MQTT reason, counted in :attr:`AggregatorService.refusals`, and after
`max_refusals` refusals in a row `run()` raises :class:`~streamfed.runtime.session.BrokerRefused`.

On every (re)connect it publishes the current global and an `ack` to every known client saying which
sequence numbers it holds, so agents send again whatever it does not (lost in a crash, say).

Durability (`state_dir`): the core's state goes to ``<state_dir>/aggregator-<fleet>.state``
(:mod:`streamfed.fleet.persistence`) atomically **before** each global that reflects it is published, and on
stop; a restarted aggregator resumes from it (version, θ or statistics, pending rounds or window,
sequence tracker). Updates it had taken in but not checkpointed are sent again by their agents.

`shared_group` subscribes through an MQTT v5 shared subscription (``$share/<group>/…``) so several
aggregator processes can split the update stream.

Asynchronous windows close on time: the first update of a window sets a timer for its end (`window` seconds
after that update was taken in, as the core counts), so a window is not left open until the next tick of
the 50 ms ticker; the ticker stays as the fallback (a window restored from a checkpoint, a clock step).

Loud failures (:mod:`streamfed.runtime.service`): a state that cannot be written holds every global back,
marks the aggregator unhealthy (log, ``streamfed_aggregator_value{name="healthy"} = 0``, its status
``…/status/aggregator``), is retried every `checkpoint_retry` seconds and stops the service with
:class:`~streamfed.runtime.service.CheckpointFailed` after `checkpoint_deadline` seconds. The aggregator claims
``…/status/aggregator`` (retained: instance, start time, health); when a later-started aggregator connects
under the same client id, this one stops with :class:`~streamfed.runtime.service.DuplicateService`
("another aggregator connected as <fleet>.aggregator") instead of taking the session back forever.

Measurement hook (the load test, :mod:`streamfed.runtime.loadtest`): with the environment variable
``STREAMFED_AGGREGATOR_TRACE`` set to a file path, the service notes, from timestamps it takes anyway,
when each accepted update was applied (client, the client's mark, time), when each window was due and
closed, and when the broker acknowledged each global; it writes them there as JSON when it stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import BrokerConfig
from streamfed.fleet.secure_aggregation import DOWN_KINDS
from streamfed.runtime.service import Lease, MqttService, Outgoing, freeze_heap
from streamfed.wire.message import Message, ProtocolError, decode
from streamfed.wire.topics import Channel, ParsedTopic, acks_topic, global_topic, shared_filter, topic_filter

__all__ = ["AggregatorService"]

log = logging.getLogger(__name__)


class AggregatorService(MqttService):
    """Runs one fleet's aggregator against a broker until `stop()`.

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    >>> svc = AggregatorService(AggregatorCore(cfg, mode="async"), BrokerConfig())
    >>> svc.client_id, svc.store is None
    ('f.aggregator', True)
    """

    log = log
    pipelined = frozenset(DOWN_KINDS)  # a secure-aggregation stage: one message to every member at once

    def __init__(self, core: AggregatorCore, broker: BrokerConfig, tick: float = 0.05,
                 shared_group: str | None = None, client_id: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, max_refusals: int = 3,
                 connect_timeout: float = 5.0, checkpoint_retry: float = 1.0, checkpoint_deadline: float = 30.0,
                 lease: bool = True, light_ingest: bool = True, freeze: bool = False) -> None:
        super().__init__(broker, client_id or f"{core.cfg.fleet}.aggregator", tick=tick, max_refusals=max_refusals,
                         connect_timeout=connect_timeout,  # connect_timeout: see streamfed.runtime.session.OP_TIMEOUT
                         checkpoint_retry=checkpoint_retry, checkpoint_deadline=checkpoint_deadline)
        self.core = core
        self.shared_group = shared_group
        self.snapshot_kind = core.cfg.global_kind  # retained: only the newest waiting one is published
        self.fleet = core.cfg.fleet
        self.ingested = 0
        self.freeze = freeze  # freeze_heap() once warmed up: what a process running this service alone wants
        # updates over a light connection of our own (MQTT v5 only); aiomqtt keeps the rest
        self.light_ingest = light_ingest and getattr(broker, "protocol", "5") == "5"
        self._timer: asyncio.TimerHandle | None = None  # closes the open asynchronous window on time
        path = os.environ.get("STREAMFED_AGGREGATOR_TRACE")
        self.trace: dict[str, list[Any]] | None = (
            {"applied": [], "closed": [], "published": []} if path else None)
        self._trace_path = Path(path) if path else None
        if state_dir is not None:
            self.keep_state(core, Path(state_dir) / f"aggregator-{self.fleet}.state", kind="aggregator")
        # One aggregator per client id. Aggregators sharing a `$share` group have ids of their own and
        # no lease (they would all claim one status topic).
        if lease and shared_group is None:
            self.lease = Lease(core.cfg, "aggregator", client_id=self.client_id, version=lambda: self.core.version)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self.core.warm_up()
        if self.freeze:
            freeze_heap()
        try:
            await super().run()
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self.trace is not None and self._trace_path is not None:
                self._trace_path.write_text(json.dumps(self.trace))

    # ------------------------------------------------------------------ MqttService hooks
    def subscriptions(self) -> list[str]:
        status = topic_filter(Channel.STATUS, self.fleet)
        return [status] if self.light_ingest else [self._updates_filter(), status]

    def light_subscriptions(self) -> list[str]:
        return [self._updates_filter()] if self.light_ingest else []

    def light_max_packet(self) -> int:
        return self.core.schema.max_bytes + 65536  # the codec refuses what is over its own limit, counted

    def light_refused(self) -> None:
        self.light_ingest = False

    def on_oversized(self, topic: str, size: int) -> None:
        self.core.counters.reject("too_large")

    def _updates_filter(self) -> str:
        return (shared_filter(self.shared_group, self.fleet) if self.shared_group
                else topic_filter(Channel.UPDATES, self.fleet))

    def on_connect(self) -> list[Message]:
        # the current global, retained, then what we hold per client (agents resend the rest)
        return [self.core.global_message(), *self.core.hello()]

    def route(self, msg: Message) -> Outgoing:
        if msg.kind == "ack" or self.core.schema.kinds[msg.kind].channel == Channel.ACKS:  # acks, secagg.* steps
            return Outgoing(acks_topic(self.fleet, msg.client))
        return Outgoing(global_topic(self.fleet), retain=True)

    def on_tick(self, now: float) -> list[Message]:
        return self._close(now)

    def on_published(self, msg: Message, at: float) -> None:
        if self.trace is not None and msg.kind != "ack":
            self.trace["published"].append((int(msg.global_version), at))

    # ------------------------------------------------------------------ windows on time
    def _window_due(self) -> float | None:
        """When the open asynchronous window ends (the core's clock: time.time()), None without one."""
        return self.core.window_due

    def _arm(self) -> None:
        due = self._window_due()
        if due is None or self._timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(loop.time() + max(0.0, due - time.time()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._outbox is None:  # not connected: the ticker closes it once the session is back
            return
        # a loop callback: a checkpoint that cannot be written must not end here, logged and forgotten
        self.emit(self._guarded(lambda: self._close(time.time())))
        if self._window_due() is not None:  # not due yet by the core's clock (the loop's clock ran ahead)
            self._arm()

    def _close(self, now: float) -> list[Message]:
        due = self._window_due() if self.trace is not None else None
        out = self.core.tick(now)
        if due is not None and out:
            self.trace["closed"].append((self.core.version, due, now))  # type: ignore[index]
        return out

    def handle(self, parsed: ParsedTopic | str, payload: bytes) -> list[Message]:
        if isinstance(parsed, str) or parsed.fleet != self.fleet or parsed.client is None:
            self.core.counters.reject("bad_topic")
            return []
        if parsed.channel == Channel.UPDATES:
            self.ingested += 1
            now = time.time()
            if self.trace is None:
                out = self.core.on_update(parsed.client, payload, now)
            else:
                accepted = self.core.counters.accepted
                out = self.core.on_update(parsed.client, payload, now)
                if self.core.counters.accepted > accepted:
                    self.trace["applied"].append((parsed.client, self.core.tracker.mark(parsed.client), now))
            if self._timer is None:
                self._arm()
            return out
        if parsed.channel == Channel.STATUS:
            try:
                st = decode(payload, self.core.cfg, client=parsed.client, kinds=("status",))
            except ProtocolError as e:
                self.core.counters.reject("bad_status")
                log.debug("status of %s rejected: %s", parsed.client, e)
                return []
            return self.core.on_status(parsed.client, str(st.meta.get("state")))
        return []
