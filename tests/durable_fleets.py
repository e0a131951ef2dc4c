"""Fleets run in-process to a state worth saving (tests/test_durable_states.py): every registered algorithm, in each
mode it runs, plain and with its wrappers (differential privacy, secure aggregation, robust aggregation, sharding)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamfed import algorithms
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.secure_aggregation import DOWN_KINDS
from streamfed.fleet.sharding import ReducerCore, ShardCore
from streamfed.fleet.sources import Reading
from streamfed.wire.message import Message, ProtocolError, decode, encode
from streamfed.wire.topics import Channel

CLIENTS = ["a", "b", "c"]
VARIANTS = ("plain", "dp", "secagg", "robust", "sharded", "raw")
# families whose parameters choose other classes for their state (a mixture client, another head, FITC)
PARAMS = {("fedbnr-personal", "mixture"): {"tau_grid": [0.05, 1.0]}, ("pfedgp", "softmax"): {"head": "softmax"},
          ("pfedgp", "inducing"): {"inducing": 4}}


def config(name: str, variant: str) -> FleetConfig:
    """A small fleet of `name` with `variant`'s wrappers (`ValueError` when the algorithm refuses them)."""
    kw: dict[str, Any] = {}
    if (name, variant) in PARAMS:
        kw["params"] = PARAMS[name, variant]
    elif variant == "dp":
        kw["dp_epsilon"] = 1.0
        # DP needs declared scales with the agents' standardisation (docs/privacy.md § The privacy boundary)
        kw["public_scales"] = {"x_mean": [0.0, 0.0, 0.0], "x_scale": [1.0, 1.0, 1.0]}
    elif variant == "secagg":
        kw["secure_aggregation"] = True
    elif variant == "robust":
        kw["robust"] = {"aggregation": "robust"}
    elif variant == "raw":
        kw["standardise"] = "none"
    # a dictionary of two kernels for the families that learn over one
    fields = algorithms.get(name).Params.model_fields
    kw.update({k: v for k, v in (("n_kernels", 2), ("n_features", 4), ("kernels", None)) if k in fields})
    return FleetConfig(fleet="d", algorithm=name, n_inputs=3, seed=1, **kw)


def cases() -> list[tuple[str, str, str]]:
    """(algorithm, variant, mode) for every registered algorithm and every variant it accepts."""
    out = []
    for name in algorithms.names():
        alg = algorithms.get(name)
        for variant in VARIANTS + tuple(v for n, v in PARAMS if n == name):
            try:
                cfg = config(name, variant)
            except ValueError:
                continue
            if variant in ("sharded", "secagg") and not alg.aggregation(cfg).shardable:
                continue  # (secure sums are partial sums too)
            if variant == "secagg":
                try:  # secure sums need fixed-size partial sums (FSGP, URK, ...; not PVI's or the baselines')
                    AgentCore(cfg, "a", 0, stats_every=10**9)
                    AggregatorCore(cfg, clients=CLIENTS, mode="async")
                except (ValueError, NotImplementedError):
                    continue
            for mode in ("lockstep", "async") if alg.lockstep else ("async",):
                if variant == "secagg" and mode == "lockstep":
                    continue  # lock-step secure rounds: tests/test_secagg_fleet.py
                out.append((name, variant, mode))
    return out


