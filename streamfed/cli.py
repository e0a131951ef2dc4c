"""The `streamfed` command."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from streamfed import algorithms

app = typer.Typer(help="streamfed: online streaming federated learning over MQTT. Every command runs its small "
                       "dense algebra on one BLAS thread (STREAMFED_BLAS_THREADS=N for N, 0 for the BLAS library's "
                       "default): more threads only contend on a busy machine.",
                  no_args_is_help=True, add_completion=False)
console = Console()


# --columns: one help text for both commands (the syntax is streamfed.fleet.columns.ColumnSpec.parse's)
_COLUMNS_HELP = ("declared input columns instead of --features, in vector order: NAME[:KIND[=OPTIONS]],... with "
                 "KIND number (default), boolean (true/false, yes/no, on/off, 1/0), category=a|b|c (one-hot; "
                 "a|b|* adds an 'other' slot, else an unknown level is skipped), hash=N (a category hashed into N "
                 "buckets), timestamp[=TZ][|raw] (ISO 8601 or epoch seconds: hour and weekday as sin/cos on TZ's "
                 "clock, default UTC; raw adds hour and weekday), e.g. 'temp, site:category=north|south|*, "
                 "time:timestamp=Europe/Berlin, rain:boolean'")


@app.callback()
def _root() -> None:
    """streamfed: online streaming federated learning over MQTT."""


@app.command()
def replay(
    dataset: Annotated[str, typer.Option(help="beijing-air, synthetic or PATH.csv")] = "beijing-air",
    algorithm: Annotated[list[str] | None, typer.Option(
        "--algorithm", "-a",
        help="a registered algorithm or one of its replay variants (repeatable; default: all of them)")] = None,
    seeds: Annotated[int, typer.Option(help="number of seeds (features and draws)")] = 1,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("out/replay"),
    steps: Annotated[int | None, typer.Option(help="cut each client's stream to this many samples")] = None,
    normalisation: Annotated[str | None, typer.Option(
        help="paper, online or none (default: paper for beijing-air and synthetic, the paper's protocol; "
             "online for a CSV file, causal, as an agent standardises its stream)")] = None,
    split: Annotated[str, typer.Option(help="station or mixed")] = "station",
    schedule: Annotated[str, typer.Option(help="step, every:K or async:WINDOW:MAX_DELAY")] = "step",
    n_kernels: Annotated[int, typer.Option(help="Gaussian kernels in the dictionary (N)")] = 16,
    n_features: Annotated[int, typer.Option(help="random features per kernel (D)")] = 100,
    eta: Annotated[float | None, typer.Option(help="learning rate η, for every algorithm that has one")] = None,
    lam: Annotated[float | None, typer.Option(help="λ, for every algorithm that has one (what it means is each "
                                              "algorithm's own: prefer --param ALG.lam=)")] = None,
    xi: Annotated[float | None, typer.Option(help="exploration rate ξ, for every algorithm that has one")] = None,
    param: Annotated[list[str] | None, typer.Option(
        help="one algorithm's own parameter, ALG.FIELD=VALUE (repeatable), e.g. <algorithm>.min_upload=64")] = None,
    bin_size: Annotated[int, typer.Option(help="kernels uploaded per step (M)")] = 1,
    plots: Annotated[bool, typer.Option(help="write PNG plots")] = True,
    target: Annotated[str | None, typer.Option(help="with --dataset PATH.csv: the column to predict")] = None,
    client_column: Annotated[str | None, typer.Option(help="with a CSV: column naming each row's client")] = None,
    features: Annotated[str | None, typer.Option(help="with a CSV: input columns A,B,... (default: numeric)")] = None,
    columns: Annotated[str | None, typer.Option(help="with a CSV: " + _COLUMNS_HELP)] = None,
    columns_file: Annotated[Path | None, typer.Option(
        help="with a CSV: a TOML file whose \\[inputs] section declares the input columns (e.g. the agents' "
             "configuration file), instead of --columns")] = None,
    join: Annotated[list[str] | None, typer.Option(
        help="CLIENT@STEP: that client joins the running fleet at STEP (repeatable)")] = None,
    leave_one_out: Annotated[int | None, typer.Option(
        help="cold start: each client in turn joins at this step, scored over its first --windows samples")] = None,
    windows: Annotated[str, typer.Option(help="with --leave-one-out: sample counts to score, e.g. 336,2000")
                       ] = "336,2000",
    dp_epsilon: Annotated[float | None, typer.Option(
        help="differential privacy of the federated rows: every upload (ε, 1e-5)-DP (docs/privacy.md)")] = None,
) -> None:
    """Replay a fleet in-process (no network) and compare algorithms: results.json, results.md, plots."""
    from streamfed.core.features import standardised_dictionary
    from streamfed.evaluation.datasets import csv_fleet_with_report, load_beijing, synthetic_fleet
    from streamfed.evaluation.replay import AlgorithmConfig, Schedule, algorithm_titles
    from streamfed.evaluation.replay import replay as run_replay
    from streamfed.evaluation.report import summarise, write_report

    titles = algorithm_titles()
    chosen = algorithm or list(titles)
    unknown = [a for a in chosen if a not in titles]
    if unknown:
        raise typer.BadParameter(f"unknown algorithm(s) {unknown}; choose from {', '.join(titles)}")
    try:
        sched = Schedule.parse(schedule)
        joins = _joins(join or [])
        score = [int(w) for w in windows.split(",") if w.strip()]
        own = _params(param or [])
        if dp_epsilon is not None and not dp_epsilon > 0:
            raise ValueError(f"--dp-epsilon must be > 0, got {dp_epsilon}")
        cfg = AlgorithmConfig(n_kernels=n_kernels, n_features=n_features, bin_size=bin_size, params=own,
                              eta=eta, lam=lam, xi=xi, privacy={"dp_epsilon": dp_epsilon})
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    is_csv = dataset.endswith((".csv", ".csv.gz"))
    if normalisation is None:
        normalisation = "online" if is_csv else "paper"
    if dataset == "beijing-air":
        fleet = load_beijing(normalisation=normalisation, split=split, steps=steps)  # type: ignore[arg-type]
    elif dataset == "synthetic":
        fleet = synthetic_fleet(n_clients=8, n_steps=steps or 5000, n_inputs=5, seed=0)
    elif is_csv:
        spec = _declared_columns(columns, columns_file)
        try:
            fleet, csv_report = csv_fleet_with_report(dataset, target, client_column=client_column,
                                                      features=features, normalisation=normalisation, columns=spec)
        except ValueError as e:
            _refuse(str(e))
        console.print(csv_report.summary(), soft_wrap=True)
        if normalisation == "online" and cfg.kernels is None:
            # unit-variance inputs: the agents' default dictionary (bandwidths around √(2d)), not the paper's
            d = max(len(fleet.feature_names), 1)
            unit = standardised_dictionary(cfg.n_kernels, d)
            cfg.bandwidth_low, cfg.bandwidth_high = unit[0].bandwidth, unit[-1].bandwidth
        hint = csv_report.hint()
        if hint is not None:
            from rich.markup import escape

            console.print(f"[yellow]note[/]: {escape(hint)}", soft_wrap=True)
    else:
        raise typer.BadParameter(f"unknown dataset {dataset!r}: beijing-air, synthetic or PATH.csv")
    samples = sum(len(s.y) for s in fleet.streams)
    console.print(f"[bold]{dataset}[/]: {len(fleet.streams)} clients, {samples} samples; "
                  f"algorithms {', '.join(chosen)}; {seeds} seed(s); schedule {schedule}")
    if leave_one_out is not None:
        _cold_start(fleet, chosen, cfg, sched, leave_one_out, score, seeds, out, plots,
                    "streamfed replay " + " ".join(shlex.quote(a) for a in _argv()))
        return
    results: dict = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        for name in chosen:
            runs = []
            for seed in range(seeds):
                task = progress.add_task(f"{name:12s} seed {seed}", total=1.0)
                try:
                    runs.append(run_replay(
                        fleet, name, cfg, sched, seed=seed, steps=steps, join=joins,
                        progress=lambda done, total, task=task: progress.update(task, completed=done / total)))
                except ValueError as e:  # e.g. a parameter the algorithm's model refuses
                    raise typer.BadParameter(f"{name}: {e}") from None
                progress.update(task, completed=1.0)
            results[name] = runs
    ds = {"name": dataset, "normalisation": fleet.normalisation, "split": fleet.split,
          "clients": len(fleet.streams), "samples": samples, "steps": steps}
    summary = summarise(results, cfg, sched, ds)
    opts = [f"--dataset {shlex.quote(dataset)}", *(f"-a {a}" for a in chosen), f"--seeds {seeds}",
            f"--normalisation {normalisation}", f"--split {split}", f"--schedule {schedule}",
            f"--n-kernels {n_kernels}", f"--n-features {n_features}", f"--bin-size {bin_size}",
            f"--out {shlex.quote(str(out))}"]
    for flag, value in (("--eta", eta), ("--lam", lam), ("--xi", xi), ("--steps", steps),
                        ("--target", target), ("--client-column", client_column), ("--features", features),
                        ("--columns", columns), ("--columns-file", columns_file)):
        if value is not None:
            opts.append(f"{flag} {shlex.quote(str(value))}")
    opts += [f"--param {shlex.quote(p)}" for p in param or []]
    opts += [f"--join {shlex.quote(j)}" for j in join or []]
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


@app.command("algorithms")
def list_algorithms() -> None:
    """The registered algorithms: where each runs, and its replay variants."""
    table = Table(title="algorithms")
    for col in ("name", "runs", "rounds", "predictions", "replay variants", "description"):
        table.add_column(col)
    for name in algorithms.names():
        alg = algorithms.get(name)
        table.add_row(name, "fleet + replay" if alg.in_fleet else "replay", "lock-step or async" if alg.lockstep
                      else "async", "mean, variance" if alg.bayesian else "mean",
                      ", ".join(v.name for v in alg.replay_variants()), alg.title)
    console.print(table)


@app.command()
def demo(
    duration: Annotated[float, typer.Option(help="seconds to run")] = 30.0,
    agents: Annotated[int, typer.Option(help="agents (one per Beijing station, at most 12)")] = 12,
    rate: Annotated[float, typer.Option(help="samples per second per agent")] = 100.0,
    algorithm: Annotated[str, typer.Option(help="any algorithm that runs in a fleet (see `streamfed algorithms`)")
                         ] = algorithms.DEFAULT,
    metrics_port: Annotated[int, typer.Option(help="Prometheus endpoint port (0: a free one)")] = 0,
    dp_epsilon: Annotated[float | None, typer.Option(help=_DP_HELP)] = None,
    secure_aggregation: Annotated[bool, typer.Option(help=_SECAGG_HELP)] = False,
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


def _run_service(svc: object, server: object | None) -> None:
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


def _argv() -> list[str]:
    import sys

    return sys.argv[2:] if len(sys.argv) > 2 else []


def _joins(items: list[str]) -> dict[str, int]:
    """`CLIENT@STEP` items as {CLIENT: STEP}."""
    out = {}
    for item in items:
        client, at, step = item.rpartition("@")
        if not (at and client and step.isdigit()):
            raise ValueError(f"--join {item!r}: expected CLIENT@STEP, e.g. Dongsi@8760")
        out[client] = int(step)
    return out


def _cold_start(fleet: Any, chosen: list[str], cfg: Any, sched: Any, join_step: int, windows: list[int],
                seeds: int, out: Path, plots: bool, command: str) -> None:
    import numpy as np

    from streamfed.evaluation.coldstart import leave_one_out

    n_runs = len(fleet.streams) * len(chosen) * seeds
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("cold start", total=n_runs)

        def step(what: str) -> None:
            progress.update(task, advance=1, description=f"cold start: {what}")

        try:
            res = leave_one_out(fleet, chosen, cfg, join_step, windows=windows, seeds=range(seeds), schedule=sched,
                                progress=step)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    written = res.write(out, command=command, plots=plots)
    for w in res.windows:
        table = Table(title=f"cold start: first {w} samples after joining at step {join_step} (mean over seeds)")
        table.add_column("algorithm")
        for col in ("mean MSE", "mean NLPD", "mean cov95"):
            table.add_column(col, justify="right")
        tab = res.table(w)
        for a in chosen:
            cells = [row[a] for row in tab.values() if a in row]
            table.add_row(a, *(f"{np.nanmean([c[k] for c in cells]):.4f}" for k in ("mse", "nlpd", "coverage")))
        console.print(table)
    console.print("wrote " + ", ".join(str(p) for p in written))


def _params(items: list[str]) -> dict[str, dict[str, object]]:
    """`ALG.FIELD=VALUE` items as {ALG: {FIELD: VALUE}} (VALUE parsed as JSON when it is, else a string)."""
    import json

    out: dict[str, dict[str, object]] = {}
    for item in items:
        key, eq, text = item.partition("=")
        alg, dot, name = key.partition(".")
        if not (eq and dot and alg and name):
            raise ValueError(f"--param {item!r}: expected ALG.FIELD=VALUE, e.g. <algorithm>.min_upload=64")
        try:
            value: object = json.loads(text)
        except ValueError:
            value = text
        out.setdefault(alg, {})[name] = value
    return out


def _names(value: str | None) -> list[str] | None:
    """A comma-separated option as a list of names (None when not given)."""
    return [v.strip() for v in value.split(",")] if value else None


def _roster(option: str | None, cfg: Any, role: str) -> list[str] | None:
    """The fleet's members for an aggregating `role`: `--clients`, else the configuration's `[fleet] clients`.
    On an authenticated broker (production) one of them is required: an aggregator that takes updates from
    whoever the broker lets in is one leaked password from a poisoned global."""
    names = _names(option) or (list(cfg.fleet.clients) if cfg.fleet.clients else None)
    if names is None and cfg.broker.username is not None:
        _refuse(f"the {role} of an authenticated (production) broker needs its fleet's roster: set [fleet] clients "
                "in the configuration or give --clients")
    return names


def _serve(build: Callable[[], Any], stats: list, metrics_port: int | None, describe: Callable[[Any], str]) -> None:
    """Build a service (a damaged, foreign or locked state file is exit 2, with its reason), serve its metrics,
    say what runs (`describe(service)`), and run it."""
    from streamfed.fleet.persistence import StateError

    try:
        svc = build()
    except StateError as e:
        console.print(f"[red]error[/]: {e}")
        raise typer.Exit(2) from None
    server = _serve_metrics(stats, metrics_port)
    console.print(describe(svc), soft_wrap=True)  # one line in a journal, however long
    _run_service(svc, server)


def _serve_metrics(stats: list, port: int | None, host: str = "127.0.0.1") -> object | None:
    if port is None:
        return None
    from streamfed.fleet.telemetry import AggregatorStats
    from streamfed.runtime.exporter import StreamfedCollector, make_registry, serve_metrics

    agents = [s for s in stats if not isinstance(s, AggregatorStats)]
    aggs = [s for s in stats if isinstance(s, AggregatorStats)]
    server, bound = serve_metrics(make_registry(StreamfedCollector(agents, aggs)), host=host, port=port)
    console.print(f"metrics on http://{host}:{bound}/metrics")
    return server


@app.command()
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
    dp_epsilon: Annotated[float | None, typer.Option(help=_DP_HELP)] = None,
    secure_aggregation: Annotated[bool | None, typer.Option(help=_SECAGG_HELP)] = None,
    recover: Annotated[bool, typer.Option(help="the state was lost or restored from an older copy and the agents are "
                                          "ahead of it: start a new epoch in which they upload their totals again "
                                          "(docs/reliability.md § Lost state)")] = False,
) -> None:
    """Run a fleet's aggregator: validate, deduplicate and aggregate updates; publish the global."""
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import load_config
    from streamfed.runtime.aggregator import AggregatorService

    cfg = _with_privacy(load_config(config), dp_epsilon, secure_aggregation)
    try:
        core = AggregatorCore(cfg.fleet, clients=_roster(clients, cfg, "aggregator"), mode=mode, quorum=quorum,  # type: ignore[arg-type]
                              round_timeout=round_timeout, window=window, offline="wait" if wait_offline else "drop",
                              recover=recover)
    except ValueError as e:
        _refuse(str(e))
    _serve(lambda: AggregatorService(core, cfg.broker, shared_group=shared_group, state_dir=state_dir),
           [core.stats], metrics_port,
           lambda svc: f"aggregator of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}, {core.mode}, "
                       f"{_aggregation_mode(cfg.fleet)}) on {cfg.broker.host}:{cfg.broker.port}"
                       + (f", global v{core.version} resumed" if svc.restored else ""))


