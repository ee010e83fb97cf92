"""``--set KEY.PATH=VALUE`` overrides: parsing, applying, and their error messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from geofl.server.config import (
    ConfigError,
    FedProxConfig,
    apply_overrides,
    format_override,
    load_config,
    parse_override,
)

MINIMAL = "run: {name: demo}\nmodel: pkg.task:make_model\n"


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.yml"
    path.write_text(MINIMAL + "strategy: {name: fedprox, clients_per_round: 4}\n")
    return path


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("run.rounds=3", ("run", "rounds"), 3),
        ("round_config.lr=0.1", ("round_config", "lr"), 0.1),
        ("strategy.tau=1e-3", ("strategy", "tau"), 1e-3),
        ("x=[1,2]", ("x",), [1, 2]),
        ("a.b={c: d}", ("a", "b"), {"c": "d"}),
        ("run.name=demo-2", ("run", "name"), "demo-2"),
        ("run.name='007'", ("run", "name"), "007"),
        ("model=pkg.mod:fn", ("model",), "pkg.mod:fn"),
        ("evaluation.clients=", ("evaluation", "clients"), None),
        ("flag=true", ("flag",), True),
        ("expr=a=b", ("expr",), "a=b"),
    ],
)
def test_parse_override_reads_yaml_values(text: str, path: tuple[str, ...], value: object) -> None:
    override = parse_override(text)
    assert (override.path, override.value, override.text) == (path, value, text)
    assert type(override.value) is type(value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run.rounds", "--set run.rounds: expected KEY.PATH=VALUE, e.g. run.rounds=10"),
        ("run..rounds=3", "--set run..rounds=3: invalid key path 'run..rounds'"),
        ("=3", "--set =3: invalid key path ''"),
        ("run rounds=3", "--set run rounds=3: invalid key path 'run rounds'"),
        ("x=[1", "--set x=[1: invalid value: "),
    ],
)
def test_malformed_override(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_override(text)
    assert str(info.value).startswith(message)


def test_apply_creates_missing_and_null_mappings_without_mutating() -> None:
    data: dict[str, object] = {"run": {"name": "x"}, "server": None}
    overrides = [
        parse_override("a.b.c=[1,2]"),
        parse_override("server.tls.cert=c.pem"),
        parse_override("run.rounds=9"),
        parse_override("run.rounds=10"),
    ]
    result = apply_overrides(data, overrides)
    assert result == {
        "run": {"name": "x", "rounds": 10},
        "server": {"tls": {"cert": "c.pem"}},
        "a": {"b": {"c": [1, 2]}},
    }
    assert data == {"run": {"name": "x"}, "server": None}


def test_apply_through_a_scalar_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides({"run": {"rounds": 3}}, [parse_override("run.rounds.x=1")])
    assert str(info.value) == (
        "--set run.rounds.x=1: cannot set a key inside run.rounds: it is a int, not a mapping"
    )


def test_overrides_change_nested_values(run_file: Path) -> None:
    cfg = load_config(
        run_file,
        [
            "run.rounds=7",
            "strategy.proximal_mu=0.5",
            "round_config.lr=0.1",
            "round_config.local_epochs=2",
            "simulation.node_config.data-dir=/data",
        ],
    )
    assert cfg.run.rounds == 7
    assert isinstance(cfg.strategy, FedProxConfig)
    assert (cfg.strategy.proximal_mu, cfg.strategy.clients_per_round) == (0.5, 4)
    assert cfg.round_config == {"lr": 0.1, "local_epochs": 2}
    assert cfg.simulation.node_config == {"data-dir": "/data"}


def test_override_paths_resolve_against_yaml_dir(
    run_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")
    cfg = load_config(run_file, ["storage.checkpoints=ck"])
    assert cfg.storage.checkpoints == tmp_path / "ck"


def test_invalid_override_value_names_the_override(run_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(run_file, ["run.rounds=0", "strategy.name=fedavgg"])
    assert str(info.value).splitlines() == [
        "--set run.rounds=0: run.rounds: Input should be greater than or equal to 1 (got 0)",
        "--set strategy.name=fedavgg: strategy.name: 'fedavgg' is not one of "
        "fedavg, fedavgm, fedprox, fedadam, fedyogi, fedadagrad, adamw, flower",
    ]


def test_unknown_key_from_override(run_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(run_file, ["strategy.proximal_muu=1"])
    assert str(info.value) == (
        "--set strategy.proximal_muu=1: strategy.proximal_muu: unknown key; allowed keys: "
        "clients_per_round, max_examples_per_client, min_clients, name, proximal_mu, robust, "
        "server_lr"
    )


def test_every_malformed_override_is_reported(run_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(run_file, ["run.rounds", "ok=1", "x=[1"])
    assert [problem.source for problem in info.value.problems] == ["--set run.rounds", "--set x=[1"]


_keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=8,
)


@given(path=st.lists(_keys, min_size=1, max_size=4).map(tuple), value=_values)
@example(path=("A",), value="\n")  # PyYAML folded it over two lines (found by hypothesis)
def test_format_then_parse_round_trips(path: tuple[str, ...], value: object) -> None:
    text = format_override(path, value)
    override = parse_override(text)
    assert override.path == path
    assert override.value == value
    assert "\n" not in text
