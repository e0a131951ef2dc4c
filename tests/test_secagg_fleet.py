"""Secure aggregation in the fleet cores (streamfed.fleet.secure_aggregation wired into AgentCore / AggregatorCore): the
global of a secure fleet equals the plain sums (exactly as integers, to the fixed-point grid as floats), in
windowed and lock-step modes, with a member dropping out mid-round; and over a real Mosquitto an eavesdropper
subscribed to `#` sees only masked vectors."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import numpy as np
import pytest

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.fleet.secure_aggregation import DOWN_KINDS, UP_KINDS, frac_bits, summed_layout
from streamfed.fleet.sources import Reading
from streamfed.privacy import fixed_point
from streamfed.runtime.connection import client_kwargs
from streamfed.wire.message import Message, decode, encode
from streamfed.wire.topics import Channel


def fedbnr_cfg(secure: bool, **kw: object) -> FleetConfig:
    return FleetConfig(fleet="s", algorithm="fedbnr", n_inputs=3, n_features=4, kernels=["gaussian:1.0"],
                       standardise="none", secure_aggregation=secure,
                       fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False), **kw)


def pof_cfg(secure: bool) -> FleetConfig:
    return FleetConfig(fleet="s", algorithm="pofmkl", n_inputs=3, n_kernels=4, n_features=5, bin_size=2, seed=3,
                       standardise="none", secure_aggregation=secure, pofmkl=POFMKLParams(eta=0.05, xi=0.2))


class Router:
    """A broker in a list: agent messages to the aggregator, the aggregator's to one agent or to all."""

    def __init__(self, cfg: FleetConfig, agents: list[AgentCore], agg: AggregatorCore,
                 drop: Callable[[Message], bool] = lambda m: False) -> None:
        self.cfg, self.agents, self.agg, self.drop = cfg, {a.client_id: a for a in agents}, agg, drop
        self.seen: list[Message] = []  # everything that crossed the "broker", decoded

    def deliver(self, msgs: list[Message], now: float) -> None:
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            if self.drop(m):
                continue
            payload = encode(m, self.cfg)
            self.seen.append(decode(payload, self.cfg))
            kind = self.cfg.protocol_schema.kinds[m.kind]
            if kind.channel == Channel.UPDATES:
                queue += self.agg.on_update(m.client, payload, now=now)
            elif kind.channel == Channel.ACKS and m.kind in DOWN_KINDS:
                a = self.agents[m.client]
                queue += a.on_secagg(decode(payload, self.cfg, client=m.client, kinds=DOWN_KINDS), now=now)
            elif kind.channel == Channel.ACKS and m.kind == "ack":
                self.agents[m.client].on_ack(decode(payload, self.cfg, client=m.client, kinds=("ack",)))
            elif kind.channel == Channel.GLOBAL:
                for a in self.agents.values():
                    a.install_global(decode(payload, self.cfg, kernel_version=a.kernel_version), now=now)

    def step(self, rng: np.random.Generator, t: int, now: float) -> None:
        """Every agent reads (and learns) its sample of step `t`; what they publish is delivered."""
        for a in self.agents.values():
            x, y = _readings(rng, t)
            self.deliver(a.on_reading(Reading(f"{t}", x, now, y), now=now)[1], now)

    def settle(self, now: float, rounds: int = 20, step: float = 1.0) -> float:
        for _ in range(rounds):  # let the clocks close whatever stage waits
            now += step
            self.deliver(self.agg.tick(now), now)
            for a in self.agents.values():
                self.deliver(a.secagg_tick(now), now)
        return now


def _record(agent: AgentCore, log: list) -> None:
    """Note every contribution an agent's masked input is built from (client, arrays)."""
    assert agent.secagg is not None
    inner = agent.secagg.contribution

    def recorded():  # type: ignore[no-untyped-def]
        got = inner()
        if got is not None:
            log.append((agent.client_id, {k: np.array(v) for k, v in got[0].items()}))
        return got

    agent.secagg.contribution = recorded


def _readings(rng: np.random.Generator, t: int) -> tuple[np.ndarray, float]:
    x = rng.normal(0, 1, 3)
    return x, float(np.sin(x.sum()) + 0.1 * rng.normal())


def test_windowed_fedbnr_global_equals_the_plain_sums_exactly() -> None:
    secure, plain = fedbnr_cfg(True), fedbnr_cfg(False)
    names = ["a", "b", "c", "d"]
    agents = [AgentCore(secure, n, i) for i, n in enumerate(names)]
    twins = [AgentCore(plain, n, i) for i, n in enumerate(names)]  # the same learners, uploads in the clear
    agg = AggregatorCore(secure, clients=names, window=0.5, round_timeout=2.0)
    router = Router(secure, agents, agg)
    contributions: list = []
    for a in agents:
        _record(a, contributions)
    uploads = []
    rng = np.random.default_rng(0)
    now = 0.0
    for t in range(64):
        for a, tw in zip(agents, twins, strict=True):
            x, y = _readings(rng, t)
            router.deliver(a.on_reading(Reading(f"{t}", x, now, y), now=now)[1], now)
            uploads += tw.on_reading(Reading(f"{t}", x, now, y), now=now)[1]
        now = router.settle(now, rounds=1, step=0.3)
    now = router.settle(now)
    st = agg.aggregation.server.stats  # type: ignore[attr-defined]
    assert agg.version >= 2 and agg.secagg is not None and agg.secagg.aborted == 0
    assert float(st.n) == 64 * 4 == sum(u.n_samples for u in uploads)  # every sample, exactly once
    # exact: the global equals the decoded integer sum of the fixed-point encodings of what was added
    f = frac_bits(secure)
    layout = summed_layout(secure)
    enc = np.zeros(sum(int(np.prod(s)) for _, s in layout), dtype=np.uint64)
    for _, arrays in contributions:
        enc += fixed_point.encode(np.concatenate([np.ravel(arrays[k]) for k, _ in layout]), f)
    packed = st.to_packed()
    got = np.concatenate([np.ravel(packed[k]) for k, _ in layout])
    assert np.array_equal(got, fixed_point.decode(enc, f))
    # and the plain float sums of the same uploads, to the fixed-point grid
    plain_sum = sum(np.concatenate([np.ravel(u.arrays[k]) for k, _ in layout]) for u in uploads)
    assert np.max(np.abs(got - plain_sum)) <= len(contributions) * 2.0 ** -f + 1e-12 * np.max(np.abs(plain_sum))
    # the aggregator never saw an update, only masked vectors, keys, shares and sums
    assert not any(m.kind == "fedbnr.update" for m in router.seen)
    assert {m.kind for m in router.seen} >= set(UP_KINDS) | set(DOWN_KINDS) | {"fedbnr.global"}


