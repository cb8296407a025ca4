"""Binary stochastic quantizers: LDPQ (Algorithm 1) and CorBinQ (Algorithm 2).

All quantizers map a weight ``w`` in ``[c - r, c + r]`` to one of the two values
``c - r*alpha(eps)`` and ``c + r*alpha(eps)`` and return the sign as a ``torch.bool``
tensor: ``True`` means ``U = +1``, i.e. the decoded value is ``c + r*alpha(eps)``, for every
quantizer and both CorBinQ roles.

Notation (CorBin-FL paper, Section II-C and Algorithm 1 lines 1-2)::

    alpha(eps) = (e^eps + 1) / (e^eps - 1)
    q(w)       = 1/2 + (w - c) / (2 r alpha(eps))          P(U = +1), the LDPQ marginal

Numerical contract
------------------
* The hot path runs in ``float32`` (inputs of other floating dtypes are converted), in chunks
  that fit in the CPU cache (one chunk on accelerators); results do not depend on the chunk
  size except through the order in which tie-break coins are drawn from ``generator``.
* ``q`` is evaluated as ``fl(fl(x * k) + 1/2)`` with ``x = clip(fl(w - c), -r, r)`` and
  ``k = fl(1/(2 r alpha))`` (for a tensor ``r``: ``fl(clip(fl(fl(w - c) / r), -1, 1) *
  fl(1/(2 alpha)))``, the same clipping). The
  CorBinQ threshold ``s = 2^d q`` (Algorithm 2 line 3) is evaluated with the same operations
  scaled by ``2^d``; scaling by a power of two commutes with rounding, so ``s == 2^d * q`` bit
  for bit, and ``T = floor(s)`` and the tie probability ``s - T`` are exact. A float32 ``q``
  has 24 significant bits, so for ``d = 16`` the fraction still carries at least 8 bits (far
  more when ``q < 1/2``).
* The follow role uses ``1 - q`` evaluated directly as ``fl(fl(-x * k) + 1/2)`` (one rounding
  from ``w``, not ``1 - fl(q)``); its threshold is ``2^d`` times that, exactly.
* Tie-break coins are ``float32`` uniforms on the grid ``{0, 2^-24, ..., 1 - 2^-24}`` drawn with
  ``torch.rand(generator=...)``, so every Bernoulli(p) draw is exact up to ``2^-24``. CorBinQ only
  needs a coin where ``Z`` equals the threshold codeword (probability ``2^-d`` for a uniform
  codebook), so only those positions draw coins, in increasing position order.
* Hence ``|q_float32 - q| <= 2^-23`` and the realised PLDP ratio of the two outputs is
  ``e^eps`` up to a relative ``2^-22 / q_min`` with ``q_min = 1/(e^eps + 1)``: below ``1e-3``
  for ``eps <= 10``; only extreme budgets would need a wider float type.

With these roundings, the marginal of every role is exactly LDPQ's, ``P(U = +1) = q``
(Theorem 1, proof in Appendix B).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from corbin_fl.mechanisms.validate import (
    integer,
    interval,
    one_device,
    operand,
    positive,
    torch_generator,
)

__all__ = [
    "MAX_SHARED_BITS",
    "alpha",
    "corbinq",
    "decode",
    "ldpq",
    "prob_plus",
]

logger = logging.getLogger(__name__)

MAX_SHARED_BITS: int = 16
"""Largest number ``d`` of common random bits per parameter that :func:`corbinq` accepts."""

_CPU_CHUNK: int = 1 << 15
"""Elements per chunk on CPU. Keeps the working set (~10 bytes/element) in L2, and stays at
torch's intra-op grain size (32768), so no chunk operation opens an OpenMP parallel region:
thousands of tiny parallel regions per call are slow, and pathological (10-25x) on an
oversubscribed host where a worker thread is descheduled at every barrier."""

_COMPUTE_DTYPE = torch.float32
_MIN_FACTOR: float = 2.0**-100
_MAX_FACTOR: float = 2.0**100
"""Range of a scalar ``scale/(2 r alpha)`` applied as one float32 multiplier (else x/r first)."""

TensorOrScalar = torch.Tensor | float | int
_NAN_MESSAGE = "w contains NaN; cannot quantize a non-finite weight"


# --------------------------------------------------------------------------------- validation


_R_MIN: float = float(torch.finfo(torch.float32).tiny)


def _check_c_r(c: TensorOrScalar, r: TensorOrScalar) -> None:
    """``c`` finite, ``r`` finite and ``>= 2^-126`` (a positive normal float32), cheaply.

    For tensors a single ``aminmax`` reduction each (min/max propagate NaN).
    """
    if isinstance(c, torch.Tensor):
        if c.numel():
            lo, hi = (float(v) for v in torch.aminmax(c.detach()))
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError("c must be finite everywhere")
    elif not math.isfinite(c):
        raise ValueError(f"c must be finite, got {c!r}")
    if isinstance(r, torch.Tensor):
        if r.numel():
            lo, hi = (float(v) for v in torch.aminmax(r.detach()))
            if not (lo >= _R_MIN and math.isfinite(hi)):
                raise ValueError(
                    f"r must be finite and > 0 everywhere (clipping radius), got min {lo!r}"
                )
    elif not (math.isfinite(r) and r >= _R_MIN):
        raise ValueError(f"r must be finite and > 0 (clipping radius), got {r!r}")


# --------------------------------------------------------------------------------- alpha / q
def alpha(eps: TensorOrScalar) -> TensorOrScalar:
    r"""PLDP scale factor :math:`\alpha(\epsilon) = (e^\epsilon + 1)/(e^\epsilon - 1)`.

    Algorithm 1 line 1 of the CorBin-FL paper. Evaluated as ``1 / tanh(eps / 2)`` (the same
    function, without overflow for large ``eps`` nor cancellation for small ``eps``).

    Parameters
    ----------
    eps : float or torch.Tensor
        Parameter-level privacy budget(s), finite and ``> 0``.

    Returns
    -------
    float or torch.Tensor
        ``alpha(eps) > 1`` (a float for a real input, an elementwise tensor otherwise;
        ``alpha -> 1`` as ``eps -> inf``).

    Raises
    ------
    TypeError
        If ``eps`` is not a real number or floating tensor.
    ValueError
        If any ``eps`` is not finite or not positive.
    """
    if isinstance(eps, torch.Tensor):
        if not eps.dtype.is_floating_point:
            raise TypeError(f"eps tensor must be floating point, got dtype {eps.dtype}")
        if eps.numel() and not bool((torch.isfinite(eps) & (eps > 0)).all()):
            raise ValueError("eps must be finite and > 0 everywhere")
        return torch.reciprocal(torch.tanh(eps * 0.5))
    return 1.0 / math.tanh(positive(eps) * 0.5)


# ------------------------------------------------------------------------------ flat operands
@dataclass(frozen=True)
class _Flat:
    """Operands broadcast to ``shape`` and flattened to 1-D; scalar ``c``/``r`` stay floats."""

    shape: torch.Size
    numel: int
    device: torch.device
    w: torch.Tensor
    c: float | torch.Tensor
    r: float | torch.Tensor
    z: torch.Tensor | None


def _flatten_operand(v: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if v.shape == shape:
        return v.reshape(-1)
    return torch.broadcast_to(v, shape).reshape(-1)


def _as_scalar_or_flat(v: TensorOrScalar, shape: torch.Size) -> float | torch.Tensor:
    if isinstance(v, torch.Tensor):
        if v.numel() == 1:
            return float(v.item())
        return _flatten_operand(v, shape)
    return float(v)


def _prepare(
    w: TensorOrScalar,
    c: TensorOrScalar,
    r: TensorOrScalar,
    z: torch.Tensor | None,
) -> _Flat:
    w = operand(w, "w", finite=False)
    c = operand(c, "c", finite=False)
    r = operand(r, "r", finite=False)
    tensors = [t for t in (w, c, r, z) if isinstance(t, torch.Tensor)]
    device = one_device(tensors)
    try:
        # numpy's rule is torch's; torch.broadcast_shapes would import sympy (seconds) once.
        shape = torch.Size(np.broadcast_shapes(*(tuple(t.shape) for t in tensors)))
    except ValueError as exc:
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        raise ValueError(f"shapes of w, c, r (and z) are not broadcastable: {shapes}") from exc
    _check_c_r(c, r)
    numel = math.prod(shape)
    if isinstance(w, torch.Tensor) and w.shape == shape:
        w_flat = w.reshape(-1)
    elif isinstance(w, torch.Tensor):
        w_flat = torch.broadcast_to(w, shape).reshape(-1)
    else:
        w_flat = torch.full((numel,), w, dtype=_COMPUTE_DTYPE, device=device)
    z_flat = None if z is None else _flatten_operand(z, shape)
    return _Flat(
        shape=shape,
        numel=numel,
        device=device,
        w=w_flat,
        c=_as_scalar_or_flat(c, shape),
        r=_as_scalar_or_flat(r, shape),
        z=z_flat,
    )


def _check_z(z: object, d: int) -> torch.Tensor:
    if not isinstance(z, torch.Tensor):
        raise TypeError(f"z must be an integer torch.Tensor, got {type(z).__name__}")
    if z.dtype.is_floating_point or z.dtype.is_complex or z.dtype == torch.bool:
        raise TypeError(f"z must have an integer dtype, got {z.dtype}")
    if z.numel():
        lo, hi = torch.aminmax(z)
        lo_v, hi_v = int(lo), int(hi)
        if lo_v < 0 or hi_v >= (1 << d):
            raise ValueError(f"z must lie in [0, 2**d) = [0, {1 << d}), got min {lo_v}, max {hi_v}")
    return z


# ------------------------------------------------------------------------------ the kernel
def _chunk_size(flat: _Flat) -> int:
    if flat.device.type == "cpu":
        return _CPU_CHUNK
    return max(flat.numel, 1)


def _slice(v: float | torch.Tensor, lo: int, hi: int) -> float | torch.Tensor:
    return v if isinstance(v, float) else v[lo:hi]


def _affine_into(
    out: torch.Tensor,
    flat: _Flat,
    lo: int,
    hi: int,
    scale: float,
    offset: float,
    alpha_value: float,
    check_nan: bool = True,
) -> torch.Tensor:
    r"""Write ``fl(fl(clip(fl(w - c), -r, r) * fl(scale/(2 r alpha))) + offset)`` into ``out``.

    With ``scale = 1, offset = 1/2`` this is :math:`q` (Algorithm 1 line 2); with
    ``scale = 2^d, offset = 2^{d-1}`` it is :math:`2^d q` (Algorithm 2 line 3), bit for bit
    ``2^d`` times the former; with negative ``scale`` it is :math:`1 - q` (resp.
    :math:`2^d(1 - q)`). Clipping ``w - c`` into ``[-r, r]`` is clipping ``w`` into
    ``[c - r, c + r]``. For a tensor ``r`` (or an extreme scalar one) the product is evaluated
    as ``fl(fl(x / r) * fl(scale / (2 alpha)))`` (a tensor ``r`` clips ``fl(fl(w - c) / r)``
    into ``[-1, 1]`` instead, which is the same). Either way the ``2^d`` scaling is exact.
    A NaN weight raises ``ValueError`` here unless ``check_nan=False`` (the caller then detects
    it later: NaN propagates through every following operation).
    """
    w = flat.w[lo:hi]
    c = _slice(flat.c, lo, hi)
    r = _slice(flat.r, lo, hi)
    torch.sub(w, c, out=out)
    factor = scale / (2.0 * alpha_value)
    if isinstance(r, float):
        out.clamp_(min=-r, max=r)
        if _MIN_FACTOR <= abs(factor / r) <= _MAX_FACTOR:
            factor /= r  # one rounding instead of two; still exact under 2^d scaling
        else:
            out.div_(r)
    else:
        # fl(x / r) clipped to [-1, 1] == fl(clip(x, -r, r) / r): monotone rounding, r > 0.
        out.div_(r).clamp_(-1.0, 1.0)
    if check_nan and math.isnan(out.sum().item()):  # clipped values are bounded
        raise ValueError(_NAN_MESSAGE)
    out.mul_(factor)
    out.add_(offset)
    return out


def _flatnonzero(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the ``True`` entries of a 1-D bool tensor, on the mask's device.

    On CPU the compaction is delegated to NumPy (zero-copy view), whose ``flatnonzero`` is an
    order of magnitude faster than ``torch.nonzero`` there; the result is the same tensor.
    """
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return torch.nonzero(mask).squeeze(1)


