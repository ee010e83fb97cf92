"""The ``tracking`` section: experiment trackers that receive each round (MLflow, TensorBoard)."""

from __future__ import annotations

from pydantic import Field

from geofl.server.config.fields import DatabaseUrl, RelativePath, Section

__all__ = ["MlflowConfig", "TensorBoardConfig", "TrackingConfig"]


class MlflowConfig(Section):
    """An MLflow run per geofl run: config as parameters, rounds as metrics (geofl[mlflow])."""

    tracking_uri: DatabaseUrl = Field(
        description="MLflow tracking URI: a tracking server (http://host:5000) or a local "
        "database (sqlite:///mlflow.db; a relative SQLite path resolves against the YAML "
        "file). A password in it is redacted from the stored configuration.",
    )
    experiment: str | None = Field(
        default=None,
        min_length=1,
        description="Experiment to log to (created if missing); null = the run's name.",
    )
    run_name: str | None = Field(
        default=None, min_length=1, description="Name of the MLflow run; null = the run's name."
    )


class TensorBoardConfig(Section):
    """TensorBoard event files of each run's rounds (geofl[tensorboard])."""

    log_dir: RelativePath = Field(
        description="Directory of the event files; each run writes to a subdirectory named "
        "after it (<run.name>-<run id>); relative to the YAML file."
    )


class TrackingConfig(Section):
    """Experiment trackers: each gets the run's configuration and every round's figures."""

    mlflow: MlflowConfig | None = Field(default=None, description="MLflow; null = off.")
    tensorboard: TensorBoardConfig | None = Field(
        default=None, description="TensorBoard event files; null = off."
    )
