"""The mask PRG (corbin_fl.secagg.prg): range, determinism, domain separation, uniformity."""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from corbin_fl.secagg import prg
from corbin_fl.secagg.packing import pack, unpack


def chi2_threshold(df: int, z: float = 4.753) -> float:
    """Upper 1e-6 quantile of chi-square(df) (Wilson-Hilferty; z is the normal 1e-6 quantile)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def uniform_chi2(values: np.ndarray, cells: int) -> float:
    counts = np.bincount(values.astype(np.int64), minlength=cells)
    expected = values.size / cells
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("bits", [1, 2, 7, 31, 32, 33, 62])
def test_expand_stays_below_2_to_the_bits(bits: int) -> None:
    v = prg.expand(secrets.token_bytes(32), 5000, bits)
    assert v.dtype == np.uint64 and v.shape == (5000,)
    assert int(v.max()) < 2**bits
    assert int(v.max()) >= 2**bits - 2**bits // 64 - 1  # reaches the top of the range


def test_expand_is_deterministic_and_prefix_consistent() -> None:
    key = bytes(range(32))
    a = prg.expand(key, 1000, 13)
    assert np.array_equal(a, prg.expand(key, 1000, 13))
    assert np.array_equal(a[:10], prg.expand(key, 10, 13))
    assert not np.array_equal(a, prg.expand(bytes(32), 1000, 13))


def test_masks_are_domain_separated_by_run_round_purpose_and_parties() -> None:
    seed = secrets.token_bytes(32)
    base = dict(run_id=1, server_round=2, purpose="self-mask", parties=(5,))
    ref = prg.mask(seed, 256, 20, **base)
    for change in (
        {"run_id": 2},
        {"server_round": 3},
        {"purpose": "pair-mask"},
        {"parties": (6,)},
        {"parties": (5, 6)},
    ):
        other = prg.mask(seed, 256, 20, **{**base, **change})
        assert np.mean(other == ref) < 0.01, change
    assert np.array_equal(ref, prg.mask(seed, 256, 20, **base))


def test_expand_is_uniform_chi_square() -> None:
    """200,000 draws mod 2^4: Pearson's statistic against its 1e-6 upper quantile (df = 15)."""
    v = prg.expand(secrets.token_bytes(32), 200_000, 4)
    assert uniform_chi2(v, 16) < chi2_threshold(15)


def test_bad_arguments_are_refused() -> None:
    for bits in (0, 63, 1.5, True):
        with pytest.raises(ValueError, match="bit width"):
            prg.expand(bytes(32), 4, bits)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="32 bytes"):
        prg.expand(bytes(31), 4, 8)
    with pytest.raises(ValueError, match="context"):
        prg.context_info("x", -1, 0)
    with pytest.raises(ValueError, match="label"):
        prg.context_info("a|b", 1, 0)


@pytest.mark.parametrize("bits", [1, 3, 8, 13, 33, 62])
def test_packing_round_trip_is_b_bits_per_value(bits: int) -> None:
    v = prg.expand(secrets.token_bytes(32), 1001, bits)
    data = pack(v, bits)
    assert len(data) == (1001 * bits + 7) // 8
    assert np.array_equal(unpack(data, 1001, bits), v)
    with pytest.raises(ValueError):
        unpack(data[:-1], 1001, bits)
    if (1001 * bits) % 8:
        with pytest.raises(ValueError, match="padding"):
            unpack(data[:-1] + bytes([data[-1] | 1]), 1001, bits)


@pytest.mark.parametrize("bits", [1, 2, 5, 7, 8, 9, 16])
@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 63, 1001])
def test_packing_is_the_msb_first_bit_stream(bits: int, count: int) -> None:
    """Both paths (eight values per ``b`` bytes for ``b <= 8``, bit planes above) write value
    ``i`` into bits ``[i b, (i + 1) b)`` MSB first, zero-padded: checked against the stream
    written out as a string of bits."""
    v = np.random.default_rng(count * 31 + bits).integers(0, 1 << bits, count, dtype=np.uint64)
    stream = "".join(format(int(x), f"0{bits}b") for x in v)
    stream += "0" * (-len(stream) % 8)
    expected = bytes(int(stream[i : i + 8], 2) for i in range(0, len(stream), 8))
    assert pack(v, bits) == expected
    assert np.array_equal(unpack(expected, count, bits), v)
