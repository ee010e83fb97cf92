"""Streaming DiLoCo on the server: the configuration, and the outer step per fragment."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from geofl.client.app import Client
from geofl.client.partial_sync import GroupUpdate
from geofl.client.streaming import StreamingState, fit_streaming
from geofl.protocols import serde, streams
from geofl.protocols.codecs import Chain, parse_chain
from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Config, Metrics, Weights, WeightsView
from geofl.server.config import ConfigError, parse_config
from geofl.server.coordinator import build_strategy
from geofl.server.models.store import ModelStore
from geofl.server.nodes.fragments import pad_to_model
from geofl.server.rounds.records import round_config
from geofl.server.scheduling.streaming import FragmentSchedule
from geofl.server.simulation.fleet import upload_timeline
from geofl.server.simulation.links import ClientLink
from geofl.server.strategies.diloco import DiLoCo

BASE = {"run": {"name": "s", "rounds": 4}, "model": "m:f"}


def _schedule(**streaming: Any) -> dict[str, Any]:
    return {
        "mode": "diloco",
        "diloco": {"local_steps": 12},
        "streaming": {"fragments": 3, "overlap_steps": 1, **streaming},
    }


# ---------------------------------------------------------------- configuration


def test_schedule_streaming_builds_the_fragment_schedule() -> None:
    config = parse_config({**BASE, "schedule": _schedule(mixing_alpha=0.3)}, source="t")
    strategy = build_strategy(config)
    assert isinstance(strategy, DiLoCo) and strategy.streaming is not None
    schedule = strategy.streaming
    assert (schedule.fragments, schedule.stride, schedule.overlap) == (3, 4, 1)
    assert schedule.alpha == 0.3
    assert round_config(config)["local_steps"] == 12  # H; each round's config says H / P


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"schedule": _schedule() | {"mode": "sync"}}, r"streaming needs schedule\.mode diloco"),
        ({"schedule": _schedule(fragments=5)}, r"fragments 5 must divide the local steps H = 12"),
        ({"schedule": _schedule(overlap_steps=4)}, r"overlap_steps 4 must be less than the 4"),
        (
            {"schedule": _schedule() | {"partial_sync": {"sync_points": 2}}},
            r"cannot be combined with schedule\.partial_sync",
        ),
        ({"schedule": _schedule(mixing_alpha=1.5)}, r"mixing_alpha"),
        ({"schedule": _schedule(overlap_steps=-1)}, r"overlap_steps"),
        (
            {"schedule": _schedule(groups=[["a*"], ["b*"]])},
            r"fragments 3 but 2 groups are given",
        ),
        ({"schedule": _schedule(groups=[["a*"], []])}, r"non-empty lists"),
        (
            {"schedule": _schedule(), "round_config": {"local_steps": 10}},
            r"must divide the local steps H = 10",
        ),
        (
            {"schedule": _schedule(), "secure_aggregation": {"enabled": True}},
            r"cannot be combined with secure_aggregation",
        ),
    ],
)
def test_bad_combinations_are_refused_with_the_reason(
    sections: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, **sections}, source="t")


# ---------------------------------------------------------------- the outer step


def test_only_the_rounds_fragment_steps_and_keeps_its_own_momentum() -> None:
    schedule = FragmentSchedule(2, stride=2, overlap=1, alpha=0.5, patterns=[["a"], ["b"]])
    strategy = DiLoCo(outer_lr=0.7, outer_momentum=0.9, streaming=schedule)
    reference = DiLoCo(outer_lr=0.7, outer_momentum=0.9)  # one optimizer per fragment
    weights = {"a": np.zeros(3), "b": np.ones(2)}
    ref_a = {"a": np.zeros(3)}
    rng = np.random.default_rng(3)
    for server_round in range(1, 7):
        name = "a" if server_round % 2 else "b"
        delta = rng.standard_normal(weights[name].shape)
        padded = pad_to_model({name: delta}, spec_of(weights))
        before = {k: v.copy() for k, v in weights.items()}
        weights = strategy.apply(weights, dict(padded), server_round)
        other = "b" if name == "a" else "a"
        np.testing.assert_array_equal(weights[other], before[other])  # untouched
        if name == "a":
            ref_a = reference.apply(ref_a, {"a": delta}, server_round)
            np.testing.assert_allclose(weights["a"], ref_a["a"], atol=1e-12)
    assert set(strategy.state()) == {"momentum/a", "momentum/b"}


class Toward(Client):
    """Moves every tensor a third of the way to ``target`` per step (depends on the start)."""

    def __init__(self, target: float) -> None:
        self.target = target

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        out = dict(parameters)
        for _ in range(int(config["local_steps"])):  # type: ignore[arg-type]
            out = {k: v + (self.target - v) / 3 for k, v in out.items()}
        return out, 10, {}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        return 0.0, 1, {}


def test_one_fragment_no_overlap_no_mixing_is_numerically_plain_diloco() -> None:
    clients = [Toward(1.0), Toward(-2.0), Toward(4.0)]
    start = {"w": np.linspace(-1, 1, 5), "v": np.full(2, 0.5)}
    plain = DiLoCo(outer_lr=0.7, outer_momentum=0.9)
    stream = DiLoCo(
        outer_lr=0.7,
        outer_momentum=0.9,
        streaming=FragmentSchedule(1, stride=3, overlap=0, alpha=0.0),
    )
    states = [StreamingState() for _ in clients]
    w_plain, w_stream = dict(start), dict(start)
    for server_round in range(1, 5):
        plain.begin_round(w_plain)
        deltas = []
        for client in clients:
            new, _, _ = client.fit(w_plain, {"local_steps": 3})
            deltas.append({k: new[k] - w_plain[k] for k in w_plain})
        mean = {k: sum(d[k] for d in deltas) / len(deltas) for k in w_plain}
        w_plain = plain.apply(w_plain, mean, server_round)

        stream.begin_round(w_stream)
        config = stream.configure_fit(server_round, {"local_steps": 12})
        sent: list[GroupUpdate] = []
        for client, state in zip(clients, states, strict=True):
            fit_streaming(
                client,
                w_stream,
                config,
                lambda _, update, into=sent: into.append(update),
                state,
                run_id=1,
                server_round=server_round,
            )
        mean = {k: sum(u[k] for u in sent) / len(sent) for k in w_stream}
        w_stream = stream.apply(w_stream, mean, server_round)
    for name in start:
        np.testing.assert_array_equal(w_stream[name], w_plain[name])


# ---------------------------------------------------------------- the clock


def test_the_fragments_sending_overlaps_the_overlap_steps_training() -> None:
    link = ClientLink(0, "r", 0.1, 8000.0, 8e6, 0.0, 0.0, 100.0)  # rtt 0.1 s, 8 kbit/s up
    # 30 samples before the send (0.3 s), 10 while it travels (0.1 s); 100 bytes = 0.1 s.
    overlapped = upload_timeline(link, [(30, 100), (10, 0)])
    (start, end), _ = overlapped.sending
    assert overlapped.compute_s == pytest.approx(0.4)
    assert start == pytest.approx(0.3) and end == pytest.approx(0.4)
    assert start < overlapped.compute_s  # the uplink is busy while training goes on
    assert overlapped.hidden_s == pytest.approx(0.1)
    assert overlapped.exposed_upload_s == pytest.approx(0.05)  # only the propagation left
    after = upload_timeline(link, [(40, 100)])
    assert after.hidden_s == 0
    assert after.exposed_upload_s == pytest.approx(0.15)


# ---------------------------------------------------------------- downloads


def _two_versions(store: ModelStore) -> tuple[Weights, Weights]:
    first = {"a": np.zeros(1000, np.float32), "b": np.ones(1000, np.float32)}
    second = {"a": np.full(1000, 0.5, np.float32), "b": first["b"].copy()}  # only a changed
    store.put(0, first)
    store.put(1, second)
    return first, second


@pytest.mark.parametrize("chain", [(), parse_chain([{"qsgd": {"bits": 4}}])])
def test_a_client_holding_the_last_version_downloads_only_what_changed(chain: Chain) -> None:
    store = ModelStore(tracks=(chain,), changed_only=True)
    _, second = _two_versions(store)
    held = store.view(0, chain)
    assert held is not None
    update = asyncio.run(store.broadcast(1, chain, base=0))
    whole = asyncio.run(store.broadcast(1, chain, base=None))
    assert update is not None and whole is not None
    assert update.wire_bytes < 0.6 * whole.wire_bytes  # tensor b was not sent again
    sink = streams.ArraySink(held)
    assembler = streams.Assembler(sink, max_total_bytes=10**6)
    for raw in update.chunks:
        assembler.feed(*serde.decode_chunk_view(raw))
    assembler.finish()
    assert set(sink.weights) == {"a"}
    view = store.view(1, chain)
    assert view is not None
    np.testing.assert_array_equal(view["b"], held["b"])  # the client keeps its b
    np.testing.assert_allclose(sink.weights["a"], view["a"])
    np.testing.assert_allclose(view["a"], second["a"], atol=0.1)


def test_without_changed_only_the_uncompressed_download_is_the_whole_model() -> None:
    store = ModelStore()
    _two_versions(store)
    update = asyncio.run(store.broadcast(1, (), base=0))
    assert update is not None and not update.difference
