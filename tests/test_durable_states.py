"""Every state object the project stores survives the durable format (streamfed.core.durable, state-file format 2)
by behaviour: a core restored from the file does what the core that wrote it does — the same predictions, the same
update messages (bytes), the same globals — for every registered algorithm in each mode it runs, plain and with
differential privacy, secure aggregation, robust aggregation, without standardisation, and sharded (reducer)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from streamfed import algorithms
from streamfed.fleet.persistence import FORMAT_VERSION, MAGIC, dumps, loads
from streamfed.wire.message import encode
from tests.durable_fleets import Fleet, cases

CASES = cases()
X0 = np.array([0.3, -0.2, 0.5])


def test_the_cases_cover_every_registered_algorithm() -> None:
    assert {c[0] for c in CASES} == set(algorithms.names())
    assert {c[1] for c in CASES} >= {"plain", "dp", "secagg", "robust", "sharded", "raw"}


def through_a_file(state: dict) -> dict:
    data = dumps(state)
    assert data.startswith(MAGIC) and int.from_bytes(data[16:20], "little") == FORMAT_VERSION == 2
    return loads(data)


def same_floats(a: object, b: object) -> bool:
    """Bit-identical (NaN equal to NaN with the same bits), for floats, arrays and None."""
    if a is None or b is None:
        return a is b
    return np.asarray(a, dtype=np.float64).tobytes() == np.asarray(b, dtype=np.float64).tobytes()


def wire(msgs: list) -> list[bytes]:
    """The messages' bytes, but for the wall-clock time each was created at."""
    return [encode(dataclasses.replace(m, created=0.0)) for m in msgs]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "variant", "mode"), CASES, ids=["-".join(c) for c in CASES])
def test_a_restored_fleet_behaves_as_the_one_that_saved_it(name: str, variant: str, mode: str) -> None:
    """Agents, aggregator and reducer after 30 steps and one more read mid-window, restored from their files, then
    both fleets run on: every prediction and every message (updates, acks, globals) is the same, bit for bit.
    Under secure aggregation the masks are fresh randomness, so there the agents only learn (the same
    predictions) and the globals held now are compared."""
    fleet = Fleet.start(name, variant, mode)
    fleet.run(30)
    fleet.step(30)  # saved mid-window: updates taken in, no global built from them yet
    assert fleet.log, "the fleet did nothing"
    fleet.quiet = fleet.cfg.secure_aggregation
    twin = fleet.twin(through_a_file)
    for a, b in zip(fleet.agents, twin.agents, strict=True):
        assert (b.seq, b.steps, b.global_version, sorted(b.outbox), b.counters) == (
            a.seq, a.steps, a.global_version, sorted(a.outbox), a.counters)
        for u, v in zip(a.learner.predict(X0), b.learner.predict(X0), strict=True):
            assert same_floats(u, v)
    assert wire([twin.agg.global_message()]) == wire([fleet.agg.global_message()])
    if fleet.reducer is not None and twin.reducer is not None:
        assert wire([twin.reducer.global_message()]) == wire([fleet.reducer.global_message()])
    fleet.log.clear()
    fleet.run(15)
    twin.run(15)
    assert len(fleet.log) == len(twin.log) > 0
    for i, (a, b) in enumerate(zip(fleet.log, twin.log, strict=True)):
        assert a == b, f"entry {i} of the run after the restore differs"
    assert wire(twin.agg.tick(fleet.now + 30)) == wire(fleet.agg.tick(fleet.now + 30))


def test_a_float_survives_bit_for_bit() -> None:
    """(The fleet test compares behaviour; this one the values a state holds, at the edges.)"""
    nan_payload = np.frombuffer(np.uint64(0x7FF8_0000_DEAD_BEEF).tobytes(), dtype=np.float64)[0]
    st = loads(dumps({"kind": "x", "f": -0.0, "n": float(nan_payload), "a": np.array([nan_payload, -0.0, math.inf])}))
    assert math.copysign(1.0, st["f"]) == -1.0
    assert np.float64(st["n"]).tobytes() == nan_payload.tobytes()
    assert st["a"].tobytes() == np.array([nan_payload, -0.0, math.inf]).tobytes()
