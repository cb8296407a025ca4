r"""One-bit correlated quantization without privacy (CQ; Suresh, Sun, Ro & Yu, ICML 2022).

"Correlated quantization for distributed mean estimation and optimization" (the CQ baseline
of CorBin-FL, [35], Experiment 1 and Appendix F Experiment 5). ``n`` clients each send one bit
per parameter; their quantization thresholds are *stratified* by shared randomness so that the
quantization errors cancel in the mean.

Scheme (one coordinate). Normalise ``x_i = (clip(w_i) - c + r) / (2r)`` in ``[0, 1]``. The
clients share a uniformly random permutation ``pi`` of ``{0, ..., n-1}``; client ``i`` draws a
private ``gamma_i ~ U[0, 1)`` and sets

.. math:: U_i = \frac{\pi(i) + \gamma_i}{n}, \qquad B_i = 1[U_i < x_i], \qquad
          \hat w_i = c + r (2 B_i - 1) \in \{c - r, c + r\}.

Each ``U_i`` is marginally ``U[0, 1)``, so ``E[B_i] = x_i`` and ``E[\hat w_i] = clip(w_i)``
(unbiased); jointly the ``U_i`` fall one per stratum ``[k/n, (k+1)/n)``, so when all ``x_i``
are equal the count ``sum_i B_i`` is ``floor(n x)`` or ``floor(n x) + 1`` and the mean has
error ``O(r/n)`` instead of the ``O(r/sqrt n)`` of independent stochastic rounding.

Per-coordinate permutations, cheap construction. The paper draws an independent permutation
per coordinate. Here coordinate ``j`` uses ``pi_j(i) = (pi_0(i) + b_j) mod n`` where ``pi_0`` is
one uniformly random permutation per round and ``b_j`` are i.i.d. uniform offsets in
``{0, ..., n-1}``, both expanded from one shared seed (:func:`cq_shared_randomness`). A client
only needs its own rank ``pi_0(i)`` and the offsets (``O(m)`` work, no ``O(n m)``
permutations). Because ``pi_0`` is uniform and ``x -> x + b_j mod n`` is a bijection
independent of it, for every pair of clients ``(pi_j(i), pi_j(i'))`` is uniform over ordered
pairs of distinct ranks, for every ``j``. The mean-squared error of each coordinate's mean is a
sum of variances and pairwise covariances, which depend only on these pairwise laws; hence
every coordinate has *exactly* the MSE of the paper's fully random permutation. (Coordinates
are no longer independent of each other, which changes no expectation of a sum of squared
errors.)

There is no privacy guarantee (``eps = inf``); the shared seed is not secret from the server.
"""

from __future__ import annotations

import logging

import torch

from corbin_fl.mechanisms.baselines._common import (
    COMPUTE_DTYPE,
    clip_to_box,
    prepare,
)
from corbin_fl.mechanisms.baselines.hooks import Block, EncodeJob, Settings
from corbin_fl.mechanisms.validate import integer, torch_generator

logger = logging.getLogger(__name__)

__all__ = [
    "block_release",
    "cq",
    "cq_decode",
    "cq_shared_randomness",
    "decode_counts",
    "shared_ranks",
]