def test_lockstep_pofmkl_with_secure_aggregation_follows_the_plain_fleet() -> None:
    names = ["a", "b", "c"]
    fleets = {}
    for secure in (True, False):
        cfg = pof_cfg(secure)
        agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
        agg = AggregatorCore(cfg, clients=names, mode="lockstep", round_timeout=2.0)
        router = Router(cfg, agents, agg)
        rng = np.random.default_rng(1)
        now = 0.0
        for t in range(12):
            router.step(rng, t, now)
            now = router.settle(now, rounds=3, step=0.6)
            assert agg.version == t + 1 and all(a.waiting_for is None for a in agents)
        fleets[secure] = agg.aggregation.server.theta  # type: ignore[attr-defined]
    # θ ← θ − ΣΔ/|C|: the same rounds, sums exact in fixed point instead of float64 — each round's sum within
    # the grid (2^-f, f = 29 at the default bound and fleet size), carried through 12 rounds of learning
    assert np.max(np.abs(fleets[True] - fleets[False])) <= 12 * 3 * 2.0 ** -frac_bits(pof_cfg(True))


def test_a_member_dropping_mid_round_does_not_stop_the_fleet() -> None:
    cfg = fedbnr_cfg(True)
    names = ["a", "b", "c", "d", "e"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=1.0)
    gone = {"on": True}
    router = Router(cfg, agents, agg, drop=lambda m: gone["on"] and m.client == "e" and m.kind == "secagg.masked")
    rng = np.random.default_rng(2)
    now = 0.0
    for t in range(8):
        router.step(rng, t, now)
    now = router.settle(now, rounds=6)
    assert agg.version == 1
    assert agg.included() == {c: 1 for c in "abcd"}  # e's pairwise masks removed from its shares
    assert float(agg.aggregation.server.stats.n) == 32  # type: ignore[attr-defined]
    # alone, e's update waits: a round needs two members (a sum of one would be the update itself)
    now = router.settle(now + 20.0, rounds=4)
    assert agg.version == 1
    gone["on"] = False  # e is back, and everyone has new samples: e's held update joins the next round
    for t in range(8, 16):
        router.step(rng, t, now)
    now = router.settle(now + 20.0, rounds=8)
    assert agg.included() == {c: 2 for c in names}
    assert float(agg.aggregation.server.stats.n) == 80  # type: ignore[attr-defined]


def test_a_round_survives_a_broker_slower_than_the_agents_fixed_timeout() -> None:
    """Every message of the aggregator reaches its agent 12 s late — as the last of a 1,000-member roster did
    over Mosquitto, the aggregator sending one QoS 1 message at a time: each agent's plain 10 s timeout expires
    before its roster (it advertises fresh keys; the roster, with the first ones, must still be taken) and
    between its later steps (a round's patience grows with its members). With a fixed 10 s no agent finished."""
    cfg = fedbnr_cfg(True)
    names = [f"c{i:02d}" for i in range(60)]
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=30.0)
    delay, late = 12.0, []  # (due, message) of the aggregator's messages to one agent

    def up(msgs: list[Message], now: float) -> None:
        for m in msgs:
            late.extend((now + delay, d) for d in agg.on_update(m.client, encode(m, cfg), now=now))

    rng = np.random.default_rng(4)
    for t in range(8):
        for a in agents.values():
            x, y = _readings(rng, t)
            up(a.on_reading(Reading(f"{t}", x, 0.0, y), now=0.0)[1], 0.0)
    now = 0.0
    while agg.version == 0 and now < 120.0:
        now += 1.0
        for a in agents.values():  # the agents' clocks first: a timer due now fires before a message due now
            up(a.secagg_tick(now), now)
        late.extend((now + delay, d) for d in agg.tick(now))
        due = [m for t, m in late if t <= now]
        late[:] = [(t, m) for t, m in late if t > now]
        for m in due:
            if m.kind in DOWN_KINDS:
                up(agents[m.client].on_secagg(decode(encode(m, cfg), cfg, client=m.client, kinds=DOWN_KINDS),
                                              now=now), now)
    assert agg.included() == {c: 1 for c in names}, f"round not done at {now:g} s: {agg.secagg.rejected}"  # type: ignore[union-attr]
    assert all(a.secagg.refused == 0 for a in agents.values())  # type: ignore[union-attr]


def test_bad_secure_aggregation_messages_are_counted_not_raised() -> None:
    cfg = fedbnr_cfg(True)
    agg = AggregatorCore(cfg, clients=["a", "b"], window=0.5)
    keys = Message("s", "a", "secagg.keys", 0, arrays={"c_pk": np.zeros(31, np.uint8), "s_pk": np.zeros(32, np.uint8)},
                   meta={"round": 1})
    assert agg.on_update("a", encode(keys)) == []
    assert agg.rejected == {"wrong_shape": 1}
    masked = Message("s", "a", "secagg.masked", 1, arrays={"y": np.zeros(56, np.uint64)}, meta={"round": 3, "first": 1})
    assert agg.on_update("a", encode(masked)) == []
    assert agg.rejected == {"wrong_shape": 1, "invalid_secagg": 1}  # no round 3 under way
    update = AgentCore(fedbnr_cfg(False), "a", 0)
    for t in range(8):
        msgs = update.on_reading(Reading(f"{t}", np.zeros(3), 0.0, 0.0))[1]
    assert agg.on_update("a", encode(msgs[0])) == []  # a plain update is not what a secure fleet takes
    assert agg.rejected["unknown_kind"] == 1


