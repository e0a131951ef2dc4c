"""The primitives of secure aggregation against plain transcriptions of their specifications: the mask PRG
(HKDF-SHA256, RFC 5869, then the ChaCha20 keystream, RFC 8439, both written out here from the RFCs and checked
on the RFCs' own test vectors), a client's masked input against its formula, and Shamir's split against
Horner's rule, with the reconstruction property over the sizes SecAgg+ uses."""

from __future__ import annotations

import hashlib
import hmac
import random
import struct

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from streamfed.privacy import shamir
from streamfed.privacy.secagg import SecAggClient, SecAggServer, SecAggSettings, masks, prg

# --------------------------------------------------------------------------- the oracles, from the RFCs


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32, salt: bytes = b"") -> bytes:
    """RFC 5869 §2.2–2.3: PRK = HMAC(salt or 0^32, IKM); T(i) = HMAC(PRK, T(i-1) | info | i)."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


def _rotl(v: int, c: int) -> int:
    return ((v << c) & 0xFFFFFFFF) | (v >> (32 - c))


def chacha20_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """RFC 8439 §2.3: 20 rounds (10 column + diagonal double rounds) over the 16-word state, added to it."""
    state = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *struct.unpack("<8I", key), counter,
             *struct.unpack("<3I", nonce)]
    w = list(state)

    def qr(a: int, b: int, c: int, d: int) -> None:
        w[a] = (w[a] + w[b]) & 0xFFFFFFFF
        w[d] = _rotl(w[d] ^ w[a], 16)
        w[c] = (w[c] + w[d]) & 0xFFFFFFFF
        w[b] = _rotl(w[b] ^ w[c], 12)
        w[a] = (w[a] + w[b]) & 0xFFFFFFFF
        w[d] = _rotl(w[d] ^ w[a], 8)
        w[c] = (w[c] + w[d]) & 0xFFFFFFFF
        w[b] = _rotl(w[b] ^ w[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12), qr(1, 5, 9, 13), qr(2, 6, 10, 14), qr(3, 7, 11, 15)
        qr(0, 5, 10, 15), qr(1, 6, 11, 12), qr(2, 7, 8, 13), qr(3, 4, 9, 14)
    return struct.pack("<16I", *((x + y) & 0xFFFFFFFF for x, y in zip(w, state, strict=True)))


def chacha20_keystream(key: bytes, n_bytes: int, counter: int = 0, nonce: bytes = bytes(12)) -> bytes:
    blocks = b"".join(chacha20_block(key, counter + i, nonce) for i in range(-(-n_bytes // 64)))
    return blocks[:n_bytes]


def prg_oracle(seed: bytes, length: int, round_id: int, label: bytes = b"mask") -> np.ndarray:
    """The documented PRG: the ChaCha20 keystream (counter 0, nonce 0) under HKDF(seed, "streamfed-secagg/
    <label>/<round>"), read as little-endian uint64."""
    key = hkdf_sha256(seed, b"streamfed-secagg/" + label + b"/" + str(round_id).encode())
    return np.frombuffer(chacha20_keystream(key, 8 * length), dtype="<u8").astype(np.uint64)


def test_the_oracles_reproduce_the_rfcs_test_vectors() -> None:
    # RFC 5869 A.1 (SHA-256, 42 bytes)
    okm = hkdf_sha256(bytes([0x0B] * 22), bytes(range(0xF0, 0xFA)), 42, salt=bytes(range(13)))
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")
    # RFC 8439 §2.3.2 (the block function)
    block = chacha20_block(bytes(range(32)), 1, bytes.fromhex("000000090000004a00000000"))
    assert block.hex() == ("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
                           "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")


# --------------------------------------------------------------------------- the PRG and the masks


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.integers(0, 40), st.integers(1, 10**6),
       st.sampled_from([b"mask", b"self"]))
def test_prg_is_the_chacha20_keystream_under_hkdf(seed: bytes, length: int, round_id: int, label: bytes) -> None:
    got = prg(seed, length, round_id, label)
    assert got.dtype == np.uint64 and got.shape == (length,)
    assert np.array_equal(got, prg_oracle(seed, length, round_id, label))


def test_masks_are_the_rows_of_their_seeds_prg_and_differ_by_round_and_label() -> None:
    rng = random.Random(4)
    seeds = [(rng.randbytes(32), rng.choice([b"mask", b"self"])) for _ in range(7)]
    m = masks(seeds, 19, round_id=5)
    assert m.shape == (7, 19) and m.dtype == np.uint64
    for row, (seed, label) in zip(m, seeds, strict=True):
        assert np.array_equal(row, prg_oracle(seed, 19, 5, label))
    assert masks([], 19, 5).shape == (0, 19)
    seed = seeds[0][0]
    assert not np.array_equal(prg(seed, 8, 5, b"mask"), prg(seed, 8, 6, b"mask"))
    assert not np.array_equal(prg(seed, 8, 5, b"mask"), prg(seed, 8, 5, b"self"))


