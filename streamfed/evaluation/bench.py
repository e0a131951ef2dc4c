"""Benchmarks: the registry of benchmark scripts, running them, and assembling `docs/benchmarks.md`.

The scripts live in the source checkout's `benchmarks/` directory (they are not part of an installed
wheel). Each writes one markdown section (`<out_dir>/<name>.md`); the newer ones also write their
numbers as JSON beside it (`<name>.json`) and accept `--quick` (a smoke run: fewer repeats, smaller
sizes — the figures are then only indicative). `benchmarks/run_all.py` and `streamfed bench` both
go through :func:`run_bench` / :func:`assemble`.

    >>> sorted(BENCHES)[:3]
    ['algorithms', 'calibration', 'demo']
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BENCHES", "Bench", "ROOT", "RESULTS", "DOCS", "assemble", "run_bench", "machine", "load_average", "section",
           "summary", "write_section", "check_numbers"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Bench:
    """One benchmark script: its path under the checkout, arguments of a quick run, and whether it
    writes `<name>.json` (and takes `--quick`)."""

    script: str
    quick_args: tuple[str, ...] = ()
    writes_json: bool = False


# Order = order of the sections in docs/benchmarks.md.
BENCHES: dict[str, Bench] = {
    "pofmkl": Bench("benchmarks/bench_pofmkl.py", ("--reps", "3000")),
    "fedbnr": Bench("benchmarks/bench_fedbnr.py", ("--n", "300", "--n-large", "100", "--repeats", "1")),
    "demo": Bench("benchmarks/bench_demo.py", ("--quick",), True),
    "replay": Bench("benchmarks/bench_replay.py", ("--quick",)),
    "runtime": Bench("benchmarks/bench_runtime.py", ("--repeats", "1", "--seconds", "1", "--per-client", "20")),
    "messages": Bench("benchmarks/bench_messages.py", ("--quick",), True),
    "flops": Bench("benchmarks/bench_flops.py", ("--quick",), True),
    "memory": Bench("benchmarks/bench_memory.py", ("--quick",), True),
    "ingest": Bench("benchmarks/bench_ingest.py", ("--quick",), True),
    "latency": Bench("benchmarks/bench_latency.py", ("--quick",), True),
    "fleet": Bench("benchmarks/bench_fleet.py", ("--quick",), True),
    "sharding": Bench("benchmarks/bench_sharding.py", ("--quick",), True),
    "algorithms": Bench("benchmarks/bench_algorithms.py", ("--quick",), True),
    "progressive": Bench("benchmarks/bench_progressive.py", ("--quick",), True),
    "calibration": Bench("benchmarks/bench_calibration.py", ("--quick",), True),
    "fsgp": Bench("benchmarks/bench_fsgp.py", ("--quick",), True),
    "pvi": Bench("benchmarks/bench_pvi.py", ("--quick",), True),
    "privacy": Bench("benchmarks/bench_privacy.py", ("--quick",), True),
    "urk": Bench("benchmarks/bench_urk.py", ("--quick",), True),
    "pfedgp": Bench("benchmarks/bench_pfedgp.py", ("--quick",), True),
}

HEADER = """# Benchmarks

Every figure is measured side by side with a peer or baseline in the same run (a ratio), with its
configuration and the command that reproduces it. Machine: {machine}. These are benchmarks, not timed
tests: nothing in the test suite asserts a speed.

This page is an index: each entry says what a benchmark measures and links to its figures (a result file
under `benchmarks/results/`, with its configuration, command and the load average of its run). Regenerate
all: `.venv/bin/python benchmarks/run_all.py` (or one: `... run_all.py pofmkl`; the same through the CLI:
`streamfed bench pofmkl`; `streamfed bench --assemble` rebuilds this index). Entries: {names}.
Load average when this index was written: {load}.

