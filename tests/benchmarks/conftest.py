"""Make the repository's ``benchmarks`` package importable for these tests.

Under ``python -m pytest`` the repository root is already importable; under plain
``pytest`` it is not, and putting the root on ``sys.path`` would let other tests import
bare folder names. So the package is registered by its path, before the test modules
(which import it at module level) are collected.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


def _register_benchmarks() -> None:
    if importlib.util.find_spec("benchmarks") is not None:
        return
    spec = importlib.util.spec_from_file_location(
        "benchmarks",
        _ROOT / "benchmarks" / "__init__.py",
        submodule_search_locations=[str(_ROOT / "benchmarks")],
    )
    if spec is None or spec.loader is None:
        raise ImportError("cannot locate the benchmarks package")
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    spec.loader.exec_module(module)


_register_benchmarks()


def import_fashion_example() -> None:
    """Import the example task as ``geofl`` does, with the repository root on ``sys.path``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(_ROOT))
        importlib.import_module("examples.fashion_mnist.task")
