"""Issue 15 for POF-MKL: a declared bound on every update (always on) and robust aggregation (an option).

* The issue's attack — four ±1e100 updates from one authenticated agent — must leave every honest client's
  MSE where it was (it went from ~0.004 to ~1e197).
* No honest client is ever refused: property test over honest learners (lock-step and error feedback) with
  hostile-but-honest hyperparameters and labels at the bound; in-process and Mosquitto fleets.
* The robust rule equals a plain-Python transcription of docs/algorithms.md §3.9 (§10.1 per kernel).
* The figure: 12 Beijing stations, lock-step through the real AggregatorCore; attackers send the largest
  update the bound allows, in the most harmful direction we found.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed import algorithms
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.aggregation import ROBUST_SHARDED, POFMKLAggregation, RobustRule, StepBound
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.wire import update_message
from streamfed.algorithms.robust_mean import row_norms
from streamfed.core import durable
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.fleet.sharding import ReducerCore, ShardCore
from streamfed.fleet.sources import Reading
from streamfed.wire.message import decode, encode

ALG = algorithms.get("pofmkl")
STEPS = 300  # the figure's rounds (12 stations, hourly readings: 12.5 days)


@pytest.fixture(scope="module")
def stations():
    return load_beijing(normalisation="paper", split="station", steps=STEPS).streams


def fig_cfg(aggregation="exact", **robust):
    """The figure's fleet: 12 stations, 8 kernels, one per upload, the federated η of docs/results.md."""
    return FleetConfig(fleet="fig", algorithm="pofmkl", n_inputs=10, n_kernels=8, n_features=20, bin_size=1,
                       seed=7, standardise="none", pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2),
                       robust=Robustness(aggregation=aggregation, **robust))


# =========================================================================== the lock-step harness


class Fleet:
    """Lock-step POF-MKL through the real AggregatorCore and codec: honest learners step on their stations;
    attackers (the last `n_attackers` clients) send `attack(round, honest updates, core)` instead. A round
    whose attacker was refused closes on the honest quorum after its timeout."""

    def __init__(self, cfg, streams, n_attackers=0, attack=None):
        self.cfg, self.streams = cfg, streams
        self.names = [s.name for s in streams]
        self.n_honest = len(streams) - n_attackers
        self.learners = [ALG.learner(cfg, n, i, "lockstep") for i, n in enumerate(self.names)]
        self.core = AggregatorCore(cfg, clients=self.names, mode="lockstep", quorum=self.n_honest,
                                   round_timeout=1.0)
        self.attack = attack
        self.sq = np.zeros((self.n_honest, 0)).tolist()
        self.sq = [[] for _ in range(self.n_honest)]
        self.refused_honest = 0
        self.max_theta = 0.0  # the largest ‖θ_p‖ any global had
        self.max_bound_radius = 0.0

    def send(self, c, seq, kernels, delta, now):
        msg = update_message(self.cfg.fleet, self.names[c], seq, kernels, delta, global_version=seq - 1,
                             kernel_version=self.core.kernel_version)
        return self.core.on_update(self.names[c], encode(msg, self.cfg), now=now)

    def run(self, steps):
        out = []
        for t in range(steps):
            now = 10.0 * t
            honest = []
            for c in range(self.n_honest):
                s = self.streams[c]
                yhat, _ = self.learners[c].learn(s.X[t], float(s.y[t]))
                self.sq[c].append((yhat - float(s.y[t])) ** 2)
                up = self.learners[c].take_update()
                honest.append(up)
            for c, up in enumerate(honest):
                before = self.core.rejected.get("invalid_update", 0)
                out += self.send(c, t + 1, up.arrays["kernels"], up.arrays["delta"], now)
                self.refused_honest += self.core.rejected.get("invalid_update", 0) - before
            for c in range(self.n_honest, len(self.names)):
                kernels, delta = self.attack(t + 1, honest, self.core)
                out += self.send(c, t + 1, kernels, delta, now)
            out += self.core.tick(now + 5.0)  # closes the round on the quorum if an attacker was refused
            assert self.core.version == t + 1, "a round did not close"
            self.broadcast(out)
            out = []
        return self

    def broadcast(self, out):
        globals_ = [m for m in out if m.kind == "pofmkl.global"]
        if not globals_:
            return
        msg = decode(encode(globals_[-1], self.cfg), self.cfg)
        theta = msg.arrays["theta"]
        self.max_theta = max(self.max_theta, float(row_norms(theta).max()))
        self.max_bound_radius = float(self.core.aggregation.radius.max())
        for learner in self.learners[: self.n_honest]:
            learner.install_global(msg)

    def mse(self):
        return np.array([np.mean(s) for s in self.sq])


