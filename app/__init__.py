"""This project's own Flower app: one user of the CorBin-FL building block.

* :mod:`corbin_fl.app.server_app` -- the ServerApp: builds the model, the evaluation and the
  update-radius rule from the run config, and hands them to :class:`corbin_fl.CorBin`.
* :mod:`corbin_fl.app.client_app` -- the ClientApp: local training (:mod:`corbin_fl.app.train`)
  behind :func:`corbin_fl.corbin_mod`.
* :mod:`corbin_fl.app.config` -- :class:`~corbin_fl.app.config.AppConfig`, the app's run config:
  the protocol's :class:`corbin_fl.config.RunConfig` and the task's settings, whose names and checks
  are in :mod:`corbin_fl.app.task`.
* The task: :mod:`~corbin_fl.app.data` (datasets and partitions, with :mod:`~corbin_fl.app.leaf`,
  :mod:`~corbin_fl.app.readers` and :mod:`~corbin_fl.app.partition_cache`),
  :mod:`~corbin_fl.app.models` and :mod:`~corbin_fl.app.training`.

The building block (``corbin_fl``, ``corbin_fl.server``, ``corbin_fl.client``,
``corbin_fl.mechanisms``) imports nothing from here: ``CorBin`` needs no dataset.
"""
