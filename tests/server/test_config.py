"""Run configuration: loading, defaults, path resolution and error messages."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from geofl.server.config import (
    STRATEGY_CONFIGS,
    ConfigError,
    FedAdamConfig,
    FedAvgConfig,
    load_config,
    parse_config,
    redact_url,
)

MINIMAL = "run: {name: demo}\nmodel: pkg.task:make_model\n"

FULL = """\
run:
  name: fmnist-3.regions_v2
  rounds: 50
  seed: 7
model: examples.fmnist.task:make_model
strategy:
  name: fedadam
  clients_per_round: 20
  min_clients: 15
  server_lr: 0.02
  tau: 1e-4
schedule: {mode: sync, deadline_s: 60, wait_for_clients_s: 30.5, over_select: 1.3}
round_config: {local_epochs: 2, lr: 0.05, optimizer: sgd, nesterov: true}
evaluation: {every: 5, clients: 4, server: examples.fmnist.task:evaluate, config: {batch: 64}}
storage: {url: "sqlite:///db/runs.db?timeout=5", checkpoints: ck, keep_checkpoints: 3}
server:
  address: "[::1]:9443"
  tls: {cert: certs/server.pem, key: certs/server.key}
  heartbeat_interval_s: 2
  chunk_bytes: 2097152
  max_model_bytes: 1000000
simulation:
  clients: 12
  app: examples.fmnist.client:app
  node_config: {data-dir: /data, batch-size: 32}
