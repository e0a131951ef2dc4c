"""Issue 15, parts 1–2, for the algorithms that federate network weights: URK-FedBNR (phase-1 proposals,
phase-2 statistics) and pFedGP (the shared deep kernel). Declared bounds (always on), robust aggregation
(`[fleet.robust] aggregation = "robust"`), and the figure: a small URK fleet with attackers sending the
largest proposal the bound allows, in the worst direction (docs/algorithms.md §9.4, §10.3)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed import algorithms
from streamfed.algorithms.chunks import split_vector
from streamfed.algorithms.pfedgp.messages import ChunkItem as PChunk
from streamfed.algorithms.shares import share_allowance
from streamfed.algorithms.urk.network import features
from streamfed.algorithms.urk.robust_proposals import RobustProposals, adam_reach, robust_delta
from streamfed.algorithms.urk.wire import chunk_update, stats_update
from streamfed.core.stats import SufficientStats
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.fleet.sources import Reading
from streamfed.wire.message import Message, decode, encode

torch = pytest.importorskip("torch")

URK = algorithms.get("urk-fedbnr")
PFEDGP = algorithms.get("pfedgp")
LB = 3.0  # label bound of these fleets (the synthetic labels stay within ±2)


def urk_cfg(names=("a", "b"), mode="exact", robust=None, **params):
    p = {"widths": [4], "n_omega": 8, "min_upload": 16, "reservoir": 64, "fit_every": 32, "fit_steps": 5,
         "learning_rate": 0.02, "min_proposal_weight": 64, "max_chunk_bytes": 512, **params}
    return FleetConfig(fleet="t", algorithm="urk-fedbnr", n_inputs=2, standardise="none", clients=list(names),
                       robust=Robustness(aggregation=mode, label_bound=LB, **(robust or {})), params=p)


def pfedgp_cfg(mode="exact", **params):
    p = {"n_classes": 3, "widths": [3], "n_omega": 4, "min_proposal_weight": 1.0, "proposal_quorum": 1.0,
         "budget": 8, "fit_steps": 4, "learning_rate": 0.01, **params}
    return FleetConfig(fleet="t", algorithm="pfedgp", n_inputs=2, robust=Robustness(aggregation=mode), params=p)


def message(cfg, client, up, seq=None):
    return Message(cfg.fleet, client, cfg.update_kind, int(up.seq if seq is None else seq), int(up.global_version),
                   cfg.kernel_version, int(up.n_samples), 0.0, dict(up.arrays), epoch=int(up.epoch))


def proposal_messages(cfg, client, delta, weight, first_seq, epoch, proposal=1, base_version=0):
    """A whole proposal as chunk messages, numbered from `first_seq`."""
    parts = split_vector(proposal, delta, cfg.params.max_chunk_bytes // 8)
    return [message(cfg, client, chunk_update(c, weight, first_seq + i, base_version, epoch))
            for i, c in enumerate(parts)]


# ------------------------------------------------------------------ the Adam bound


def a_t_oracle(t, b1=0.9, b2=0.999):
    """A_t straight from its definition: the largest |m̂_t|/√v̂_t, attained by g_i = (β₁/β₂)^{t−i}."""
    g = np.array([(b1 / b2) ** (t - i) for i in range(1, t + 1)])
    m = (1 - b1) * sum(b1 ** (t - i) * g[i - 1] for i in range(1, t + 1)) / (1 - b1**t)
    v = (1 - b2) * sum(b2 ** (t - i) * g[i - 1] ** 2 for i in range(1, t + 1)) / (1 - b2**t)
    return m / math.sqrt(v)


def test_adam_reach_is_the_sum_of_the_per_step_maxima():
    for s in (1, 2, 5, 10, 30):
        assert adam_reach(s) == pytest.approx(sum(a_t_oracle(t) for t in range(1, s + 1)), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 25), lr=st.floats(1e-4, 1.0), seed=st.integers(0, 2**31),
       log_scale=st.floats(-8.0, 8.0))
def test_torch_adam_never_moves_a_weight_beyond_the_reach(steps, lr, seed, log_scale):
    """Whatever the gradients (any signs, magnitudes over 16 orders, the adversarial sequence that attains A_t at
    the last step), torch.optim.Adam with its defaults moves no coordinate further than lr · adam_reach(steps)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((steps, 6)) * 10.0 ** rng.uniform(-8, 8, (steps, 6)) * 10.0**log_scale
    g[:, 0] = [(0.9 / 0.999) ** (steps - i) for i in range(1, steps + 1)]  # the worst case for the last step
    g[:, 1] = 1.0  # a constant gradient: exactly lr per step
    v = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([v], lr=lr)
    for i in range(steps):
        opt.zero_grad()
        v.grad = torch.tensor(g[i])
        opt.step()
    moved = np.abs(v.detach().numpy())
    assert np.all(moved <= lr * adam_reach(steps) * (1 + 1e-9))
    assert moved[1] == pytest.approx(lr * steps, rel=1e-6)


