"""How a command runs a service (an agent, aggregator, shard, reducer or the broker monitor): build it (a damaged,
foreign or locked state file is exit status 2), serve its metrics, say what runs, and run it until it ends,
Ctrl-C or SIGTERM — a broker that refuses it is exit status 2, a failed service its own status."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import typer

from streamfed.cli.common import console

__all__ = ["metrics_endpoint", "run_service", "serve"]


def serve(build: Callable[[], Any], stats: list, metrics_port: int | None, describe: Callable[[Any], str],
          collectors: Callable[[Any], list] | None = None) -> None:
    """Build a service (a damaged, foreign or locked state file is exit 2, with its reason), serve its metrics
    (`stats`, and `collectors(service)` if given), say what runs (`describe(service)`), and run it."""
    from streamfed.fleet.persistence import StateError

    try:
        svc = build()
    except StateError as e:
        console.print(f"[red]error[/]: {e}")
        raise typer.Exit(2) from None
    server = metrics_endpoint(stats, metrics_port, extra=collectors(svc) if collectors else ())
    console.print(describe(svc), soft_wrap=True)  # one line in a journal, however long
    run_service(svc, server)


def metrics_endpoint(stats: list, port: int | None, host: str = "127.0.0.1",
                     extra: Sequence[Any] = ()) -> object | None:
    """The Prometheus endpoint of these agents' and aggregators' statistics (and `extra` collectors) on `port`
    (None: none)."""
    if port is None:
        return None
    from streamfed.fleet.telemetry import AggregatorStats
    from streamfed.runtime.exporter import StreamfedCollector, make_registry, serve_metrics

    agents = [s for s in stats if not isinstance(s, AggregatorStats)]
    aggs = [s for s in stats if isinstance(s, AggregatorStats)]
    server, bound = serve_metrics(make_registry(StreamfedCollector(agents, aggs), *extra), host=host, port=port)
    console.print(f"metrics on http://{host}:{bound}/metrics")
    return server


def run_service(svc: object, server: object | None) -> None:
    """Run an agent or aggregator service until it ends or Ctrl-C; exit 2 when the broker refuses it."""
    import asyncio

    from streamfed.runtime.service import ServiceFailed
    from streamfed.runtime.session import BrokerRefused

    async def run() -> None:
        import signal

        # SIGTERM (systemd's stop) stops the service cleanly: its state saved, its stop line said, exit 0
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, svc.stop)  # type: ignore[attr-defined]
        await svc.run()  # type: ignore[attr-defined]

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    except BrokerRefused as e:
        console.print(f"[red]error[/]: {e}")
        raise typer.Exit(2) from None
    except ServiceFailed as e:  # state not written (3), a second instance took the client id (4)
        console.print(f"[red]error[/]: {e}", soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    finally:
        if server is not None:
            server.close()  # type: ignore[attr-defined]
