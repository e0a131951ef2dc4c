"""The recorded leave-one-out (`leave_one_out_recorded`: one fleet run's uploads serve every held-out client)
against the plain one (`leave_one_out`: a whole fleet replay per held-out client) — the reference it replaces in
benchmarks/bench_coldstart.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamfed.evaluation.coldstart import leave_one_out, leave_one_out_recorded, record_uploads
from streamfed.evaluation.datasets import synthetic_fleet
from streamfed.evaluation.replay import AlgorithmConfig
from streamfed.wire.message import encode

JOIN, WINDOWS = 90, (12, 50)


@pytest.fixture(scope="module")
def fleet():  # type: ignore[no-untyped-def]
    return synthetic_fleet(n_clients=4, n_steps=JOIN + max(WINDOWS), n_inputs=2, seed=3)


def config() -> AlgorithmConfig:
    # uploads every 8 samples: the held-out client's own uploads reach the fleet within its windows
    return AlgorithmConfig(n_kernels=1, n_features=8, kernels=("gaussian:1",),
                           params={"fedbnr": {"min_upload": 8},
                                   "fedbnr-personal": {"min_upload": 8, "trace_experts": True}})


@pytest.mark.slow
def test_personalised_equals_the_plain_replay_bit_for_bit(fleet) -> None:  # type: ignore[no-untyped-def]
    """The mixture's rows (its own and each expert's) and its MSE-to-date curves, for two held-out clients."""
    held = [fleet.names[0], fleet.names[2]]
    plain = leave_one_out(fleet, ["fedbnr-personal"], config(), JOIN, windows=WINDOWS, seeds=(1,), clients=held)
    fast = leave_one_out_recorded(fleet, "fedbnr-personal", config(), JOIN, windows=WINDOWS, seed=1, clients=held)
    assert len(plain.rows) == 2 * 4 * len(WINDOWS)  # the learner and its three experts, per client and window
    assert fast.rows == plain.rows
    assert fast.curves.keys() == plain.curves.keys()
    for k, v in plain.curves.items():
        assert np.array_equal(fast.curves[k], v), k


@pytest.mark.slow
def test_pooled_equals_the_plain_replay_to_rounding(fleet) -> None:  # type: ignore[no-untyped-def]
    """Pooled FedBNR stages its rank-one updates until a global arrives, so its uploads' sums are rounded in an
    order that depends on when globals arrive: equal to 1e-12 (relative), not bit for bit."""
    held = [fleet.names[1]]
    plain = leave_one_out(fleet, ["fedbnr"], config(), JOIN, windows=WINDOWS, seeds=(0,), clients=held)
    fast = leave_one_out_recorded(fleet, "fedbnr", config(), JOIN, windows=WINDOWS, seed=0, clients=held)
    assert [(r.client, r.algorithm, r.window, r.n) for r in fast.rows] == \
        [(r.client, r.algorithm, r.window, r.n) for r in plain.rows]
    for a, b in zip(fast.rows, plain.rows, strict=True):
        for k in ("mse", "nlpd", "coverage"):
            assert math.isclose(getattr(a, k), getattr(b, k), rel_tol=1e-12, abs_tol=0.0), (k, a, b)


def test_a_recording_of_another_run_is_refused(fleet) -> None:  # type: ignore[no-untyped-def]
    rec = record_uploads(fleet, "fedbnr", config(), seed=0, steps=JOIN + max(WINDOWS))
    assert sum(len(u) for u in rec.uploads) > 0 and not rec.rejected.any()
    with pytest.raises(ValueError, match="another algorithm, seed"):
        leave_one_out_recorded(fleet, "fedbnr", config(), JOIN, windows=WINDOWS, seed=1, recording=rec)
    with pytest.raises(ValueError, match="no client named"):
        leave_one_out_recorded(fleet, "fedbnr", config(), JOIN, windows=WINDOWS, seed=0, clients=["x"], recording=rec)


def test_an_arrangement_without_one_aggregation_is_refused(fleet) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="one federated aggregation"):
        record_uploads(fleet, "fedbnr-local", config(), seed=0, steps=20)


def test_the_experts_mixture_uploads_what_the_personalised_learner_alone_does(fleet) -> None:  # type: ignore[no-untyped-def]
    """benchmarks/bench_coldstart.py records the other stations' uploads without the experts' mixture: only the
    personal expert uploads, so the messages must be the same bytes (the experts share one feature computation)."""
    alone = AlgorithmConfig(n_kernels=1, n_features=8, kernels=("gaussian:1",),
                            params={"fedbnr-personal": {"min_upload": 8, "experts": False}})
    mixed = record_uploads(fleet, "fedbnr-personal", config(), seed=2, steps=JOIN + max(WINDOWS))
    plain = record_uploads(fleet, "fedbnr-personal", alone, seed=2, steps=JOIN + max(WINDOWS))
    assert sum(len(u) for u in mixed.uploads) > 4 * (JOIN // 8) - 4
    assert [[(c, encode(m)) for c, m in step] for step in mixed.uploads] == \
        [[(c, encode(m)) for c, m in step] for step in plain.uploads]