def cq_shared_randomness(
    seed: int, n: int, shape: tuple[int, ...] | torch.Size, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand a shared seed into the base permutation ``pi_0`` and per-coordinate offsets.

    All clients of a round call this with the same ``seed`` (drawn by the deployment from a
    CSPRNG) and obtain identical values on any device: the expansion always runs on a CPU
    ``torch.Generator`` seeded with ``seed`` and the offsets are then moved to ``device``.

    Parameters
    ----------
    seed : int
        Shared seed in ``[0, 2**64)``.
    n : int
        Number of clients taking part in the round (``n >= 1``).
    shape : tuple of int
        Shape of the quantized tensor (one offset per coordinate).
    device : torch.device or str
        Device of the returned offsets.

    Returns
    -------
    tuple of torch.Tensor
        ``(perm, offsets)``: ``perm`` is an ``int64`` CPU tensor, a uniformly random permutation
        of ``0..n-1`` (client with index ``i`` in the round's sorted client list has rank
        ``perm[i]``); ``offsets`` is ``int64`` of ``shape`` with i.i.d. uniform values in
        ``0..n-1``.
    """
    seed = integer(seed, "seed", 0)
    if seed >= 1 << 64:
        raise ValueError(f"seed must be < 2**64, got {seed}")
    n = integer(n, "n", 1)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    perm = torch.randperm(n, generator=g, dtype=torch.int64)
    offsets = torch.randint(0, n, tuple(shape), generator=g, dtype=torch.int64)
    return perm, offsets.to(device)


def cq(
    w: torch.Tensor | float,
    c: torch.Tensor | float,
    r: torch.Tensor | float,
    rank: int,
    n: int,
    *,
    shared_offset: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Correlated one-bit quantization of one client (Suresh et al. 2022, one-dimensional CQ).

    ``B_j = 1[U_j < x_j]`` with ``U_j = (((rank + b_j) mod n) + gamma_j) / n``,
    ``gamma_j ~ U[0, 1)`` private, ``x_j = (clip(w_j) - c_j + r_j) / (2 r_j)``.

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights, centers and radii (``r > 0``), broadcast together.
    rank : int
        This client's rank ``pi_0(i)`` in ``0..n-1`` (from :func:`cq_shared_randomness`).
    n : int
        Number of clients sharing the permutation.
    shared_offset : torch.Tensor, optional
        Integer per-coordinate offsets ``b_j`` in ``0..n-1`` broadcastable to ``w``
        (from :func:`cq_shared_randomness`); ``None`` means all zero (the same permutation for
        every coordinate, still unbiased and with the same per-coordinate MSE).
    generator : torch.Generator, optional
        Source of the private ``gamma_j`` on the tensors' device; ``None`` uses a fresh
        generator seeded from the OS CSPRNG.

    Returns
    -------
    torch.Tensor
        ``torch.bool``; ``True`` means the output value ``c + r``.
    """
    n = integer(n, "n", 1)
    rank = integer(rank, "rank", 0)
    if rank >= n:
        raise ValueError(f"rank must be in [0, n) = [0, {n}), got {rank}")
    wt, ct, rt = prepare(w, c, r)
    g = torch_generator(generator, wt.device)
    stratum = torch.full(wt.shape, rank, dtype=torch.int64, device=wt.device)
    if shared_offset is not None:
        if not isinstance(shared_offset, torch.Tensor) or shared_offset.dtype.is_floating_point:
            raise TypeError("shared_offset must be an integer torch.Tensor")
        if shared_offset.dtype == torch.bool:
            raise TypeError("shared_offset must be an integer torch.Tensor, not bool")
        if shared_offset.device != wt.device:
            raise ValueError(f"shared_offset is on {shared_offset.device} but w is on {wt.device}")
        if shared_offset.numel():
            lo, hi = torch.aminmax(shared_offset)
            if int(lo) < 0 or int(hi) >= n:
                raise ValueError(f"shared_offset must lie in [0, n) = [0, {n})")
        try:
            stratum = torch.remainder(stratum + shared_offset.to(torch.int64), n)
        except RuntimeError as exc:
            raise ValueError(
                f"shared_offset of shape {tuple(shared_offset.shape)} does not broadcast to "
                f"{tuple(wt.shape)}"
            ) from exc
        if stratum.shape != wt.shape:
            raise ValueError(
                f"shared_offset of shape {tuple(shared_offset.shape)} changes the output shape "
                f"{tuple(wt.shape)}"
            )
    gamma = torch.rand(wt.shape, generator=g, dtype=torch.float64, device=wt.device)
    u = (stratum.to(torch.float64) + gamma) / n
    x = ((clip_to_box(wt, ct, rt) - ct) / (2.0 * rt) + 0.5).to(torch.float64)
    return u < x


def cq_decode(bits: torch.Tensor, c: torch.Tensor | float, r: torch.Tensor | float) -> torch.Tensor:
    """Decode CQ bits to ``c + r (2B - 1)``, i.e. ``c + r`` for ``True`` and ``c - r`` otherwise.

    Parameters
    ----------
    bits : torch.Tensor
        ``torch.bool`` output of :func:`cq`.
    c, r : torch.Tensor or float
        Centers and radii used to quantize.

    Returns
    -------
    torch.Tensor
        ``float32`` values; their mean over the ``n`` clients estimates the mean weight.
    """
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.bool:
        got = bits.dtype if isinstance(bits, torch.Tensor) else type(bits).__name__
        raise TypeError(f"bits must be a torch.bool tensor, got {got}")
    _, ct, rt = prepare(bits.to(COMPUTE_DTYPE), c, r)
    sign = bits.to(COMPUTE_DTYPE) * 2.0 - 1.0
    return ct + rt * sign


def decode_counts(
    k: torch.Tensor, n: int, c: torch.Tensor | float, r: torch.Tensor | float, cfg: Settings
) -> torch.Tensor:
    """``c + r (2 k / n - 1)`` (:data:`.hooks.CountDecode`): the mean of the decoded bits
    ``c + U r`` of ``n`` clients (``alpha = 1``: no privacy budget)."""
    return c + r * (2.0 * k.to(torch.float64) / n - 1.0)


def shared_ranks(seed: int, n: int) -> list[int]:
    """The ranks in ``pi_0`` of the round's ``n`` participants, in the order of their node ids
    (:data:`.hooks.SharedRanks`; the server sends each its own)."""
    perm, _ = cq_shared_randomness(seed, n, (0,))
    return [int(p) for p in perm]


def block_release(job: EncodeJob) -> Block:
    """The client's release of one range block (:data:`.hooks.BlockRelease`): correlated
    quantization with the round's shared seed, this client's rank and the participants
    (``job.shared_seed``), one bit per parameter."""
    shared = getattr(job, "shared_seed", None)
    if shared is None:
        raise ValueError("cq needs the shared seed, rank and client count")
    seed, rank, n = shared
    w, gen = job.w, job.gen
    _, offsets = cq_shared_randomness(seed, n, (w.numel(),), device=w.device)
    return lambda s, c, r: cq(w[s], c, r, rank, n, shared_offset=offsets[s], generator=gen)
