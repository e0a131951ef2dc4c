"""A bound on any rule that weighs members, for the adaptive attacker of `bench_adaptive_attack.py`
(docs/reliability.md §7.2.1): the same two runs, with the attackers' uploads taken with weight 0 and kept out of
every statistic the robust rule reads — residual and systematic levels, the centre, the evidence's noise floor.
What the attackers still change is only *when* the aggregator publishes (their uploads close windows), the
cold-start quorum and the share cap's member count: the honest stations' ratio to the attack-free run is then
what the robust rule's own sensitivity to those costs.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_adaptive_oracle.py 1000 1 4
    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_adaptive_oracle.py \
        1000 1 4 "{}" "dict(robust_soft=0.0)"

Arguments: steps, k, f, [robust-rule overrides (algorithms/shares.py Robust), FedBNR overrides] — passed on to
`bench_adaptive_attack.py` with a 1 Hz declared sensor rate.
"""
# ruff: noqa: SLF001 — an oracle replaces the robust rule's own steps (they are private) for the attackers only
import runpy
import sys

from streamfed.algorithms.fedbnr.aggregation import FedBNRAggregation, RobustFedBNRServer
from streamfed.evaluation.datasets import load_beijing

steps, k = int(sys.argv[1]), int(sys.argv[2])
ATTACKERS = set(list(load_beijing("paper", steps=10).names)[:k])  # the bench's attackers: the first k stations

_weights = FedBNRAggregation._member_weights
_systematic = FedBNRAggregation._systematic
_screen = FedBNRAggregation._screen_weight
_member = RobustFedBNRServer._add_member


def member_weights(self):  # the attackers' whole sums weigh 0 in every global
    return {**_weights(self), **dict.fromkeys(ATTACKERS, 0.0)}


def systematic(self, client, item):  # no systematic level: out of the medians and of the centre
    return None if client in ATTACKERS else _systematic(self, client, item)


def screen_weight(self, client, item):  # weight 0, no residual level or average: out of those medians
    if client in ATTACKERS:
        self._level.pop(client, None)
        getattr(self, "_avg", {}).pop(client, None)
        return 0.0
    return _screen(self, client, item)


def add_member(self, client, st, time):  # not a member of the evidence's noise floor
    if client not in ATTACKERS:
        _member(self, client, st, time)


FedBNRAggregation._member_weights = member_weights
FedBNRAggregation._systematic = systematic
FedBNRAggregation._screen_weight = screen_weight
RobustFedBNRServer._add_member = add_member
rule = sys.argv[4] if len(sys.argv) > 4 else "{}"
params = sys.argv[5] if len(sys.argv) > 5 else "{}"
sys.argv = [sys.argv[0], *sys.argv[1:4], "dict(sensor_rate=1.0)", params, "fedbnr", rule]
runpy.run_path("benchmarks/bench_adaptive_attack.py", run_name="__main__")
