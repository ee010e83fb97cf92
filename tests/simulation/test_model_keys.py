"""Model versions cached by workers: each fleet's versions are retired on their own."""

from __future__ import annotations

from geofl.server.simulation.workers import ModelKey, superseded


def test_only_the_added_fleets_old_versions_are_superseded() -> None:
    cached: list[ModelKey] = [("", 1, ()), ("", 2, ()), ("relay-far", 1, ()), ("relay-far", 2, ())]
    # The main fleet reaches version 3: its version 1 goes, the region's stay.
    assert superseded(cached, ("", 3, ())) == [("", 1, ())]
    # A region's version 4 retires that region's 1 and 2 only.
    assert superseded(cached, ("relay-far", 4, ())) == [("relay-far", 1, ()), ("relay-far", 2, ())]
    # An older version arriving late retires nothing newer.
    assert superseded(cached, ("", 1, ())) == []
