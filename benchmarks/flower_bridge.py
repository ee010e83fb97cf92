"""What the benchmarks' Flower apps share: event logs, run-config reading, round configs.

The Flower side of ``scale`` and ``wan_schedule`` (``scale_flower.py``,
``wan_schedule_flower.py``) wraps geofl's own client code in a stock Flower ServerApp
and ClientApp; these helpers carry the run config to the clients the way geofl's
``round_config`` does and log timings the harnesses read back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

from flwr.app import ConfigRecord

from geofl.protocols.types import Config

__all__ = ["fit_config", "int_setting", "log_event", "train_config"]


def log_event(path: str, event: str, **fields: object) -> None:
    """Append one JSON event line with the current wall time to ``path``."""
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def int_setting(run_config: Mapping[str, object], key: str) -> int:
    """An integer of Flower's run config; ``ValueError`` naming it otherwise."""
    value = run_config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"run config {key} must be an integer, got {value!r}")
    return value


def train_config(run_config: Mapping[str, object], keys: Iterable[str]) -> ConfigRecord:
    """The per-round training settings ``keys`` of the run config (``a-b`` there, ``a_b`` here)."""
    record = ConfigRecord()
    for key in keys:
        value = run_config[key.replace("_", "-")]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"run config {key.replace('_', '-')} must be a number, got {value!r}")
        record[key] = value
    return record


def fit_config(sent: Mapping[str, object], keys: Iterable[str]) -> Config:
    """geofl's fit config from Flower's train config: ``keys`` plus ``server_round``."""
    config: Config = {}
    for key in keys:
        value = sent.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            config[key] = value
    config["server_round"] = int(str(sent["server-round"]))
    return config
