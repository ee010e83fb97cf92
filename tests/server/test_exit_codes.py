"""The one exception -> exit-code mapping of ``geofl server``, ``simulate`` and ``relay``."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import warnings
from types import ModuleType
from typing import Any

import pytest

from geofl.protocols.errors import ErrorCode
from geofl.server.cli.exit_codes import CODES, ExitCode, exit_code_for
from geofl.server.config import ConfigProblem


def _module(name: str) -> ModuleType:
    """Import ``name``; Flower's modules only where flwr is installed (else skip)."""
    with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
        warnings.simplefilter("ignore", DeprecationWarning)
        if name.startswith("geofl.server.flower"):
            pytest.importorskip("flwr.serverapp")
        return importlib.import_module(name)


def _class(module: str, name: str) -> type[BaseException]:
    cls: type[BaseException] = getattr(_module(module), name)
    return cls


@pytest.mark.parametrize(("module", "name", "code"), CODES, ids=[name for _, name, _ in CODES])
def test_each_entry_names_the_module_that_defines_its_class(
    module: str, name: str, code: ExitCode
) -> None:
    cls = _class(module, name)
    assert cls.__module__ == module  # an instance exists only once that module is imported
    assert issubclass(cls, BaseException)


def test_no_entry_is_shadowed_by_an_earlier_base_class() -> None:
    classes = [_class(module, name) for module, name, _ in CODES]
    for i, earlier in enumerate(classes):
        for later in classes[i + 1 :]:
            assert not issubclass(later, earlier), f"{earlier} comes before its {later}"


PROBLEM = ConfigProblem("run.yaml", "run.rounds", "must be >= 1")
CASES: list[tuple[str, str, tuple[Any, ...], dict[str, Any], ExitCode]] = [
    ("geofl.server.config.errors", "ConfigError", ([PROBLEM],), {}, ExitCode.USAGE),
    (
        "geofl.storage.errors",
        "StorageUnavailableError",
        ("x", "no"),
        {},
        ExitCode.STORAGE_UNAVAILABLE,
    ),
    ("geofl.server.coordinator", "AddressInUseError", ("in use",), {}, ExitCode.ADDRESS_IN_USE),
    (
        "geofl.server.metrics.endpoint",
        "MetricsAddressError",
        ("in use",),
        {},
        ExitCode.ADDRESS_IN_USE,
    ),
    ("geofl.server.models.loading", "UserCodeError", ("no module",), {}, ExitCode.USER_CODE),
    ("geofl.server.flower.errors", "FlowerAppError", ("failed",), {}, ExitCode.USER_CODE),
    ("geofl.server.flower.errors", "UnsupportedFlowerFeatureError", ("x",), {}, ExitCode.USER_CODE),
    ("geofl.client.runtime", "GaveUpError", ("gone",), {}, ExitCode.SERVER_UNREACHABLE),
    (
        "geofl.protocols.errors",
        "IdentityRefusedError",
        ("unknown key",),
        {},
        ExitCode.IDENTITY_REFUSED,
    ),
    ("geofl.client.connection", "TlsVerificationError", ("bad CA",), {}, ExitCode.TLS_VERIFICATION),
    ("geofl.client.connection", "CredentialsError", ("no file",), {}, ExitCode.CREDENTIALS),
    ("geofl.protocols.identity", "KeyFileError", ("not a key",), {}, ExitCode.CREDENTIALS),
    ("builtins", "KeyboardInterrupt", (), {}, ExitCode.INTERRUPTED),
    (
        "geofl.protocols.errors",
        "WireError",
        ("no common version",),
        {"code": ErrorCode.PROTOCOL_VERSION},
        ExitCode.PROTOCOL,
    ),
    (
        "geofl.protocols.errors",
        "WireError",
        ("over",),
        {"code": ErrorCode.RUN_FINISHED},
        ExitCode.RUN_FAILED,
    ),
    ("geofl.protocols.errors", "GeoflError", ("a local error",), {}, ExitCode.RUN_FAILED),
    ("geofl.protocols.errors", "ProtocolError", ("malformed",), {}, ExitCode.RUN_FAILED),
    ("geofl.server.simulation.traces", "TraceError", ("bad",), {}, ExitCode.RUN_FAILED),
]


@pytest.mark.parametrize(
    ("module", "name", "args", "kwargs", "code"), CASES, ids=[case[1] for case in CASES]
)
def test_each_exception_maps_to_its_code(
    module: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], code: ExitCode
) -> None:
    exc = _class(module, name)(*args, **kwargs)
    assert exit_code_for(exc) is code


def test_every_entry_has_a_case() -> None:
    assert {(module, name) for module, name, _ in CODES} <= {case[:2] for case in CASES}


@pytest.mark.parametrize(
    "exc", [ValueError("a bug"), RuntimeError("a bug"), SystemExit(3), asyncio.CancelledError()]
)
def test_an_exception_without_a_code_is_raised_again(exc: BaseException) -> None:
    with pytest.raises(type(exc)) as raised:
        exit_code_for(exc)
    assert raised.value is exc


def test_mapping_an_error_imports_nothing() -> None:
    """``geofl relay`` and ``geofl server`` must not load Flower (optional) to fail."""
    code = (
        "import sys\n"
        "from geofl.server.cli.exit_codes import exit_code_for\n"
        "assert exit_code_for(KeyboardInterrupt()) == 130\n"
        "try:\n"
        "    exit_code_for(ValueError())\n"
        "except ValueError:\n"
        "    pass\n"
        "loaded = [m for m in ('flwr', 'pydantic', 'geofl.server.config') if m in sys.modules]\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
