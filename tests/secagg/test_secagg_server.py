"""SecAggServer: bad messages are refused without corrupting the round; stages in order."""

from __future__ import annotations

import numpy as np
import pytest

from geofl.client.secagg import SecAggClient
from geofl.protocols.secagg import (
    SHARE_BYTES,
    PublicKeys,
    SecAggAbortError,
    SecAggError,
    SecAggParams,
    SecAggStage,
)
from geofl.server.rounds.secagg import SecAggServer

from .test_secagg_harness import clipped_sum, make_params, make_vectors

LENGTH = 6


def _advertised(
    params: SecAggParams,
) -> tuple[dict[int, SecAggClient], SecAggServer, dict[int, dict[int, PublicKeys]]]:
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    server = SecAggServer(params, length=LENGTH)
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    return clients, server, server.close_advertise()


def _masking(params: SecAggParams) -> tuple[dict[int, SecAggClient], SecAggServer]:
    clients, server, rosters = _advertised(params)
    for node, roster in rosters.items():
        server.add_shares(node, clients[node].share_keys(roster))
    for node, inbox in server.close_sharing().items():
        clients[node].receive_shares(inbox)
    return clients, server


def test_stage_names_are_the_recorded_strings() -> None:
    assert [stage.value for stage in SecAggStage] == ["advertise", "share", "mask", "unmask"]
    assert isinstance(SecAggStage.UNMASK, str) and f"{SecAggStage.UNMASK}" == "unmask"


def test_calls_outside_their_stage_are_refused() -> None:
    params = make_params(4, 3, 2)
    server = SecAggServer(params)
    with pytest.raises(SecAggError, match="add_shares belongs to stage share, but the stage is"):
        server.add_shares(101, {})
    with pytest.raises(SecAggError, match="finish belongs to stage unmask"):
        server.finish()


def test_bad_keys_are_refused() -> None:
    params = make_params(4, 3, 2)
    server = SecAggServer(params)
    keys = SecAggClient(101, params).advertise()
    with pytest.raises(SecAggError, match="node 7 may not send in stage advertise"):
        server.add_keys(7, keys)
    server.add_keys(101, keys)
    with pytest.raises(SecAggError, match="node 101 already sent"):
        server.add_keys(101, keys)
    with pytest.raises(SecAggError, match="must be PublicKeys"):
        server.add_keys(102, (keys.encrypt, keys.mask))  # type: ignore[arg-type]


def test_rosters_list_only_advertised_neighbours() -> None:
    params = make_params(10, 4, 3)
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    server = SecAggServer(params)
    for node, client in clients.items():
        if node != 105:
            server.add_keys(node, client.advertise())
    rosters = server.close_advertise()
    graph = params.neighbourhoods()
    assert set(rosters) == set(params.cohort) - {105}
    for node, roster in rosters.items():
        assert set(roster) == graph[node] - {105}
        assert all(isinstance(keys, PublicKeys) for keys in roster.values())


def test_bad_shares_are_refused() -> None:
    params = make_params(4, 3, 2)
    clients, server, rosters = _advertised(params)
    sent = clients[101].share_keys(rosters[101])
    with pytest.raises(SecAggError, match=r"shares missing for \[104\], unexpected for \[\]"):
        server.add_shares(101, {k: v for k, v in sent.items() if k != 104})
    with pytest.raises(SecAggError, match="the share for node 102 must be 160 bytes"):
        server.add_shares(101, {**sent, 102: sent[102][:-1]})
    server.add_shares(101, sent)
    with pytest.raises(SecAggError, match="already sent"):
        server.add_shares(101, sent)


def test_inboxes_hold_only_senders_that_completed_sharing() -> None:
    params = make_params(5, 4, 2)
    clients, server, rosters = _advertised(params)
    sent = {n: clients[n].share_keys(rosters[n]) for n in (101, 102, 103)}
    for node, ciphertexts in sent.items():
        server.add_shares(node, ciphertexts)
    inboxes = server.close_sharing()
    assert set(inboxes) == {101, 102, 103}
    assert inboxes[101] == {102: sent[102][101], 103: sent[103][101]}


