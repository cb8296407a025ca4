"""The experiments: TOML specs (:mod:`~experiments.spec`) expanded into runs with resume
(:mod:`~experiments.sweep`, :mod:`~experiments.runner`, :mod:`~experiments.experiment`),
summarised by :mod:`~experiments.results`, :mod:`~experiments.plots` and
:mod:`~experiments.report`; the quantizer MSE in :mod:`~experiments.mse`. ``corbin-fl
experiment`` is :func:`experiments.cli.main`."""
