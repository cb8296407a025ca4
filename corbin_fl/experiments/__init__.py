"""Experiment framework: TOML specs, sweeps with resume, runs.csv, figures and report.md.

The entry point is :func:`corbin_fl.experiments.cli.main` (wired as ``corbin-fl experiment``).
A spec (``experiments/quick/*.toml``, ``experiments/paper/*.toml``) is parsed by
:mod:`~corbin_fl.experiments.spec` into frozen dataclasses, expanded into runs by
:mod:`~corbin_fl.experiments.sweep`, executed on Flower's simulation runtime (or a running
SuperLink) by :mod:`~corbin_fl.experiments.runner`, and summarised by
:mod:`~corbin_fl.experiments.results`, :mod:`~corbin_fl.experiments.plots` and
:mod:`~corbin_fl.experiments.report`. The quantizer-MSE experiment (paper Fig. 4) needs no
federation and lives in :mod:`~corbin_fl.experiments.mse`.
"""

from corbin_fl.experiments.spec import ExperimentSpec, SpecError, load_spec, parse_spec
from corbin_fl.experiments.sweep import Run, expand_runs

__all__ = ["ExperimentSpec", "Run", "SpecError", "expand_runs", "load_spec", "parse_spec"]
