"""Secure aggregation (SecAgg+, Bell et al. 2020; SecAgg, Bonawitz et al. 2017) for integer
vectors, as a self-contained Flower building block on the Message API.

The server learns only the exact sum, modulo ``2^b`` with ``b = ceil(log2(n * levels + 1))``,
of the surviving clients' inputs in ``[0, levels]``. Pure protocol (no Flower): :mod:`.shamir`,
:mod:`.prg`, :mod:`.crypto`, :mod:`.graph`, :mod:`.client`, :mod:`.server`,
:mod:`.simulate`. Flower glue: :mod:`.wire`, :mod:`.mod`, :mod:`.strategy`.
"""