@dataclass
class Fleet:
    cfg: FleetConfig
    mode: str
    agents: list[AgentCore]
    agg: AggregatorCore
    shard: ShardCore | None = None
    reducer: ReducerCore | None = None
    now: float = 1000.0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(5))
    log: list[Any] = field(default_factory=list)  # every prediction and message, for comparing two fleets
    quiet: bool = False  # learn only: nothing is delivered (secure aggregation's masks are fresh randomness)

    @classmethod
    def start(cls, name: str, variant: str, mode: str) -> Fleet:
        cfg = config(name, variant)
        agents = [AgentCore(cfg, c, i, mode=mode, stats_every=10**9) for i, c in enumerate(CLIENTS)]  # type: ignore[arg-type]
        agg = AggregatorCore(cfg, clients=CLIENTS, mode=mode, window=0.05, round_timeout=2.0)  # type: ignore[arg-type]
        shard = reducer = None
        if variant == "sharded":
            shard = ShardCore(cfg, "s0", clients=CLIENTS, mode=mode)  # type: ignore[arg-type]
            reducer = ReducerCore(cfg, clients=CLIENTS, mode=mode, shards=["s0"], window=0.05)  # type: ignore[arg-type]
        return cls(cfg, mode, agents, agg, shard, reducer)

    def reading(self, t: int) -> tuple[np.ndarray, float]:
        x = self.rng.uniform(-1, 1, 3)
        y = np.sin(x).sum() + 0.05 * self.rng.normal()
        classes = algorithms.get(self.cfg.algorithm).n_classes(self.cfg)
        return x, float(y if classes is None else int(np.clip((y + 1.5) / 3 * classes, 0, classes - 1)))

    def deliver(self, msgs: list[Message]) -> None:
        queue = [] if self.quiet else list(msgs)
        by_id = {a.client_id: a for a in self.agents}
        while queue:
            m = queue.pop(0)
            try:
                payload = encode(m, self.cfg)
            except ProtocolError as e:  # refused by the wire (a DP-noised count below zero): dropped, noted
                self.log.append(("refused", m.kind, m.client, str(e)))
                continue
            self.log.append(encode(dataclasses.replace(m, created=0.0)))  # all but the wall-clock time
            kind = self.cfg.protocol_schema.kinds[m.kind]
            if kind.channel == Channel.UPDATES:
                queue += self.agg.on_update(m.client, payload, now=self.now)
                if self.shard is not None and self.reducer is not None:
                    for p in self.shard.on_update(m.client, payload, now=self.now):
                        queue += self.reducer.on_partial("s0", encode(p, self.cfg), now=self.now)
            elif kind.channel == Channel.ACKS and m.kind in DOWN_KINDS:
                queue += by_id[m.client].on_secagg(decode(payload, self.cfg, client=m.client, kinds=DOWN_KINDS),
                                                  now=self.now)
            elif kind.channel == Channel.ACKS and m.kind == "ack":
                by_id[m.client].on_ack(decode(payload, self.cfg, client=m.client, kinds=("ack",)))
            elif kind.channel == Channel.GLOBAL:
                for a in self.agents:
                    a.install_global(decode(payload, self.cfg, kernel_version=a.kernel_version), now=self.now)

    def run(self, steps: int) -> None:
        for t in range(steps):
            self.step(t)
            self.now += 0.1
            self.deliver(self.agg.tick(self.now))
            if self.reducer is not None:
                self.reducer.tick(self.now)
            for a in self.agents:
                if a.secagg is not None:
                    self.deliver(a.secagg_tick(self.now))

    def step(self, t: int) -> None:
        """Every agent reads its sample `t`; their messages are delivered (no clock moves: windows stay open)."""
        for a in self.agents:
            x, y = self.reading(t)
            p, msgs = a.on_reading(Reading(f"r{t}", x, self.now, y), now=self.now)
            if p is not None:
                self.log.append((p.reading_id, p.global_version, p.epoch, np.float64(p.mean).tobytes(),
                                 None if p.var is None else np.float64(p.var).tobytes(),
                                 None if p.proba is None else p.proba.tobytes()))
            self.deliver(msgs)

    def twin(self, through: Callable[[dict[str, Any]], dict[str, Any]]) -> Fleet:
        """A second fleet whose agents, aggregator and reducer are restored from states passed `through` (a file
        round trip); the sensor stream and the shard (no durable state of its own) are copies."""
        agents = []
        for a in self.agents:
            b = AgentCore(self.cfg, a.client_id, a.index, mode=a.mode, stats_every=10**9)
            b.restore(through({"kind": "agent", "core": a.snapshot(), "saved_at": self.now})["core"])
            agents.append(b)
        agg = AggregatorCore(self.cfg, clients=CLIENTS, mode=self.mode, window=0.05,  # type: ignore[arg-type]
                             round_timeout=2.0)
        agg.restore(through({"kind": "aggregator", "core": self.agg.snapshot()})["core"], now=self.now)
        reducer = None
        if self.reducer is not None:
            reducer = ReducerCore(self.cfg, clients=CLIENTS, mode=self.mode, shards=["s0"],  # type: ignore[arg-type]
                                  window=0.05)
            reducer.restore(through({"kind": "reducer", "core": self.reducer.snapshot()})["core"], now=self.now)
        return Fleet(self.cfg, self.mode, agents, agg, copy.deepcopy(self.shard), reducer, self.now,
                     copy.deepcopy(self.rng), quiet=self.quiet)