# ------------------------------------------------------------------ reproduce: a huge proposal today


def toy(n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(shift, 1.0, (n, 2))
    y = np.clip(np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n), -2, 2)
    return X, y


class Fleet:
    """Real URK agents and the real aggregator core through the codec, one reading per client per step.
    `attack(fleet, name, t)` returns the messages attacker `name` sends at step t (None: it is silent)."""

    def __init__(self, n_clients, n_attackers=0, mode="exact", attack=None, steps=320, seed=0, robust=None,
                 **params):
        self.names = [f"c{i:02d}" for i in range(n_clients)]
        self.attackers = set(self.names[:n_attackers])
        self.cfg = urk_cfg(self.names, mode, robust, **params)
        self.core = AggregatorCore(self.cfg, clients=self.names, mode="async", window=0.0)
        self.agents = {n: AgentCore(self.cfg, n, i) for i, n in enumerate(self.names) if n not in self.attackers}
        self.data = {n: toy(steps, seed * 100 + i, shift=0.3 * (i % 3)) for i, n in enumerate(self.names)}
        self.attack, self.steps = attack, steps
        self.seq = dict.fromkeys(self.names, 0)
        self.sent = dict.fromkeys(self.names, 0)

    def deliver(self, msgs, now):
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            payload = encode(m, self.cfg)
            if m.kind.endswith(".update"):
                queue += self.core.on_update(m.client, payload, now=now)
            elif m.kind.endswith(".global"):
                for a in self.agents.values():
                    a.on_global(decode(payload, self.cfg, kernel_version=a.kernel_version), now=now)

    def run(self):
        for t in range(self.steps):
            now = float(t)
            msgs = []
            for n in self.names:
                if n in self.attackers:
                    if self.attack is not None:
                        msgs += self.attack(self, n, t)
                    continue
                X, y = self.data[n]
                msgs += self.agents[n].on_reading(Reading(f"{t}", X[t], now, float(y[t])), now=now)[1]
            self.deliver(msgs, now)
        return self

    def mse(self):
        return {n: a.counters.sq_loss / a.counters.learned for n, a in self.agents.items()}


def huge(value=1e3):
    """The attack of the issue, on network weights: one proposal of `value` in every network coordinate (logs
    left alone, so the server's own log-range check does not catch it), at a full reservoir's weight, at once
    and again at every new version."""

    def attack(fleet, name, t):
        server = fleet.core.aggregation.server
        if fleet.sent[name] == server.epoch + 1:
            return []
        fleet.sent[name] = server.epoch + 1
        delta = np.full(server.theta.size, value)
        delta[list(_clamped(fleet.cfg))] = 0.0
        msgs = proposal_messages(fleet.cfg, name, delta, float(fleet.cfg.params.reservoir), fleet.seq[name] + 1,
                                 server.epoch, proposal=server.epoch + 1, base_version=fleet.core.version)
        fleet.seq[name] += len(msgs)
        return msgs

    return attack