@pytest.mark.parametrize("flavour", ["dev", "prod"])
def test_eavesdropper_on_mosquitto_sees_only_masked_vectors(mosquitto_dev, flavour: str) -> None:  # type: ignore[no-untyped-def]
    """Dev: an anonymous client on `#`. Prod (TLS, the generated roster): the broker's *operator* account,
    which may read every topic — the threat model's broker operator — on `#`."""
    import aiomqtt

    from streamfed.fleet.sources import array_source
    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.aggregator import AggregatorService
    from tests import brokers

    cfg = FleetConfig(fleet="eaves", algorithm="fedbnr", n_inputs=3, n_features=4, kernels=["gaussian:1.0"],
                      standardise="none", secure_aggregation=True,
                      fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False))
    plain = cfg.model_copy(update={"secure_aggregation": False})
    n_agents = 3
    names = [f"e{i}" for i in range(n_agents)]
    rng = np.random.default_rng(3)
    data = {n: (rng.normal(0, 1, (16, 3)), rng.normal(0, 1, 16)) for n in names}
    prod = None
    if flavour == "prod":
        prod = brokers.start_mosquitto("prod", roster={"operators": ["ops"],
                                                       "fleet": [{"name": "eaves", "agents": names}]})

    def login(user: str) -> BrokerConfig:
        return mosquitto_dev.broker_config() if prod is None else prod.broker_config(user)

    async def main() -> tuple[list[tuple[str, bytes]], AggregatorService]:
        seen: list[tuple[str, bytes]] = []
        async with aiomqtt.Client(**client_kwargs(login("ops"), "ops" if prod else "eaves.spy")) as spy:
            await spy.subscribe("#", qos=1)

            async def listen() -> None:
                async for m in spy.messages:
                    seen.append((m.topic.value, bytes(m.payload)))

            listener = asyncio.create_task(listen())
            agg = AggregatorService(AggregatorCore(cfg, clients=names, window=0.3, round_timeout=3.0),
                                    login("eaves.aggregator"))
            agg_task = asyncio.create_task(agg.run())
            await asyncio.wait_for(agg.connected.wait(), 10)
            agents = [AgentService(AgentCore(cfg, n, i), login(n), array_source(*data[n]),
                                   settings=AgentSettings(linger=0.5))
                      for i, n in enumerate(names)]
            tasks = [asyncio.create_task(a.run()) for a in agents]

            async def done() -> None:
                while agg.core.included() != {n: 2 for n in names}:
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(done(), 60)
            for a in agents:
                a.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            agg.stop()
            await asyncio.wait_for(agg_task, 10)
            await asyncio.sleep(0.2)
            listener.cancel()
        return seen, agg

    try:
        seen, agg = asyncio.run(main())
    finally:
        if prod is not None:
            prod.close()
    kinds: dict[str, int] = {}
    schema = cfg.protocol_schema
    for topic, payload in seen:
        if "/eaves/" not in topic or "/predictions/" in topic or "/status/" in topic:
            continue
        m = decode(payload, schema)
        kinds[m.kind] = kinds.get(m.kind, 0) + 1
        assert m.kind != "fedbnr.update"  # no statistics in the clear, ever
        if m.kind == "secagg.masked":
            y = np.asarray(m.arrays["y"])
            # masked: the top bytes of a fixed-point encoding of statistics would be 0x00 or 0xff
            top = (y >> np.uint64(56)).astype(np.int64)
            assert len(set(top.tolist())) > 10
    assert kinds.get("secagg.masked", 0) >= n_agents and kinds.get("fedbnr.global", 0) >= 2
    # the unmasked sums equal the plain sums: every sample, and the statistics of the data
    st = agg.core.aggregation.server.stats  # type: ignore[attr-defined]
    twin = AgentCore(plain, "t", 0)
    phi = np.concatenate([[twin.learner.client.features(x) for x in data[n][0]] for n in names])  # type: ignore[attr-defined]
    ys = np.concatenate([data[n][1] for n in names])
    assert float(st.n) == 16 * n_agents
    f = frac_bits(cfg)
    np.testing.assert_allclose(st.S[0], phi[:, 0].T @ phi[:, 0], atol=4 * n_agents * 2.0**-f + 1e-12)
    np.testing.assert_allclose(st.b[0], phi[:, 0].T @ ys, atol=4 * n_agents * 2.0**-f + 1e-12)


def test_distributed_dp_adds_a_share_of_the_noise_and_needs_secure_aggregation() -> None:
    with pytest.raises(ValueError, match="secure_aggregation"):
        fedbnr_cfg(False, dp_epsilon=1.0, dp_round_clients=4)
    local = AgentCore(fedbnr_cfg(True, dp_epsilon=1.0), "a", 0).privacy
    shared = AgentCore(fedbnr_cfg(True, dp_epsilon=1.0, dp_round_clients=4), "a", 0).privacy
    assert local is not None and shared is not None
    assert shared.std == pytest.approx(local.std / 2)  # a quarter of the variance
    assert shared.z == local.z  # the round's sum carries the whole noise: the same guarantee is accounted


def test_a_secure_fleet_with_distributed_dp_publishes_installable_globals() -> None:
    cfg = fedbnr_cfg(True, dp_epsilon=2.0, dp_round_clients=3)
    names = ["a", "b", "c"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=1.0)
    router = Router(cfg, agents, agg)
    rng = np.random.default_rng(4)
    now = 0.0
    for t in range(32):
        router.step(rng, t, now)
        now = router.settle(now, rounds=1, step=0.4)
    now = router.settle(now)
    assert agg.version >= 2 and agg.rejected == {}
    for a in agents:
        assert a.global_version == agg.version and a.counters.rejected_globals == 0
        assert a.privacy is not None and a.privacy.accountant.uploads == 4


