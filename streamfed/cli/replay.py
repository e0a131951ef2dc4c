"""`streamfed replay`: a fleet replayed in-process (no network), its algorithms compared — or, with
`--leave-one-out`, each client's cold start when it joins a running fleet."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from streamfed.cli.common import COLUMNS_HELP, console, refuse, validation_problem

__all__ = ["replay"]


def replay(
    dataset: Annotated[str, typer.Option(help="beijing-air, synthetic or PATH.csv")] = "beijing-air",
    algorithm: Annotated[list[str] | None, typer.Option(
        "--algorithm", "-a",
        help="a registered algorithm or one of its replay variants (repeatable; default: every regressor's)")] = None,
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
    columns: Annotated[str | None, typer.Option(help="with a CSV: " + COLUMNS_HELP)] = None,
    encoding: Annotated[str, typer.Option(
        help="with a CSV: the text encoding (UTF-8 by default; a byte-order mark is dropped)")] = "utf-8",
    na_values: Annotated[str | None, typer.Option(
        help="with a CSV: the cells that mean 'no value', comma-separated, replacing the default list (NA, N/A, "
             "NaN, nan, NULL, null, None, ?, -); an empty cell always does, a declared category level never "
             "does")] = None,
    max_abs: Annotated[float, typer.Option(
        help="with a CSV: skip (as too large) a number beyond ±this (default 1e150: no square overflows)")] = 1e150,
    max_skip_share: Annotated[float, typer.Option(
        help="with a CSV: end with exit status 5 when more than this share of its rows is skipped (0..1; 1: "
             "never)")] = 0.5,
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
        help="differential privacy of the federated rows: every upload (ε, 1e-5)-DP, with the agent's privacy "
             "boundary — declared public scales on the raw readings, the public upload schedule (beijing-air "
             "only; docs/privacy.md)")] = None,
) -> None:
    """Replay a fleet in-process (no network) and compare algorithms: results.json, results.md, plots."""
    from streamfed.evaluation.report import summarise, write_report

    chosen = _chosen(algorithm)
    sched, joins, score, cfg = _config(schedule, join, windows, param, dp_epsilon, n_kernels=n_kernels,
                                       n_features=n_features, bin_size=bin_size, eta=eta, lam=lam, xi=xi)
    label = _task(chosen, cfg) == "classification"  # a class label is never normalised
    if dp_epsilon is not None:
        normalisation = _private_scaling(dataset, normalisation, cfg)
    if normalisation is None:
        normalisation = "online" if _is_csv(dataset) else "paper"
    if not 0.0 <= max_skip_share <= 1.0:
        refuse(f"--max-skip-share must be between 0 and 1, got {max_skip_share}")
    fleet = _load_fleet(dataset, normalisation, split, steps, cfg, target=target, client_column=client_column,
                        features=features, columns=columns, columns_file=columns_file, encoding=encoding,
                        na_values=na_values, max_abs=max_abs, max_skip_share=max_skip_share, label=label)
    samples = sum(len(s.y) for s in fleet.streams)
    console.print(f"[bold]{dataset}[/]: {len(fleet.streams)} clients, {samples} samples; "
                  f"algorithms {', '.join(chosen)}; {seeds} seed(s); schedule {schedule}")
    if leave_one_out is not None:
        _cold_start(fleet, chosen, cfg, sched, leave_one_out, score, seeds, out, plots,
                    "streamfed replay " + " ".join(shlex.quote(a) for a in _argv()))
        return
    results = _replay_all(fleet, chosen, cfg, sched, seeds, steps, joins)
    ds = {"name": dataset, "normalisation": fleet.normalisation, "split": fleet.split,
          "clients": len(fleet.streams), "samples": samples, "steps": steps}
    summary = summarise(results, cfg, sched, ds)
    # the command that makes these results again, for the report
    opts = [f"--dataset {shlex.quote(dataset)}", *(f"-a {a}" for a in chosen), f"--seeds {seeds}",
            f"--normalisation {normalisation}", f"--split {split}", f"--schedule {schedule}",
            f"--n-kernels {n_kernels}", f"--n-features {n_features}", f"--bin-size {bin_size}",
            f"--out {shlex.quote(str(out))}"]
    for flag, value in (("--eta", eta), ("--lam", lam), ("--xi", xi), ("--steps", steps), ("--dp-epsilon", dp_epsilon),
                        ("--target", target), ("--client-column", client_column), ("--features", features),
                        ("--columns", columns), ("--columns-file", columns_file), ("--na-values", na_values),
                        ("--max-abs", None if max_abs == 1e150 else max_abs),
                        ("--encoding", None if encoding == "utf-8" else encoding)):
        if value is not None:
            opts.append(f"{flag} {shlex.quote(str(value))}")
    opts += [f"--param {shlex.quote(p)}" for p in param or []]
    opts += [f"--join {shlex.quote(j)}" for j in join or []]
    command = "streamfed replay " + " ".join(opts)
    written = write_report(results, summary, out, command=command, plots=plots)
    console.print(_results_table(summary))
    console.print("wrote " + ", ".join(str(p) for p in written))


def _chosen(algorithm: list[str] | None) -> list[str]:
    """The algorithms (or replay variants) asked for, every regressor's by default (a classifier reads its target
    as a class label: it is asked for by name); an unknown one is a bad parameter."""
    from streamfed import algorithms
    from streamfed.evaluation.replay import algorithm_titles

    titles = algorithm_titles()
    chosen = algorithm or [v for v in titles if algorithms.variant(v)[0].task == "regression"]
    unknown = [a for a in chosen if a not in titles]
    if unknown:
        raise typer.BadParameter(f"unknown algorithm(s) {unknown}; choose from {', '.join(titles)}")
    return chosen


def _task(chosen: list[str], cfg: Any) -> str:
    """The task the chosen algorithms share (each one's, from its parameters: PVI with a Bernoulli likelihood is a
    classifier); a mix is one `error:` line, exit 2 — a class label and a regression target are read apart."""
    from streamfed import algorithms

    tasks: dict[str, list[str]] = {}
    for name in chosen:
        alg, v = algorithms.variant(name)
        try:
            task = alg.task_of(cfg.fleet_config(alg.name, n_inputs=1, seed=0, variant=v.name))
        except ValueError as e:  # a parameter its model refuses
            raise typer.BadParameter(f"{name}: {e}") from None
        tasks.setdefault(task, []).append(name)
    if len(tasks) > 1:
        refuse(f"classifiers ({', '.join(tasks['classification'])}) and regressors "
               f"({', '.join(tasks['regression'])}) read the target apart (a class label is never normalised): "
               "replay them separately")
    return next(iter(tasks))


def _config(schedule: str, join: list[str] | None, windows: str, param: list[str] | None, dp_epsilon: float | None,
            *, n_kernels: int, n_features: int, bin_size: int, eta: float | None, lam: float | None,
            xi: float | None) -> tuple[Any, dict[str, int], list[int], Any]:
    """The options as the replay's schedule, joins, cold-start windows and AlgorithmConfig; a value they refuse
    is a bad parameter."""
    from streamfed.evaluation.replay import AlgorithmConfig, Schedule

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
    return sched, joins, score, cfg


def _private_scaling(dataset: str, normalisation: str | None, cfg: Any) -> str:
    """Under --dp-epsilon the replay keeps the agent's privacy boundary: raw readings, standardised by each agent
    with declared public scales (docs/privacy.md § The privacy boundary) — known for beijing-air only; anything
    else is one `error:` line, exit 2."""
    if dataset != "beijing-air":
        refuse(f"--dp-epsilon: {dataset!r} has no declared public scales (only beijing-air has: "
               "streamfed/evaluation/datasets/public_scales.py); a dataset-wide or running normalisation is a "
               "statistic of the data, outside the privacy guarantee — run agents with [fleet.public_scales]")
    if normalisation not in (None, "none"):
        refuse(f"--dp-epsilon standardises with the declared public scales: --normalisation {normalisation} would "
               "scale by the data's own statistics, outside the privacy guarantee (leave it out)")
    from streamfed.evaluation.datasets.public_scales import beijing_public_scales

    cfg.privacy["public_scales"] = beijing_public_scales()
    return "none"


def _is_csv(dataset: str) -> bool:
    return dataset.endswith((".csv", ".csv.gz"))


def _load_fleet(dataset: str, normalisation: str, split: str, steps: int | None, cfg: Any, *, target: str | None,
                client_column: str | None, features: str | None, columns: str | None,
                columns_file: Path | None, encoding: str = "utf-8", na_values: str | None = None,
                max_abs: float = 1e150, max_skip_share: float = 1.0, label: bool = False) -> Any:
    """The fleet of `dataset`: the Beijing streams, the synthetic fleet or a CSV file (whose report is printed;
    standardised online, `cfg` gets the agents' default dictionary). A CSV file of which more than
    `max_skip_share` of the rows were skipped is one `error:` line and exit 5."""
    from streamfed.core.features import standardised_dictionary
    from streamfed.evaluation.datasets import csv_fleet_with_report, load_beijing, synthetic_fleet

    if dataset == "beijing-air":
        return load_beijing(normalisation=normalisation, split=split, steps=steps)  # type: ignore[arg-type]
    if dataset == "synthetic":
        return synthetic_fleet(n_clients=8, n_steps=steps or 5000, n_inputs=5, seed=0)
    if not _is_csv(dataset):
        raise typer.BadParameter(f"unknown dataset {dataset!r}: beijing-air, synthetic or PATH.csv")
    from streamfed.fleet.sources import NA_VALUES, parse_na_values

    spec = _declared_columns(columns, columns_file)
    if not (max_abs > 0 and math.isfinite(max_abs)):
        refuse(f"--max-abs must be a finite number > 0, got {max_abs}")
    na = parse_na_values(na_values) if na_values is not None else NA_VALUES
    try:
        fleet, csv_report = csv_fleet_with_report(dataset, target, client_column=client_column,
                                                  features=features, normalisation=normalisation, columns=spec,
                                                  encoding=encoding, na_values=na, max_abs=max_abs, label=label)
    except ValueError as e:  # the reader's hints name its keyword arguments: here they are options
        refuse(str(e).replace("encoding='", "--encoding '").replace("try encoding=", "try --encoding "))
    console.print(csv_report.summary(), soft_wrap=True, markup=False)
    if csv_report.rows and csv_report.skipped > max_skip_share * csv_report.rows:
        from rich.markup import escape

        hint = csv_report.hint()
        why = (f"{dataset}: {csv_report.skipped} of {csv_report.rows} rows skipped "
               f"({100 * csv_report.skipped / csv_report.rows:.0f}% > --max-skip-share {100 * max_skip_share:.0f}%;"
               f" reasons above)" + (f"; {hint}" if hint else ""))
        if any(csv_report.missing.values()):
            why += ("; a missing cell is an empty one or a marker of --na-values (by default "
                    f"{' '.join(sorted(m for m in NA_VALUES if m))}), unless it is a declared level")
        console.print(f"[red]error[/]: {escape(why)}", soft_wrap=True)
        raise typer.Exit(5)
    if normalisation == "online" and cfg.kernels is None:
        # unit-variance inputs: the agents' default dictionary (bandwidths around √(2d)), not the paper's
        d = max(len(fleet.feature_names), 1)
        unit = standardised_dictionary(cfg.n_kernels, d)
        cfg.bandwidth_low, cfg.bandwidth_high = unit[0].bandwidth, unit[-1].bandwidth
    hint = csv_report.hint()
    if hint is not None:
        from rich.markup import escape

        console.print(f"[yellow]note[/]: {escape(hint)}", soft_wrap=True)
    return fleet


def _replay_all(fleet: Any, chosen: list[str], cfg: Any, sched: Any, seeds: int, steps: int | None,
                joins: dict[str, int]) -> dict[str, list[Any]]:
    """Every chosen algorithm on every seed, with a progress bar each; a value an algorithm refuses is a bad
    parameter."""
    from streamfed.evaluation.replay import replay as run_replay

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
    return results


def _results_table(summary: dict[str, Any]) -> Table:
    """Regressors: MSE as the learners see it (standardised, or the normalisation's units) ± std over seeds, and
    the RMSE in the stream's own units; classifiers: accuracy, log loss, ECE (no MSE), and as R/T the regret in
    log loss against each client's class frequencies in hindsight (not the learner's own, whose loss differs)."""
    algs = summary["algorithms"]
    classify = any(a.get("classification") for a in algs.values())
    regress = any(not a.get("classification") for a in algs.values())
    table = Table(title="replay results")
    cols = ["algorithm"]
    if regress:
        cols += ["MSE", "± std", "RMSE (units)"]
    if classify:
        cols += ["accuracy", "log loss", "ECE"]
    # R/T: the learner's own regret for a regressor; a classifier's in log loss against its class frequencies
    cols += ["R/T (log loss)" if classify else "R/T", "up/step", "wall s"]
    for col in cols:
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for name, a in algs.items():
        c = a.get("classification")
        row = [name]
        if regress:
            row += ["-"] * 3 if c else [f"{a['mse_mean']:.6f}", f"{a['mse_std']:.6f}", f"{a['rmse_stream_mean']:.5g}"]
        if classify:
            row += [f"{c['accuracy']:.4f}", f"{c['log_loss']:.4f}", f"{c['ece']:.4f}"] if c else ["-"] * 3
        regret = c.get("log_loss_regret", float("nan")) if c else a["avg_regret"]
        row += [f"{regret:.2e}", f"{a['uploaded_per_client_step']:.0f}", f"{a['wall_s']:.1f}"]
        table.add_row(*row)
    return table


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


def _declared_columns(text: str | None, file: Path | None) -> Any:
    """The input columns declared by `--columns` or `--columns-file` (a TOML file's `[inputs]` section), or
    None; a bad declaration or file is `error: …` on one line, exit 2."""
    from streamfed.fleet.columns import ColumnSpec

    if text is not None and file is not None:
        refuse("give --columns or --columns-file, not both")
    if text is not None:
        try:
            return ColumnSpec.parse(text)
        except ValueError as e:
            refuse(f"--columns: {e}")
    if file is None:
        return None
    import tomllib

    from pydantic import ValidationError

    from streamfed.fleet.config import InputsConfig

    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        refuse(f"--columns-file {file}: {e}")
    if not isinstance(data.get("inputs"), dict):
        refuse(f"--columns-file {file}: no [inputs] section (declare [[inputs.columns]] tables)")
    try:
        spec = InputsConfig.model_validate(data["inputs"]).spec
    except ValidationError as e:
        refuse(f"--columns-file {file}: {validation_problem(e)}")
    if spec is None:
        refuse(f"--columns-file {file}: its [inputs] section declares no columns (declare [[inputs.columns]] tables)")
    return spec
