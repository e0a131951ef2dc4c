"""Bounded influence at the edges of the fleet (issue 15, parts 1, 2 and 4): labels within the fleet's bound
before any learner sees them, per-client rate limits at the aggregator, and the roster an aggregator on a
production broker requires. Each attempt is first shown against what the code did before (said per test).
"""

from __future__ import annotations

import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.fleet.admission import Admission, TokenBucket
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.fleet.sources import Reading
from streamfed.wire.message import encode

# =========================================================================== token buckets


def bucket_oracle(rate: float, burst: float, requests: list[tuple[float, float]]) -> list[bool]:
    """A plain transcription: tokens(t) = min(burst, tokens(t₀) + rate·(t − t₀)); a request of n takes n
    tokens if at least n are there. Starts full at t = 0; times never go back."""
    tokens, at, out = burst, 0.0, []
    for t, n in requests:
        tokens, at = min(burst, tokens + rate * (t - at)), t
        ok = n <= tokens
        if ok:
            tokens -= n
        out.append(ok)
    return out


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.1, 1e3), burst=st.floats(1.0, 1e4),
       steps=st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 2e3)), max_size=40))
def test_token_bucket_equals_its_transcription_and_never_admits_more_than_rate_times_time_plus_burst(
        rate: float, burst: float, steps: list[tuple[float, float]]) -> None:
    t, requests = 0.0, []
    for dt, n in steps:
        t += dt
        requests.append((t, n))
    bucket = TokenBucket(rate, burst, burst, 0.0)
    got = [bucket.take(n, now) for now, n in requests]
    assert got == bucket_oracle(rate, burst, requests)
    admitted = sum(n for (_, n), ok in zip(requests, got, strict=True) if ok)
    assert admitted <= burst + rate * t + 1e-9 * (1 + admitted)


def test_admission_takes_both_buckets_or_neither() -> None:
    adm = Admission(Robustness(max_sample_rate=1.0, sample_burst=10.0, max_upload_rate=1.0, upload_burst=3.0))
    assert adm.admit("a", 10, now=0.0)  # every sample token, one upload token
    assert not adm.admit("a", 1, now=0.0)  # no sample token left: the upload token is not spent either
    assert adm.admit("a", 0, now=0.0) and adm.admit("a", 0, now=0.0)
    assert not adm.admit("a", 0, now=0.0)  # three uploads: the upload bucket is empty
    assert adm.admit("a", 1, now=1.0)


# =========================================================================== the aggregator's rate limit


def fedbnr_cfg(**robust: float) -> FleetConfig:
    return FleetConfig(fleet="t", algorithm="fedbnr", n_inputs=2, n_kernels=1, n_features=3, kernels=["gaussian:1.0"],
                       standardise="none", fedbnr=FedBNRParams(min_upload=1, fit_hyperparameters=False),
                       robust=Robustness(**robust))


def agent_uploads(cfg: FleetConfig, n: int, client: str = "a") -> list[bytes]:
    agent = AgentCore(cfg, client, 0)
    rng = np.random.default_rng(0)
    out = []
    for t in range(n):
        _, msgs = agent.on_reading(Reading(f"r{t}", rng.normal(size=2), float(t), float(rng.normal())))
        out += [encode(m, cfg) for m in msgs if m.kind.endswith(".update")]
    return out


def test_a_client_over_its_rate_is_refused_for_now_and_its_uploads_count_once_it_slows_down() -> None:
    """Before: one client sent 194k valid uploads in 20 s and became 99.5% of the samples in the global.
    Now at most `rate × elapsed + burst` of its samples are taken; the rest are refused as `rate_limited`,
    and the same uploads sent again later are accepted — slowed, not lost."""
    cfg = fedbnr_cfg(max_sample_rate=2.0, sample_burst=5.0)
    payloads = agent_uploads(cfg, 12)
    agg = AggregatorCore(cfg, mode="async", window=0.0)
    for p in payloads:
        agg.on_update("a", p, now=0.0)
    assert agg.counters.accepted == 5 and agg.rejected == {"rate_limited": 7}
    assert agg.aggregation.included() == {"a": 5}
    t = 0.0
    while agg.aggregation.included().get("a", 0) < 12:  # the agent resends what is not included
        t += 0.5
        for p in payloads[agg.aggregation.included()["a"]:]:
            agg.on_update("a", p, now=t)
    assert agg.counters.accepted == 12 and 3.0 <= t <= 3.5  # 7 more samples at 2/s