def _clamped(cfg):
    from streamfed.algorithms.urk import _clamped as clamped_of
    from streamfed.algorithms.urk import arch_of

    return clamped_of(arch_of(cfg))


@pytest.fixture(scope="module")
def calm6():
    return Fleet(6, 1).run()  # the attack-free run: the attacker's seat is silent


def test_one_huge_network_proposal_leaves_every_honest_client_where_it_was(calm6):
    """Fails on the old code: the proposal (1e3 per weight, within max_abs) is accepted, averaged into the
    network, and every client's features become noise (measured there: every honest MSE 0.04–0.09 → 0.97–1.05;
    the attacker alone met the proposal quorum, 320 versions in 320 steps, every honest statistic void)."""
    hit = Fleet(6, 1, attack=huge()).run()
    calm, bad = calm6.mse(), hit.mse()
    print("huge proposal: honest MSE", {n: (round(calm[n], 4), round(bad[n], 4)) for n in calm},
          hit.core.rejected, hit.core.aggregation.diagnostics())
    assert hit.core.rejected.get("invalid_update", 0) >= 1
    assert hit.core.aggregation.server.epoch >= 2  # honest proposals still move the network
    assert all(bad[n] <= 1.02 * calm[n] for n in calm)


def test_honest_urk_fleet_is_never_refused(calm6):
    """Real local training (torch Adam on the evidence), real statistics: nothing an honest agent sends is
    refused by the declared bounds, and the network moves."""
    assert calm6.core.rejected == {}
    assert calm6.core.aggregation.server.epoch >= 2


# ------------------------------------------------------------------ URK phase-2 statistics


def urk_stats_msg(cfg, agg, X, y, *, n=None, n_samples=None, client="a", seq=1):
    phi = features(agg.server.weights, agg.server.omega, X)
    st_ = SufficientStats.from_samples(phi[:, None, :], y, kernel_version=cfg.kernel_version)
    if n is not None:
        st_ = SufficientStats(st_.S, st_.b, float(n), st_.q, st_.kernel_version, 0)
    msg = message(cfg, client, stats_update(st_, seq, 0, 0))
    if n_samples is not None:
        msg = Message(msg.fleet, msg.client, msg.kind, msg.seq, msg.global_version, msg.kernel_version, n_samples,
                      0.0, msg.arrays, epoch=msg.epoch)
    return msg


def test_urk_statistics_claiming_2_53_samples_or_big_labels_are_refused():
    """Fails on the old code (it checked only tr S <= n‖φ‖²: claiming more samples passed)."""
    cfg = urk_cfg()
    agg = URK.aggregation(cfg)
    X, y = toy(20, 1)
    agg.check(urk_stats_msg(cfg, agg, X, y))  # honest: passes
    with pytest.raises(ValueError, match="claims more samples"):
        agg.check(urk_stats_msg(cfg, agg, X, y, n=2.0**53))
    with pytest.raises(ValueError, match="label bound"):
        agg.check(urk_stats_msg(cfg, agg, X, np.full(20, 10 * LB)))
    with pytest.raises(ValueError, match="n_samples"):
        agg.check(urk_stats_msg(cfg, agg, X, y, n_samples=19))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(16, 200), seed=st.integers(0, 2**31), at_bound=st.booleans())
def test_honest_urk_statistics_always_pass(n, seed, at_bound):
    cfg = urk_cfg()
    agg = URK.aggregation(cfg)
    rng = np.random.default_rng(seed)
    X = rng.normal(0, 3, (n, 2))
    y = np.full(n, LB) * rng.choice([-1.0, 1.0], n) if at_bound else rng.uniform(-LB, LB, n)
    agg.check(urk_stats_msg(cfg, agg, X, y))


