"""Lightweight simulated agents for the fleet load test (``loadtest run --light``): thousands per process.

A full :class:`~streamfed.runtime.agent.AgentService` per agent costs ~0.65 ms of CPU per sample at 1,000 agents
(learning, a prediction, asyncio and aiomqtt machinery per message; benchmarks/results/fleet.md): 10,000 agents at
1 sample/s would need ~6.5 cores on their own. A light agent keeps what the broker and the aggregator see and
drops the rest:

* **one real MQTT v5 connection per agent** — a paho client of its own (fixed client id ``<fleet>.<client>``,
  persistent session: ``clean_start=False`` and a session expiry, an ``offline`` last will on its status topic,
  QoS 1 subscriptions to the retained global and to its acks topic, QoS 1 updates). The clients of a process
  share one epoll loop (:mod:`selectors`) that calls paho's ``loop_read`` / ``loop_write`` / ``loop_misc`` — no
  thread, no socket pair and no asyncio task per client;
* **honest updates from a real AgentCore**: each process runs one real :class:`~streamfed.fleet.agent.AgentCore`
  over synthetic samples first and keeps the update arrays it produced; an agent's update carries one of them
  (its own client id, seq, the global version it has installed, the samples it covers, its creation time), so
  the aggregator's checks (schema, shapes, ranges, seq window, admission) pass as for a real agent. Samples are
  counted, not learned (no prediction is published);
* **the agent's bookkeeping**: seqs 1, 2, …; an outbox of updates not yet included in an installed global (an
  update counts as included when a global's ``included`` map covers its seq); **flow control** as the real agent
  does it (``outbox_limit`` updates outstanding: further samples are coalesced, as POF-MKL's error feedback does,
  and leave as one update as soon as a global makes room, or at the end of the stream); resend after
  ``resend_after`` s, backing off as the real agent does while globals are late (the wait doubles after each
  timed resend, up to ``AgentSettings.resend_backoff`` times, and resets when a global includes an update), and
  on an ack that names an update missing or that was sent that long ago; globals decoded once per process
  (:class:`~streamfed.runtime.shared_globals.SharedGlobals`).

After its last sample an agent waits (at most `drain` s) for its updates to be included; the process then stays
connected `linger` s more (the last global), and reports per agent what :func:`streamfed.runtime.loadtest._analyse`
reads, plus the global version it ended with.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import resource
import selectors
import time
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.runtime.agent.settings import AgentSettings
from streamfed.runtime.shared_globals import SharedGlobals
from streamfed.wire.message import Message, ProtocolError, decode, encode, status_message
from streamfed.wire.topics import acks_topic, global_topic, status_topic, updates_topic

__all__ = ["LightAgent", "honest_updates", "run_light_agents"]

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def honest_updates(cfg: FleetConfig, n: int = 64, seed: int = 0) -> list[tuple[dict[str, np.ndarray], int]]:
    """Update arrays (and epochs) a real :class:`AgentCore` produced from `n` synthetic labelled samples."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.sources import Reading

    core = AgentCore(cfg, "pool", 0, mode="async")
    rng = np.random.default_rng(seed)
    out: list[tuple[dict[str, np.ndarray], int]] = []
    for i in range(max(n, 8)):
        x = rng.uniform(-1, 1, cfg.n_inputs)
        _, msgs = core.on_reading(Reading(f"p{i}", x, 0.0, float(np.sin(x.sum()) + 0.1 * rng.standard_normal())))
        out += [({k: np.array(v) for k, v in m.arrays.items()}, int(m.epoch)) for m in msgs]
    if not out:
        raise RuntimeError("the real agent core produced no update to replay")
    return out