"""


def write(directory: Path, text: str, name: str = "run.yml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(path: Path, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value).splitlines()


@pytest.fixture
def full_file(tmp_path: Path) -> Path:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "server.pem").write_text("cert")
    (tmp_path / "certs" / "server.key").write_text("key")
    return write(tmp_path, FULL)


def test_full_config_loads_every_value(full_file: Path) -> None:
    base = full_file.parent
    cfg = load_config(full_file)
    assert (cfg.run.name, cfg.run.rounds, cfg.run.seed) == ("fmnist-3.regions_v2", 50, 7)
    assert cfg.model == "examples.fmnist.task:make_model"
    assert isinstance(cfg.strategy, FedAdamConfig)
    assert cfg.strategy.params() == {"server_lr": 0.02, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-4}
    assert (cfg.strategy.clients_per_round, cfg.strategy.min_clients) == (20, 15)
    assert cfg.schedule.deadline_s == 60.0 and isinstance(cfg.schedule.deadline_s, float)
    assert (cfg.schedule.wait_for_clients_s, cfg.schedule.over_select) == (30.5, 1.3)
    assert cfg.round_config == {"local_epochs": 2, "lr": 0.05, "optimizer": "sgd", "nesterov": True}
    assert cfg.evaluation.server == "examples.fmnist.task:evaluate"
    assert cfg.evaluation_clients == 4
    assert cfg.storage.url == f"sqlite:///{base / 'db' / 'runs.db'}?timeout=5"
    assert cfg.storage.checkpoints == base / "ck"
    assert cfg.storage.keep_checkpoints == 3
    assert (cfg.server.host, cfg.server.port) == ("::1", 9443)
    assert cfg.server.tls is not None
    assert cfg.server.tls.cert == base / "certs" / "server.pem"
    assert cfg.server.tls.key == base / "certs" / "server.key"
    assert cfg.server.chunk_bytes == 2 * 1024 * 1024
    assert cfg.simulation.node_config == {"data-dir": "/data", "batch-size": 32}
    assert cfg.simulation.app == "examples.fmnist.client:app"


def test_defaults_fill_every_section(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert (cfg.run.rounds, cfg.run.seed) == (3, 0)
    assert cfg.strategy == FedAvgConfig(name="fedavg", clients_per_round=2, min_clients=2)
    assert cfg.strategy.server_lr == 1.0
    schedule = cfg.schedule.model_dump()
    assert {k: schedule[k] for k in ("mode", "deadline_s", "wait_for_clients_s")} == {
        "mode": "sync",
        "deadline_s": 600.0,
        "wait_for_clients_s": 300.0,
    }
    assert schedule["over_select"] == 1.0
    # Flower's behaviour unless asked: uniform selection, no adaptive codecs.
    assert schedule["selection"]["policy"] == "uniform" and cfg.compression.adaptive is False
    assert cfg.round_config == {} and cfg.evaluation.config == {}
    assert (cfg.evaluation.every, cfg.evaluation.clients, cfg.evaluation.server) == (1, None, None)
    assert cfg.evaluation_clients == 2
    assert cfg.storage.url == f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    assert cfg.storage.checkpoints == tmp_path / "runs" / "checkpoints"
    assert cfg.storage.keep_checkpoints is None
    assert cfg.server.model_dump() == {
        "address": "127.0.0.1:8443",
        "tls": None,
        "auth": None,
        "insecure": False,
        "heartbeat_interval_s": 5.0,
        "chunk_bytes": 1024 * 1024,
        "max_model_bytes": 8 * 1024**3,
        "upload_buffer_bytes": 256 * 1024**2,
        "regions": [],
        "control": None,
        "metrics": None,
        "dashboard": None,
    }
    assert cfg.tracking.model_dump() == {"mlflow": None, "tensorboard": None}
    assert cfg.privacy is None
    simulation = cfg.simulation.model_dump()
    assert {k: simulation[k] for k in ("clients", "app", "node_config", "relays")} == {
        "clients": 2,
        "app": None,
        "node_config": {},
        "relays": False,
    }
    # No WAN model, no trace, no built-in partition: the app partitions itself, as before.
    assert (simulation["regions"], simulation["trace"], simulation["partition"]) == ({}, None, None)
    assert (simulation["clock"], simulation["backend"]) == ("wall", "process")


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("fedavg", {"server_lr": 1.0}),
        ("fedavgm", {"server_lr": 1.0, "server_momentum": 0.9}),
        ("fedprox", {"server_lr": 1.0, "proximal_mu": 0.01}),
        ("fedadam", {"server_lr": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}),
        ("fedyogi", {"server_lr": 0.01, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}),
        ("fedadagrad", {"server_lr": 0.1, "tau": 1e-3}),
    ],
)
def test_strategy_defaults_per_name(name: str, params: dict[str, float]) -> None:
    cfg = parse_config({"run": {"name": "x"}, "model": "m:f", "strategy": {"name": name}})
    assert type(cfg.strategy) is STRATEGY_CONFIGS[name]
    assert cfg.strategy.name == name
    assert cfg.strategy.params() == params


def test_strategy_configs_build_registered_strategies() -> None:
    from geofl.server.strategies import STRATEGIES, make_strategy

    assert list(STRATEGY_CONFIGS) == list(STRATEGIES)
    for name, model in STRATEGY_CONFIGS.items():
        strategy = make_strategy(name, **model.model_validate({}).params())
        assert type(strategy) is STRATEGIES[name]


def test_strategy_name_defaults_to_fedavg() -> None:
    cfg = parse_config({"run": {"name": "x"}, "model": "m:f", "strategy": {"clients_per_round": 5}})
    assert isinstance(cfg.strategy, FedAvgConfig)
    assert cfg.strategy.clients_per_round == 5


def test_typo_names_line_and_allowed_keys(tmp_path: Path) -> None:
    text = MINIMAL + "strategy:\n  name: fedavg\n  clients_per_rond: 4\n"
    path = write(tmp_path, text)
    assert problems_of(path) == [
        f"{path}:5: strategy.clients_per_rond: unknown key; allowed keys: "
        "clients_per_round, max_examples_per_client, min_clients, name, robust, server_lr"
    ]


def test_unknown_section_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "privcy: {enabled: true}\n")
    (line,) = problems_of(path)
    assert line.startswith(f"{path}:3: privcy: unknown key; allowed keys: compression,")


def test_secure_aggregation_refuses_per_client_codecs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + "secure_aggregation: {enabled: true}\ncompression: {up: [{topk: {ratio: 0.1}}]}\n",
    )
    (line,) = problems_of(path)
    assert "compression.up cannot be combined with secure_aggregation" in line
    assert "ring_bits" in line


def test_secure_aggregation_refuses_flower_strategies(tmp_path: Path) -> None:
    path = write(
        tmp_path, MINIMAL + "secure_aggregation: {enabled: true}\nstrategy: {flower: FedMedian}\n"
    )
    (line,) = problems_of(path)
    assert "cannot be combined with a Flower strategy" in line


def test_secure_aggregation_needs_two_clients(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL + "secure_aggregation: {enabled: true}\nstrategy: {clients_per_round: 1, "
        "min_clients: 1}\n",
    )
    (line,) = problems_of(path)
    assert "min_clients >= 2" in line


def test_secure_aggregation_ring_and_threshold_bounds(tmp_path: Path) -> None:
    path = write(
        tmp_path, MINIMAL + "secure_aggregation: {enabled: true, ring_bits: 40, threshold: 0.4}\n"
    )
    problems = problems_of(path)
    assert any("secure_aggregation.ring_bits" in p and "32" in p for p in problems), problems
    assert any("secure_aggregation.threshold" in p and "0.5" in p for p in problems), problems


def test_wrong_type_is_not_coerced(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  name: demo\n  rounds: '3'\nmodel: m:f\n")
    assert problems_of(path) == [f"{path}:3: run.rounds: Input should be a valid integer (got '3')"]


def test_zero_cohort_reports_bound_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "strategy: {clients_per_round: 0, min_clients: 1}\n")
    assert problems_of(path) == [
        f"{path}:3: strategy.clients_per_round: Input should be greater than or equal to 1 (got 0)"
    ]


def test_wrong_strategy_name_lists_allowed_values(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "strategy:\n  clients_per_round: 3\n  name: fedavgg\n")
    assert problems_of(path) == [
        f"{path}:5: strategy.name: 'fedavgg' is not one of "
        "fedavg, fedavgm, fedprox, fedadam, fedyogi, fedadagrad, adamw, flower"
    ]


def test_wrong_literal_lists_allowed_values(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "schedule: {mode: asynchronous}\n")
    assert problems_of(path) == [
        f"{path}:3: schedule.mode: 'asynchronous' is not one of sync, async, diloco"
    ]


def test_strategy_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "strategy: fedavg\n")
    assert problems_of(path) == [
        f"{path}:3: strategy: expected a mapping with a 'name' key, got 'fedavg'"
    ]


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ("{clients_per_round: 3, min_clients: 5}", "min_clients (5) must not exceed"),
        ("{clients_per_round: 1}", "min_clients (2) must not exceed"),
    ],
)
def test_min_clients_above_cohort(tmp_path: Path, strategy: str, message: str) -> None:
    path = write(tmp_path, MINIMAL + f"strategy: {strategy}\n")
    (line,) = problems_of(path)
    assert line.startswith(f"{path}:3: strategy.min_clients: {message} clients_per_round")


@pytest.mark.parametrize(
    "address",
    ["localhost", ":8443", "host:", "host:70000", "host:-1", "::1:8443", "[zz]:1", "a_b:1", "h:8a"],
)
def test_bad_address(tmp_path: Path, address: str) -> None:
    path = write(tmp_path, MINIMAL + f"server:\n  address: '{address}'\n")
    (line,) = problems_of(path)
    assert line.startswith(f"{path}:4: server.address: ")
    assert repr(address) in line


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        ("0.0.0.0:0", "0.0.0.0", 0),
        ("[::1]:65535", "::1", 65535),
        ("coord.example.org:443", "coord.example.org", 443),
    ],
)
def test_good_address(address: str, host: str, port: int) -> None:
    cfg = parse_config({"run": {"name": "x"}, "model": "m:f", "server": {"address": address}})
    assert (cfg.server.host, cfg.server.port) == (host, port)


def test_missing_tls_file_resolved_against_yaml_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "server.pem").write_text("cert")
    (tmp_path / "server.key").write_text("key")  # next to cwd, not the YAML: must not count
    monkeypatch.chdir(tmp_path)
    path = write(conf, MINIMAL + "server:\n  tls:\n    cert: server.pem\n    key: server.key\n")
    assert problems_of(path) == [f"{path}:6: server.tls.key: file not found: {conf / 'server.key'}"]


def test_paths_resolve_against_yaml_dir_not_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    conf = tmp_path / "conf"
    conf.mkdir()
    text = MINIMAL + "storage: {url: 'sqlite:///../db/x.db', checkpoints: ck}\n"
    cfg = load_config(write(conf, text))
    assert cfg.storage.url == f"sqlite:///{tmp_path / 'db' / 'x.db'}"
    assert cfg.storage.checkpoints == conf / "ck"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:////abs/geofl.db",
        "postgresql+psycopg://geofl@db.example.org:5432/runs",
    ],
)
def test_urls_left_as_written(url: str) -> None:
    cfg = parse_config({"run": {"name": "x"}, "model": "m:f", "storage": {"url": url}})
    assert cfg.storage.url == url


def test_url_without_scheme_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "storage: {url: runs/geofl.db}\n")
    (line,) = problems_of(path)
    assert line.startswith(f"{path}:3: storage.url: expected a database URL")


def test_every_problem_is_listed(tmp_path: Path) -> None:
    text = (
        "run: {name: 'bad name', rounds: 0}\nstrategy: {min_clients: 0}\nserver: {chunk_bytes: 1}\n"
    )
    lines = problems_of(write(tmp_path, text))
    paths = [line.split(": ")[1] for line in lines]
    expected = ["run.name", "run.rounds", "model", "strategy.min_clients", "server.chunk_bytes"]
    assert sorted(paths) == sorted(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("run: {name: demo\nmodel: m:f\n", r":\d+: invalid YAML: "),
        ("- a\n- b\n", ": the top level must be a mapping of sections .*, got a list"),
        ("", ": the top level must be a mapping of sections .*, got an empty document"),
        ("run: !!python/object/apply:os.system [echo hi]\n", r":1: invalid YAML: .*constructor"),
        (MINIMAL + "run: {name: again}\n", r":3: run: duplicate key \(first set on line 1\)"),
    ],
)
def test_unreadable_documents(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    (line,) = problems_of(path)
    assert line.startswith(str(path))
    assert re.search(expected, line), line


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nope.yml") == [f"{tmp_path / 'nope.yml'}: file not found"]
    assert problems_of(tmp_path) == [f"{tmp_path}: is a directory, not a YAML file"]


def test_exponent_floats_read_as_numbers(tmp_path: Path) -> None:
    text = MINIMAL + "strategy: {name: fedyogi, tau: 1e-6, server_lr: 2E-2}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.strategy.params()["tau"] == 1e-6
    assert cfg.strategy.params()["server_lr"] == 0.02


@pytest.mark.parametrize(
    ("value", "message"),
    [("[1, 2]", "expected a boolean, number or string, got list"), (".nan", "finite number")],
)
def test_round_config_holds_scalars_only(tmp_path: Path, value: str, message: str) -> None:
    path = write(tmp_path, MINIMAL + f"round_config:\n  lr: {value}\n")
    (line,) = problems_of(path)
    assert line.startswith(f"{path}:4: round_config.lr: ") and message in line


def test_simulation_reserves_partition_keys(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "simulation: {node_config: {num-partitions: 3}}\n")
    assert problems_of(path) == [
        f"{path}:3: simulation.node_config: num-partitions: set by the simulator for each client"
    ]


def test_import_paths_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "run: {name: d}\nmodel: pkg/task.py\n")
    assert problems_of(path) == [
        f"{path}:2: model: expected 'package.module:attribute', got 'pkg/task.py'"
    ]


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    with pytest.raises(ValidationError):
        cfg.run.rounds = 10


def test_to_dict_is_json_safe_and_reloads(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path, FULL.replace("  tls: {cert: certs/server.pem, key: certs/server.key}\n", "")
        )
    )
    data = cfg.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["storage"]["checkpoints"] == str(tmp_path / "ck")
    assert data["strategy"]["name"] == "fedadam"
    assert parse_config(data, base_dir=Path("/somewhere/else")) == cfg


def test_to_dict_redacts_database_password() -> None:
    url = "postgresql+psycopg://geofl:s3cret@db:5432/runs"
    cfg = parse_config({"run": {"name": "x"}, "model": "m:f", "storage": {"url": url}})
    assert cfg.storage.url == url
    assert cfg.to_dict()["storage"]["url"] == "postgresql+psycopg://geofl:***@db:5432/runs"
    assert "s3cret" not in json.dumps(cfg.to_dict())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:p@h/d", "postgresql://u:***@h/d"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("sqlite:///a:b@c.db", "sqlite:///a:b@c.db"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_sha256_is_stable_and_sensitive() -> None:
    one = {"run": {"name": "x", "rounds": 4}, "model": "m:f", "round_config": {"a": 1, "b": 2.5}}
    two = {"round_config": {"b": 2.5, "a": 1}, "model": "m:f", "run": {"rounds": 4, "name": "x"}}
    base = Path("/base")
    sha = parse_config(one, base_dir=base).config_sha256()
    assert len(sha) == 64 and int(sha, 16) >= 0
    assert parse_config(two, base_dir=base).config_sha256() == sha
    one["run"] = {"name": "x", "rounds": 5}
    assert parse_config(one, base_dir=base).config_sha256() != sha


def test_sha256_is_over_canonical_json_without_what_only_watches_the_run() -> None:
    cfg = parse_config({"run": {"name": "x"}, "model": "m:f"}, base_dir=Path("/b"))
    data = cfg.to_dict()
    del data["tracking"]
    del data["privacy"]  # null: left out, so runs from before the section keep their identity
    for key in ("control", "metrics", "dashboard"):
        data["server"].pop(key, None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert cfg.config_sha256() == hashlib.sha256(canonical.encode()).hexdigest()


def test_watching_a_run_does_not_change_its_identity() -> None:
    plain = {"run": {"name": "x"}, "model": "m:f"}
    watched = {
        **plain,
        "server": {"metrics": {"address": "127.0.0.1:0"}},
        "tracking": {"tensorboard": {"log_dir": "tb"}},
    }
    sha = parse_config(plain, base_dir=Path("/b")).config_sha256()
    assert parse_config(watched, base_dir=Path("/b")).config_sha256() == sha
    changed = {**plain, "strategy": {"clients_per_round": 7}}
    assert parse_config(changed, base_dir=Path("/b")).config_sha256() != sha


def test_parse_config_rejects_non_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^<config>: the top level must be a mapping"):
        parse_config([1, 2])  # type: ignore[arg-type]


def test_config_error_keeps_structured_problems(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "schedule: {deadline_s: soon}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert (problem.source, problem.path, problem.line) == (str(path), "schedule.deadline_s", 3)
    assert problem.message == "Input should be a valid number (got 'soon')"


def test_empty_sections_mean_defaults(tmp_path: Path) -> None:
    text = MINIMAL + "strategy:\nevaluation:\n  # every: 2\nround_config:\n"
    cfg = load_config(write(tmp_path, text))
    assert isinstance(cfg.strategy, FedAvgConfig)
    assert cfg.evaluation.every == 1 and cfg.round_config == {}


def test_null_run_section_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\nmodel: m:f\n")
    assert problems_of(path) == [f"{path}:1: run: expected a mapping, got null"]


def test_async_secure_aggregation_needs_a_buffer_of_two_at_config_time() -> None:
    data = {
        "run": {"name": "x", "rounds": 2},
        "model": "m:f",
        "schedule": {"mode": "async", "fedbuff": {"buffer_size": 1, "updates": 7}},
        "secure_aggregation": {"enabled": True},
    }
    with pytest.raises(ConfigError, match=r"fedbuff\.buffer_size must be >= 2"):
        parse_config(data, source="t")
    data["schedule"] = {"mode": "async", "fedbuff": {"buffer_size": 2, "updates": 7}}
    assert parse_config(data, source="t").planned_rounds == 7
