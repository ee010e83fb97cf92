"""This client's side of secure aggregation: the stage tasks of each secure round.

A secure round sends a client up to four tasks (advertise, share, a masked fit, unmask);
the SecAgg+ state between them (key pairs, the shares received) lives in one
:class:`~geofl.client.secagg.SecAggClient` per round, kept in memory only: a client that
restarts mid-round has lost its secrets and counts as dropped for that round, which the
protocol tolerates.

When the unmask task asks for it (``keys_ahead``), the answer also carries the public keys
of fresh secrets for this client's next secure round of the run; that round's share task
then names them (``own``) and there is no advertise task. Those secrets are used once: a
share task that names them consumes them, and an advertise task discards them (the server
did not take them), so no key pair ever serves two rounds.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from geofl.client.secagg import RoundSecrets, SecAggClient
from geofl.protocols.ddp import DistributedDpParams, secure_generator
from geofl.protocols.secagg import PublicKeys, SecAggError, SecAggParams
from geofl.protocols.shared_lowrank import SharedLowRank, projection_of
from geofl.protocols.tensors import Difference, TensorSpec
from geofl.protocols.v1 import geofl_pb2 as pb

__all__ = ["SecureRounds", "ddp_of"]


def params_of(task: pb.Task) -> SecAggParams:
    """The round's parameters as the server sent them (validated by SecAggParams)."""
    setup = task.secagg.setup
    return SecAggParams(
        run_id=task.run_id,
        round=task.round,
        cohort=tuple(int(n) for n in setup.cohort),
        threshold=setup.threshold,
        degree=setup.degree,
        graph_seed=bytes(setup.graph_seed),
        clip=setup.clip,
        ring_bits=setup.ring_bits,
    )


def ddp_of(setup: pb.SecAggSetup) -> DistributedDpParams | None:
    """The round's distributed-DP parameters, if the server asked for distributed DP."""
    if not setup.HasField("ddp"):
        return None
    ddp = setup.ddp
    return DistributedDpParams(
        clip_norm=ddp.clip_norm,
        granularity=ddp.granularity,
        noise_stddev=ddp.noise_stddev,
        rounding_bound=ddp.rounding_bound,
        dimension=ddp.dimension,
        rotation_seed=bytes(ddp.rotation_seed),
        ring_bits=setup.ring_bits,
        min_survivors=ddp.min_survivors,
    )


def weighted_vector(update: npt.NDArray[np.float64], weight: float) -> npt.NDArray[np.float64]:
    """``[w * update, w]``: summed over the cohort, the weighted sum and the total weight."""
    vector = np.empty(update.size + 1, dtype=np.float64)
    np.multiply(update, weight, out=vector[:-1])
    vector[-1] = weight
    return vector


def weighted_flat(delta: Mapping[str, Difference], weight: float) -> npt.NDArray[np.float64]:
    """``weighted_vector(flatten(delta), weight)`` in one float64 buffer, no temporaries.

    Each difference is computed in its own dtype straight into the buffer, then scaled
    in place: the same values as the two steps, without two more model-sized arrays.
    """
    size = sum(int(np.prod(d.shape, dtype=np.int64)) for d in delta.values())
    vector = np.empty(size + 1, dtype=np.float64)
    offset = 0
    for difference in delta.values():
        new, base = difference.new.reshape(-1), difference.base.reshape(-1)
        part = vector[offset : offset + base.size]
        np.subtract(new, base, out=part, dtype=difference.dtype, casting="unsafe")
        offset += base.size
    np.multiply(vector[:-1], weight, out=vector[:-1])
    vector[-1] = weight
    return vector


def flatten(delta: Mapping[str, Difference]) -> npt.NDArray[np.float64]:
    """The delta's tensors in model order as one float64 vector."""
    size = sum(int(np.prod(d.shape, dtype=np.int64)) for d in delta.values())
    out = np.empty(size, dtype=np.float64)
    offset = 0
    for difference in delta.values():
        values = difference.materialize().reshape(-1)
        out[offset : offset + values.size] = values
        offset += values.size
    return out


