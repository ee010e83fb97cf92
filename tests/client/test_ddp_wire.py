"""Under distributed DP the server never receives a client's un-noised vector.

Three clients run the real client side of a secure round (:class:`SecureRounds`, from the
protobuf tasks a server sends) against the real SecAgg+ server state machine. What each
client hands to masking is already noised (checked by decoding it, which only this test
can do); what travels is masked; the unmasked sum carries every client's noise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from geofl.client.secagg import SecAggClient
from geofl.client.secure_rounds import SecureRounds
from geofl.protocols.ddp import clip_to_norm, padded_size, rounding_bound
from geofl.protocols.secagg import RingArray, SecAggError
from geofl.protocols.tensors import Difference
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.rounds.secagg import SecAggServer
from geofl.server.rounds.secure import (
    DistributedDpSettings,
    SecureSettings,
    keys_from_proto,
    roster_to_proto,
    round_params,
    setup_to_proto,
)

DIMENSION = 4000
GRANULARITY = 1e-4
NOISE = 200.0  # steps
NODES = [1, 2, 3]


def _settings() -> SecureSettings:
    padded = padded_size(DIMENSION)
    ddp = DistributedDpSettings(
        clip_norm=1.0,
        granularity=GRANULARITY,
        noise_stddev=NOISE,
        rounding_bound=rounding_bound(1.0 / GRANULARITY, padded),
        dimension=DIMENSION,
        min_survivors=3,
        denominator=3,
    )
    return SecureSettings(
        run_id=7,
        degree="full",
        threshold=0.66,
        clip=8.0,
        ring_bits=32,
        max_examples=1,
        stage_deadline_s=10,
        ddp=ddp,
    )


def _task(kind: int, secagg: pb.SecAggTask) -> pb.Task:
    return pb.Task(kind=kind, task_id=1, run_id=7, round=1, secagg=secagg)


def test_what_is_masked_is_noised_and_what_travels_is_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = _settings()
    assert settings.ddp is not None
    params = round_params(settings, 1, NODES)
    ddp = settings.ddp.round_params(settings.ring_bits)
    setup = setup_to_proto(params, settings, ddp)
    server, clients = SecAggServer(params), {n: SecureRounds() for n in NODES}

    handed: dict[int, RingArray] = {}
    original = SecAggClient.mask_encoded

    def spy(self: SecAggClient, encoded: RingArray) -> Any:
        handed[self.node_id] = encoded.copy()  # masking works in place
        return original(self, encoded)

    monkeypatch.setattr(SecAggClient, "mask_encoded", spy)

    for n in NODES:
        result = clients[n].advertise(
            _task(pb.TASK_KIND_SECAGG_ADVERTISE, pb.SecAggTask(setup=setup)), n
        )
        server.add_keys(n, keys_from_proto(result.keys))
    for n, roster in server.close_advertise().items():
        share = _task(
            pb.TASK_KIND_SECAGG_SHARE, pb.SecAggTask(setup=setup, roster=roster_to_proto(roster))
        )
        server.add_shares(n, dict(clients[n].share(share).shares))
    rng = np.random.default_rng(3)
    updates = {n: rng.normal(size=DIMENSION) for n in NODES}
    wire: dict[int, RingArray] = {}
    for n, inbox in server.close_sharing().items():
        fit = _task(pb.TASK_KIND_FIT, pb.SecAggTask(setup=setup, inbox=inbox))
        base = np.zeros(DIMENSION, np.float32)
        delta = {"w": Difference(updates[n].astype(np.float32), base)}
        wire[n] = clients[n].mask(fit, delta, num_examples=1)
        server.add_masked(n, wire[n].copy())

    one_client_noise = NOISE * GRANULARITY
    for n in NODES:
        clipped = clip_to_norm(updates[n].astype(np.float32).astype(np.float64), 1.0)
        residual = ddp.decode_sum(handed[n]) - clipped
        # Noise of the planned std was in the vector before any mask was added.
        assert float(residual.std()) == pytest.approx(one_client_noise, rel=0.1)
        # The upload is masked: uniform over the ring, nothing like the noised vector.
        assert not np.array_equal(wire[n], handed[n])
        assert 0.45 < float(np.mean(wire[n] >= 1 << 31)) < 0.55

    survivors, dropped = server.close_masking()
    reveal = _task(
        pb.TASK_KIND_SECAGG_UNMASK,
        pb.SecAggTask(setup=setup, survivors=sorted(survivors), dropped=sorted(dropped)),
    )
    for n in NODES:
        server.add_reveal(n, dict(clients[n].unmask(reveal).revealed))
    total = ddp.decode_sum(server.finish_ring())
    exact = sum(
        clip_to_norm(u.astype(np.float32).astype(np.float64), 1.0) for u in updates.values()
    )
    residual = total - exact
    assert float(residual.std()) == pytest.approx(math.sqrt(3) * one_client_noise, rel=0.1)


def test_a_client_refuses_to_unmask_fewer_survivors_than_the_noise_needs() -> None:
    settings = _settings()
    assert settings.ddp is not None
    params = round_params(settings, 1, NODES)
    setup = setup_to_proto(params, settings, settings.ddp.round_params(32))
    client = SecureRounds()
    client.advertise(_task(pb.TASK_KIND_SECAGG_ADVERTISE, pb.SecAggTask(setup=setup)), 1)
    reveal = _task(
        pb.TASK_KIND_SECAGG_UNMASK, pb.SecAggTask(setup=setup, survivors=[1, 2], dropped=[3])
    )
    with pytest.raises(SecAggError, match="fewer than the 3 distributed DP's noise needs"):
        client.unmask(reveal)
