r"""A malicious client against the real server aggregation path (``server.round.run_round``).

One-bit mechanisms. The server's estimate of parameter ``j`` from ``n`` accepted updates is
(Alg. 1 line 4, Alg. 3 line 23)

.. math:: \bar w_j = c_j + r_j \alpha \Big(\frac{2 k_j}{n} - 1\Big),
          \qquad k_j = \#\{i : U_{i,j} = +1\},

(``alpha = alpha(eps)``; ``alpha = 1`` for ``cq``), and eq. (6) makes the new global model
``w_g' = (1 - lambda) w_g + lambda \bar w``. A client that replaces its bit ``b_j`` (1 for
``U = +1``) by any other bit changes ``k_j`` by at most one, so, everything else equal,

.. math:: |\Delta w_{g,j}'| \le \frac{2 \lambda r_j \alpha}{n}.

A client that always sends all ones changes ``k_j`` by exactly ``1 - b_j`` where ``b_j`` is the
bit it would have sent honestly:

.. math:: \Delta w_{g,j}' = \frac{2 \lambda r_j \alpha (1 - b_j)}{n}
          \in \Big\{0, \frac{2 \lambda r_j \alpha}{n}\Big\},

an upward shift, attained whenever the honest bit was ``-1``. Its expectation over the honest
bit, with ``q_j = P(b_j = 1) = 1/2 + (\mathrm{clip}(w_j) - c_j) / (2 r_j \alpha)`` (LDPQ, and
CorBinQ's marginal by Theorem 1), is

.. math:: E[\Delta w_{g,j}'] = \frac{\lambda r_j \alpha (1 - (2 q_j - 1))}{n}
          = \frac{\lambda (r_j \alpha - (\mathrm{clip}(w_j) - c_j))}{n}
          \in \Big[\frac{\lambda r_j (\alpha - 1)}{n}, \frac{\lambda r_j (\alpha + 1)}{n}\Big].

(The "``r alpha / n``" one might guess is the expected shift only for ``w_j = c_j``.) The tests
check the exact per-parameter identity against the honest counterfactual (the same round with
that client's honest reply, aggregated by the same server code), the bound and its tightness,
and the expectation statistically (fixed seeds, five standard errors).

Float mechanisms: a release with NaN, inf, or a value outside the admissible range of the
mechanism (:func:`server.aggregation.float_release_bounds`) is rejected, never averaged; a
release just inside the range is averaged, and then it moves the mean by at most
``2 lambda limit / n``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, RecordDict

# In-process harness: Flower task identity, tiny model and stub training (autouse fixtures).
from harness import InProcessGrid, make_cfg, reply_hook, runtime
from wire_helpers import is_stage, run_plain_round

from corbin_fl import registry, wire
from corbin_fl.app import train as client_train
from corbin_fl.app.config import AppConfig
from corbin_fl.client import encode
from corbin_fl.layout import expand_per_element
from corbin_fl.mechanisms.quantizers import alpha
from corbin_fl.server import round as server_round
from corbin_fl.server.aggregation import apply_global_lr, float_release_bounds, make_aggregator

N_NODES = 4


@pytest.fixture(autouse=True)
def _no_client_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub training ignores the data: skip loading the node's partition."""
    monkeypatch.setattr(client_train, "local_dataset", lambda *args, **kwargs: None)


