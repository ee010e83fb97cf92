"""The configuration reference: generated page up to date, every key described."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

import geofl.server.config as config_pkg
from geofl.server.config import STRATEGY_CONFIGS, RunConfig
from geofl.server.config.docs import render_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
REGENERATE = "python -m geofl.server.config.docs > docs/configuration.md"


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """``model`` and every model reachable from its fields."""
    from geofl.server.config.messages import _models_in

    found = [model]
    for field in model.model_fields.values():
        for child in _models_in(field.annotation):
            found += [m for m in _models(child) if m not in found]
    return found


ALL_MODELS = _models(RunConfig)


def test_every_strategy_model_is_reachable() -> None:
    assert set(STRATEGY_CONFIGS.values()) <= set(ALL_MODELS)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda model: model.__name__)
def test_every_field_has_a_description(model: type[BaseModel]) -> None:
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert missing == []
    assert model.__doc__ and model.__doc__.strip()


def test_every_key_appears_in_the_reference() -> None:
    page = render_markdown()
    for model in ALL_MODELS:
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in page, name
            assert str(field.description).replace("|", "\\|") in page, name


def test_committed_reference_is_up_to_date() -> None:
    assert DOC.is_file(), f"missing {DOC}; run: {REGENERATE}"
    assert DOC.read_text(encoding="utf-8") == render_markdown(), f"stale; run: {REGENERATE}"


def test_module_entry_point_prints_the_reference() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "geofl.server.config.docs"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout == render_markdown()


def test_all_names_are_exported() -> None:
    for name in config_pkg.__all__:
        assert hasattr(config_pkg, name), name
    public = {
        name
        for name, value in vars(config_pkg).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("geofl.server.config.")
    }
    assert public <= set(config_pkg.__all__)
