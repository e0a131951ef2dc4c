"""A small personalised-FedBNR fleet run in process: agents and an aggregator (every upload its own window)
through the real codec, every global installed by every agent — for the tests of its experts and its refits."""

from __future__ import annotations

from typing import Any

from streamfed.evaluation.datasets import synthetic_fleet
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.wire.message import Message, encode


def run_personal_fleet(params: dict[str, Any], n_agents: int = 2, steps: int = 80
                       ) -> tuple[AggregatorCore, list[AgentCore], list[Message]]:
    """`n_agents` synthetic streams of `steps` readings under `fedbnr-personal` with `params` (uploads of 8):
    the aggregator, the agents and every global published, in order."""
    data = synthetic_fleet(n_agents, steps, 2, seed=7)
    cfg = FleetConfig(standardise="none", fleet="mix", algorithm="fedbnr-personal", n_inputs=2, n_features=6,
                      kernels=["gaussian:1.0"], params={"min_upload": 8, **params})
    agg = AggregatorCore(cfg, mode="async", window=0.0)
    agents = [AgentCore(cfg, f"a{i}", i) for i in range(n_agents)]
    globals_ = []
    for t in range(steps):
        for a, s in zip(agents, data.streams, strict=True):
            for m in a.on_reading(Reading(str(t), s.X[t], float(t), float(s.y[t])))[1]:
                for out in agg.on_update(a.client_id, encode(m), now=0.0):
                    if out.kind.endswith(".global"):
                        globals_.append(out)
                        for b in agents:
                            b.on_global_payload(encode(out))
    return agg, agents, globals_
