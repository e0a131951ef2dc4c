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

import logging
import os
from pathlib import Path

from ..aggregator import AggregatorCore
from ..config import BrokerConfig
from ..protocol import Message, ProtocolError, decode
from ..topics import Channel, ParsedTopic, acks_topic, global_topic, shared_filter, topic_filter
from .service import MqttService, Outgoing

__all__ = ["AggregatorService"]

log = logging.getLogger("streamfed.aggregator")


class AggregatorService(MqttService):
    """Runs one fleet's aggregator against a broker until `stop()`.

    >>> from streamfed.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    >>> svc = AggregatorService(AggregatorCore(cfg, mode="async"), BrokerConfig())
    >>> svc.client_id, svc.store is None
    ('f.aggregator', True)
    """

    log = log

    def __init__(self, core: AggregatorCore, broker: BrokerConfig, tick: float = 0.05,
                 shared_group: str | None = None, client_id: str | None = None,
                 state_dir: str | os.PathLike[str] | None = None, max_refusals: int = 3,
                 connect_timeout: float = 5.0) -> None:
        super().__init__(broker, client_id or f"{core.cfg.fleet}.aggregator", tick=tick, max_refusals=max_refusals,
                         connect_timeout=connect_timeout)  # connect_timeout: see streamfed.runtime.agent.OP_TIMEOUT
        self.core = core
        self.shared_group = shared_group
        self.fleet = core.cfg.fleet
        self.ingested = 0
        if state_dir is not None:
            self.keep_state(core, Path(state_dir) / f"aggregator-{self.fleet}.state", kind="aggregator")

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self.core.warm_up()
        await super().run()

    # ------------------------------------------------------------------ MqttService hooks
    def subscriptions(self) -> list[str]:
        upd = (shared_filter(self.shared_group, self.fleet) if self.shared_group
               else topic_filter(Channel.UPDATES, self.fleet))
        return [upd, topic_filter(Channel.STATUS, self.fleet)]

    def on_connect(self) -> list[Message]:
        # the current global, retained, then what we hold per client (agents resend the rest)
        return [self.core.global_message(), *self.core.hello()]

    def route(self, msg: Message) -> Outgoing:
        if msg.kind == "ack":
            return Outgoing(acks_topic(self.fleet, msg.client))
        return Outgoing(global_topic(self.fleet), retain=True)

    def on_tick(self, now: float) -> list[Message]:
        return self.core.tick(now)

    def handle(self, parsed: ParsedTopic | str, payload: bytes) -> list[Message]:
        if isinstance(parsed, str) or parsed.fleet != self.fleet or parsed.client is None:
            self.core.counters.reject("bad_topic")
            return []
        if parsed.channel == Channel.UPDATES:
            self.ingested += 1
            return self.core.on_update(parsed.client, payload)
        if parsed.channel == Channel.STATUS:
            try:
                st = decode(payload, self.core.cfg, client=parsed.client, kinds=("status",))
            except ProtocolError as e:
                self.core.counters.reject("bad_status")
                log.debug("status of %s rejected: %s", parsed.client, e)
                return []
            return self.core.on_status(parsed.client, str(st.meta.get("state")))
        return []