def test_a_restarted_aggregator_does_not_hand_every_client_a_fresh_burst() -> None:
    cfg = fedbnr_cfg(max_sample_rate=1.0, sample_burst=4.0)
    payloads = agent_uploads(cfg, 6)
    agg = AggregatorCore(cfg, mode="async", window=0.0)
    for p in payloads[:4]:
        agg.on_update("a", p, now=0.0)
    twin = AggregatorCore(cfg, mode="async", window=0.0)
    twin.restore(pickle.loads(pickle.dumps(agg.snapshot())), now=0.0)
    twin.on_update("a", payloads[4], now=0.0)
    assert twin.rejected == {"rate_limited": 1}


# =========================================================================== labels at the agent


def pof_cfg(standardise: str = "none") -> FleetConfig:
    return FleetConfig(fleet="t", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=4, seed=1,
                       standardise=standardise)


def first_update_norm(cfg: FleetConfig, y: float) -> float:
    agent = AgentCore(cfg, "a", 0, mode="lockstep")
    _, msgs = agent.on_reading(Reading("r", np.array([0.3, -0.2]), 0.0, y))
    (msg,) = msgs
    return float(np.linalg.norm(msg.arrays["delta"]))


def test_one_huge_label_moves_an_update_no_further_than_the_label_bound() -> None:
    """Before: a sensor label y = 1e50 gave an accepted update of ~9e48 (global θ ~1e50)."""
    cfg = pof_cfg()
    bound = cfg.robust.label_bound
    assert first_update_norm(cfg, 1e50) == first_update_norm(cfg, bound)
    assert first_update_norm(cfg, -1e150) == first_update_norm(cfg, -bound)
    agent = AgentCore(cfg, "a", 0, mode="async")
    agent.on_reading(Reading("r", np.array([0.3, -0.2]), 0.0, 1e50))
    assert agent.learner.diagnostics()["labels_clipped"] == 1.0


def test_a_label_whose_square_overflows_is_skipped_with_its_reason() -> None:
    agent = AgentCore(pof_cfg("online"), "a", 0, mode="async")
    for t in range(5):
        agent.on_reading(Reading(f"r{t}", np.array([0.1 * t, 1.0]), float(t), float(t)))
    pred, msgs = agent.on_reading(Reading("huge", np.array([0.3, 0.1]), 9.0, 1e300))
    assert msgs == [] and agent.counters.skipped.get("unlearnable") == 1
    assert math.isfinite(agent.counters.sq_loss)


def test_a_standardising_agent_folds_an_outlier_in_at_the_edge_of_its_learned_range() -> None:
    """Before: the target's running scale took y = 1e50 in whole (scale ~1e49), after which every honest
    label standardised to ~0 and the agent's predictions were ~1e49 away from the stream for good."""
    agent = AgentCore(pof_cfg("online"), "a", 0, mode="async")
    rng = np.random.default_rng(0)
    for t in range(200):
        agent.on_reading(Reading(f"r{t}", rng.normal(size=2), float(t), float(5.0 + rng.normal())))
    scale_before = agent.learner.diagnostics()["target_scale"]
    agent.on_reading(Reading("bad", rng.normal(size=2), 200.0, 1e50))
    diag = agent.learner.diagnostics()
    assert diag["targets_winsorised"] == 1.0
    assert diag["target_scale"] < 2 * scale_before  # the outlier entered as mean + 10 scales, not as 1e50
    mean, _ = agent.learner.predict(rng.normal(size=2))
    assert abs(mean - 5.0) < 3.0


# =========================================================================== the roster in production


@pytest.mark.parametrize("role", ["aggregator", "reducer"])
def test_an_aggregator_on_an_authenticated_broker_refuses_to_start_without_its_roster(tmp_path, role) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text('[fleet]\nfleet = "f"\nalgorithm = "fedbnr"\nn_inputs = 2\n'
                      '[broker]\nusername = "f.aggregator"\npassword = "x"\nport = 1\n')
    run = subprocess.run([sys.executable, "-m", "streamfed.cli", role, "--config", str(config)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = [ln for ln in run.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and "needs its fleet's roster" in lines[0] and "Traceback" not in run.stderr
