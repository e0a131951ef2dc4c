"""Agents and aggregator cores wired through the real codec (no broker): lock-step equals the replay,
FedBNR equals a centralised fit, async error feedback loses no update mass, bad input is counted."""

import dataclasses

import numpy as np
import pytest

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.learner import ErrorFeedback
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.server import POFMKLServer, run_lockstep
from streamfed.core import durable
from streamfed.core.features import RFFBank
from streamfed.evaluation.datasets import load_beijing
from streamfed.evaluation.replay import AlgorithmConfig, replay
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Label, Reading, Skip, SkipReason
from streamfed.wire.message import decode, encode

STEPS = 150


@pytest.fixture(scope="module")
def fleet():
    return load_beijing(normalisation="paper", split="station", steps=STEPS)


def pof_cfg(**kw):
    return FleetConfig(standardise="none",
                       fleet="t", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=20, bin_size=2,
                       seed=3, pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2), **kw)


def deliver(msgs, agg, agents, cfg):
    """Route encoded messages like a broker would: updates to the aggregator, globals to everyone."""
    queue = list(msgs)
    while queue:
        m = queue.pop(0)
        payload = encode(m, cfg)
        if m.kind.endswith(".update"):
            queue += agg.on_update(m.client, payload, now=0.0)
        elif m.kind.endswith(".global"):
            for a in agents:
                a.on_global(decode(payload, cfg, kernel_version=a.kernel_version), now=0.0)


def test_lockstep_over_the_codec_equals_replay(fleet):
    streams = fleet.streams[:4]
    cfg = pof_cfg()
    names = [s.name for s in streams]
    agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, mode="lockstep")
    for t in range(STEPS):
        msgs = []
        for a, s in zip(agents, streams, strict=True):
            assert a.waiting_for is None
            _, out = a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))
            msgs += out
            assert a.waiting_for == t + 1
        deliver(msgs, agg, agents, cfg)
    ref = replay(dataclasses.replace(fleet, streams=tuple(streams)), "pofmkl",
                 AlgorithmConfig(n_kernels=4, n_features=20, eta=0.05, lam=1e-4, xi=0.2, bin_size=2),
                 seed=3, steps=STEPS)
    assert agg.version == STEPS == ref.rounds
    for c, a in enumerate(agents):  # the same predictions, step by step
        assert a.counters.sq_loss == pytest.approx(float(np.sum(ref.sq_errors[c])), rel=1e-12)
    # and the same global θ as the reference lock-step protocol, to the last bit
    bank = RFFBank(AlgorithmConfig(n_kernels=4).specs(), 20, 10, seed=3)
    cl = [POFMKLClient(bank, 0.05, 1e-4, 0.2, 2, rng=np.random.default_rng([3, c])) for c in range(4)]
    srv = POFMKLServer(4, bank.dim)
    run_lockstep(cl, srv, [s.X[:STEPS] for s in streams], [s.y[:STEPS] for s in streams])
    assert np.max(np.abs(agg.aggregation.server.theta - srv.theta)) <= 1e-12