def huge(value=1e100, rounds=4):
    """The issue's attacker: ±1e100 in every entry of one row, for `rounds` rounds, then zeros."""

    def attack(r, honest, core):
        dim = 2 * core.cfg.params.n_features
        if r > rounds:
            return np.array([0]), np.zeros((1, dim))
        return np.array([r % core.cfg.params.n_kernels]), np.full((1, dim), value * (-1) ** r)

    return attack


def _limit(core, p):
    """The largest row norm the core's bound lets one lock-step upload carry on kernel p (a hair below)."""
    agg = core.aggregation
    return float(agg.bound.per_step(agg.radius[[p]])[0]) * (1 - 1e-6)


def _busiest(honest, core):
    """The kernel most honest clients sent this round (ties: the largest ‖θ_p‖), and their mean row on it."""
    counts = {}
    for up in honest:
        for i, p in enumerate(up.arrays["kernels"].tolist()):
            counts.setdefault(p, []).append(up.arrays["delta"][i])
    theta = core.aggregation.server.theta
    p = max(counts, key=lambda k: (len(counts[k]), float(np.linalg.norm(theta[k]))))
    return p, np.mean(counts[p], axis=0)


def reverse(r, honest, core):
    """Largest allowed row against the honest mean on the busiest kernel: undoes (and reverses) the round."""
    p, mean = _busiest(honest, core)
    n = np.linalg.norm(mean)
    u = -mean / n if n > 0 else np.ones_like(mean) / math.sqrt(mean.size)
    return np.array([p]), (_limit(core, p) * u)[None, :]


def grow(r, honest, core):
    """Largest allowed row along −θ_p on the busiest kernel: θ_p grows each round, and the bound with it."""
    p, mean = _busiest(honest, core)
    th = core.aggregation.server.theta[p]
    n = np.linalg.norm(th)
    u = -th / n if n > 0 else -mean / max(np.linalg.norm(mean), 1e-300)
    return np.array([p]), (_limit(core, p) * u)[None, :]


def little(r, honest, core):
    """'A little is enough': per coordinate, the honest mean minus 3 standard deviations (inside the spread
    a trimmed mean keeps), on the busiest kernel, then clipped to the bound."""
    p, _ = _busiest(honest, core)
    rows = [up.arrays["delta"][i] for up in honest for i, k in enumerate(up.arrays["kernels"].tolist()) if k == p]
    rows = np.array(rows + [np.zeros_like(rows[0])] * (len(honest) - len(rows)))
    v = rows.mean(axis=0) - 3.0 * rows.std(axis=0)
    n = np.linalg.norm(v)
    lim = _limit(core, p)
    return np.array([p]), (v * min(1.0, lim / n) if n > 0 else v)[None, :]


ATTACKS = {"reverse": reverse, "grow": grow, "little": little}


# =========================================================================== part 1: the attack


def test_four_huge_updates_from_one_agent_leave_every_honest_mse_where_it_was(stations):
    """Issue 15 §1: four ±1e100 updates from one agent pushed every MSE from ~0.004 to ~1e197. Now each is
    refused by the declared bound (counted as invalid_update) and the honest fleet learns as without it."""
    streams = stations[:4]
    clean = Fleet(fig_cfg(), streams[:3]).run(60)
    hit = Fleet(fig_cfg(), streams, n_attackers=1, attack=huge()).run(60)
    assert np.all(hit.mse() <= 2.0 * clean.mse()), (hit.mse(), clean.mse())
    assert hit.core.rejected.get("invalid_update") == 4 and hit.refused_honest == 0


# =========================================================================== honest clients are never refused


