"""The client training API: ClientContext, Client defaults and load_client_app."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from geofl.client.app import Client, ClientAppError, ClientContext, load_client_app
from geofl.protocols.types import Weights

USER_MODULE = """
from geofl.client.app import Client


class Echo(Client):
    def __init__(self, tag="default"):
        self.tag = tag

    def fit(self, parameters, config):
        return parameters, 7, {"tag": self.tag}


class NeedsArgs(Client):
    def __init__(self, data):
        self.data = data

    def fit(self, parameters, config):
        return parameters, 1, {}


class Abstract(Client):
    pass


class NotAClient:
    pass


INSTANCE = Echo("instance")
NUMBER = 42


def factory(context):
    return Echo(context.node_name)


def bad_factory(context):
    return "not a client"


class holder:
    nested = Echo("nested")
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A freshly written, importable user module; yields its unique name."""
    name = f"user_app_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _context(name: str = "client-3") -> ClientContext:
    return ClientContext(node_id=3, node_name=name, region="eu-west")


def test_context_defaults_are_independent() -> None:
    first, second = _context(), _context()
    first.state["round"] = 1
    assert second.state == {}
    assert first.node_config == {} and first.run_config == {}


def test_instance_is_shared(user_module: str) -> None:
    build = load_client_app(f"{user_module}:INSTANCE")
    a, b = build(_context()), build(_context())
    assert a is b
    assert a.fit({}, {})[2] == {"tag": "instance"}


def test_subclass_is_instantiated_per_call(user_module: str) -> None:
    build = load_client_app(f"{user_module}:Echo")
    a, b = build(_context()), build(_context())
    assert a is not b
    assert a.fit({}, {})[2] == {"tag": "default"}


def test_factory_receives_context(user_module: str) -> None:
    build = load_client_app(f"{user_module}:factory")
    client = build(_context("edge-9"))
    weights: Weights = {"w": np.ones(2, dtype=np.float32)}
    new, n, metrics = client.fit(weights, {})
    assert metrics == {"tag": "edge-9"} and n == 7 and new is weights


def test_nested_attribute(user_module: str) -> None:
    client = load_client_app(f"{user_module}:holder.nested")(_context())
    assert client.fit({}, {})[2] == {"tag": "nested"}


@pytest.mark.parametrize("spec", ["no_colon", ":attr", "module:", "a:b:c", "  :  ", "module:x..y"])
def test_malformed_spec(spec: str) -> None:
    with pytest.raises(ClientAppError, match=r"malformed|no attribute|cannot import"):
        load_client_app(spec)


def test_malformed_spec_message() -> None:
    with pytest.raises(ClientAppError, match="expected 'module:attr'"):
        load_client_app("just_a_module")


def test_module_not_importable_shows_import_error() -> None:
    with pytest.raises(ClientAppError, match="No module named 'geofl_no_such_mod'") as info:
        load_client_app("geofl_no_such_mod.sub:app")
    assert isinstance(info.value.__cause__, ImportError)


def test_module_raising_import_error_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"broken_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("import geofl_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ClientAppError, match="geofl_missing_dependency_xyz"):
        load_client_app(f"{name}:app")
    sys.modules.pop(name, None)


def test_missing_attribute(user_module: str) -> None:
    with pytest.raises(ClientAppError, match="has no attribute 'nope'"):
        load_client_app(f"{user_module}:nope")


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        ("NUMBER", "is a int"),
        ("NotAClient", "not a subclass"),
        ("Abstract", "abstract .*fit"),
        ("NeedsArgs", "cannot be instantiated without arguments"),
    ],
)
def test_wrong_type(user_module: str, attr: str, message: str) -> None:
    with pytest.raises(ClientAppError, match=message):
        load_client_app(f"{user_module}:{attr}")


def test_factory_returning_non_client(user_module: str) -> None:
    build = load_client_app(f"{user_module}:bad_factory")
    with pytest.raises(ClientAppError, match="returned str, expected"):
        build(_context())


def test_default_evaluate_is_not_implemented() -> None:
    class FitOnly(Client):
        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            return parameters, 0, {}

    with pytest.raises(NotImplementedError, match="FitOnly does not implement evaluate"):
        FitOnly().evaluate({}, {})