class Attack:
    """Replaces the update of one node; keeps its honest reply and its local model."""

    def __init__(self, grid: InProcessGrid, victim: int, forge: Any) -> None:
        self.victim = victim
        self.forge = forge
        self.honest: RecordDict | None = None
        self.local: dict[int, dict[str, torch.Tensor]] = {}
        grid.hooks.append(reply_hook(wire.UPDATE, victim, self._replace))

    def _replace(self, instruction: Message, reply: Message) -> list[Message]:
        self.honest = copy.deepcopy(reply.content)
        content = copy.deepcopy(reply.content)
        key = next(iter(content.array_records[wire.UPDATE_REC]))
        honest_values = content.array_records[wire.UPDATE_REC][key].numpy()
        forged = self.forge(honest_values)
        content.array_records[wire.UPDATE_REC] = ArrayRecord({key: Array(forged)})
        return [Message(content, reply_to=instruction)]

    def spy_encode(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Record every node's local model ``w`` and ``c, r`` as the encoder sees them."""
        real = encode.encode

        def spy(cfg: AppConfig, context: Any, **kw: Any) -> Any:
            c, r, layout = kw["c"], kw["r"], kw.get("layout")
            if layout is not None:  # per-layer c, r as the client got them: expand to compare
                c, r = expand_per_element(c, layout), expand_per_element(r, layout)
            self.local[context.node_id] = {
                "w": kw["w"].detach().cpu().clone(),  # on the encode device: CUDA when there is one
                "c": c.detach().cpu().clone(),
                "r": r.detach().cpu().clone(),
            }
            return real(cfg, context, **kw)

        monkeypatch.setattr(encode, "encode", spy)


def counterfactual(
    grid: InProcessGrid, attack: Attack, rt: server_round.ServerRuntime, w0: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The global model the round would have produced had the victim been honest.

    Every other node's reply exactly as the server received it, plus the victim's honest reply,
    through the server's aggregator and eq. (6); ``c, r`` are those the server sent.
    Returns ``(w_honest, c, r, n)``.
    """
    sent = [m for m in grid.sent if is_stage(m, wire.UPDATE)]
    model = sent[0].content.array_records[wire.RANGE]
    c = expand_per_element(torch.from_numpy(model[wire.CENTER].numpy()), rt.layout)
    r = expand_per_element(torch.from_numpy(model[wire.RADIUS].numpy()), rt.layout)
    aggregator = make_aggregator(rt.cfg, w0, c, r)
    for msg in grid.received:
        if is_stage(msg, wire.UPDATE) and msg.metadata.src_node_id != attack.victim:
            aggregator.add(msg.content.array_records[wire.UPDATE_REC])
    assert attack.honest is not None
    aggregator.add(attack.honest.array_records[wire.UPDATE_REC])
    estimate = aggregator.estimate()
    assert estimate is not None
    return apply_global_lr(w0, estimate, rt.cfg.global_lr), c, r, aggregator.n


def all_ones(honest: np.ndarray, m: int) -> np.ndarray:
    """Packed bits, every parameter ``+1`` (padding bits stay zero, as the server requires)."""
    return np.packbits(np.ones(m, dtype=bool))


BIT_CASES = {
    "corbin": {"mechanism": "corbin", "global_lr": 1.0},
    "corbin-lambda": {"mechanism": "corbin", "global_lr": 0.3, "epsilon": 2.0},
    "augcorbin-lambda": {"mechanism": "augcorbin", "global_lr": 0.5, "gamma": 0.5},
    "ldpfl-lambda": {"mechanism": "ldpfl", "global_lr": 0.25, "epsilon": 0.5},
    "cq": {"mechanism": "cq", "global_lr": 1.0},
}


@pytest.mark.parametrize("case", sorted(BIT_CASES))
def test_all_ones_client_shift_on_the_server_path(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exact shift ``2 lambda r alpha (1 - b) / n``, its bound and tightness, its expectation."""
    # the layer range: r is each layer's radius of the global model (the formula's r)
    grid = InProcessGrid(
        make_cfg(num_rounds=1, seed=11, range_mode="layer", **BIT_CASES[case]), N_NODES
    )
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    rt = runtime(grid, cfg)
    m = rt.layout.m
    victim = grid.node_ids[1]
    attack = Attack(grid, victim, lambda honest: all_ones(honest, m))
    attack.spy_encode(monkeypatch)
    w0 = rt.weights.clone()

    state = run_plain_round(rt, 1)

    assert state.dropped == {} and len(state.client_metrics) == N_NODES
    if cfg.mechanism == "corbin":  # the bound holds for a node inside a CorBinQ pair
        assert state.partner.get(victim) is not None
        assert state.client_metrics[victim][wire.M_PAIRED] == 1.0
    w_honest, c, r, n = counterfactual(grid, attack, rt, w0)
    assert n == N_NODES
    lam = cfg.global_lr
    a = 1.0 if cfg.mechanism == "cq" else float(alpha(cfg.epsilon))
    assert attack.honest is not None
    honest_bits = np.unpackbits(attack.honest.array_records[wire.UPDATE_REC][wire.BITS].numpy())
    b = torch.from_numpy(honest_bits[:m].astype(np.float64))
    r64 = r.to(torch.float64)
    shift = rt.weights.to(torch.float64) - w_honest.to(torch.float64)
    expected = 2.0 * lam * r64 * a * (1.0 - b) / n
    scale = float((w0.abs().max() + r64.max() * a).item())
    tol = 8 * float(np.finfo(np.float32).eps) * scale  # float32 aggregation and eq. (6)
    torch.testing.assert_close(shift, expected, rtol=0.0, atol=tol)
    bound = 2.0 * lam * r64 * a / n
    assert bool((shift.abs() <= bound + tol).all())  # the bound ...
    flipped = b == 0
    assert int(flipped.sum()) > m // 10  # ... attained where the honest bit was -1
    torch.testing.assert_close(shift[flipped], bound[flipped], rtol=0.0, atol=tol)
    assert bool((shift[~flipped].abs() <= tol).all())

    # Expectation over the honest bit: sum_j (1 - b_j) against sum_j (1 - q_j), 5 SE.
    local = attack.local[victim]
    w, c_l, r_l = (local[k].to(torch.float64) for k in ("w", "c", "r"))
    torch.testing.assert_close(c_l, c.to(torch.float64))
    torch.testing.assert_close(r_l, r64)
    clipped = torch.minimum(torch.maximum(w, c_l - r_l), c_l + r_l)
    if cfg.mechanism == "cq":
        q = (clipped - c_l + r_l) / (2.0 * r_l)  # CQ: P(+1) = x, unbiased for c + r (2x - 1)
    else:
        q = 0.5 + (clipped - c_l) / (2.0 * r_l * a)
    observed = float((shift * n / (2.0 * lam * r64 * a)).sum())
    mean = float((1.0 - q).sum())
    se = math.sqrt(float((q * (1.0 - q)).sum()))
    assert abs(observed - mean) <= 5.0 * se, (observed, mean, se)
    # ... which is sum_j E[shift_j] = lambda (r alpha - (clip(w) - c)) / n, per parameter.
    e_shift = lam * (r64 * a - (clipped - c_l)) / n
    torch.testing.assert_close(e_shift, 2.0 * lam * r64 * a * (1.0 - q) / n)
    assert bool((e_shift >= lam * r64 * (a - 1.0) / n - tol).all())
    assert bool((e_shift <= lam * r64 * (a + 1.0) / n + tol).all())


FLOAT_MECHANISMS = tuple(
    name
    for name, mech in registry.REGISTRY.items()
    if mech.wire is registry.float32 and not mech.update_only
)
"""The registered mechanisms that release float32 values in the layer range (gaussian, laplace,
fedavg, fedcad; central-gaussian works on the updates only)."""


def _poison(kind: str, limit: torch.Tensor, c: torch.Tensor) -> Any:
    """A forger for ``kind``: NaN, +inf, -inf, a huge float, or a value just outside (in) range."""

    def forge(honest: np.ndarray) -> np.ndarray:
        out = honest.copy()
        j = out.size // 3
        if kind == "nan":
            out[j] = np.nan
        elif kind == "inf":
            out[j] = np.inf
        elif kind == "-inf":
            out[-1] = -np.inf
        elif kind == "huge":
            out[j] = np.float32(3e38)
        elif kind == "outside":
            edge = (c.to(torch.float64) + limit.expand_as(c)).numpy()
            out[j] = np.float32(edge[j] * (1 + 1e-3) + 1e-3)
        elif kind == "inside":
            edge = (c.to(torch.float64) + 0.99 * limit.expand_as(c)).numpy()
            out[:] = edge.astype(np.float32)
        else:  # pragma: no cover - the parametrization is closed
            raise AssertionError(kind)
        return out

    return forge


@pytest.mark.parametrize("mechanism", FLOAT_MECHANISMS)
@pytest.mark.parametrize("kind", ["nan", "inf", "-inf", "huge", "outside", "inside"])
def test_float_updates_nan_inf_huge_are_rejected_not_averaged(mechanism: str, kind: str) -> None:
    lam = 0.5
    # the layer range: the admissible bounds below are built from each layer's center/radius
    cfg_in = make_cfg(num_rounds=1, mechanism=mechanism, global_lr=lam, range_mode="layer")
    grid = InProcessGrid(cfg_in, 3)
    cfg = AppConfig.from_flower(grid.contexts[grid.node_ids[0]].run_config)
    rt = runtime(grid, cfg)
    w0 = rt.weights.clone()
    from corbin_fl.layout import layer_center_radius

    c_l, r_l = layer_center_radius(w0, rt.layout, cfg.radius_margin, cfg.min_radius)
    c, r = expand_per_element(c_l, rt.layout), expand_per_element(r_l, rt.layout)
    reference, limit = float_release_bounds(cfg, c, r)
    if mechanism in ("fedavg", "fedcad"):
        c = torch.zeros_like(c)  # their admissible range is centred on 0
        assert float(limit) == pytest.approx(1e6)
    else:
        torch.testing.assert_close(reference, c.to(torch.float64))
    victim = grid.node_ids[0]
    attack = Attack(grid, victim, _poison(kind, limit, c))

    state = run_plain_round(rt, 1)

    w_honest, _, _, _ = counterfactual(grid, attack, rt, w0)
    if kind == "inside":
        assert state.dropped == {} and len(state.client_metrics) == 3
        shift = rt.weights.to(torch.float64) - w_honest.to(torch.float64)
        # replacing one release by another inside the range moves the mean by at most
        # lambda * (|v - ref| + |v_honest - ref|) / n <= 2 lambda limit / n
        assert bool((shift.abs() <= 2 * lam * limit / 3 * (1 + 1e-5)).all())
        assert float(shift.abs().max()) > 0
        return
    reason = state.dropped[victim]
    assert list(state.dropped) == [victim] and victim not in state.client_metrics
    if kind in ("nan", "inf", "-inf"):
        assert "NaN or inf" in reason
    else:
        assert "outside the admissible range" in reason
    # the round went on with the two honest releases only: what the victim sent left no trace
    others = [
        msg
        for msg in grid.received
        if is_stage(msg, wire.UPDATE) and msg.metadata.src_node_id != victim
    ]
    c_sent, r_sent = expand_per_element(c_l, rt.layout), expand_per_element(r_l, rt.layout)
    aggregator = make_aggregator(cfg, w0, c_sent, r_sent)
    for msg in others:
        aggregator.add(msg.content.array_records[wire.UPDATE_REC])
    estimate = aggregator.estimate()
    assert estimate is not None and aggregator.n == 2
    torch.testing.assert_close(rt.weights, apply_global_lr(w0, estimate, lam))
    assert bool(torch.isfinite(rt.weights).all())


def test_float_release_bounds_match_the_mechanisms() -> None:
    """The admissible range is ``r + 12 sigma`` (Gaussian) and ``r + 75 b`` (Laplace) around
    ``c``, and honest releases of many rounds' worth of parameters all fall inside it."""
    from corbin_fl.mechanisms.baselines.gaussian import analytic_gaussian_sigma, gaussian
    from corbin_fl.mechanisms.baselines.laplace import laplace

    gen = torch.Generator().manual_seed(5)
    m = 200_000
    c = 0.1 * torch.randn(m, generator=gen)
    r = 0.01 + torch.rand(m, generator=gen)
    w = c + 3.0 * r * torch.randn(m, generator=gen)  # many outside the box: clipped
    for mech, eps in (("gaussian", 0.5), ("laplace", 0.2)):
        cfg = AppConfig(mechanism=mech, epsilon=eps)
        reference, limit = float_release_bounds(cfg, c, r)
        r64 = r.to(torch.float64)
        if mech == "gaussian":
            sigma = 2.0 * analytic_gaussian_sigma(eps, cfg.delta, 1.0) * r64
            torch.testing.assert_close(limit, (r64 + 12.0 * sigma) * (1 + 1e-5) + 1e-5 * c.abs())
            out = gaussian(w, c, r, eps, cfg.delta, generator=gen)
        else:
            b = 2.0 * r64 / eps
            torch.testing.assert_close(limit, (r64 + 75.0 * b) * (1 + 1e-5) + 1e-5 * c.abs())
            out = laplace(w, c, r, eps, generator=gen)
        assert bool(((out.to(torch.float64) - reference).abs() <= limit).all())
        aggregator = make_aggregator(cfg, torch.zeros(m), c, r)
        aggregator.add(ArrayRecord({wire.VALUES: Array(out.numpy())}))
        assert aggregator.n == 1
