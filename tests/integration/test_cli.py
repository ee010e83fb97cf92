"""The ``geofl`` program as a user runs it: help, exit codes, errors, simulate, runs."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from geofl.server.cli.exit_codes import HELP, ExitCode
from geofl.server.cli.main import build_parser

from .processes import run_geofl, write_config


def test_every_exit_code_has_help_and_appears_in_geofl_help() -> None:
    assert set(HELP) == set(ExitCode)
    text = build_parser().format_help()
    for code in ExitCode:
        assert f"{int(code):>3}  {HELP[code]}" in text


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), ["server", "client", "simulate", "runs", "db", "exit codes"]),
        (("server",), ["--config", "--set"]),
        (("client",), ["--server", "--app", "--region", "--node-config", "--root-certificates"]),
        (("simulate",), ["--config", "--set", "simulation.clients"]),
        (("runs", "list"), ["--db", "--json"]),
        (("runs", "show"), ["RUN_ID", "--db", "--json"]),
        (("runs", "report"), ["RUN_ID", "--db", "--out", "geofl[report]"]),
        (("runs", "export"), ["RUN_ID", "--db", "--csv", "docs/reports.md"]),
        (("db", "upgrade"), ["--db"]),
    ],
)
def test_every_command_explains_itself(
    tmp_path: Path, args: tuple[str, ...], expected: list[str]
) -> None:
    result = run_geofl(tmp_path, *args, "--help")
    assert result.returncode == 0, result.stderr
    for word in expected:
        assert word in result.stdout


def test_yaml_typo_is_reported_with_line_and_allowed_keys(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("clients_per_round", "clients_per_rond"))
    result = run_geofl(tmp_path, "server", "-c", str(config))
    assert result.returncode == ExitCode.USAGE
    assert (
        "run.yaml:" in result.stderr and "strategy.clients_per_rond: unknown key" in result.stderr
    )
    assert "clients_per_round" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_override_is_a_usage_error(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = run_geofl(tmp_path, "simulate", "-c", str(config), "--set", "run.rounds=0")
    assert result.returncode == ExitCode.USAGE
    assert "run.rounds" in result.stderr


def test_simulate_refuses_more_clients_per_round_than_exist(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = run_geofl(
        tmp_path,
        "simulate",
        "-c",
        str(config),
        "--set",
        "simulation.clients=2",
        "--set",
        "strategy.clients_per_round=5",
        "--set",
        "strategy.min_clients=2",
    )
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "strategy.clients_per_round" in result.stderr and "5" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_database_is_one_clear_line(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    url = "postgresql+psycopg://geofl:secret@127.0.0.1:1/geofl"
    result = run_geofl(tmp_path, "server", "-c", str(config), "--set", f"storage.url={url}")
    assert result.returncode == ExitCode.STORAGE_UNAVAILABLE
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unavailable" in lines[0], result.stderr
    assert "secret" not in result.stderr


def test_port_in_use_is_reported(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_geofl(
            tmp_path, "server", "-c", str(config), "--set", f"server.address=127.0.0.1:{port}"
        )
    assert result.returncode == ExitCode.ADDRESS_IN_USE, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr


def test_client_with_missing_app_is_a_user_code_error(tmp_path: Path) -> None:
    result = run_geofl(tmp_path, "client", "--server", "127.0.0.1:1", "--app", "nope.module:app")
    assert result.returncode == ExitCode.USER_CODE
    assert "nope.module" in result.stderr


def test_simulate_then_inspect_runs(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = run_geofl(tmp_path, "simulate", "-c", str(config), "--set", "run.rounds=3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "round 3/3 committed" in result.stderr
    db = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    listing = run_geofl(tmp_path, "runs", "list", "--db", db, "--json")
    runs = json.loads(listing.stdout)
    assert [(r["name"], r["status"], r["last_committed_round"]) for r in runs] == [
        ("proc", "completed", 3)
    ]
    shown = json.loads(
        run_geofl(tmp_path, "runs", "show", str(runs[0]["id"]), "--db", db, "--json").stdout
    )
    assert [r["status"] for r in shown["rounds"]] == ["committed"] * 3
    assert all(r["bytes_up"] > 0 and r["duration_s"] > 0 for r in shown["rounds"])
    assert shown["config"]["run"]["rounds"] == 3
    assert {p["node_name"] for p in shown["participations"]} == {"sim-0", "sim-1"}
    table = run_geofl(tmp_path, "runs", "show", str(runs[0]["id"]), "--db", db)
    assert "committed" in table.stdout and "sim-0" in table.stdout
    missing = run_geofl(tmp_path, "runs", "show", "999", "--db", db)
    assert missing.returncode == ExitCode.USAGE and "999" in missing.stderr


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = run_geofl(tmp_path, "db", "upgrade", "--db", db)
    assert result.returncode == 0, result.stderr
    assert "revision" in result.stdout
    assert json.loads(run_geofl(tmp_path, "runs", "list", "--db", db, "--json").stdout) == []


def test_runs_list_on_a_database_that_is_not_there(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'absent.db'}"
    result = run_geofl(tmp_path, "runs", "list", "--db", db)
    assert result.returncode != 0
    assert "no database file" in result.stderr, result.stderr
    assert not (tmp_path / "absent.db").exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    result = run_geofl(tmp_path, "runs", "list", "--db", f"sqlite:///{empty}")
    assert result.returncode == ExitCode.STORAGE_UNAVAILABLE
    assert "geofl db upgrade" in result.stderr
