"""Experiment framework: TOML specs, sweeps with resume, runs.csv, figures and report.md.

The entry point is :func:`experiments.cli.main` (wired as ``corbin-fl experiment``).
A spec (``experiments/quick/*.toml``, ``experiments/paper/*.toml``) is parsed by
:mod:`~experiments.spec` into frozen dataclasses, expanded into runs by
:mod:`~experiments.sweep`, executed on Flower's simulation runtime (or a running
SuperLink) by :mod:`~experiments.runner`, and summarised by
:mod:`~experiments.results`, :mod:`~experiments.plots` and
:mod:`~experiments.report`. The quantizer-MSE experiment (paper Fig. 4) needs no
federation and lives in :mod:`~experiments.mse`.
"""
