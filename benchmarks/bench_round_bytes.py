"""Bytes crossing the core link per lock-step POF-MKL round, per region of k clients: the k raw updates (the
`updates` uplink), the `pofmkl.round` partial a lock-step shard sends (its clients' updates, bit-identical
global), and the dense `pofmkl.partial` ΣΔ shards sent before (and still send for asynchronous windows).

    .venv/bin/python benchmarks/bench_round_bytes.py

Counted, not timed: each message is built by the real `ShardCore` from encoded updates and encoded by
`streamfed.wire.message.encode`; deterministic (fixed seed). The edge configuration's N = 16 kernels,
D = 100 features (2D = 200), M = 1 (and M = 4 for comparison).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.algorithms.pofmkl.wire import update_message  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402
from streamfed.fleet.sharding import ShardCore  # noqa: E402
from streamfed.wire.message import encode  # noqa: E402


def region_bytes(n: int, d: int, m: int, k: int) -> tuple[int, int, int]:
    """(raw updates, round partials, dense partial) bytes for one round of `k` clients of one region."""
    cfg = FleetConfig(fleet="beijing", algorithm="pofmkl", n_inputs=10, n_kernels=n, n_features=d, bin_size=m)
    rng = np.random.default_rng(0)
    names = [f"station-{i:04d}" for i in range(k)]
    payloads = [encode(update_message(cfg.fleet, c, 7, rng.choice(n, m, replace=False),
                                      rng.standard_normal((m, 2 * d)), global_version=6,
                                      kernel_version=cfg.kernel_version)) for c in names]
    sizes = []
    for mode in ("lockstep", "async"):  # a lock-step shard sends pofmkl.round, an asynchronous one the dense sum
        shard = ShardCore(cfg, "north", names, mode=mode)
        shard.version = 6
        for c, p in zip(names, payloads, strict=True):
            shard.on_update(c, p, now=0.0)
        sizes.append(sum(len(encode(p)) for p in shard.flush(now=0.0)))
    return sum(map(len, payloads)), sizes[0], sizes[1]


def main() -> None:
    print("| N, 2D, M | clients in the region | raw updates | `pofmkl.round` (now) | dense ΣΔ (before) |")
    print("|---|---|---|---|---|")
    for n, d, m in [(16, 100, 1), (16, 100, 4)]:
        for k in (10, 100, 500):
            raw, rnd, dense = region_bytes(n, d, m, k)
            print(f"| {n}, {2 * d}, {m} | {k} | {raw / 1024:.1f} KiB | {rnd / 1024:.1f} KiB ({rnd / raw:.2f}×) "
                  f"| {dense / 1024:.1f} KiB |")


if __name__ == "__main__":
    main()
