"""Streaming DiLoCo end to end: over gRPC on loopback, and on the virtual clock.

The test app's ``step_app`` adds ``rate x steps`` to every float tensor (``rate`` = 1 +
partition id; integers get ``+ steps``) and reports ``10 x steps`` examples, so the
fragments' pseudo-gradients and the model the server builds from them are known exactly.
With H = 4 and P = 2 a round trains 2 steps; tau = 1 sends the fragment after the first.
The planned fragments of ``geofl_testapp:make_model`` (w 48 bytes, b 12, steps 8) are
[w] and [b, steps]. Outer lr 1 and no momentum: the outer step adds the mean delta.

Worked through for a client of rate c (mean rate m over the clients, alpha 0.5):

* round 1 syncs [w]: from zeros, 1 step (w = b = c, steps 1), send dw = c, 1 more step
  (w = b = 2c, steps 2); the server's w becomes m.
* round 2 syncs [b, steps] and first merges w: w = 0.5 x 2c + 0.5 x m; 1 step
  (b = 3c, steps 3), send db = 3c and dsteps = 3; the server's b becomes 3m, steps 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from geofl.server.config import ConfigError, RunConfig
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import open_database, queries
from geofl.storage.models import Node, Participation, Round
from tests.integration.conftest import final_weights, run_config

APP = "geofl_testapp:step_app"
FRAGMENT_BYTES = {1: 4 * 3 * 4, 2: 3 * 4 + 8}  # raw bytes of round r's fragment


def _schedule(**streaming: Any) -> dict[str, Any]:
    return {
        "mode": "diloco",
        "deadline_s": 600,
        "wait_for_clients_s": 5,
        "diloco": {"local_steps": 4, "outer_lr": 1.0, "outer_momentum": 0.0},
        "streaming": {"fragments": 2, "overlap_steps": 1, "mixing_alpha": 0.5, **streaming},
    }


def _virtual(
    tmp_path: Path, schedule: dict[str, Any], app: str = APP, rounds: int = 2
) -> RunConfig:
    return run_config(
        tmp_path,
        run={"rounds": rounds},
        strategy={"name": "fedavg", "clients_per_round": 3, "min_clients": 3},
        schedule=schedule,
        evaluation={"every": 0},
        simulation={
            "clients": 3,
            "app": app,
            "clock": "virtual",
            "workers": 0,
            # 1 kbit/s up: a 48-byte fragment occupies the uplink for 0.384 s, longer than
            # the overlap step (10 samples at 100/s = 0.1 s) can hide, so some is exposed.
            "regions": {"near": {"share": 1.0, "rtt_ms": 20, "up_mbps": 0.001, "down_mbps": 40}},
            "compute": {"samples_per_s": 100.0},
        },
    )


def _fits(config: RunConfig) -> list[tuple[Participation, int]]:
    with open_database(config.storage.url) as db, db.session() as session:
        rows = session.execute(
            select(Participation, Round.number)
            .join(Node, Participation.node_id == Node.id)
            .join(Round, Participation.round_id == Round.id)
            .where(Participation.kind == "fit")
        )
        fits = [(p, int(number)) for p, number in rows]
        session.expunge_all()
    return fits


def _expected_after_two_rounds(mean_rate: float) -> dict[str, Any]:
    return {
        "w": np.full((4, 3), mean_rate, np.float32),
        "b": np.full(3, 3 * mean_rate, np.float32),
        "steps": 3,
    }


def _assert_weights(weights: dict[str, np.ndarray], expected: dict[str, Any]) -> None:
    np.testing.assert_allclose(weights["w"], expected["w"], rtol=1e-6)
    np.testing.assert_allclose(weights["b"], expected["b"], rtol=1e-6)
    assert int(weights["steps"]) == expected["steps"]


# ---------------------------------------------------------------- gRPC


def test_streaming_rounds_over_grpc_sync_one_fragment_each(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 2},
        strategy={"name": "fedavg", "clients_per_round": 3, "min_clients": 3},
        schedule=_schedule() | {"deadline_s": 20, "wait_for_clients_s": 20},
        evaluation={"every": 0},
    )
    server = serve(config)
    for partition in range(3):
        server.add_client(partition, app=APP)
    result = server.wait()
    assert result.status == "completed"
    _assert_weights(final_weights(config), _expected_after_two_rounds((1.0 + 2.0 + 3.0) / 3))
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed", "committed"]
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert len(fits) == 6 and all(p.status == "ok" for p in fits)
    # Two steps of 10 examples per round; each upload carries one fragment only.
    assert {p.num_examples for p in fits} == {20}
    whole_model = sum(FRAGMENT_BYTES.values())
    assert all(p.bytes_up_raw is not None and p.bytes_up_raw < whole_model + 1024 for p in fits)
    # Round 2's clients hold version 0, and only round 1's fragment [w] changed since.
    first, second = ({p.bytes_down for p in fits if p.round_number == number} for number in (1, 2))
    assert max(second) < min(first)


# ---------------------------------------------------------------- virtual clock


def test_fragment_uploads_hide_behind_the_overlap_steps_on_the_virtual_clock(
    tmp_path: Path,
) -> None:
    overlapped = _virtual(tmp_path / "tau1", _schedule())
    run = run_virtual_simulation(overlapped)
    assert run.result.status == "completed"
    _assert_weights(final_weights(overlapped), _expected_after_two_rounds(2.0))
    # The clock recorded the uplink busy while the overlap step trained.
    assert run.stats.hidden_sending_s > 0
    assert run.stats.hidden_sending_s <= run.stats.overlapped_sending_s
    fits = _fits(overlapped)
    assert len(fits) == 6 and all(p.status == "ok" for p, _ in fits)
    for participation, number in fits:
        assert participation.bytes_up_raw == FRAGMENT_BYTES[number]
    down = {number: participation.bytes_down for participation, number in fits}
    assert down[2] < down[1]  # round 2 downloads only the tensors round 1 changed

    sequential = _virtual(tmp_path / "tau0", _schedule(overlap_steps=0))
    run_tau0 = run_virtual_simulation(sequential)
    assert run_tau0.result.status == "completed"
    assert run_tau0.stats.hidden_sending_s == 0  # sent after the last step: nothing hidden
    # Same compute and bytes per fit; the overlap takes the hidden part off each fit.
    by_round = {(n, p.node_id): p for p, n in _fits(sequential)}
    for participation, number in fits:
        other = by_round[(number, participation.node_id)]
        assert participation.compute_s == pytest.approx(other.compute_s)
        assert (participation.duration_s or 0) < (other.duration_s or 0)


def test_one_fragment_without_overlap_or_mixing_is_plain_diloco(tmp_path: Path) -> None:
    """P = 1, tau = 0, alpha = 0: the same model as DiLoCo, round for round."""
    diloco = {
        "mode": "diloco",
        "deadline_s": 600,
        "wait_for_clients_s": 5,
        "diloco": {"local_steps": 3, "outer_lr": 0.7, "outer_momentum": 0.9},
    }
    streaming = diloco | {"streaming": {"fragments": 1, "overlap_steps": 0, "mixing_alpha": 0.0}}
    app = "geofl_testapp:toward_app"  # its update depends on the model it starts from
    plain = _virtual(tmp_path / "plain", diloco, app, rounds=3)
    stream = _virtual(tmp_path / "stream", streaming, app, rounds=3)
    run_virtual_simulation(plain)
    run_virtual_simulation(stream)
    expected, got = final_weights(plain), final_weights(stream)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    assert not np.array_equal(expected["w"], np.zeros((4, 3)))  # the run did train
    # The comparison can tell: mixing the kept local model in gives another model.
    mixing = streaming | {"streaming": {"fragments": 1, "overlap_steps": 0, "mixing_alpha": 0.5}}
    mixed = _virtual(tmp_path / "mixed", mixing, app, rounds=3)
    run_virtual_simulation(mixed)
    assert not np.array_equal(final_weights(mixed)["w"], expected["w"])


# ---------------------------------------------------------------- bad input


def test_fragments_the_model_cannot_have_are_refused_before_a_round(tmp_path: Path) -> None:
    config = _virtual(tmp_path, _schedule(fragments=0, groups=[["w"], ["b"]]))
    with pytest.raises(ConfigError, match=r"schedule\.streaming\.groups never synchronizes"):
        run_virtual_simulation(config)
