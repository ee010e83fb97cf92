"""MLflow: one MLflow run per geofl run, the configuration as parameters, rounds as metrics.

Everything goes through :class:`mlflow.tracking.MlflowClient` (never the fluent
``mlflow.start_run``, whose active run is global to the process), and every call after
the start runs on one worker thread of its own: a slow or unreachable tracking server
delays the tracking, never a round, and on the virtual clock it takes no simulated time.

A resumed geofl run (same database run, same configuration) continues the MLflow run it
started, found by its tags.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import (
    MAX_ENTITY_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from geofl.server.config.errors import ConfigError
from geofl.server.config.tracking import MlflowConfig
from geofl.server.tracking.figures import RunIdentity, flatten_config

__all__ = [
    "MLFLOW_STATUS",
    "TAG_CONFIG",
    "TAG_RUN_ID",
    "TAG_RUN_NAME",
    "MlflowTracker",
    "mlflow_name",
]

log = logging.getLogger(__name__)

#: Tags that identify the geofl run an MLflow run belongs to.
TAG_RUN_ID = "geofl.run_id"
TAG_RUN_NAME = "geofl.run_name"
TAG_CONFIG = "geofl.config_sha256"
#: geofl run status -> MLflow run status.
MLFLOW_STATUS = {
    "completed": "FINISHED",
    "failed": "FAILED",
    "cancelled": "KILLED",
    "interrupted": "KILLED",
}
#: Characters MLflow accepts in a metric or parameter name; others become ``_``.
_UNNAMEABLE = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_name(name: str) -> str:
    """``name`` as MLflow accepts it: allowed characters only, at most 250 of them."""
    return _UNNAMEABLE.sub("_", name)[:MAX_ENTITY_KEY_LENGTH]


class MlflowTracker:
    """Logs one geofl run to MLflow; open with :meth:`start`."""

    def __init__(self, config: MlflowConfig, run: RunIdentity) -> None:
        self._config = config
        self._run = run
        self._client: MlflowClient | None = None
        self.mlflow_run_id: str | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geofl-mlflow")
        self._pending: list[Future[None]] = []

    def __repr__(self) -> str:
        return f"MlflowTracker({self._config.tracking_uri!r})"

    def start(self) -> str:
        """Create (or, on resume, reopen) the MLflow run and log the configuration.

        Raises
        ------
        ConfigError
            If the tracking URI cannot be used (the message is MLflow's).
        """
        try:
            client = MlflowClient(tracking_uri=self._config.tracking_uri)
            experiment = self._experiment(client)
            self.mlflow_run_id = self._open_run(client, experiment)
            self._log_params(client, self.mlflow_run_id)
        except MlflowException as exc:
            raise ConfigError.single(
                self._run.run_name,
                f"MLflow at {self._config.tracking_uri!r}: {exc.message}",
                path="tracking.mlflow.tracking_uri",
            ) from exc
        self._client = client
        return self.mlflow_run_id

    def _experiment(self, client: MlflowClient) -> str:
        name = self._config.experiment or self._run.run_name
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        return str(client.create_experiment(name))

    def _open_run(self, client: MlflowClient, experiment: str) -> str:
        run = self._run
        query = (
            f"tags.`{TAG_RUN_ID}` = '{run.run_id}' and tags.`{TAG_RUN_NAME}` = '{run.run_name}' "
            f"and tags.`{TAG_CONFIG}` = '{run.config_sha256}'"
        )
        earlier = client.search_runs([experiment], filter_string=query, max_results=1)
        if earlier:
            mlflow_id = str(earlier[0].info.run_id)
            client.update_run(mlflow_id, status="RUNNING")
            log.info("MLflow: resuming run %s", mlflow_id)
            return mlflow_id
        tags = {
            TAG_RUN_ID: str(run.run_id),
            TAG_RUN_NAME: run.run_name,
            TAG_CONFIG: run.config_sha256,
        }
        created = client.create_run(
            experiment, tags=tags, run_name=self._config.run_name or run.run_name
        )
        return str(created.info.run_id)

    def _log_params(self, client: MlflowClient, mlflow_id: str) -> None:
        params = [
            Param(mlflow_name(key), value[:MAX_PARAM_VAL_LENGTH])
            for key, value in sorted(flatten_config(self._run.config).items())
        ]
        for first in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            client.log_batch(mlflow_id, params=params[first : first + MAX_PARAMS_TAGS_PER_BATCH])

    def log_round(self, number: int, figures: Mapping[str, float], unix_s: float) -> None:
        """Queue round ``number``'s figures as metrics at step ``number``."""
        client, mlflow_id = self._client, self.mlflow_run_id
        if client is None or mlflow_id is None:
            return
        stamp = int(unix_s * 1000)
        metrics = [Metric(mlflow_name(k), float(v), stamp, number) for k, v in figures.items()]

        def log_batch() -> None:
            for first in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                client.log_batch(mlflow_id, metrics=metrics[first : first + MAX_METRICS_PER_BATCH])

        self._submit(log_batch, f"round {number}")

    def _submit(self, call: Any, what: str) -> None:
        future = self._worker.submit(call)
        future.add_done_callback(lambda done: _warn_on_failure(done, what))
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(future)

    def finish(self, status: str) -> None:
        """Mark the MLflow run ended with geofl's ``status``, after every queued round."""
        client, mlflow_id = self._client, self.mlflow_run_id
        if client is not None and mlflow_id is not None:
            state = MLFLOW_STATUS.get(status, "KILLED")
            self._submit(lambda: client.set_terminated(mlflow_id, state), "the run's end")
            self._client = None
        self._worker.shutdown(wait=True)


def _warn_on_failure(done: Future[None], what: str) -> None:
    exc = done.exception()
    if exc is not None:
        log.warning("MLflow: %s not logged: %s", what, exc)
