"""Each package's curated ``__all__`` names only what exists, and is complete."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = [
    "geofl.protocols.errors",
    "geofl.storage",
    "geofl.server.strategies",
    "geofl.server.config",
    "geofl.server.rounds",
    "geofl.client",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ lists missing {item}"


def test_client_package_imports_without_server_dependencies() -> None:
    """A client-only machine has no SQLAlchemy, no server code and maybe no torch."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('sqlalchemy', 'alembic', 'torch') or "
        "name.startswith('geofl.server') or name.startswith('geofl.storage'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import geofl.client, geofl.client.runtime, geofl.client.cli\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
