"""Regional relays on the virtual clock, and nodes of regions the run does not serve.

The expectations are computed here, independently of the simulator: models from the test
app's rule (client ``i`` adds ``1 + i`` to every float weight and reports 100 examples),
durations from the link model (:class:`LinkModel`, :func:`transfer_time_s`) and the
bytes of the initial model's broadcast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from geofl.client.app import load_client_app
from geofl.client.runtime import ClientOptions, ClientRuntime
from geofl.protocols import streams
from geofl.protocols.errors import ErrorCode, GeoflError
from geofl.protocols.tensors import model_bytes, spec_of
from geofl.server.config import RunConfig
from geofl.server.models.loading import load_initial_weights
from geofl.server.simulation.links import LinkModel, transfer_time_s
from geofl.server.simulation.relays import regional_cohorts
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import CheckpointRecord, CheckpointStore, open_database
from geofl.storage.models import Checkpoint, Node, Participation
from tests.integration.conftest import STORED_DURATION_ABS, link_model, run_config, run_rows

# Two near clients and six far ones (of 8): example weighting and plain averaging of the
# two regional models give different global models.
UNEVEN = {
    "near": {"share": 0.25, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "far": {"share": 0.75, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}
THREE = {
    "near": {"share": 0.25, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "mid": {"share": 0.25, "rtt_ms": 80, "up_mbps": 2, "down_mbps": 10},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}
SPEED = 1000.0  # samples per second; each client trains on 100 examples
EXAMPLES = 100  # what every virtual_app client reports


def _relayed(tmp_path: Path, **overrides: Any) -> RunConfig:
    """Eight virtual clients behind one simulated relay per region of ``UNEVEN``."""
    simulation: dict[str, Any] = {
        "clients": 8,
        "app": "geofl_testapp:virtual_app",
        "clock": "virtual",
        "workers": 0,
        "relays": True,
        "regions": UNEVEN,
        "compute": {"samples_per_s": SPEED},
    }
    simulation.update(overrides.pop("simulation", {}))
    sections: dict[str, Any] = {
        "run": {"name": "itest", "rounds": 1, "seed": 1},
        "strategy": {"name": "fedavg", "clients_per_round": 2, "min_clients": 2},
        "schedule": {"deadline_s": 600, "wait_for_clients_s": 5},
        "evaluation": {"every": 0, "server": "geofl_testapp:server_evaluate"},
        "simulation": simulation,
    }
    sections.update(overrides)
    return run_config(tmp_path, **sections)


def _checkpoints(config: RunConfig) -> dict[int, dict[str, np.ndarray]]:
    """The global model saved after each round, by round number."""
    db = open_database(config.storage.url)
    try:
        with db.session() as session:
            records = {
                row.round: CheckpointRecord.from_row(row)
                for row in session.scalars(select(Checkpoint).order_by(Checkpoint.round))
            }
    finally:
        db.close()
    store = CheckpointStore(Path(config.storage.checkpoints))
    return {number: dict(store.load(record)[0]) for number, record in records.items()}


def _initial_bytes(config: RunConfig) -> tuple[int, int]:
    """(wire bytes of the initial model's full broadcast, its raw tensor bytes)."""
    initial = load_initial_weights(config.model)
    chunks = streams.encode_chunks(initial, config.server.chunk_bytes)
    return sum(len(chunk) for chunk in chunks), model_bytes(spec_of(initial))


def _mean_shift(links: LinkModel, region: str) -> float:
    """One regional FedAvg step of the test app: the mean of ``1 + i`` over the region."""
    return float(np.mean([1 + client for client in links.clients_in(region)]))


def _fits(pairs: list[tuple[Participation, Node]]) -> dict[str, Participation]:
    return {node.name: p for p, node in pairs if p.kind == "fit"}


# ---------------------------------------------------------------- aggregation


def test_one_local_round_is_exactly_flat_fedavg(tmp_path: Path) -> None:
    config = _relayed(tmp_path, run={"name": "itest", "rounds": 2, "seed": 1})
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    links = link_model(config)
    counts = links.region_counts()
    assert counts == {"near": 2, "far": 6}
    # The test has power: averaging the regions' models without weights would differ.
    plain = (_mean_shift(links, "near") + _mean_shift(links, "far")) / 2
    assert plain != pytest.approx(4.5)
    # Flat FedAvg over all 8 clients, equal examples: + mean(1..8) = 4.5 a round.
    models = _checkpoints(config)
    assert sorted(models) == [1, 2]
    for number, weights in models.items():
        assert np.array_equal(weights["w"], np.full((4, 3), 4.5 * number, np.float32))
        assert np.array_equal(weights["b"], np.full(3, 4.5 * number, np.float32))
        assert int(weights["steps"]) == number
    _, rounds, pairs = run_rows(config)
    assert [r.status for r in rounds] == ["committed", "committed"]
    assert {node.name for _, node in pairs} == {"relay-near", "relay-far"}
    fits = [(p, node) for p, node in pairs if p.kind == "fit"]
    assert len(fits) == 4
    for participation, node in fits:
        region = node.name.removeprefix("relay-")
        assert node.region == region
        assert participation.status == "ok"
        assert participation.num_examples == EXAMPLES * counts[region]
        assert participation.metrics["relay_clients"] == counts[region]
        assert participation.metrics["relay_rounds"] == 1
        # The region's train loss: the test app reports its shift, averaged over the region.
        assert participation.metrics["train_loss"] == pytest.approx(_mean_shift(links, region))


def test_hierfavg_runs_two_regional_steps_then_weights_the_regions(tmp_path: Path) -> None:
    local = {"relay": {"local_rounds": 2}}
    # One relay a round: the global model is then that region's model itself.
    alone = _relayed(
        tmp_path / "alone",
        strategy={"name": "fedavg", "clients_per_round": 1, "min_clients": 1},
        simulation=local,
    )
    both = _relayed(tmp_path / "both", simulation=local)
    run_virtual_simulation(alone)
    run_virtual_simulation(both)
    links = link_model(both)
    counts = links.region_counts()
    # Two regional FedAvg steps from the same model: twice the region's mean shift.
    expected = {region: 2 * _mean_shift(links, region) for region in counts}

    (chosen,) = [name.removeprefix("relay-") for name in _fits(run_rows(alone)[2])]
    alone_model = _checkpoints(alone)[1]
    assert np.allclose(alone_model["w"], expected[chosen])
    assert int(alone_model["steps"]) == 2  # the int tensor: +1 in each regional round

    # The global model is the example-weighted mean of the regional models; with the
    # chosen region's model known, it pins the other region's model too.
    other = next(region for region in counts if region != chosen)
    global_model = _checkpoints(both)[1]["w"]
    other_model = (8 * global_model - counts[chosen] * expected[chosen]) / counts[other]
    assert np.allclose(other_model, expected[other], atol=1e-4)
    weighted = sum(counts[r] * expected[r] for r in counts) / sum(counts.values())
    assert np.allclose(global_model, weighted)
    for name, participation in _fits(run_rows(both)[2]).items():
        region = name.removeprefix("relay-")
        assert participation.metrics["relay_rounds"] == 2
        assert participation.metrics["relay_clients"] == counts[region]
        # Each contributing client's examples count once, not once per regional round.
        assert participation.num_examples == EXAMPLES * counts[region]


# ---------------------------------------------------------------- timing


def test_a_relays_fit_lasts_wan_down_regional_round_wan_up(tmp_path: Path) -> None:
    relay_rtt_ms, relay_mbps = 30.0, 50.0
    config = _relayed(
        tmp_path,
        simulation={
            "relay": {"rtt_ms": relay_rtt_ms, "mbps": relay_mbps},
            # Clients differ, so the regional round lasts as long as its slowest one.
            "heterogeneity": {
                "compute": {"uniform": {"low": 0.2, "high": 2.0}},
                "bandwidth": {"uniform": {"low": 0.2, "high": 2.0}},
            },
        },
    )
    run_virtual_simulation(config)
    broadcast, raw = _initial_bytes(config)
    links = link_model(config)
    fits = _fits(run_rows(config)[2])
    assert set(fits) == {"relay-near", "relay-far"}
    for name, participation in fits.items():
        region = config.simulation.regions[name.removeprefix("relay-")]
        assert participation.status == "ok"
        assert participation.bytes_down == broadcast
        assert participation.bytes_up == participation.bytes_up_raw == raw
        wan_s = region.rtt_ms / 1000
        # A fetch pays the task's notice and the request (one rtt) before the model's trip.
        wan_down = wan_s + transfer_time_s(broadcast, relay_mbps * 1e6, wan_s)
        wan_up = transfer_time_s(raw, relay_mbps * 1e6, wan_s)
        per_client = [
            relay_rtt_ms / 1000
            + transfer_time_s(broadcast, link.down_bps, relay_rtt_ms / 1000)
            + EXAMPLES / link.samples_per_s
            + transfer_time_s(raw, link.up_bps, relay_rtt_ms / 1000)
            for link in links.links
            if link.region == name.removeprefix("relay-")
        ]
        assert len(set(per_client)) == len(per_client)  # the slowest one matters
        expected = wan_down + max(per_client) + wan_up
        assert participation.duration_s == pytest.approx(expected, abs=STORED_DURATION_ABS)


def test_a_deadline_without_time_for_regional_rounds_fails_each_relay(tmp_path: Path) -> None:
    # Both relays' downloads (the task's notice and request, 0.1 s at 100 ms RTT, then the
    # model's 0.05 s trip) end before the deadline, but too little is left after them for
    # the upload (0.05 s), let alone a regional round.
    rtt_ms, deadline_s = 100.0, 0.18
    regions = {name: {**model, "rtt_ms": rtt_ms} for name, model in UNEVEN.items()}
    config = _relayed(
        tmp_path,
        run={"name": "itest", "rounds": 2, "seed": 1},
        schedule={"deadline_s": deadline_s, "wait_for_clients_s": 5},
        simulation={"regions": regions},
    )
    outcome = run_virtual_simulation(config)
    run, rounds, pairs = run_rows(config)
    # What the code records: every round failed, so did the run, no model saved.
    assert outcome.result.status == "failed"
    assert outcome.result.error == "no round committed (every round failed)"
    assert run.status == "failed"
    assert [r.status for r in rounds] == ["failed", "failed"]
    assert _checkpoints(config) == {}
    broadcast, _ = _initial_bytes(config)
    wan_s = rtt_ms / 1000
    download_s = wan_s + transfer_time_s(broadcast, config.simulation.relay.mbps * 1e6, wan_s)
    assert download_s < deadline_s < download_s + wan_s / 2
    fits = [(p, node) for p, node in pairs if p.kind == "fit"]
    assert sorted(node.name for _, node in fits) == ["relay-far"] * 2 + ["relay-near"] * 2
    for participation, node in fits:
        reason = participation.reason or ""
        assert participation.status == "failed"
        assert reason.startswith(f"region {node.region}: ")
        assert reason.endswith("no time for regional rounds")
        assert participation.num_examples == 0 and participation.bytes_up == 0
        assert participation.duration_s == pytest.approx(download_s, abs=STORED_DURATION_ABS)
    # A round ends when its last relay has given up: no hang, no wait for the deadline.
    durations = [r.duration_s for r in rounds]
    assert durations == pytest.approx([download_s] * 2, abs=STORED_DURATION_ABS)


# ---------------------------------------------------------------- cohorts


def test_regional_cohorts_split_by_client_counts() -> None:
    counts = {"near": 25, "mid": 25, "far": 50}
    assert regional_cohorts(counts, 20, 1) == {"near": 5, "mid": 5, "far": 10}
    assert regional_cohorts(counts, None, 1) == counts
    # Largest remainder: 7 * (0.25, 0.25, 0.5) = (1.75, 1.75, 3.5) -> (2, 2, 3).
    assert regional_cohorts(counts, 7, 1) == {"near": 2, "mid": 2, "far": 3}
    # A region never gets more than its clients, nor fewer than min_clients it has.
    assert regional_cohorts({"a": 2, "b": 98}, 10, 3)["a"] == 2
    assert regional_cohorts({"a": 10, "b": 90}, 10, 2)["a"] == 2
    assert regional_cohorts({"a": 0, "b": 10}, 5, 1) == {"a": 0, "b": 5}
    # Raising a small region to min_clients takes the client from the others.
    assert regional_cohorts({"a": 1, "b": 4}, 2, 1) == {"a": 1, "b": 1}
    assert sum(regional_cohorts({"a": 1, "b": 100}, 50, 1).values()) == 50


@st.composite
def _split_inputs(draw: st.DrawFn) -> tuple[dict[str, int], int, int]:
    sizes = draw(st.lists(st.integers(0, 200), min_size=1, max_size=6))
    if sum(sizes) == 0:
        sizes[0] = 1
    counts = {f"r{index}": size for index, size in enumerate(sizes)}
    cohort = draw(st.integers(1, sum(sizes)))
    return counts, cohort, draw(st.integers(1, 5))


@given(_split_inputs())
def test_regional_cohorts_are_proportional_and_bounded(
    inputs: tuple[dict[str, int], int, int],
) -> None:
    counts, cohort, min_clients = inputs
    shares = regional_cohorts(counts, cohort, min_clients)
    total = sum(counts.values())
    assert shares.keys() == counts.keys()
    for name, share in shares.items():
        assert min(min_clients, counts[name]) <= share <= counts[name]
    # The sum is the cohort whenever the bounds allow it.
    floor = sum(min(min_clients, count) for count in counts.values())
    assert sum(shares.values()) == max(cohort, floor)
    # Where no region's proportional share is below min_clients, the split is the
    # largest-remainder rounding: each region within 1 of its share.
    exact = {name: cohort * count / total for name, count in counts.items()}
    if all(value >= min_clients for value in exact.values()):
        assert all(abs(shares[name] - exact[name]) < 1 for name in counts)


def test_each_relay_selects_its_share_of_the_cohort(tmp_path: Path) -> None:
    config = _relayed(
        tmp_path,
        strategy={"name": "fedavg", "clients_per_round": 3, "min_clients": 3},
        simulation={"clients": 40, "regions": THREE, "relay": {"cohort": 8}},
    )
    run_virtual_simulation(config)
    assert link_model(config).region_counts() == {"near": 10, "mid": 10, "far": 20}
    fits = _fits(run_rows(config)[2])
    expected = {"near": 2, "mid": 2, "far": 4}
    assert {name: p.metrics["relay_clients"] for name, p in fits.items()} == {
        f"relay-{region}": share for region, share in expected.items()
    }
    for name, participation in fits.items():
        assert participation.num_examples == EXAMPLES * expected[name.removeprefix("relay-")]


def test_a_region_without_clients_fails_its_relay_with_a_clear_reason(tmp_path: Path) -> None:
    """Two clients over three regions: one region gets none, its relay says so."""
    config = _relayed(
        tmp_path,
        strategy={"name": "fedavg", "clients_per_round": 3, "min_clients": 2},
        simulation={"clients": 2, "regions": THREE},
    )
    counts = link_model(config).region_counts()
    empty = [name for name, count in counts.items() if count == 0]
    assert len(empty) == 1
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    fits = _fits(run_rows(config)[2])
    assert fits[f"relay-{empty[0]}"].status == "failed"
    reason = fits[f"relay-{empty[0]}"].reason or ""
    assert f"region {empty[0]}: has no simulated clients" in reason
    assert {p.status for name, p in fits.items() if name != f"relay-{empty[0]}"} == {"ok"}


# ---------------------------------------------------------------- server.regions


def test_a_node_of_a_region_the_run_does_not_serve_is_refused(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"name": "itest", "rounds": 1, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 1, "min_clients": 1},
        evaluation={"every": 0, "server": "geofl_testapp:server_evaluate"},
        server={"regions": ["near"]},
    )
    assert config.server.regions == ["near"]
    server = serve(config)
    stranger = ClientRuntime(
        ClientOptions(
            server=f"127.0.0.1:{server.port}",
            node_name="node-moon",
            region="moon",
            reconnect_for_s=2,
        ),
        load_client_app("geofl_testapp:client_app"),
    )
    with pytest.raises(GeoflError) as refused:
        stranger.run()
    assert refused.value.code is ErrorCode.UNKNOWN_REGION
    assert "'moon'" in str(refused.value) and "['near']" in str(refused.value)
    server.add_client(0, region="near")
    assert server.wait().status == "completed"
    _, rounds, pairs = run_rows(config)
    assert [r.status for r in rounds] == ["committed"]
    assert {(node.name, node.region) for _, node in pairs} == {("node-0", "near")}
    db = open_database(config.storage.url)
    try:
        with db.session() as session:
            assert list(session.scalars(select(Node.name))) == ["node-0"]
    finally:
        db.close()