# ------------------------------------------------------------------ proposals: bounds hold for real training


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lr=st.sampled_from([1e-3, 0.01, 0.1, 1.0]), steps=st.integers(1, 12), seed=st.integers(0, 1000),
       ls=st.sampled_from([None, 1e-4, 5e3]))
def test_real_urk_local_fits_pass_the_bound(lr, steps, seed, ls):
    """A URK client's real local fit (including learning rates that slam σ, λ, ℓ against the clamp, and a
    configured lengthscale outside the clamp's range) is within the declared bound, chunk by chunk."""
    from streamfed.algorithms.urk.training import fit_local

    cfg = urk_cfg(learning_rate=lr, fit_steps=steps, lengthscale=ls)
    agg = URK.aggregation(cfg)
    w = agg.server.weights
    X, y = toy(64, seed)
    new = fit_local(w, agg.server.omega, X, y, steps=steps, learning_rate=lr)
    if new is None:
        return
    delta = new.to_vector() - w.to_vector()
    for m in proposal_messages(cfg, "a", delta, 64.0, 1, 0):
        agg.check(m)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lr=st.sampled_from([1e-3, 0.05, 1.0]), steps=st.integers(1, 6), seed=st.integers(0, 1000),
       head=st.sampled_from(["gp", "softmax"]), inducing=st.sampled_from([0, 3]))
def test_real_pfedgp_local_updates_pass_the_bound(lr, steps, seed, head, inducing):
    cfg = pfedgp_cfg(learning_rate=lr, fit_steps=steps, head=head, inducing=inducing if head == "gp" else 0)
    agg = PFEDGP.aggregation(cfg)
    client = PFEDGP.learner(cfg, "a", 0).client
    rng = np.random.default_rng(seed)
    for t in range(24):
        c = t % 3
        client.budget.add(rng.normal(c - 1.0, 0.5, 2), c)
    assert client.fit()
    for up in list(client.queue):
        agg.check(message(cfg, "a", up, seq=1))


def test_pfedgp_huge_or_overweight_proposals_are_refused():
    """Fails on the old code: a chunk of 1e5 per weight (within the server's ±1e6) and a weight of 1e9 passed."""
    cfg = pfedgp_cfg()
    agg = PFEDGP.aggregation(cfg)
    theta = agg.server.theta
    with pytest.raises(ValueError, match="declared bound"):
        agg.check(proposal_messages(cfg, "evil", np.full(theta.size, 1e5), 8.0, 1, 0)[0])
    with pytest.raises(ValueError, match="weight"):
        agg.check(proposal_messages(cfg, "evil", np.zeros(theta.size), 1e9, 1, 0)[0])
    agg.check(proposal_messages(cfg, "a", np.full(theta.size, 0.9 * agg.bound.reach), 24.0, 1, 0)[0])


# ------------------------------------------------------------------ robust rule against a transcription


def robust_oracle(rows, trim, clip_factor):
    """Plain transcription: norms, τ = clip_factor × median, each row scaled by min(1, τ/‖r‖), then per
    coordinate sorted, k = min(⌊trim·n⌋, ⌊(n−1)/2⌋) dropped off each end, the rest averaged."""
    n = len(rows)
    norms = [math.sqrt(sum(v * v for v in r)) for r in rows]
    tau = clip_factor * float(np.median(norms))
    clipped = [[v * min(1.0, tau / nr) if nr > 0 else v for v in r] for r, nr in zip(rows, norms, strict=True)]
    k = min(int(math.floor(trim * n)), (n - 1) // 2)
    out = []
    for j in range(len(rows[0])):
        col = sorted(r[j] for r in clipped)
        kept = col[k:n - k]
        out.append(sum(kept) / len(kept))
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 7), trim=st.floats(0.0, 0.5), clip=st.floats(1.0, 5.0),
       seed=st.integers(0, 2**31))
def test_robust_delta_equals_the_plain_transcription(n, d, trim, clip, seed):
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-3, 3, (n, 1))
    got = robust_delta(rows, RobustProposals(trim, clip))
    assert np.allclose(got, robust_oracle(rows.tolist(), trim, clip), rtol=1e-12, atol=1e-15)


