"""`streamfed algorithms` (what is registered), `streamfed demo` (a whole fleet on this machine), `streamfed bench`
(benchmarks) and `streamfed kernels` (the learners' kernels compiled ahead of time)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamfed import algorithms
from streamfed.cli.common import DP_HELP, SECAGG_HELP, console

__all__ = ["bench", "demo", "kernels", "list_algorithms"]


def list_algorithms() -> None:
    """The registered algorithms, one block each: its title, task, where it runs, its rounds and predictions,
    and its replay variants — wrapped to the terminal, readable at 80 columns."""
    import textwrap

    from rich.markup import escape

    width = max(40, min(console.width, 100))
    for name in algorithms.names():
        alg = algorithms.get(name)
        predicts = ("class probabilities" if alg.task == "classification" else "mean, variance" if alg.bayesian
                    else "mean")
        facts = (f"{alg.task}; runs in {'a fleet and the replay' if alg.in_fleet else 'the replay only'}; "
                 f"{'lock-step or async' if alg.lockstep else 'async'} rounds; predicts {predicts}")
        variants = "replay variants: " + ", ".join(v.name for v in alg.replay_variants())
        console.print(f"[bold]{escape(name)}[/]")
        for text in (alg.title, facts, variants):
            for line in textwrap.wrap(text, width=width - 2, break_on_hyphens=False):
                console.print("  " + escape(line), soft_wrap=True, highlight=False)
        console.print()


def demo(
    duration: Annotated[float, typer.Option(help="seconds to run")] = 30.0,
    agents: Annotated[int, typer.Option(help="agents (one per Beijing station, at most 12)")] = 12,
    rate: Annotated[float, typer.Option(help="samples per second per agent")] = 100.0,
    algorithm: Annotated[str, typer.Option(help="any algorithm that runs in a fleet (see `streamfed algorithms`)")
                         ] = algorithms.DEFAULT,
    metrics_port: Annotated[int, typer.Option(help="Prometheus endpoint port (0: a free one)")] = 0,
    dp_epsilon: Annotated[float | None, typer.Option(help=DP_HELP)] = None,
    secure_aggregation: Annotated[bool, typer.Option(help=SECAGG_HELP)] = False,
    out: Annotated[Path, typer.Option(help="where the Prometheus config and summary.json are written")
                   ] = Path("out/demo"),
) -> None:
    """A whole fleet on this machine: broker, aggregator and agents on the Beijing streams, live."""
    import asyncio

    from streamfed.demo import DemoOptions, run_demo

    if algorithm not in algorithms.fleet_names():
        raise typer.BadParameter(f"algorithm must be one of {', '.join(algorithms.fleet_names())}")
    if dp_epsilon is not None and not dp_epsilon > 0:
        raise typer.BadParameter(f"--dp-epsilon must be > 0, got {dp_epsilon}")
    asyncio.run(run_demo(DemoOptions(duration=duration, agents=min(max(agents, 1), 12), rate=rate,
                                     algorithm=algorithm, metrics_port=metrics_port, dp_epsilon=dp_epsilon,
                                     secure_aggregation=secure_aggregation, out_dir=str(out)), console))


def bench(
    names: Annotated[list[str] | None, typer.Argument(help="benchmarks to run (default: all)")] = None,
    quick: Annotated[bool, typer.Option(help="smoke-test sizes: figures indicative only")] = False,
    out: Annotated[Path | None, typer.Option(help="results directory (default: benchmarks/results)")] = None,
    assemble_only: Annotated[bool, typer.Option("--assemble", help="only rebuild docs/benchmarks.md")] = False,
) -> None:
    """Run benchmarks side by side with their peers; write JSON + markdown and docs/benchmarks.md."""
    from streamfed.evaluation.bench import BENCHES, DOCS, RESULTS, assemble, run_bench

    if assemble_only:
        console.print(f"wrote {assemble(out or RESULTS, DOCS if out is None else Path(out) / 'benchmarks.md')}")
        return
    unknown = [n for n in names or [] if n not in BENCHES]
    if unknown:
        raise typer.BadParameter(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    rc = run_bench(names or None, out or RESULTS, quick=quick)
    if rc:
        raise typer.Exit(rc)


def kernels(
    action: Annotated[str, typer.Argument(help="build, status or clean")] = "status",
    force: Annotated[bool, typer.Option(help="build again even if a build of these sources exists")] = False,
) -> None:
    """Compile the learners' kernels ahead of time, so agents run without numba/LLVM in memory.

    Every algorithm family with a `_compiled` module registers its kernel group; `build` compiles the core's
    and all of theirs into one build. `status` says which backend each group would use; `clean` deletes
    builds of older sources."""
    import importlib
    import importlib.util
    import os
    import sys

    if action not in ("build", "status", "clean"):
        raise typer.BadParameter(f"unknown action {action!r}; choose build, status or clean")
    mode = os.environ.get("STREAMFED_KERNELS", "auto")
    if action == "status" and mode.strip().lower() == "aot":
        os.environ["STREAMFED_KERNELS"] = "auto"  # report a missing build instead of failing on it
    try:
        packages = []  # every registered family's package (a family's Algorithm class lives in it)
        for name in algorithms.names():
            module = type(algorithms.get(name)).__module__
            pkg = module if hasattr(sys.modules[module], "__path__") else module.rpartition(".")[0]
            if pkg not in packages:
                packages.append(pkg)
        for pkg in packages:
            if importlib.util.find_spec(f"{pkg}._compiled") is not None:
                importlib.import_module(f"{pkg}._compiled")  # registers the family's kernel group
    finally:
        os.environ["STREAMFED_KERNELS"] = mode
    from streamfed.core import compiled

    if action == "build":
        from streamfed.core.compiled.build import build

        with console.status("compiling the kernels ahead of time (numba pycc)…"):
            paths = build(force=force)
        target = {p.resolve() for p in paths.values()}
        console.print(f"kernels built ({', '.join(paths)}): {', '.join(map(str, sorted(target)))}", soft_wrap=True)
    elif action == "clean":
        from streamfed.core.compiled.build import clean

        gone = clean()
        console.print(f"deleted {len(gone)} build(s) and link(s) of other sources"
                      + "".join(f"\n  {p}" for p in gone))
    else:
        missing = []
        lines = []
        for name, grp in compiled.groups().items():
            path = grp.build_path()
            if path.is_file():
                state = f"present ({path.resolve().name})"
            else:
                state = "missing (run `streamfed kernels build`)"
                missing.append(name)
            lines.append(f"  {name}: {path} — {state}; this process runs it on: {grp.backend}")
        console.print("ahead-of-time builds for these sources, by kernel group:\n" + "\n".join(lines)
                      + f"\nSTREAMFED_KERNELS={mode}", soft_wrap=True)
        if missing and mode.strip().lower() == "aot":
            raise typer.Exit(1)