class _Ties:
    """Tie positions of one call, collected chunk by chunk and resolved with one coin draw.

    Resolution is ``BINRAND(2^d q - floor(2^d q))`` of Algorithm 2 line 9 (line 17 for the
    follow role): a fresh local uniform coin per tie position, drawn from ``generator`` for the
    tie positions only, in increasing position order, and ``U = +1`` (lead) or ``U = -1``
    (follow) iff ``coin < fraction``. Ties with a fraction of exactly 0 or 1 are deterministic
    and are not collected. A NaN fraction (from a NaN weight, which every step propagates)
    raises ``ValueError``.
    """

    def __init__(self) -> None:
        self.idx: list[torch.Tensor] = []
        self.frac: list[torch.Tensor] = []

    def collect(self, tie: torch.Tensor, frac: torch.Tensor, offset: int) -> None:
        """Record the positions where ``tie`` is set and their fractions ``frac``."""
        idx = _flatnonzero(tie)
        if idx.numel():
            self.frac.append(frac.index_select(0, idx))
            self.idx.append(idx.add_(offset) if offset else idx)

    def resolve(self, out: torch.Tensor, generator: torch.Generator, invert: bool) -> None:
        """Draw the coins and write ``U = +1`` outcomes into the flat bool ``out``.

        ``invert=True`` (follow role) writes ``coin >= fraction``: the own decision is -1.
        """
        if not self.idx:
            return
        idx = torch.cat(self.idx) if len(self.idx) > 1 else self.idx[0]
        frac = torch.cat(self.frac) if len(self.frac) > 1 else self.frac[0]
        if bool(torch.isnan(frac).any()):
            raise ValueError(_NAN_MESSAGE)
        coins = torch.rand(idx.numel(), generator=generator, dtype=frac.dtype, device=frac.device)
        out.index_copy_(0, idx, torch.ge(coins, frac) if invert else torch.lt(coins, frac))


