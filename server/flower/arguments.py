"""The ``--flower-app`` options of ``geofl server`` and ``geofl simulate``.

Apart from the rest of :mod:`geofl.server.flower` so that building the command line never
imports ``flwr``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_flower_arguments"]


def add_flower_arguments(parser: argparse.ArgumentParser, simulate: bool) -> None:
    """``--flower-app``, ``--run-config``, ``--min-nodes`` (and the federation for simulate)."""
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
    parser.add_argument(
        "--min-nodes",
        type=_count,
        metavar="N",
        help="start the ServerApp once N nodes have joined (run.min_nodes; fails after "
        "run.wait_for_nodes_s, default 120 s)"
        + ("; default: every simulated client" if simulate else ""),
    )
    if simulate:
        parser.add_argument(
            "--federation",
            metavar="NAME",
            help="the SuperLink connection of $FLWR_HOME/config.toml, else the "
            "[tool.flwr.federations] entry, whose options.num-supernodes sets the number of "
            "clients (default: their `default`)",
        )
        parser.add_argument(
            "--federation-config",
            action="append",
            default=[],
            metavar='"KEY=VALUE ..."',
            help='Flower\'s federation settings, e.g. "num-supernodes=10" (as `flwr run '
            "--federation-config`); only num-supernodes applies",
        )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