def _aggregation_mode(fleet: Any) -> str:
    """How the aggregator combines uploads, in the words its start-up line uses (docs/reliability.md §7.2)."""
    if fleet.robust.aggregation == "robust":
        return "robust aggregation: trimmed means and share caps, not equal to the centralised model"
    return "exact aggregation: every member trusted, bounds only"


_DP_HELP = ("differential privacy: every upload (ε, δ)-DP with this ε (overrides the configuration's dp_epsilon; "
            "docs/privacy.md); give the aggregator the same")
_SECAGG_HELP = "secure aggregation of uploads (overrides the configuration's secure_aggregation; docs/privacy.md)"


def _with_privacy(cfg: Any, dp_epsilon: float | None, secure_aggregation: bool | None) -> Any:
    """`cfg` (a StreamfedConfig) with the command line's privacy switches applied (validated like the file)."""
    from pydantic import ValidationError

    update: dict[str, Any] = {}
    if dp_epsilon is not None:
        update["dp_epsilon"] = dp_epsilon
    if secure_aggregation is not None:
        update["secure_aggregation"] = secure_aggregation
    if not update:
        return cfg
    try:
        fleet = type(cfg.fleet).model_validate({**cfg.fleet.model_dump(), "params": cfg.fleet.params, **update})
    except ValidationError as e:
        _refuse(f"--dp-epsilon/--secure-aggregation: {_validation_problem(e)}")
    return cfg.model_copy(update={"fleet": fleet})


