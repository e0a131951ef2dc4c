"""Run every benchmark and write docs/benchmarks.md from their sections.

    .venv/bin/python benchmarks/run_all.py            # all (≈ 20 min on 2 cores, the 1,000-agent fleet included)
    .venv/bin/python benchmarks/run_all.py pofmkl     # only some: pofmkl, fedbnr, replay, runtime, messages,
                                                      # flops, memory, ingest, latency, fleet, sharding
    .venv/bin/python benchmarks/run_all.py --quick messages   # smoke-test sizes (figures indicative only)
    .venv/bin/python benchmarks/run_all.py --assemble # only rebuild docs/benchmarks.md from results/

Each script also runs alone and prints its section; results/*.md keep the last section of each (and
results/*.json the numbers of those that write them). The registry and the assembly live in
`streamfed/evaluation/bench.py` (also behind `streamfed bench`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.evaluation.bench import BENCHES, DOCS, RESULTS, assemble, run_bench  # noqa: E402


def main() -> int:
    args = sys.argv[1:]
    if "--assemble" in args:  # rebuild docs/benchmarks.md from results/*.md without running
        print(f"wrote {assemble(RESULTS, DOCS)}")
        return 0
    unknown = [a for a in args if not a.startswith("--") and a not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}", file=sys.stderr)
        return 2
    return run_bench([a for a in args if a in BENCHES] or None, RESULTS, quick="--quick" in args, docs=DOCS)


if __name__ == "__main__":
    raise SystemExit(main())