class SecureRounds:
    """The open secure round of this client (at most one at a time)."""

    def __init__(self) -> None:
        self._round: tuple[int, int] | None = None
        self._client: SecAggClient | None = None
        #: What shared low-rank projections dropped so far, by tensor (error feedback).
        self._residual: dict[str, npt.NDArray[np.float64]] = {}
        #: Secrets whose public keys went ahead in the last unmask answer:
        #: (run id, this client's node id then, secrets).
        self._ahead: tuple[int, int, RoundSecrets] | None = None

    def advertise(self, task: pb.Task, node_id: int) -> pb.SecAggResult:
        """Start the round: fresh key pairs; their public halves go to the server.

        Secrets sent ahead are discarded: the server did not take them for this round.
        """
        self._ahead = None
        self._client = SecAggClient(node_id, params_of(task))
        self._round = (task.run_id, task.round)
        keys = self._client.advertise()
        return pb.SecAggResult(keys=pb.PublicKeys(encrypt=keys.encrypt, mask=keys.mask))

    def share(self, task: pb.Task) -> pb.SecAggResult:
        """Encrypted shares of this client's secrets for each neighbour in the roster.

        A task that names this client's own keys starts the round with the secrets sent
        ahead (there was no advertise task).
        """
        if task.secagg.HasField("own"):
            self._client = self._take_ahead(task)
            self._round = (task.run_id, task.round)
        roster = {
            int(node): PublicKeys(encrypt=bytes(k.encrypt), mask=bytes(k.mask))
            for node, k in task.secagg.roster.items()
        }
        return pb.SecAggResult(shares=self._current(task).share_keys(roster))

    def mask(
        self, task: pb.Task, delta: Mapping[str, Difference], num_examples: int
    ) -> npt.NDArray[np.unsignedinteger]:
        """Take the shares addressed to this client, then mask the weighted update."""
        client = self._current(task)
        client.receive_shares({int(n): bytes(c) for n, c in task.secagg.inbox.items()})
        setup = task.secagg.setup
        ddp = ddp_of(setup)
        if ddp is not None:  # every client counts once: num_examples would scale sensitivity
            noised = ddp.encode(flatten(delta), secure_generator())
            return client.mask_encoded(noised)
        weight = min(num_examples, setup.max_examples) / setup.max_examples
        projection = projection_of(setup)
        if projection is None:
            return client.mask(weighted_flat(delta, weight))
        return client.mask(weighted_vector(self._project(projection, delta), weight))

    def _project(
        self, projection: SharedLowRank, delta: Mapping[str, Difference]
    ) -> npt.NDArray[np.float64]:
        """Project delta + residual; keep what the projection dropped for the next round."""
        spec = tuple(TensorSpec(n, str(d.dtype), tuple(d.shape)) for n, d in delta.items())
        corrected = {}
        for name, difference in delta.items():
            values = difference.materialize().astype(np.float64)
            residual = self._residual.get(name)
            if residual is not None and residual.shape == values.shape:
                values += residual
            corrected[name] = values
        vector = projection.project(corrected, spec)
        sent = projection.lift(vector, spec)
        # Tensors sent whole leave no residual: keep only the projected ones' remainders.
        projected = [part.name for part in projection.layout(spec) if part.projected]
        self._residual = {name: corrected[name] - sent[name] for name in projected}
        return vector

    def unmask(self, task: pb.Task) -> pb.SecAggResult:
        """Reveal what the server needs to remove the survivors' and the dropped' masks.

        Under distributed DP a client refuses to unmask a sum of fewer survivors than the
        noise was planned for: it would carry less noise than accounted.
        """
        ddp = ddp_of(task.secagg.setup)
        if ddp is not None and len(task.secagg.survivors) < ddp.min_survivors:
            self._client = self._round = None
            raise SecAggError(
                f"refusing to unmask round {task.round}: {len(task.secagg.survivors)} "
                f"survivors, fewer than the {ddp.min_survivors} distributed DP's noise needs"
            )
        client = self._current(task)
        revealed = client.reveal(
            [int(n) for n in task.secagg.survivors], [int(n) for n in task.secagg.dropped]
        )
        self._client = self._round = None  # the round's secrets are spent
        result = pb.SecAggResult(revealed=revealed)
        if task.secagg.keys_ahead:  # the next round's keys, so it needs no advertise task
            secrets = RoundSecrets.fresh()
            self._ahead = (task.run_id, client.node_id, secrets)
            keys = secrets.public()
            result.keys.CopyFrom(pb.PublicKeys(encrypt=keys.encrypt, mask=keys.mask))
        return result

    def _take_ahead(self, task: pb.Task) -> SecAggClient:
        """The round's state from the secrets sent ahead, which are used up by this call."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead[0] != task.run_id:
            self._client = self._round = None
            raise SecAggError(
                f"round {task.round}: the server holds keys this client sent ahead, but it "
                "has none (it restarted, or they served a round already)"
            )
        _, node_id, secrets = ahead
        mine, named = secrets.public(), task.secagg.own
        if (bytes(named.encrypt), bytes(named.mask)) != (mine.encrypt, mine.mask):
            self._client = self._round = None
            raise SecAggError(
                f"round {task.round}: the server names keys this client did not send ahead"
            )
        return SecAggClient(node_id, params_of(task), secrets=secrets)

    def _current(self, task: pb.Task) -> SecAggClient:
        if self._client is None or self._round != (task.run_id, task.round):
            raise SecAggError(
                f"no secure-aggregation state for round {task.round} "
                "(this client joined or restarted after the round's key exchange)"
            )
        return self._client