def _refuse(message: str) -> NoReturn:
    """`error: <message>` on one line (never wrapped), exit status 2."""
    from rich.markup import escape

    console.print(f"[red]error[/]: {escape(' '.join(str(message).split()))}", soft_wrap=True)
    raise typer.Exit(2)


def _declared_columns(text: str | None, file: Path | None) -> Any:
    """The input columns declared by `--columns` or `--columns-file` (a TOML file's `[inputs]` section), or
    None; a bad declaration or file is `error: …` on one line, exit 2."""
    from streamfed.fleet.columns import ColumnSpec

    if text is not None and file is not None:
        _refuse("give --columns or --columns-file, not both")
    if text is not None:
        try:
            return ColumnSpec.parse(text)
        except ValueError as e:
            _refuse(f"--columns: {e}")
    if file is None:
        return None
    import tomllib

    from pydantic import ValidationError

    from streamfed.fleet.config import InputsConfig

    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        _refuse(f"--columns-file {file}: {e}")
    if not isinstance(data.get("inputs"), dict):
        _refuse(f"--columns-file {file}: no [inputs] section (declare [[inputs.columns]] tables)")
    try:
        return InputsConfig.model_validate(data["inputs"]).spec
    except ValidationError as e:
        _refuse(f"--columns-file {file}: {_validation_problem(e)}")


