"""What the commands share: the console they print on, a refusal in one line (exit status 2), and the help
texts and checks of the options more than one command takes."""

from __future__ import annotations

from typing import Any, NoReturn

import typer
from rich.console import Console

__all__ = ["COLUMNS_HELP", "DP_HELP", "SECAGG_HELP", "console", "name_list", "refuse", "validation_problem",
           "with_privacy"]

console = Console()

# --columns: one help text for both commands (the syntax is streamfed.fleet.columns.ColumnSpec.parse's)
COLUMNS_HELP = ("declared input columns instead of --features, in vector order: NAME[:KIND[=OPTIONS]],... with "
               "KIND number (default), boolean (true/false, yes/no, on/off, 1/0), category=a|b|c (one-hot; "
               "a|b|* adds an 'other' slot, else an unknown level is skipped), hash=N (a category hashed into N "
               "buckets), timestamp[=TZ][|raw] (ISO 8601 or epoch seconds: hour and weekday as sin/cos on TZ's "
               "clock, default UTC; raw adds hour and weekday), e.g. 'temp, site:category=north|south|*, "
               "time:timestamp=Europe/Berlin, rain:boolean'")
DP_HELP = ("differential privacy: every upload (ε, δ)-DP with this ε (overrides the configuration's dp_epsilon; "
           "docs/privacy.md); give the aggregator the same")
SECAGG_HELP = "secure aggregation of uploads (overrides the configuration's secure_aggregation; docs/privacy.md)"


def refuse(message: str) -> NoReturn:
    """`error: <message>` on one line (never wrapped), exit status 2."""
    from rich.markup import escape

    console.print(f"[red]error[/]: {escape(' '.join(str(message).split()))}", soft_wrap=True)
    raise typer.Exit(2)


def validation_problem(e: Any) -> str:
    """A pydantic ValidationError as `where: what; ...` — without the input values (a configuration's values
    may be secrets)."""
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err.get("loc", ()))
        what = str(err.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {what}" if where else what)
    return "; ".join(parts)


def load(config: Any) -> Any:
    """The configuration file `config` (a StreamfedConfig), or one `error:` line and exit 2: a value the schema
    refuses (where and what, not the values), no file, bad TOML/JSON."""
    from pydantic import ValidationError

    from streamfed.fleet.config import load_config

    try:
        return load_config(config)
    except ValidationError as e:
        refuse(f"--config {config}: {validation_problem(e)}")
    except (OSError, ValueError) as e:
        refuse(f"--config {config}: {e}")


def name_list(value: str | None) -> list[str] | None:
    """A comma-separated option as a list of names (None when not given)."""
    return [v.strip() for v in value.split(",")] if value else None


def with_privacy(cfg: Any, dp_epsilon: float | None, secure_aggregation: bool | None) -> Any:
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
        refuse(f"--dp-epsilon/--secure-aggregation: {validation_problem(e)}")
    return cfg.model_copy(update={"fleet": fleet})