class LightAgent:
    """One simulated agent: a paho client and the agent's update bookkeeping (see the module docstring)."""

    __slots__ = ("name", "index", "client", "fd", "events", "connected", "subacks", "seq", "outbox", "mids",
                 "sent_at", "created", "acked", "learned", "pending", "global_version", "global_epoch", "resent",
                 "reconnects", "rejected_globals", "reconnect_at", "done_at", "ended", "loop", "utopic",
                 "atopic", "connects", "resend_wait", "resend_oldest")

    def __init__(self, loop: _LightLoop, name: str, index: int) -> None:
        self.loop, self.name, self.index = loop, name, index
        fleet, broker = loop.cfg.fleet, loop.broker
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{fleet}.{name}", protocol=mqtt.MQTTv5,
                        userdata=self)
        c.will_set(status_topic(fleet, name), encode(status_message(fleet, name, "offline")), qos=1, retain=True)
        c.on_connect, c.on_message, c.on_publish = _on_connect, _on_message, _on_publish
        c.on_disconnect, c.on_subscribe = _on_disconnect, _on_subscribe
        c.max_inflight_messages_set(max(20, 2 * loop.outbox_limit))
        if broker.username:
            c.username_pw_set(broker.username, broker.password.get_secret_value() if broker.password else None)
        self.client = c
        self.fd = -1
        self.events = 0
        self.connected = False
        self.subacks = 0
        self.connects = 0
        self.seq = 0
        self.outbox: dict[int, bytes] = {}  # seq → encoded update, until a global includes it
        self.mids: dict[int, int] = {}  # paho mid → seq, until its PUBACK
        self.sent_at: dict[int, float] = {}  # seq → (monotonic) last handed to paho
        self.created: list[float | None] = []
        self.acked: list[float | None] = []
        self.learned = 0
        self.pending = 0  # samples not in any update yet (coalesced while flow control holds)
        self.global_version = 0
        self.global_epoch = 0
        self.resent = 0
        self.reconnects = 0
        self.rejected_globals = 0
        self.reconnect_at = 0.0
        self.done_at: float | None = None  # last sample taken (and the rest flushed)
        self.ended = False
        self.utopic = updates_topic(fleet, name)
        self.atopic = acks_topic(fleet, name)
        self.resend_wait = loop.resend_after  # backs off while globals are late (see resend_due)
        self.resend_oldest = 0

    # ------------------------------------------------------------------ connection
    def connect(self) -> None:
        b, loop = self.loop.broker, self.loop
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = b.session_expiry
        try:
            self.client.connect(b.host, b.port, keepalive=b.keepalive, clean_start=False, properties=props)
        except OSError as e:
            loop.note_lost(f"connect: {e}"[:80])
            self.reconnect_at = time.monotonic() + 1.0
            return
        self.connects += 1
        loop.watch(self)

    # ------------------------------------------------------------------ the stream
    def sample(self) -> None:
        self.learned += 1
        self.pending += 1
        if self.connected and len(self.outbox) < self.loop.outbox_limit:
            self.upload()

    def end_of_stream(self) -> None:
        """The last upload goes out even while flow control holds (as the real agent's end of stream)."""
        if self.pending and self.connected:
            self.upload()
        self.done_at = time.monotonic()

    def upload(self) -> None:
        loop = self.loop
        self.seq += 1
        arrays, epoch = loop.pool[(self.index + self.seq) % len(loop.pool)]
        now = time.time()
        msg = Message(loop.cfg.fleet, self.name, loop.update_kind, self.seq, self.global_version, loop.kernel_version,
                      self.pending, now, arrays, epoch=max(epoch, self.global_epoch))
        self.pending = 0
        self.outbox[self.seq] = encode(msg)
        self.created.append(now)
        self.acked.append(None)
        self.publish(self.seq)

    def publish(self, seq: int) -> None:
        info = self.client.publish(self.utopic, self.outbox[seq], 1, False)
        self.sent_at[seq] = time.monotonic()
        if info.rc == mqtt.MQTT_ERR_SUCCESS or info.rc == mqtt.MQTT_ERR_NO_CONN:
            self.mids[info.mid] = seq  # paho keeps it in its session and sends it on reconnect
        self.loop.wants_write(self)

    def resend_due(self, now: float, after: float | None = None) -> None:
        """Send again what waited the resend timer's wait (`after` overrides it: 0 after a reconnect). A timed
        resend doubles the wait, up to `resend_backoff` × `resend_after`; an included update resets it."""
        if not self.outbox:
            return
        loop = self.loop
        oldest = min(self.outbox)
        if oldest != self.resend_oldest:
            self.resend_oldest, self.resend_wait = oldest, loop.resend_after
        wait = self.resend_wait if after is None else after
        inflight = set(self.mids.values())
        again = [s for s in self.outbox if s not in inflight and now - self.sent_at.get(s, -math.inf) >= wait]
        for seq in again:
            self.resent += 1
            self.publish(seq)
        if again and after is None:
            self.resend_wait = min(2 * wait, loop.resend_after * loop.resend_backoff)

    # ------------------------------------------------------------------ what arrives
    def on_global(self, payload: bytes) -> None:
        loop = self.loop
        msg = loop.shared.decode(payload, loop.cfg, loop.kernel_version, loop.cfg.global_kind)
        if isinstance(msg, ProtocolError):
            self.rejected_globals += 1
            return
        if msg.global_version <= self.global_version:
            return
        self.global_version, self.global_epoch = int(msg.global_version), int(msg.epoch)
        mark = int(msg.included.get(self.name, 0))
        for s in [s for s in self.outbox if s <= mark]:
            del self.outbox[s]
            self.sent_at.pop(s, None)
        if mark > self.seq:
            self.seq = mark
        if self.pending and self.connected and len(self.outbox) < loop.outbox_limit and self.learned:
            self.upload()  # what flow control held back leaves as soon as there is room (the real agent's take_held)

    def on_ack(self, payload: bytes) -> None:
        loop = self.loop
        try:
            msg = decode(payload, loop.cfg, client=self.name, kinds=("ack",))
        except ProtocolError:
            return
        mark = int(msg.included.get(self.name, 0))
        missing = set(msg.arrays["missing"].tolist()) if "missing" in msg.arrays else set()
        now = time.monotonic()
        inflight = set(self.mids.values())
        # not named missing: probably on its way to an aggregator behind its input; the resend timer's wait
        wait = self.resend_wait
        for s in sorted(self.outbox):
            if s > mark and s not in inflight and (s in missing or now - self.sent_at.get(s, -math.inf) >= wait):
                self.resent += 1
                self.publish(s)

    def result(self) -> dict[str, Any]:
        return {"seq": self.seq, "learned": self.learned, "outbox": sorted(self.outbox), "resent": self.resent,
                "reconnects": self.reconnects, "dropped_predictions": 0, "rejected_globals": self.rejected_globals,
                "global_version": self.global_version, "created": self.created, "acked": self.acked,
                "pending": self.pending}


