"""Cost of robust aggregation without attackers on the Beijing stations (docs/reliability.md §7.2.1): every
station an honest member (tests/attacked_fleet.py, no attacker), exact against robust, fleet mean prequential MSE.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_robust_cost.py 1000 fedbnr "{}" "{}"
    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_robust_cost.py \
        1000 fsgp "{}" "dict(robust_soft=1.0)"

Arguments: steps, family, [fleet.robust] overrides, the family's parameter overrides (Python literals).
"""
import sys
from types import SimpleNamespace

import numpy as np

from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from tests.attacked_fleet import run_attacked_fleet

steps, alg = int(sys.argv[1]), sys.argv[2]
rob = eval(sys.argv[3]) if len(sys.argv) > 3 else {}
par = eval(sys.argv[4]) if len(sys.argv) > 4 else {}
if len(sys.argv) > 5:  # overrides of the robust rule's own settings (algorithms/shares.py Robust), e.g. systematic
    import dataclasses

    from streamfed.algorithms.shares import Robust
    _of, _over = Robust.of.__func__, eval(sys.argv[5])
    Robust.of = classmethod(lambda cls, r, p: (lambda x: x and dataclasses.replace(x, **_over))(_of(cls, r, p)))
b = load_beijing("paper", steps=steps)
fleet = SimpleNamespace(names=list(b.names), streams=list(b.streams))
res = {}
for mode in ("exact", "robust"):
    c = FleetConfig(fleet="t", algorithm=alg, n_inputs=10, standardise="none", clients=tuple(fleet.names),
                    robust=Robustness(aggregation=mode, **rob), **{alg: par})
    res[mode], core = run_attacked_fleet(fleet, c, lambda *a: None, steps)
r = {n: res["robust"][n] / res["exact"][n] for n in fleet.names}
fleet_ratio = np.mean(list(res["robust"].values())) / np.mean(list(res["exact"].values()))
print(alg, steps, rob, par, f"fleet {fleet_ratio:.4f}", f"stations {min(r.values()):.4f}..{max(r.values()):.4f}",
      core.aggregation.diagnostics())