"""


def machine() -> str:
    """A one-line description of this machine and interpreter."""
    cpu = platform.processor() or platform.machine()
    with_model = cpu
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                with_model = f"{line.split(':', 1)[1].strip()} ({platform.machine()})"
                break
    except OSError:
        pass
    return f"{with_model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def load_average() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def check_numbers(data: Any, path: str = "") -> list[str]:
    """Paths of the numbers in a JSON-like tree that are not finite (NaN, inf) — `[]` when all are.

    >>> check_numbers({"a": [1.0, float("nan")], "b": {"c": 2}})
    ['a[1]']
    """
    bad: list[str] = []
    if isinstance(data, bool) or data is None or isinstance(data, str):
        return bad
    if isinstance(data, int | float):
        return [] if math.isfinite(data) else [path]
    if isinstance(data, Mapping):
        for k, v in data.items():
            bad += check_numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, Sequence):
        for i, v in enumerate(data):
            bad += check_numbers(v, f"{path}[{i}]")
    return bad


def write_section(out: Path | None, lines: Iterable[str], data: Mapping[str, Any], quick: bool = False) -> str:
    """Print a benchmark's markdown section and, with `out` (`…/<name>.md`), write it there and its
    numbers to `…/<name>.json` (with the machine, load average, time and whether it was a quick run)."""
    text = "\n".join(lines) + "\n"
    if quick:
        text = text.replace("\n", "\n\n*Quick run (`--quick`): smoke-test sizes, indicative only.*\n", 1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        meta = {"machine": machine(), "loadavg": list(os.getloadavg()), "time": time.time(), "quick": quick,
                "argv": sys.argv[1:]}
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, **data}, indent=1, allow_nan=True) + "\n")
    return text


def section(text: str) -> str:
    r"""A result file as one section of the document: a file titled at level 1 (`# ...`) has every heading
    moved one level down, so that the document keeps a single title.

    >>> section("# FSGP\n\n## (a) 1-D\ntext")
    '## FSGP\n\n### (a) 1-D\ntext'
    >>> section("## Replay\ntext")
    '## Replay\ntext'
    """
    if not text.startswith("# "):
        return text
    return "\n".join("#" + line if line.startswith("#") else line for line in text.split("\n"))


def summary(text: str, limit: int = 420) -> tuple[str, str]:
    r"""A result file's title (its first heading, without the `#`s) and its first paragraph of prose (what was
    measured and how), cut at `limit` characters on a word.

    >>> summary("## Replay\n\nTwelve stations, 300 steps.\n\n| a | b |")
    ('Replay', 'Twelve stations, 300 steps.')
    """
    lines = text.strip().split("\n")
    title = next((ln.lstrip("#").strip() for ln in lines if ln.startswith("#")), "")
    paras, cur = [], []
    for ln in lines:
        if ln.startswith("#"):
            continue
        if not ln.strip():
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(ln.strip())
    if cur:
        paras.append(" ".join(cur))
    prose = next((p for p in paras if not p.startswith(("|", "!", "```", "- "))), "")
    if len(prose) > limit:
        prose = prose[:limit].rsplit(" ", 1)[0] + " …"
    return title, prose


def assemble(results: Path = RESULTS, docs: Path = DOCS) -> Path:
    """Write `docs`, an index over the result files in `results` (registered benches in order, then any others):
    per file its title, what it measures (its first paragraph) and a link to the figures. The figures themselves
    stay in one place, the result file."""
    results = Path(results)
    names = [n for n in BENCHES if (results / f"{n}.md").exists()]
    extra = sorted(p for p in results.glob("*.md") if p.stem not in BENCHES and p.resolve() != Path(docs).resolve()
                   and p.name != "benchmarks.md")
    files = [results / f"{n}.md" for n in names] + extra
    rel = os.path.relpath(results, Path(docs).parent)
    entries = []
    for f in files:
        title, prose = summary(f.read_text())
        link = f"{rel}/{f.name}".replace(os.sep, "/")
        entries.append(f"## {title or f.stem}\n\n{prose}\n\nFigures: [`{f.stem}`]({link})"
                       + (f" (`streamfed bench {f.stem}`)" if f.stem in BENCHES else "") + "\n")
    text = HEADER.format(machine=machine(), load=load_average(),
                         names=", ".join(names + [p.stem for p in extra]) or "none") + "\n".join(entries)
    Path(docs).parent.mkdir(parents=True, exist_ok=True)
    Path(docs).write_text(text)
    return Path(docs)


def run_bench(names: Sequence[str] | None = None, out_dir: Path = RESULTS, quick: bool = False,
              docs: Path | None = None, timeout: float | None = None) -> int:
    """Run the benchmarks `names` (all when None or empty), each in its own process, writing
    `<out_dir>/<name>.md` (and `.json` for those that write JSON), then assemble the markdown document
    `docs` (default: `docs/benchmarks.md` when `out_dir` is the checkout's `benchmarks/results`, else
    `<out_dir>/benchmarks.md`). `quick`: smoke-test sizes. Returns a process exit code: 0 when every
    bench ran and its JSON (if any) holds only finite numbers, 1 when one failed, 2 for an unknown
    name or a missing `benchmarks/` directory (nothing is run then)."""
    chosen = list(names) if names else list(BENCHES)
    unknown = [n for n in chosen if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}", file=sys.stderr)
        return 2
    missing = [BENCHES[n].script for n in chosen if not (ROOT / BENCHES[n].script).exists()]
    if missing:
        print(f"benchmark scripts not found: {missing} (they live in a source checkout of streamfed)",
              file=sys.stderr)
        return 2
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if docs is None:
        docs = DOCS if out_dir == RESULTS.resolve() else out_dir / "benchmarks.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    failed = []
    for name in chosen:
        bench = BENCHES[name]
        md = out_dir / f"{name}.md"
        cmd = [sys.executable, str(ROOT / bench.script), "--out", str(md), *(bench.quick_args if quick else ())]
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        print(f"  {name}: {time.perf_counter() - t0:.0f}s{'' if rc == 0 else f' FAILED (exit {rc})'}", flush=True)
        if rc == 0 and bench.writes_json:
            try:
                data = json.loads(md.with_suffix(".json").read_text())
            except (OSError, ValueError) as e:
                print(f"  {name}: no readable JSON ({e})", file=sys.stderr)
                rc = 1
            else:
                bad = check_numbers({k: v for k, v in data.items() if k != "meta"})
                if bad:
                    print(f"  {name}: non-finite numbers at {bad[:10]}", file=sys.stderr)
                    rc = 1
        if rc != 0:
            failed.append(name)
    path = assemble(out_dir, docs)
    print(f"wrote {path}")
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    return 0
