"""Flower 1.42 ServerApps, unchanged, driving whole geofl runs over real gRPC on loopback.

The apps live in ``apps/flower_server_apps.py`` (NumPy only); every result is compared
with the same ServerApp run against a transport-free reference grid in this process.
The app directory ``apps/flower_app_dir`` runs through ``geofl simulate --flower-app``.
"""

from __future__ import annotations

import importlib
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.storage import open_database, queries

from .conftest import ServerHandle
from .processes import run_geofl

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("flwr.serverapp")

from geofl.server.flower import (
    FlowerApp,
    FlowerCoordinator,
    load_flower_config,
)

APP_DIR = Path(__file__).parent / "apps" / "flower_app_dir"
CLIENTS = 3
#: One round's FedAvg step: the shifts 1, 2, 3 weighted by 10, 20, 30 examples.
STEP = (10 * 1 + 20 * 2 + 30 * 3) / 60


def _apps() -> Any:
    return importlib.import_module("flower_server_apps")


def _settings(tmp_path: Path) -> Any:
    return load_flower_config(
        None,
        [
            f"storage.url=sqlite:///{tmp_path / 'geofl.db'}",
            f"storage.checkpoints={tmp_path / 'ckpt'}",
            "server.address=127.0.0.1:0",
            "server.heartbeat_interval_s=0.5",
        ],
    )


@pytest.fixture
def serve_flower(tmp_path: Path, serve_coordinator: Any) -> Any:
    """``serve_flower(serverapp_name, run_config)``: a FlowerCoordinator in a thread."""

    def start(serverapp: str, run_config: dict[str, Any]) -> ServerHandle:
        app = FlowerApp(
            root=tmp_path,
            name="itest-flower",
            version="1.0.0",
            publisher="geofl-tests",
            serverapp=f"flower_server_apps:{serverapp}",
            clientapp="flower_server_apps:message_app",
            config=dict(run_config),
            num_supernodes=None,
        )
        return serve_coordinator(
            lambda: FlowerCoordinator(
                app, getattr(_apps(), serverapp), run_config, _settings(tmp_path)
            )
        )

    return start


def _detail(tmp_path: Path, run_id: int, db: str = "geofl.db") -> Any:
    url = f"sqlite:///{tmp_path / db}"
    with open_database(url, migrate=False) as db, db.session() as session:
        return queries.run_detail(session, run_id)


def _run(serve_flower: Any, serverapp: str, client_app: str, rounds: int) -> Any:
    server = serve_flower(serverapp, {"num-server-rounds": rounds})
    for partition in range(CLIENTS):
        server.add_client(partition, app=f"flower_server_apps:{client_app}")
    return server.wait(timeout=120)


def _assert_same_result(got: Any, want: Any) -> None:
    assert got.arrays.keys() == want.arrays.keys()
    for key in want.arrays:
        np.testing.assert_allclose(got.arrays[key].numpy(), want.arrays[key].numpy(), rtol=1e-6)
    assert got.train_metrics_clientapp.keys() == want.train_metrics_clientapp.keys()
    for number, metrics in want.train_metrics_clientapp.items():
        assert dict(got.train_metrics_clientapp[number]) == pytest.approx(dict(metrics))
    for number, metrics in want.evaluate_metrics_clientapp.items():
        assert dict(got.evaluate_metrics_clientapp[number]) == pytest.approx(dict(metrics))


def _assert_rounds_recorded(tmp_path: Path, run_id: int, rounds: int) -> Any:
    detail = _detail(tmp_path, run_id)
    assert detail.run.status == "completed"
    assert [r.number for r in detail.rounds] == list(range(1, rounds + 1))
    assert all(r.status == "committed" for r in detail.rounds)
    for r in detail.rounds:
        assert (r.num_selected, r.num_succeeded, r.num_failed) == (CLIENTS, CLIENTS, 0)
        assert r.train_loss == pytest.approx((10 * 0 + 20 * 1 + 30 * 2) / 60)
        assert r.eval_metrics["accuracy"] == pytest.approx(0.6)
    return detail


