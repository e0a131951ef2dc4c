"""Sharded aggregation (shards + reducer, pure cores through the real codec) equals the single
aggregator: POF-MKL lock-step θ and FedBNR statistics, whatever shard each update reaches, with
duplicate deliveries to other shards, refused partials sent again, and partials re-sent after a
reconnect. Bad partials are counted, never applied."""

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sharding import ReducerCore, ShardCore, contributors_fields, contributors_of
from streamfed.fleet.sources import Reading
from streamfed.wire.message import Message, decode, encode

STEPS = 40


@pytest.fixture(scope="module")
def fleet():
    return load_beijing(normalisation="paper", split="station", steps=120)


def first_update(fleet, cfg, mode):
    """Client "a"'s update after its first sample of station 0 (a `mode` agent)."""
    s = fleet.streams[0]
    _, msgs = AgentCore(cfg, "a", 0, mode=mode).on_reading(Reading("0", s.X[0], 0.0, float(s.y[0])))
    assert len(msgs) == 1
    return msgs[0]


def pof_cfg(**kw):
    return FleetConfig(standardise="none",
                       fleet="t", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=20, bin_size=2,
                       seed=3, pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2), **kw)


def bnr_cfg():
    return FleetConfig(standardise="none", fleet="t", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=15,
                       kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=True))


class ShardedFleet:
    """A broker in miniature: `$share` hands each update to one shard (chosen by `rng`), sometimes a copy to
    another; partials go to the reducer, acks back to their shard, globals to everyone."""

    def __init__(self, cfg, names, n_shards, rng, dup_rate=0.0, mode="lockstep"):
        self.cfg, self.rng, self.dup_rate = cfg, rng, dup_rate
        self.shards = [ShardCore(cfg, f"s{i}", names, mode=mode) for i in range(n_shards)]
        self.reducer = ReducerCore(cfg, names, mode=mode, window=0.0)
        self.globals: list[Message] = []

    def route_updates(self, msgs):
        for m in msgs:
            payload = encode(m, self.cfg)
            first = self.rng.randrange(len(self.shards))
            self.shards[first].on_update(m.client, payload, now=0.0)
            if len(self.shards) > 1 and self.rng.random() < self.dup_rate:  # a resend reaching another shard
                other = (first + 1 + self.rng.randrange(len(self.shards) - 1)) % len(self.shards)
                self.shards[other].on_update(m.client, payload, now=0.0)

    def flush(self, which=None):
        out = []
        for i, s in enumerate(self.shards):
            if which is None or i in which:
                for p in s.flush(now=0.0):
                    out += self.to_reducer(s, p)
        for s in self.shards:  # the kept count equals a recount of what the shard holds
            assert s.held == sum(map(len, s._pending.values())) + sum(len(p.items) for p in s._unacked.values())
        return out

    def to_reducer(self, shard, partial, *, again=False):
        out = []
        for m in self.reducer.on_partial(shard.name, encode(partial, self.cfg), now=0.0):
            payload = encode(m, self.cfg)
            if m.kind == "partial.ack":
                back = decode(payload, self.cfg, client=shard.name, kinds=("partial.ack",))
                for p in shard.on_ack(back, now=0.0):
                    out += self.to_reducer(shard, p)
            elif m.kind.endswith(".global"):
                g = decode(payload, self.cfg, kernel_version=self.reducer.kernel_version)
                self.globals.append(g)
                for s in self.shards:
                    s.on_global(g)
                out.append(g)
        return out


def test_contributors_roundtrip_and_validation():
    inc, owner, seqs = contributors_fields([("b", 3), ("a", 1), ("b", 2)])
    msg = Message("f", "s", "partial.ack", 0, included=inc, arrays={"owner": owner, "seqs": seqs})
    assert contributors_of(msg) == [("a", 1), ("b", 2), ("b", 3)]
    bad = [
        Message("f", "s", "x", 0, included={"a": 1}, arrays={"owner": np.array([1]), "seqs": np.array([1])}),
        Message("f", "s", "x", 0, included={"a": 1}, arrays={"owner": np.array([0, 0]), "seqs": np.array([1, 1])}),
        Message("f", "s", "x", 0, included={"a": 2}, arrays={"owner": np.array([0]), "seqs": np.array([1])}),
        Message("f", "s", "x", 0, included={"a": 1, "b": 1}, arrays={"owner": np.array([0]), "seqs": np.array([1])}),
    ]
    for m in bad:
        with pytest.raises(ValueError):
            contributors_of(m)


