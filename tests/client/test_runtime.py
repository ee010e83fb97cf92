"""The client runtime's reconnection policy and node-config parsing."""

from __future__ import annotations

import random

import pytest

from geofl.client.cli import parse_node_config, parse_value
from geofl.client.runtime import Backoff, GaveUpError


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("geofl.client.runtime.time.monotonic", fake.monotonic)
    monkeypatch.setattr("geofl.client.runtime.time.sleep", fake.sleep)
    return fake


def test_backoff_is_jittered_exponential_and_capped(clock: FakeClock) -> None:
    backoff = Backoff(base=0.5, cap=4.0, budget=1e9, rng=random.Random(1))
    for _ in range(12):
        backoff.wait("down")
    caps = [min(4.0, 0.5 * 2**i) for i in range(12)]
    assert all(0 <= s <= c for s, c in zip(clock.sleeps, caps, strict=True))
    assert len(set(clock.sleeps)) == len(clock.sleeps)  # jittered, not a fixed schedule
    assert max(clock.sleeps[6:]) > 2.0  # grew towards the cap


def test_backoff_gives_up_after_its_budget_and_resets(clock: FakeClock) -> None:
    backoff = Backoff(base=1.0, cap=2.0, budget=10.0, rng=random.Random(2))
    with pytest.raises(GaveUpError, match="unreachable"):
        for _ in range(1000):
            backoff.wait("connection refused")
    assert clock.now >= 10.0
    backoff.reset()
    backoff.wait("again")  # a fresh budget after a successful connection


def test_node_config_parsing_follows_flower() -> None:
    assert parse_node_config(["partition-id=0 num-partitions=4", "name=a", "lr=0.5", "x=true"]) == {
        "partition-id": 0,
        "num-partitions": 4,
        "name": "a",
        "lr": 0.5,
        "x": True,
    }
    assert parse_value("1e-3") == 0.001 and parse_value("abc") == "abc"
    with pytest.raises(ValueError, match="not key=value"):
        parse_node_config(["oops"])