def test_a_masked_input_is_its_formula_with_the_agreed_keys() -> None:
    """`y_u = x_u + PRG(b_u, "self") + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv)` with `s_uv = HKDF(X25519(s_u, s_v),
    "streamfed-secagg/mask/<round>")`, recomputed here from the oracles; `b_u` is what the unmasking reveals."""
    s = SecAggSettings(round_id=11, clients=("a", "b", "c", "d"), length=9)
    keys = {c: (X25519PrivateKey.generate(), X25519PrivateKey.generate()) for c in s.clients}
    cs = {c: SecAggClient(c, s, keys=keys[c]) for c in s.clients}
    srv = SecAggServer(s)
    for c in cs.values():
        srv.add_keys(c.advertise())
    for c in cs.values():
        srv.add_shares(c.client, c.share_keys(srv.roster_for(c.client)))
    rng = np.random.default_rng(0)
    xs = {c: rng.integers(0, 2**64, 9, dtype=np.uint64) for c in s.clients}
    ys = {c: cs[c].masked_input(xs[c], srv.forwarded(c)) for c in s.clients}
    for c in s.clients:
        srv.add_masked(c, ys[c])
    revealed = {c: cs[c].unmask(srv.survivors_for(c)) for c in s.clients}
    for c, shares in revealed.items():
        srv.add_unmasking(c, shares)
    for u in s.clients:
        # u's self-mask seed from t of its neighbours' shares (abscissa: the holder's place in u's neighbours)
        pts = [(s.share_index(u, h), shamir.from_bytes(revealed[h][u][1])) for h in s.neighbours[u]]
        b_u = shamir.reconstruct(pts[: s.threshold]).to_bytes(32, "big")
        want = xs[u] + prg_oracle(b_u, 9, 11, b"self")
        for v in s.neighbours[u]:
            shared = keys[u][1].exchange(X25519PublicKey.from_public_bytes(cs[v].advertise().s_pk))
            mask = prg_oracle(hkdf_sha256(shared, b"streamfed-secagg/mask/11"), 9, 11)
            want = want + mask if u < v else want - mask
        assert np.array_equal(ys[u], want), u
    assert np.array_equal(srv.result(), sum(xs.values()))


# --------------------------------------------------------------------------- Shamir


def horner_split(secret: int, n: int, t: int, rng: random.Random) -> list[tuple[int, int]]:
    """The textbook split: coefficients `a_1..a_{t-1}` drawn in order, `y(x)` by Horner's rule modulo p."""
    coeffs = [secret] + [rng.randrange(shamir.PRIME) for _ in range(t - 1)]
    out = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coeffs):
            y = (y * x + c) % shamir.PRIME
        out.append((x, y))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, shamir.PRIME - 1), st.integers(1, 120), st.data())
def test_shamir_split_is_the_polynomial_of_its_coefficients(secret: int, n: int, data: st.DataObject) -> None:
    # n·t above the power table's bound takes Horner's path inside `split`: both are checked
    t = data.draw(st.integers(1, n))
    seed = data.draw(st.integers(0, 2**32))
    assert shamir.split(secret, n, t, rng=random.Random(seed)) == horner_split(secret, n, t, random.Random(seed))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**256 - 1), st.integers(2, 68), st.data())
def test_shamir_any_t_of_a_neighbourhood_reconstruct_with_fresh_randomness(secret: int, k: int,
                                                                           data: st.DataObject) -> None:
    t = data.draw(st.integers(1, k))
    shares = shamir.split(secret, k, t)  # the OS's randomness, as a client draws it
    order = data.draw(st.permutations(range(k)))
    assert shamir.reconstruct([shares[i] for i in order[:t]]) == secret
    assert shamir.reconstruct([shares[i] for i in order]) == secret  # more than t: the same polynomial
    if t > 1:
        assert shamir.reconstruct([shares[i] for i in order[: t - 1]]) != secret


def test_random_elements_are_uniform_field_elements() -> None:
    draws = shamir.random_elements(20_000)
    assert len(draws) == 20_000 and all(0 <= v < shamir.PRIME for v in draws)
    assert len(set(draws)) == len(draws)
    # the top 9 bits (512..520) and the low byte spread evenly: no bit of the 521 is fixed or skewed
    top = np.bincount([v >> 512 for v in draws], minlength=512)
    low = np.bincount([v & 0xFF for v in draws], minlength=256)
    assert stats.chisquare(top).pvalue > 1e-4 and stats.chisquare(low).pvalue > 1e-4
    assert shamir.random_elements(0) == []
