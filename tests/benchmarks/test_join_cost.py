"""The join-cost benchmark runs each server mode end to end (a few joins each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.join_cost import measure


@pytest.mark.parametrize("mode", ["none", "keys", "mtls"])
def test_each_mode_joins_on_one_and_on_new_connections(tmp_path: Path, mode: str) -> None:
    figures = measure(mode, tmp_path, joins=3, fresh=2)
    assert figures["mode"] == mode
    for kind in ("same_connection", "new_connection"):
        assert figures[kind]["ms_per_join"] > 0 and figures[kind]["joins_per_s"] > 0
