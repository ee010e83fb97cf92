"""Flower app directories, ``--run-config`` and the ``-c`` file beside ``--flower-app``."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from geofl.server.config import ConfigError

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("flwr.serverapp")

from geofl.server.flower import (
    FlowerAppError,
    fuse_run_config,
    load_app_dir,
    load_flower_config,
    parse_run_config,
)

PYPROJECT = """
[project]
name = "demo"
version = "2.0.0"

[tool.flwr.app]
publisher = "me"

[tool.flwr.app.components]
serverapp = "demo.server_app:app"
clientapp = "demo.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
lr = 0.1
model.name = "mlp"
greeting = "hi"

[tool.flwr.federations]
default = "local-simulation"

[tool.flwr.federations.local-simulation]
options.num-supernodes = 4

[tool.flwr.federations.big]
options.num-supernodes = 50
"""


def _app_dir(tmp_path: Path, text: str = PYPROJECT) -> Path:
    (tmp_path / "pyproject.toml").write_text(text)
    return tmp_path


def test_app_directory_is_read_as_flwr_run_reads_it(tmp_path: Path) -> None:
    app = load_app_dir(_app_dir(tmp_path))
    assert (app.fab_id, app.version, app.num_supernodes) == ("me/demo", "2.0.0", 4)
    assert (app.serverapp, app.clientapp) == ("demo.server_app:app", "demo.client_app:app")
    assert app.config == {"num-server-rounds": 3, "lr": 0.1, "model.name": "mlp", "greeting": "hi"}
    assert load_app_dir(tmp_path, federation="big").num_supernodes == 50


def test_run_config_overrides_take_flowers_syntax(tmp_path: Path) -> None:
    app = load_app_dir(_app_dir(tmp_path))
    overrides = parse_run_config(['num-server-rounds=5 greeting="hello world"', "model.name='cnn'"])
    assert overrides == {"num-server-rounds": 5, "greeting": "hello world", "model.name": "cnn"}
    assert fuse_run_config(app, overrides)["lr"] == 0.1
    (tmp_path / "over.toml").write_text("lr = 0.5\n[model]\nname = 'rnn'\n")
    assert parse_run_config([str(tmp_path / "over.toml")]) == {"lr": 0.5, "model.name": "rnn"}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["greeting=hello"], 'strings need quotes (e.g. greeting="hello")'),
        (["justaword"], "'justaword' is not key=value"),
        (["a.toml", "lr=1"], "cannot be mixed"),
    ],
)
def test_malformed_run_config_is_named(items: list[str], message: str) -> None:
    with pytest.raises(FlowerAppError, match="--run-config") as raised:
        parse_run_config(items)
    assert message in str(raised.value)


def test_unknown_override_keys_list_the_known_ones(tmp_path: Path) -> None:
    app = load_app_dir(_app_dir(tmp_path))
    with pytest.raises(
        FlowerAppError, match=r"epochs not in \[tool.flwr.app.config\].*known keys: greeting, lr"
    ):
        fuse_run_config(app, {"epochs": 2})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('publisher = "me"', ""), "[tool.flwr.app] has no publisher (Flower requires it"),
        (('version = "2.0.0"', ""), "[project] has no version"),
        (('serverapp = "demo.server_app:app"', ""), "has no serverapp"),
        (('"demo.client_app:app"', '"demo.client_app"'), 'is not "module:attr"'),
        (("options.num-supernodes = 4", "options.num-supernodes = 0"), "is not a count >= 1"),
        (('default = "local-simulation"', 'default = "nowhere"'), "federation 'nowhere' is not"),
        (("lr = 0.1", "lr = [0.1]"), "run-config values are bool, int, float or string"),
        (("[project]", "[project"), "is not valid TOML"),
    ],
)
def test_bad_app_directories_are_named(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    assert edit[0] in PYPROJECT
    with pytest.raises(FlowerAppError) as raised:
        load_app_dir(_app_dir(tmp_path, PYPROJECT.replace(edit[0], edit[1])))
    assert message in str(raised.value)


def test_missing_directory_pyproject_and_flower_table_are_named(tmp_path: Path) -> None:
    with pytest.raises(FlowerAppError, match="does not exist"):
        load_app_dir(tmp_path / "nope")
    with pytest.raises(FlowerAppError, match=r"pyproject.toml not found.*flwr new"):
        load_app_dir(tmp_path)
    with pytest.raises(FlowerAppError, match=r"has no \[tool.flwr.app\] table"):
        load_app_dir(_app_dir(tmp_path, "[project]\nname = 'x'\nversion = '1'\n"))


def test_run_file_adds_geofl_settings_and_refuses_what_the_app_decides(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "run: {name: demo-run}\nstorage: {url: sqlite:///db/runs.db}\nsimulation:\n  clients: 5\n"
    )
    settings = load_flower_config(good, ["server.heartbeat_interval_s=2"])
    assert (settings.run.name, settings.simulation.clients) == ("demo-run", 5)
    assert settings.storage.url == f"sqlite:///{tmp_path / 'db' / 'runs.db'}"
    assert settings.server.heartbeat_interval_s == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {name: x, rounds: 3}\nmodel: a.b:c\nstrategy: {name: fedavg}\n")
    with pytest.raises(ConfigError) as raised:
        load_flower_config(bad)
    text = str(raised.value)
    assert f"{bad}:2: model: not used with --flower-app" in text
    assert f"{bad}:3: strategy: not used with --flower-app: the ServerApp builds its own" in text
    assert (
        f"{bad}:1: run.rounds: not used with --flower-app" in text and "num-server-rounds" in text
    )
    with pytest.raises(ConfigError, match=r"simulation\.clients"):
        load_flower_config(None, ["simulation.clients=0"])