def read_step(agents, ref_agents, streams, t):
    """Step `t` of every stream read by both sets of lock-step agents: (their updates, the references')."""
    msgs, ref_msgs = [], []
    for a, r, s in zip(agents, ref_agents, streams, strict=True):
        reading = Reading(f"{t}", s.X[t], float(t), float(s.y[t]))
        msgs += a.on_reading(reading)[1]
        ref_msgs += r.on_reading(reading)[1]
    return msgs, ref_msgs


def feed_single(single, ref_agents, ref_msgs, cfg):
    """The single aggregator takes the reference agents' updates; they install every global it publishes."""
    for m in ref_msgs:
        for g in single.on_update(m.client, encode(m, cfg), now=0.0):
            if g.kind.endswith(".global"):
                for r in ref_agents:
                    r.on_global(decode(encode(g, cfg), cfg, kernel_version=r.kernel_version), now=0.0)


def run_pofmkl(fleet, n_shards, seed, dup_rate, flush_prob):
    streams = fleet.streams[:4]
    cfg = pof_cfg()
    names = [s.name for s in streams]
    rng = random.Random(seed)
    agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    ref_agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    single = AggregatorCore(cfg, clients=names, mode="lockstep")
    sharded = ShardedFleet(cfg, names, n_shards, rng, dup_rate)
    for t in range(STEPS):
        msgs, ref_msgs = read_step(agents, ref_agents, streams, t)
        feed_single(single, ref_agents, ref_msgs, cfg)
        # the sharded path: updates spread over shards, shards flush at random moments
        rng.shuffle(msgs)
        got = []
        for m in msgs:
            sharded.route_updates([m])
            if rng.random() < flush_prob:
                got += sharded.flush({rng.randrange(n_shards)})
        got += sharded.flush()
        assert [g.global_version for g in got] == [t + 1], "one global per lock-step round"
        for a in agents:
            a.on_global(got[0], now=0.0)
    return single, sharded


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_shards=st.integers(1, 4), seed=st.integers(0, 2**16), dup_rate=st.sampled_from([0.0, 0.3]),
       flush_prob=st.sampled_from([0.0, 0.5, 1.0]))
def test_sharded_pofmkl_lockstep_equals_single_aggregator(fleet, n_shards, seed, dup_rate, flush_prob):
    single, sharded = run_pofmkl(fleet, n_shards, seed, dup_rate, flush_prob)
    red = sharded.reducer
    assert red.version == single.version == STEPS
    assert np.array_equal(red.aggregation.server.theta, single.aggregation.server.theta)  # bit for bit
    assert red.included() == single.included()
    assert red.accepted == single.counters.accepted == 4 * STEPS  # every update exactly once
    assert all(s.held == 0 for s in sharded.shards)  # every partial acknowledged
    if dup_rate == 0:
        assert "duplicate" not in red.rejected
    # what agents receive is the same message, but for the sender
    a, b = red.global_message(), single.global_message()
    assert a.included == b.included and a.global_version == b.global_version
    assert a.arrays["theta"].tobytes() == b.arrays["theta"].tobytes()


