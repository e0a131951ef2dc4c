"""Run every benchmark and write docs/benchmarks.md from their sections.

    .venv/bin/python benchmarks/run_all.py            # all (≈ 10 min on 2 cores)
    .venv/bin/python benchmarks/run_all.py pofmkl     # only some: pofmkl, replay, fedbnr, runtime
    .venv/bin/python benchmarks/run_all.py --assemble # only rebuild docs/benchmarks.md from results/

Each script also runs alone and prints its section; results/*.md keep the last section of each.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHES = {
    "pofmkl": ["benchmarks/bench_pofmkl.py"],
    "fedbnr": ["benchmarks/bench_fedbnr.py"],
    "replay": ["benchmarks/bench_replay.py"],
    "runtime": ["benchmarks/bench_runtime.py"],
}
HEADER = """# Benchmarks

Every figure is measured side by side with a peer or baseline in the same run (a ratio), with its
configuration and the command that reproduces it. Machine: {machine}. These are benchmarks, not timed
tests: nothing in the test suite asserts a speed.

Regenerate all: `.venv/bin/python benchmarks/run_all.py` (or one section: `... run_all.py pofmkl`).
Load average when this file was written: {load}.

"""


def main() -> None:
    args = sys.argv[1:]
    assemble_only = "--assemble" in args  # rebuild docs/benchmarks.md from results/*.md without running
    chosen = [] if assemble_only else ([a for a in args if a in BENCHES] or list(BENCHES))
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    for name in chosen:
        out = results / f"{name}.md"
        cmd = [sys.executable, *BENCHES[name], "--out", str(out)]
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True)
        print(f"  {name}: {time.perf_counter() - t0:.0f}s", flush=True)
    sections = [(results / f"{n}.md").read_text() for n in BENCHES if (results / f"{n}.md").exists()]
    extra = sorted(p for p in results.glob("*.md") if p.stem not in BENCHES)
    sections += [p.read_text() for p in extra]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = HEADER.format(machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                         load=load) + "\n".join(sections)
    (ROOT / "docs" / "benchmarks.md").write_text(text)
    print("wrote docs/benchmarks.md")


if __name__ == "__main__":
    main()