def test_an_agent_past_its_budget_says_so_in_its_retained_status_over_mosquitto(mosquitto_dev) -> None:  # type: ignore[no-untyped-def]
    import aiomqtt

    from streamfed.fleet.sources import array_source
    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.aggregator import AggregatorService
    from streamfed.wire.topics import status_topic

    cfg = FleetConfig(fleet="budget", algorithm="fedbnr", n_inputs=3, n_features=4, kernels=["gaussian:1.0"],
                      standardise="none", dp_epsilon=1.0, dp_budget=2.5,
                      fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False))
    rng = np.random.default_rng(5)
    X, y = rng.normal(0, 1, (80, 3)), rng.normal(0, 1, 80)
    broker = mosquitto_dev.broker_config()

    async def main() -> tuple[AgentService, list[Message]]:
        statuses: list[Message] = []
        async with aiomqtt.Client(**client_kwargs(broker, "budget.spy")) as spy:
            await spy.subscribe(status_topic("budget", "b1"), qos=1)

            async def listen() -> None:
                async for m in spy.messages:
                    statuses.append(decode(bytes(m.payload), cfg, kinds=("status",)))

            listener = asyncio.create_task(listen())
            agg = AggregatorService(AggregatorCore(cfg, clients=["b1"], window=0.05), broker)
            agg_task = asyncio.create_task(agg.run())
            await asyncio.wait_for(agg.connected.wait(), 10)
            agent = AgentService(AgentCore(cfg, "b1", 0), broker, array_source(X, y),
                                 settings=AgentSettings(linger=0.5))
            await asyncio.wait_for(agent.run(), 30)  # a finite stream: it ends by itself
            agg.stop()
            await asyncio.wait_for(agg_task, 10)
            await asyncio.sleep(0.3)
            listener.cancel()
        return agent, statuses

    agent, statuses = asyncio.run(main())
    p = agent.core.privacy
    # RDP: 1.09, 1.60, 1.99, 2.33 after 1..4 uploads; a 5th would pass 2.5
    assert p is not None and p.exhausted and p.accountant.uploads == 4 and agent.core.counters.updates == 4
    said = [(m.meta["state"], m.meta.get("dp_exhausted")) for m in statuses]
    # it says its privacy state when it comes online, and again the moment its budget runs out (which, with
    # the whole stream at hand, may come before its session is up)
    assert said[0][0] == "online" and said[0][1] in (False, True)
    assert ("online", True) in said
    last = statuses[-1]
    assert last.meta["state"] == "offline" and last.meta["dp_exhausted"] is True  # and in its last word
    assert last.meta["dp_epsilon"] == pytest.approx(p.epsilon) and last.meta["dp_delta"] == 1e-5
    assert agent.core.counters.samples == 80  # predicted every sample, budget or not


def test_a_repeated_forward_gets_the_same_bytes_and_never_a_second_masked_input() -> None:
    """Before: a duplicate `secagg.forward` (a QoS 1 redelivery, an aggregator asking again) made the agent mask
    its *new* contribution with the same masks: the two masked vectors differed by exactly the new update, in
    the clear, for the aggregator and for anyone on `#`. Now the agent answers a repeated request with the bytes
    it sent the first time, and the primitive refuses a second, different input in one round."""
    from streamfed.privacy.secagg import SecAggError

    cfg = fedbnr_cfg(True)
    names = ["a", "b", "c"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=2.0)
    a = agents[0]
    rng = np.random.default_rng(3)
    seen: dict[str, Message] = {}
    replies: list[Message] = []

    def spy(m: Message) -> bool:  # the broker: when a's masked input passes, the forward is delivered again
        if m.kind == "secagg.forward" and m.client == "a":
            seen["forward"] = m
        if m.kind == "secagg.masked" and m.client == "a" and "masked" not in seen:
            seen["masked"] = m
            before = a.secagg.contribution
            got = before()
            assert got is not None
            # meanwhile a has learned more: its contribution is no longer what it masked
            a.secagg.contribution = lambda: got._replace(arrays={k: np.asarray(v) + 0.5 for k, v in got.arrays.items()},
                                                         seq=got.seq + 1, n_samples=got.n_samples + 8)
            replies.extend(a.on_secagg(decode(encode(seen["forward"], cfg), cfg, client="a", kinds=DOWN_KINDS),
                                       now=now))
            assert [r.kind for r in replies] == ["secagg.masked"]
            leak = (replies[0].arrays["y"] - m.arrays["y"]).astype(np.int64)  # what the difference would show
            assert encode(replies[0], cfg) == encode(m, cfg), f"a second masked input: differs by {leak[:4]}…"
            sa = a.secagg._sa  # noqa: SLF001 - the round object the agent holds
            x0, y0 = sa._masked  # noqa: SLF001
            assert np.array_equal(sa.masked_input(x0, sa._received), y0)  # noqa: SLF001 - the same: fine
            with pytest.raises(SecAggError, match="second masked input"):
                sa.masked_input(x0 + np.uint64(1), sa._received)  # noqa: SLF001 - another: refused
        return False

    router = Router(cfg, agents, agg, drop=spy)
    now = 0.0
    t = 0
    while "masked" not in seen and t < 200:  # learn until a round reaches its masked inputs
        router.step(rng, t, now)
        now = router.settle(now, rounds=1, step=0.3)
        t += 1
    assert "masked" in seen, "no secure-aggregation round reached its masked inputs"
    first = seen["masked"]
    assert [m.kind for m in replies] == ["secagg.masked"]
    assert encode(replies[0], cfg) == encode(first, cfg)  # the same bytes: nothing new to subtract


def test_a_late_global_never_makes_a_round_count_updates_twice() -> None:
    """Before: an agent that had not heard the global including its updates (lost, late) gave up on its round
    and started another with the same updates: the aggregator summed them again (global n = 40 for 32 samples).
    Now a masked input says the oldest seq it sums, and one reaching into what is summed is left out of its
    round (`already_summed`); the agent's newer updates come in the next one."""
    cfg = fedbnr_cfg(True)
    names = ["a", "b", "c"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=2.0)
    from streamfed.fleet.agent import GlobalResult

    agents[0].install_global = lambda msg, now=None: GlobalResult(False)  # the globals to a are lost on the way
    router = Router(cfg, agents, agg)
    rng = np.random.default_rng(5)
    now = 0.0
    learned = 0
    for phase in range(2):  # each agent: one upload of min_upload = 8 samples per phase, a round after each
        for t in range(8 * phase, 8 * phase + 8):
            router.step(rng, t, now)
            learned += len(agents)
            now = router.settle(now, rounds=1, step=0.3)
        now = router.settle(now, rounds=40, step=1.0)  # the round runs (a never hears its global)
    st = agg.aggregation.server.stats  # type: ignore[attr-defined]
    assert agents[0].secagg is not None and agents[0].secagg.rounds_started >= 2  # a did start a round again
    # every sample once: a's retry reaching back into what was summed was left out, and the aggregator's ack told a
    # what is summed, so its newer update came in the next round
    # (an update still waiting for a round with another member is not in yet: 8 samples each)
    waiting = sum(len(a.outbox) for a in agents)
    assert float(st.n) == learned - 8 * waiting, (float(st.n), learned, [sorted(a.outbox) for a in agents])
    assert not agents[0].outbox  # a's newer update was summed, once
    assert agg.secagg is not None and agg.secagg.rejected.get("already_summed", 0) >= 1