def test_regional_shards_with_partials_in_any_order_are_bit_identical(fleet, monkeypatch):
    """A shard per region (uneven: 1, 2 and 4 clients), several rounds, each round's partials reaching the
    reducer in a shuffled order, a region's round split over several partials (two updates each at most): the
    global equals the single aggregator's bit for bit after every round. Summing each region first and then the
    regions (what shards sent before) gives other bits in some of these rounds: the order is what is tested."""
    from streamfed.algorithms.pofmkl import wire as pofmkl_wire

    monkeypatch.setattr(pofmkl_wire, "ROUND_BYTES", 2 * 2 * 40 * 8)  # two updates of M = 2 rows of 2D = 40
    cfg = pof_cfg().model_copy(update={"fleet": "regions"})  # its own schema (cached by value) with that bound
    assert pofmkl_wire.round_clients(cfg) == 2
    streams = fleet.streams[:7]
    names = [s.name for s in streams]
    regions = [names[:1], names[1:3], names[3:]]
    region_of = {c: i for i, r in enumerate(regions) for c in r}
    rng = random.Random(11)
    agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    ref_agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    single = AggregatorCore(cfg, clients=names, mode="lockstep")
    shards = [ShardCore(cfg, f"region{i}", names) for i in range(len(regions))]
    red = ReducerCore(cfg, names, shards=[s.name for s in shards])
    steps, presummed_differs = 30, 0
    for t in range(steps):
        msgs, ref_msgs = read_step(agents, ref_agents, streams, t)
        rng.shuffle(ref_msgs)
        feed_single(single, ref_agents, ref_msgs, cfg)
        rng.shuffle(msgs)
        for m in msgs:
            shards[region_of[m.client]].on_update(m.client, encode(m, cfg), now=0.0)
        parts = [(sh, p) for sh in shards for p in sh.flush(now=0.0)]
        assert len(parts) == 1 + 1 + 2  # the 4-client region's round in two partials
        assert {p.kind for _, p in parts} == {"pofmkl.round"}
        rng.shuffle(parts)
        got = []
        for sh, p in parts:
            for out in red.on_partial(sh.name, encode(p, cfg), now=0.0):
                back = decode(encode(out, cfg), cfg)
                if out.kind == "partial.ack":
                    assert back.meta["applied"] and sh.on_ack(back, now=0.0) == []
                elif out.kind.endswith(".global"):
                    got.append(back)
        assert [g.global_version for g in got] == [t + 1] == [single.version]
        assert got[0].arrays["theta"].tobytes() == single.global_message().arrays["theta"].tobytes()
        assert got[0].included == single.global_message().included
        for a in agents:
            a.on_global(got[0], now=0.0)
        for sh in shards:
            sh.on_global(got[0])
        # the pre-summed alternative, from the same updates: per region in arrival order, regions as they came
        by_client = {m.client: m for m in msgs}
        fleet_sum, dense = np.zeros((4, 40)), np.zeros((4, 40))
        for c in names:  # eq. (10)'s sum in the fleet's order: what the single aggregator adds
            fleet_sum[by_client[c].arrays["kernels"]] += by_client[c].arrays["delta"]
        for i in dict.fromkeys(shards.index(sh) for sh, _ in parts):  # regions in the order they came
            region = np.zeros((4, 40))
            for m in msgs:
                if region_of[m.client] == i:
                    region[m.arrays["kernels"]] += m.arrays["delta"]
            dense += region
        presummed_differs += (dense / len(names)).tobytes() != (fleet_sum / len(names)).tobytes()
    assert all(s.held == 0 for s in shards) and red.accepted == single.counters.accepted == 7 * 30
    assert presummed_differs > 0, "these rounds do not depend on the order of additions: the test proves nothing"


def test_duplicates_across_shards_are_refused_and_the_rest_resent(fleet):
    single, sharded = run_pofmkl(fleet, 3, seed=7, dup_rate=0.5, flush_prob=0.5)
    red = sharded.reducer
    assert red.rejected.get("duplicate", 0) > 0  # the test exercised the refusal path
    assert sum(s.counters.resent for s in sharded.shards) > 0
    assert red.accepted == 4 * STEPS
    assert np.array_equal(red.aggregation.server.theta, single.aggregation.server.theta)


def test_partial_sent_again_after_reconnect_is_acknowledged_not_added(fleet):
    cfg = pof_cfg()
    names = ["a", "b"]
    shard, red = ShardCore(cfg, "s0", names), ReducerCore(cfg, names)
    up = first_update(fleet, cfg, "lockstep")
    shard.on_update("a", encode(up, cfg))
    (p,) = shard.flush()
    first = red.on_partial("s0", encode(p, cfg))
    again = red.on_partial("s0", encode(shard.unacked()[0], cfg))
    assert [m.meta["applied"] for m in first + again] == [True, True]
    assert red.accepted == 1 and red._round[1][1] == {"a"}


