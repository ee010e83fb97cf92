"""What a run is instrumented with follows its configuration, and only that."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from geofl.server.config import ConfigError, RunConfig, parse_config
from geofl.server.instruments import RunInstruments
from geofl.server.metrics import MetricsObserver
from geofl.server.models.spool import MemoryBudget
from geofl.server.nodes.registry import Registry


def config(tmp_path: Path, **sections: Any) -> RunConfig:
    data = {"run": {"name": "inst"}, "model": "a.b:c", **sections}
    return parse_config(data, source="inst", base_dir=tmp_path)


def instruments(cfg: RunConfig) -> RunInstruments:
    return RunInstruments(cfg, Registry(1.0), 7, MemoryBudget(10))


def test_nothing_configured_adds_nothing(tmp_path: Path) -> None:
    made = instruments(config(tmp_path))

    async def stage(*_: Any) -> None:
        return None

    assert made.observers == [] and made.endpoint is None and made.metrics_port is None
    assert made.staging(stage) is stage
    made.start()
    made.close("completed")


def test_metrics_add_one_observer_and_an_endpoint(tmp_path: Path) -> None:
    made = instruments(config(tmp_path, server={"metrics": {"address": "127.0.0.1:0"}}))
    [observer] = made.observers
    assert isinstance(observer, MetricsObserver)
    made.start()
    assert made.metrics_port is not None and made.metrics_port > 0
    made.close("completed")
    made.close("interrupted")  # once only: the coordinator's stop() comes after run()
    labels = observer.metrics.registry.get_sample_value(
        "geofl_run_info",
        {"run_name": "inst", "run_id": "7", "clock": "wall", "mode": "sync", "strategy": "fedavg"},
    )
    assert labels == 1


@pytest.mark.parametrize(
    ("section", "package"), [("mlflow", "mlflow"), ("tensorboard", "tensorboard")]
)
def test_a_tracker_whose_extra_is_missing_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, section: str, package: str
) -> None:
    for name in list(sys.modules):
        if name == package or name.startswith((f"{package}.", "geofl.server.tracking.")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    settings = {"mlflow": {"tracking_uri": "sqlite:///m.db"}, "tensorboard": {"log_dir": "tb"}}
    cfg = config(tmp_path, tracking={section: settings[section]})
    with pytest.raises(ConfigError, match=rf"pip install 'geofl\[{section}\]'"):
        instruments(cfg)