def _uniform_chunk(
    s: torch.Tensor,
    z: torch.Tensor,
    fbuf: torch.Tensor,
    own: torch.Tensor,
    tie: torch.Tensor,
    ties: _Ties,
    offset: int,
) -> None:
    r"""Uniform-codebook CorBinQ rule on one chunk (Algorithm 2 lines 3-11), ``s = 2^d q``.

    With ``D = s - Z`` (exact when ``Z = floor(s)``, by Sterbenz' lemma), ``T = floor(s)``:
    ``Z < T  <=>  D >= 1`` (own +1); ``Z > T  <=>  D < 0``; ``Z = T  <=>  0 <= D < 1`` and
    then ``D = s - T`` is the tie probability of line 9. With ``E = clip(D, 0, 1)``: ``E > 0``
    is the decision up to ties, and ties with a random outcome are exactly the positions where
    ``E (1 - E) != 0`` (nonzero even in float32 for any ``E`` strictly inside ``(0, 1)``), with
    probability ``E``. ``own`` receives the role's own decision (``U = +1`` for the lead,
    ``U = -1`` for the follow, whose ``s`` is ``2^d (1 - q)``).
    """
    fbuf.copy_(z)
    s.sub_(fbuf).clamp_(0.0, 1.0)  # E
    own.copy_(s)  # E > 0 (ties are overwritten by _Ties.resolve)
    torch.addcmul(s, s, s, value=-1.0, out=fbuf)  # E - E^2
    tie.copy_(fbuf)
    ties.collect(tie, s, offset)