def run_fedbnr(fleet, n_shards, seed, dup_rate, cfg=None):
    streams = fleet.streams[:3]
    cfg = cfg or bnr_cfg()
    names = [s.name for s in streams]
    rng = random.Random(seed)
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    single = AggregatorCore(cfg, clients=names, window=0.0)
    sharded = ShardedFleet(cfg, names, n_shards, rng, dup_rate, mode="async")
    msgs = []
    for t in range(120):
        for a, s in zip(agents, streams, strict=True):
            msgs += a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))[1]
    rng.shuffle(msgs)  # any arrival order
    for m in msgs:
        single.on_update(m.client, encode(m, cfg), now=0.0)
        sharded.route_updates([m])
        if rng.random() < 0.3:
            sharded.flush({rng.randrange(n_shards)})
    sharded.flush()
    return single, sharded, len(msgs)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_shards=st.integers(1, 4), seed=st.integers(0, 2**16), dup_rate=st.sampled_from([0.0, 0.4]))
def test_sharded_fedbnr_equals_single_aggregator(fleet, n_shards, seed, dup_rate):
    single, sharded, n_msgs = run_fedbnr(fleet, n_shards, seed, dup_rate)
    red = sharded.reducer
    a, b = red.aggregation.server, single.aggregation.server
    assert red.accepted == single.counters.accepted == n_msgs
    assert a.stats.n == b.stats.n
    np.testing.assert_allclose(a.stats.S, b.stats.S, rtol=1e-12, atol=1e-12 * np.abs(b.stats.S).max())
    np.testing.assert_allclose(a.stats.b, b.stats.b, rtol=1e-12, atol=1e-12 * np.abs(b.stats.b).max())
    assert a.stats.q == pytest.approx(b.stats.q, rel=1e-12)
    # the single aggregator publishes when its window closes; fit σ, λ on the same sums
    single.aggregation.server.publish()
    np.testing.assert_allclose(a.sigma, b.sigma, rtol=1e-6)
    np.testing.assert_allclose(a.lam, b.lam, rtol=1e-6)
    assert dict(a.included) == dict(b.included)


def test_bad_partials_are_counted_and_change_nothing(fleet):
    """A lock-step POF-MKL reducer takes rounds as `pofmkl.round` partials; each update in one is held to what an
    update is held to (1..M distinct kernels in range, finite, within ±max_abs), else the partial is refused with a
    reason, counted, and nothing changes."""
    cfg = pof_cfg()  # N = 4 kernels, M = 2, 2D = 40
    names = ["a", "b"]
    red = ReducerCore(cfg, names)
    assert red.partial_kind == "pofmkl.round"
    theta = red.aggregation.server.theta.copy()
    inc, owner, seqs = contributors_fields([("a", 1)])
    good = dict(fleet=cfg.fleet, client="s0", kind="pofmkl.round", seq=1, kernel_version=red.kernel_version,
                included=inc, meta={"round": 1})

    def partial(delta, rows=(1,), kernels=(0,), **kw):
        return Message(**{**good, **kw}, arrays={"rows": np.array(rows), "kernels": np.array(kernels),
                                                 "delta": delta, "owner": owner, "seqs": seqs})

    row = np.zeros((1, 40))
    dense = Message(**{**good, "kind": "pofmkl.partial"}, arrays={"sum": np.zeros((4, 40)), "owner": owner,
                                                                   "seqs": seqs})
    cases = {
        "not_msgpack": [b"\xc1garbage"],
        "non_finite": [encode(partial(np.full((1, 40), np.nan)))],
        "wrong_shape": [encode(partial(np.zeros((1, 39))))],
        "bad_index": [encode(partial(row, kernels=(4,)))],
        "unknown_client": [encode(partial(row, included={"zz": 1}))],
        "unknown_kind": [encode(dense)],  # a dense sum: lock-step rounds travel as their updates
        "wrong_kernel_version": [encode(partial(row, kernel_version="other"))],
        "invalid_partial": [encode(p) for p in [
            partial(row, meta={"round": 2}),  # seqs say round 1
            partial(np.zeros((2, 40)), rows=(2,), kernels=(1, 1)),  # a kernel twice in one update
            partial(np.zeros((3, 40)), rows=(3,), kernels=(0, 1, 2)),  # more rows than M = 2
            partial(np.zeros((2, 40)), rows=(1,), kernels=(0, 1)),  # rows do not add up to the rows sent
            partial(np.full((1, 40), 1e101)),  # beyond max_abs
        ]],
    }
    for reason, payloads in cases.items():
        for payload in payloads:
            assert red.on_partial("s0", payload, now=0.0) == [], reason
        assert red.rejected.get(reason, 0) == len(payloads), (reason, red.rejected)
    assert red.accepted == 0 and red.version == 0 and np.array_equal(red.aggregation.server.theta, theta)
    assert not red._round
    # and the well-formed partial is taken
    assert [m.meta["applied"] for m in red.on_partial("s0", encode(partial(row)), now=0.0)] == [True]