def test_bad_masked_vectors_are_refused_and_leave_the_sum_intact() -> None:
    params = make_params(4, 3, 2, ring_bits=20)
    clients, server = _masking(params)
    vectors = make_vectors(params, LENGTH)
    good = clients[101].mask(vectors[101])
    for bad, message in [
        (good.astype(np.uint64), "1-D uint32"),
        (good.reshape(2, 3), "1-D uint32"),
        (good[:-1], "has 5 values, expected 6"),
        (np.full(LENGTH, 2**20, np.uint32), "outside the ring"),
        (good.tolist(), "NumPy array"),
    ]:
        with pytest.raises(SecAggError, match=message):
            server.add_masked(101, bad)
    with pytest.raises(SecAggError, match="node 7 may not send in stage mask"):
        server.add_masked(7, good)
    for node in params.cohort:
        server.add_masked(node, good if node == 101 else clients[node].mask(vectors[node]))
    with pytest.raises(SecAggError, match="already sent"):
        server.add_masked(101, good)
    survivors, dropped = server.close_masking()
    assert survivors == set(params.cohort) and not dropped
    for node in params.cohort:
        server.add_reveal(node, clients[node].reveal(survivors, dropped))
    total = server.finish()
    bound = params.quantizer().error_bound(4)
    assert np.abs(total - clipped_sum(params, vectors, params.cohort)).max() <= bound


def test_length_is_taken_from_the_first_vector_without_a_hint() -> None:
    params = make_params(3, 2, 2)
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    server = SecAggServer(params)
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    for node, roster in server.close_advertise().items():
        server.add_shares(node, clients[node].share_keys(roster))
    for node, inbox in server.close_sharing().items():
        clients[node].receive_shares(inbox)
    server.add_masked(101, clients[101].mask(np.zeros(4)))
    with pytest.raises(SecAggError, match="has 3 values, expected 4"):
        server.add_masked(102, clients[102].mask(np.zeros(3)))


def test_bad_reveals_are_refused() -> None:
    params = make_params(4, 3, 2)
    clients, server = _masking(params)
    for node in (101, 102, 103):
        server.add_masked(node, clients[node].mask(np.zeros(LENGTH)))
    survivors, dropped = server.close_masking()
    assert dropped == {104}
    shares = clients[101].reveal(survivors, dropped)
    with pytest.raises(SecAggError, match="node 104 may not send in stage unmask"):
        server.add_reveal(104, shares)
    with pytest.raises(SecAggError, match=r"misses owners \[103\], has extra \[\]"):
        server.add_reveal(101, {k: v for k, v in shares.items() if k != 103})
    with pytest.raises(SecAggError, match=f"the share of node 102 must be {SHARE_BYTES} bytes"):
        server.add_reveal(101, {**shares, 102: b"x"})
    server.add_reveal(101, shares)
    with pytest.raises(SecAggError, match="already sent"):
        server.add_reveal(101, shares)


def test_a_corrupted_reveal_is_caught_when_reconstructing() -> None:
    params = make_params(4, 3, 2)
    clients, server = _masking(params)
    for node in (101, 102, 103):
        server.add_masked(node, clients[node].mask(np.zeros(LENGTH)))
    survivors, dropped = server.close_masking()
    for node in sorted(survivors):
        shares = clients[node].reveal(survivors, dropped)
        if node == 101:
            shares[104] = bytes(SHARE_BYTES - 1) + b"\x07"  # a wrong share of 104's key
        server.add_reveal(node, shares)
    with pytest.raises(SecAggError, match="node 104"):
        server.finish()


def test_after_an_abort_the_round_is_over() -> None:
    params = make_params(4, 3, 3)
    server = SecAggServer(params)
    server.add_keys(101, SecAggClient(101, params).advertise())
    with pytest.raises(SecAggAbortError) as caught:
        server.close_advertise()
    assert caught.value.stage == "advertise"
    assert caught.value.reason == (
        "run 9, round 4, stage advertise: 1 of 4 clients left, threshold 3"
    )
    assert server.stage is None
    with pytest.raises(SecAggError, match=r"round is over \(aborted at stage advertise\)"):
        server.add_keys(102, SecAggClient(102, params).advertise())


def test_length_hint_must_be_an_int() -> None:
    with pytest.raises(SecAggError, match="length must be an int"):
        SecAggServer(make_params(3, 2, 2), length=2.5)  # type: ignore[arg-type]
