"""Bit codes and GF(2) algebra, checked against the independent `galois` implementation."""

import hashlib

import galois
import numpy as np
import pytest
import torch

from fixed_embed.interfaces.codes import (
    bits_of,
    code_width,
    decode_bits,
    gf2_apply,
    gf2_rank,
    matrix_from_rows,
    random_invertible_gf2,
    rows_from_matrix,
)

GF2 = galois.GF(2)


@pytest.mark.parametrize(
    ("vocab", "width"),
    [(2, 1), (3, 2), (4, 2), (5, 3), (256, 8), (257, 9), (8192, 13), (49152, 16), (65536, 16)],
)
def test_code_width_is_ceil_log2(vocab, width):
    assert code_width(vocab) == width


def test_known_bit_codes_little_endian():
    ids = torch.tensor([0, 1, 2, 255, 49151])
    bits = bits_of(ids, 16)
    assert bits[0].tolist() == [0] * 16
    assert bits[1].tolist() == [1] + [0] * 15
    assert bits[2].tolist() == [0, 1] + [0] * 14
    assert bits[3].tolist() == [1] * 8 + [0] * 8
    # 49151 = 0b1011_1111_1111_1111: bit 14 is the only zero.
    assert bits[4].tolist() == [1] * 14 + [0, 1]
    assert torch.equal(decode_bits(bits), ids)


def _random_rows(rng, width):
    return [int(x) for x in rng.integers(0, 2**width, size=width)]


def _to_galois(rows, width):
    return GF2(matrix_from_rows(rows, width).numpy().astype(np.int64))


@pytest.mark.parametrize("width", [1, 2, 5, 13, 16])
def test_rank_matches_galois(width):
    rng = np.random.default_rng(width)
    for _ in range(20):
        rows = _random_rows(rng, width)
        assert gf2_rank(rows) == np.linalg.matrix_rank(_to_galois(rows, width))


def test_apply_matches_galois_matvec():
    width = 16
    rows = random_invertible_gf2(width, 7)
    ids = torch.randint(0, 2**width, (500,))
    got = bits_of(gf2_apply(torch.tensor(rows), ids), width).numpy()
    expected = _to_galois(rows, width) @ GF2(bits_of(ids, width).numpy().T)
    assert np.array_equal(got, np.asarray(expected).T)


def test_random_invertible_is_invertible_and_seeded():
    for width in (1, 3, 13, 16, 20):
        rows = random_invertible_gf2(width, 12345)
        assert gf2_rank(rows) == width
        assert rows == random_invertible_gf2(width, 12345)
    assert random_invertible_gf2(16, 12345) != random_invertible_gf2(16, 12346)


def test_golden_matrix_for_paper_seed():
    """Pins the paper's recoding: any change to the generator changes every gf2 result."""
    rows = random_invertible_gf2(16, 12345)
    assert rows == [
        41839,
        52686,
        35165,
        18669,
        63381,
        16585,
        36686,
        4924,
        10114,
        48879,
        14872,
        63424,
        36826,
        19803,
        7490,
        42,
    ]
    digest = hashlib.sha256(bytes(matrix_from_rows(rows, 16).flatten().tolist())).hexdigest()
    assert digest == "17ad7511edf93d76b1e7caa56c493af933f97f13e34986e91c0143db7aa895a8"


def test_rows_from_matrix_validates():
    assert rows_from_matrix([[1, 0], [1, 1]]) == [0b01, 0b11]
    with pytest.raises(ValueError, match="square"):
        rows_from_matrix([[1, 0, 1], [0, 1, 0]])
    with pytest.raises(ValueError, match=r"0 or 1, got \[2\]"):
        rows_from_matrix([[1, 2], [0, 1]])