def _validation_problem(e: Any) -> str:
    """A pydantic ValidationError as `where: what; ...` — without the input values (a configuration's values
    may be secrets)."""
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err.get("loc", ()))
        what = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {what}" if where else what)
    return "; ".join(parts)


def _agent_names(value: str | None, n_inputs: int) -> list[str] | None:
    """--features as names: none empty or repeated, as many as the fleet's inputs."""
    names = _names(value)
    if names is None:
        return None
    if any(not n for n in names):
        _refuse(f"--features {value!r}: a feature has an empty name")
    if len(set(names)) != len(names):
        _refuse(f"--features {value!r}: features are repeated")
    if len(names) != n_inputs:
        _refuse(f"--features: {len(names)} features for a fleet with n_inputs={n_inputs}")
    return names


def _river_source(name: str, names: list[str] | None, n_inputs: int, rate: float | None,
                  columns: Any = None) -> object:
    """A River dataset as a source, checked at start-up: the dataset exists and can be read, its first
    sample has the features (or declared `columns`) asked for (or, without them, as many as the fleet's
    inputs)."""
    import itertools

    from river import datasets

    from streamfed.fleet import sources

    known = sorted(n for n in dir(datasets) if not n.startswith("_") and isinstance(getattr(datasets, n), type)
                   and n[0].isupper() and n != "base")
    if name not in known:
        _refuse(f"unknown River dataset {name!r}; River has: {', '.join(known)}")
    try:
        it = iter(getattr(datasets, name)())
        first = next(it)
    except StopIteration:
        _refuse(f"River dataset {name!r} is empty")
    except Exception as e:  # noqa: BLE001 - a download or a file that fails: any reason, one line
        _refuse(f"cannot read River dataset {name!r}: {type(e).__name__}: {e}")
    keys = [str(k) for k in first[0]]
    if names is None and len(keys) != n_inputs:
        _refuse(f"River dataset {name!r} has {len(keys)} features ({', '.join(keys[:40])}) for a fleet with "
                f"n_inputs={n_inputs}: pass --features")
    unknown = [n for n in names or [] if n not in first[0]]
    if unknown:
        _refuse(f"River dataset {name!r}: feature(s) {unknown} not found; features are: {', '.join(keys[:40])}")
    return sources.river_source(itertools.chain([first], it), rate_hz=rate, features=None if columns else names,
                                columns=columns)