def test_distributed_dp_never_unmasks_a_round_below_its_size() -> None:
    """Before: with `dp_round_clients = 4` a round of 3 (one member silent) was unmasked and published: its sum
    carried 3/4 of the noise the accountant recorded (the review saw multiplier 1.87 for 3.73). Now a round with fewer
    masked inputs than `dp_round_clients` is dropped before unmasking (`too_few_survivors`): nothing is revealed,
    the members' updates wait for a full round."""
    cfg = fedbnr_cfg(True, dp_epsilon=2.0, dp_round_clients=4)
    names = ["a", "b", "c", "d"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=1.0)
    # d's masked inputs are lost on the way: every round has three inputs at most
    router = Router(cfg, agents, agg, drop=lambda m: m.kind == "secagg.masked" and m.client == "d")
    rng = np.random.default_rng(4)
    now = 0.0
    for t in range(32):
        router.step(rng, t, now)
        now = router.settle(now, rounds=1, step=0.4)
    now = router.settle(now)
    assert agg.secagg is not None and agg.secagg.rounds == 0 and agg.version == 0, (agg.secagg.rounds, agg.version)
    assert agg.secagg.aborted >= 1
    assert not any(m.kind == "secagg.survivors" for m in router.seen)  # never a step towards unmasking


def test_robust_aggregation_with_secure_aggregation_is_refused() -> None:
    """Before: the aggregator printed its "robust aggregation" banner and screened nothing (every upload is masked:
    `screened_uploads` 0), although docs/reliability.md said the combination is refused. Now the configuration
    itself refuses it."""
    from streamfed.fleet.robustness import Robustness

    with pytest.raises(ValueError, match="cannot be combined"):
        fedbnr_cfg(True, robust=Robustness(aggregation="robust"))
    fedbnr_cfg(True)  # each alone is fine
    fedbnr_cfg(False, robust=Robustness(aggregation="robust"))


