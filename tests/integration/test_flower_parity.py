"""A Flower app under geofl behaves as under Flower: issue 18's defects, over real gRPC.

The ServerApps live in ``apps/flower_parity_app`` (NumPy only): one that trains exactly the
nodes connected when it starts, one that fails while its nodes work, one with a custom
``aggregate_train``, central evaluation and a final evaluation of its own.
"""

from __future__ import annotations

import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geofl.storage import open_database, queries
from geofl.storage.models import Event

from .conftest import ServerHandle
from .processes import run_geofl

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("flwr.serverapp")

from geofl.server.flower import FlowerCoordinator, load_app_dir, load_flower_config
from geofl.server.flower.app_dir import load_server_app
from geofl.server.flower.errors import FlowerAppError
from geofl.server.flower.federation import nodes_from_flower_settings

APP_DIR = Path(__file__).parent / "apps" / "flower_parity_app"
DEFAULT_SERVERAPP = 'serverapp = "parityapp.server_app:metrics_app"'
NODES = 3  # options.num-supernodes of the app's federation


@pytest.fixture(autouse=True)
def _no_flower_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's settings outside the app come from the test's own FLWR_HOME only."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))


def _app(
    tmp_path: Path, serverapp: str = "metrics_app", replace: tuple[str, str] = ("", "")
) -> Path:
    app_dir = tmp_path / "app"
    shutil.copytree(APP_DIR, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = (app_dir / "pyproject.toml").read_text()
    assert DEFAULT_SERVERAPP in pyproject
    pyproject = pyproject.replace("server_app:metrics_app", f"server_app:{serverapp}")
    (app_dir / "pyproject.toml").write_text(
        pyproject.replace(*replace) if replace[0] else pyproject
    )
    return app_dir


def _simulate(tmp_path: Path, app_dir: Path, *extra: str, timeout: float = 180) -> Any:
    return run_geofl(
        tmp_path,
        "simulate",
        "--flower-app",
        str(app_dir),
        "--set",
        "server.address=127.0.0.1:0",
        "--set",
        "server.heartbeat_interval_s=0.5",
        *extra,
        timeout=timeout,
    )


def _detail(tmp_path: Path, run_id: int = 1) -> Any:
    url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    with open_database(url, migrate=False) as db, db.session() as session:
        return queries.run_detail(session, run_id)


def _events(tmp_path: Path, kind: str) -> list[Event]:
    url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    with open_database(url, migrate=False) as db, db.session() as session:
        found = session.scalars(select(Event).where(Event.kind == kind).order_by(Event.id))
        return list(found)


# ---------------------------------------------------------------- 1. every node first


def test_simulate_starts_the_serverapp_once_every_node_joined(tmp_path: Path) -> None:
    result = _simulate(tmp_path, _app(tmp_path, "snapshot_app"))
    assert result.returncode == 0, result.stderr + result.stdout
    (only,) = _detail(tmp_path).rounds
    # The ServerApp trains whoever get_node_ids() lists at its start: all of them.
    assert (only.num_selected, only.num_succeeded) == (NODES, NODES)


@pytest.fixture
def serve_app(tmp_path: Path, serve_coordinator: Any) -> Any:
    """``serve_app(serverapp, *overrides)``: the parity app's coordinator in a thread."""

    def start(serverapp: str, *overrides: str) -> ServerHandle:
        app = load_app_dir(_app(tmp_path, serverapp))
        if str(app.root) not in sys.path:
            sys.path.insert(0, str(app.root))
        settings = load_flower_config(
            None,
            [
                f"storage.url=sqlite:///{tmp_path / 'geofl.db'}",
                f"storage.checkpoints={tmp_path / 'ckpt'}",
                "server.address=127.0.0.1:0",
                "server.heartbeat_interval_s=0.5",
                *overrides,
            ],
        )
        return serve_coordinator(
            lambda: FlowerCoordinator(app, load_server_app(app), app.config, settings)
        )

    return start


def test_a_deployment_waits_for_min_nodes_before_the_serverapp_starts(
    tmp_path: Path, serve_app: Any
) -> None:
    server = serve_app("snapshot_app", f"run.min_nodes={NODES}")
    for partition in range(NODES):  # nodes joining one by one, as machines come up
        time.sleep(0.3)
        server.add_client(partition, app="parityapp.client_app:app")
    result = server.wait(timeout=60)
    assert result.status == "completed", result.error
    url = f"sqlite:///{tmp_path / 'geofl.db'}"
    with open_database(url, migrate=False) as db, db.session() as session:
        (only,) = queries.run_detail(session, result.run_id).rounds
    assert only.num_selected == NODES


def test_too_few_nodes_in_time_is_a_clear_error(tmp_path: Path) -> None:
    result = run_geofl(
        tmp_path,
        "server",
        "--flower-app",
        str(_app(tmp_path, "snapshot_app")),
        "--min-nodes",
        "2",
        "--set",
        "server.address=127.0.0.1:0",
        "--set",
        "run.wait_for_nodes_s=1",
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "only 0 of 2 nodes joined within 1 s" in result.stderr
    assert "the ServerApp was not started" in result.stderr


# ---------------------------------------------------------------- 3. a failing ServerApp


def test_a_failing_serverapp_ends_simulate_and_its_clients_at_once(tmp_path: Path) -> None:
    # Its nodes are busy for 60 s: the run must not wait for them (nor they for 60 s more
    # of reconnecting); the subprocess timeout is the failure, not a timing assertion.
    result = _simulate(tmp_path, _app(tmp_path, "raising_app"), timeout=45)
    assert result.returncode == 1, result.stderr
    assert "ValueError: deliberate ServerApp failure" in result.stderr
    assert _detail(tmp_path).run.status == "failed"


# ---------------------------------------------------------------- 4. components first


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        (
            ('clientapp = "parityapp.client_app:app"', 'clientapp = "parityapp.client_app:ap"'),
            "clientapp = 'parityapp.client_app:ap': Unable to find attribute ap",
        ),
        (
            ('clientapp = "parityapp.client_app:app"', 'clientapp = "parityapp.clent_app:app"'),
            "clientapp = 'parityapp.clent_app:app': Unable to load module parityapp.clent_app",
        ),
        (
            ("server_app:metrics_app", "server_app:metrics_ap"),
            "serverapp = 'parityapp.server_app:metrics_ap': Unable to find attribute",
        ),
        (
            ('serverapp = "parityapp.', 'serverapp = "nopkg.'),
            "serverapp = 'nopkg.server_app:metrics_app': Unable to load module nopkg",
        ),
    ],
)
def test_a_component_typo_is_one_error_before_anything_starts(
    tmp_path: Path, replace: tuple[str, str], expected: str
) -> None:
    app_dir = tmp_path / "app"
    shutil.copytree(APP_DIR, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = (app_dir / "pyproject.toml").read_text()
    assert replace[0] in pyproject
    (app_dir / "pyproject.toml").write_text(pyproject.replace(replace[0], replace[1]))
    result = _simulate(tmp_path, app_dir, timeout=60)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "listening on port" not in result.stdout + result.stderr  # nothing started
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- 5 and 6. the records


def test_strategy_results_the_run_id_and_a_final_group_are_recorded(tmp_path: Path) -> None:
    result = _simulate(tmp_path, _app(tmp_path, "metrics_app"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    detail = _detail(tmp_path)
    rounds = {r.number: r for r in detail.rounds}
    assert sorted(rounds) == [1, 2]
    for number, r in rounds.items():
        # The custom aggregate_train's own metric, beside geofl's weighted means.
        assert r.fit_metrics["custom-train"] == 40.0 + number
        assert r.train_loss == pytest.approx((10 * 0 + 20 * 1 + 30 * 2) / 60)
        # evaluate_fn's results: each FedAvg round adds 1 to every weight.
        assert r.server_eval_metrics["central-w-mean"] == pytest.approx(float(number))
        assert r.server_eval_loss == pytest.approx(1.0 / (number + 1))
    # The final evaluation (group_id "final") is not merged into round 2 ...
    evaluations = [p for p in detail.participations if p.kind == "evaluate"]
    assert sorted(p.round_number for p in evaluations) == [1] * NODES + [2] * NODES
    # ... but recorded as its own group.
    (group,) = _events(tmp_path, "flower.group")
    assert group.data["group_id"] == "final" and group.data["kind"] == "evaluate"
    assert (group.data["messages"], group.data["succeeded"]) == (NODES, NODES)
    assert group.data["metrics"]["w-mean"] == pytest.approx(2.0)
    (initial,) = _events(tmp_path, "flower.server_evaluation")
    assert initial.round == 0 and initial.data["metrics"]["central-w-mean"] == 0.0
    # Clients see the ServerApp's run id, as under Flower.
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert {p.metrics["run-id"] for p in fits} == {detail.run.id}
    # Flower's log lines, the ServerApp's and the ClientApps', are printed once.
    assert output.count("Starting CustomAggregation strategy") == 1
    for partition in range(NODES):
        assert output.count(f"parity client {partition} trained") == 2  # once per round


def test_a_legacy_apps_central_evaluation_and_fit_metrics_are_recorded(tmp_path: Path) -> None:
    client = (
        'clientapp = "parityapp.client_app:app"',
        'clientapp = "parityapp.client_app:legacy_app"',
    )
    result = _simulate(tmp_path, _app(tmp_path, "legacy_app", replace=client))
    assert result.returncode == 0, result.stdout + result.stderr
    rounds = _detail(tmp_path).rounds
    assert [r.number for r in rounds] == [1, 2]
    for r in rounds:
        assert r.fit_metrics["custom-fit"] == 7.0  # fit_metrics_aggregation_fn's
        assert r.server_eval_metrics == {"central-w-mean": pytest.approx(float(r.number))}
        assert r.server_eval_loss == pytest.approx(1.0 / (r.number + 1))
        assert r.eval_loss == pytest.approx(0.5)
    # Before round 1, the legacy workflow reports the loss and the metrics one by one.
    initial = _events(tmp_path, "flower.server_evaluation")
    assert {e.round for e in initial} == {0}
    assert [e.data["loss"] for e in initial if e.data["loss"] is not None] == [1.0]
    assert [e.data["metrics"] for e in initial if e.data["metrics"]] == [{"central-w-mean": 0.0}]


# ---------------------------------------------------------------- 6. federation settings


def test_federation_config_sets_the_number_of_simulated_nodes(tmp_path: Path) -> None:
    result = _simulate(
        tmp_path,
        _app(tmp_path, "snapshot_app"),
        "--federation-config",
        "num-supernodes=2 client-resources-num-cpus=1",
    )
    assert result.returncode == 0, result.stderr + result.stdout
    detail = _detail(tmp_path)
    assert detail.run.num_nodes == 2
    assert "client-resources-num-cpus do not apply" in result.stderr


def _write_flower_config(tmp_path: Path, text: str) -> None:
    home = tmp_path / "flwr-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(text)


def test_flower_config_toml_connections_are_read(tmp_path: Path) -> None:
    _write_flower_config(
        tmp_path,
        '[superlink]\ndefault = "local"\n\n'
        '[superlink.local]\naddress = ":local:"\noptions.num-supernodes = 4\n\n'
        '[superlink.big]\naddress = ":local:"\noptions.num-supernodes = 9\n\n'
        '[superlink.remote]\naddress = "127.0.0.1:9093"\n',
    )
    assert nodes_from_flower_settings([], None).count == 4
    assert nodes_from_flower_settings([], "big").count == 9
    remote = nodes_from_flower_settings([], "remote")
    assert remote.count is None and remote.connection_found
    assert nodes_from_flower_settings([], "unknown").count is None
    # --federation-config wins, as it does for `flwr run`.
    assert nodes_from_flower_settings(["num-supernodes=2"], "big").count == 2


def test_no_flower_config_toml_means_no_count(tmp_path: Path) -> None:
    assert nodes_from_flower_settings([], None).count is None
    assert not (tmp_path / "flwr-home").exists()  # geofl reads Flower's file, never writes it


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["num-supernodes=0"], "num-supernodes = 0 is not a count >= 1"),
        (["num-nodes=3"], "Unknown simulation config field(s): num_nodes"),
        (["num-supernodes"], "not key=value pairs"),
        (['num-supernodes="3"'], "--federation-config"),
    ],
)
def test_bad_federation_config_is_a_clear_error(items: list[str], expected: str) -> None:
    with pytest.raises(FlowerAppError, match="federation-config") as raised:
        nodes_from_flower_settings(items, None)
    assert expected in str(raised.value)


def test_a_bad_count_in_config_toml_names_the_file(tmp_path: Path) -> None:
    _write_flower_config(
        tmp_path, '[superlink]\ndefault = "local"\n[superlink.local]\noptions.num-supernodes = 0\n'
    )
    with pytest.raises(FlowerAppError, match=r"config.toml \[superlink.local\]"):
        nodes_from_flower_settings([], None)