# paho callbacks (userdata: the agent)
def _on_connect(client: mqtt.Client, agent: LightAgent, flags: Any, rc: Any, props: Any) -> None:
    if rc.is_failure:
        agent.loop.note_lost(f"refused: {rc}")
        return
    client.subscribe([(global_topic(agent.loop.cfg.fleet), 1), (agent.atopic, 1)])


def _on_subscribe(client: mqtt.Client, agent: LightAgent, mid: int, rcs: Any, props: Any) -> None:
    agent.connected = True
    if agent.pending and len(agent.outbox) < agent.loop.outbox_limit:
        agent.upload()
    agent.resend_due(time.monotonic(), 0.0)  # what was not acknowledged before a reconnect


def _on_message(client: mqtt.Client, agent: LightAgent, message: Any) -> None:
    topic = message.topic
    if topic == agent.atopic:
        agent.on_ack(message.payload)
    else:
        agent.on_global(message.payload)


def _on_publish(client: mqtt.Client, agent: LightAgent, mid: int, rc: Any, props: Any) -> None:
    seq = agent.mids.pop(mid, None)
    if seq is not None and agent.acked[seq - 1] is None:
        agent.acked[seq - 1] = time.time()


def _on_disconnect(client: mqtt.Client, agent: LightAgent, flags: Any, rc: Any, props: Any) -> None:
    if agent.ended:
        return
    agent.connected = False
    agent.reconnects += 1
    agent.loop.note_lost(str(rc)[:80])
    agent.mids.clear()
    agent.reconnect_at = time.monotonic() + 1.0