@pytest.mark.parametrize("command", [["aggregator"], ["shard", "--name", "s0"], ["reducer"]])
def test_a_refused_configuration_is_one_line_and_exit_2_on_every_service(tmp_path, command) -> None:  # type: ignore[no-untyped-def]
    """Before: a configuration the schema refuses ended the aggregator, shard and reducer commands in a
    pydantic traceback (the agent command alone said it in one line)."""
    import subprocess
    import sys

    conf = tmp_path / "fleet.toml"
    conf.write_text('[fleet]\nfleet = "f"\nalgorithm = "fedbnr"\nn_inputs = 3\nsecure_aggregation = true\n'
                    '[fleet.robust]\naggregation = "robust"\n')
    res = subprocess.run([sys.executable, "-m", "streamfed.cli", *command, "--config", str(conf)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "Traceback" not in out, out
    assert [line for line in out.splitlines() if line.strip()] == [out.strip().splitlines()[0]]  # one line
    assert out.startswith("error: --config") and "cannot be combined" in out


# =========================================================================== defences under secure aggregation


def _attacked_fleet(cheat: Callable, max_sample_rate: float = 1000.0) -> tuple[AggregatorCore, list[AgentCore]]:
    """Three honest FedBNR agents and `evil`, whose contributions pass through `cheat(contribution)` before they
    are masked; 48 samples each, windows of 0.5 s, then every round settled."""
    from streamfed.fleet.robustness import Robustness
    from streamfed.fleet.secure_aggregation import Contribution

    cfg = fedbnr_cfg(True, robust=Robustness(label_bound=3.0, max_sample_rate=max_sample_rate, sample_burst=100.0))
    names = ["a", "b", "c", "evil"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    assert agents[3].secagg is not None
    honest = agents[3].secagg.contribution

    def evil() -> Contribution | None:
        got = honest()
        return None if got is None else cheat(got)

    agents[3].secagg.contribution = evil
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=2.0)
    router = Router(cfg, agents, agg)
    rng = np.random.default_rng(4)
    now = 0.0
    for t in range(48):
        router.step(rng, t, now)
        now = router.settle(now, rounds=1, step=0.3)
    router.settle(now)
    return agg, agents


def _rows(got, k: int, label: float, n_clear: int):  # type: ignore[no-untyped-def]
    """`got` plus `k` rows of one in-bound feature vector labelled `label`, saying `n_clear` more samples."""
    from streamfed.core.stats import pack_upper

    arrays = {key: np.array(v, dtype=np.float64) for key, v in got.arrays.items()}
    f = arrays["b"].shape[-1]
    phi = np.zeros(f)
    phi[0] = 1.0 / np.sqrt(2.0)  # an RFF-like vector: norm within the features' bound
    arrays["S_upper"] = arrays["S_upper"] + k * pack_upper(np.outer(phi, phi))[None]
    arrays["b"] = arrays["b"] + k * label * phi[None]
    arrays["n"] = arrays["n"] + k
    arrays["q"] = arrays["q"] + k * label**2
    return got._replace(arrays=arrays, n_samples=got.n_samples + n_clear)


def test_a_member_that_hides_samples_under_secure_aggregation_gets_no_round_in() -> None:
    """Issue 30 part 4: before, a member added 10,000 in-bound rows labelled +B to each masked input and nothing
    was refused (global n 99.4% the attacker's). Each member's sample count travels in the clear now, and the
    unmasked sum must count exactly what its members said: a round with the hidden rows is refused as a whole
    (`invalid_sum`; which member lied, masking hides), so the hidden rows never reach the global."""
    agg, _ = _attacked_fleet(lambda got: _rows(got, 10_000, 3.0, 0))
    st = agg.aggregation.server.stats  # type: ignore[attr-defined]
    assert agg.counters.rejected.get("invalid_sum", 0) >= 1
    assert float(st.n) < 10_000  # none of the hidden rows is in


def test_a_member_claiming_its_extra_samples_is_held_to_the_rate_limit() -> None:
    """The same rows, claimed honestly in the clear: the rate limit applies to a masked input's n_samples as to a
    plain upload's, so an input over the member's rate is left out of the round (`rate_limited`)."""
    agg, _ = _attacked_fleet(lambda got: _rows(got, 10_000, 3.0, 10_000), max_sample_rate=5.0)
    st = agg.aggregation.server.stats  # type: ignore[attr-defined]
    assert agg.counters.rejected.get("rate_limited", 0) >= 1
    assert float(st.n) < 10_000 and float(st.n) > 0  # the honest members' rounds go on


def test_a_sum_beyond_the_declared_bounds_is_refused() -> None:
    """+1e9 in b (within secagg_max_abs's fixed-point range, beyond any label bound): Cauchy–Schwarz on the sum
    (|b| ≤ √(n·q)-type bounds hold for sums of honest uploads) refuses the round."""
    def cheat(got):  # type: ignore[no-untyped-def]
        arrays = {key: np.array(v, dtype=np.float64) for key, v in got.arrays.items()}
        arrays["b"] = arrays["b"] + 1e5
        return got._replace(arrays=arrays)

    agg, _ = _attacked_fleet(cheat)
    st = agg.aggregation.server.stats  # type: ignore[attr-defined]
    assert agg.counters.rejected.get("invalid_sum", 0) >= 1
    assert float(np.abs(st.b).max()) < 1e3


def test_an_honest_secure_fleet_has_no_sum_refused() -> None:
    agg, _ = _attacked_fleet(lambda got: got)
    assert "invalid_sum" not in agg.counters.rejected and agg.version >= 2
    assert float(agg.aggregation.server.stats.n) == 4 * 48  # type: ignore[attr-defined]


def _graph_from_keys(seen: list[Message], names: list[str]) -> dict[str, tuple[str, ...]]:
    """The round's neighbour graph recomputed from the keys the agents advertised (the public rule), not from the
    aggregator's state."""
    from streamfed.privacy.secagg import default_degree, harary_neighbours, roster_seed

    keys = {m.client: (bytes(m.arrays["c_pk"]), bytes(m.arrays["s_pk"])) for m in seen if m.kind == "secagg.keys"}
    assert sorted(keys) == sorted(names)  # one key pair each: nobody re-advertised
    return harary_neighbours(names, default_degree(len(names)), roster_seed(1, keys))


@pytest.mark.slow
def test_a_member_is_sent_its_neighbourhood_only_and_the_sum_stays_exact_under_dropouts() -> None:
    """200 members (k = 32): every roster names exactly the member and its neighbours in the graph drawn from
    everyone's keys, forwarded shares and survivors come from neighbours only, a member's bytes down are bounded
    by a constant plus a constant per neighbour (O(k), below the 64 bytes per member the full roster's keys alone
    took), and with members dropping after sharing their keys the global is the exact sum of the rest."""
    from streamfed.privacy.secagg import KEY_BYTES, default_degree, harary_size

    cfg = fedbnr_cfg(True, max_clients=256)
    n = 200
    names = [f"m{i:03d}" for i in range(n)]
    agents = [AgentCore(cfg, c, i) for i, c in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=5.0)
    dropped = {"m007", "m100", "m150"}
    router = Router(cfg, agents, agg, drop=lambda m: m.client in dropped and m.kind == "secagg.masked")
    contributions: list = []
    for a in agents:
        _record(a, contributions)
    rng = np.random.default_rng(7)
    now = 0.0
    for t in range(8):
        router.step(rng, t, now)
    router.settle(now, rounds=8)  # the masked stage waits out its 5 s timeout for the dropped members
    assert agg.version == 1 and agg.included() == {c: 1 for c in names if c not in dropped}
    graph = _graph_from_keys(router.seen, names)
    k = harary_size(n, default_degree(n))
    assert k == 32 and all(len(v) == k for v in graph.values())
    down: dict[str, int] = dict.fromkeys(names, 0)
    for m in router.seen:
        if m.kind not in DOWN_KINDS:
            continue
        down[m.client] += len(encode(m, cfg))
        mine = set(graph[m.client])
        if m.kind == "secagg.roster":
            assert set(m.included) == mine | {m.client}  # never a non-neighbour's key
            assert m.arrays["c_pk"].shape == (k + 1, KEY_BYTES)
        elif m.kind == "secagg.forward":
            assert {names[i] for i in m.arrays["from"].tolist()} <= mine
        else:
            assert {names[i] for i in m.arrays["alive"].tolist()} <= (mine | {m.client}) - dropped
    # per neighbour: two keys and a name with its index (≤ 96 bytes), a ciphertext and its index (156), a survivor
    # index (8); per message a header (≤ 400 bytes here)
    bound = 3 * 400 + (k + 1) * (96 + 156 + 8)
    assert max(down.values()) <= bound < n * 2 * KEY_BYTES
    # exact: the global is the decoded sum of the survivors' fixed-point contributions
    st = agg.aggregation.server.stats  # type: ignore[attr-defined]
    f, layout = frac_bits(cfg), summed_layout(cfg)
    enc = np.zeros(sum(int(np.prod(s)) for _, s in layout), dtype=np.uint64)
    for c, arrays in contributions:
        if c not in dropped:
            enc += fixed_point.encode(np.concatenate([np.ravel(arrays[k]) for k, _ in layout]), f)
    packed = st.to_packed()
    assert np.array_equal(np.concatenate([np.ravel(packed[k]) for k, _ in layout]), fixed_point.decode(enc, f))
    assert float(st.n) == 8 * (n - len(dropped))


def test_a_stage_waits_longer_in_a_larger_round() -> None:
    """Answers reach the aggregator one after another, 40 ms apart (one loop serving every agent, as in the
    benchmark): a stage of 60 members needs 2.4 s, far beyond the 0.5 s `round_timeout`. A stage waits for its
    last answers `timeout` plus 40 ms a member, so the round includes everyone; a fixed timeout closed each stage
    with a dozen answers in and the round failed (issue 29: `recovery_failed` at 1,000 agents)."""
    from streamfed.fleet.secure_aggregation import STAGE_PER_MEMBER

    cfg = fedbnr_cfg(True)
    n, pace, timeout = 60, 0.04, 0.5
    names = [f"c{i:02d}" for i in range(n)]
    agents = {c: AgentCore(cfg, c, i) for i, c in enumerate(names)}
    # keys are gathered until all 60 are in (`window`): the stages after them are what is timed
    agg = AggregatorCore(cfg, clients=names, window=30.0, round_timeout=timeout)
    assert agg.secagg is not None
    assert n * pace > 4 * timeout and n * pace < timeout + STAGE_PER_MEMBER * n
    rng = np.random.default_rng(5)
    inbox: list[Message] = []  # the agents' messages, taken in by the aggregator one every `pace` seconds
    for t in range(8):
        for a in agents.values():
            x, y = _readings(rng, t)
            inbox += a.on_reading(Reading(f"{t}", x, 0.0, y), now=0.0)[1]
    now, stages = 0.0, []

    def to_agents(msgs: list[Message]) -> None:
        for m in msgs:
            if m.kind in DOWN_KINDS:
                inbox.extend(agents[m.client].on_secagg(decode(encode(m, cfg), cfg, client=m.client,
                                                               kinds=DOWN_KINDS), now=now))

    while agg.version == 0 and now < 60.0:
        now += pace
        if inbox:
            m = inbox.pop(0)
            to_agents(agg.on_update(m.client, encode(m, cfg), now=now))
        to_agents(agg.tick(now))
        if not stages or stages[-1] != agg.secagg.stage:
            stages.append(agg.secagg.stage)
    assert agg.included() == {c: 1 for c in names}, (agg.secagg.rejected, agg.secagg.aborted)
    assert agg.secagg.aborted == 0 and stages == ["keys", "shares", "masked", "unmask", "keys"]


def test_an_agent_that_gave_up_after_its_masked_input_still_unmasks_that_round() -> None:
    """The survivor lists come after every agent's patience ran out (a loaded aggregator): each has started a new
    round with fresh keys (refused: a round is under way), yet answers the old round's survivors once, so the round
    unmasks the exact sum — before, they ignored it and the round failed with `recovery_failed`. A second request
    for the same round is refused: a member never reveals shares twice."""
    cfg = fedbnr_cfg(True)
    names = ["a", "b", "c", "d", "e"]
    agents = {c: AgentCore(cfg, c, i) for i, c in enumerate(names)}
    agg = AggregatorCore(cfg, clients=names, window=5.0, round_timeout=5.0)
    held: list[Message] = []
    router = Router(cfg, list(agents.values()), agg,
                    drop=lambda m: m.kind == "secagg.survivors" and not held.append(m))
    contributions: list = []
    for a in agents.values():
        _record(a, contributions)
    rng = np.random.default_rng(9)
    for t in range(8):
        router.step(rng, t, 0.0)
    router.settle(0.0, rounds=1)
    assert len(held) == 5 and agg.version == 0  # every masked input in, the survivor lists held back
    # the agents' clocks (their own) far beyond their patience: each starts over; the aggregator's still at 1 s
    late = 1000.0
    for a in agents.values():
        for m in a.secagg_tick(late):
            assert agg.on_update(m.client, encode(m, cfg), now=1.0) == []
    assert all(a.secagg.rounds_started == 2 for a in agents.values())  # type: ignore[union-attr]
    assert agg.secagg is not None and agg.secagg.rejected.get("busy") == 5
    router.drop = lambda m: False
    for m in held:
        for r in agents[m.client].on_secagg(decode(encode(m, cfg), cfg, client=m.client, kinds=DOWN_KINDS), now=late):
            router.deliver(agg.on_update(r.client, encode(r, cfg), now=1.0), 1.0)
    assert agg.included() == {c: 1 for c in names} and agg.secagg.aborted == 0
    f, layout = frac_bits(cfg), summed_layout(cfg)
    enc = np.zeros(sum(int(np.prod(s)) for _, s in layout), dtype=np.uint64)
    for _, arrays in contributions:
        enc += fixed_point.encode(np.concatenate([np.ravel(arrays[k]) for k, _ in layout]), f)
    packed = agg.aggregation.server.stats.to_packed()  # type: ignore[attr-defined]
    assert np.array_equal(np.concatenate([np.ravel(packed[k]) for k, _ in layout]), fixed_point.decode(enc, f))
    again = agents["a"].on_secagg(decode(encode(held[0], cfg), cfg, client="a", kinds=DOWN_KINDS), now=late)
    assert again == [] and agents["a"].secagg.refused >= 1  # type: ignore[union-attr]


def test_a_step_whose_rows_disagree_with_its_index_is_refused_with_a_reason() -> None:
    """The codec holds a message's index and rows to one dimension; built without it, the coordinator and the agent
    still refuse a mismatch with a stable reason (`bad_shape`), never an IndexError or a half-read step."""
    from streamfed.fleet.secure_aggregation import ROSTER, SHARES, SecAggAgent, SecAggCoordinator

    cfg = fedbnr_cfg(True)
    names = ["a", "b", "c"]
    agents = {c: SecAggAgent(cfg, c, lambda: None) for c in names}
    coord = SecAggCoordinator(cfg, expected=lambda: set(names))
    rosters: list[Message] = []
    for a in agents.values():
        for m in a.tick(0.0, pending=True):
            rosters += coord.on_message(m, 0.0)[0]
    assert [m.kind for m in rosters] == [ROSTER] * 3
    shares = agents["a"].on_message(rosters[0], 0.0)
    assert [m.kind for m in shares] == [SHARES]
    good = shares[0]
    bad = Message(good.fleet, good.client, good.kind, good.seq, 0, "", 0, good.created,
                  {"to": good.arrays["to"], "ct": good.arrays["ct"][:1]}, dict(good.meta))
    assert coord.on_message(bad, 0.0) == ([], None)
    assert coord.rejected.get("bad_shape") == 1
    assert coord.progress()[1] == 0
    coord.on_message(good, 0.0)
    assert coord.progress()[1] == 1  # the honest step still counts
    short = rosters[1]
    cut = Message(short.fleet, short.client, short.kind, short.seq, 0, "", 0, short.created,
                  {"c_pk": short.arrays["c_pk"], "s_pk": short.arrays["s_pk"][:1]}, dict(short.meta),
                  dict(short.included))
    assert agents["b"].on_message(cut, 0.0) == [] and agents["b"].refused == 1


def test_every_message_delivered_twice_never_exposes_an_update_and_the_sum_stays_exact() -> None:
    """A broker that delivers every message twice (QoS 1 redelivery), in both directions, with one member dropping
    after its shares so that the unmasking rebuilds a key too: every agent answers a repeated request with the bytes
    it sent the first time, or nothing once the round is over (never a second masked input, never shares of another
    survivor set), the aggregator refuses each repeat (counted, the round unchanged), and the global is the exact
    sum of the others. Then the round's messages replayed into the next round are refused, never summed again."""
    cfg = fedbnr_cfg(True)
    names = ["a", "b", "c", "d", "e", "f"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.5, round_timeout=1.0)
    replies: dict[tuple[str, str, int], list[bytes]] = {}  # (agent, request kind, round) → encoded replies
    contributions: list = []
    for a in agents:
        _record(a, contributions)

    class Twice(Router):
        def deliver(self, msgs: list[Message], now: float) -> None:
            queue = list(msgs)
            while queue:
                m = queue.pop(0)
                if self.drop(m):
                    continue
                payload = encode(m, self.cfg)
                self.seen.append(decode(payload, self.cfg))
                channel = self.cfg.protocol_schema.kinds[m.kind].channel
                for _ in range(2):  # every message twice, whichever way it goes
                    if channel == Channel.UPDATES:
                        queue += self.agg.on_update(m.client, payload, now=now)
                    elif m.kind in DOWN_KINDS:
                        got = self.agents[m.client].on_secagg(
                            decode(payload, self.cfg, client=m.client, kinds=DOWN_KINDS), now=now)
                        replies.setdefault((m.client, m.kind, int(m.meta["round"])), []).append(
                            b"".join(encode(r, self.cfg) for r in got))
                        queue += got
                    elif m.kind == "ack":
                        self.agents[m.client].on_ack(decode(payload, self.cfg, client=m.client, kinds=("ack",)))
                    elif channel == Channel.GLOBAL:
                        for a in self.agents.values():
                            a.install_global(decode(payload, self.cfg, kernel_version=a.kernel_version), now=now)

    router = Twice(cfg, agents, agg, drop=lambda m: m.client == "f" and m.kind == "secagg.masked")
    rng = np.random.default_rng(8)
    now = 0.0
    for t in range(8):
        router.step(rng, t, now)
    now = router.settle(now, rounds=8)
    assert agg.included() == {c: 1 for c in "abcde"}, (agg.secagg.rejected, agg.rejected)  # type: ignore[union-attr]
    # asked twice: the same bytes — or nothing, when the round ended between the two deliveries (its global came)
    assert {kind for _, kind, _ in replies} >= {"secagg.roster", "secagg.forward", "secagg.survivors"}
    for key, got in replies.items():
        if key[0] == "f" and key[1] != "secagg.roster":
            continue  # f's masked input never arrived: it is not asked further
        assert len(got) == 2 and got[0] and got[1] in (got[0], b""), key
    assert sum(got[1] == got[0] for got in replies.values()) >= len(replies) // 2
    # every repeated step reached the aggregator as a duplicate, or out of its stage or round: refused, counted
    assert agg.secagg is not None
    refused = {r: v for r, v in agg.secagg.rejected.items() if r != "busy"}
    assert set(refused) <= {"duplicate", "out_of_order", "wrong_round"} and sum(refused.values()) >= 3 * 5, refused
    # exact: the sum of a..e's contributions, each once (f's masks with them removed with its rebuilt key)
    f, layout = frac_bits(cfg), summed_layout(cfg)
    enc = np.zeros(sum(int(np.prod(s)) for _, s in layout), dtype=np.uint64)
    for arrays in {c: arrays for c, arrays in contributions if c != "f"}.values():
        enc += fixed_point.encode(np.concatenate([np.ravel(arrays[k]) for k, _ in layout]), f)
    packed = agg.aggregation.server.stats.to_packed()  # type: ignore[attr-defined]
    assert np.array_equal(np.concatenate([np.ravel(packed[k]) for k, _ in layout]), fixed_point.decode(enc, f))
    # the round's up messages replayed while the next round is under way: refused, never summed again
    old = [m for m in router.seen if m.kind in ("secagg.shares", "secagg.masked", "secagg.unmask")]
    router.drop = lambda m: False
    for t in range(8, 16):
        router.step(rng, t, now)
    now = router.settle(now, rounds=1, step=0.6)
    before = sum(agg.secagg.rejected.values())
    for m in old:
        agg.on_update(m.client, encode(m, cfg), now=now)
    assert sum(agg.secagg.rejected.values()) - before == len(old)
    now = router.settle(now, rounds=8)
    assert {c: agg.included()[c] for c in "abcde"} == {c: 2 for c in "abcde"}  # the next round: each once more


def test_a_queued_secure_aggregation_step_does_not_keep_its_mqtt5_properties() -> None:
    """paho builds some fifty objects of MQTT 5 properties per message; the agent reads none of them, and a
    secure-aggregation stage queues one message at every member at once: the receiver lets them go as the message
    is queued (the garbage collector walked them otherwise), payload and topic kept."""
    import aiomqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from streamfed.fleet.sources import array_source
    from streamfed.runtime.agent import AgentService
    from streamfed.runtime.mqtt import IncomingQueue
    from streamfed.wire.topics import acks_topic

    cfg = fedbnr_cfg(True)
    agent = AgentService(AgentCore(cfg, "a", 0), BrokerConfig(), array_source(np.zeros((1, 3)), np.zeros(1)))
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("k", "v")
    queue = IncomingQueue(limit=4, divert=agent._divert)
    sent = aiomqtt.Message(acks_topic(cfg.fleet, "a"), b"step", 1, False, 7, props)
    queue.put_nowait(sent)
    got = queue.get_nowait()
    assert got is sent and got.payload == b"step" and got.topic.value == acks_topic(cfg.fleet, "a")
    assert got.properties is None and agent.received == {"ack": 1}