def test_shard_rejects_like_the_aggregator(fleet):
    """Same bad updates → same reasons at a shard and at the single aggregator."""
    cfg = pof_cfg()
    names = ["a", "b"]
    shard, agg = ShardCore(cfg, "s0", names), AggregatorCore(cfg, names)
    up = first_update(fleet, cfg, "lockstep")
    good = encode(up, cfg)
    arrays = dict(up.arrays)
    arrays["delta"] = np.full_like(arrays["delta"], np.inf)
    nonfinite = encode(Message(**{**up.__dict__, "arrays": arrays}))
    for payload, client in [(b"junk", "a"), (good, "b"), (nonfinite, "a"), (good, "a"), (good, "a")]:
        shard.on_update(client, payload, now=0.0)
        agg.on_update(client, payload, now=0.0)
    assert shard.rejected == agg.rejected
    assert shard.counters.accepted == agg.counters.accepted == 1


def test_reducer_resumes_from_its_checkpoint_exactly(fleet):
    """A reducer rebuilt from the snapshot it wrote before a global (encoded as the state file holds it)
    continues exactly as one that never stopped: same θ after every later round."""
    from streamfed.core import durable

    streams = fleet.streams[:3]
    cfg = pof_cfg()
    names = [s.name for s in streams]
    agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    rng = random.Random(5)
    sharded = ShardedFleet(cfg, names, 2, rng)
    saved = []
    sharded.reducer.checkpoint = lambda core: saved.append(durable.encode(core.snapshot()))
    ref = AggregatorCore(cfg, clients=names, mode="lockstep")  # never stops
    for t in range(30):
        msgs = [m for a, s in zip(agents, streams, strict=True)
                for m in a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))[1]]
        for m in msgs:
            ref.on_update(m.client, encode(m, cfg), now=0.0)
        sharded.route_updates(msgs)
        if t == 14:
            # Round 15: shard s0's partial reaches the reducer and is acknowledged (s0 forgets it), then the
            # reducer crashes before the round closes: a new one from the last checkpoint (before global 14's
            # publication) has lost s0's part. The agents resend what its acks do not list; s0 takes the
            # resends in again, the restored reducer refuses what s1's partial already brought.
            assert sharded.flush({0}) == [] and sharded.shards[0].held == 0
            restored = ReducerCore(cfg, names, mode="lockstep", window=0.0)
            restored.restore(durable.decode(saved[-1]))
            assert restored.version == 14 and restored.included() == {n: 14 for n in names}
            sharded.reducer = restored
            by_name = {a.client_id: a for a in agents}
            resend = [m for ack in restored.hello() for m in by_name[ack.client].on_ack(ack)]
            assert len(resend) == len(names)  # every agent's round-15 update is above the mark
            sharded.route_updates(resend)
        got = sharded.flush()
        for a in agents:
            a.on_global(got[0], now=0.0)
    assert sharded.reducer.version == ref.version == 30
    assert np.array_equal(sharded.reducer.aggregation.server.theta, ref.aggregation.server.theta)
    with pytest.raises(ValueError, match="different fleet configuration"):
        ReducerCore(bnr_cfg(), names, mode="async").restore(durable.decode(saved[-1]))


def test_open_lockstep_round_of_updates_survives_a_checkpoint(fleet):
    """A reducer's state holding an open lock-step round (one region's updates in, the other's not) is written and
    read as the state file holds it; the restored reducer closes the round on the same bits as one that never
    stopped."""
    from streamfed.core import durable

    streams = fleet.streams[:3]
    cfg = pof_cfg()
    names = [s.name for s in streams]
    msgs = [m for i, (n, s) in enumerate(zip(names, streams, strict=True))
            for m in AgentCore(cfg, n, i, mode="lockstep").on_reading(Reading("0", s.X[0], 0.0, float(s.y[0])))[1]]
    north, south = ShardCore(cfg, "north", names), ShardCore(cfg, "south", names)
    for m in msgs:
        (north if m.client == names[0] else south).on_update(m.client, encode(m, cfg), now=0.0)
    (p_north,), (p_south,) = north.flush(now=0.0), south.flush(now=0.0)
    live = ReducerCore(cfg, names)
    live.on_partial("north", encode(p_north, cfg), now=0.0)
    restored = ReducerCore(cfg, names)
    restored.restore(durable.decode(durable.encode(live.snapshot())))
    assert restored._round[1][1] == {names[0]}
    for red in (live, restored):
        assert red.on_partial("south", encode(p_south, cfg), now=0.0)[-1].kind == "pofmkl.global"
    single = AggregatorCore(cfg, clients=names, mode="lockstep")
    for m in reversed(msgs):
        single.on_update(m.client, encode(m, cfg), now=0.0)
    assert live.version == restored.version == single.version == 1
    assert live.aggregation.server.theta.tobytes() == restored.aggregation.server.theta.tobytes() \
        == single.aggregation.server.theta.tobytes()


