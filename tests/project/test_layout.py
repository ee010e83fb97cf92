"""The package layout: folders <-> installed packages, and imports pointing one way."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = {
    "protocols": "geofl.protocols",
    "storage": "geofl.storage",
    "server": "geofl.server",
    "client": "geofl.client",
}
# Which of our top-level packages each may import (architecture §1).
ALLOWED = {
    "geofl.protocols": set(),
    "geofl.storage": {"geofl.protocols"},
    "geofl.server": {"geofl.protocols", "geofl.storage"},
    "geofl.client": {"geofl.protocols"},
}
# Composition roots that may also import the client.
CLIENT_IMPORTERS = ("geofl.server.cli", "geofl.server.simulation", "geofl.server.relay")


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts[0] = TOP[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_folders() -> set[str]:
    found = set()
    for folder, package in TOP.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(_module_of(init))
        found.add(package)
    return found


def test_declared_packages_match_folders() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = set(config["tool"]["setuptools"]["packages"])
    assert declared == _package_folders()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _sources() -> list[Path]:
    return [p for folder in TOP for p in (ROOT / folder).rglob("*.py")]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_one_way(path: Path) -> None:
    module = _module_of(path)
    own = next(pkg for pkg in ALLOWED if module == pkg or module.startswith(pkg + "."))
    for name in _imports(path):
        top = name.split(".")[0]
        assert top not in TOP, f"{module} imports the bare folder name {name!r}"
        target = next((p for p in ALLOWED if name == p or name.startswith(p + ".")), None)
        if target is None or target == own:
            continue
        if target == "geofl.client" and module.startswith(CLIENT_IMPORTERS):
            continue
        assert target in ALLOWED[own], f"{module} must not import {name}"


def test_import_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from geofl.server.rounds.sync import RoundEngine\n")
    assert "geofl.server.rounds.sync" in _imports(bad)
    assert "geofl.server" not in ALLOWED["geofl.client"]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_only_the_command_line_imports_the_command_line() -> None:
    """``geofl.server.cli`` is the top of the server: nothing below imports it back."""
    offenders = [
        f"{_module_of(path)} imports {name}"
        for path in _sources()
        if not _in(_module_of(path), "geofl.server.cli")
        for name in _imports(path)
        if _in(name, "geofl.server.cli")
    ]
    assert offenders == []
