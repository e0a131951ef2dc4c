"""Run aggregators or agents of one or more fleets in one process, from a JSON spec — the unit a
fault-injection test starts, SIGKILLs and starts again (``python -m streamfed.runtime.runner``).

Spec (JSON)::

    {"broker": {...BrokerConfig...}, "state_dir": "/var/lib/streamfed",
     "fleets": [{"config": {...FleetConfig...}, "mode": "lockstep", "clients": ["a", "b"],
                 "window": 0.05, "offline": "wait", "rate": 40.0, "drain": 60.0,
                 "streams": {"a": "a.npz", "b": "b.npz"}}]}

Optional service settings (the aggregators'), with their defaults::

    {"service": {"checkpoint_retry": 1.0, "checkpoint_deadline": 30.0}}

Each stream file is an ``.npz`` with `X (T, d)` and `y (T,)`. ``runner SPEC aggregator`` runs every
fleet's aggregator until SIGTERM/SIGINT; ``runner SPEC agent CLIENT`` runs that client's agent in every
fleet that lists it, until their streams end (the process exits 0) — both with the spec's `state_dir`,
so a restarted process resumes where its state says, and an agent's source continues after the last
item the state covers.

Exit status: 0 after SIGTERM/SIGINT or the end of the streams; 2 when the broker refuses the connection
(:class:`~streamfed.runtime.session.BrokerRefused`); 3 when the state cannot be written for longer than
`checkpoint_deadline` (:class:`~streamfed.runtime.service.CheckpointFailed`); 4 when another aggregator connected
with the same client id (:class:`~streamfed.runtime.service.DuplicateService`) — each with one ``error: …`` line
on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregation_mode import resolve_aggregation
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.service import ServiceFailed
from streamfed.runtime.session import BrokerRefused

__all__ = ["FleetSpec", "array_source_from", "load_spec", "main", "run_agents", "run_aggregators", "service_options"]

log = logging.getLogger(__name__)


@dataclass
class FleetSpec:
    """One fleet of a runner spec.

    >>> spec = FleetSpec.from_dict({"config": {"fleet": "f", "algorithm": "fedbnr", "n_inputs": 2},
    ...                              "clients": ["a"], "streams": {"a": "a.npz"}})
    >>> spec.config.fleet, spec.mode, spec.streams["a"].name
    ('f', 'async', 'a.npz')
    """

    config: FleetConfig
    clients: list[str]
    streams: dict[str, Path] = field(default_factory=dict)
    mode: str = "async"
    window: float = 0.05
    offline: str = "drop"
    rate: float | None = None
    drain: float = 60.0

    @classmethod
    def from_dict(cls, d: dict[str, Any], base: Path = Path(".")) -> FleetSpec:
        return cls(FleetConfig.model_validate(d["config"]), list(d["clients"]),
                   {c: base / p for c, p in d.get("streams", {}).items()}, d.get("mode", "async"),
                   float(d.get("window", 0.05)), d.get("offline", "drop"), d.get("rate"), float(d.get("drain", 60.0)))


_SERVICE_KEYS = {"checkpoint_retry", "checkpoint_deadline"}


def load_spec(path: str | Path) -> tuple[BrokerConfig, Path | None, list[FleetSpec]]:
    """`(broker, state_dir, fleets)` of a spec file (relative stream paths are relative to it)."""
    p = Path(path)
    d = json.loads(p.read_text())
    state_dir = Path(d["state_dir"]) if d.get("state_dir") else None
    return (BrokerConfig.model_validate(d.get("broker", {})), state_dir,
            [FleetSpec.from_dict(f, p.parent) for f in d["fleets"]])


def service_options(path: str | Path) -> dict[str, float]:
    """The spec's `service` settings (see the module doc); `ValueError` for an unknown key."""
    opts = json.loads(Path(path).read_text()).get("service", {})
    unknown = set(opts) - _SERVICE_KEYS
    if unknown:
        raise ValueError(f"unknown service setting(s) {sorted(unknown)}; known: {sorted(_SERVICE_KEYS)}")
    return {k: float(v) for k, v in opts.items()}


def array_source_from(X: np.ndarray, y: np.ndarray, rate: float | None) -> Callable[[int], AsyncIterator[Reading]]:
    """A resumable source: `source(pos)` yields readings `pos, pos + 1, …` (ids `s<i>`), one every
    `1/rate` seconds at most — also after a stall (no burst to catch up, unlike `sources.paced`: a
    sensor that was blocked does not produce its backlog at once, and a test can rely on the pace)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    period = 1.0 / rate if rate else 0.0

    async def source(pos: int) -> AsyncIterator[Reading]:
        for i in range(pos, len(y)):
            await asyncio.sleep(period)
            yield Reading(f"s{i}", X[i], float(i), float(y[i]))

    return source


def _stop_on_signals(services: Sequence[AgentService | AggregatorService]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [s.stop() for s in services])


async def run_aggregators(broker: BrokerConfig, state_dir: Path | None, fleets: Sequence[FleetSpec],
                          **options: float) -> None:
    """Every fleet's aggregator, until SIGTERM/SIGINT (`options`: the spec's service settings)."""
    resolved = [resolve_aggregation(f.config, authenticated=broker.username is not None) for f in fleets]
    services = [AggregatorService(AggregatorCore(cfg, clients=f.clients, mode=f.mode,  # type: ignore[arg-type]
                                                 window=f.window, offline=f.offline),  # type: ignore[arg-type]
                                  broker, state_dir=state_dir, connect_timeout=2.0, freeze=True,
                                  **options)  # type: ignore[arg-type]
                for f, (cfg, _) in zip(fleets, resolved, strict=True)]
    _stop_on_signals(services)
    for s, (_, line) in zip(services, resolved, strict=True):
        log.info("aggregator %s: version %d (%s), %s", s.fleet, s.core.version, "resumed" if s.restored else "new",
                 line)
    await asyncio.gather(*(s.run() for s in services))


async def run_agents(broker: BrokerConfig, state_dir: Path | None, fleets: Sequence[FleetSpec], client: str) -> None:
    """`client`'s agent in every fleet that lists it, until their streams end."""
    services = []
    for f in fleets:
        if client not in f.clients:
            continue
        data = np.load(f.streams[client])
        core = AgentCore(f.config, client, f.clients.index(client), mode=f.mode)  # type: ignore[arg-type]
        svc = AgentService(core, broker, array_source_from(data["X"], data["y"], f.rate), state_dir=state_dir,
                           settings=AgentSettings(drain=f.drain, resend_after=5.0, connect_timeout=2.0))
        log.info("agent %s/%s: %s at source item %d", f.config.fleet, client,
                 "resumed" if svc.restored else "new", svc.source_pos)
        services.append(svc)
    if not services:
        raise SystemExit(f"no fleet lists client {client!r}")
    _stop_on_signals(services)
    await asyncio.gather(*(s.run() for s in services))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streamfed.runtime.runner", description=__doc__.split("\n")[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("role", choices=["aggregator", "agent"])
    ap.add_argument("client", nargs="?")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    broker, state_dir, fleets = load_spec(args.spec)
    try:
        if args.role == "aggregator":
            asyncio.run(run_aggregators(broker, state_dir, fleets, **service_options(args.spec)))
        else:
            if not args.client:
                ap.error("the agent role needs a client id")
            asyncio.run(run_agents(broker, state_dir, fleets, args.client))
    except BrokerRefused as e:
        log.error("%s", e)
        return 2
    except ServiceFailed as e:  # one line, no traceback: what failed and what is on disk
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
