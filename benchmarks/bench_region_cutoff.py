"""A region cut off for minutes (issue 35 part 3), measured once rather than tested in CI: 3 regions + core on
loopback ports (production profile), FedBNR async, one shard per region and the reducer at the core. Region
`east`'s regional broker is stopped (SIGTERM: its bridge and sessions saved) for `--minutes` while its agents keep
reading (their outboxes hold the updates) and the other regions go on; then it comes back. The posterior must
equal the centralised one over every sample (each counted once) and every agent must end on the last global.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_region_cutoff.py --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from types import SimpleNamespace

from streamfed.evaluation.datasets import load_beijing
from streamfed.runtime.topology import LocalTopology
from tests.oracles.fedbnr import assert_global_is_centralised
from tests.test_bridges import FEDBNR, REGIONS, agents_of, regional_services


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=1.0, help="readings per second per agent")
    a = ap.parse_args()
    steps = int(a.rate * (a.minutes * 60 + 60))  # the streams outlast the cut by a minute
    streams = {s.name: s for s in load_beijing(normalisation="paper", split="station", steps=steps).streams[:6]}
    streams = {f"s{i}": s for i, s in enumerate(streams.values())}
    names = list(streams)
    report = {}
    with LocalTopology("wind", REGIONS) as topo:
        reducer, shards = regional_services(topo, FEDBNR, names, "async", resend_after=30.0)
        agents = agents_of(topo, FEDBNR, streams, "async", rate_hz=a.rate, linger=1.0, resend_after=30.0,
                           drain=120.0)

        async def run() -> None:
            tasks = [asyncio.create_task(s.run()) for s in [reducer, *shards]]
            for s in [reducer, *shards]:
                await asyncio.wait_for(s.connected.wait(), 15)
            agent_tasks = [asyncio.create_task(x.run()) for x in agents]
            while reducer.core.version < 2:
                await asyncio.sleep(0.1)
            topo.stop("east")
            t0 = time.time()
            await asyncio.sleep(a.minutes * 60)
            report["silent_s"] = time.time() - reducer.regions.seen()["east"].last
            topo.start("east")
            report["down_s"] = time.time() - t0
            await asyncio.wait_for(asyncio.gather(*agent_tasks), a.minutes * 60 + 600)
            for s in [*agents, reducer, *shards]:
                s.stop()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)

        asyncio.run(run())
    # an agent's last samples below the upload floor never leave it (counted as below_privacy_floor): the global
    # must hold every other sample exactly once
    dropped = {x.core.client_id: x.core.counters.skipped.get("below_privacy_floor", 0) for x in agents}
    kept = [SimpleNamespace(X=s.X[: len(s.y) - dropped[n]], y=s.y[: len(s.y) - dropped[n]])
            for n, s in streams.items()]
    assert_global_is_centralised(reducer.core.aggregation.server, agents[0].core.learner.client, kept)
    report["below_floor_at_end"] = sum(dropped.values())
    report["global_version"] = reducer.core.version
    report["agents_versions"] = sorted({x.core.global_version for x in agents})
    report["samples_in_global"] = float(reducer.core.aggregation.server.stats.n)
    report["samples_offered"] = sum(len(s.y) for s in streams.values())
    print("region east cut off:", report, "— the posterior equals the centralised one (every sample once)")


if __name__ == "__main__":
    main()
