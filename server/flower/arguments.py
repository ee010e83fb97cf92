"""The ``--flower-app`` options of ``geofl server`` and ``geofl simulate``.

Apart from the rest of :mod:`geofl.server.flower` so that building the command line never
imports ``flwr``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_flower_arguments"]


def add_flower_arguments(parser: argparse.ArgumentParser, simulate: bool) -> None:
    """``--flower-app``, ``--run-config`` (and ``--federation`` for simulate)."""
    parser.add_argument(
        "--flower-app",
        type=Path,
        metavar="DIR",
        help="run a Flower app directory (pyproject.toml with [tool.flwr.app]) instead of "
        "a geofl run; -c then only adds geofl settings (storage, server, simulation)",
    )
    parser.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar='"KEY=VALUE ..."',
        help="override the Flower app's config as `flwr run` does, e.g. \"num-server-rounds=5 "
        'lr=0.1" (TOML values) or a .toml file',
    )
    if simulate:
        parser.add_argument(
            "--federation",
            metavar="NAME",
            help="the [tool.flwr.federations] entry whose options.num-supernodes sets the "
            "number of clients (default: its `default`)",
        )