@pytest.mark.parametrize(
    ("serverapp", "name"), [("fedadam_app", "fedadam"), ("fedmedian_app", "fedmedian")]
)
def test_message_api_strategy_runs_unchanged_and_is_recorded(
    tmp_path: Path, serve_flower: Any, serverapp: str, name: str
) -> None:
    apps = _apps()
    apps.RESULTS.pop(name, None)
    result = _run(serve_flower, serverapp, "message_app", rounds=3)
    assert result.status == "completed", result.error
    got = apps.RESULTS.pop(name)
    apps.reference_run(getattr(apps, serverapp), apps.message_app, {"num-server-rounds": 3})
    _assert_same_result(got, apps.RESULTS[name])
    if name == "fedmedian":  # the median of the shifts 1, 2, 3 is 2 per round, exactly
        np.testing.assert_array_equal(got.arrays["w"].numpy(), np.full((4, 3), 6.0))
    detail = _assert_rounds_recorded(tmp_path, result.run_id, rounds=3)
    by_round: dict[tuple[int, str], list[Any]] = {}
    for p in detail.participations:
        by_round.setdefault((p.round_number, p.kind), []).append(p)
    for number in (1, 2, 3):
        fits, evals = by_round[(number, "fit")], by_round[(number, "evaluate")]
        assert sorted(p.num_examples for p in fits) == [10, 20, 30]
        assert all(p.status == "ok" and p.bytes_up > 60 for p in fits)
        assert all(p.bytes_down > 60 for p in evals)  # each evaluation gets the new model
        if number == 1:
            assert all(p.bytes_down > 60 for p in fits)
        else:  # train sends the model evaluate just sent: the nodes hold it already
            assert all(p.bytes_down == 0 for p in fits)


def test_a_failing_client_app_is_an_error_reply_and_the_run_goes_on(
    tmp_path: Path, serve_flower: Any
) -> None:
    apps = _apps()
    server = serve_flower("fedmedian_app", {"num-server-rounds": 1})
    server.add_client(0, app="flower_server_apps:message_app")
    server.add_client(1, app="flower_server_apps:message_app")
    server.add_client(2, app="flower_server_apps:message_app", behaviour="raise")
    result = server.wait(timeout=60)
    assert result.status == "completed", result.error
    # The median of the two good updates (shifts 1 and 2).
    np.testing.assert_array_equal(apps.RESULTS.pop("fedmedian").arrays["w"].numpy(), 1.5)
    detail = _detail(tmp_path, result.run_id)
    (only,) = detail.rounds
    assert (only.num_selected, only.num_succeeded, only.num_failed) == (3, 2, 1)
    fits = {p.node_name: p for p in detail.participations if p.kind == "fit"}
    assert fits["node-2"].status == "failed"
    assert "ValueError: deliberate failure in a train handler" in (fits["node-2"].reason or "")


def test_legacy_server_fn_app_runs_with_a_legacy_client_app(
    tmp_path: Path, serve_flower: Any
) -> None:
    result = _run(serve_flower, "legacy_app", "legacy_client_app", rounds=2)
    assert result.status == "completed", result.error
    detail = _assert_rounds_recorded(tmp_path, result.run_id, rounds=2)
    # Round r's evaluation sees the model after r FedAvg steps.
    losses = [r.eval_loss for r in detail.rounds]
    assert losses == pytest.approx([STEP, 2 * STEP], rel=1e-5)


def test_custom_main_with_query_messages_and_an_unknown_node(
    tmp_path: Path, serve_flower: Any
) -> None:
    apps = _apps()
    server = serve_flower("query_app", {})
    for partition in range(CLIENTS):
        server.add_client(partition, app="flower_server_apps:query_client_app")
    result = server.wait(timeout=60)
    assert result.status == "completed", result.error
    replies = apps.RESULTS.pop("query")
    answered = [r for r in replies if not r.has_error()]
    errors = [r for r in replies if r.has_error()]
    assert len(answered) == CLIENTS
    assert sorted(r.content["answer"]["partition"] for r in answered) == [0, 1, 2]
    assert len(errors) == 1 and errors[0].metadata.src_node_id == 987_654_321
    assert "not connected" in (errors[0].error.reason or "")
    assert _detail(tmp_path, result.run_id).rounds == ()  # queries are not rounds


def test_unsupported_dtype_fails_the_run_with_a_clear_error(
    tmp_path: Path, serve_flower: Any
) -> None:
    server = serve_flower("uint64_app", {})
    for partition in range(CLIENTS):
        server.add_client(partition, app="flower_server_apps:message_app")
    result = server.wait(timeout=60)
    assert result.status == "failed"
    assert "'counts'" in result.error and "uint64" in result.error
    assert "astype" in result.error  # says what to do instead
    assert _detail(tmp_path, result.run_id).run.status == "failed"


def test_secagg_workflow_is_refused_with_what_to_do_instead(
    tmp_path: Path, serve_flower: Any
) -> None:
    server = serve_flower("secagg_app", {})
    for partition in range(CLIENTS):
        server.add_client(partition, app="flower_server_apps:legacy_client_app")
    result = server.wait(timeout=60)
    assert result.status == "failed"
    assert "UnsupportedFlowerFeatureError" in result.error and "SecAgg+" in result.error
    assert "DefaultWorkflow without a secure-aggregation fit_workflow" in result.error