class _LightLoop:
    """The epoll loop that drives every paho client of the process."""

    def __init__(self, cfg: FleetConfig, broker: BrokerConfig, outbox_limit: int, pool: list[Any],
                 resend_after: float = 10.0, resend_backoff: float = AgentSettings.resend_backoff) -> None:
        self.cfg, self.broker, self.outbox_limit, self.pool = cfg, broker, max(1, outbox_limit), pool
        self.resend_after, self.resend_backoff = float(resend_after), max(1.0, float(resend_backoff))
        from streamfed import algorithms

        self.kernel_version = algorithms.get(cfg.algorithm).kernel_version(cfg)
        self.update_kind = cfg.update_kind
        self.shared = SharedGlobals()
        self.sel = selectors.EpollSelector()
        self.lost: dict[str, int] = {}

    def note_lost(self, reason: str) -> None:
        self.lost[reason] = self.lost.get(reason, 0) + 1

    def watch(self, agent: LightAgent) -> None:
        """(Re)register the agent's socket, reading; writing too while paho has bytes waiting."""
        sock = agent.client.socket()
        fd = sock.fileno() if sock is not None else -1
        if fd != agent.fd:
            if agent.fd >= 0:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self.sel.unregister(agent.fd)
            agent.fd, agent.events = fd, 0
            if fd < 0:
                return
        if fd < 0:
            return
        events = _READ | (_WRITE if agent.client.want_write() else 0)
        if events != agent.events:
            if agent.events:
                self.sel.modify(fd, events, agent)
            else:
                self.sel.register(fd, events, agent)
            agent.events = events

    def wants_write(self, agent: LightAgent) -> None:
        c = agent.client
        if c.want_write() and not agent.events & _WRITE:
            c.loop_write()
            self.watch(agent)

    def poll(self, timeout: float) -> None:
        for key, mask in self.sel.select(max(0.0, timeout)):
            agent: LightAgent = key.data
            c = agent.client
            if mask & _READ:
                c.loop_read(16)
            if c.want_write():
                c.loop_write()
            self.watch(agent)


