"""The attack figure of the summed-statistics algorithms (FedBNR, FSGP; docs/reliability.md §7.2): real agents and
the real aggregator core through the codec, one reading per client per second, with attackers and a flooder that
send protocol-valid uploads built by the algorithm's own `upload(agent, core, client, seq, X, y)`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.wire.message import Message, decode, encode

Upload = Callable[[AgentCore, AggregatorCore, str, int, np.ndarray, np.ndarray], Message]


Labels = Callable[[AgentCore, AggregatorCore, Any, np.ndarray], np.ndarray]


def run_attacked_fleet(fleet: Any, cfg: FleetConfig, upload: Upload, steps: int, attackers: Collection[str] = (),
                       silent: bool = False, flooder: str | None = None, probe: int | None = None,
                       labels: Labels | None = None) -> tuple[dict[str, float], AggregatorCore]:
    """Every honest client's prequential MSE, and the core. An attacker sends, whenever its token bucket holds
    16 samples, statistics of real rows of its station with every label at −B·sign(the global's prediction)
    (`B = cfg.robust.label_bound`) and n = all the tokens it has — protocol-valid: they pass every declared
    bound. The flooder sends honest statistics (real rows, real labels), 50 uploads a second from t = 100 to
    119. `labels(agent, core, stream, rows)`: the attackers' labels instead (an adaptive attacker sees its
    agent, the core and its rows). `silent`: the attackers send nothing (the attack-free run of the same honest
    clients). `probe`: the step at which `core.probed` records the clients' shares; `core.agents` holds the
    agents at the end."""
    names = list(fleet.names)
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    core = AggregatorCore(cfg, clients=names, window=0.0)
    level = dict.fromkeys(names, cfg.robust.sample_burst)  # the core's token bucket on samples, mirrored
    seqs = dict.fromkeys(names, 0)
    rng = np.random.default_rng(0)
    bound = cfg.robust.label_bound

    def forged(n: str, t: int, k: int, labels: Callable[[Any, np.ndarray], np.ndarray]) -> Message:
        s = fleet.streams[names.index(n)]
        rows = rng.integers(0, t + 1, k)
        seqs[n] += 1
        level[n] -= k
        return upload(agents[n], core, n, seqs[n], s.X[rows], labels(s, rows))

    def deliver(msgs: list[Message], now: float) -> None:
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            payload = encode(m, cfg)
            if m.kind.endswith(".update"):
                refused = sum(core.rejected.values())
                queue += core.on_update(m.client, payload, now=now)
                if m.client in attackers and sum(core.rejected.values()) > refused:
                    seqs[m.client] -= 1  # a refused forgery's seq is used again (no gap to wedge the next ones)
            elif m.kind.endswith(".global"):
                for a in agents.values():
                    a.on_global(decode(payload, cfg, kernel_version=a.kernel_version), now=now)

    rate, burst = cfg.robust.max_sample_rate, cfg.robust.sample_burst
    least = max(16, int(getattr(cfg.params, "min_upload", 16)))  # the smallest upload the aggregator takes
    for t in range(steps):
        now = float(t)
        msgs: list[Message] = []
        if t:
            level.update({n: min(burst, v + rate) for n, v in level.items()})
        for i, n in enumerate(names):
            s = fleet.streams[i]
            if n in attackers:
                k = int(level[n])
                if not silent and k >= least and labels is not None:
                    msgs.append(forged(n, t, k, lambda s, rows, a=agents[n]: labels(a, core, s, rows)))
                elif not silent and k >= least:
                    sign = np.sign(agents[n].learner.predict(s.X[t])[0]) or 1.0
                    msgs.append(forged(n, t, k, lambda s, rows, sign=sign: np.full(rows.size, -bound * sign)))
                continue
            if n == flooder:
                for _ in range(50 if 100 <= t < 120 else 0):
                    k = int(min(32, level[n]))
                    if k >= 16:
                        msgs.append(forged(n, t, k, lambda s, rows: s.y[rows]))
                continue
            msgs += agents[n].on_reading(Reading(f"{t}", s.X[t], now, float(s.y[t])), now=now)[1]
        deliver(msgs, now)
        if t == probe:
            core.probed = core.aggregation.client_shares()  # type: ignore[attr-defined]
    mse = {n: a.counters.sq_loss / a.counters.learned for n, a in agents.items()
           if n not in attackers and n != flooder}
    core.agents = list(agents.values())  # type: ignore[attr-defined]
    return mse, core