@app.command()
def agent(
    config: Annotated[Path, typer.Option(help="fleet + broker configuration (TOML or JSON)")],
    client: Annotated[str, typer.Option(help="this agent's client id")],
    index: Annotated[int, typer.Option(help="this client's position in the fleet (seeds its draws)")] = 0,
    source: Annotated[str, typer.Option(
        help="mqtt (JSON readings on the sensor topic), csv:PATH, jsonl (stdin) or river:DATASET")] = "mqtt",
    features: Annotated[str | None, typer.Option(help="comma-separated input names, in order")] = None,
    columns: Annotated[str | None, typer.Option(
        help=_COLUMNS_HELP + "; overrides the configuration's \\[inputs] section; the numbers they make must be "
             "the fleet's n_inputs")] = None,
    target: Annotated[str | None, typer.Option(help="CSV: the label column")] = None,
    encoding: Annotated[str, typer.Option(
        help="CSV / JSON lines: the text encoding (UTF-8 by default; a byte-order mark is dropped)")] = "utf-8",
    rate: Annotated[float | None, typer.Option(help="CSV/River replay: samples per second")] = None,
    mode: Annotated[str, typer.Option(help="async, or lockstep for algorithms with lock-step rounds")] = "async",
    max_skip_share: Annotated[float, typer.Option(
        help="warn in the log when more than this share of the last --skip-window items was skipped "
             "(0..1; 1: never)")] = 0.5,
    skip_window: Annotated[int, typer.Option(help="items the skip share is taken over")] = 100,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="persist learner, outbox and source position here")] = None,
    wait_for_global: Annotated[float, typer.Option(
        help="joining a running fleet: wait up to this many seconds for its global before the first sample, so "
             "that the first prediction already uses it as the prior (0: start at once)")] = 2.0,
    sensor_queue: Annotated[int, typer.Option(min=1, help="sensor readings waiting to be learned; beyond it the "
                                              "oldest is dropped and counted (queue_full)")] = 4096,
    dp_epsilon: Annotated[float | None, typer.Option(help=_DP_HELP)] = None,
    secure_aggregation: Annotated[bool | None, typer.Option(help=_SECAGG_HELP)] = None,
) -> None:
    """Run one edge agent: predict, learn, publish predictions and bounded updates.

    Inputs are numbers named by --features, or declared input columns (booleans, categories, timestamps) from
    --columns or the configuration's \\[inputs] section, encoded into the fleet's n_inputs numbers the same way
    by every source (sensor topic, CSV, JSON lines, River).

    A source that cannot be used (no such file, text that is not --encoding, an empty or header-only file,
    no such --target or --features column, a bad column declaration or one whose width is not n_inputs, ...)
    is refused in one line with exit status 2, before connecting. Bad rows and messages are skipped, counted
    by reason and logged (the first few of each)."""
    import math

    from pydantic import ValidationError

    from streamfed.fleet import sources
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.columns import ColumnSpec
    from streamfed.fleet.config import load_config
    from streamfed.runtime.agent import AgentService, AgentSettings

    try:
        cfg = load_config(config)
    except ValidationError as e:  # a value the schema refuses: where and what, not the values
        _refuse(f"--config {config}: {_validation_problem(e)}")
    except (OSError, ValueError) as e:  # no file, bad TOML/JSON
        _refuse(f"--config {config}: {e}")
    cfg = _with_privacy(cfg, dp_epsilon, secure_aggregation)
    if not (0.0 <= max_skip_share <= 1.0) or math.isnan(max_skip_share):
        _refuse(f"--max-skip-share must be between 0 and 1, got {max_skip_share}")
    if skip_window < 1:
        _refuse(f"--skip-window must be >= 1, got {skip_window}")
    try:
        sources.check_encoding(encoding)
    except ValueError as e:
        _refuse(f"--encoding: {e}")
    spec: ColumnSpec | None = None
    declared = "--columns" if columns is not None else f"[inputs] of {config}"
    if columns is not None:
        try:
            spec = ColumnSpec.parse(columns)
        except ValueError as e:
            _refuse(f"--columns: {e}")
    elif cfg.inputs is not None:
        spec = cfg.inputs.spec
    if spec is not None:
        try:
            spec.check_width(cfg.fleet.n_inputs)
        except ValueError as e:
            _refuse(f"{declared}: {e}")
        if features is not None and _names(features) != list(spec.names):
            _refuse(f"--features {features!r} differs from the input columns declared by {declared} "
                    f"({','.join(spec.names)}): leave --features out")
        names: list[str] | None = list(spec.names)
    else:
        names = _agent_names(features, cfg.fleet.n_inputs)
    src = None
    if source.startswith("csv:"):
        if not (names and target):
            _refuse("a CSV source needs --features and --target (--columns or [inputs] may replace --features)")
        try:
            src = sources.csv_source(source[4:], target, () if spec else names, rate_hz=rate, encoding=encoding,
                                     columns=spec)
        except ValueError as e:
            _refuse(str(e))
    elif source == "jsonl":
        parser = sources.ReadingParser(names or [f"x{i}" for i in range(cfg.fleet.n_inputs)], columns=spec)
        src = sources.jsonl_source(parser=parser, encoding=encoding)
    elif source.startswith("river:"):
        src = _river_source(source[6:], names, cfg.fleet.n_inputs, rate, spec)
    elif source != "mqtt":
        _refuse(f"unknown source {source!r}: mqtt, csv:PATH, jsonl or river:DATASET")
    try:
        core = AgentCore(cfg.fleet, client, index, mode=mode)  # type: ignore[arg-type]
    except ValueError as e:
        _refuse(str(e))
    sensor = (names or [f"x{i}" for i in range(cfg.fleet.n_inputs)]) if src is None else None

    def build() -> Any:
        # AgentService sizes its sensor parser by n_inputs: it is given the encoded names, then the parser reads
        # the declared columns — keeping the order and duplicate memory a restored state file gave it.
        svc = AgentService(core, cfg.broker, src, state_dir=state_dir,
                           sensor_features=list(spec.outputs) if spec is not None and sensor else sensor,
                           settings=AgentSettings(max_skip_share=max_skip_share, skip_window=skip_window,
                                                  wait_for_global=wait_for_global, sensor_queue=sensor_queue))
        if svc.parser is not None and sensor is not None:
            svc.parser = svc.parser.with_schema(() if spec is not None else sensor, columns=spec)
        return svc

    inputs = f", inputs {spec.text} ({spec.width} numbers)" if spec is not None else ""
    _serve(build, [core.stats], metrics_port,
           lambda svc: f"agent {client!r} of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}) on "
                       f"{cfg.broker.host}:{cfg.broker.port}, source {source}{inputs}"
                       + (f", resumed at item {svc.source_pos}" if svc.restored else ""))


