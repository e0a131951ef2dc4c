"""The fleet's other services — `streamfed aggregator`, `shard` and `reducer` — and its views: `streamfed
subscribe` (the predictions, live) and `streamfed broker-metrics` (the broker's $SYS statistics for Prometheus)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from streamfed.cli.common import (
    DP_HELP,
    SECAGG_HELP,
    console,
    load,
    name_list,
    refuse,
    validation_problem,
    with_privacy,
)
from streamfed.cli.serving import run_service, serve

__all__ = ["aggregator", "broker_metrics", "reducer", "shard", "subscribe"]


def aggregator(
    config: Annotated[Path, typer.Option(help="fleet + broker configuration (TOML or JSON)")],
    clients: Annotated[str | None, typer.Option(help="comma-separated client ids, in fleet order")] = None,
    mode: Annotated[str, typer.Option(help="lockstep (algorithms with lock-step rounds) or async; order-free "
                                      "ones always run async")] = "async",
    window: Annotated[float, typer.Option(help="async aggregation window, seconds")] = 0.5,
    quorum: Annotated[int | None, typer.Option(help="lock-step: close a round with this many after a timeout")] = None,
    round_timeout: Annotated[float, typer.Option(help="lock-step round timeout, seconds")] = 5.0,
    shared_group: Annotated[str | None, typer.Option(help="MQTT v5 shared-subscription group")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="persist the global state here; resume from it")] = None,
    wait_offline: Annotated[bool, typer.Option(help="lock-step: rounds wait for clients that went offline")] = False,
    dp_epsilon: Annotated[float | None, typer.Option(help=DP_HELP)] = None,
    secure_aggregation: Annotated[bool | None, typer.Option(help=SECAGG_HELP)] = None,
    recover: Annotated[bool, typer.Option(help="the state was lost or restored from an older copy and the agents are "
                                          "ahead of it: start a new epoch in which they upload their totals again "
                                          "(docs/reliability.md § Lost state)")] = False,
) -> None:
    """Run a fleet's aggregator: validate, deduplicate and aggregate updates; publish the global."""
    from streamfed.fleet.aggregation_mode import resolve_aggregation
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.runtime.aggregator import AggregatorService

    cfg = with_privacy(load(config), dp_epsilon, secure_aggregation)
    fleet, mode_line = resolve_aggregation(cfg.fleet, authenticated=cfg.broker.username is not None)
    try:
        core = AggregatorCore(fleet, clients=_roster(clients, cfg, "aggregator"), mode=mode, quorum=quorum,  # type: ignore[arg-type]
                              round_timeout=round_timeout, window=window, offline="wait" if wait_offline else "drop",
                              recover=recover)
    except ValueError as e:
        refuse(str(e))
    serve(lambda: AggregatorService(core, cfg.broker, shared_group=shared_group, state_dir=state_dir, freeze=True),
          [core.stats], metrics_port,
          lambda svc: f"aggregator of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}, {core.mode}, "
                      f"{mode_line}) on {cfg.broker.host}:{cfg.broker.port}"
                      + (f", global v{core.version} resumed" if svc.restored else ""))


def _roster(option: str | None, cfg: Any, role: str) -> list[str] | None:
    """The fleet's members for an aggregating `role`: `--clients`, else the configuration's `[fleet] clients`.
    On an authenticated broker (production) one of them is required: an aggregator that takes updates from
    whoever the broker lets in is one leaked password from a poisoned global."""
    names = name_list(option) or (list(cfg.fleet.clients) if cfg.fleet.clients else None)
    if names is None and cfg.broker.username is not None:
        refuse(f"the {role} of an authenticated (production) broker needs its fleet's roster: set [fleet] clients "
               "in the configuration or give --clients")
    return names