def test_robust_servers_take_one_clipped_trimmed_row_per_client():
    """URK and pFedGP in robust mode: θ + the transcription over one row per client (a client proposing twice
    counts once, with the mean of its two); exact mode: the weighted mean of every proposal, as before."""
    rng = np.random.default_rng(3)
    for alg, cfg_of in ((URK, lambda m: urk_cfg(("a", "b", "c", "d"), m, min_proposal_weight=1, proposal_quorum=1.0)),
                        (PFEDGP, lambda m: pfedgp_cfg(m))):
        for mode in ("exact", "robust"):
            cfg = cfg_of(mode)
            agg = alg.aggregation(cfg)
            theta0 = agg.server.theta.copy()
            reach = agg.bound.reach
            deltas = {c: rng.uniform(-reach, reach, theta0.size) for c in "abcd"}
            deltas["d2"] = rng.uniform(-reach, reach, theta0.size)
            if alg is URK:
                for d in deltas.values():
                    d[list(_clamped(cfg))] = 0.0
            seqs = dict.fromkeys("abcd", 0)
            for key, w in (("a", 10.0), ("b", 20.0), ("c", 24.0), ("d", 16.0), ("d2", 8.0)):
                c = key[0]
                for m in proposal_messages(cfg, c, deltas[key], w, seqs[c] + 1, 0, proposal=len(key)):
                    seqs[c] += 1
                    agg.take(c, m.seq, agg.check(m))
            assert agg.close_window({}, lambda c: 0) and agg.server.epoch == 1
            if mode == "exact":
                ws = {"a": 10.0, "b": 20.0, "c": 24.0, "d": 16.0, "d2": 8.0}
                want = theta0 + sum(ws[k] * deltas[k] for k in ws) / sum(ws.values())
                assert np.allclose(agg.server.theta, want, rtol=0, atol=1e-14)
            else:
                rows = [deltas["a"], deltas["b"], deltas["c"], (deltas["d"] + deltas["d2"]) / 2]
                want = theta0 + np.array(robust_oracle([r.tolist() for r in rows], 0.25, 2.0))
                assert np.allclose(agg.server.theta, want, rtol=0, atol=1e-14)


def test_robust_urk_distillation_aims_at_the_trimmed_gram_matrices():
    """Distillation in robust mode starts from the robust mean and targets the entrywise trimmed mean of the
    clients' Gram matrices (one hostile client cannot set the target); trim = None is the old mean."""
    from streamfed.algorithms.urk.training import distill

    cfg = urk_cfg()
    agg = URK.aggregation(cfg)
    w0, om = agg.server.weights, agg.server.omega
    X = toy(10, 2)[0]
    same = distill(w0, [w0, w0, w0], om, X, toy(10, 2)[1], steps=2, trim=0.25)
    plain = distill(w0, [w0, w0, w0], om, X, toy(10, 2)[1], steps=2)
    assert same is not None and plain is not None
    assert np.allclose(same.to_vector(), plain.to_vector(), rtol=0, atol=1e-12)


