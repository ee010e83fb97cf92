"""Flower 1.42 client apps, unchanged, in whole geofl runs over real gRPC on loopback.

The apps live in ``apps/flower_apps.py`` (NumPy) and ``apps/flower_quickstart.py``
(quickstart-pytorch style, on Fashion-MNIST); ``examples/flower_quickstart`` is run too.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from geofl.server.config import parse_config
from geofl.storage import open_database, queries

from .conftest import final_weights, run_config
from .processes import run_geofl, write_config

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("flwr.clientapp")
    pytest.importorskip("flwr.client.mod")  # the apps import from both

ROOT = Path(__file__).resolve().parents[2]
FMNIST_REQUIRED = os.environ.get("GEOFL_REQUIRE_FMNIST") == "1"
# One round's aggregate of the legacy app's shifts (1, 2, 3 weighted by 10, 20, 30).
STEP = (10 * 1 + 20 * 2 + 30 * 3) / 60


def _detail(config: Any, run_id: int) -> Any:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        return queries.run_detail(session, run_id)


def _numpy_run(tmp_path: Path, **sections: Any) -> Any:
    sections.setdefault("evaluation", {"every": 1, "server": None})
    return run_config(tmp_path, model="flower_apps:make_model", **sections)


@pytest.mark.parametrize(
    "app",
    [
        "flower_apps:legacy_app",
        "flower_apps:client_fn",
        "flower_apps:unannotated_client_fn",
        "flower_apps:legacy_secagg_app",
    ],
)
def test_legacy_numpy_client_aggregates_exactly(tmp_path: Path, serve: Any, app: str) -> None:
    """Tensors go as a list in dict order; FitRes/EvaluateRes come back as geofl results."""
    config = _numpy_run(tmp_path)
    server = serve(config)
    for partition in range(3):
        server.add_client(partition, app=app)
    result = server.wait()
    assert result.status == "completed"
    weights = final_weights(config, result.run_id)
    # "w" is the first array (shift x1), "b" the second (shift x2).
    np.testing.assert_allclose(weights["w"], np.full((4, 3), 2 * STEP, np.float32), rtol=1e-6)
    np.testing.assert_allclose(weights["b"], np.full(3, 4 * STEP, np.float32), rtol=1e-6)
    detail = _detail(config, result.run_id)
    for r in detail.rounds:
        assert (r.status, r.num_succeeded, r.num_failed) == ("committed", 3, 0)
        assert r.train_loss == pytest.approx((10 * 0 + 20 * 1 + 30 * 2) / 60)
        assert r.eval_metrics["accuracy"] == pytest.approx((0.5 + 0.6 + 0.7) / 3)
        assert r.eval_loss == pytest.approx(STEP * r.number, rel=1e-6)  # mean of "w" after it


def test_message_api_state_persists_and_a_raising_handler_is_a_client_error(
    tmp_path: Path, serve: Any
) -> None:
    config = _numpy_run(tmp_path, run={"rounds": 3})
    server = serve(config)
    server.add_client(0, app="flower_apps:counting_app")
    server.add_client(1, app="flower_apps:counting_app")
    server.add_client(2, app="flower_apps:counting_app", behaviour="raise")
    result = server.wait()
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [(r.status, r.num_succeeded, r.num_failed) for r in detail.rounds] == [
        ("committed", 2, 1)
    ] * 3
    fits = [p for p in detail.participations if p.kind == "fit"]
    calls = {(p.node_name, p.round_number): p.metrics.get("calls") for p in fits}
    for node in ("node-0", "node-1"):  # context.state carried the count across rounds
        assert [calls[node, n] for n in (1, 2, 3)] == [1, 2, 3]
    failed = [p for p in fits if p.node_name == "node-2"]
    assert [p.status for p in failed] == ["failed"] * 3
    assert all("deliberate failure in a Flower train handler" in (p.reason or "") for p in failed)
    # Only nodes 0 and 1 (10 and 20 examples, each +1 per round) moved the model.
    np.testing.assert_allclose(final_weights(config, result.run_id)["w"], 3.0, rtol=1e-6)
    evals = [p for p in detail.participations if p.kind == "evaluate"]
    assert evals and all(p.status == "ok" for p in evals)
    assert [r.eval_loss for r in detail.rounds] == pytest.approx([1.0, 2.0, 3.0])


def test_local_dp_mod_clips_the_update_the_server_receives(tmp_path: Path, serve: Any) -> None:
    """The handler moves every weight by +10; LocalDpMod clips each update to norm 1."""
    config = _numpy_run(tmp_path, evaluation={"every": 0, "server": None})
    server = serve(config)
    for partition in range(3):
        server.add_client(partition, app="flower_apps:dp_app")
    result = server.wait()
    assert result.status == "completed"
    weights = final_weights(config, result.run_id)
    flat = np.concatenate([weights["w"].ravel(), weights["b"].ravel()])
    # Every clipped update is the same vector of norm 1, so two rounds move the model by 2.
    assert np.linalg.norm(flat) == pytest.approx(2.0, rel=1e-5)
    np.testing.assert_allclose(flat, flat[0], rtol=1e-5)


def _fmnist_present() -> bool:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        from examples.fashion_mnist.data import _FILES, data_dir

    return all((data_dir() / name).is_file() for pair in _FILES.values() for name in pair)


needs_fmnist = pytest.mark.skipif(
    not FMNIST_REQUIRED and not _fmnist_present(),
    reason="Fashion-MNIST files absent: apt-get install dataset-fashion-mnist "
    "(set GEOFL_REQUIRE_FMNIST=1 to make this a failure)",
)


@pytest.mark.fmnist
@needs_fmnist
def test_quickstart_pytorch_clientapp_trains_on_fashion_mnist(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # the app reads the images via examples.*
    import flower_quickstart  # type: ignore[import-not-found]  # conftest puts apps/ on the path

    config = run_config(
        tmp_path,
        model="flower_quickstart:make_model",
        round_config={"lr": 0.1, "local-epochs": 2, "batch-size": 32},
        evaluation={"every": 1, "server": None},
        schedule={"deadline_s": 60, "wait_for_clients_s": 30},
    )
    server = serve(config)
    for partition in range(3):
        server.add_client(partition, app="flower_quickstart:app", **{"num-partitions": 3})
    result = server.wait(timeout=120)
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [(r.status, r.num_succeeded) for r in detail.rounds] == [("committed", 3)] * 2
    sizes = {(p.kind, p.num_examples) for p in detail.participations}
    assert sizes == {("fit", 160), ("evaluate", 40)}  # 600 images / 3, split 80/20
    for r in detail.rounds:
        assert r.train_loss is not None and math.isfinite(r.train_loss)
        assert 0.0 <= r.eval_metrics["eval_acc"] <= 1.0
    first, second = (r.eval_loss for r in detail.rounds)
    assert second < first  # the aggregated Flower updates are training the model
    assert detail.rounds[-1].eval_metrics["eval_acc"] > 0.2  # chance is 0.1
    initial = flower_quickstart.make_model()
    final = final_weights(config, result.run_id)
    assert list(final) == list(initial)
    assert not np.allclose(final["fc2.weight"], initial["fc2.weight"])


def test_the_flower_quickstart_example_trains_as_its_run_yaml_says(
    tmp_path: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sklearn")
    monkeypatch.syspath_prepend(str(ROOT))  # user code is imported as examples.*
    data = yaml.safe_load((ROOT / "examples" / "flower_quickstart" / "run.yaml").read_text())
    data["run"]["rounds"] = 2
    data["storage"] = {
        "url": f"sqlite:///{tmp_path / 'geofl.db'}",
        "checkpoints": str(tmp_path / "ckpt"),
    }
    data["server"] = {"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5}
    config = parse_config(data, source="examples/flower_quickstart/run.yaml")
    server = serve(config)
    clients = config.simulation.clients
    for partition in range(clients):
        server.add_client(partition, app=str(config.simulation.app), **{"num-partitions": clients})
    result = server.wait(timeout=120)
    assert result.status == "completed"
    detail = _detail(config, result.run_id)
    assert [(r.status, r.num_succeeded) for r in detail.rounds] == [("committed", clients)] * 2
    assert detail.rounds[-1].eval_metrics["eval_acc"] > 0.5  # chance is 0.1


def test_geofl_simulate_runs_a_flower_client_app(tmp_path: Path) -> None:
    """`geofl simulate` starts `geofl client` processes, each loading the Flower app once."""
    config = write_config(
        tmp_path,
        model="flower_apps:make_model",
        evaluation={"every": 1, "server": None},
        simulation={"clients": 2, "app": "flower_apps:legacy_secagg_app"},
    )
    result = run_geofl(tmp_path, "simulate", "-c", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "round 2/2 committed" in result.stderr
    assert "secure_aggregation.enabled" in result.stderr  # each client said why it dropped it
