"""The soft screen of robust aggregation (`algorithms/shares.py`, docs/reliability.md §7.2.1), against its rule
written out in numpy: each member's residual ratios are averaged over its last ~5 uploads (an exponential
average, `a ← 0.8·a + 0.2·r`, started at its first ratio), and an upload is taken with weight
`min(1, soft · median of the other members' averages / its member's average)`."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.shares import Robust, RobustShares

FOLLOW = 0.2  # the averaging rate the rule states: ~5 uploads


class _Server:
    version = 0

    def __init__(self) -> None:
        self.weights: list[tuple[str, float]] = []

    def apply(self, item) -> bool:
        (client, _n, _ratio), w = item
        self.weights.append((client, w))
        return True


class _Fleet(RobustShares):
    """Uploads `(client, n, ratio)`: the ratio is what the aggregation would measure under the global."""

    def __init__(self, soft: float = 1.0) -> None:
        self.server = _Server()
        # no share cap (1.0), a floor of one upload, the screen far away: the weight is the soft screen's alone
        self.robust = Robust(share_cap=1.0, floor=1.0, screen=1e9, screen_clients=3, soft=soft, systematic=0.0)
        self._start_robust(None)

    def _samples(self, item) -> float:
        return item[1]

    def _tempered(self, item, w: float):
        return (item, w)

    def _ratio(self, item) -> float:
        return item[2]


def _reference(rounds: list[dict[str, float]], soft: float, clients: int = 3) -> list[tuple[str, float]]:
    """The rule in numpy: the weights of every upload after the cold start (the first `clients + 1` uploads wait
    for the quorum and are then taken in order; a member's average starts at its first ratio)."""
    avg: dict[str, float] = {}
    out = []
    for r in rounds:
        for c, ratio in r.items():
            others = np.array([a for d, a in avg.items() if d != c])
            avg[c] = ratio if c not in avg else (1.0 - FOLLOW) * avg[c] + FOLLOW * ratio
            if others.size < clients:
                out.append((c, 1.0))
            else:
                out.append((c, min(1.0, soft * float(np.median(others)) / avg[c])))
    return out


@settings(max_examples=40, deadline=None)
@given(ratios=st.lists(st.lists(st.floats(0.05, 20.0), min_size=5, max_size=5), min_size=2, max_size=30),
       soft=st.sampled_from([1.0, 1.5]))
def test_soft_weights_follow_the_rule_in_numpy(ratios, soft):
    fleet = _Fleet(soft)
    names = ["a", "b", "c", "d", "e"]
    rounds = [dict(zip(names, r, strict=True)) for r in ratios]
    for r in rounds:
        for c, ratio in r.items():
            fleet.take_robust(c, (c, 16.0, ratio))
    assert [c for c, _ in fleet.server.weights] == [c for c, _ in _reference(rounds, soft)]
    np.testing.assert_allclose([w for _, w in fleet.server.weights], [w for _, w in _reference(rounds, soft)],
                               rtol=1e-12)


def _run(pattern):
    """Five members with ratio 1 each round but member `x`, whose ratios are `pattern`; `x`'s weights."""
    fleet = _Fleet()
    for ratio in pattern:
        for c in "abcd":
            fleet.take_robust(c, (c, 16.0, 1.0))
        fleet.take_robust("x", ("x", 16.0, ratio))
    return [w for c, w in fleet.server.weights if c == "x"]


def test_one_outlier_upload_and_the_members_recovery():
    # an honest member's pollution episode of one upload at 5× the fleet's ratio: that upload weighs 1/1.8, the
    # next 1/(0.8·1.8 + 0.2) — its weight comes back over ~5 uploads
    w = _run([1.0] * 10 + [5.0, 1.0])
    assert w[10] == pytest.approx(1.0 / 1.8)
    assert w[11] == pytest.approx(1.0 / (0.8 * 1.8 + 0.2))


def test_a_member_that_turns_hostile_is_down_weighted_within_a_few_uploads():
    # honest for 10 uploads, then residuals at 30× the fleet's (under the 50× screen): weight 0.066 by its
    # third biased upload, 0.040 by its eighth (an average over ~50 uploads would leave it at 0.37 and 0.19)
    w = _run([1.0] * 10 + [30.0] * 8)
    assert w[12] < 0.07 and w[17] < 0.045
    assert all(b <= a for a, b in zip(w[10:], w[11:], strict=False))