@st.composite
def honest_setups(draw):
    n_kernels = draw(st.integers(1, 6))
    return dict(
        n_kernels=n_kernels, bin_size=draw(st.integers(1, n_kernels)), n_features=draw(st.integers(1, 6)),
        eta=draw(st.sampled_from([1e-4, 0.005, 0.3, 5.0, 1e3])), lam=draw(st.sampled_from([0.0, 1e-4, 0.5, 3.0])),
        xi=draw(st.sampled_from([0.0, 1e-3, 0.1, 1.0])), label_bound=draw(st.sampled_from([0.1, 1.0, 10.0])),
        mode=draw(st.sampled_from(["lockstep", "async"])), seed=draw(st.integers(0, 2**16)),
        every=draw(st.integers(1, 4)),  # async: an upload every `every` samples (error feedback carries rows)
        global_every=draw(st.integers(1, 5)),  # a global reaches the learners every few rounds (stale θ)
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(honest_setups())
def test_any_honest_learners_updates_pass_check(s):
    """Honest learners — labels anywhere within ±label_bound (mostly at it), inputs far out, any η, λ, ξ, N, M,
    lock-step or error feedback with uploads every few samples, globals arriving late — are never refused."""
    cfg = FleetConfig(fleet="h", algorithm="pofmkl", n_inputs=3, n_kernels=s["n_kernels"], bin_size=s["bin_size"],
                      n_features=s["n_features"], seed=s["seed"], standardise="none",
                      pofmkl=POFMKLParams(eta=s["eta"], lam=s["lam"], xi=s["xi"]),
                      robust=Robustness(label_bound=s["label_bound"]))
    rng = np.random.default_rng(s["seed"])
    agg = ALG.aggregation(cfg)
    learners = [ALG.learner(cfg, f"c{i}", i, s["mode"]) for i in range(3)]
    seqs = [0, 0, 0]
    B = s["label_bound"]
    for t in range(40):
        items = []
        for i, learner in enumerate(learners):
            y = float(rng.choice([B, -B, rng.uniform(-B, B)]))
            learner.learn(rng.normal(0, 3, 3), y)
            if s["mode"] == "async" and t % s["every"] != s["every"] - 1:
                continue
            ups = [learner.take_update()] if s["mode"] == "lockstep" else learner.flush()[:1]
            for up in [u for u in ups if u is not None]:
                seqs[i] += 1
                msg = update_message("h", f"c{i}", seqs[i], up.arrays["kernels"], up.arrays["delta"],
                                     global_version=up.global_version, kernel_version="k", n_samples=up.n_samples)
                items.append((f"c{i}", seqs[i], agg.check(msg)))  # raises if refused: the test fails
        if s["mode"] == "lockstep":
            agg.apply_round(t + 1, [(c, it) for c, _, it in items])
        else:
            for c, q, it in items:
                agg.take(c, q, it)
            agg.close_window({f"c{i}": i for i in range(3)}, lambda c: seqs[int(c[1:])])
        if t % s["global_every"] == 0:
            msg = agg.global_message("h", "aggregator", "k")
            for learner in learners:
                learner.install_global(msg)


def test_error_feedback_rows_are_allowed_every_step_since_they_last_left():
    """A row the agent held back for many uploads carries all those steps; a repeat of a seq gets its first
    allowance; an upload below a newer one that carried the row is allowed all the client's steps."""
    agg = POFMKLAggregation(2, 2, bound=StepBound(0.5, 1.0, 0.0))  # 1 per step at θ = 0

    def msg(seq, k, norm, n=1):
        return update_message("f", "a", seq, np.array([k]), np.array([[norm, 0.0]]), global_version=0,
                              kernel_version="k", n_samples=n)

    agg.check(msg(1, 0, 1.0))
    agg.check(msg(2, 0, 1.0))
    agg.check(msg(3, 0, 1.0, n=5))
    with pytest.raises(ValueError, match="beyond the declared bound"):
        agg.check(msg(4, 1, 8.5))  # kernel 1 never sent: 7 steps so far + 1 = 8 allowed
    agg.check(msg(4, 1, 8.0))
    agg.check(msg(4, 1, 8.0))  # a repeat: same allowance
    with pytest.raises(ValueError, match="sent again"):
        agg.check(msg(4, 1, 1.0, n=2))
    agg.check(msg(6, 0, 2.0))  # kernel 0 last in seq 3: the steps of 4 and 6
    agg.check(msg(5, 0, 10.0))  # below seq 6, which carried kernel 0: every step of the client (9 + 1)
    with pytest.raises(ValueError):
        agg.check(msg(7, 0, 2.5))  # kernel 0's mark is seq 6: the steps of 5 and 7 since


def test_honest_async_agents_with_worst_case_settings_are_never_refused(stations):
    """AgentCores in asynchronous mode (error feedback, uploads held while a window is outstanding) through the
    real codec and AggregatorCore: large η, ξ = 0 (the step at its cap), large λ, labels at the bound."""
    cfg = FleetConfig(fleet="w", algorithm="pofmkl", n_inputs=10, n_kernels=8, n_features=10, bin_size=2,
                      seed=1, standardise="none", pofmkl=POFMKLParams(eta=2.0, lam=0.5, xi=0.0),
                      robust=Robustness(label_bound=1.0))
    names = [s.name for s in stations[:4]]
    agents = {n: AgentCore(cfg, n, i, mode="async") for i, n in enumerate(names)}
    for i, a in enumerate(agents.values()):
        a.upload_every = i + 1  # uploads every 1..4 samples: rows carried forward for several steps
    core = AggregatorCore(cfg, clients=names, mode="async", window=3.0)
    rng = np.random.default_rng(0)
    for t in range(200):
        queue = []
        for (_n, a), s in zip(agents.items(), stations, strict=False):
            y = float(np.clip(s.y[t] * 4 - 1 + rng.choice([0, 5, -5]), -1, 1))  # labels mostly at ±1
            queue += a.on_reading(Reading(f"{t}", s.X[t], float(t), y), now=float(t))[1]
        replies = []
        for m in queue:
            replies += core.on_update(m.client, encode(m, cfg), now=float(t))
        replies += core.tick(now=float(t))
        for g in replies:
            d = decode(encode(g, cfg), cfg)
            if g.kind.endswith(".global"):
                for a in agents.values():
                    a.on_global(d, now=float(t))
            else:  # an ack naming missing seqs: the agent sends them again
                for m in agents[g.client].on_ack(d):
                    core.on_update(m.client, encode(m, cfg), now=float(t))
    assert core.version > 20 and core.aggregation.radius.max() > 0.1  # θ moved, so the bound grew
    assert core.rejected == {}, core.rejected


# =========================================================================== part 2: robust aggregation


def robust_oracle(theta, updates, n_clients, trim, clip_factor):
    """docs/algorithms.md §3.9 in plain Python: lists and the statistics module, no numpy."""
    norms = [math.sqrt(sum(v * v for v in row)) for _, ks, rows in updates for row in rows]
    tau = clip_factor * statistics.median(norms)
    clipped = {}
    for _c, ks, rows in updates:
        for p, row in zip(ks, rows, strict=True):
            nrm = math.sqrt(sum(v * v for v in row))
            s = tau / nrm if nrm > tau else 1.0
            clipped.setdefault(p, []).append([v * s for v in row])
    out = [list(r) for r in theta]
    for p, rows in clipped.items():
        m = len(rows)
        k = min(math.floor(trim * m), (m - 1) // 2)
        for j in range(len(theta[p])):
            kept = sorted(r[j] for r in rows)[k : m - k]
            out[p][j] = theta[p][j] - (sum(kept) / len(kept)) * m / n_clients
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(1, 4), st.sampled_from([0.0, 0.1, 0.25, 0.4, 0.5]),
       st.sampled_from([1.0, 2.0, 3.5]), st.integers(0, 2**16))
def test_robust_round_equals_the_plain_transcription(n_clients, n_kernels, dim, trim, clip_factor, seed):
    rng = np.random.default_rng(seed)
    agg = POFMKLAggregation(n_kernels, dim, robust=RobustRule(trim, clip_factor))
    agg.server.theta = rng.normal(size=(n_kernels, dim))
    theta0 = agg.server.theta.tolist()
    items = []
    for c in range(n_clients):
        ks = np.sort(rng.choice(n_kernels, rng.integers(1, n_kernels + 1), replace=False))
        d = rng.normal(size=(ks.size, dim)) * 10.0 ** rng.integers(-2, 3, size=(ks.size, 1))
        if rng.random() < 0.2:
            d[0] = 1e90  # a hostile row
        items.append((f"c{c}", KernelUpdate(ks, d)))
    ref = robust_oracle(theta0, [(c, u.kernels.tolist(), u.delta.tolist()) for c, u in items], n_clients, trim,
                        clip_factor)
    agg.apply_round(1, items)
    np.testing.assert_allclose(agg.server.theta, np.array(ref), rtol=1e-12, atol=1e-12 * max(1.0, np.abs(ref).max()))


def test_robust_without_trim_or_clipping_is_eq_10():
    """trim = 0 and rows within the clip: (|S_p|/|C|) × the mean over the senders is ΣΔ/|C| (eq. 10)."""
    ups = [("a", KernelUpdate(np.array([0]), np.array([[1.0, 2.0]]))),
           ("b", KernelUpdate(np.array([0, 1]), np.array([[1.1, 2.1], [0.9, -1.0]])))]
    exact, robust = POFMKLAggregation(2, 2), POFMKLAggregation(2, 2, robust=RobustRule(0.0, 100.0))
    exact.apply_round(1, ups)
    robust.apply_round(1, ups)
    np.testing.assert_allclose(robust.server.theta, exact.server.theta, rtol=1e-15)


def test_robust_async_window_combines_each_clients_merged_sum():
    agg = POFMKLAggregation(2, 1, robust=RobustRule(0.25, 2.0))
    for c, v in [("a", 1.0), ("a", 1.0), ("b", 1.5), ("c", 2.5), ("d", 1e6)]:
        agg.take(c, 1, KernelUpdate(np.array([0]), np.array([[v]])))
    agg.take("e", 1, KernelUpdate(np.array([1]), np.array([[0.0]])))  # reports, but not row 0
    agg.close_window({}, lambda c: 1)
    # merged row 0: a 2, b 1.5, c 2.5, d 1e6 (e: none) → clipped at 2 × median(2, 1.5, 2.5, 1e6, 0) = 4 →
    # sorted 1.5 2 2.5 4; trim ⌊0.25·4⌋ = 1 each side → mean(2, 2.5) = 2.25, × |S_0|/|C| = 4/5
    np.testing.assert_allclose(agg.server.theta, [[-1.8], [0.0]], rtol=1e-15)


def test_robust_is_refused_for_shards_and_the_reducer_and_exact_shards_still_work():
    cfg = fig_cfg("robust")
    for build in (lambda: ShardCore(cfg, "s0", clients=["a"]), lambda: ReducerCore(cfg, clients=["a"], shards=["s0"])):
        with pytest.raises(ValueError, match="single aggregator"):
            build()
    agg = ALG.aggregation(cfg)
    for role in ("shard", "reducer"):
        with pytest.raises(ValueError, match="cannot be computed from partial sums"):
            agg.for_partials(role)
    with pytest.raises(ValueError, match="partial sums"):
        agg.partial([])
    assert "single aggregator" in ROBUST_SHARDED
    ex = ALG.aggregation(fig_cfg())
    ex.for_partials("shard")  # exact: fine; a shard holds no θ and bounds nothing
    assert ex.role == "shard"


def test_state_keeps_its_bound_and_counts():
    agg = ALG.aggregation(fig_cfg("robust"))
    msg = update_message("fig", "a", 1, np.array([2]), np.full((1, 40), 0.01), global_version=0, kernel_version="k")
    agg.take("a", 1, agg.check(msg))
    agg.close_window({}, lambda c: 1)
    back = durable.decode(durable.encode(agg))
    assert back.bound == agg.bound and back.robust == agg.robust
    assert np.array_equal(back.radius, agg.radius) and back.steps["a"].total == 1
    assert back.server.theta.tobytes() == agg.server.theta.tobytes()


# =========================================================================== part 3: the figure


def _run(stations, aggregation, n_attackers=0, attack=None, steps=STEPS):
    f = Fleet(fig_cfg(aggregation), stations, n_attackers, attack).run(steps)
    assert f.refused_honest == 0
    return f


@pytest.fixture(scope="module")
def figure(stations):
    """Every run of the figure once (module-scoped: the assertions below share them)."""
    runs = {("exact", 0, ""): _run(stations, "exact"), ("robust", 0, ""): _run(stations, "robust")}
    for name, attack in ATTACKS.items():
        runs[("exact", 1, name)] = _run(stations, "exact", 1, attack)
        runs[("robust", 1, name)] = _run(stations, "robust", 1, attack)
        runs[("robust", 3, name)] = _run(stations, "robust", 3, attack)
    return runs


def _ratio(runs, mode, k, name):
    hit, clean = runs[(mode, k, name)].mse(), runs[(mode, 0, "")].mse()[: 12 - k]
    return hit / clean


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_figure_robust_mode_keeps_every_honest_mse_within_10_percent_of_one_attacker(figure):
    """Robust mode, 1 of 12 attackers (every attack we tried): every honest MSE within 10% of the attack-free
    robust run. 3 of 12 is NOT within 10% (measured up to 4.2×, the 'reverse' attack: three colluders on the
    busiest kernel are a large share of its senders); held here to 5× so a regression shows. Robust mode
    costs ~10% of MSE without any attacker."""
    worst = {}
    for k in (1, 3):
        for name in ATTACKS:
            worst[(k, name)] = float(_ratio(figure, "robust", k, name).max())
    assert max(v for (k, _), v in worst.items() if k == 1) <= 1.10, worst
    assert max(v for (k, _), v in worst.items() if k == 3) <= 5.0, worst
    cost = figure[("robust", 0, "")].mse().mean() / figure[("exact", 0, "")].mse().mean()
    assert cost <= 1.2, cost


@pytest.mark.slow  # its module fixture runs the whole figure (over 2 s): outside the pure tier
def test_figure_exact_mode_damage_is_bounded_by_the_declared_bound(figure):
    """Exact mode is not robust: the attacker's rows are held to the bound, not removed. θ stays within the
    configured radius the bound is computed from (issue 30: no attacker-published quantity raises it)."""
    damage = {name: float(_ratio(figure, "exact", 1, name).max()) for name in ATTACKS}
    assert damage["reverse"] > 100  # exact mode is not robust: the damage is real (measured ~3,900×) ...
    for name in ATTACKS:
        f = figure[("exact", 1, name)]
        agg = f.core.aggregation
        assert f.max_theta <= f.max_bound_radius * (1 + 1e-9)
        # and the radius is the configured one (B/√λ here), whatever the attacker sent: θ is projected onto it
        assert f.max_bound_radius == agg.bound.radius == ALG.Params(lam=1e-4).radius(agg.bound.label_bound)


def rule_comparison() -> list[tuple[str, dict[str, float], float]]:
    """docs/reliability.md §7.2: the worst honest MSE ratio with 3 of 12 attackers for three robust rules, and
    each rule's attack-free cost against exact mode (not a test: ~4 minutes)."""
    streams = load_beijing(normalisation="paper", split="station", steps=STEPS).streams

    def cfg(aggregation: str, bin_size: int, **robust: float) -> FleetConfig:
        c = fig_cfg(aggregation, **robust)
        return FleetConfig.model_validate(c.model_dump() | {"params": c.params.model_dump() | {"bin_size": bin_size}})

    out = []
    for title, m, robust in (("M = 1, trim 0.25, clip 2 (default)", 1, {}),
                             ("M = 1, median (trim 0.5), clip 1", 1, {"trim": 0.5, "clip_factor": 1.0}),
                             ("M = 8, trim 0.25, clip 2", 8, {})):
        exact = Fleet(cfg("exact", m), streams).run(STEPS).mse()
        clean = Fleet(cfg("robust", m, **robust), streams).run(STEPS).mse()
        worst = {name: float((Fleet(cfg("robust", m, **robust), streams, 3, attack).run(STEPS).mse()
                              / clean[:9]).max()) for name, attack in ATTACKS.items()}
        out.append((title, worst, float(clean.mean() / exact.mean())))
    return out


if __name__ == "__main__":
    for title, worst, cost in rule_comparison():
        print(f"| {title} | " + " | ".join(f"{worst[n]:.2f}" for n in ATTACKS) + f" | {cost - 1:+.0%} |")
