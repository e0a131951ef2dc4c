"""The `streamfed` command."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(help="streamfed: online streaming federated learning (POF-MKL, FedBNR) over MQTT.",
                  no_args_is_help=True, add_completion=False)
console = Console()


@app.callback()
def _root() -> None:
    """streamfed: online streaming federated learning (POF-MKL, FedBNR) over MQTT."""


@app.command()
def replay(
    dataset: Annotated[str, typer.Option(help="beijing-air or synthetic")] = "beijing-air",
    algorithm: Annotated[list[str] | None, typer.Option(
        "--algorithm", "-a",
        help="pofmkl, ofskl, ofmkl-avg, vm-kofl, em-kofl, local-only, centralised (repeatable)")] = None,
    seeds: Annotated[int, typer.Option(help="number of seeds (features and draws)")] = 1,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("out/replay"),
    steps: Annotated[int | None, typer.Option(help="cut each client's stream to this many samples")] = None,
    normalisation: Annotated[str, typer.Option(help="paper, online or none")] = "paper",
    split: Annotated[str, typer.Option(help="station or mixed")] = "station",
    schedule: Annotated[str, typer.Option(help="step, every:K or async:WINDOW:MAX_DELAY")] = "step",
    n_kernels: Annotated[int, typer.Option(help="Gaussian kernels in the dictionary (N)")] = 16,
    n_features: Annotated[int, typer.Option(help="random features per kernel (D)")] = 100,
    eta: Annotated[float, typer.Option(help="learning rate η")] = 0.005,
    lam: Annotated[float, typer.Option(help="regularisation λ")] = 1e-4,
    xi: Annotated[float, typer.Option(help="exploration rate ξ")] = 0.1,
    bin_size: Annotated[int, typer.Option(help="kernels uploaded per step (M)")] = 1,
    plots: Annotated[bool, typer.Option(help="write PNG plots")] = True,
) -> None:
    """Replay a fleet in-process (no network) and compare algorithms: results.json, results.md, plots."""
    from .datasets import load_beijing, synthetic_fleet
    from .replay import ALGORITHMS, AlgorithmConfig, Schedule
    from .replay import replay as run_replay
    from .report import summarise, write_report

    algorithms = algorithm or ["pofmkl", "ofskl", "ofmkl-avg", "vm-kofl", "em-kofl", "local-only",
                               "centralised"]
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        raise typer.BadParameter(f"unknown algorithm(s) {unknown}; choose from {sorted(ALGORITHMS)}")
    sched = Schedule.parse(schedule)
    cfg = AlgorithmConfig(n_kernels=n_kernels, n_features=n_features, eta=eta, lam=lam, xi=xi,
                          bin_size=bin_size)
    if dataset == "beijing-air":
        fleet = load_beijing(normalisation=normalisation, split=split, steps=steps)  # type: ignore[arg-type]
    elif dataset == "synthetic":
        fleet = synthetic_fleet(n_clients=8, n_steps=steps or 5000, n_inputs=5, seed=0)
    else:
        raise typer.BadParameter(f"unknown dataset {dataset!r}: beijing-air or synthetic")
    samples = sum(len(s.y) for s in fleet.streams)
    console.print(f"[bold]{dataset}[/]: {len(fleet.streams)} clients, {samples} samples; "
                  f"algorithms {', '.join(algorithms)}; {seeds} seed(s); schedule {schedule}")
    results: dict = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        for name in algorithms:
            runs = []
            for seed in range(seeds):
                task = progress.add_task(f"{name:12s} seed {seed}", total=1.0)
                runs.append(run_replay(
                    fleet, name, cfg, sched, seed=seed, steps=steps,
                    progress=lambda done, total, task=task: progress.update(task, completed=done / total)))
                progress.update(task, completed=1.0)
            results[name] = runs
    ds = {"name": dataset, "normalisation": fleet.normalisation, "split": fleet.split,
          "clients": len(fleet.streams), "samples": samples, "steps": steps}
    summary = summarise(results, cfg, sched, ds)
    opts = [f"--dataset {dataset}", *(f"-a {a}" for a in algorithms), f"--seeds {seeds}",
            f"--normalisation {normalisation}", f"--split {split}", f"--schedule {schedule}",
            f"--n-kernels {n_kernels}", f"--n-features {n_features}", f"--eta {eta}", f"--lam {lam}",
            f"--xi {xi}", f"--bin-size {bin_size}", f"--out {shlex.quote(str(out))}"]
    if steps is not None:
        opts.append(f"--steps {steps}")
    command = "streamfed replay " + " ".join(opts)
    written = write_report(results, summary, out, command=command, plots=plots)
    table = Table(title="replay results")
    for col in ("algorithm", "MSE", "± std", "avg R/T", "uploaded/step", "wall s"):
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for name, a in summary["algorithms"].items():
        table.add_row(name, f"{a['mse_mean']:.6f}", f"{a['mse_std']:.6f}", f"{a['avg_regret']:.2e}",
                      f"{a['uploaded_per_client_step']:.0f}", f"{a['wall_s']:.1f}")
    console.print(table)
    console.print("wrote " + ", ".join(str(p) for p in written))


@app.command()
def demo(
    duration: Annotated[float, typer.Option(help="seconds to run")] = 30.0,
    agents: Annotated[int, typer.Option(help="agents (one per Beijing station, at most 12)")] = 12,
    rate: Annotated[float, typer.Option(help="samples per second per agent")] = 100.0,
    algorithm: Annotated[str, typer.Option(help="pofmkl or fedbnr")] = "pofmkl",
    metrics_port: Annotated[int, typer.Option(help="Prometheus endpoint port (0: a free one)")] = 0,
) -> None:
    """A whole fleet on this machine: broker, aggregator and agents on the Beijing streams, live."""
    import asyncio

    from .demo import DemoOptions, run_demo

    if algorithm not in ("pofmkl", "fedbnr"):
        raise typer.BadParameter("algorithm must be pofmkl or fedbnr")
    asyncio.run(run_demo(DemoOptions(duration=duration, agents=min(max(agents, 1), 12), rate=rate,
                                     algorithm=algorithm, metrics_port=metrics_port), console))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