def _biased_chunk(
    q: torch.Tensor,
    z: torch.Tensor,
    d: int,
    a: float,
    b: float,
    own: torch.Tensor,
    tie: torch.Tensor,
    ties: _Ties,
    offset: int,
) -> None:
    r"""Biased-codebook (CoQ-FL) rule on one chunk, threshold codeword found bit by bit.

    Codewords are ``d``-bit integers, bits i.i.d. with ``P(bit = 1) = p_x``, ordered by integer
    value (lexicographic, MSB first). ``F(k) = P(Z < k)`` is the cumulative codebook law.
    Descending MSB to LSB, the current interval of ``F`` splits into the ``bit = 0`` part (mass
    fraction ``a = 1 - p_x``) and the ``bit = 1`` part (``b = 1 - a``); ``x`` is the position of
    ``q`` relative to the current interval. After ``d`` levels ``T`` is the codeword with
    ``F(T) <= q < F(T + 1)`` and ``x = (q - F(T)) / P(T)`` in ``[0, 1]``. Then ``Z < T -> +1``
    (because ``F(Z + 1) <= q``), ``Z > T -> -1`` (``F(Z) >= q``), and ``Z = T -> +1`` with
    probability ``x``. Rounding keeps ``x`` in ``[0, 1]`` (``b = fl(1 - a)``). For
    ``p_x = 1/2`` every step is exact (``x/a = 2x``, ``(x - a)/b = 2x - 1``) and the result,
    coins included, is bit-identical to :func:`_uniform_chunk`.
    """
    x = q.clamp_(0.0, 1.0)
    t = torch.zeros(q.shape, dtype=torch.int32, device=q.device)
    bit = torch.empty(q.shape, dtype=torch.bool, device=q.device)
    for _ in range(d):
        torch.ge(x, a, out=bit)
        x = torch.where(bit, (x - a) / b, x / a)
        t.mul_(2).add_(bit)
    zi = z if z.dtype == torch.int32 else z.to(torch.int32)
    at_t = zi == t
    sure = at_t & (x >= 1.0)
    torch.logical_or(zi < t, sure, out=own)
    torch.logical_and(at_t & ~sure, x > 0.0, out=tie)
    ties.collect(tie, x, offset)


