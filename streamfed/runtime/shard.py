"""MQTT shells of sharded aggregation (:mod:`streamfed.fleet.sharding`): aggregator shards and the reducer.

Topics (``streamfed/v1/<fleet>/…``)::

    $share/<group>/…/updates/+    agents → one shard of the group (MQTT v5 shared subscription), QoS 1
    …/partials/<shard>            shard → reducer: partial sums, QoS 1
    …/shard_acks/<shard>          reducer → that shard: applied, or refused with the repeated pairs
    …/global                      reducer → everyone (agents and shards), retained
    …/acks/<client>               reducer → an agent: seqs it holds / misses (agents resend the rest)

A shard validates, deduplicates and sums what the broker hands it, and publishes its partials every
`flush_interval` seconds (20 ms in lock-step, 0.1 s for asynchronous windows); it keeps each partial
until the reducer acknowledges it and sends the unacknowledged ones again after a reconnect. The
reducer closes lock-step rounds and asynchronous windows exactly as the single aggregator does and
publishes the same global message.

Durability: the reducer with `state_dir` checkpoints its state (the global, the (client, seq) pairs and
partials applied, open rounds and window) atomically **before** each global that reflects it is published,
and resumes from it; what it took in after the last checkpoint is lost with it and comes back from the
agents, which keep every update until a global includes it and send again what the restarted reducer's
acks do not list. Shards hold only what the reducer has not acknowledged, and send a partial again when no
acknowledgement comes within `resend_after` (5 s); a restarted shard loses what it held, and the agents
send it again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from streamfed.fleet.config import BrokerConfig
from streamfed.fleet.sharding import ReducerCore, ShardCore
from streamfed.runtime.region_view import RegionView
from streamfed.runtime.service import Lease, MqttService, Outgoing
from streamfed.wire.message import Message, ProtocolError, decode
from streamfed.wire.topics import (
    Channel,
    ParsedTopic,
    acks_topic,
    channel_topic,
    global_topic,
    shared_filter,
    topic_filter,
)

__all__ = ["ShardService", "ReducerService"]


class ShardService(MqttService):
    """One aggregator shard of a fleet, sharing the update stream with the other shards of `group`.

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    >>> svc = ShardService(ShardCore(cfg, "s1", mode="async"), BrokerConfig(), group="shards")
    >>> svc.client_id, svc.light_subscriptions()[0]  # over its own light connection (MQTT v5)
    ('f.shard.s1', '$share/shards/streamfed/v1/f/updates/+')
    """

    log = logging.getLogger(__name__)

    def __init__(self, core: ShardCore, broker: BrokerConfig, group: str = "shards",
                 flush_interval: float | None = None, client_id: str | None = None, light_ingest: bool = True,
                 **kw: float) -> None:
        if flush_interval is None:
            # A lock-step round waits for the last partial, so flush promptly; asynchronous windows are
            # ~0.5 s, so fewer, larger partials (each costs a publish, an ack and a reducer decode).
            flush_interval = 0.02 if core.mode == "lockstep" else 0.1
        super().__init__(broker, client_id or f"{core.cfg.fleet}.shard.{core.name}", tick=flush_interval, **kw)
        self.core = core
        self.fleet = core.cfg.fleet
        self.group = group
        self._global_kind = f"{core.cfg.algorithm}.global"
        self._partials = channel_topic(self.fleet, Channel.PARTIALS, core.name)
        # its share of the updates over a light connection of its own (MQTT v5 only), as the aggregator's
        self.light_ingest = light_ingest and getattr(broker, "protocol", "5") == "5"

    def subscriptions(self) -> list[str]:
        own = [global_topic(self.fleet), channel_topic(self.fleet, Channel.SHARD_ACKS, self.core.name)]
        return own if self.light_ingest else [shared_filter(self.group, self.fleet), *own]

    def light_subscriptions(self) -> list[str]:
        return [shared_filter(self.group, self.fleet)] if self.light_ingest else []

    def light_max_packet(self) -> int:
        return self.core.schema.max_bytes + 65536  # the codec refuses what is over its own limit, counted

    def light_refused(self) -> None:
        self.light_ingest = False

    def on_oversized(self, topic: str, size: int) -> None:
        self.core.reject("too_large")

    def on_connect(self) -> list[Message]:
        return self.core.unacked()  # the reducer acknowledges again what it already has

    def route(self, msg: Message) -> Outgoing:
        return Outgoing(self._partials)

    def on_tick(self, now: float) -> list[Message]:
        return self.core.flush(now)

    def handle(self, topic: ParsedTopic | str, payload: bytes) -> list[Message]:
        if isinstance(topic, str) or topic.fleet != self.fleet:
            self.core.reject("bad_topic")
            return []
        if topic.channel == Channel.UPDATES and topic.client is not None:
            return self.core.on_update(topic.client, payload)
        if topic.channel == Channel.GLOBAL:
            try:
                msg = decode(payload, self.core.schema, kernel_version=self.core.kernel_version,
                             kinds=(self._global_kind,))
            except ProtocolError as e:
                self.log.warning("shard %s: global refused: %s", self.core.name, e)
                return []
            self.core.on_global(msg)
            return []
        if topic.channel == Channel.SHARD_ACKS and topic.client == self.core.name:
            try:
                msg = decode(payload, self.core.schema, client=self.core.name, kinds=("partial.ack",))
            except ProtocolError as e:
                self.log.warning("shard %s: partial ack refused: %s", self.core.name, e)
                return []
            return self.core.on_ack(msg)
        return []


class ReducerService(MqttService):
    """Combines the shards' partials into the fleet's global (see :class:`streamfed.fleet.sharding.ReducerCore`).

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_kernels=1, n_features=3)
    >>> svc = ReducerService(ReducerCore(cfg), BrokerConfig())
    >>> svc.client_id, svc.subscriptions()
    ('f.reducer', ['streamfed/v1/f/partials/+', 'streamfed/v1/f/status/+'])
    """

    log = logging.getLogger(__name__)
    carried = frozenset({"partial.ack"})  # a shard keeps a partial whose ack is lost until its resend timer

    def __init__(self, core: ReducerCore, broker: BrokerConfig, tick: float = 0.05, client_id: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, **kw: float) -> None:
        super().__init__(broker, client_id or f"{core.cfg.fleet}.reducer", tick=tick, **kw)
        # a second reducer is found and exits (the one holding the older state, or else the older one)
        self.lease = Lease(core.cfg, "reducer", client_id=self.client_id, version=lambda: self.core.version)
        self.core = core
        self.snapshot_kind = core.cfg.global_kind  # retained: only the newest waiting one is published
        self.fleet = core.cfg.fleet
        # per shard (per region, brokers bridged to a core): last partial, its transit, its lag in versions
        self.regions = RegionView(self.fleet, sorted(core.shards) if core.shards else None)
        if state_dir is not None:
            self.keep_state(core, Path(state_dir) / f"reducer-{self.fleet}.state", kind="reducer")

    def subscriptions(self) -> list[str]:
        return [topic_filter(Channel.PARTIALS, self.fleet), topic_filter(Channel.STATUS, self.fleet)]

    def on_connect(self) -> list[Message]:
        return [self.core.global_message(), *self.core.hello()]

    def route(self, msg: Message) -> Outgoing:
        if msg.kind == "partial.ack":
            return Outgoing(channel_topic(self.fleet, Channel.SHARD_ACKS, msg.client))
        if msg.kind == "ack":
            return Outgoing(acks_topic(self.fleet, msg.client))
        return Outgoing(global_topic(self.fleet), retain=True)

    def on_tick(self, now: float) -> list[Message]:
        return self.core.tick(now)

    def _observe_partial(self, shard: str, payload: bytes) -> None:
        try:  # decoded a second time for its header only: a few partials a second per shard
            msg = decode(payload, self.core.schema, kernel_version=self.core.kernel_version, client=shard,
                         kinds=(self.core.partial_kind,))
        except ProtocolError:
            return
        self.regions.observe(shard, sent=msg.created, shard_version=msg.global_version,
                             reducer_version=self.core.version)

    def handle(self, topic: ParsedTopic | str, payload: bytes) -> list[Message]:
        if isinstance(topic, str) or topic.fleet != self.fleet or topic.client is None:
            self.core.reject("bad_topic")
            return []
        if topic.channel == Channel.PARTIALS:
            out = self.core.on_partial(topic.client, payload)
            if any(m.kind == "partial.ack" for m in out):  # taken (applied or a repeat): it was well-formed
                self._observe_partial(topic.client, payload)
            return out
        if topic.channel == Channel.STATUS:
            try:
                st = decode(payload, self.core.schema, client=topic.client, kinds=("status",))
            except ProtocolError:
                self.core.reject("bad_status")
                return []
            return self.core.on_status(topic.client, str(st.meta.get("state")))
        return []