@app.command()
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
) -> None:
    """Run one aggregator shard: take a share of the updates, validate, sum, send partials to the reducer."""
    from streamfed.fleet.config import load_config
    from streamfed.fleet.sharding import ShardCore
    from streamfed.fleet.telemetry import AggregatorStats
    from streamfed.runtime.shard import ShardService

    cfg = load_config(config)
    stats = AggregatorStats(cfg.fleet.fleet)
    core = ShardCore(cfg.fleet, name, clients=_roster(clients, cfg, "shard"), mode=mode, stats=stats)  # type: ignore[arg-type]
    _serve(lambda: ShardService(core, cfg.broker, group=group, flush_interval=flush_interval),  # None: by mode
           [stats], metrics_port,
           lambda svc: f"shard {name!r} of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}, {core.mode}) in "
                       f"group {group!r} on {cfg.broker.host}:{cfg.broker.port}")


@app.command()
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
    from streamfed.fleet.config import load_config
    from streamfed.fleet.sharding import ReducerCore
    from streamfed.runtime.shard import ReducerService

    cfg = load_config(config)
    core = ReducerCore(cfg.fleet, clients=_roster(clients, cfg, "reducer"), mode=mode, window=window,  # type: ignore[arg-type]
                       shards=_names(shards), offline="wait" if wait_offline else "drop")
    _serve(lambda: ReducerService(core, cfg.broker, state_dir=state_dir), [core.stats], metrics_port,
           lambda svc: f"reducer of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}, {core.mode}) on "
                       f"{cfg.broker.host}:{cfg.broker.port}"
                       + (f", global v{core.version} resumed" if svc.restored else ""))


@app.command()
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


@app.command()
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


@app.command()
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

    from streamfed.fleet.config import BrokerConfig, load_config
    from streamfed.runtime.subscribe import watch

    broker = load_config(config).broker if config else BrokerConfig(host=host, port=port)
    try:
        asyncio.run(watch(fleet, broker, console, count=count, as_json=as_json, client_id=client_id))
    except KeyboardInterrupt:
        pass


@app.command("broker-metrics")
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
        _refuse(f"broker configuration: {_validation_problem(e) if isinstance(e, ValidationError) else e}")
    metrics = BrokerMetrics()
    server, bound = serve_metrics(make_registry(metrics), port=metrics_port)
    console.print(f"broker metrics of {broker.host}:{broker.port} ($SYS as {broker.username!r}) on "
                  f"http://127.0.0.1:{bound}/metrics", soft_wrap=True)
    _run_service(SysSubscriber(broker, metrics, client_id=client_id), server)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
