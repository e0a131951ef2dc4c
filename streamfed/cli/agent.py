"""`streamfed agent`: one edge agent, and the checks of its source before it connects."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from streamfed.cli.common import (
    COLUMNS_HELP,
    DP_HELP,
    SECAGG_HELP,
    load,
    name_list,
    refuse,
    with_privacy,
)
from streamfed.cli.serving import serve

__all__ = ["agent"]


def agent(
    config: Annotated[Path, typer.Option(help="fleet + broker configuration (TOML or JSON)")],
    client: Annotated[str, typer.Option(help="this agent's client id")],
    index: Annotated[int, typer.Option(help="this client's position in the fleet (seeds its draws)")] = 0,
    source: Annotated[str, typer.Option(
        help="mqtt (JSON readings on the sensor topic), csv:PATH, jsonl (stdin) or river:DATASET")] = "mqtt",
    features: Annotated[str | None, typer.Option(help="comma-separated input names, in order")] = None,
    columns: Annotated[str | None, typer.Option(
        help=COLUMNS_HELP + "; overrides the configuration's \\[inputs] section; the numbers they make must be "
             "the fleet's n_inputs")] = None,
    target: Annotated[str | None, typer.Option(help="CSV: the label column")] = None,
    encoding: Annotated[str, typer.Option(
        help="CSV / JSON lines: the text encoding (UTF-8 by default; a byte-order mark is dropped)")] = "utf-8",
    na_values: Annotated[str | None, typer.Option(
        help="CSV: the cells that mean 'no value', comma-separated, replacing the default list (NA, N/A, NaN, "
             "nan, NULL, null, None, ?, -); an empty cell always does, a declared category level never does; "
             "also [inputs] na_values")] = None,
    max_abs: Annotated[float | None, typer.Option(
        help="skip (as too_large) a number beyond ±this (default 1e150, also [inputs] max_abs: no square "
             "overflows)")] = None,
    rate: Annotated[float | None, typer.Option(help="CSV/River replay: samples per second")] = None,
    mode: Annotated[str, typer.Option(help="async, or lockstep for algorithms with lock-step rounds")] = "async",
    max_skip_share: Annotated[float, typer.Option(
        help="warn in the log when more than this share of the last --skip-window items was skipped; a finite "
             "source (CSV, JSON lines, River) that skipped more than this share in all ends with exit status 5 "
             "(0..1; 1: never)")] = 0.5,
    skip_window: Annotated[int, typer.Option(help="items the skip share is taken over")] = 100,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus metrics on this port")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="persist learner, outbox and source position here")] = None,
    wait_for_global: Annotated[float, typer.Option(
        help="joining a running fleet: wait up to this many seconds for its global before the first sample, so "
             "that the first prediction already uses it as the prior (0: start at once)")] = 2.0,
    sensor_queue: Annotated[int, typer.Option(min=1, help="sensor readings waiting to be learned; beyond it the "
                                              "oldest is dropped and counted (queue_full)")] = 4096,
    dp_epsilon: Annotated[float | None, typer.Option(help=DP_HELP)] = None,
    secure_aggregation: Annotated[bool | None, typer.Option(help=SECAGG_HELP)] = None,
    dp_unnoised_metrics: Annotated[bool, typer.Option(
        help="under differential privacy, still export the agent's quality metrics (MSE, coverage, regret, kernel "
             "weights, sample, skip and learned counts, latencies): un-noised statistics of the raw stream, outside "
             "the privacy guarantee (default: withheld; docs/privacy.md)")] = False,
) -> None:
    """Run one edge agent: predict, learn, publish predictions and bounded updates.

    Inputs are numbers named by --features, or declared input columns (booleans, categories, timestamps) from
    --columns or the configuration's \\[inputs] section, encoded into the fleet's n_inputs numbers the same way
    by every source (sensor topic, CSV, JSON lines, River).

    A source that cannot be used (no such file, text that is not --encoding, an empty or header-only file,
    no such --target or --features column, a bad column declaration or one whose width is not n_inputs, ...)
    is refused in one line with exit status 2, before connecting. Bad rows and messages are skipped, counted
    by reason and logged (the first few of each). A finite source ends with a summary line (items, learned,
    skipped by reason, the error in the stream's units); exit status 5, with one line saying why, when it
    learned nothing or skipped more than --max-skip-share of its items."""
    import math

    from streamfed.fleet import sources
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.columns import ColumnSpec
    from streamfed.runtime.agent import AgentService, AgentSettings

    cfg = with_privacy(load(config), dp_epsilon, secure_aggregation)
    if not (0.0 <= max_skip_share <= 1.0) or math.isnan(max_skip_share):
        refuse(f"--max-skip-share must be between 0 and 1, got {max_skip_share}")
    if skip_window < 1:
        refuse(f"--skip-window must be >= 1, got {skip_window}")
    try:
        sources.check_encoding(encoding)
    except ValueError as e:
        refuse(f"--encoding: {e}")
    spec: ColumnSpec | None = None
    declared = "--columns" if columns is not None else f"[inputs] of {config}"
    if columns is not None:
        try:
            spec = ColumnSpec.parse(columns)
        except ValueError as e:
            refuse(f"--columns: {e}")
    elif cfg.inputs is not None:
        spec = cfg.inputs.spec
    na = sources.parse_na_values(na_values) if na_values is not None else (
        frozenset({"", *cfg.inputs.na_values}) if cfg.inputs is not None and cfg.inputs.na_values is not None
        else sources.NA_VALUES)
    limit = max_abs if max_abs is not None else cfg.inputs.max_abs if cfg.inputs is not None else sources.MAX_ABS
    if not (limit > 0 and math.isfinite(limit)):
        refuse(f"--max-abs must be a finite number > 0, got {limit}")
    if spec is not None:
        try:
            spec.check_width(cfg.fleet.n_inputs)
        except ValueError as e:
            refuse(f"{declared}: {e}")
        if features is not None and name_list(features) != list(spec.names):
            refuse(f"--features {features!r} differs from the input columns declared by {declared} "
                   f"({','.join(spec.names)}): leave --features out")
        names: list[str] | None = list(spec.names)
    else:
        names = _agent_names(features, cfg.fleet.n_inputs)
    src = None
    if source.startswith("csv:"):
        if not (names and target):
            refuse("a CSV source needs --features and --target (--columns or [inputs] may replace --features)")
        try:
            src = sources.csv_source(source[4:], target, () if spec else names, rate_hz=rate, encoding=encoding,
                                     columns=spec, na_values=na, max_abs=limit)
        except ValueError as e:
            refuse(str(e))
    elif source == "jsonl":
        parser = sources.ReadingParser(names or [f"x{i}" for i in range(cfg.fleet.n_inputs)], columns=spec,
                                       max_abs=limit)
        src = sources.jsonl_source(parser=parser, encoding=encoding)
    elif source.startswith("river:"):
        src = _river_source(source[6:], names, cfg.fleet.n_inputs, rate, spec)
    elif source != "mqtt":
        refuse(f"unknown source {source!r}: mqtt, csv:PATH, jsonl or river:DATASET")
    try:
        core = AgentCore(cfg.fleet, client, index, mode=mode)  # type: ignore[arg-type]
    except ValueError as e:
        refuse(str(e))
    core.stats.unnoised_metrics = dp_unnoised_metrics
    sensor = (names or [f"x{i}" for i in range(cfg.fleet.n_inputs)]) if src is None else None

    built: list[Any] = []

    def build() -> Any:
        # AgentService sizes its sensor parser by n_inputs: it is given the encoded names, then the parser reads
        # the declared columns — keeping the order and duplicate memory a restored state file gave it.
        svc = AgentService(core, cfg.broker, src, state_dir=state_dir,
                           sensor_features=list(spec.outputs) if spec is not None and sensor else sensor,
                           settings=AgentSettings(max_skip_share=max_skip_share, skip_window=skip_window,
                                                  wait_for_global=wait_for_global, sensor_queue=sensor_queue))
        if svc.parser is not None and sensor is not None:
            svc.parser = svc.parser.with_schema(() if spec is not None else sensor, columns=spec)
            svc.parser.max_abs = limit
        built.append(svc)
        return svc

    inputs = f", inputs {spec.text} ({spec.width} numbers)" if spec is not None else ""
    serve(build, [core.stats], metrics_port,
          lambda svc: f"agent {client!r} of fleet {cfg.fleet.fleet!r} ({cfg.fleet.algorithm}) on "
                      f"{cfg.broker.host}:{cfg.broker.port}, source {source}{inputs}"
                      + (f", resumed at item {svc.source_pos}" if svc.restored else ""))
    if src is not None and built and built[0].source_finished:
        _end_of_run(built[0], source)


def _end_of_run(svc: Any, source: str) -> None:
    """A finite source has ended: its summary line; exit 5 with one line when it learned nothing or skipped
    more than --max-skip-share of its items."""
    from streamfed.cli.common import console
    from streamfed.runtime.agent.summary import RunSummary

    summary = RunSummary.of(svc, source)
    console.print(summary.line(), soft_wrap=True, markup=False)
    problem = summary.problem()
    if problem is not None:
        from rich.markup import escape

        console.print(f"[red]error[/]: {escape(problem)}", soft_wrap=True)
        raise typer.Exit(5)


def _agent_names(value: str | None, n_inputs: int) -> list[str] | None:
    """--features as names: none empty or repeated, as many as the fleet's inputs."""
    names = name_list(value)
    if names is None:
        return None
    if any(not n for n in names):
        refuse(f"--features {value!r}: a feature has an empty name")
    if len(set(names)) != len(names):
        refuse(f"--features {value!r}: features are repeated")
    if len(names) != n_inputs:
        refuse(f"--features: {len(names)} features for a fleet with n_inputs={n_inputs}")
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
        refuse(f"unknown River dataset {name!r}; River has: {', '.join(known)}")
    try:
        it = iter(getattr(datasets, name)())
        first = next(it)
    except StopIteration:
        refuse(f"River dataset {name!r} is empty")
    except Exception as e:  # noqa: BLE001 - a download or a file that fails: any reason, one line
        refuse(f"cannot read River dataset {name!r}: {type(e).__name__}: {e}")
    keys = [str(k) for k in first[0]]
    if names is None and len(keys) != n_inputs:
        refuse(f"River dataset {name!r} has {len(keys)} features ({', '.join(keys[:40])}) for a fleet with "
               f"n_inputs={n_inputs}: pass --features")
    unknown = [n for n in names or [] if n not in first[0]]
    if unknown:
        refuse(f"River dataset {name!r}: feature(s) {unknown} not found; features are: {', '.join(keys[:40])}")
    return sources.river_source(itertools.chain([first], it), rate_hz=rate, features=None if columns else names,
                                columns=columns)