def _tend(agents: list[LightAgent], n: int, loop: _LightLoop, k: int, mono: float) -> int:
    """paho's housekeeping (keepalive pings) for the next slice of the first `n` agents, and the reconnects due
    among them; returns where the next slice starts. A twentieth per call, called every tenth of a second: each
    agent every 2 s. (Before, the connect phase did none: with a ramp over 45 s the first agents sent nothing for
    1.5 keepalives and the broker closed them.)"""
    for _ in range(max(1, n // 20)):
        a = agents[k % n]
        k += 1
        if a.fd >= 0:
            a.client.loop_misc()
            loop.watch(a)
        elif not a.ended and mono >= a.reconnect_at and a.reconnect_at:
            a.reconnect_at = 0.0
            try:
                a.client.reconnect()
                loop.watch(a)
            except OSError as e:
                loop.note_lost(f"reconnect: {e}"[:80])
                a.reconnect_at = mono + 2.0
    return k


def run_light_agents(spec: dict[str, Any], lost_reasons: dict[str, int]) -> dict[str, Any]:
    """One agent process of light agents (the spec as `loadtest._run` writes it); returns per-agent results."""
    cfg = FleetConfig.model_validate(spec["fleet"])
    broker = BrokerConfig.model_validate(spec["broker"])
    rate, n_samples = float(spec["rate"]), int(spec["samples"])
    period = 1.0 / rate
    loop = _LightLoop(cfg, broker, int(spec.get("outbox_limit", 8)), honest_updates(cfg, seed=int(spec["seed"])),
                      resend_after=float(spec["resend_after"]))
    rng = np.random.default_rng([spec["seed"], len(spec["clients"])])
    agents = [LightAgent(loop, name, index) for name, index in spec["clients"]]
    phases = rng.uniform(0, period, len(agents))
    order = np.argsort(phases)
    ramp, drain = float(spec["ramp"]), float(spec["drain"])
    linger = float(spec.get("linger", 3.0))
    t0 = time.time()
    cpu0 = time.process_time()
    # connect, spread over the ramp
    n = len(agents)
    k = 0
    late = float(spec["t_start"]) + float(spec.get("connect_grace", 60.0))
    connected_at = None
    next_misc, misc_k = time.monotonic() + 0.1, 0
    while True:
        now = time.time()
        while k < n and now >= t0 + ramp * k / max(1, n):
            agents[k].connect()
            k += 1
        loop.poll(0.005 if k < n else 0.05)
        mono = time.monotonic()
        if k and mono >= next_misc:  # the ones connected keep their keepalive while the rest connect
            next_misc = mono + 0.1
            misc_k = _tend(agents, k, loop, misc_k, mono)
        if k == n and all(a.connected for a in agents):
            connected_at = time.time()
            break
        if time.time() > late:
            break
    start_at = max(float(spec["t_start"]), time.time() + 1.0)
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    cpu_connect = time.process_time() - cpu0
    lateness: list[float] = []
    last_taken = 0.0
    i = j = 0  # sample round i, agent j (in phase order) of it
    next_resend = next_misc = time.monotonic() + 1.0
    cpu_sampling0 = None
    while True:
        now = time.time()
        if cpu_sampling0 is None and now >= start_at:
            cpu_sampling0 = (time.process_time(), now)
        while i < n_samples and n:
            due = start_at + i * period + phases[order[j]]
            if due > now:
                break
            a = agents[order[j]]
            lateness.append(now - due)
            last_taken = now
            a.sample()
            if i == n_samples - 1:
                a.end_of_stream()
            j += 1
            if j == n:
                i, j = i + 1, 0
        mono = time.monotonic()
        if mono >= next_misc:  # keepalive pings and reconnects, a slice of the agents per tenth of a second
            next_misc = mono + 0.1
            misc_k = _tend(agents, n, loop, misc_k, mono)
        if mono >= next_resend:
            next_resend = mono + 1.0
            for a in agents:
                if a.outbox and a.connected:
                    a.resend_due(mono)
        if i >= n_samples:
            if all(not a.outbox for a in agents) or any(
                    a.done_at is not None and mono - a.done_at > drain for a in agents):
                break
        nxt = start_at + i * period + phases[order[j]] - time.time() if i < n_samples else 0.05
        loop.poll(min(0.05, max(0.0, nxt)))
    sampling_cpu = (time.process_time() - cpu_sampling0[0]) if cpu_sampling0 else float("nan")
    end_linger = time.monotonic() + linger
    while (mono := time.monotonic()) < end_linger:
        loop.poll(0.05)
        # keepalive here too: the linger is 2 windows (60 s at a 30 s window), beyond Mosquitto's 1.5 × 30 s, and
        # without pings the broker closed every agent once at its end (the one reconnect per agent at 10,000)
        if mono >= next_misc:
            next_misc = mono + 0.1
            misc_k = _tend(agents, n, loop, misc_k, mono)
    for a in agents:
        a.ended = True
        with contextlib.suppress(Exception):
            a.client.disconnect()
            a.client.loop_write()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lost_reasons.update(loop.lost)
    return {
        "pid": os.getpid(), "cpu_s": time.process_time() - cpu0, "cpu_connect_s": cpu_connect,
        "cpu_sampling_s": sampling_cpu, "maxrss_bytes": usage.ru_maxrss * 1024,
        "started": t0, "all_connected_at": connected_at, "t_start": start_at, "ended": time.time(),
        "last_sample_at": last_taken, "errors": [], "n_errors": 0,
        "lost_reasons": dict(loop.lost), "light": True, "shared_decodes_hits": loop.shared.hits,
        "lateness": [float(np.percentile(lateness, q)) for q in (50, 99, 100)] if lateness else None,
        "prediction_latency_s": None,
        "agents": {a.name: a.result() for a in agents},
    }