def test_flower_app_directory_runs_with_geofl_simulate(tmp_path: Path) -> None:
    app_dir = tmp_path / "app"
    shutil.copytree(APP_DIR, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    result = run_geofl(
        tmp_path,
        "simulate",
        "--flower-app",
        str(app_dir),
        "--run-config",
        "num-server-rounds=2 fraction-evaluate=1.0",
        "--set",
        "server.address=127.0.0.1:0",
        "--set",
        "server.heartbeat_interval_s=0.5",
        timeout=240,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "round 2/2 committed" in result.stderr
    detail = _detail(tmp_path, 1, db="runs/geofl.db")  # the default, under the cwd
    assert detail.run.status == "completed"
    assert (detail.run.name, detail.run.rounds_planned, detail.run.num_nodes) == ("flowernp", 2, 3)
    assert [r.status for r in detail.rounds] == ["committed", "committed"]
    assert [r.num_succeeded for r in detail.rounds] == [3, 3]  # options.num-supernodes = 3
    # The app's evaluation reports the mean weight: one FedAvg step (lr 0.5) per round.
    means = [r.eval_metrics["w-mean"] for r in detail.rounds]
    assert means == pytest.approx([0.5 * STEP, 2 * 0.5 * STEP], rel=1e-5)


def _write_app(tmp_path: Path, pyproject: str) -> Path:
    app_dir = tmp_path / "app"
    shutil.copytree(APP_DIR, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (app_dir / "pyproject.toml").write_text(pyproject)
    return app_dir


@pytest.mark.parametrize(
    ("edit", "extra", "expected"),
    [
        (('clientapp = "flowernp.client_app:app"', ""), (), "has no clientapp"),
        ((), ("--run-config", "no-such-key=1"), "no-such-key not in [tool.flwr.app.config]"),
        ((), ("--run-config", "greeting=hello"), 'strings need quotes (e.g. greeting="hello")'),
        ((), ("--set", "strategy.name=fedavg"), "strategy: not used with --flower-app"),
        (("options.num-supernodes = 3", ""), (), "how many clients?"),
    ],
)
def test_bad_flower_inputs_give_one_clear_error(
    tmp_path: Path, edit: tuple[str, str], extra: tuple[str, ...], expected: str
) -> None:
    pyproject = (APP_DIR / "pyproject.toml").read_text()
    if edit:
        assert edit[0] in pyproject
        pyproject = pyproject.replace(edit[0], edit[1])
    app_dir = _write_app(tmp_path, pyproject)
    result = run_geofl(tmp_path, "simulate", "--flower-app", str(app_dir), *extra, timeout=60)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_serverapp_is_a_usage_error_before_serving(tmp_path: Path) -> None:
    pyproject = (APP_DIR / "pyproject.toml").read_text()
    app_dir = _write_app(tmp_path, pyproject.replace("server_app:app", "server_app:missing"))
    result = run_geofl(
        tmp_path, "server", "--flower-app", str(app_dir), "--set", "server.address=127.0.0.1:0"
    )
    assert result.returncode == 2, result.stderr
    assert "Unable to find attribute missing in module flowernp.server_app" in result.stderr
    assert "listening on port" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_a_serverapp_that_does_not_import_is_a_user_code_error(tmp_path: Path) -> None:
    app_dir = _write_app(tmp_path, (APP_DIR / "pyproject.toml").read_text())
    module = app_dir / "flowernp" / "server_app.py"
    module.write_text(module.read_text() + "\nraise RuntimeError('broken at import')\n")
    result = run_geofl(
        tmp_path, "server", "--flower-app", str(app_dir), "--set", "server.address=127.0.0.1:0"
    )
    assert result.returncode == 5, result.stderr
    assert "RuntimeError: broken at import" in result.stderr
    assert "Traceback" not in result.stderr


def test_flower_options_without_a_flower_app_are_usage_errors(tmp_path: Path) -> None:
    missing = run_geofl(tmp_path, "server", "--set", "run.rounds=1")
    assert missing.returncode == 2 and "-c/--config RUN.yaml is required" in missing.stderr
    stray = run_geofl(tmp_path, "simulate", "-c", "run.yaml", "--run-config", "lr=0.1")
    assert stray.returncode == 2
    assert "--run-config, --federation, --federation-config and --min-nodes need" in stray.stderr
    nodes = run_geofl(tmp_path, "server", "-c", "run.yaml", "--min-nodes", "3")
    assert nodes.returncode == 2 and "need --flower-app DIR" in nodes.stderr


def test_help_lists_the_flower_options() -> None:
    for command in ("server", "simulate"):
        result = run_geofl(Path.cwd(), command, "--help")
        assert result.returncode == 0
        assert "--flower-app DIR" in result.stdout and "--run-config" in result.stdout
    assert "--min-nodes N" in run_geofl(Path.cwd(), "server", "--help").stdout
    simulate_help = run_geofl(Path.cwd(), "simulate", "--help").stdout
    assert "--federation" in simulate_help and "--federation-config" in simulate_help
