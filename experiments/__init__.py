"""The experiments: TOML specs (:mod:`~experiments.spec`) expanded into runs that execute with
resume (:mod:`~experiments.sweep`), summarised by :mod:`~experiments.results`,
:mod:`~experiments.plots` and :mod:`~experiments.report`; the quantizer MSE in
:mod:`~experiments.mse`. ``corbin-fl experiment`` is :func:`experiments.cli.main`, which also
plans, runs and finalizes an experiment."""