def test_a_round_holding_a_dense_sum_from_an_older_state_is_summed_densely():
    """A reducer state written by a build whose shards sent dense sums may hold an open lock-step round as one:
    the round's updates that come after are added to it (ΣΔ by plain NumPy), so the round still closes."""
    from streamfed.algorithms.pofmkl.aggregation import RoundUpdates
    from streamfed.algorithms.pofmkl.messages import KernelUpdate

    agg = ReducerCore(pof_cfg(), ["a", "b", "c"]).aggregation
    old = np.zeros((4, 40))
    old[1] = 0.25  # client "a"'s row 1, summed by the older build's shard
    ups = RoundUpdates({"c": KernelUpdate(np.array([1, 3]), np.full((2, 40), 0.5)),
                        "b": KernelUpdate(np.array([0]), np.ones((1, 40)))})
    total = agg.combine_partials([old, ups], {"a": 0, "b": 1, "c": 2})
    expected = np.zeros((4, 40))
    expected[1], expected[3], expected[0] = 0.75, 0.5, 1.0
    assert isinstance(total, np.ndarray) and np.array_equal(total, expected)
    merged = agg.combine_partials([ups], {"a": 0, "b": 1, "c": 2})
    assert merged.clients() == ["b", "c"]  # the fleet's order, not arrival


def test_fedbnr_reducer_checkpoint_holds_no_applied_window(fleet):
    """The checkpoint before a FedBNR global is taken with the window already summed into the statistics and
    emptied: restoring it must not add that window a second time."""
    from streamfed.core import durable

    cfg = bnr_cfg()
    names = [s.name for s in fleet.streams[:2]]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    shard, red = ShardCore(cfg, "s0", names), ReducerCore(cfg, names, mode="async", window=0.0)
    saved = []
    red.checkpoint = lambda core: saved.append(durable.encode(core.snapshot()))
    for t in range(60):
        for a, s in zip(agents, fleet.streams[:2], strict=True):
            for m in a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))[1]:
                shard.on_update(m.client, encode(m, cfg))
    for p in shard.flush(now=0.0):
        red.on_partial("s0", encode(p, cfg), now=0.0)
    assert saved and red.aggregation.server.stats.n >= 100  # uploads of >= 8 samples: the last few still pending
    again = ReducerCore(cfg, names, mode="async", window=0.0)
    again.restore(durable.decode(saved[-1]))
    assert again.aggregation.server.stats.n == red.aggregation.server.stats.n and again._win_sum is None
    np.testing.assert_array_equal(again.aggregation.server.stats.S, red.aggregation.server.stats.S)


def test_shard_takes_a_resend_after_its_partial_was_applied_and_the_reducer_refuses_it(fleet):
    """After the reducer acknowledged a partial, the shard no longer remembers its pairs: an agent's resend
    (e.g. to a restarted reducer that lost it) is taken in again — and a reducer that does have it refuses
    the repeat, so it is counted once."""
    cfg = pof_cfg()
    names = ["a", "b"]
    shard, red = ShardCore(cfg, "s0", names, mode="async"), ReducerCore(cfg, names, mode="async", window=60.0)
    up = first_update(fleet, cfg, "async")
    payload = encode(up, cfg)

    def deliver(parts):
        for p in parts:
            for ack in red.on_partial("s0", encode(p, cfg), now=0.0):
                if ack.kind == "partial.ack":
                    deliver(shard.on_ack(decode(encode(ack, cfg), cfg, client="s0", kinds=("partial.ack",))))

    shard.on_update("a", payload, now=0.0)
    shard.on_update("a", payload, now=0.0)  # a duplicate while held: the shard drops it itself
    assert shard.rejected == {"stale_seq": 1}
    deliver(shard.flush(now=0.0))
    assert red.accepted == 1 and shard.held == 0
    shard.on_update("a", payload, now=1.0)  # the resend: taken in again ...
    assert shard.held == 1
    deliver(shard.flush(now=1.0))
    assert red.accepted == 1 and red.rejected.get("duplicate") == 1 and shard.held == 0  # ... and refused once