def shard(
    config: Annotated[Path, typer.Option(help="fleet + broker configuration (TOML or JSON)")],
    name: Annotated[str, typer.Option(help="this shard's name (unique in the fleet)")],
    clients: Annotated[str | None, typer.Option(help="comma-separated client ids, in fleet order")] = None,
    mode: Annotated[str, typer.Option(help="lockstep (algorithms with lock-step rounds) or async; order-free "
                                      "ones always run async")] = "async",
    group: Annotated[str, typer.Option(help="MQTT v5 shared-subscription group of the shards")] = "shards",
    flush_interval: Annotated[float | None, typer.Option(
        help="seconds between partial sums sent to the reducer (default: 0.02 lock-step, 0.1 async)")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    resend_after: Annotated[float, typer.Option(
        help="seconds before a partial the reducer has not acknowledged is sent again (behind a bridge that queues "
             "through outages, longer: docs/sharding.md)", min=0.1)] = 5.0,
) -> None:
    """Run one aggregator shard: take a share of the updates, validate, sum, send partials to the reducer."""

    from streamfed.fleet.sharding import ShardCore
    from streamfed.fleet.telemetry import AggregatorStats
    from streamfed.runtime.shard import ShardService

    cfg = load(config)
    stats = AggregatorStats(cfg.fleet.fleet)
    core = ShardCore(cfg.fleet, name, clients=_roster(clients, cfg, "shard"), mode=mode, stats=stats,  # type: ignore[arg-type]
                     resend_after=resend_after)
    serve(lambda: ShardService(core, cfg.broker, group=group, flush_interval=flush_interval),  # None: by mode
          [stats], metrics_port,
          lambda svc: f"shard {name!r} of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}, {core.mode}) in "
                      f"group {group!r} on {cfg.broker.host}:{cfg.broker.port}")


def reducer(
    config: Annotated[Path, typer.Option(help="fleet + broker configuration (TOML or JSON)")],
    clients: Annotated[str | None, typer.Option(help="comma-separated client ids, in fleet order")] = None,
    mode: Annotated[str, typer.Option(help="lockstep (algorithms with lock-step rounds) or async; order-free "
                                      "ones always run async")] = "async",
    window: Annotated[float, typer.Option(help="async aggregation window, seconds")] = 0.5,
    shards: Annotated[str | None, typer.Option(help="comma-separated shard names to accept (default: any)")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    wait_offline: Annotated[bool, typer.Option(help="lock-step: rounds wait for clients that went offline")] = False,
    state_dir: Annotated[Path | None, typer.Option(help="persist the global state here; resume from it")] = None,
) -> None:
    """Run the reducer of a sharded fleet: combine the shards' partial sums, publish the global."""

    from streamfed.fleet.sharding import ReducerCore
    from streamfed.runtime.shard import ReducerService

    cfg = load(config)
    core = ReducerCore(cfg.fleet, clients=_roster(clients, cfg, "reducer"), mode=mode, window=window,  # type: ignore[arg-type]
                       shards=name_list(shards), offline="wait" if wait_offline else "drop")
    from streamfed.runtime.region_view import RegionCollector

    serve(lambda: ReducerService(core, cfg.broker, state_dir=state_dir), [core.stats], metrics_port,
          lambda svc: f"reducer of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}, {core.mode}) on "
                      f"{cfg.broker.host}:{cfg.broker.port}"
                      + (f", global v{core.version} resumed" if svc.restored else ""),
          lambda svc: [RegionCollector([svc.regions])])  # per shard (region): last partial, transit, lag


def subscribe(
    fleet: Annotated[str, typer.Option(help="fleet name")],
    config: Annotated[Path | None, typer.Option(help="configuration file (for the broker section)")] = None,
    host: Annotated[str, typer.Option(help="broker host (without --config)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="broker port (without --config)")] = 1883,
    count: Annotated[int | None, typer.Option(help="exit after this many predictions")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON line per prediction")] = False,
    client_id: Annotated[str | None, typer.Option(help="MQTT client id (default: the user name if there is one, "
                                                  "as a production broker's viewer account requires)")] = None,
) -> None:
    """A live view of a fleet's predictions (or JSON lines with --json)."""
    import asyncio

    from streamfed.fleet.config import BrokerConfig
    from streamfed.runtime.subscribe import watch

    broker = load(config).broker if config else BrokerConfig(host=host, port=port)
    try:
        asyncio.run(watch(fleet, broker, console, count=count, as_json=as_json, client_id=client_id))
    except KeyboardInterrupt:
        pass


def broker_metrics(
    config: Annotated[Path | None, typer.Option(help="a TOML file whose [broker] table is the monitor's login")] = None,
    host: Annotated[str, typer.Option(help="broker host (without --config)")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="broker port (without --config; default 8883 with TLS)")] = None,
    username: Annotated[str, typer.Option(help="user name (without --config); password: STREAMFED_BROKER__PASSWORD")
                        ] = "monitor",
    tls_ca: Annotated[Path | None, typer.Option(help="CA certificate of the broker (without --config)")] = None,
    client_id: Annotated[str | None, typer.Option(help="MQTT client id (default: the user name)")] = None,
    metrics_port: Annotated[int, typer.Option(help="serve Prometheus metrics on this port")] = 9412,
) -> None:
    """Export the broker's $SYS statistics (dropped messages, clients, queued messages, load) to Prometheus."""
    import os
    import tomllib

    from pydantic import ValidationError

    from streamfed.fleet.config import BrokerConfig
    from streamfed.runtime.broker_metrics import BrokerMetrics, SysSubscriber
    from streamfed.runtime.exporter import make_registry, serve_metrics

    password = os.environ.get("STREAMFED_BROKER__PASSWORD")
    try:
        if config is not None:
            section = tomllib.loads(config.read_text(encoding="utf-8")).get("broker", {})
            broker = BrokerConfig.model_validate(section | ({"password": password} if password else {}))
        else:
            broker = BrokerConfig.model_validate(
                {"host": host, "username": username, "password": password,
                 **({"port": port} if port is not None else {}), **({"tls_ca": str(tls_ca)} if tls_ca else {})})
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as e:
        refuse(f"broker configuration: {validation_problem(e) if isinstance(e, ValidationError) else e}")
    metrics = BrokerMetrics()
    server, bound = serve_metrics(make_registry(metrics), port=metrics_port)
    console.print(f"broker metrics of {broker.host}:{broker.port} ($SYS as {broker.username!r}) on "
                  f"http://127.0.0.1:{bound}/metrics", soft_wrap=True)
    run_service(SysSubscriber(broker, metrics, client_id=client_id), server)