Role = Literal["lead", "follow"]


@torch.no_grad()
def _run(
    flat: _Flat,
    eps: float,
    d: int,
    role: Role | None,
    generator: torch.Generator,
    p_x: float,
    *,
    biased: bool | None = None,
) -> torch.Tensor:
    """Drive the chunked kernel; ``role=None`` is LDPQ, otherwise CorBinQ.

    ``biased=None`` picks the bit-by-bit codebook rule for ``p_x != 1/2`` and the direct uniform
    rule otherwise; ``True`` forces the codebook rule (the tests check that it reproduces the
    uniform rule bit for bit at ``p_x = 1/2``).
    """
    alpha_value = 1.0 / math.tanh(eps * 0.5)
    n = flat.numel
    dev = flat.device
    out = torch.empty(n, dtype=torch.bool, device=dev)
    step = _chunk_size(flat)
    buf_len = min(step, n)
    xbuf = torch.empty(buf_len, dtype=_COMPUTE_DTYPE, device=dev)
    fbuf = torch.empty(buf_len, dtype=_COMPUTE_DTYPE, device=dev)
    mbuf = torch.empty(buf_len, dtype=torch.bool, device=dev)
    uniform = (p_x == 0.5) if biased is None else not biased
    a = float(np.float32(1.0 - p_x))
    b = float(np.float32(1.0) - np.float32(a))
    sign = -1.0 if role == "follow" else 1.0
    ties = _Ties()
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        x = xbuf[: hi - lo]
        f = fbuf[: hi - lo]
        own = out[lo:hi]
        if role is None:
            # LDPQ (Algorithm 1 line 3): U = +1 iff coin < q, one coin per element.
            _affine_into(x, flat, lo, hi, 1.0, 0.5, alpha_value)
            torch.rand(hi - lo, generator=generator, out=f)
            torch.lt(f, x, out=f)
            own.copy_(f)
            continue
        z = flat.z[lo:hi]  # type: ignore[index]
        tie = mbuf[: hi - lo]
        if uniform:
            # NaN weights are caught among the ties (see _Ties): no extra pass here.
            _affine_into(x, flat, lo, hi, sign * 2.0**d, 2.0 ** (d - 1), alpha_value, False)
            _uniform_chunk(x, z, f, own, tie, ties, lo)
        else:
            _affine_into(x, flat, lo, hi, sign, 0.5, alpha_value)
            _biased_chunk(x, z, d, a, b, own, tie, ties, lo)
        if role == "follow":
            # The follow rule decides U = -1 (Algorithm 2 lines 12-19); True must mean +1.
            own.logical_not_()
    ties.resolve(out, generator, invert=role == "follow")
    return out.reshape(flat.shape)