def test_shard_sends_an_unacknowledged_partial_again(fleet):
    cfg = pof_cfg()
    shard = ShardCore(cfg, "s0", ["a"], mode="async", resend_after=5.0)
    up = first_update(fleet, cfg, "async")
    shard.on_update("a", encode(up, cfg), now=0.0)
    (first,) = shard.flush(now=0.0)
    assert shard.flush(now=4.9) == []
    (again,) = shard.flush(now=5.0)  # no acknowledgement came: the same partial (same seq) again
    assert again.seq == first.seq and np.array_equal(again.arrays["sum"], first.arrays["sum"])
    red = ReducerCore(cfg, ["a"], mode="async", window=60.0)
    acks = red.on_partial("s0", encode(first, cfg), now=0.0) + red.on_partial("s0", encode(again, cfg), now=0.0)
    assert [a.meta["applied"] for a in acks] == [True, True] and red.accepted == 1


def personal_cfg():
    return FleetConfig(standardise="none",
                       fleet="t", algorithm="fedbnr-personal", n_inputs=10, n_features=15, kernels=["gaussian:1.0"],
                       params={"min_upload": 8, "fit_hyperparameters": False})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_shards=st.integers(1, 3), seed=st.integers(0, 2**16), dup_rate=st.sampled_from([0.0, 0.4]))
def test_sharded_personal_fedbnr_equals_single_aggregator(fleet, n_shards, seed, dup_rate):
    """Personalised FedBNR keeps statistics per client, so a partial carries per-client sums (each client's
    uploads in it, time-weighted to the latest); the reducer's per-client statistics, `included` and shared
    posterior equal the single aggregator's."""
    single, sharded, n_msgs = run_fedbnr(fleet, n_shards, seed, dup_rate, cfg=personal_cfg())
    red = sharded.reducer
    a, b = red.aggregation.server, single.aggregation.server
    assert red.accepted == single.counters.accepted == n_msgs
    assert dict(a.included) == dict(b.included) and sorted(a.clients) == sorted(b.clients)
    for c, (st_b, t_b) in b.clients.items():
        st_a, t_a = a.clients[c]
        assert t_a == t_b and st_a.n == st_b.n
        np.testing.assert_allclose(st_a.S, st_b.S, rtol=1e-12, atol=1e-12 * np.abs(st_b.S).max())
        np.testing.assert_allclose(st_a.b, st_b.b, rtol=1e-12, atol=1e-12 * np.abs(st_b.b).max())
    ga, gb = red.global_message(), single.global_message()
    for k in ("A_upper", "h"):
        np.testing.assert_allclose(ga.arrays[k], gb.arrays[k], rtol=1e-10, atol=1e-12)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_shards=st.integers(2, 3), seed=st.integers(0, 2**16))
def test_sharded_tau_mixture_equals_single_aggregator(fleet, n_shards, seed):
    """The τ-mixture's per-client statistics travel through shards like a single model's; every τ's shared
    posterior equals the single aggregator's."""
    cfg = FleetConfig(standardise="none",
                      fleet="t", algorithm="fedbnr-personal", n_inputs=10, n_features=15, kernels=["gaussian:1.0"],
                      params={"min_upload": 8, "fit_hyperparameters": False, "tau_grid": [0.1, 1.0]})
    single, sharded, n_msgs = run_fedbnr(fleet, n_shards, seed, 0.3, cfg=cfg)
    ga, gb = sharded.reducer.global_message(), single.global_message()
    assert ga.arrays["A_upper"].shape[0] == 2 and ga.included == gb.included
    for k in ("A_upper", "h"):
        np.testing.assert_allclose(ga.arrays[k], gb.arrays[k], rtol=1e-10, atol=1e-12)
