"""Tests of mechanisms.packing: wire packing, BitCounter, mean_from_counts, SumAccumulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from corbin_fl.mechanisms import (
    BitCounter,
    SumAccumulator,
    alpha,
    corbinq,
    decode,
    ldpq,
    mean_from_counts,
    pack_bits,
    packed_len,
    unpack_bits,
)
from corbin_fl.mechanisms import packing as pk

torch.set_num_threads(1)


def random_bits(m: int, seed: int, density: float = 0.5) -> torch.Tensor:
    return torch.rand(m, generator=torch.Generator().manual_seed(seed)) < density


# ----------------------------------------------------------------------------- pack / unpack
def test_pack_layout_is_numpy_big_endian() -> None:
    bits = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    packed = pack_bits(bits)
    assert packed.dtype == np.uint8
    assert packed.tolist() == [0b10000001, 0b11000000]
    assert pack_bits(torch.zeros(0, dtype=torch.bool)).shape == (0,)
    assert packed_len(10) == 2 and packed_len(16) == 2 and packed_len(0) == 0


@pytest.mark.parametrize("m", [*range(0, 70), 1000, 4097, 65_539])
def test_pack_unpack_round_trip(m: int) -> None:
    bits = random_bits(m, seed=m)
    packed = pack_bits(bits)
    assert packed.shape == ((m + 7) // 8,)
    assert np.array_equal(packed, np.packbits(bits.numpy()))
    back = unpack_bits(packed, m)
    assert back.dtype == torch.bool and torch.equal(back, bits)
    assert torch.equal(unpack_bits(packed.tobytes(), m, device="cpu"), bits)
    assert np.array_equal(pk._pack_bits_torch(bits).numpy(), packed)  # accelerator variant


def test_pack_accepts_any_shape() -> None:
    bits = random_bits(60, seed=1).view(3, 4, 5)
    assert torch.equal(unpack_bits(pack_bits(bits), 60), bits.reshape(-1))


def test_unpack_rejects_malformed() -> None:
    bits = random_bits(13, seed=2)
    packed = pack_bits(bits)
    with pytest.raises(ValueError, match="exactly"):
        unpack_bits(packed[:1], 13)
    with pytest.raises(ValueError, match="exactly"):
        unpack_bits(np.concatenate([packed, np.zeros(1, np.uint8)]), 13)
    tampered = packed.copy()
    tampered[-1] |= 0b00000001  # a padding bit (13 bits -> 3 padding bits)
    with pytest.raises(ValueError, match="padding"):
        unpack_bits(tampered, 13)
    with pytest.raises(TypeError, match="uint8"):
        unpack_bits(packed.astype(np.int16), 13)
    with pytest.raises(ValueError, match="1-D"):
        unpack_bits(packed.reshape(1, -1), 13)
    with pytest.raises(TypeError):
        unpack_bits([1, 2], 13)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bool"):
        pack_bits(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="m must be"):
        unpack_bits(packed, -1)


# ----------------------------------------------------------------------------- BitCounter
M_VALUES = (1, 7, 9, 63, 65, 1000, 4099)
N_VALUES = (1, 2, 3, 7, 8, 63, 64, 65, 255, 256)


@pytest.mark.parametrize("m", M_VALUES)
def test_bitcounter_matches_naive_reference(m: int) -> None:
    rng = np.random.default_rng(m)
    n_max = max(N_VALUES)
    dens = rng.random(m)  # per-parameter densities, incl. near 0 and near 1
    dens[: m // 5] = 1.0  # some parameters always +1: counts reach n exactly
    dens[m // 5 : 2 * m // 5] = 0.0
    updates = rng.random((n_max, m)) < dens
    counter = BitCounter(m)
    assert counter.m == m and counter.n == 0
    assert np.array_equal(counter.counts(), np.zeros(m, np.int32))
    for i in range(n_max):
        counter.add(np.packbits(updates[i]))
        if counter.n in N_VALUES:
            got = counter.counts()
            assert got.dtype == np.int32 and got.shape == (m,)
            assert np.array_equal(got, updates[: counter.n].sum(axis=0)), counter.n
    assert counter.n == n_max


def test_bitcounter_wide_counts_and_bytes_input() -> None:
    """n >= 256 uses 16-bit digits: 300 updates of 19 parameters, passed as bytes."""
    m, n = 19, 300
    rng = np.random.default_rng(3)
    updates = rng.random((n, m)) < 0.9
    counter = BitCounter(m)
    for row in updates:
        counter.add(np.packbits(row).tobytes())
    assert np.array_equal(counter.counts(), updates.sum(axis=0))
    assert "n=300" in repr(counter)


def test_bitcounter_validation() -> None:
    counter = BitCounter(13)
    ok = pack_bits(random_bits(13, seed=0))
    with pytest.raises(ValueError, match="exactly"):
        counter.add(ok[:1])
    with pytest.raises(TypeError, match="uint8"):
        counter.add(ok.astype(np.int8))
    bad = ok.copy()
    bad[-1] |= 0b100  # padding bit
    with pytest.raises(ValueError, match="padding"):
        counter.add(bad)
    with pytest.raises(TypeError):
        counter.add(torch.from_numpy(ok))  # type: ignore[arg-type]
    assert counter.n == 0  # nothing was counted
    counter.add(ok)
    assert counter.n == 1
    with pytest.raises(TypeError):
        BitCounter(3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BitCounter(-1)
    empty = BitCounter(0)
    empty.add(np.zeros(0, np.uint8))
    assert empty.counts().shape == (0,)


# ----------------------------------------------------------------------------- means
@pytest.mark.parametrize(("c", "r", "eps"), [(0.0, 1.0, 1.0), (0.3, 0.05, 0.5), (-2.0, 3.0, 4.0)])
def test_mean_from_counts_equals_mean_of_decoded(c: float, r: float, eps: float) -> None:
    m, n = 5003, 37
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(m, generator=gen) * r + c
    counter = BitCounter(m)
    decoded = torch.zeros(m, dtype=torch.float64)
    for i in range(n):
        if i % 2:
            z = torch.randint(0, 32, (m,), generator=gen, dtype=torch.int32)
            bits = corbinq(w, c, r, eps, z, 5, lead=bool(i % 4 == 1), generator=gen)
        else:
            bits = ldpq(w, c, r, eps, generator=gen)
        counter.add(pack_bits(bits))
        decoded += decode(bits, c, r, eps).double()
    ref = decoded / n
    got = mean_from_counts(counter.counts(), n, c, r, eps)
    assert got.dtype == torch.float32 and got.shape == (m,)
    tol = 4 * 2.0**-24 * (abs(c) + r * alpha(eps))
    assert float((got.double() - ref).abs().max()) <= tol


def test_mean_from_counts_exact_cases_and_tensors() -> None:
    a = alpha(1.0)
    k = np.array([0, 5, 10], dtype=np.int32)
    got = mean_from_counts(k, 10, 0.25, 0.5, 1.0)
    assert got.tolist() == pytest.approx([0.25 - 0.5 * a, 0.25, 0.25 + 0.5 * a], abs=1e-7)
    assert float(got[1]) == 0.25  # 2k - n = 0 exactly
    c = torch.tensor([0.0, 1.0, -1.0])
    r = torch.tensor([1.0, 0.1, 2.0])
    got_t = mean_from_counts(torch.from_numpy(k), 10, c, r, 1.0)
    ref = c.double() + r.double() * a * (2 * torch.tensor([0.0, 5.0, 10.0]) / 10 - 1)
    assert float((got_t.double() - ref).abs().max()) <= 1e-6
    # per-layer broadcast: counts (2, 3) with c, r of shape (2, 1)
    k2 = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.int64)
    got2 = mean_from_counts(k2, 2, torch.tensor([[0.0], [1.0]]), torch.tensor([[1.0], [2.0]]), 1.0)
    assert got2.shape == (2, 3)
    assert got2[1].tolist() == pytest.approx([1 + 2 * a, 1.0, 1 - 2 * a], abs=1e-6)


def test_mean_from_counts_validation() -> None:
    k = np.array([0, 3], dtype=np.int32)
    with pytest.raises(ValueError, match="n must be"):
        mean_from_counts(k, 0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        mean_from_counts(k, 2, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        mean_from_counts(np.array([-1]), 2, 0.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="integer"):
        mean_from_counts(k.astype(np.float32), 3, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="r must be"):
        mean_from_counts(k, 3, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="eps"):
        mean_from_counts(k, 3, 0.0, 1.0, -1.0)
    with pytest.raises(ValueError, match="c must be"):
        mean_from_counts(k, 3, math.inf, 1.0, 1.0)
    with pytest.raises(ValueError, match="broadcastable"):
        mean_from_counts(k, 3, torch.zeros(3), 1.0, 1.0)


# ----------------------------------------------------------------------------- SumAccumulator
def test_sum_accumulator() -> None:
    rng = np.random.default_rng(0)
    ups = [rng.standard_normal(17).astype(np.float32) for _ in range(9)]
    acc = SumAccumulator(17)
    for i, u in enumerate(ups):
        acc.add(torch.from_numpy(u) if i % 2 else u)
    assert acc.n == 9 and acc.shape == (17,)
    ref = np.sum(np.stack(ups).astype(np.float64), axis=0)
    assert np.allclose(acc.sum().numpy(), ref, rtol=0, atol=1e-12)
    mean = acc.mean()
    assert mean.dtype == torch.float32
    assert np.allclose(mean.numpy(), ref / 9, atol=1e-6)
    acc2 = SumAccumulator((2, 3), dtype=torch.float32)
    acc2.add(torch.ones(2, 3))
    assert acc2.sum().dtype == torch.float32


def test_sum_accumulator_validation() -> None:
    acc = SumAccumulator(4)
    with pytest.raises(ValueError, match="no update"):
        acc.mean()
    with pytest.raises(ValueError, match="shape"):
        acc.add(torch.zeros(5))
    with pytest.raises(ValueError, match="NaN or infinite"):
        acc.add(torch.tensor([0.0, math.nan, 0.0, 0.0]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        acc.add(np.array([0.0, 0.0, math.inf, 0.0]))
    with pytest.raises(TypeError, match="floating"):
        acc.add(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError):
        acc.add([0.0] * 4)  # type: ignore[arg-type]
    assert acc.n == 0
    with pytest.raises(TypeError):
        SumAccumulator("4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        SumAccumulator(4, dtype=torch.float16)
