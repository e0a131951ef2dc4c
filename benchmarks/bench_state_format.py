"""State files: format 2 (msgpack, streamfed.core.durable) against format 1 (pickle), side by side in one run.

For a typical agent and aggregator state — a fleet of 3 clients with the default POF-MKL (8 kernels, 50 features)
and RFF FedBNR configuration, after 200 steps — it times `dumps` (encode + checksum + header) and `loads` (checks +
decode) of the same state in both formats, median of `--repeats`, and prints the sizes. Format 1 is produced
here with pickle protocol 5 behind the same header, as the project wrote it before format 2.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_state_format.py
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from durable_fleets import Fleet  # noqa: E402

from streamfed.fleet.config import FleetConfig  # noqa: E402
from streamfed.fleet.persistence import MAGIC, PICKLE_FORMAT, dumps, loads  # noqa: E402


def pickle_dumps(state: dict) -> bytes:
    body = pickle.dumps(state, protocol=5)
    return MAGIC + struct.pack("<IQ", PICKLE_FORMAT, len(body)) + hashlib.sha256(body).digest() + body


def median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    print("| state | format 2 bytes | format 1 bytes | save ms (2 / 1) | load ms (2 / 1) |")
    print("|---|---:|---:|---:|---:|")
    for name in ("pofmkl", "fedbnr"):
        fleet = _default_fleet(name)
        fleet.run(args.steps)
        states = {"agent": {"kind": "agent", "core": fleet.agents[0].snapshot(), "saved_at": 0.0},
                  "aggregator": {"kind": "aggregator", "core": fleet.agg.snapshot(), "saved_at": 0.0}}
        for kind, st in states.items():
            new, old = dumps(st), pickle_dumps(st)
            assert loads(old)["kind"] == loads(new)["kind"] == kind
            s2, s1 = median_ms(lambda st=st: dumps(st), args.repeats), median_ms(lambda st=st: pickle_dumps(st),
                                                                                 args.repeats)
            l2, l1 = median_ms(lambda b=new: loads(b), args.repeats), median_ms(lambda b=old: loads(b), args.repeats)
            print(f"| {name} {kind} | {len(new):,} | {len(old):,} | {s2:.3f} / {s1:.3f} | {l2:.3f} / {l1:.3f} |")


def _default_fleet(name: str) -> Fleet:
    """A fleet at FleetConfig's defaults (not the small test fleet): what a deployment runs."""
    from durable_fleets import CLIENTS

    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore

    cfg = FleetConfig(fleet="d", algorithm=name, n_inputs=3, seed=1)
    agents = [AgentCore(cfg, c, i, mode="async") for i, c in enumerate(CLIENTS)]
    return Fleet(cfg, "async", agents, AggregatorCore(cfg, clients=CLIENTS, mode="async", window=0.05))


if __name__ == "__main__":
    main()
