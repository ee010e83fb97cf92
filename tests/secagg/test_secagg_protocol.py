"""Whole SecAgg+ rounds in process: dropouts at every stage, full and sparse graphs."""

from __future__ import annotations

import numpy as np
import pytest

from geofl.client.secagg import SecAggClient
from geofl.protocols.secagg import SecAggAbortError, SecAggError, SecAggStage
from geofl.server.rounds.secagg import SecAggServer

from .test_secagg_harness import DROP_STAGES, clipped_sum, make_params, make_vectors, run_round

SIZE = 20
LENGTH = 257
#: (degree, threshold) per graph; thresholds low enough that any 6 dropouts leave every
#: client's 7 (sparse) or 20 (full) share holders at or above the threshold.
GRAPHS = {"full": (SIZE - 1, 11), "sparse": (8, 3)}


def _pick(count: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return sorted(int(n) for n in rng.choice(np.arange(101, 101 + SIZE), count, replace=False))


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("stage", DROP_STAGES)
def test_sum_is_correct_with_dropouts_at_one_stage(graph: str, fraction: float, stage: str) -> None:
    degree, threshold = GRAPHS[graph]
    params = make_params(SIZE, degree, threshold)
    vectors = make_vectors(params, LENGTH)
    gone = _pick(round(fraction * SIZE), seed=DROP_STAGES.index(stage))
    result = run_round(params, vectors, {stage: gone})
    kept = set(params.cohort) - (set() if stage == "unmask" else set(gone))
    assert result.survivors == kept
    before_sharing = stage in ("advertise", "share")
    assert result.dropped == (frozenset() if before_sharing or stage == "unmask" else set(gone))
    assert result.total is not None
    error = np.abs(result.total - clipped_sum(params, vectors, kept))
    assert error.max() <= params.quantizer().error_bound(len(kept))
    assert result.server.stage is None


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_sum_is_correct_with_dropouts_at_every_stage(graph: str) -> None:
    degree, _ = GRAPHS[graph]
    threshold = 10 if graph == "full" else 3  # 20 - 4 * 2 = 12 left; sparse: 9 - 6 >= 3
    params = make_params(SIZE, degree, threshold, ring_bits=20)
    vectors = make_vectors(params, LENGTH, seed=5)
    order = _pick(8, seed=11)
    drops = {stage: order[2 * i : 2 * i + 2] for i, stage in enumerate(DROP_STAGES[:4])}
    drops["unmask"] = _pick(SIZE, seed=12)[:0] + [n for n in params.cohort if n not in order][:2]
    result = run_round(params, vectors, drops)
    kept = set(params.cohort) - set(order)
    assert result.survivors == kept
    assert result.dropped == set(drops["receive"]) | set(drops["mask"])
    assert result.total is not None
    error = np.abs(result.total - clipped_sum(params, vectors, kept))
    assert error.max() <= params.quantizer().error_bound(len(kept))


@pytest.mark.parametrize(
    ("stage", "server_stage"),
    [
        ("advertise", SecAggStage.ADVERTISE),
        ("share", SecAggStage.SHARE),
        ("receive", SecAggStage.MASK),
        ("mask", SecAggStage.MASK),
        ("unmask", SecAggStage.UNMASK),
    ],
)
def test_round_aborts_when_fewer_than_threshold_remain(
    stage: str, server_stage: SecAggStage
) -> None:
    params = make_params(10, 9, 4)
    vectors = make_vectors(params, 16)
    with pytest.raises(SecAggAbortError) as caught:
        run_round(params, vectors, {stage: list(params.cohort)[:7]})
    assert caught.value.stage == server_stage
    assert (
        caught.value.reason
        == f"run 9, round 4, stage {server_stage}: 3 of 10 clients left, threshold 4"
    )
    assert caught.value.reason in str(caught.value)


def test_exactly_threshold_clients_are_enough() -> None:
    params = make_params(10, 9, 4)
    vectors = make_vectors(params, 16)
    result = run_round(params, vectors, {"mask": list(params.cohort)[:6]})
    assert result.survivors == set(params.cohort[6:])
    assert result.total is not None
    assert np.abs(result.total - clipped_sum(params, vectors, params.cohort[6:])).max() <= (
        params.quantizer().error_bound(4)
    )


def test_sparse_round_aborts_when_one_clients_holders_vanish() -> None:
    params = make_params(SIZE, 4, 3)  # 5 holders per client
    graph = params.neighbourhoods()
    victim = params.cohort[0]
    neighbours = sorted(graph[victim])[:3]  # victim keeps itself and one neighbour
    with pytest.raises(SecAggAbortError) as caught:
        run_round(params, make_vectors(params, 8), {"unmask": neighbours})
    assert caught.value.stage == SecAggStage.UNMASK
    assert f"node {victim}'s self-mask seed has 2 share holders left, threshold 3" in (
        caught.value.reason
    )


def test_a_dropped_clients_missing_key_holders_abort_at_masking() -> None:
    params = make_params(SIZE, 4, 3)
    graph = params.neighbourhoods()
    victim = params.cohort[0]
    vanished = [victim, *sorted(graph[victim])[:3]]  # one neighbour of the victim stays
    with pytest.raises(SecAggAbortError) as caught:
        run_round(params, make_vectors(params, 8), {"mask": vanished})
    assert caught.value.stage == SecAggStage.MASK
    assert f"node {victim}'s mask key has 1 share holders left" in caught.value.reason


def test_clients_with_too_few_sharing_neighbours_are_pruned_not_fatal() -> None:
    params = make_params(SIZE, 4, 3)  # 5 holders; each client needs 2 of its 4 neighbours
    graph = params.neighbourhoods()
    victim = params.cohort[0]
    gone = sorted(graph[victim])[:3]
    vectors = make_vectors(params, 32)
    result = run_round(params, vectors, {"share": gone})
    kept = result.server.sharers
    assert victim not in kept and not kept & set(gone)
    assert len(kept) >= SIZE - len(gone) - 2  # the victim, perhaps one more, but no collapse
    assert all(len(graph[node] & kept) >= 2 for node in kept)
    assert result.survivors == kept
    assert result.total is not None
    error = np.abs(result.total - clipped_sum(params, vectors, kept))
    assert error.max() <= params.quantizer().error_bound(len(kept))


def test_a_pruned_client_cannot_upload() -> None:
    params = make_params(SIZE, 4, 3)
    server = SecAggServer(params)
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    victim = params.cohort[0]
    gone = set(sorted(params.neighbourhoods()[victim])[:3])
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    for node, roster in server.close_advertise().items():
        if node not in gone:
            server.add_shares(node, clients[node].share_keys(roster))
    inboxes = server.close_sharing()
    assert victim not in inboxes
    with pytest.raises(SecAggError, match=f"node {victim} may not send in stage mask"):
        server.add_masked(victim, np.zeros(4, np.uint32))


def test_a_tight_threshold_on_a_sparse_graph_can_collapse_and_says_so() -> None:
    params = make_params(SIZE, 4, 5)  # every client needs all 4 neighbours
    gone = sorted(params.neighbourhoods()[params.cohort[0]])[:1]
    with pytest.raises(SecAggAbortError) as caught:
        run_round(params, make_vectors(params, 4), {"share": gone})
    assert caught.value.stage == SecAggStage.SHARE
    assert "0 of 20 clients left after removing 19 with fewer than 4 neighbours left" in str(
        caught.value
    )