def test_fedbnr_global_equals_centralised_fit(fleet):
    streams = fleet.streams[:3]
    cfg = FleetConfig(standardise="none", fleet="t", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=15,
                      kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=16, fit_hyperparameters=False))
    names = [s.name for s in streams]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.0)
    for t in range(STEPS):
        msgs = []
        for a, s in zip(agents, streams, strict=True):
            msgs += a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))[1]
        deliver(msgs, agg, agents, cfg)
    # every client uploaded all but its last < 16 pending samples; the global sums them exactly
    n_up = sum((STEPS // 16) * 16 for _ in streams)
    assert agg.aggregation.server.stats.n == n_up
    phi = np.concatenate([agents[0].learner.client.features_many(s.X[: (STEPS // 16) * 16]) for s in streams])
    y = np.concatenate([s.y[: (STEPS // 16) * 16] for s in streams])
    phi = phi.reshape(len(y), -1)
    np.testing.assert_allclose(agg.aggregation.server.stats.S[0], phi.T @ phi, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(agg.aggregation.server.stats.b[0], phi.T @ y, rtol=1e-10, atol=1e-10)


def test_error_feedback_conserves_mass_and_bounds_messages():
    rng = np.random.default_rng(0)
    ef = ErrorFeedback(n_kernels=6, dim=4, bin_size=2)
    computed = np.zeros((6, 4))
    published = np.zeros((6, 4))
    for _ in range(500):
        k = rng.choice(6, size=rng.integers(1, 4), replace=False)
        d = rng.standard_normal((k.size, 4))
        ef.add(KernelUpdate(k, d))
        computed[k] += d
        if rng.random() < 0.5 and (u := ef.take()) is not None:
            assert u.kernels.size <= 2
            published[u.kernels] += u.delta
    np.testing.assert_allclose(published + ef.residual, computed, rtol=1e-12, atol=1e-12)


def test_async_agent_publishes_at_most_m_kernels_and_loses_nothing(fleet):
    cfg = pof_cfg()
    s = fleet.streams[0]
    agent = AgentCore(cfg, "a", 0, mode="async", upload_every=3)
    sent = np.zeros((4, 40))
    for t in range(STEPS):
        for m in agent.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])))[1]:
            assert m.arrays["kernels"].size <= cfg.params.bin_size
            sent[m.arrays["kernels"]] += m.arrays["delta"]
    for m in agent.flush():
        sent[m.arrays["kernels"]] += m.arrays["delta"]
    # recompute every step's update with a fresh identical learner: their sum is what was sent
    twin = AgentCore(cfg, "a", 0, mode="lockstep")
    total = np.zeros((4, 40))
    for t in range(STEPS):
        _, upd = twin.learner.client.step(s.X[t], s.y[t])
        total[upd.kernels] += upd.delta
    np.testing.assert_allclose(sent, total, rtol=1e-10, atol=1e-12)


def test_bad_input_is_counted_not_learned(fleet):
    cfg = pof_cfg()
    agent = AgentCore(cfg, "a", 0)
    agent.on_skip(Skip(SkipReason.NON_FINITE, "NaN"))
    assert agent.on_label(Label("nope", 1.0)) == []
    assert agent.counters.skipped == {"non_finite": 1, "unknown_reading": 1}
    agg = AggregatorCore(cfg, clients=["a"], mode="lockstep")
    assert agg.on_update("a", b"\x00garbage", now=0.0) == []
    assert agg.on_update("zz", b"\x93", now=0.0) == []
    assert sum(agg.rejected.values()) == 2 and agg.version == 0
    assert not agg.aggregation.server.theta.any()


def _async_updates(cfg, clients, per_client, seed):
    """Encoded async updates (random kernels and deltas, some -0.0) from several clients, interleaved."""
    from streamfed.algorithms.pofmkl.wire import update_message as pofmkl_update_message

    rng = np.random.default_rng(seed)
    agg = AggregatorCore(cfg, clients=clients, mode="async")
    out = []
    for s in range(1, per_client + 1):
        for c in rng.permutation(clients):
            k = np.sort(rng.choice(cfg.params.n_kernels, rng.integers(1, cfg.params.bin_size + 1), replace=False))
            d = rng.standard_normal((k.size, 2 * cfg.params.n_features)) * 10.0 ** rng.integers(-3, 4)
            d[rng.random(d.shape) < 0.05] = -0.0
            out.append((str(c), encode(pofmkl_update_message(cfg.fleet, str(c), s, k, d, global_version=0,
                                                             kernel_version=agg.kernel_version), cfg)))
    return out


def test_async_window_sums_each_clients_updates_like_merge_updates():
    """The async aggregator sums a client's updates per kernel as they arrive; the global is the one
    merge_updates + the server give for the same window, to the last bit, also across a restart
    in the middle of the window."""
    from streamfed.algorithms.pofmkl.messages import merge_updates
    from streamfed.fleet.robustness import Robustness

    cfg = pof_cfg(robust=Robustness(label_bound=1e9))  # random deltas: far beyond what honest labels give
    clients = ["a", "b", "c", "d"]
    payloads = _async_updates(cfg, clients, per_client=12, seed=5)
    agg = AggregatorCore(cfg, clients=clients, mode="async", window=10.0)
    half = len(payloads) // 2
    for c, p in payloads[:half]:
        assert agg.on_update(c, p, now=0.0) == []
    resumed = AggregatorCore(cfg, clients=clients, mode="async", window=10.0)
    resumed.restore(durable.decode(durable.encode(agg.snapshot())), now=0.0)  # as on disk (format 2)
    for core in (agg, resumed):
        for c, p in payloads[half:]:
            assert core.on_update(c, p, now=1.0) == []
        assert [m.kind for m in core.tick(now=11.0)] == ["pofmkl.global"]
    # the reference: each client's updates merged, added in the fleet's client order, one round
    per_client = {c: [] for c in clients}
    for c, p in payloads:
        m = decode(p, cfg)
        per_client[c].append(KernelUpdate(m.arrays["kernels"], m.arrays["delta"], m.n_samples))
    srv = POFMKLServer(cfg.params.n_kernels, cfg.params.dim)
    for c in clients:
        srv.add(merge_updates(per_client[c]))
    srv.finish_round()
    for core in (agg, resumed):
        assert core.version == 1 and core.counters.accepted == len(payloads)
        assert core.aggregation.server.theta.tobytes() == srv.theta.tobytes()
        assert core.included() == {c: 12 for c in clients}


@pytest.mark.parametrize("algorithm", ["pofmkl", "fedbnr"])
def test_begin_then_finish_reading_is_on_reading(fleet, algorithm):
    """The split the MQTT agent uses (prediction first, then learning and the update) gives the same
    predictions, messages and state as on_reading; warming up changes nothing either."""
    s = fleet.streams[0]
    if algorithm == "pofmkl":
        cfg = pof_cfg()
    else:
        cfg = FleetConfig(standardise="none", fleet="t", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=10,
                          kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=4, fit_hyperparameters=False))
    whole, split = AgentCore(cfg, "a", 0, mode="async"), AgentCore(cfg, "a", 0, mode="async")
    split.warm_up()
    for t in range(40):
        y = None if t % 5 == 4 else float(s.y[t])  # some readings come without their label
        r = Reading(f"{t}", s.X[t], float(t), y)
        p1, m1 = whole.on_reading(r, now=0.0)
        p2, pending = split.begin_reading(r, now=0.0)
        assert split.counters.learned == t - t // 5  # nothing of this sample learned or counted yet
        m2 = split.finish_reading(pending)
        assert (p1.mean, p1.var, p1.reading_id) == (p2.mean, p2.var, p2.reading_id)
        assert [m.kind for m in m1] == [m.kind for m in m2]
        assert all(a.arrays.keys() == b.arrays.keys() and a.seq == b.seq for a, b in zip(m1, m2, strict=True))
        assert all(np.array_equal(a.arrays[k], b.arrays[k]) for a, b in zip(m1, m2, strict=True) for k in a.arrays)
    assert whole.counters.sq_loss == split.counters.sq_loss and whole.steps == split.steps
    assert whole.regret == split.regret


def test_an_update_names_the_global_its_step_saw(fleet):
    """A global installed between a step and its update message (the agent publishes the prediction in
    between) does not relabel the update: it was computed against the older one."""
    from streamfed.algorithms.pofmkl.wire import global_message as pofmkl_global_message

    cfg = pof_cfg()
    s = fleet.streams[0]
    agent = AgentCore(cfg, "a", 0, mode="async")
    _, pending = agent.begin_reading(Reading("0", s.X[0], 0.0, float(s.y[0])))
    newer = pofmkl_global_message(cfg.fleet, "aggregator", np.zeros((4, 40)), 5, kernel_version=agent.kernel_version)
    assert agent.on_global(decode(encode(newer, cfg), cfg))
    (msg,) = agent.finish_reading(pending)
    assert agent.global_version == 5 and msg.global_version == 0


def test_aggregator_warm_up_changes_nothing():
    cfg = pof_cfg()
    agg, ref = (AggregatorCore(cfg, clients=["a", "b"], mode="async") for _ in range(2))
    agg.warm_up()
    assert agg.version == 0 and not agg.aggregation.server.theta.any() and not agg.aggregation.pending()
    payloads = _async_updates(cfg, ["a", "b"], per_client=3, seed=1)
    for core in (agg, ref):
        for c, p in payloads:
            core.on_update(c, p, now=0.0)
        core.tick(now=100.0)
    assert agg.aggregation.server.theta.tobytes() == ref.aggregation.server.theta.tobytes()
    assert agg.version == ref.version == 1


def _compiled_signatures() -> dict[str, int]:
    """Every numba dispatcher in streamfed and how many specialisations it has compiled or loaded."""
    import sys

    from numba.core.registry import CPUDispatcher

    out = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("streamfed"):
            for attr, obj in vars(mod).items():
                if isinstance(obj, CPUDispatcher):
                    out[f"{name}.{attr}"] = len(obj.signatures)
    return out


@pytest.mark.parametrize("algorithm", ["pofmkl", "fedbnr"])
def test_warm_up_compiles_everything_the_stream_runs(algorithm, fleet):
    """After `warm_up`, real samples (dataset rows are read-only arrays, sensor readings writable) and an
    installed global compile nothing: a cold start must not stall the first seconds of a live stream.
    About numba's JIT: when this process runs on the ahead-of-time build, the test runs in a JIT one."""
    import streamfed.algorithms.fedbnr._compiled
    import streamfed.algorithms.pofmkl._compiled  # noqa: F401  (both groups registered before asking)
    from streamfed.core import compiled

    if compiled.backend() != "jit":
        import os
        import subprocess
        import sys

        node = f"{__file__}::test_warm_up_compiles_everything_the_stream_runs[{algorithm}]"
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
                             capture_output=True, text=True, env={**os.environ, "STREAMFED_KERNELS": "jit"},
                             timeout=600)
        assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
        return
    if algorithm == "pofmkl":
        cfg = pof_cfg()
    else:
        cfg = FleetConfig(standardise="none",
                          fleet="t", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=20, seed=3,
                          fedbnr=FedBNRParams(min_upload=4))
    agent = AgentCore(cfg, "a", 0, mode="async")
    agg = AggregatorCore(cfg, clients=["a"], mode="async", window=0.0)
    agent.warm_up()
    agg.warm_up()
    before = _compiled_signatures()
    X = fleet.streams[0].X
    assert not X.flags.writeable  # what the datasets hand out
    msgs = []
    for i in range(8):
        x = X[i] if i % 2 else np.array(X[i])  # read-only, then writable
        _, out = agent.on_reading(Reading(f"r{i}", x, float(i), float(fleet.streams[0].y[i])), now=float(i))
        msgs += out
    msgs += agent.flush()
    assert msgs, "the agent produced no update to aggregate"
    globals_ = [g for m in msgs for g in agg.on_update("a", encode(m, cfg), now=100.0)] + agg.tick(now=200.0)
    assert any(g.kind.endswith(".global") for g in globals_)
    for g in globals_:
        if g.kind.endswith(".global"):
            assert agent.on_global(decode(encode(g, cfg), cfg.protocol_schema), now=300.0)
    after = _compiled_signatures()
    assert {k: v for k, v in after.items() if v != before.get(k, 0)} == {}


@pytest.mark.parametrize("algorithm", ["fedbnr", "fedbnr-personal", "pofmkl"])
def test_a_target_the_learner_refuses_is_counted_not_fatal_and_changes_nothing(algorithm):
    """A finite target so large that its square overflows (1e300): the agent skips the sample with the reason
    `unlearnable` (or `non_finite`), keeps running, and its model is what it was (same predictions, same
    regret accounting; scratch buffers may differ)."""
    cfg = FleetConfig(standardise="none", fleet="t", algorithm=algorithm, n_inputs=2, n_kernels=1, n_features=4,
                      kernels=["gaussian:1.0"], params={"min_upload": 2} if algorithm != "pofmkl" else {})
    agent = AgentCore(cfg, "a", 0)
    agent.on_reading(Reading("ok", np.array([0.1, 0.2]), 0.0, 0.5))
    probes = [np.array([0.3, 0.1]), np.array([-1.0, 2.0])]
    before = ([agent.learner.predict(x) for x in probes], agent.learner.regret())
    pred, msgs = agent.on_reading(Reading("huge", np.array([0.3, 0.1]), 1.0, 1e300))
    assert msgs == [] and agent.counters.learned == 1
    assert sum(agent.counters.skipped.get(r, 0) for r in ("unlearnable", "non_finite")) == 1
    assert ([agent.learner.predict(x) for x in probes], agent.learner.regret()) == before
    _, msgs = agent.on_reading(Reading("next", np.array([0.2, 0.2]), 2.0, 0.4))  # and it goes on learning
    assert agent.counters.learned == 2


def test_predictions_state_and_metrics_carry_the_epoch_of_the_global_in_use():
    """A global of a new epoch (a learned kernel or (θ, Z) version) is named in every prediction the agent
    publishes under it, in its metrics and in its state; predictions before it say epoch 0."""
    from streamfed.algorithms import get
    from streamfed.runtime.exporter import StreamfedCollector

    cfg = FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, standardise="none", params={"n_inducing": 4})
    agent = AgentCore(cfg, "a", 0, mode="async")
    before, _ = agent.on_reading(Reading("r0", np.zeros(2), 0.0))
    assert before is not None and agent.prediction_message(before).epoch == 0
    agg = get("fsgp").aggregation(cfg)
    g = agg.global_message(cfg.fleet, "aggregator", agent.kernel_version)
    g = dataclasses.replace(g, global_version=3, epoch=2)  # the same (θ, σ, Z) as version 2 of the kernel
    assert agent.on_global(decode(encode(g, cfg), cfg))
    pred, _ = agent.on_reading(Reading("r1", np.ones(2), 1.0))
    msg = decode(encode(agent.prediction_message(pred), cfg), cfg)
    assert (msg.global_version, msg.epoch) == (3, 2)
    assert agent.stats.global_epoch == 2
    samples = {s.name: s.value for fam in StreamfedCollector([agent.stats]).collect() for s in fam.samples}
    assert samples["streamfed_agent_global_epoch"] == 2
    twin = AgentCore(cfg, "a", 0, mode="async")
    twin.restore(durable.decode(durable.encode(agent.snapshot())))
    assert twin.global_epoch == 2


def test_a_lockstep_agent_on_the_default_standardiser_does_not_wait_for_a_round_it_never_opened() -> None:
    """Before: with `standardise = "online"` (the default) the first samples only set the scales and make no
    update, but the agent waited for global version 1 after its first sample: a lock-step fleet on the defaults
    never started (found by the latency benchmark)."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import decode, encode

    cfg = FleetConfig(fleet="ls", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)  # online: default
    agent = AgentCore(cfg, "a", 0, mode="lockstep")
    agg = AggregatorCore(cfg, clients=["a"], mode="lockstep")
    rng = np.random.default_rng(0)
    uploads = 0
    for t in range(10):
        assert agent.waiting_for is None, (t, agent.steps, agent.seq, agent.global_version)
        _, msgs = agent.on_reading(Reading(f"r{t}", rng.normal(size=2), float(t), float(rng.normal())))
        for m in msgs:
            uploads += 1
            for g in agg.on_update("a", encode(m, cfg), now=float(t)):
                if g.kind == cfg.global_kind:
                    agent.install_global(decode(encode(g, cfg), cfg, kernel_version=agent.kernel_version))
    assert agent.steps == 10 and uploads == agent.seq == 8  # two samples set the scales, eight rounds ran
    assert agg.version == 8 and agent.global_version == 8
