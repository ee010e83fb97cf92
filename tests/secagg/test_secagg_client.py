"""SecAggClient: stage order and the checks a client makes on what the server sends."""

from __future__ import annotations

import numpy as np
import pytest

from geofl.client.secagg import SecAggClient
from geofl.protocols.secagg import (
    PublicKeys,
    SecAggAbortError,
    SecAggError,
    SecAggParams,
    SecAggStage,
)
from geofl.server.rounds.secagg import SecAggServer

from .test_secagg_harness import make_params


def _shared_round(params: SecAggParams) -> tuple[dict[int, SecAggClient], SecAggServer]:
    """Every client through receive_shares; returns clients and the server in stage mask."""
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    server = SecAggServer(params)
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    for node, roster in server.close_advertise().items():
        server.add_shares(node, clients[node].share_keys(roster))
    for node, inbox in server.close_sharing().items():
        clients[node].receive_shares(inbox)
    return clients, server


def test_stages_run_once_and_in_order() -> None:
    params = make_params(4, 3, 2)
    client = SecAggClient(101, params)
    with pytest.raises(SecAggError, match=r"share_keys\(\) called out of order \(expected adv"):
        client.share_keys({})
    client.advertise()
    with pytest.raises(SecAggError, match=r"advertise\(\) called out of order"):
        client.advertise()
    clients, _ = _shared_round(params)
    clients[101].mask(np.zeros(3))
    with pytest.raises(SecAggError, match=r"mask\(\) called out of order \(expected reveal"):
        clients[101].mask(np.zeros(3))


def test_node_must_belong_to_the_cohort() -> None:
    with pytest.raises(SecAggError, match="node 7 is not in the round's cohort"):
        SecAggClient(7, make_params(4, 3, 2))


def _keys() -> PublicKeys:
    return SecAggClient(101, make_params(4, 3, 2)).advertise()


def test_roster_must_stay_within_the_neighbourhood() -> None:
    params = make_params(10, 2, 2)
    client = SecAggClient(101, params)
    client.advertise()
    stranger = next(n for n in params.cohort if n not in client.neighbours and n != 101)
    with pytest.raises(SecAggError, match=rf"non-neighbours \[{stranger}\]"):
        client.share_keys({stranger: _keys()})


def test_roster_must_not_reflect_my_own_keys() -> None:
    params = make_params(4, 3, 2)
    client = SecAggClient(101, params)
    mine = client.advertise()
    with pytest.raises(SecAggError, match="reuses my keys"):
        client.share_keys({102: PublicKeys(encrypt=_keys().encrypt, mask=mine.mask)})


def test_too_small_a_roster_aborts_sharing() -> None:
    params = make_params(6, 5, 4)
    client = SecAggClient(101, params)
    client.advertise()
    with pytest.raises(SecAggAbortError) as caught:
        client.share_keys({102: _keys()})
    assert caught.value.stage == SecAggStage.SHARE
    assert "node 101 has 1 advertised neighbours, threshold 4" in caught.value.reason


def test_inbox_from_strangers_or_tampered_is_rejected() -> None:
    params = make_params(4, 3, 2)
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    server = SecAggServer(params)
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    rosters = server.close_advertise()
    for node in (101, 102, 103):
        server.add_shares(node, clients[node].share_keys(rosters[node]))
    inboxes = server.close_sharing()
    with pytest.raises(SecAggError, match=r"non-roster nodes \[999\]"):
        clients[101].receive_shares({**inboxes[101], 999: b"x"})
    forged = dict(inboxes[102])
    forged[101] = forged[101][:-1] + bytes([forged[101][-1] ^ 1])
    with pytest.raises(SecAggError, match=r"from node 101 to node 102 .* failed authentication"):
        clients[102].receive_shares(forged)


def test_a_ciphertext_for_another_recipient_is_rejected() -> None:
    params = make_params(4, 3, 2)
    clients = {n: SecAggClient(n, params) for n in params.cohort}
    server = SecAggServer(params)
    for node, client in clients.items():
        server.add_keys(node, client.advertise())
    rosters = server.close_advertise()
    sent = {node: clients[node].share_keys(rosters[node]) for node in params.cohort}
    with pytest.raises(SecAggError, match=r"from node 101 to node 102 .* misaddressed"):
        clients[102].receive_shares({101: sent[101][103]})  # meant for 103


def test_mask_rejects_bad_vectors() -> None:
    params = make_params(4, 3, 2)
    for bad, message in [
        (np.zeros((2, 2)), "1-D NumPy float vector"),
        ([0.0, 1.0], "1-D NumPy float vector"),
        (np.array([1, 2]), "floating-point"),
        (np.array([0.0, np.nan]), "NaN"),
    ]:
        clients, _ = _shared_round(params)
        with pytest.raises(SecAggError, match=message):
            clients[101].mask(bad)  # type: ignore[arg-type]


def _masked_round(params: SecAggParams) -> dict[int, SecAggClient]:
    clients, _ = _shared_round(params)
    for client in clients.values():
        client.mask(np.zeros(2))
    return clients


def test_reveal_refuses_inconsistent_survivor_lists() -> None:
    params = make_params(5, 4, 3)
    clients = _masked_round(params)
    with pytest.raises(SecAggError, match=r"nodes \[102\] listed as survivor and dropped"):
        clients[101].reveal({101, 102, 103}, {102})
    clients = _masked_round(params)
    with pytest.raises(SecAggError, match="not listed as survivor"):
        clients[101].reveal({102, 103, 104}, {101})
    clients = _masked_round(params)
    with pytest.raises(SecAggError, match=r"did not classify nodes \[105\]"):
        clients[101].reveal({101, 102, 103}, {104})


def test_reveal_refuses_when_too_few_survive() -> None:
    params = make_params(5, 4, 3)
    clients = _masked_round(params)
    with pytest.raises(SecAggAbortError) as caught:
        clients[101].reveal({101, 102}, {103, 104, 105})
    assert caught.value.stage == SecAggStage.UNMASK


def test_reveal_gives_one_share_per_owner_and_the_right_kind() -> None:
    params = make_params(5, 4, 3)
    clients = _masked_round(params)
    survivors, dropped = {101, 102, 103, 104}, {105}
    reveals = {n: clients[n].reveal(survivors, dropped) for n in (101, 102, 103)}
    assert all(set(shares) == set(params.cohort) for shares in reveals.values())
    held = {n: clients[n]._held for n in reveals}
    for node, shares in reveals.items():
        for owner, share in shares.items():
            key_share, seed_share = held[node][owner]
            assert share == (key_share if owner in dropped else seed_share)