# ------------------------------------------------------------------------------ public API
def prob_plus(
    w: TensorOrScalar,
    c: TensorOrScalar,
    r: TensorOrScalar,
    eps: float,
) -> torch.Tensor:
    r"""LDPQ marginal :math:`q = P(U=+1) = 1/2 + (w - c)/(2 r \alpha(\epsilon))` after clipping.

    Algorithm 1 line 2 (and Algorithm 2 line 2) of the CorBin-FL paper, with ``w`` first
    clipped into ``[c - r, c + r]``; hence ``q`` lies in
    ``[1/2 - 1/(2 alpha), 1/2 + 1/(2 alpha)]`` and ``q(w) / q(w') <= e^eps`` (PLDP, eq. 3).

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights, centers and radii (``r > 0``), broadcast against each other.
    eps : float
        Privacy budget ``eps > 0``.

    Returns
    -------
    torch.Tensor
        ``float32`` tensor of the broadcast shape on the tensors' device, clamped to ``[0, 1]``
        (guards the last-ulp rounding when ``alpha`` rounds to 1 for very large ``eps``).
        Bit-identical to the ``q`` used by :func:`ldpq` and (scaled by ``2^d``) :func:`corbinq`.
    """
    eps_v = positive(eps)
    flat = _prepare(w, c, r, None)
    alpha_value = 1.0 / math.tanh(eps_v * 0.5)
    out = torch.empty(flat.numel, dtype=_COMPUTE_DTYPE, device=flat.device)
    with torch.no_grad():
        _affine_into(out, flat, 0, flat.numel, 1.0, 0.5, alpha_value)
    return out.clamp_(0.0, 1.0).reshape(flat.shape)


