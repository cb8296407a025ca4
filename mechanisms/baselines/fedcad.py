r"""Fed-CAD: correlation-aware adaptive Gaussian LDP on model *updates* (participant side).

Zhu, Chang, Liang, Zhu & Xu, "Fed-CAD: Federated Learning with Correlation-aware Adaptive Local
Differential Privacy" (see README "References"), Algorithm 1 (participant side), lines 7-25, with
the noise of Section V-A (correlated Gaussian mechanism) and the momentum estimate of ``E[Diff]`` of
Section V-B. The mechanism is *stateful*: round ``i`` re-uses the noise ``mu_{i-1}`` of round
``i - 1``, so a client keeps one :class:`FedCAD` object per run (see :meth:`FedCAD.state_dict`).

Per round, for the local update ``Delta_i`` (``theta_local - theta_global``, a tensor of any
shape, treated as one vector), with clip threshold ``C`` and noise multiplier ``sigma``:

* line 9: ``Delta_i <- Delta_i / max(1, ||Delta_i|| / C)``;
* first round (lines 7-11): ``mu_1 ~ N(0, sigma^2 C^2 I)``, release ``Delta_1 + mu_1``,
  ``v_1 = 1``;
* later rounds: if ``||Delta_i - Delta_{i-1}|| > E[Diff]`` the update is pulled towards the
  previous one, ``Delta_i <- Delta_{i-1} + (Delta_i - Delta_{i-1}) / S`` with
  ``S = ||Delta_i - Delta_{i-1}|| / E[Diff]`` (lines 19-22); then (lines 14-18), with
  ``D = E[Diff] / C``,

  .. math::
      r_i = \frac{1 - D}{(1 - D)^2 + v_{i-1}},\quad
      \sigma_i = \big(|1 - r_i| + r_i D\big)\,\sigma,\quad
      \mu_i = N(0, \sigma_i^2 C^2 I) + r_i \mu_{i-1},\quad
      v_i = \frac{v_{i-1}}{(1 - D)^2 + v_{i-1}},

  and the release is ``Delta_i + mu_i``;
* line 25 / Section V-B: ``E[Diff] <- (1 - gamma) E[Diff] + gamma (||Delta_i - Delta_{i-1}||
  + N(0, sigma_Diff^2))`` with the obsolete factor ``gamma``.

Choices made where the paper is loose (all documented, none changes the algorithm's intent):

* The paper fixes ``C = 1``; for general ``C`` the formulas use the *relative* bound
  ``D = E[Diff] / C`` (so they reduce to the paper's at ``C = 1``). ``E[Diff]`` is kept in
  ``[diff_floor, (1 - 1e-6) C]`` because the analysis needs ``Diff < C``.
* ``Delta_{i-1}`` in lines 13-25 is the previous *pre-noise* (clipped) update, as in the proof of
  Theorem VI.1 (case 2); since the previous release is ``Delta_{i-1} + mu_{i-1}`` the release can
  be rewritten as ``(1 - r_i) Delta_i + r_i (Delta_i - Delta_{i-1}) + N(.) + r_i *
  (previous release)``, i.e. post-processing of the previous release plus a Gaussian mechanism
  on a quantity whose sensitivity is ``(|1 - r_i| + r_i D)`` times that of ``Delta_i``. The
  paper writes ``(1 - r_i)``; the absolute value only matters when ``r_i > 1`` (possible
  transiently when ``E[Diff]`` shrinks) and keeps the bound valid there.
* Line 25 uses the difference *before* the pull-back of lines 19-22: after the pull-back the
  norm never exceeds ``E[Diff]`` and the estimate could only decrease, contradicting Section
  V-B's goal of following the rise and fall of the update differences.
* Calibration: ``sigma`` is the noise *multiplier* of line 10 (standard deviation ``sigma C``).
  We set ``sigma C = analytic_gaussian_sigma(eps, delta, 2 C)``: the L2 sensitivity of a clipped
  update under replacement of the client's data is ``2 C`` (the paper uses ``C``), so every
  round's release is ``(eps, delta)``-DP at the update level with the analytic Gaussian of
  Balle & Wang (2018). ``T`` rounds compose as Gaussians (:mod:`mechanisms.accounting`). The
  ``E[Diff]`` release uses the paper's fixed ``sigma_Diff`` and is not accounted for (as in the
  paper).
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import torch

from corbin_fl.mechanisms.analytic_gaussian import analytic_gaussian_sigma
from corbin_fl.mechanisms.baselines._common import (
    COMPUTE_DTYPE,
)
from corbin_fl.mechanisms.baselines.hooks import EncodeJob, Settings
from corbin_fl.mechanisms.validate import positive, probability, torch_generator

logger = logging.getLogger(__name__)

__all__ = ["FedCAD", "node_state", "stateful_release"]

_STATE_VERSION = 1
_MAX_REL_DIFF = 1.0 - 1e-6


def _positive(x: object, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    v = float(x)
    ok = v >= 0.0 if allow_zero else v > 0.0
    if not (math.isfinite(v) and ok):
        raise ValueError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0, got {x!r}")
    return v


class FedCAD:
    r"""Stateful Fed-CAD perturbation of one participant's model updates (Algorithm 1).

    Parameters
    ----------
    clip_norm : float
        L2 clip threshold ``C > 0`` of line 9.
    eps, delta : float
        Per-round, update-level budget; the noise multiplier is
        ``analytic_gaussian_sigma(eps, delta, 2 C) / C``.
    gamma : float, default 0.5
        Obsolete factor ``gamma`` in ``[0, 1]`` of the ``E[Diff]`` momentum (line 25).
    sigma_diff : float, default 0.01
        Standard deviation of the noise on the measured difference norm (Section V-B), in the
        units of the update (absolute), ``>= 0``.
    diff_init : float, default 0.5
        Initial ``E[Diff]`` as a fraction of ``C``, in ``(0, 1)``.
    diff_floor : float, default 1e-3
        Smallest ``E[Diff]`` as a fraction of ``C`` (keeps line 20 well defined), in
        ``(0, diff_init]``.
    """

    STATE_SCALARS: ClassVar[tuple[str, ...]] = ("version", "round", "v", "expected_diff")
    """The entries of :meth:`state_dict` a node keeps across rounds as numbers (the
    configuration entries come from the run's settings each round)."""
    STATE_TENSORS: ClassVar[tuple[str, ...]] = ("prev_update", "mu")
    """The entries of :meth:`state_dict` a node keeps as tensors (both or neither)."""

    def __init__(
        self,
        clip_norm: float,
        eps: float,
        delta: float,
        *,
        gamma: float = 0.5,
        sigma_diff: float = 0.01,
        diff_init: float = 0.5,
        diff_floor: float = 1e-3,
    ) -> None:
        self.clip_norm = _positive(clip_norm, "clip_norm")
        self.eps = positive(eps)
        self.delta = probability(delta, "delta")
        self.gamma = probability(gamma, "gamma", lo_open=False, hi_open=False)
        self.sigma_diff = _positive(sigma_diff, "sigma_diff", allow_zero=True)
        init = probability(diff_init, "diff_init")
        floor = probability(diff_floor, "diff_floor")
        if floor > init:
            raise ValueError(f"diff_floor ({floor}) must be <= diff_init ({init})")
        self.diff_floor = floor
        self.diff_init = init
        self.noise_multiplier = (
            analytic_gaussian_sigma(self.eps, self.delta, 2.0 * self.clip_norm) / self.clip_norm
        )
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget all rounds (the next call to :meth:`perturb` is a first round)."""
        self.round = 0
        self.v = 1.0
        self.expected_diff = self.diff_init * self.clip_norm
        self.prev_update: torch.Tensor | None = None
        self.mu: torch.Tensor | None = None

    def _config(self) -> dict[str, float]:
        return {
            "clip_norm": self.clip_norm,
            "eps": self.eps,
            "delta": self.delta,
            "gamma": self.gamma,
            "sigma_diff": self.sigma_diff,
            "diff_init": self.diff_init,
            "diff_floor": self.diff_floor,
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the state as plain Python numbers and (CPU, detached) tensors.

        Returns
        -------
        dict
            ``version``, ``round``, ``v``, ``expected_diff``, the configuration floats, and
            ``prev_update`` / ``mu`` (``None`` before the first round).
        """
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "round": self.round,
            "v": self.v,
            "expected_diff": self.expected_diff,
            **self._config(),
            "prev_update": None,
            "mu": None,
        }
        if self.prev_update is not None and self.mu is not None:
            state["prev_update"] = self.prev_update.detach().to("cpu", copy=True)
            state["mu"] = self.mu.detach().to("cpu", copy=True)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (configuration must match).

        Parameters
        ----------
        state : dict
            The saved state.

        Raises
        ------
        ValueError
            Wrong version, configuration mismatch or inconsistent tensors.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported FedCAD state version {state.get('version')!r}")
        for key, value in self._config().items():
            if key not in state or not math.isclose(float(state[key]), value, rel_tol=1e-12):
                raise ValueError(
                    f"FedCAD state was saved with {key}={state.get(key)!r}, this object has {value}"
                )
        rnd = state["round"]
        if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
            raise ValueError(f"round must be an int >= 0, got {rnd!r}")
        v = _positive(state["v"], "v")
        if v > 1.0:
            raise ValueError(f"v must be in (0, 1], got {v}")
        ed = _positive(state["expected_diff"], "expected_diff")
        prev, mu = state["prev_update"], state["mu"]
        if rnd == 0:
            if prev is not None or mu is not None:
                raise ValueError("a round-0 state must not hold tensors")
        else:
            if not isinstance(prev, torch.Tensor) or not isinstance(mu, torch.Tensor):
                raise ValueError("prev_update and mu must be tensors after the first round")
            if prev.shape != mu.shape:
                raise ValueError(f"prev_update {prev.shape} and mu {mu.shape} differ in shape")
        self.round = rnd
        self.v = v
        self.expected_diff = ed
        self.prev_update = None if prev is None else prev.detach().to(COMPUTE_DTYPE, copy=True)
        self.mu = None if mu is None else mu.detach().to(COMPUTE_DTYPE, copy=True)

    # ------------------------------------------------------------------ mechanism
    def _clamp_diff(self, value: float) -> float:
        lo = self.diff_floor * self.clip_norm
        hi = _MAX_REL_DIFF * self.clip_norm
        return min(max(value, lo), hi)

    def perturb(
        self, delta_update: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Perturb this round's model update (Algorithm 1, lines 7-25) and advance the state.

        Parameters
        ----------
        delta_update : torch.Tensor
            Floating-point update ``theta_local - theta_global`` (any shape; its L2 norm is
            taken over all elements). Not modified.
        generator : torch.Generator, optional
            Noise source on the update's device; ``None`` uses a fresh generator seeded from
            the OS CSPRNG.

        Returns
        -------
        torch.Tensor
            ``float32`` noisy update of the same shape and device.
        """
        if not isinstance(delta_update, torch.Tensor) or not delta_update.dtype.is_floating_point:
            got = (
                delta_update.dtype
                if isinstance(delta_update, torch.Tensor)
                else type(delta_update).__name__
            )
            raise TypeError(f"delta_update must be a floating-point tensor, got {got}")
        x = delta_update.detach().to(COMPUTE_DTYPE)
        if not bool(torch.isfinite(x).all()):
            raise ValueError("delta_update must be finite")
        device = x.device
        g = torch_generator(generator, device)
        big_c = self.clip_norm
        sigma = self.noise_multiplier

        # line 9: norm clipping
        norm = float(torch.linalg.vector_norm(x, dtype=torch.float64))
        clipped = x / max(1.0, norm / big_c)

        if self.round == 0 or self.prev_update is None or self.mu is None:
            # lines 8-11
            mu = torch.randn(x.shape, generator=g, dtype=COMPUTE_DTYPE, device=device)
            mu.mul_(sigma * big_c)
            v_new = 1.0
            new_diff = self.expected_diff
        else:
            if self.prev_update.shape != x.shape:
                raise ValueError(
                    f"update shape {tuple(x.shape)} differs from the previous round's "
                    f"{tuple(self.prev_update.shape)}"
                )
            prev = self.prev_update.to(device)
            mu_prev = self.mu.to(device)
            exp_diff = self.expected_diff
            diff = clipped - prev
            raw_norm = float(torch.linalg.vector_norm(diff, dtype=torch.float64))
            if raw_norm > exp_diff:  # lines 19-22: pull the update towards the previous one
                clipped = prev + diff / (raw_norm / exp_diff)
            # lines 14-18
            rel = exp_diff / big_c
            denom = (1.0 - rel) ** 2 + self.v
            r_i = (1.0 - rel) / denom
            sigma_i = (abs(1.0 - r_i) + r_i * rel) * sigma
            mu = torch.randn(x.shape, generator=g, dtype=COMPUTE_DTYPE, device=device)
            mu.mul_(sigma_i * big_c).add_(mu_prev, alpha=r_i)
            v_new = self.v / denom
            # line 25 with the Section V-B noise on the measured difference
            noise = 0.0
            if self.sigma_diff > 0.0:
                z = torch.randn((1,), generator=g, dtype=torch.float64, device=device)
                noise = float(z) * self.sigma_diff
            new_diff = self._clamp_diff(
                (1.0 - self.gamma) * exp_diff + self.gamma * (raw_norm + noise)
            )
            logger.debug(
                "fedcad round %d: r=%.4g sigma_i=%.4g v=%.4g E[Diff]=%.4g",
                self.round + 1,
                r_i,
                sigma_i,
                v_new,
                new_diff,
            )

        out = clipped + mu
        self.prev_update = clipped
        self.mu = mu
        self.v = v_new
        self.expected_diff = new_diff
        self.round += 1
        return out


def node_state(cfg: Settings) -> FedCAD:
    """A node's Fed-CAD under the run's settings, before its first round
    (:data:`.hooks.NodeState`; the node restores its saved state into it)."""
    return FedCAD(
        cfg.param("fedcad-clip"),
        cfg.epsilon,
        cfg.delta,
        gamma=cfg.param("fedcad-gamma"),
        sigma_diff=cfg.param("fedcad-sigma-diff"),
        diff_init=cfg.param("fedcad-diff-init"),
        diff_floor=cfg.param("fedcad-diff-floor"),
    )


def stateful_release(state: FedCAD, job: EncodeJob) -> torch.Tensor:
    """The noisy update ``w - w_g`` (Fed-CAD Alg. 1), advancing ``state``
    (:data:`.hooks.StatefulRelease`)."""
    return state.perturb(job.w - job.w_global.to(job.w.device), generator=job.gen)
