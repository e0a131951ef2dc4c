"""Random Fourier features: exact unit norm, determinism, kernel approximation, fast sincos."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamfed.core.features import (
    KERNEL_KINDS,
    KernelSpec,
    RFFBank,
    RFFMap,
    derive_frequencies,
    gaussian_dictionary,
)

SPECS = [KernelSpec("gaussian", 0.7), KernelSpec("laplacian", 1.5), KernelSpec("matern32", 0.9),
         KernelSpec("matern52", 2.0)]


def plain_features(freqs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """z_p(x) = D^{-1/2}[sin(V_p x), cos(V_p x)] with libm, one kernel at a time.

    V_p x is summed coordinate by coordinate, in the same order as the fast path, so that with huge
    (Cauchy) frequencies the comparison measures sin/cos and not the summation order of the angle.
    """
    d_feat = freqs.shape[1]
    out = []
    for v in freqs:
        a = np.zeros(d_feat)
        for k in range(v.shape[1]):
            a = a + v[:, k] * x[k]
        out.append(np.concatenate([np.sin(a), np.cos(a)]) / np.sqrt(d_feat))
    return np.stack(out)


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float64, 5, elements=st.floats(-1e3, 1e3)), seed=st.integers(0, 2**31))
def test_feature_norm_is_exactly_one(x, seed):
    bank = RFFBank(SPECS, n_features=16, n_inputs=5, seed=seed)
    z = bank.transform_one(x)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=0, atol=1e-14)


@settings(max_examples=100, deadline=None)
@given(x=hnp.arrays(np.float64, 4, elements=st.floats(-50, 50)))
def test_fast_path_matches_libm(x):
    bank = RFFBank(SPECS, n_features=32, n_inputs=4, seed=3)
    np.testing.assert_allclose(bank.transform_one(x), plain_features(bank.frequencies, x), rtol=0, atol=1e-13)


def test_huge_angles_fall_back_to_libm():
    # Cauchy frequencies times large inputs give angles far beyond the polynomial's range
    bank = RFFBank([KernelSpec("laplacian", 1e-4)], n_features=64, n_inputs=3, seed=1)
    x = np.array([1e3, -2e3, 5e2])
    assert np.abs(bank.frequencies[0] @ x).max() > 1e5
    np.testing.assert_allclose(bank.transform_one(x), plain_features(bank.frequencies, x), atol=1e-12)


def test_transform_many_equals_transform_one():
    bank = RFFBank(SPECS, n_features=8, n_inputs=3, seed=2)
    xs = np.random.default_rng(0).standard_normal((20, 3))
    many = bank.transform_many(xs)
    for t in range(20):
        np.testing.assert_array_equal(many[t], bank.transform_one(xs[t]))


def test_frequencies_are_deterministic_and_order_free():
    a = RFFBank(SPECS, 10, 4, seed=11)
    b = RFFBank(list(reversed(SPECS)), 10, 4, seed=11)
    for p, spec in enumerate(SPECS):
        np.testing.assert_array_equal(a.frequencies[p], b.frequencies[len(SPECS) - 1 - p])
        np.testing.assert_array_equal(a.frequencies[p], derive_frequencies(spec, 10, 4, 11))
    assert a.version == RFFBank(SPECS, 10, 4, seed=11).version
    assert not np.array_equal(a.frequencies, RFFBank(SPECS, 10, 4, seed=12).frequencies)
    # a different kernel spec never shares frequencies with another one
    g1 = derive_frequencies(KernelSpec("gaussian", 1.0), 10, 4, 0)
    g2 = derive_frequencies(KernelSpec("gaussian", 2.0), 10, 4, 0)
    assert not np.allclose(g1 * 1.0, g2 * 2.0)


def test_explicit_frequencies_interoperate():
    bank = RFFBank(SPECS, 6, 3, seed=5)
    same = RFFBank.from_frequencies(list(bank.frequencies), specs=SPECS)
    x = np.array([0.3, -0.1, 0.8])
    np.testing.assert_array_equal(same.transform_one(x), bank.transform_one(x))
    assert same.version == bank.version
    with pytest.raises(ValueError):
        RFFBank.from_frequencies(np.full((1, 2, 3), np.nan))


@pytest.mark.parametrize("kind", KERNEL_KINDS)
def test_features_approximate_the_kernel(kind):
    """z(x)·z(x') → k(x, x') as D grows (checks each spectral density)."""
    spec = KernelSpec(kind, 1.3)
    bank = RFFBank([spec], n_features=40000, n_inputs=3, seed=0)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x, x2 = rng.standard_normal(3) * 0.8, rng.standard_normal(3) * 0.8
        approx = float(bank.transform_one(x)[0] @ bank.transform_one(x2)[0])
        assert abs(approx - spec.exact(x, x2)) < 0.02, (kind, approx, spec.exact(x, x2))


def test_bad_input_is_rejected_with_reason():
    bank = RFFBank(SPECS, 4, 3, seed=0)
    with pytest.raises(ValueError, match="shape"):
        bank.transform_one(np.zeros(4))
    with pytest.raises(ValueError, match="non-finite"):
        bank.transform_one(np.array([0.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="unknown kernel"):
        KernelSpec("cosine", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bandwidth"):
        KernelSpec("gaussian", 0.0)


def test_rffmap_bias_and_dictionary():
    specs = gaussian_dictionary(5, 0.1, 10.0)
    assert [s.bandwidth for s in specs] == pytest.approx(list(np.geomspace(0.1, 10.0, 5)))
    bank = RFFBank(specs, 6, 2, seed=0)
    fm = bank.kernel(2)
    x = np.array([0.2, 0.4])
    np.testing.assert_array_equal(fm.transform_one(x), bank.transform_one(x)[2])
    fb = RFFMap(fm.bank, bias=True)
    assert fb.dim == 13 and fb.transform_one(x)[-1] == 1.0
    np.testing.assert_array_equal(fb.transform_many(x[None])[0], fb.transform_one(x))


def test_kernel_refuses_a_short_scratch_instead_of_corrupting_memory():
    from streamfed.core.compiled import features as kern  # the backend in use (build or JIT)

    bank = RFFBank(SPECS, 4, 3, seed=0)
    out = np.empty((len(SPECS), 8))
    with pytest.raises(ValueError, match="scratch"):
        kern.rff_transform_into(bank.frequency_matrix, np.zeros(3), np.empty(len(SPECS) * 4), out)  # needs 2·N·D
    with pytest.raises(ValueError, match="scratch"):
        kern.rff_transform_into(bank.frequency_matrix, np.zeros(2), np.empty(2 * len(SPECS) * 4), out)  # x too short