def ldpq(
    w: TensorOrScalar,
    c: TensorOrScalar,
    r: TensorOrScalar,
    eps: float,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""LDPQ: binary-output stochastic quantization (CorBin-FL Algorithm 1, LDP-FL [17]).

    ``U = +1`` with probability :math:`q = 1/2 + (w - c)/(2 r \alpha(\epsilon))` (line 2-3),
    independently per element; the decoded value is :math:`c + U r \alpha(\epsilon)` (line 4,
    see :func:`decode`). Unbiased (:math:`E[c + U r\alpha] = w`) and ``eps``-PLDP
    (Proposition 1).

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights (clipped into ``[c - r, c + r]``), centers, radii ``> 0``; broadcast together.
    eps : float
        Privacy budget ``eps > 0``, finite.
    generator : torch.Generator, optional
        Source of the local coins, on the tensors' device. ``None`` uses a fresh generator seeded
        from the OS CSPRNG (never the global RNG).

    Returns
    -------
    torch.Tensor
        ``torch.bool`` of the broadcast shape; ``True`` means ``U = +1``.
    """
    eps_v = positive(eps)
    flat = _prepare(w, c, r, None)
    g = torch_generator(generator, flat.device)
    return _run(flat, eps_v, 0, None, g, 0.5)


def corbinq(
    w: TensorOrScalar,
    c: TensorOrScalar,
    r: TensorOrScalar,
    eps: float,
    z: torch.Tensor,
    d: int,
    lead: bool = True,
    *,
    generator: torch.Generator | None = None,
    p_x: float = 0.5,
) -> torch.Tensor:
    r"""CorBinQ: one role of the correlated stochastic quantizer pair (Algorithm 2).

    Both partners hold the same shared codeword ``z`` (``d`` bits per element, MSB first, so
    integer order is the lexicographic order of the paper). With :math:`q` as in
    :func:`prob_plus`:

    * lead (``Q1``, lines 4-11): :math:`T_1 = \lfloor 2^d q\rfloor`; ``z < T1 -> +1``,
      ``z > T1 -> -1``, ``z == T1 -> +1`` with probability :math:`2^d q - T_1` (local coin);
    * follow (``Q2``, lines 12-19): :math:`T_2 = \lfloor 2^d (1-q)\rfloor`; ``z < T2 -> -1``,
      ``z > T2 -> +1``, ``z == T2 -> -1`` with probability :math:`2^d(1-q) - T_2`.

    ``q = 1`` gives ``T = 2^d`` (always +1 for the lead) and ``q = 0`` gives ``T = 0`` with a
    zero tie probability (always -1), exactly. Each role's marginal is exactly LDPQ's,
    :math:`P(U=+1) = q` (Theorem 1, Appendix B), so PLDP and unbiasedness carry over, while
    the two roles fed the same ``z`` are maximally negatively correlated (Theorem 1, eq. 4).

    Biased codebook (CoQ-FL draft, "Codebook Creation"): with ``p_x != 1/2`` the ``d`` shared
    bits are i.i.d. Bernoulli(``p_x``) (bit = 1 with probability ``p_x``), codewords are ordered
    by integer value and the thresholds use the cumulative law :math:`F(k) = P(Z < k)`: the lead
    outputs +1 if :math:`F(z+1) \le q`, -1 if :math:`F(z) \ge q`, and +1 with probability
    :math:`(q - F(z))/P(z)` on the straddling codeword; the follow applies the same rule to
    ``1 - q`` and outputs the opposite sign. The threshold codeword is computed bit by bit (``d``
    vectorised steps). ``p_x = 1/2`` is the uniform rule above, bit for bit.

    Parameters
    ----------
    w, c, r : torch.Tensor or float
        Weights (clipped into ``[c - r, c + r]``), centers, radii ``> 0``; broadcast together
        with ``z``.
    eps : float
        Privacy budget ``eps > 0``, finite.
    z : torch.Tensor
        Integer tensor of shared codewords in ``[0, 2**d)`` (see
        :func:`mechanisms.randomness.expand_seed`).
    d : int
        Number of shared bits per element, ``1 <= d <= 16``.
    lead : bool, default True
        ``True`` for the lead role ``Q1``, ``False`` for the follow role ``Q2``.
    generator : torch.Generator, optional
        Source of the local tie-break coins (on the tensors' device); ``None`` uses a fresh
        generator seeded from the OS CSPRNG. Only tie positions draw coins.
    p_x : float, default 0.5
        Bias of the shared bits, in ``[2^-16, 1 - 2^-16]``; must match how ``z`` was drawn.

    Returns
    -------
    torch.Tensor
        ``torch.bool`` of the broadcast shape; ``True`` means the output is ``c + r*alpha``
        for both roles.

    Raises
    ------
    TypeError
        Wrong argument types (non-floating ``w``, non-integer ``z``, wrong generator type...).
    ValueError
        ``eps`` or ``r`` not positive/finite, ``d`` out of range, ``z`` out of ``[0, 2**d)``,
        non-broadcastable shapes, mismatched devices, NaN weights.
    """
    eps_v = positive(eps)
    d_v = integer(d, "d", 1, MAX_SHARED_BITS)
    px = interval(p_x, "p_x", 2.0**-16, 1.0 - 2.0**-16, lo_open=False, hi_open=False)
    if not isinstance(lead, bool):
        raise TypeError(f"lead must be a bool, got {type(lead).__name__}")
    z = _check_z(z, d_v)
    flat = _prepare(w, c, r, z)
    g = torch_generator(generator, flat.device)
    return _run(flat, eps_v, d_v, "lead" if lead else "follow", g, px)


def decode(
    bits: torch.Tensor,
    c: TensorOrScalar,
    r: TensorOrScalar,
    eps: float,
) -> torch.Tensor:
    r"""Decode signs to values :math:`c + U r \alpha(\epsilon)` (Algorithm 1 line 4).

    Parameters
    ----------
    bits : torch.Tensor
        ``torch.bool`` signs (``True`` means ``U = +1``), as returned by :func:`ldpq` and
        :func:`corbinq`.
    c, r : torch.Tensor or float
        Centers and radii ``> 0``, broadcast against ``bits``.
    eps : float
        Privacy budget ``eps > 0``.

    Returns
    -------
    torch.Tensor
        ``float32`` values ``c + r*alpha`` where ``bits`` else ``c - r*alpha``.
    """
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.bool:
        got = bits.dtype if isinstance(bits, torch.Tensor) else type(bits).__name__
        raise TypeError(f"bits must be a torch.bool tensor, got {got}")
    eps_v = positive(eps)
    c = operand(c, "c", finite=False)
    r = operand(r, "r", finite=False)
    one_device([t for t in (bits, c, r) if isinstance(t, torch.Tensor)])
    _check_c_r(c, r)
    a = 1.0 / math.tanh(eps_v * 0.5)
    if isinstance(c, torch.Tensor):
        c = c.to(_COMPUTE_DTYPE)
    if isinstance(r, torch.Tensor):
        r = r.to(_COMPUTE_DTYPE)
    half = r * a
    hi = c + half
    lo = c - half
    if not isinstance(hi, torch.Tensor):
        hi = torch.tensor(hi, dtype=_COMPUTE_DTYPE, device=bits.device)
        lo = torch.tensor(lo, dtype=_COMPUTE_DTYPE, device=bits.device)
    return torch.where(bits, hi, lo)
