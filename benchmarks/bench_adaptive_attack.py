"""The adaptive residual-matching attacker against robust FedBNR on its defaults (docs/reliability.md §7.2.1):
`k` of 12 Beijing stations send labels = the global's prediction + sqrt(f · median · v) per row, every sample
their rate allows; worst honest MSE ratio to the attack-free run.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_adaptive_attack.py \
        300 1 4 "dict(sensor_rate=1.0)"

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_adaptive_attack.py \
        300 1 4 "dict(sensor_rate=1.0)" "{}" fsgp

Arguments: steps, k, f, [fleet.robust] overrides, the family's parameter overrides (Python literals), the family
(`fedbnr`, the default, or `fsgp`: the attacker's statistics under its client's current (θ, σ, Z) and epoch, the
shift measured under the fleet's posterior, not an honest client's personal mixture).
"""
import sys

import numpy as np

from streamfed.algorithms.fedbnr.wire import stats_update_message
from streamfed.algorithms.fsgp.kernels import cov
from streamfed.algorithms.fsgp.messages import Upload
from streamfed.algorithms.fsgp.posterior import Stats
from streamfed.algorithms.fsgp.wire import UPDATE, update_arrays
from streamfed.core.stats import SufficientStats
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.wire.message import Message
from tests.attacked_fleet import run_attacked_fleet

steps, k, f = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if len(sys.argv) > 7:  # overrides of the robust rule's own settings (algorithms/shares.py Robust), e.g. systematic
    import dataclasses

    from streamfed.algorithms.shares import Robust
    _of, _over = Robust.of.__func__, eval(sys.argv[7])
    Robust.of = classmethod(lambda cls, r, p: (lambda x: x and dataclasses.replace(x, **_over))(_of(cls, r, p)))
b = load_beijing("paper", steps=steps)
names = list(b.names)
family = sys.argv[6] if len(sys.argv) > 6 else "fedbnr"
cfg = FleetConfig(fleet="t", algorithm=family, n_inputs=10, standardise="none", clients=tuple(names),
                  robust=Robustness(aggregation="robust", **eval(sys.argv[4] if len(sys.argv) > 4 else "{}")),
                  **{family: eval(sys.argv[5] if len(sys.argv) > 5 else "{}")})

def upload(agent, core, n, seq, X, y):
    if family == "fsgp":
        client = agent.learner.client
        st_ = Stats.from_samples(cov(client.hyper, X, client.hyper.Z), y, client.epoch)
        return Message("t", n, UPDATE, seq, core.version, core.kernel_version, y.size, 0.0,
                       update_arrays(Upload(n, seq, core.version, st_), 10), epoch=client.epoch)
    st_ = SufficientStats.from_samples(agent.learner.client.features_many(X), y,
                                       kernel_version=core.kernel_version).to_packed()
    return stats_update_message("t", n, seq, st_["S_upper"], st_["b"], float(st_["n"]), float(st_["q"]),
                                global_version=core.version, kernel_version=core.kernel_version, created=0.0)

t_now = [0]
def labels(agent, core, s, rows):
    c = agent.learner.client
    predict = c.post.predict_many if family == "fsgp" else c.predict_many  # the fleet's posterior
    t = int(rows.max())
    # omniscient: the median over honest stations of their last 32 rows' ratio under the attacker's global
    meds = []
    for st in b.streams[k:]:
        lo = max(0, t - 31)
        m, v = predict(st.X[lo:t + 1])
        meds.append(float(np.mean((st.y[lo:t + 1] - m) ** 2 / v)))
    med = float(np.median(meds))
    mean, var = predict(s.X[rows])
    return mean + np.sqrt(f * max(med, 1e-6) * var)

calm, calm_core = run_attacked_fleet(b, cfg, upload, steps, names[:k], silent=True)
hit, core = run_attacked_fleet(b, cfg, upload, steps, names[:k], labels=labels)
r = {n: hit[n] / calm[n] for n in hit}
print(f"k={k} f={f}: worst {max(r.values()):.4f} mean {np.mean(list(hit.values()))/np.mean(list(calm.values())):.4f}",
      core.aggregation.diagnostics(), {a: round(core.aggregation.client_shares().get(a, 0), 4) for a in names[:k]},
      core.rejected)
print({n: round(v, 3) for n, v in r.items()})
print("calm", {n: round(v, 5) for n, v in calm.items()})
for name, c in (("calm", calm_core), ("attacked", core)):
    srv = c.aggregation.server
    print(name, "sigma", np.round(srv.sigma, 4), "lam", np.round(srv.lam, 3), "n", round(srv.stats.n),
          "noise floor", None if getattr(srv, "floors", None) is None else np.round(np.sqrt(srv.floors), 4))
for name, c in (("calm", calm_core), ("attacked", core)):
    lv = c.aggregation.systematic_levels() if hasattr(c.aggregation, "systematic_levels") else {}
    print("systematic levels", name, {n: round(v, 3) for n, v in lv.items()})
srv = core.aggregation.server
if hasattr(srv, "member_sums"):  # each member's own-fit residual level over σ² (kernel 0): how noisy its labels are
    rho = (srv.sigma[0] / srv.lam[0]) ** 2
    own = {c: (m.q - m.b[0] @ np.linalg.solve(m.S[0] + rho * np.eye(srv.dim), m.b[0])) / (m.n * srv.sigma[0] ** 2)
           for c, m in srv.member_sums().items()}
    print("own-fit residual / σ² (attacked)", {c: round(float(v), 3) for c, v in own.items()})
