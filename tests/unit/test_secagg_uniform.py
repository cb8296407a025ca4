"""What the server sees is uniform given its view (Bonawitz et al. 2017, Thm. 6.3's simulator):

* before unmasking, each masked vector ``y_u`` is uniform on ``Z_{2^b}^d`` whatever ``x_u`` is
  (the self mask alone makes it so);
* after unmasking (it then knows every survivor's ``b_u`` and every dropped node's ``s_v``),
  the survivors' residuals ``z_u = y_u - PRG(b_u) - (masks towards dropped nodes)`` are jointly
  uniform subject only to ``sum_u z_u = sum_u x_u``: any ``|U3| - 1`` of them are uniform.

Tests: Pearson's chi-square over the coordinates (independent, since every coordinate uses
fresh keystream) against the upper ``1e-6`` quantile of chi-square(df), from the Wilson-Hilferty
approximation (its error at df >= 7 is far below the margin), so a correct implementation
fails with probability about ``1e-6`` per check. Masks come from the CSPRNG (never seeded), the
inputs and graph from fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest

from corbin_fl.secagg.client import SecAggClient, pair_mask, pair_sign, self_mask
from corbin_fl.secagg.server import SecAggServer
from corbin_fl.secagg.shamir import combine_shares

RUN, RND = 3, 9


def chi2_threshold(df: int, z: float = 4.753) -> float:
    """Upper 1e-6 quantile of chi-square(df) (Wilson-Hilferty; z = normal 1e-6 quantile)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def chi2_uniform(cells: np.ndarray, num_cells: int) -> float:
    counts = np.bincount(cells.astype(np.int64), minlength=num_cells)
    expected = cells.size / num_cells
    return float(((counts - expected) ** 2 / expected).sum())


def run_round(inputs: dict[int, np.ndarray], drop_at_mask: set[int]):
    clients = {u: SecAggClient(u, RUN) for u in inputs}
    srv = SecAggServer(run_id=RUN, server_round=RND, node_ids=list(inputs), levels=1)
    srv.receive_adverts({u: clients[u].advertise(RND) for u in srv.advertise_targets()})
    srv.receive_shares({u: clients[u].share_keys(r) for u, r in srv.share_requests().items()})
    masked = {
        u: clients[u].mask(r, inputs[u])
        for u, r in srv.mask_requests().items()
        if u not in drop_at_mask
    }
    srv.receive_masked(masked)
    unmask = {u: clients[u].unmask(r) for u, r in srv.unmask_requests().items()}
    out = srv.receive_unmask(unmask)
    return srv, masked, unmask, out


@pytest.mark.parametrize("value", [0, 1])
def test_each_masked_vector_is_uniform_whatever_the_input(value: int) -> None:
    d = 4000
    inputs = {u: np.full(d, value) for u in (11, 22, 33, 44)}
    srv, masked, _, out = run_round(inputs, set())
    bits = srv.config.bits
    assert bits == 3 and out.total is not None
    for u, rep in masked.items():
        stat = chi2_uniform(rep.masked, 2**bits)
        assert stat < chi2_threshold(2**bits - 1), (u, stat)


def test_survivors_residuals_are_jointly_uniform_after_unmasking() -> None:
    """n = 4 (complete graph, t = 2), one drops before masking; the server reconstructs every
    secret it may and removes those masks; two of the three residuals are jointly uniform."""
    d = 20000
    rng = np.random.default_rng(5)
    inputs = {u: rng.integers(0, 2, size=d) for u in (11, 22, 33, 44)}
    srv, masked, unmask, out = run_round(inputs, {44})
    bits, t = srv.config.bits, srv.threshold
    survivors = out.survivors
    assert survivors == (11, 22, 33) and out.total is not None
    top = np.uint64(2**bits - 1)
    b_seed = {
        u: combine_shares(
            {w: unmask[w].self_mask_shares[u] for w in unmask if u in unmask[w].self_mask_shares},
            t,
            32,
        )
        for u in survivors
    }
    s_key = combine_shares({w: unmask[w].key_shares[44] for w in unmask}, t, 32)
    z = {}
    for u in survivors:
        r = masked[u].masked - self_mask(b_seed[u], d, bits, run_id=RUN, server_round=RND, owner=u)
        m = pair_mask(s_key, srv.keys[u].s_public, d, bits, run_id=RUN, server_round=RND, u=u, v=44)
        r = r - m if pair_sign(u, 44) > 0 else r + m
        z[u] = r & top
    total = (z[11] + z[22] + z[33]) & top
    assert np.array_equal(total.astype(np.int64), out.total)  # the view is consistent
    joint = z[11] * np.uint64(2**bits) + z[22]
    stat = chi2_uniform(joint, 4**bits)
    assert stat < chi2_threshold(4**bits - 1), stat
    for u in survivors:
        assert chi2_uniform(z[u], 2**bits) < chi2_threshold(2**bits - 1)