def test_relays_pass_evaluation_on_to_their_clients(tmp_path: Path) -> None:
    """Federated evaluation through relays: each relay reports its clients' weighted mean."""
    config = _relayed(
        tmp_path,
        evaluation={"every": 1, "clients": 2, "server": "geofl_testapp:server_evaluate"},
    )
    assert run_virtual_simulation(config).result.status == "completed"
    counts = link_model(config).region_counts()
    evaluations = {node.name: p for p, node in run_rows(config)[2] if p.kind == "evaluate"}
    assert set(evaluations) == {"relay-near", "relay-far"}
    for name, participation in evaluations.items():
        assert participation.status == "ok"
        region = name.removeprefix("relay-")
        # virtual_app evaluates to loss mean(|b|) on 1 example per client: after one round
        # of flat FedAvg b = 4.5 everywhere, the same for every client.
        assert participation.num_examples == counts[region]
        assert participation.loss == pytest.approx(4.5)
        assert participation.metrics["relay_clients"] == counts[region]


def test_relays_stay_online_for_longer_than_the_heartbeat_patience(tmp_path: Path) -> None:
    """Simulated relays send no heartbeats: the reaper must not take them offline."""
    config = _relayed(
        tmp_path,
        run={"name": "itest", "rounds": 4, "seed": 1},
        server={"heartbeat_interval_s": 0.1},
    )
    outcome = run_virtual_simulation(config)
    assert outcome.simulated_s > 10 * 0.1  # far past three missed heartbeats
    assert outcome.result.status == "completed"
    assert [r.status for r in run_rows(config)[1]] == ["committed"] * 4


@pytest.mark.parametrize("workers", [0, 2])
def test_each_region_trains_from_its_own_regional_model(tmp_path: Path, workers: int) -> None:
    """Regions number their local versions alike; a shared backend must not mix them up.

    ``toward_app`` moves every weight half-way to ``1 + partition-id``, so a client that
    trained from the other region's model would change the result.
    """
    config = _relayed(
        tmp_path,
        strategy={"name": "fedavg", "clients_per_round": 2, "min_clients": 2},
        simulation={
            "app": "geofl_testapp:toward_app",
            "workers": workers,
            "relay": {"local_rounds": 3},
        },
    )
    assert run_virtual_simulation(config).result.status == "completed"
    links = link_model(config)
    regional: dict[str, float] = {}
    for region in ("near", "far"):
        targets = [1.0 + link.client for link in links.links if link.region == region]
        value = 0.0
        for _ in range(3):  # equal examples: FedAvg is the plain mean of the clients' moves
            value = float(np.mean([value + (t - value) / 2 for t in targets]))
        regional[region] = value
    counts = links.region_counts()
    expected = sum(regional[r] * counts[r] for r in regional) / sum(counts.values())
    np.testing.assert_allclose(_checkpoints(config)[1]["b"], expected, rtol=1e-6)
