"""Secure aggregation (streamfed.privacy.secagg, shamir, fixed_point): exact sums under dropouts, masked
uploads indistinguishable from uniform, Shamir thresholds, and every malformed message refused."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from streamfed.privacy import fixed_point, shamir
from streamfed.privacy.secagg import (
    CIPHERTEXT_BYTES,
    KEY_BYTES,
    Keys,
    Neighbourhood,
    SecAggClient,
    SecAggError,
    SecAggServer,
    SecAggSettings,
    default_degree,
    harary_neighbours,
    harary_size,
    run_round,
)

# --------------------------------------------------------------------------- exact sums with dropouts


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], list[str], list[str], list[str], int | None, int]:
    n = draw(st.integers(3, 24))
    m = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    clients = [f"c{i}" for i in range(n)]
    # float64 values as FedBNR statistics are: mixed magnitudes and signs
    floats = {c: rng.normal(0, 10.0 ** rng.integers(-3, 4), m) for c in clients}
    dropped = draw(st.lists(st.sampled_from(clients), unique=True, max_size=n // 3))
    cut1, cut2 = sorted(draw(st.tuples(st.integers(0, len(dropped)), st.integers(0, len(dropped)))))
    degree = draw(st.one_of(st.none(), st.integers(2, max(2, n - 1))))
    return floats, dropped[:cut1], dropped[cut1:cut2], dropped[cut2:], degree, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_unmasked_sum_equals_plain_fixed_point_sum_with_dropouts(fleet: tuple) -> None:
    floats, before_share, before_mask, before_unmask, degree, seed = fleet
    n = len(floats)
    bound = max(float(np.max(np.abs(v))) for v in floats.values())
    f = fixed_point.frac_bits_for(bound, n)
    enc = {c: fixed_point.encode(v, f) for c, v in floats.items()}
    try:
        total = run_round(enc, round_id=seed % 1000 + 1, degree=degree, graph_seed=seed,
                          drop_before_sharing=before_share, drop_before_masking=before_mask,
                          drop_before_unmasking=before_unmask)
    except SecAggError as e:
        # a sparse neighbourhood may lose too many members: the round must say so, never give a wrong sum
        assert e.reason in ("recovery_failed", "too_few_neighbours", "too_few_clients"), e
        if degree is None or degree >= n - 1:  # everyone a neighbour: fails only past what a majority allows
            k = n - 1
            gone = len(before_share) + len(before_mask) + len(before_unmask)
            assert e.reason != "recovery_failed" or gone > k - (k // 2 + 1), e
        return
    included = [c for c in floats if c not in set(before_share) | set(before_mask)]
    plain = np.zeros_like(total)
    for c in included:
        plain += enc[c]  # the oracle: plain integer sum of the fixed-point encodings, modulo 2^64
    assert np.array_equal(total, plain)
    got = fixed_point.decode(total, f)
    rows = np.array([floats[c] for c in included]).reshape(len(included), -1)
    want = rows.sum(axis=0)
    # each input's rounding to the grid, plus the float reference sum's own rounding
    tol = len(included) * (2.0 ** -(f + 1) + 2.0**-52 * np.abs(rows).sum(axis=0))
    assert np.all(np.abs(got - want) <= tol)


def test_full_graph_always_recovers_fewer_than_half_dropping() -> None:
    """With a majority threshold `t = ⌊k/2⌋ + 1` a round recovers while at most `k - t` of a neighbourhood drop
    (fewer than half; a round of 3 cannot lose a member: the price of the majority, docs/privacy.md)."""
    rng = np.random.default_rng(1)
    for n in (4, 6, 9, 15):
        xs = {f"c{i}": rng.integers(0, 2**64, 8, dtype=np.uint64) for i in range(n)}
        names = sorted(xs)
        k = n - 1
        drop = names[: k - (k // 2 + 1)]
        total = run_round(xs, degree=n - 1, drop_before_unmasking=drop[: len(drop) // 2],
                          drop_before_masking=drop[len(drop) // 2:])
        want = np.zeros(8, dtype=np.uint64)
        for c in names:
            if c not in drop[len(drop) // 2:]:
                want += xs[c]
        assert np.array_equal(total, want)


def test_sparse_graph_of_a_hundred_recovers_random_dropouts() -> None:
    rng = np.random.default_rng(2)
    xs = {f"c{i:03d}": rng.integers(0, 2**64, 16, dtype=np.uint64) for i in range(100)}
    names = sorted(xs)
    drop = list(rng.choice(names, 33, replace=False))
    total = run_round(xs, graph_seed=5, drop_before_masking=drop[:15], drop_before_unmasking=drop[15:])
    want = np.zeros(16, dtype=np.uint64)
    for c in names:
        if c not in drop[:15]:
            want += xs[c]
    assert np.array_equal(total, want)


def test_harary_graph_is_regular_symmetric_and_seeded() -> None:
    names = [f"c{i}" for i in range(50)]
    g = harary_neighbours(names, 10, seed=3)
    assert all(len(v) == 10 for v in g.values())
    assert all(u in g[v] for u, vs in g.items() for v in vs)
    assert g == harary_neighbours(list(reversed(names)), 10, seed=3)
    assert g != harary_neighbours(names, 10, seed=4)


# --------------------------------------------------------------------------- what the server sees


def _masked_upload(x: np.ndarray, n: int = 3) -> np.ndarray:
    s = SecAggSettings(round_id=9, clients=tuple(f"c{i}" for i in range(n)), length=x.size)
    cs = [SecAggClient(c, s) for c in s.clients]
    srv = SecAggServer(s)
    for c in cs:
        srv.add_keys(c.advertise())
    for c in cs:
        srv.add_shares(c.client, c.share_keys(srv.roster()))
    return cs[0].masked_input(x, srv.forwarded("c0"))


def test_one_masked_upload_is_indistinguishable_from_uniform() -> None:
    # a structured input (small fixed-point values: top bits all 0 or all 1) ...
    x = fixed_point.encode(np.linspace(-1, 1, 20_000), 40)
    top = (x >> np.uint64(56)).astype(np.int64)
    assert stats.chisquare(np.bincount(top, minlength=256)).pvalue < 1e-12  # the test can fail
    assert stats.kstest(x.astype(np.float64) / 2.0**64, "uniform").pvalue < 1e-12
    # ... masked, as the aggregator (or anyone on the broker) receives it
    y = _masked_upload(x)
    top = (y >> np.uint64(56)).astype(np.int64)
    low = (y & np.uint64(0xFF)).astype(np.int64)
    assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-4
    assert stats.chisquare(np.bincount(low, minlength=256)).pvalue > 1e-4
    assert stats.kstest(y.astype(np.float64) / 2.0**64, "uniform").pvalue > 1e-4


# --------------------------------------------------------------------------- Shamir


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**256 - 1), st.integers(1, 12), st.data())
def test_shamir_any_t_shares_reconstruct_and_t_minus_one_do_not(secret: int, t: int, data: st.DataObject) -> None:
    n = data.draw(st.integers(t, 16))
    shares = shamir.split(secret, n, t, rng=random.Random(data.draw(st.integers(0, 2**32))))
    subset = data.draw(st.lists(st.sampled_from(shares), min_size=t, max_size=n, unique=True))
    assert shamir.reconstruct(subset) == secret
    if t > 1:
        fewer = subset[: t - 1]
        assert shamir.reconstruct(fewer) != secret
        # t - 1 shares fit every secret: for any candidate there is a degree-(t-1) polynomial through them
        other = (secret + 1) % shamir.PRIME
        fake = [*fewer, (0, other)]
        x_new = max(x for x, _ in shares) + 1
        y_new = _lagrange_at(fake, x_new)
        assert shamir.reconstruct([*fewer, (x_new, y_new)]) == other


def _lagrange_at(points: list[tuple[int, int]], x: int) -> int:
    p = shamir.PRIME
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * (x - xj) % p
                den = den * (xi - xj) % p
        total = (total + yi * num * pow(den, -1, p)) % p
    return total


def test_shamir_share_bytes_round_trip_and_refusals() -> None:
    y = shamir.PRIME - 1
    assert shamir.from_bytes(shamir.to_bytes(y)) == y
    with pytest.raises(ValueError):
        shamir.from_bytes(b"\x00" * 65)
    with pytest.raises(ValueError):
        shamir.from_bytes(b"\xff" * 66)
    with pytest.raises(ValueError):
        shamir.split(5, 3, 4)


# --------------------------------------------------------------------------- fixed point


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30), st.integers(1, 1000))
def test_fixed_point_sums_never_overflow_at_the_chosen_scale(xs: list[float], n: int) -> None:
    bound = max(max(abs(x) for x in xs), 1e-300)
    f = fixed_point.frac_bits_for(bound, n)
    enc = fixed_point.encode(xs, f)
    total = np.zeros_like(enc)
    for _ in range(n):
        total += enc
    # the integer sum, in Python integers, matches the ring's and stays below 2^63
    exact = [int(np.int64(e.view(np.int64))) * n for e in enc]
    assert all(abs(v) < 2**63 for v in exact)
    assert fixed_point.decode(total, f).tolist() == [v / 2.0**f for v in exact]


def test_fixed_point_refuses_what_it_cannot_encode() -> None:
    with pytest.raises(ValueError):
        fixed_point.encode([np.nan], 10)
    with pytest.raises(ValueError):
        fixed_point.encode([2.0**60], 10)
    with pytest.raises(ValueError):
        fixed_point.frac_bits_for(1e300, 10)


# --------------------------------------------------------------------------- validation


def test_every_malformed_message_is_refused_with_a_reason() -> None:
    s = SecAggSettings(round_id=3, clients=("a", "b", "c", "d"), length=4)
    cs = {c: SecAggClient(c, s) for c in s.clients}
    srv = SecAggServer(s)

    def reason(f: object, *args: object) -> str:
        with pytest.raises(SecAggError) as e:
            f(*args)  # type: ignore[operator]
        return e.value.reason

    assert reason(srv.add_keys, Keys("zz", bytes(32), bytes(range(32)))) == "bad_roster"
    assert reason(srv.add_keys, Keys("a", bytes(32), bytes(32))) == "bad_key"
    for c in cs.values():
        srv.add_keys(c.advertise())
    assert reason(srv.add_keys, cs["a"].advertise()) == "duplicate"
    assert reason(srv.add_masked, "a", np.zeros(4, dtype=np.uint64)) == "out_of_order"
    roster = srv.roster()
    cts = {c: cs[c].share_keys(roster) for c in s.clients}
    assert reason(srv.add_shares, "a", {"b": b"x" * 5}) == "bad_ciphertext"
    assert reason(srv.add_shares, "a", {"q": b"x" * CIPHERTEXT_BYTES}) == "not_a_neighbour"
    for c in s.clients:
        srv.add_shares(c, cts[c])
    assert reason(srv.add_masked, "a", np.zeros(3, dtype=np.uint64)) == "bad_vector"
    assert reason(srv.add_masked, "a", np.zeros(4, dtype=np.float64)) == "bad_vector"
    assert reason(cs["a"].masked_input, np.zeros(4, dtype=np.int64), srv.forwarded("a")) == "bad_vector"
    for c in ("a", "b", "c"):
        srv.add_masked(c, cs[c].masked_input(np.ones(4, dtype=np.uint64), srv.forwarded(c)))
    survivors = srv.survivors()
    # a survivor's unmasking may reveal only the self-mask share of a survivor, the key share of a dropout
    shares = cs["a"].unmask(survivors)
    assert shares["b"][0] == "b" and shares["d"][0] == "s"
    forged = dict(shares)
    forged["b"] = ("s", shares["b"][1])
    assert reason(srv.add_unmasking, "a", forged) == "wrong_share"
    assert reason(cs["a"].unmask, survivors) == "out_of_order"  # never twice
    assert reason(cs["b"].unmask, {"a", "c"}) == "bad_survivors"  # b sent its input: it must be listed
    assert reason(srv.add_unmasking, "d", {}) == "out_of_order"  # not a survivor
    srv.add_unmasking("a", shares)
    assert reason(srv.result) == "recovery_failed"  # one share of each secret, threshold 2
    srv.add_unmasking("b", cs["b"].unmask(survivors))
    assert reason(srv.result) == "recovery_failed"  # still one share of a's own seed: b holds it, a cannot
    srv.add_unmasking("c", cs["c"].unmask(survivors))
    assert srv.result().tolist() == [3, 3, 3, 3]


def test_a_roster_given_again_is_taken_only_if_it_is_the_same() -> None:
    """A client keeps its neighbours' keys as it was handed them: the same roster again (a repeated request) is
    taken, one that differs in any key is refused, and the round still sums exactly with the keys first given."""
    s = SecAggSettings(round_id=6, clients=("a", "b", "c", "d"), length=3)
    cs = {c: SecAggClient(c, s) for c in s.clients}
    srv = SecAggServer(s)
    for c in cs.values():
        srv.add_keys(c.advertise())
    for c in s.clients:
        srv.add_shares(c, cs[c].share_keys(srv.roster_for(c)))
    again = {c: Keys(k.client, bytes(k.c_pk), bytes(k.s_pk)) for c, k in srv.roster_for("a").items()}
    cs["a"].share_keys(again)  # equal keys in new objects: the same roster
    other = SecAggClient("b", s).advertise()  # b's name, someone else's keys
    for changed in (Keys("b", other.c_pk, again["b"].s_pk), Keys("b", again["b"].c_pk, other.s_pk)):
        with pytest.raises(SecAggError) as e:
            cs["a"].share_keys({**again, "b": changed})
        assert e.value.reason == "out_of_order"
    xs = {c: np.array([i, 2 * i, 2**64 - 1 - i], dtype=np.uint64) for i, c in enumerate(s.clients)}
    for c in s.clients:
        srv.add_masked(c, cs[c].masked_input(xs[c], srv.forwarded(c)))
    for c in s.clients:
        srv.add_unmasking(c, cs[c].unmask(srv.survivors_for(c)))
    want = np.zeros(3, dtype=np.uint64)
    for x in xs.values():
        want += x
    assert np.array_equal(srv.result(), want)


def test_a_client_refuses_shares_that_were_not_made_for_it() -> None:
    s = SecAggSettings(round_id=4, clients=("a", "b", "c"), length=2)
    cs = {c: SecAggClient(c, s) for c in s.clients}
    srv = SecAggServer(s)
    for c in cs.values():
        srv.add_keys(c.advertise())
    cts = {c: cs[c].share_keys(srv.roster()) for c in s.clients}
    swapped = {"b": cts["b"]["c"], "c": cts["c"]["a"]}  # b's ciphertext for c handed to a
    cs["a"].masked_input(np.zeros(2, dtype=np.uint64), swapped)
    with pytest.raises(SecAggError) as e:
        cs["a"].unmask({"a", "b", "c"})
    assert e.value.reason == "bad_ciphertext"


# --------------------------------------------------------------------------- a member knows its neighbourhood only


def test_a_member_is_handed_and_accepts_only_its_neighbours_keys() -> None:
    s = SecAggSettings(round_id=2, clients=tuple(f"c{i:02d}" for i in range(40)), length=3, graph_seed=11)
    assert s.degree is not None and s.degree < 39  # sparse: most members are not neighbours
    cs = {c: SecAggClient(c, s) for c in s.clients}
    srv = SecAggServer(s)
    for c in cs.values():
        srv.add_keys(c.advertise())
    for c in s.clients:
        assert set(srv.roster_for(c)) == {c, *s.neighbours[c]}
    # the whole roster, or one stranger in it, is refused: a member holds no key of a non-neighbour
    stranger = next(c for c in s.clients if c != "c00" and c not in s.neighbours["c00"])
    with pytest.raises(SecAggError) as e:
        cs["c00"].share_keys(srv.roster())
    assert e.value.reason == "bad_roster"
    with pytest.raises(SecAggError) as e:
        cs["c00"].share_keys({**srv.roster_for("c00"), stranger: srv.keys[stranger]})
    assert e.value.reason == "bad_roster"
    # its own entry must carry its own keys
    forged = dict(srv.roster_for("c00"))
    forged["c00"] = Keys("c00", srv.keys[stranger].c_pk, srv.keys[stranger].s_pk)
    with pytest.raises(SecAggError) as e:
        cs["c00"].share_keys(forged)
    assert e.value.reason == "bad_roster"


def test_an_announced_neighbourhood_is_held_to_the_public_rule() -> None:
    k = harary_size(1000, default_degree(1000))
    names = [f"n{i}" for i in range(k)]
    v = Neighbourhood.announced(5, "me", names, members=1000, length=8)
    assert v.threshold == k // 2 + 1 == 21
    for bad in (names[:-1], [*names, "extra"]):  # fewer neighbours (a lower threshold) or more: refused
        with pytest.raises(SecAggError) as e:
            Neighbourhood.announced(5, "me", bad, members=1000, length=8)
        assert e.value.reason == "bad_roster"
    with pytest.raises(SecAggError):
        Neighbourhood.announced(5, "me", [*names[:-1], "me"], members=1000, length=8)  # itself as a neighbour


@pytest.mark.slow
def test_bytes_down_per_member_grow_with_the_neighbourhood_not_the_fleet() -> None:
    """In process, with every member's keys, shares and survivors as the fleet sends them: the most any member
    receives is bounded by its neighbourhood (two keys, a ciphertext, a survivor index per neighbour)."""
    rng = np.random.default_rng(5)
    for n in (50, 400):
        xs = {f"c{i:03d}": rng.integers(0, 2**64, 2, dtype=np.uint64) for i in range(n)}
        stats: dict[str, float] = {}
        run_round(xs, graph_seed=n, stats=stats)
        k = harary_size(n, default_degree(n))
        assert stats["max_bytes_down"] <= (k + 1) * (2 * KEY_BYTES + CIPHERTEXT_BYTES + 8)
    assert stats["max_bytes_down"] < n * 2 * KEY_BYTES  # at 400: below the full roster's keys alone
