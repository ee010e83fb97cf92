"""Flower 1.42 ServerApps, run unchanged on geofl's transport.

``geofl server --flower-app DIR`` / ``geofl simulate --flower-app DIR`` read a Flower app
directory (:mod:`.app_dir`), load its ServerApp and call it with a :class:`GeoflGrid`, the
``flwr.serverapp.Grid`` that carries messages as geofl tasks: each node long-polls for
its next task and arrays stream in chunks both ways (:mod:`.hub`, :mod:`.grid`).  Any
strategy of ``flwr.serverapp.strategy`` runs through ``strategy.start(grid=...)``, as do
custom ``main(grid, context)`` functions and legacy ``ServerApp(server_fn=...)`` apps.
Rounds are recorded in geofl's database like native ones (:mod:`.recording`); the
optional ``-c run.yaml`` adds geofl's storage, server and simulation settings
(:mod:`.config`).

Names are imported on first use, so ``geofl`` commands that do not run a Flower app never
import ``flwr``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from geofl.server.flower.app_dir import (
        FlowerApp,
        fuse_run_config,
        load_app_dir,
        load_server_app,
        parse_run_config,
    )
    from geofl.server.flower.arguments import add_flower_arguments
    from geofl.server.flower.config import FlowerRunConfig, load_flower_config
    from geofl.server.flower.errors import (
        FlowerAppError,
        GridClosedError,
        UnsupportedFlowerFeatureError,
    )
    from geofl.server.flower.grid import GeoflGrid
    from geofl.server.flower.hub import MessageHub
    from geofl.server.flower.recording import RoundBook
    from geofl.server.flower.runner import FlowerCoordinator

_EXPORTS = {
    "FlowerApp": "app_dir",
    "fuse_run_config": "app_dir",
    "load_app_dir": "app_dir",
    "load_server_app": "app_dir",
    "parse_run_config": "app_dir",
    "add_flower_arguments": "arguments",
    "FlowerRunConfig": "config",
    "load_flower_config": "config",
    "FlowerAppError": "errors",
    "GridClosedError": "errors",
    "UnsupportedFlowerFeatureError": "errors",
    "GeoflGrid": "grid",
    "MessageHub": "hub",
    "RoundBook": "recording",
    "FlowerCoordinator": "runner",
}

__all__ = [
    "FlowerApp",
    "FlowerAppError",
    "FlowerCoordinator",
    "FlowerRunConfig",
    "GeoflGrid",
    "GridClosedError",
    "MessageHub",
    "RoundBook",
    "UnsupportedFlowerFeatureError",
    "add_flower_arguments",
    "fuse_run_config",
    "load_app_dir",
    "load_flower_config",
    "load_server_app",
    "parse_run_config",
]


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
