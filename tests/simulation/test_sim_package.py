"""The package's public surface: every exported name resolves, lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

import geofl.server.simulation as simulation


def test_all_names_exist() -> None:
    exported = simulation.__all__
    assert len(exported) == len(set(exported))
    for name in exported:
        assert getattr(simulation, name) is not None, name


def test_importing_the_package_loads_no_submodule() -> None:
    code = (
        "import sys, geofl.server.simulation as s\n"
        "loaded = [m for m in sys.modules if m.startswith('geofl.server.simulation.')]\n"
        "assert loaded == [], loaded\n"
        "s.LinkModel\n"
        "assert 'geofl.server.simulation.links' in sys.modules\n"
        "assert 'geofl.server.simulation.fedscale' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        getattr(simulation, "NoSuchThing")  # noqa: B009
