"""The `streamfed` command: one Typer app (:data:`app`, the console script's entry point), its commands in modules
by what they do —

* :mod:`~streamfed.cli.replay` — `replay`: a fleet replayed in-process, its algorithms compared;
* :mod:`~streamfed.cli.agent` — `agent`: one edge agent;
* :mod:`~streamfed.cli.fleet` — `aggregator`, `shard`, `reducer`, and the views `subscribe` and `broker-metrics`;
* :mod:`~streamfed.cli.tools` — `algorithms`, `demo`, `bench`, `kernels`;

and what they share in :mod:`~streamfed.cli.common` (the console, one-line refusals, shared options) and
:mod:`~streamfed.cli.serving` (running a service). `python -m streamfed.cli` runs it too.
"""

from __future__ import annotations

import typer

from streamfed.cli import agent, fleet, replay, tools

__all__ = ["app", "main"]

app = typer.Typer(help="streamfed: online streaming federated learning over MQTT. Every command runs its small "
                       "dense algebra on one BLAS thread (STREAMFED_BLAS_THREADS=N for N, 0 for the BLAS library's "
                       "default): more threads only contend on a busy machine.",
                  no_args_is_help=True, add_completion=False)


@app.callback()
def _root() -> None:
    """streamfed: online streaming federated learning over MQTT."""


# in the order `streamfed --help` lists them
app.command()(replay.replay)
app.command("algorithms")(tools.list_algorithms)
app.command()(tools.demo)
app.command()(fleet.aggregator)
app.command()(agent.agent)
app.command()(fleet.shard)
app.command()(fleet.reducer)
app.command()(tools.bench)
app.command()(tools.kernels)
app.command()(fleet.subscribe)
app.command("broker-metrics")(fleet.broker_metrics)


def main() -> None:  # pragma: no cover - console entry point
    app()
