"""Every benchmark of `streamfed bench` runs on main (issue 27): each at `--quick` size through the CLI, in its own
process, into a temporary directory, with finite figures. The names come from the registry, so a new benchmark is
covered as soon as it is registered. (`tests/test_bench.py` checks the runner itself and the figures of one bench.)
"""

import json
import math
import re
import subprocess
import sys

import pytest

from streamfed.evaluation.bench import BENCHES, ROOT, check_numbers

pytestmark = pytest.mark.broker  # ingest, latency, runtime, fleet and sharding start Mosquitto

# a number that is not finite as a markdown cell prints it ("nan", "inf", "-inf"), never inside a word
NOT_FINITE = re.compile(r"(?<![\w.])[-+]?(?:nan|inf)(?![\w])", re.IGNORECASE)


def _documented() -> dict[str, int]:
    """The checkout's documented results and plots, with their modification times."""
    paths = [ROOT / "docs" / "benchmarks.md", *(ROOT / "benchmarks" / "results").glob("*"),
             *(ROOT / "docs" / "img").glob("*")]
    return {str(p): p.stat().st_mtime_ns for p in paths if p.is_file()}


@pytest.mark.parametrize("name", list(BENCHES))
def test_bench_runs_at_quick_size(name, tmp_path):
    before = _documented()
    res = subprocess.run([sys.executable, "-m", "streamfed.cli", "bench", name, "--quick", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{name} failed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    section = (tmp_path / f"{name}.md").read_text()
    assert section.startswith("#") and re.search(r"\d", section), section[:500]
    assert not NOT_FINITE.findall(section), [line for line in section.splitlines() if NOT_FINITE.search(line)]
    if BENCHES[name].writes_json:
        data = json.loads((tmp_path / f"{name}.json").read_text())
        figures = {k: v for k, v in data.items() if k != "meta"}
        assert figures and check_numbers(figures) == []
        if name == "ingest":  # honest updates: the aggregator takes every one of them, over either path
            for algo in ("pofmkl", "fedbnr"):
                r = data[algo]
                assert r["messages"] > 0 and r["aggregator_accepted"] == [r["messages"]] * (2 * data["repeats"])
                assert sum(r["aggregator_refused"]) == 0
                assert all(math.isfinite(v) and v > 0 for v in r["median"].values())
    assert (tmp_path / "benchmarks.md").read_text().startswith("# Benchmarks")  # assembled beside, not in docs/
    after = _documented()
    # a smoke run leaves the documented figures and plots alone (rewrites none of them)
    assert [p for p, t in before.items() if after.get(p) != t] == []
