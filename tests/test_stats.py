"""Sufficient statistics: oracles are plain numpy sums over the samples."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.core.stats import SufficientStats, pack_upper, packed_dim, packed_size, unpack_upper


def _oracle(phi: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """S = Σ φφᵀ etc., written as explicit loops over samples."""
    f = phi.shape[-1]
    s = np.zeros(phi.shape[1:-1] + (f, f))
    b = np.zeros(phi.shape[1:])
    for t in range(phi.shape[0]):
        s += phi[t][..., :, None] * phi[t][..., None, :]
        b += phi[t] * y[t]
    return s, b, float(len(y)), float(sum(v * v for v in y))


@given(dim=st.integers(1, 12), batch=st.lists(st.integers(1, 3), max_size=2), seed=st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_pack_unpack_roundtrip(dim: int, batch: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(tuple(batch) + (dim, dim))
    sym = a + np.swapaxes(a, -1, -2)
    packed = pack_upper(sym)
    assert packed.shape == tuple(batch) + (packed_size(dim),)
    # Order is numpy.triu_indices: row by row, diagonal first.
    iu = np.triu_indices(dim)
    assert np.array_equal(packed, sym[..., iu[0], iu[1]])
    assert np.array_equal(unpack_upper(packed), sym)
    assert np.array_equal(unpack_upper(packed, dim), sym)
    assert packed_dim(packed.shape[-1]) == dim


def test_packed_dim_rejects_non_triangular() -> None:
    with pytest.raises(ValueError):
        packed_dim(5)
    with pytest.raises(ValueError):
        unpack_upper(np.zeros(6), dim=4)
    with pytest.raises(ValueError):
        pack_upper(np.zeros((2, 3)))


@given(n=st.integers(1, 30), dim=st.integers(1, 8), cut=st.floats(0, 1), seed=st.integers(0, 2**31))
@settings(max_examples=40, deadline=None)
def test_from_samples_matches_oracle_and_is_additive(n: int, dim: int, cut: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((n, dim))
    y = rng.standard_normal(n)
    s, b, nn, q = _oracle(phi, y)
    full = SufficientStats.from_samples(phi, y, kernel_version="v")
    assert np.allclose(full.S, s, rtol=1e-12, atol=1e-12)
    assert np.allclose(full.b, b, rtol=1e-12, atol=1e-12)
    assert full.n == nn and math.isclose(full.q, q, rel_tol=1e-12)
    k = int(cut * n)
    a = SufficientStats.from_samples(phi[:k], y[:k], kernel_version="v") if k else SufficientStats.zeros(
        dim, kernel_version="v")
    c = SufficientStats.from_samples(phi[k:], y[k:], kernel_version="v")
    total = a + c
    assert np.allclose(total.S, s, rtol=1e-12, atol=1e-12)
    assert total.n == n
    back = total - c
    assert np.allclose(back.S, a.S, atol=1e-10) and np.allclose(back.b, a.b, atol=1e-10)
    assert back.n == a.n
    acc = SufficientStats.zeros(dim, kernel_version="v")
    acc += a
    acc += c
    assert np.allclose(acc.S, s, atol=1e-12)
    acc -= c
    assert acc.n == a.n


def test_batch_axis_for_a_kernel_dictionary() -> None:
    rng = np.random.default_rng(1)
    phi = rng.standard_normal((20, 3, 4))  # T=20 samples, K=3 feature maps, F=4
    y = rng.standard_normal(20)
    st_ = SufficientStats.from_samples(phi, y)
    s, b, _, _ = _oracle(phi, y)
    assert st_.batch_shape == (3,) and st_.dim == 4
    assert np.allclose(st_.S, s) and np.allclose(st_.b, b)
    assert st_.to_packed()["S_upper"].shape == (3, 10)
    assert SufficientStats.from_packed(st_.to_packed()) == st_


def test_packed_roundtrip_is_exact_and_pickles() -> None:
    rng = np.random.default_rng(2)
    st_ = SufficientStats.from_samples(rng.standard_normal((7, 5)), rng.standard_normal(7), "ver", epoch=3)
    wire = st_.to_packed()
    assert set(wire) == {"S_upper", "b", "n", "q", "kernel_version", "epoch"}
    back = SufficientStats.from_packed(wire)
    assert back == st_ and back.tag == ("ver", 3)
    assert pickle.loads(pickle.dumps(st_)) == st_
    # The packed form does not alias the statistics.
    wire["b"][0] += 1.0
    assert back == st_


def test_incompatible_statistics_cannot_be_combined() -> None:
    a = SufficientStats.zeros(3, kernel_version="v1")
    with pytest.raises(ValueError, match="kernel version"):
        a + SufficientStats.zeros(3, kernel_version="v2")
    with pytest.raises(ValueError, match="kernel version"):
        a - SufficientStats.zeros(3, kernel_version="v1", epoch=1)
    with pytest.raises(ValueError, match="shape"):
        a += SufficientStats.zeros(4, kernel_version="v1")
    with pytest.raises(TypeError):
        a + 1  # type: ignore[operator]
    with pytest.raises(ValueError):
        SufficientStats(np.zeros((3, 3)), np.zeros(2), 0, 0)


def test_noise_and_masks_are_representable() -> None:
    """DP noise / secure-aggregation masks: fractional n, indefinite S — allowed, and they cancel."""
    rng = np.random.default_rng(3)
    st_ = SufficientStats.from_samples(rng.standard_normal((5, 3)), rng.standard_normal(5), "v")
    mask_upper = rng.standard_normal(6) * 1e3
    mask = SufficientStats(unpack_upper(mask_upper), rng.standard_normal(3), 0.5, -2.0, "v")
    masked = st_ + mask
    assert masked.n == 5.5
    unmasked = masked - mask
    assert np.allclose(unmasked.S, st_.S, atol=1e-9) and math.isclose(unmasked.n, 5.0)
    assert st_.scaled(0.5).n == 2.5


def test_non_finite_statistics_are_detected() -> None:
    st_ = SufficientStats.zeros(2)
    assert st_.is_finite()
    st_.b[1] = np.nan
    assert not st_.is_finite()
    with pytest.raises(ValueError, match="non-finite"):
        st_.check_finite()
    st2 = SufficientStats.zeros(2)
    st2.q = math.inf
    with pytest.raises(ValueError):
        st2.check_finite()


def test_construction_copies_inputs() -> None:
    s = np.eye(2)
    st_ = SufficientStats(s, np.zeros(2), 1, 1)
    s[0, 0] = 5.0
    assert st_.S[0, 0] == 1.0
    c = st_.copy()
    c.S[1, 1] = 9.0
    assert st_.S[1, 1] == 1.0


@pytest.mark.parametrize("dim", [101, 513])  # through the cached gather index, and past its size limit
def test_unpack_upper_is_the_mirrored_triangle(dim: int) -> None:
    rng = np.random.default_rng(dim)
    packed = rng.standard_normal((2, packed_size(dim)))
    full = unpack_upper(packed, dim)
    for k in range(2):
        want = np.zeros((dim, dim))
        want[np.triu_indices(dim)] = packed[k]  # the upper triangle row by row, then mirrored
        want = want + np.triu(want, 1).T
        assert np.array_equal(full[k], want)
    full[0, 0, 0] = 7.0  # a copy: the packed input is not changed through it
    assert packed[0, 0] != 7.0
