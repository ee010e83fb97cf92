"""How many nodes ``geofl simulate --flower-app`` starts, read where Flower 1.42 keeps it.

Flower 1.42 keeps federation settings outside the app: ``flwr run APP [CONNECTION]
--federation-config "num-supernodes=N ..."`` (Flower's ``key=value`` syntax, keys of its
``SimulationConfig``), and the SuperLink connections of ``$FLWR_HOME/config.toml``
(default ``~/.flwr/config.toml``), whose ``[superlink] default`` names the connection
and whose (deprecated, still read) ``options.num-supernodes`` sizes a local simulation.
The ``[tool.flwr.federations]`` of the app's pyproject are the older place, which Flower
migrates into that file; geofl still reads them (:mod:`.app_dir`).

The first of these that gives a count wins: ``simulation.clients`` of run.yaml,
``--federation-config``, the connection in ``config.toml`` (``--federation`` names it),
the pyproject's federation.  geofl reads ``config.toml`` and never writes it.  Of the
federation settings only ``num-supernodes`` applies: geofl's simulated clients are
processes it starts itself, so Ray's resources and backend options do not.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.common.config import parse_config_args
from flwr.supercore.utils import get_flwr_home, simulation_config_from_json

from geofl.server.flower.errors import FlowerAppError

__all__ = ["FederationNodes", "flower_config_path", "nodes_from_flower_settings"]

log = logging.getLogger(__name__)

_CONFIG_FILE = "config.toml"
_NUM_SUPERNODES = "num_supernodes"


@dataclass(frozen=True)
class FederationNodes:
    """A node count from Flower's settings outside the app, and where it was found."""

    count: int | None
    source: str
    #: Whether ``--federation`` named a connection of ``config.toml`` (so it need not be
    #: a federation of the pyproject).
    connection_found: bool = False


def flower_config_path() -> Path:
    """``$FLWR_HOME/config.toml`` (``~/.flwr/config.toml`` without ``FLWR_HOME``)."""
    return get_flwr_home() / _CONFIG_FILE


def _federation_config(items: Sequence[str]) -> int | None:
    """``num-supernodes`` of ``--federation-config``, checked as Flower checks it."""
    try:
        parsed = parse_config_args(list(items))
        if not parsed and any(item.strip() for item in items):
            raise ValueError('not key=value pairs (e.g. "num-supernodes=10")')
        config = simulation_config_from_json({k.replace("-", "_"): v for k, v in parsed.items()})
    # Flower reports bad syntax as a click exception, unknown keys as ValueError and
    # wrongly typed values as TypeError.
    except Exception as exc:
        raise FlowerAppError(
            f"--federation-config {' '.join(items)!r}: {getattr(exc, 'message', exc)}"
        ) from None
    ignored = sorted(k for k in parsed if k.replace("-", "_") != _NUM_SUPERNODES)
    if ignored:
        log.warning(
            "--federation-config: %s do not apply to geofl's simulated clients (processes, "
            "not Ray actors); only num-supernodes is used",
            ", ".join(ignored),
        )
    if not config.HasField("num_supernodes"):
        return None
    if config.num_supernodes < 1:
        raise FlowerAppError(
            f"--federation-config: num-supernodes = {config.num_supernodes} is not a count >= 1"
        )
    return int(config.num_supernodes)


def _read_flower_config(path: Path) -> Mapping[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise FlowerAppError(f"Flower's configuration {path} does not read: {exc}") from exc


def _connection_nodes(connection: str | None) -> FederationNodes:
    """``options.num-supernodes`` of the named (else the default) SuperLink connection."""
    path = flower_config_path()
    if not path.is_file():
        return FederationNodes(None, str(path))
    superlinks = _read_flower_config(path).get("superlink", {})
    if not isinstance(superlinks, Mapping):
        raise FlowerAppError(f"{path}: [superlink] must be a table")
    name = connection or superlinks.get("default")
    chosen = superlinks.get(name) if isinstance(name, str) else None
    where = f"{path} [superlink.{name}]"
    if not isinstance(chosen, Mapping):
        return FederationNodes(None, where)
    options = chosen.get("options", {})
    value = options.get("num-supernodes") if isinstance(options, Mapping) else None
    if value is None:
        return FederationNodes(None, where, connection_found=connection is not None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FlowerAppError(f"{where}: options.num-supernodes = {value!r} is not a count >= 1")
    return FederationNodes(value, where, connection_found=connection is not None)


def nodes_from_flower_settings(
    federation_config: Sequence[str], connection: str | None
) -> FederationNodes:
    """The node count of ``--federation-config``, else of the ``config.toml`` connection.

    Raises
    ------
    FlowerAppError
        If ``--federation-config`` is not Flower's ``key=value`` syntax or names a key
        Flower does not know, or ``config.toml`` does not parse or holds a bad count.
    """
    if federation_config:
        count = _federation_config(federation_config)
        if count is not None:
            return FederationNodes(count, "--federation-config")
    return _connection_nodes(connection)
