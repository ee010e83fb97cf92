"""One exception tree: every public exception class of geofl derives from GeoflError.

Every module of the four installed packages is imported and every public exception class
defined there is collected; the tree drawn in ``geofl.protocols.errors``'s docstring must
name exactly those classes, each under its true parent and with its extra bases.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import geofl.protocols.errors as errors
from geofl.protocols.errors import ErrorCode, GeoflError, WireError

PACKAGES = ("geofl.protocols", "geofl.storage", "geofl.server", "geofl.client")
#: Scripts that are not importable library modules: running a ``__main__`` starts a
#: program, and Alembic's ``env.py`` only runs inside an Alembic migration.  They must
#: define no classes (checked below), so leaving them out hides no exception class.
SCRIPTS = ("geofl.storage.migrations.env",)


#: Exceptions outside GeoflError by design, each with why (and the base it must keep).
OUTSIDE_BY_DESIGN: dict[str, tuple[str, str]] = {
    # Flower's grids end a run with RunNotRunningException, a BaseException, so that a
    # ServerApp's ``except Exception`` cannot swallow the end of its run.
    "geofl.server.flower.errors.GridClosedError": ("RunNotRunningException", "flwr"),
}


def _is_script(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "__main__" or name in SCRIPTS


@dataclass
class _Walk:
    modules: dict[str, ModuleType]
    scripts: list[str]
    #: module -> the missing third-party module that kept it from importing
    skipped: dict[str, str]


def _third_party_import_error(name: str, exc: ImportError) -> str:
    """The missing third-party module behind ``exc``; re-raise if it is one of ours."""
    missing = exc.name or ""
    if not missing or missing.split(".")[0] == "geofl":
        raise AssertionError(f"{name} does not import: {exc!r}") from exc
    return missing


def _walk() -> _Walk:
    walk = _Walk({}, [], {})

    def failed(name: str) -> None:  # a package whose __init__ did not import
        exc = sys.exc_info()[1]
        if not isinstance(exc, ImportError):
            raise AssertionError(f"{name} does not import: {exc!r}") from exc
        walk.skipped[name] = _third_party_import_error(name, exc)

    with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
        warnings.simplefilter("ignore", DeprecationWarning)
        for package_name in PACKAGES:
            package = importlib.import_module(package_name)
            walk.modules[package_name] = package
            infos = pkgutil.walk_packages(package.__path__, package_name + ".", onerror=failed)
            for info in infos:
                if _is_script(info.name):
                    walk.scripts.append(info.name)
                    continue
                try:
                    walk.modules[info.name] = importlib.import_module(info.name)
                except ImportError as exc:
                    walk.skipped[info.name] = _third_party_import_error(info.name, exc)
    return walk


WALK = _walk()


def _exception_classes() -> dict[str, type[BaseException]]:
    """``module.Name`` -> class, for every public exception class defined in geofl."""
    found: dict[str, type[BaseException]] = {}
    for name, module in WALK.modules.items():
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not attr.startswith("_")
            ):
                found[f"{name}.{attr}"] = value
    return found


CLASSES = _exception_classes()


def test_the_walk_finds_the_packages_and_their_errors() -> None:
    assert "geofl.protocols.errors" in WALK.modules
    assert "geofl.storage.errors" in WALK.modules
    assert "geofl.server.transport.servicer" in WALK.modules
    assert "geofl.client.runtime" in WALK.modules
    assert CLASSES["geofl.protocols.errors.GeoflError"] is GeoflError
    assert "geofl.storage.errors.StorageError" in CLASSES


def test_modules_left_out_of_the_walk() -> None:
    """Only for a missing third-party dependency; the skip reason names every one."""
    if WALK.skipped:
        listed = ", ".join(
            f"{module} (needs {dep})" for module, dep in sorted(WALK.skipped.items())
        )
        pytest.skip(f"not imported, optional dependency missing: {listed}")


@pytest.mark.parametrize("name", WALK.scripts)
def test_scripts_left_out_of_the_walk_define_no_classes(name: str) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    classes = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    assert classes == [], f"{name} is not imported by this test but defines {classes}"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_public_exception_derives_from_geofl_error(name: str) -> None:
    cls = CLASSES[name]
    if name in OUTSIDE_BY_DESIGN:
        base, _ = OUTSIDE_BY_DESIGN[name]
        assert not issubclass(cls, Exception), f"{name} must stay a BaseException"
        assert base in [b.__name__ for b in cls.__mro__]
        return
    assert issubclass(cls, GeoflError), f"{name} must derive from GeoflError"


@pytest.mark.parametrize(
    "name", sorted(name for name, cls in CLASSES.items() if issubclass(cls, WireError))
)
def test_every_wire_error_carries_a_catalogued_code(name: str) -> None:
    cls = CLASSES[name]
    assert issubclass(cls, WireError)
    assert isinstance(cls.error_code, ErrorCode)
    error = cls("boom")
    assert error.code is cls.error_code
    assert error.wire_details() == f"GEOFL-{cls.error_code.code}: boom"


def test_a_local_geofl_error_carries_no_wire_code() -> None:
    error = GeoflError("boom")
    assert not isinstance(error, WireError)
    assert not hasattr(error, "code")
    assert not hasattr(error, "wire_details")


def test_error_from_details_returns_wire_errors() -> None:
    for code in ErrorCode:
        error = errors.error_from_details(f"GEOFL-{code.code}: boom")
        assert isinstance(error, WireError)
        assert error.code is code
        assert str(error) == "boom"


@dataclass(frozen=True)
class _Drawn:
    name: str
    module: str
    parent: str | None  # ``module.Name`` of the parent drawn above, None for the root
    also: tuple[str, ...]


_LINE = re.compile(
    r"^(?P<tree>[ │├└─]*)(?P<name>\w+)(?: \(also (?P<also>[\w, ]+)\))? +(?P<module>geofl[\w.]+)$"
)


def _drawing() -> list[_Drawn]:
    """The tree in ``geofl.protocols.errors``'s docstring, parsed line by line."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    drawn: list[_Drawn] = []
    stack: list[tuple[int, str]] = []  # (depth, module.Name) of the open ancestors
    for raw in block.splitlines():
        line = raw[4:]  # the literal block's indent
        match = _LINE.match(line)
        assert match, f"cannot read this line of the drawing: {raw!r}"
        depth = len(match["tree"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        qualified = f"{match['module']}.{match['name']}"
        also = tuple(part.strip() for part in (match["also"] or "").split(",") if part.strip())
        drawn.append(_Drawn(match["name"], match["module"], stack[-1][1] if stack else None, also))
        stack.append((depth, qualified))
    return drawn


DRAWN = _drawing()


def test_the_drawing_names_every_exception_class_and_nothing_else() -> None:
    names = [f"{d.module}.{d.name}" for d in DRAWN]
    assert len(names) == len(set(names)), "a class is drawn twice"
    missing = sorted(set(CLASSES) - set(names) - set(OUTSIDE_BY_DESIGN))
    not_imported = {f"{d.module}.{d.name}" for d in DRAWN if d.module in WALK.skipped}
    extra = sorted(set(names) - set(CLASSES) - not_imported)
    assert not missing, f"add to the tree in geofl/protocols/errors.py: {missing}"
    assert not extra, f"the tree in geofl/protocols/errors.py names unknown classes: {extra}"


@pytest.mark.parametrize("drawn", DRAWN, ids=lambda d: d.name)
def test_the_drawing_shows_each_class_under_its_parent(drawn: _Drawn) -> None:
    if drawn.module in WALK.skipped:
        pytest.skip(f"{drawn.module} not imported: needs {WALK.skipped[drawn.module]}")
    cls = CLASSES.get(f"{drawn.module}.{drawn.name}")
    if cls is None:
        pytest.fail(f"{drawn.module}.{drawn.name} is drawn but does not exist")
    geofl_bases = [base for base in cls.__bases__ if issubclass(base, GeoflError)]
    other_bases = tuple(base.__name__ for base in cls.__bases__ if base not in geofl_bases)
    if drawn.parent is None:
        assert cls is GeoflError
        return
    parents = [f"{base.__module__}.{base.__qualname__}" for base in geofl_bases]
    assert parents == [drawn.parent]
    assert other_bases == drawn.also