def test_urk_share_cap_holds_a_flooding_client():
    """Robust mode: one client's statistics are held to share_cap of the version's samples (floor: 4 ×
    min_upload); exact mode sums everything."""
    for mode in ("exact", "robust"):
        cfg = urk_cfg(("a", "b", "c", "d"), mode)
        agg = URK.aggregation(cfg)
        seq = dict.fromkeys("abcd", 0)
        for i in range(40):
            c = "a" if i % 4 else "bcd"[(i // 4) % 3]  # a sends three uploads for each of the others' one
            X, y = toy(32, i)
            seq[c] += 1
            agg.take(c, seq[c], agg.check(urk_stats_msg(cfg, agg, X, y, client=c, seq=seq[c])))
        shares = agg.client_shares()
        if mode == "exact":
            assert shares == {} and agg.server.stats.n == 40 * 32
        else:
            assert max(shares.values()) <= max(0.25, 64 / (agg.server.stats.n)) + 1e-12
            assert shares["a"] == max(shares.values()) and agg.server.tempered > 0
            # the cap's arithmetic is FedBNR's (imported, not copied)
            assert share_allowance(0.0, 0.0, 0.25, 64.0) == 64.0


def test_robust_is_refused_for_shards_and_the_reducer():
    for alg, cfg in ((URK, urk_cfg(mode="robust")), (PFEDGP, pfedgp_cfg("robust"))):
        agg = alg.aggregation(cfg)
        for role in ("shard", "reducer"):
            with pytest.raises(ValueError, match="partial sums"):
                agg.for_partials(role)
        with pytest.raises(ValueError, match="partial sums"):
            agg.partial([])
        alg.aggregation(urk_cfg() if alg is URK else pfedgp_cfg()).for_partials("shard")  # exact: fine


def test_state_pickles_with_bounds_and_robust_settings():
    for alg, cfg in ((URK, urk_cfg(mode="robust")), (PFEDGP, pfedgp_cfg("robust"))):
        agg = pickle.loads(pickle.dumps(alg.aggregation(cfg)))
        assert agg.bound is not None and agg.server.robust == RobustProposals(0.25, 2.0)


def test_pfedgp_chunk_of_an_older_version_is_not_bounded_but_not_used():
    cfg = pfedgp_cfg()
    agg = PFEDGP.aggregation(cfg)
    theta = agg.server.theta
    for m in proposal_messages(cfg, "a", np.full(theta.size, 0.5 * agg.bound.reach), 8.0, 1, 0):
        agg.take("a", m.seq, agg.check(m))
    agg.close_window({}, lambda c: 0)
    assert agg.server.epoch == 1
    old = PChunk("b", 1, 0, 0, split_vector(1, np.full(theta.size, 1.0), 512)[0], 8.0)
    agg.take("b", 1, old)
    assert agg.server.stale_chunks == 1


# ------------------------------------------------------------------ the figure


def worst(fleet_scale=1.0):
    """Every attacker sends, once per version, the largest proposal the bound allows in the worst direction
    for the features: every MLP weight grown by the reach in its own sign (larger f(x)), every log-lengthscale
    lowered by it (shorter ℓ) — both raise the features' frequency, towards noise — and log σ, log λ pushed
    down, at a full reservoir's weight."""

    def attack(fleet, name, t):
        server = fleet.core.aggregation.server
        if fleet.sent[name] == server.epoch + 1 or t < 20:
            return []
        fleet.sent[name] = server.epoch + 1
        reach = fleet.core.aggregation.bound.reach * fleet_scale
        sign = np.sign(server.theta)
        sign[sign == 0] = 1.0
        delta = reach * sign
        delta[list(_clamped(fleet.cfg))] = -reach
        msgs = proposal_messages(fleet.cfg, name, delta, float(fleet.cfg.params.reservoir), fleet.seq[name] + 1,
                                 server.epoch, proposal=server.epoch + 1, base_version=fleet.core.version)
        fleet.seq[name] += len(msgs)
        return msgs

    return attack


# carry=False: statistics restart from the reservoirs at each version — what URK does by default in robust mode
# (URKParams.carry None). With them carried (the default in exact mode since issue 34) the robust figure's worst
# honest MSE ratio with 3 of 10 attackers is 1.19, not <= 1.10 (the mean honest MSE still falls under attack,
# 0.0862 → 0.0817): a version pushed by the attackers leaves its loss in the statistics carried through it
# (docs/results.md, "URK-FedBNR against fixed RFF")
FIG = {"n_clients": 10, "steps": 256, "carry": False}
# k hostile clients propose first after every new version: a version must wait for enough honest proposers that
# they outnumber them — the default quorum (0.5: 5 of 10) for one, 0.8 (8 of 10) for three (at 0.5, three
# attackers are 3 of the 5 proposals a version needs: measured worst honest MSE ratio 1.40 over 256 steps,
# 2.0 over 320; docs/algorithms.md §10.3)
QUORUM = {1: 0.5, 3: 0.8}


@pytest.fixture(scope="module")
def figure():
    out = {}
    for mode in ("exact", "robust"):
        for k in (1, 3):
            q = QUORUM[k] if mode == "robust" else 0.5
            calm = Fleet(FIG["n_clients"], k, mode, steps=FIG["steps"], proposal_quorum=q, carry=FIG["carry"]).run()
            hit = Fleet(FIG["n_clients"], k, mode, attack=worst(), steps=FIG["steps"], proposal_quorum=q,
                        carry=FIG["carry"]).run()
            out[mode, k] = (calm, hit)
    return out


def _ratio(calm, hit):
    c, h = calm.mse(), hit.mse()
    return max(h[n] / c[n] for n in c), float(np.mean(list(c.values()))), float(np.mean(list(h.values())))


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("k", [1, 3])
def test_figure_robust_mode_keeps_every_honest_mse_within_10_percent(figure, k):
    calm, hit = figure["robust", k]
    w, mc, mh = _ratio(calm, hit)
    print(f"robust, {k} of {FIG['n_clients']} attackers: worst honest MSE ratio {w:.4f}, mean {mc:.5f} → {mh:.5f}, "
          f"epochs {calm.core.aggregation.server.epoch}/{hit.core.aggregation.server.epoch}, rejected "
          f"{hit.core.rejected}")
    assert hit.core.rejected == {}  # the attack is protocol-valid: within the declared bound
    # the attackers cannot call versions: the clients heard in the version before count towards the quorum
    assert 2 <= hit.core.aggregation.server.epoch <= calm.core.aggregation.server.epoch + 1
    assert w <= 1.10


@pytest.mark.slow  # its module fixture runs the whole figure (over 2 s): outside the pure tier
def test_figure_exact_mode_damage_is_bounded_by_the_reach(figure):
    """Exact mode: FedAvg of proposals each within the reach is within the reach, so a version moves no
    coordinate further than one honest fit could, and the attackers cannot call versions; the damage is
    measured and stated, not removed (measured over 256 steps: worst honest MSE ratio 1.09 with one attacker,
    1.32 with three; 1.22 and 1.79 over 320 steps. Before the quorum counted the version before, the attackers
    called a version at will: 78 instead of 10 over 320 steps, ratio 19)."""
    for k in (1, 3):
        calm, hit = figure["exact", k]
        w, mc, mh = _ratio(calm, hit)
        print(f"exact, {k} of {FIG['n_clients']} attackers: worst honest MSE ratio {w:.4f}, mean {mc:.5f} → {mh:.5f}")
        assert hit.core.rejected == {}
        assert hit.core.aggregation.server.epoch <= calm.core.aggregation.server.epoch + 1
        assert w <= 2.5  # stated in docs/reliability.md; a regression guard, not a promise
        server = hit.core.aggregation.server
        theta0 = URK.aggregation(hit.cfg).server.theta
        # every version moved each coordinate at most reach (+ the clamp's distance: none here)
        assert np.all(np.abs(server.theta - theta0) <= server.epoch * hit.core.aggregation.bound.reach * (1 + 1e-9))


def test_noised_uploads_are_not_bounded_per_step():
    """Differential privacy noises every floating array of a chunk (its weight too): the core passes
    check_stats=False, and neither algorithm then applies the Adam bound (the privacy layer's clipping is it)."""
    assert URK.aggregation(urk_cfg(), check_stats=False).bound is None
    assert PFEDGP.aggregation(pfedgp_cfg(), check_stats=False).bound is None
    assert URK.aggregation(urk_cfg()).bound is not None and PFEDGP.aggregation(pfedgp_cfg()).bound is not None
