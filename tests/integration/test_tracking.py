"""Experiment tracking of real runs, read back with each tool's own reader.

MLflow: a local store (SQLite, MLflow's recommended local backend; and the file store,
which MLflow 3 keeps behind ``MLFLOW_ALLOW_FILE_STORE``) read back with
:class:`mlflow.tracking.MlflowClient`. TensorBoard: the event file read back with
TensorBoard's :class:`EventAccumulator`. The figures must be the run's: its
configuration, one step per round, losses and bytes as the database recorded them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from geofl.server.config import ConfigError, RunConfig
from geofl.server.coordinator import Coordinator
from geofl.server.simulation.virtual import run_virtual_simulation
from tests.integration.conftest import run_config, run_rows

mlflow_tracking = pytest.importorskip("mlflow.tracking")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}


def virtual_config(tmp_path: Path, name: str, **tracking: Any) -> RunConfig:
    return run_config(
        tmp_path,
        run={"name": name, "rounds": 3, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 6, "min_clients": 2},
        schedule={"deadline_s": 600, "wait_for_clients_s": 5},
        evaluation={"every": 1, "server": "geofl_testapp:server_evaluate"},
        simulation={
            "clients": 6,
            "app": "geofl_testapp:virtual_app",
            "clock": "virtual",
            "workers": 0,
            "regions": REGIONS,
            "compute": {"samples_per_s": 1000.0},
        },
        tracking=tracking,
    )


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


@pytest.mark.parametrize("store", ["sqlite", "file"])
def test_mlflow_receives_the_config_and_every_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    if store == "file":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = f"file://{tmp_path / 'mlruns'}"
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = virtual_config(
        tmp_path, "tracked", mlflow={"tracking_uri": uri, "experiment": "geofl-tests"}
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    _, rounds, pairs = run_rows(config)

    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("geofl-tests")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.tags["geofl.run_id"] == str(outcome.result.run_id)
    assert run.data.tags["geofl.config_sha256"] == config.config_sha256()
    params = run.data.params
    assert params["run.rounds"] == "3" and params["strategy.name"] == "fedavg"
    assert params["simulation.regions.far.rtt_ms"] == "200.0"
    mlflow_id = run.info.run_id
    assert history(client, mlflow_id, "round/committed") == [(1, 1.0), (2, 1.0), (3, 1.0)]
    losses = history(client, mlflow_id, "loss/server_eval")
    assert losses == [(r.number, pytest.approx(r.server_eval_loss)) for r in rounds]
    for direction in ("up", "down"):
        logged = sum(v for _, v in history(client, mlflow_id, f"bytes/{direction}"))
        assert logged == sum(getattr(p, f"bytes_{direction}") for p, _ in pairs)
    by_region = sum(
        v
        for region in REGIONS
        for _, v in history(client, mlflow_id, f"bytes_by_region/{region}/up")
    )
    assert by_region == sum(p.bytes_up for p, _ in pairs)
    durations = history(client, mlflow_id, "round/duration_s")
    assert [d for _, d in durations] == pytest.approx([r.duration_s for r in rounds], abs=1e-5)
    fits = history(client, mlflow_id, "tasks/fit_ok")
    assert sum(v for _, v in fits) == sum(1 for p, _ in pairs if p.kind == "fit")


def test_a_resumed_run_continues_its_mlflow_run(tmp_path: Path, serve_coordinator: Any) -> None:
    """A coordinator restarted on the same database and config logs to the same run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = run_config(
        tmp_path,
        run={"name": "resumed", "rounds": 1, "seed": 1},
        tracking={"mlflow": {"tracking_uri": uri}},
    )
    first = Coordinator(config)
    first.instruments.start()
    first.instruments.close("interrupted")  # as a SIGTERM'd coordinator leaves it
    first.db.close()
    handle = serve_coordinator(lambda: Coordinator(config))
    for partition in range(3):
        handle.add_client(partition)
    assert handle.wait().status == "completed"
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("resumed").experiment_id])
    assert run.info.status == "FINISHED"
    assert history(client, run.info.run_id, "round/committed") == [(1, 1.0)]


def test_tensorboard_event_file_holds_the_config_and_every_round(tmp_path: Path) -> None:
    config = virtual_config(tmp_path, "boarded", tensorboard={"log_dir": str(tmp_path / "tb")})
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    _, rounds, pairs = run_rows(config)
    directory = tmp_path / "tb" / f"boarded-{outcome.result.run_id}"
    events = event_accumulator.EventAccumulator(
        str(directory), size_guidance={"scalars": 0, "tensors": 0}
    )
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"round/committed", "round/duration_s", "loss/server_eval", "bytes/up"} <= scalars
    losses = [(e.step, e.value) for e in events.Scalars("loss/server_eval")]
    assert losses == [(r.number, pytest.approx(r.server_eval_loss, rel=1e-6)) for r in rounds]
    bytes_down = sum(e.value for e in events.Scalars("bytes/down"))
    assert bytes_down == sum(p.bytes_down for p, _ in pairs)
    [text] = events.Tensors("config")
    shown = text.tensor_proto.string_val[0].decode()
    assert json.loads(shown.removeprefix("```json\n").removesuffix("\n```")) == config.to_dict()
    [status] = events.Tensors("status")
    assert status.tensor_proto.string_val[0] == b"completed"


def test_an_unusable_mlflow_uri_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow 3 refuses a file store unless asked: the message says so before any round."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    config = virtual_config(tmp_path, "refused", mlflow={"tracking_uri": f"file://{tmp_path}/m"})
    with pytest.raises(ConfigError, match=r"tracking\.mlflow\.tracking_uri.*MLflow at"):
        run_virtual_simulation(config)
    _, rounds, _ = run_rows(config)
    assert rounds == []
