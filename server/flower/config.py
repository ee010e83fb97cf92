"""The optional ``-c run.yaml`` beside ``--flower-app``: geofl's own features for a Flower app.

The app decides what is trained and how (its ServerApp builds the strategy, its run
config sets the rounds); the YAML adds what geofl runs it with: where runs are recorded
(``storage``), where the server listens and its wire limits (``server``), and how many
clients ``geofl simulate`` starts (``simulation``).  Sections that would override the
app (``model``, ``strategy`` ...) are errors that say where that setting lives instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from geofl.server.config import ConfigError, ConfigProblem, ServerConfig, StorageConfig
from geofl.server.config.fields import BASE_DIR_KEY, ScalarMap, Section
from geofl.server.config.messages import validation_problems
from geofl.server.config.models import RESERVED_NODE_KEYS
from geofl.server.config.overrides import apply_overrides, parse_override
from geofl.server.config.yamlsource import duplicate_keys, line_of, parse_yaml

__all__ = ["FlowerRunConfig", "FlowerRunSection", "FlowerSimulationConfig", "load_flower_config"]

#: Sections of a native run file that a Flower app decides itself, and where instead.
NOT_FOR_FLOWER_APPS = {
    "model": "the ServerApp passes its initial arrays to the strategy",
    "strategy": "the ServerApp builds its own strategy",
    "round_config": "the strategy writes each message's ConfigRecord",
    "evaluation": "the strategy decides federated and central evaluation",
    "schedule": "the strategy samples nodes and sets its timeouts",
    "compression": "Flower messages travel uncompressed in this version of geofl",
}
_RUN_KEYS_NOT_FOR_FLOWER = {
    "rounds": "the app's run config sets them (e.g. --run-config num-server-rounds=5)",
    "seed": "the ServerApp does its own sampling",
}


def _section(description: str) -> Any:
    return Field(default_factory=dict, validate_default=True, description=description)


class FlowerRunSection(Section):
    """The run's name in the database, and the nodes the ServerApp waits for."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Run name; null = the app's project name.",
    )
    min_nodes: int | None = Field(
        default=None,
        ge=1,
        description="Nodes that must have joined before the ServerApp starts (as Flower's "
        "simulation registers every node first); null = none for geofl server (--min-nodes "
        "sets it), every client for geofl simulate.",
    )
    wait_for_nodes_s: float = Field(
        default=120.0,
        gt=0,
        description="How long to wait for min_nodes before the run fails.",
    )


class FlowerSimulationConfig(Section):
    """Clients ``geofl simulate`` starts for a Flower app."""

    clients: int | None = Field(
        default=None,
        ge=1,
        description="Number of clients; null = options.num-supernodes of the app's federation.",
    )
    node_config: ScalarMap = Field(
        default_factory=dict,
        description="Node config of every client, besides partition-id and num-partitions.",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Long-lived client processes, each holding many clients (pooled); null = "
        "one per CPU core (at most one per client).",
    )
    pooled: bool = Field(
        default=True,
        description="Run the clients in simulation.workers processes (each client keeps its "
        "own connection and context.state); false = one geofl client process per client.",
    )
    client_threads: int = Field(
        default=1,
        ge=0,
        description="Math-library threads (torch, OpenMP, MKL, OpenBLAS) per client process, "
        "set before they initialise; 0 = the libraries' defaults.",
    )

    @field_validator("node_config")
    @classmethod
    def _no_reserved_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = [key for key in RESERVED_NODE_KEYS if key in value]
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the simulator for each client")
        return value


class FlowerRunConfig(Section):
    """geofl's settings for running a Flower app."""

    run: FlowerRunSection = _section("Run identity.")
    storage: StorageConfig = _section("Database and checkpoint locations.")
    server: ServerConfig = _section("Server endpoint, TLS and wire limits.")
    simulation: FlowerSimulationConfig = _section("Simulated clients for geofl simulate.")

    @model_validator(mode="before")
    @classmethod
    def _empty_sections_are_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {key: {} if value is None else value for key, value in data.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe copy for the run's record (database passwords redacted)."""
        from geofl.server.config import redact_url

        data = self.model_dump(mode="json")
        data["storage"]["url"] = redact_url(self.storage.url)
        return data


def _misplaced(data: Mapping[str, Any], source: str, node: Any) -> list[ConfigProblem]:
    problems = [
        ConfigProblem(
            source,
            key,
            f"not used with --flower-app: {why}; remove it",
            line=line_of(node, [key]),
        )
        for key, why in NOT_FOR_FLOWER_APPS.items()
        if key in data
    ]
    run = data.get("run")
    if isinstance(run, Mapping):
        problems += [
            ConfigProblem(
                source,
                f"run.{key}",
                f"not used with --flower-app: {why}; remove it",
                line=line_of(node, ["run", key]),
            )
            for key, why in _RUN_KEYS_NOT_FOR_FLOWER.items()
            if key in run
        ]
    return problems


def _read(path: Path) -> tuple[Any, Mapping[str, Any]]:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError.single(source, f"cannot read: {exc}") from None
    node, data = parse_yaml(text, source)
    duplicates = duplicate_keys(node, source)
    if duplicates:
        raise ConfigError(duplicates)
    if data is None:
        return node, {}
    if not isinstance(data, Mapping):
        raise ConfigError.single(source, "the top level must be a mapping of sections")
    return node, data


def load_flower_config(path: Path | None, overrides: Sequence[str] = ()) -> FlowerRunConfig:
    """Load ``-c run.yaml`` for a Flower app (defaults without one), ``--set`` applied.

    Relative paths resolve against the file's directory (the current one without a file).

    Raises
    ------
    ConfigError
        Listing every problem: unreadable or invalid YAML, sections a Flower app sets
        itself, and invalid values.
    """
    source = "<defaults>" if path is None else str(path)
    node, data = (None, {}) if path is None else _read(path)
    parsed = [parse_override(text) for text in overrides]
    merged = apply_overrides(data, parsed)
    problems = _misplaced(merged, source, node)
    if problems:
        raise ConfigError(problems)
    base_dir = (Path.cwd() if path is None else path.absolute().parent).absolute()
    try:
        return FlowerRunConfig.model_validate(merged, context={BASE_DIR_KEY: base_dir})
    except ValidationError as exc:
        found = validation_problems(exc, source, lambda where: line_of(node, where), parsed)
        raise ConfigError(found) from exc
