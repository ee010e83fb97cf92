"""Experiment tracking: the run's configuration and every round's figures, to MLflow and
TensorBoard (the ``tracking`` section; extras ``geofl[mlflow]`` and ``geofl[tensorboard]``).

:mod:`~geofl.server.tracking.figures` turns rounds into figures; the trackers
(:mod:`~geofl.server.tracking.mlflow_tracker`, :mod:`~geofl.server.tracking.tensorboard_tracker`)
import their optional package and are imported only when configured.
"""
