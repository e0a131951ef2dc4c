"""Updates a fleet's aggregator accepts, for the benchmarks that feed it from a broker (ingest, runtime).

Each client's updates are made by a real `AgentCore` (async, one upload per learned sample) learning a
synthetic stream `y = sin(Σx) + noise`, so that they pass the aggregator's checks as an agent's would
(POF-MKL's declared ‖Δ‖ bound, `n_samples`, seq order). Random deltas do not: a standard-normal row of
2D = 200 values has ‖Δ‖ ≈ 14, beyond one step's bound `g · 2(R + B) = 0.4 · 2 · 10 = 8` at θ = 0.
"""

from __future__ import annotations

import numpy as np

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.wire.message import encode


def honest_updates(cfg: FleetConfig, n_clients: int, per_client: int) -> list[tuple[str, bytes]]:
    """`per_client` encoded updates from each of clients `c0 … c{n_clients-1}`, in arrival order (round by
    round: every client's first, then every client's second, …)."""
    rng = np.random.default_rng(0)
    per: list[list[bytes]] = []
    for c in range(n_clients):
        core = AgentCore(cfg, f"c{c}", c, mode="async")
        msgs: list[bytes] = []
        i = 0
        while len(msgs) < per_client:  # the first samples of a stream only set its scales: no update
            x = rng.standard_normal(cfg.n_inputs)
            y = float(np.sin(x.sum()) + 0.1 * rng.standard_normal())
            _, out = core.on_reading(Reading(f"r{i}", x, float(i), y), now=float(i))
            msgs += [encode(m) for m in out]
            i += 1
        if sum(core.counters.skipped.values()):
            raise RuntimeError(f"agent c{c} skipped samples: {core.counters.skipped}")
        per.append(msgs[:per_client])
    return [(f"c{c}", per[c][s]) for s in range(per_client) for c in range(n_clients)]
