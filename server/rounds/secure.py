"""The SecAgg+ stage driver, written once for synchronous rounds and FedBuff groups.

:class:`SecureRound` runs the stages among one cohort::

    ADVERTISE -> SHARE -> masked fit (BROADCAST, FIT) -> UNMASK -> the survivors' sum

Given a :class:`KeysAhead`, the unmask tasks also ask every survivor for fresh public keys
for its next secure round, and a later round takes them instead of asking again: a cohort
whose members all sent keys ahead skips ADVERTISE (one long-poll round trip per client
fewer), and the others advertise as before. Keys sent ahead are used for one round at most
(taken out when a round starts) and only for the session that sent them.

with the engine's own task machinery: the engine says how a stage's tasks are handed out
and settled (:class:`StageTasks`), and the driver feeds every result to the server's
bookkeeping (:class:`geofl.server.rounds.secagg.SecAggServer`), rejecting a node whose stage
input is malformed as a bad update is rejected in a plain round. A stage that leaves fewer
clients than the threshold raises :class:`SecAggAbortError`. This module also chooses each
round's parameters (neighbourhood degree, threshold, a fresh graph seed) and converts
between the protocol's dataclasses and their protobuf messages; the cryptography lives in
:mod:`geofl.protocols.secagg`.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

from geofl.protocols.ddp import DistributedDpError, DistributedDpParams
from geofl.protocols.secagg import (
    PublicKeys,
    SecAggAbortError,
    SecAggError,
    SecAggParams,
    SecAggStage,
    graph_degree,
    recommended_degree,
)
from geofl.protocols.shared_lowrank import projection_of
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Weights
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.nodes.outcomes import MaskedVector, Outcome, StageResult
from geofl.server.nodes.registry import NodeSession, TaskKindName, TaskRecord
from geofl.server.rounds.records import Phase
from geofl.server.rounds.secagg import SecAggServer
from geofl.server.rounds.tasks import StageInput, TakeResult

if TYPE_CHECKING:
    from geofl.server.config import SecureAggregationConfig

__all__ = [
    "DistributedDpSettings",
    "KeysAhead",
    "SecureRound",
    "SecureSettings",
    "StageTasks",
    "keys_from_proto",
    "keys_to_proto",
    "mean_of_sum",
    "roster_to_proto",
    "round_params",
    "setup_to_proto",
]


@dataclass(frozen=True)
class DistributedDpSettings:
    """Distributed DP's per-run parameters (planned by
    :class:`~geofl.server.privacy.distributed.DistributedMechanism`).

    ``denominator`` is the fixed public number the noised sum is divided by
    (``clients_per_round``): dividing by the survivors would make the mean's scale depend
    on who took part.
    """

    clip_norm: float
    granularity: float
    noise_stddev: float
    rounding_bound: float
    dimension: int
    min_survivors: int
    denominator: int

    def round_params(self, ring_bits: int) -> DistributedDpParams:
        """One round's parameters, with a fresh public rotation seed."""
        return DistributedDpParams(
            clip_norm=self.clip_norm,
            granularity=self.granularity,
            noise_stddev=self.noise_stddev,
            rounding_bound=self.rounding_bound,
            dimension=self.dimension,
            rotation_seed=os.urandom(32),
            ring_bits=ring_bits,
            min_survivors=self.min_survivors,
        )


@dataclass(frozen=True)
class SecureSettings:
    """The ``secure_aggregation`` section, plus the run id the keys are bound to."""

    run_id: int
    degree: int | Literal["auto", "full"]
    threshold: float
    clip: float
    ring_bits: int
    max_examples: int
    stage_deadline_s: float
    low_rank: int = 0
    low_rank_min_elements: int = 0
    ddp: DistributedDpSettings | None = None

    @classmethod
    def from_config(
        cls,
        secure: SecureAggregationConfig,
        run_id: int,
        ddp: DistributedDpSettings | None = None,
    ) -> SecureSettings | None:
        """The section's settings, bound to ``run_id`` (None: plain rounds); ``ddp``: the
        run's distributed DP, if any."""
        if not secure.enabled:
            return None
        return cls(
            run_id=run_id,
            degree=secure.degree,
            threshold=secure.threshold,
            clip=secure.clip,
            ring_bits=secure.ring_bits,
            max_examples=secure.max_examples,
            stage_deadline_s=secure.stage_deadline_s,
            low_rank=secure.low_rank.rank if secure.low_rank else 0,
            low_rank_min_elements=secure.low_rank.min_elements if secure.low_rank else 0,
            ddp=ddp,
        )


class StageTasks(Protocol):
    """How an engine hands one stage's tasks to ``sessions`` and settles them.

    Every good result passes through ``take`` (which feeds it to the SecAgg+ server);
    the engine records each task as its machinery does.
    """

    async def __call__(
        self,
        sessions: Sequence[NodeSession],
        kind: TaskKindName,
        inputs: StageInput,
        take: TakeResult,
    ) -> None:
        """Run the stage's tasks to their end."""


class KeysAhead:
    """Public keys that nodes sent ahead (in an unmask answer) for their next secure round.

    Held by an engine across its rounds. An entry belongs to the session that sent it: a
    node that joined again (a new session, a restarted client) has lost the secrets, so
    its old entry is never used. :meth:`take` removes what it returns, so a set of keys
    serves one round at most, whether or not that round completes.
    """

    def __init__(self) -> None:
        self._keys: dict[int, tuple[NodeSession, PublicKeys]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def put(self, session: NodeSession, keys: PublicKeys) -> None:
        """``session``'s keys for its next secure round (replacing any it sent before)."""
        self._keys[session.node_id] = (session, keys)

    def take(self, session: NodeSession) -> PublicKeys | None:
        """``session``'s keys sent ahead, removed; None if it sent none (or another session
        of the node did)."""
        entry = self._keys.pop(session.node_id, None)
        if entry is None or entry[0] is not session:
            return None
        return entry[1]


class SecureRound:
    """SecAgg+ among one cohort: only the survivors' sum is ever unmasked.

    Raises
    ------
    SecAggError
        From the constructor, if the cohort cannot run it (too small to share secrets).
    """

    def __init__(
        self,
        settings: SecureSettings,
        round_id: int,
        cohort: Sequence[NodeSession],
        spec: ModelSpec,
        keys_ahead: KeysAhead | None = None,
    ) -> None:
        self.params = round_params(settings, round_id, [s.node_id for s in cohort])
        self._ddp = settings.ddp
        self.ddp = settings.ddp.round_params(settings.ring_bits) if settings.ddp else None
        self.setup = setup_to_proto(self.params, settings, self.ddp)
        self._server = SecAggServer(self.params)
        self._cohort = list(cohort)
        self._by_id = {s.node_id: s for s in cohort}
        self._spec = spec
        self._ahead = keys_ahead
        #: The cohort's keys sent ahead for this round (taken at once: used once at most).
        self._own: dict[int, PublicKeys] = {}
        if keys_ahead is not None:
            taken = {s.node_id: keys_ahead.take(s) for s in cohort}
            self._own = {node: keys for node, keys in taken.items() if keys is not None}

    async def run(
        self,
        stage: StageTasks,
        masked_fit: StageTasks,
        enter: Callable[[Phase], None] = lambda phase: None,
    ) -> tuple[Weights, float]:
        """The stages in order; the survivors' mean update and its total weight.

        ``masked_fit`` hands out the fit tasks (the engine's broadcast and fit); ``enter``
        hears of the secure phases (a synchronous round's phase clock).

        Raises
        ------
        SecAggAbortError
            If a stage leaves fewer clients than the threshold.
        """
        server, setup, by_id, own = self._server, self.setup, self._by_id, self._own
        for node, keys in sorted(own.items()):
            server.add_keys(node, keys)
        advertising = [s for s in self._cohort if s.node_id not in own]
        if advertising:
            enter(Phase.ADVERTISE)
            await stage(
                advertising,
                "advertise",
                lambda s: pb.SecAggTask(setup=setup),
                _stage_take("advertise", lambda n, r: server.add_keys(n, keys_from_proto(r.keys))),
            )
        rosters = server.close_advertise()
        enter(Phase.SHARE)

        def share_task(s: NodeSession) -> pb.SecAggTask:
            task = pb.SecAggTask(setup=setup, roster=roster_to_proto(rosters[s.node_id]))
            if s.node_id in own:
                task.own.CopyFrom(keys_to_proto(own[s.node_id]))
            return task

        await stage(
            [by_id[n] for n in rosters],
            "share",
            share_task,
            _stage_take("share", lambda n, r: server.add_shares(n, dict(r.shares))),
        )
        inboxes = server.close_sharing()
        await masked_fit(
            [by_id[n] for n in inboxes],
            "fit",
            lambda s: pb.SecAggTask(setup=setup, inbox=inboxes[s.node_id]),
            self._take_masked,
        )
        survivors, dropped = server.close_masking()
        self._require_noise(survivors)
        enter(Phase.UNMASK)
        reveal = pb.SecAggTask(
            setup=setup,
            survivors=sorted(survivors),
            dropped=sorted(dropped),
            keys_ahead=self._ahead is not None,
        )
        await stage(
            [by_id[n] for n in sorted(survivors)],
            "unmask",
            lambda s: reveal,
            _stage_take("unmask", self._take_reveal),
        )
        if self.ddp is None:
            total = await asyncio.to_thread(server.finish)
            return mean_of_sum(total, self._spec, setup)
        ring = await asyncio.to_thread(server.finish_ring)
        return self._noised_mean(ring), float(len(survivors))

    def _take_reveal(self, node: int, result: pb.SecAggResult) -> None:
        """A survivor's revealed shares, and the keys it sent ahead for its next round.

        Keys that are not well-formed are ignored (the node advertises next time): they
        must not cost this round the node's shares.
        """
        self._server.add_reveal(node, dict(result.revealed))
        if self._ahead is None or not result.HasField("keys"):
            return
        try:
            keys = keys_from_proto(result.keys)
        except SecAggError:
            return
        self._ahead.put(self._by_id[node], keys)

    def _require_noise(self, survivors: frozenset[int]) -> None:
        """Abort before unmasking a sum that carries less noise than distributed DP planned."""
        if self._ddp is not None and len(survivors) < self._ddp.min_survivors:
            raise SecAggAbortError(
                SecAggStage.MASK,
                f"run {self.params.run_id}, round {self.params.round}, stage mask: "
                f"{len(survivors)} survivors, fewer than privacy.min_survivors "
                f"{self._ddp.min_survivors} whose noise distributed DP accounts for",
            )

    def _noised_mean(self, ring: npt.NDArray[np.unsignedinteger]) -> Weights:
        """The decoded noised sum divided by the fixed public denominator, per tensor."""
        assert self.ddp is not None and self._ddp is not None
        try:
            total = self.ddp.decode_sum(ring)
        except DistributedDpError as exc:
            raise SecAggError(f"distributed DP: {exc}") from exc
        total /= self._ddp.denominator
        return split_flat(total, self._spec)

    async def _take_masked(self, task: TaskRecord, outcome: Outcome) -> Outcome:
        payload, outcome.payload = outcome.payload, None
        try:
            if not isinstance(payload, MaskedVector):
                raise SecAggError("a masked fit result without its masked vector")
            await asyncio.to_thread(self._server.add_masked, task.node_id, payload.vector)
        except SecAggError as rejected:
            outcome.status, outcome.reason = "rejected", str(rejected)
        return outcome


def _stage_take(kind: str, accept: Callable[[int, pb.SecAggResult], None]) -> TakeResult:
    """Feed a stage result to ``accept``; a malformed one rejects its node."""

    async def take(task: TaskRecord, outcome: Outcome) -> Outcome:
        payload, outcome.payload = outcome.payload, None
        try:
            if not isinstance(payload, StageResult):
                raise SecAggError(f"{kind} result without secure-aggregation content")
            accept(task.node_id, payload.result)
        except SecAggError as rejected:
            outcome.status, outcome.reason = "rejected", str(rejected)
        return outcome

    return take


def round_params(settings: SecureSettings, number: int, cohort: list[int]) -> SecAggParams:
    """This round's parameters for the selected ``cohort`` (node ids)."""
    n = len(cohort)
    if settings.degree == "full":
        degree = n - 1
    elif settings.degree == "auto":
        degree = recommended_degree(n)
    else:
        degree = settings.degree
    holders = graph_degree(n, degree) + 1  # the neighbours and the client itself
    threshold = min(holders, max(2, math.ceil(settings.threshold * holders)))
    return SecAggParams(
        run_id=settings.run_id,
        round=number,
        cohort=tuple(sorted(cohort)),
        threshold=threshold,
        degree=degree,
        graph_seed=os.urandom(32),
        clip=settings.clip,
        ring_bits=settings.ring_bits,
    )


def setup_to_proto(
    params: SecAggParams, settings: SecureSettings, ddp: DistributedDpParams | None = None
) -> pb.SecAggSetup:
    """The parameters as every stage task carries them."""
    return pb.SecAggSetup(
        ddp=ddp_to_proto(ddp) if ddp is not None else None,
        cohort=list(params.cohort),
        threshold=params.threshold,
        degree=params.degree,
        graph_seed=params.graph_seed,
        clip=params.clip,
        ring_bits=params.ring_bits,
        max_examples=settings.max_examples,
        low_rank=settings.low_rank,
        low_rank_min_elements=settings.low_rank_min_elements,
    )


def ddp_to_proto(ddp: DistributedDpParams) -> pb.DistributedDp:
    """Distributed DP's round parameters on the wire (the ring's bits travel in the setup)."""
    return pb.DistributedDp(
        clip_norm=ddp.clip_norm,
        granularity=ddp.granularity,
        noise_stddev=ddp.noise_stddev,
        rounding_bound=ddp.rounding_bound,
        dimension=ddp.dimension,
        rotation_seed=ddp.rotation_seed,
        min_survivors=ddp.min_survivors,
    )


def split_flat(flat: npt.NDArray[np.float64], spec: ModelSpec) -> Weights:
    """A flat vector in model order, as one array per tensor."""
    out: Weights = {}
    offset = 0
    for tensor in spec:
        size = int(np.prod(tensor.shape, dtype=np.int64))
        out[tensor.name] = flat[offset : offset + size].reshape(tensor.shape)
        offset += size
    return out


def keys_to_proto(keys: PublicKeys) -> pb.PublicKeys:
    """A client's advertised public keys on the wire."""
    return pb.PublicKeys(encrypt=keys.encrypt, mask=keys.mask)


def keys_from_proto(message: pb.PublicKeys) -> PublicKeys:
    """Public keys from the wire (their length is checked by the protocol classes)."""
    return PublicKeys(encrypt=bytes(message.encrypt), mask=bytes(message.mask))


def mean_of_sum(
    total: npt.NDArray[np.float64], spec: ModelSpec, setup: pb.SecAggSetup
) -> tuple[Weights, float]:
    """Split the unmasked sum into per-tensor weighted sums divided by the total weight.

    The last element of a secure-aggregation vector is the client's weight, so the last
    element of the sum is the cohort's total weight.
    """
    weight = float(total[-1])
    if not weight > 0:
        raise ValueError(f"the survivors' total weight is {weight}")
    projection = projection_of(setup)
    if projection is not None:
        return dict(projection.lift(total[:-1] / weight, spec)), weight
    mean: Weights = {}
    offset = 0
    for tensor in spec:
        size = int(np.prod(tensor.shape, dtype=np.int64))
        mean[tensor.name] = (total[offset : offset + size] / weight).reshape(tensor.shape)
        offset += size
    return mean, weight


def roster_to_proto(roster: Mapping[int, PublicKeys]) -> dict[int, pb.PublicKeys]:
    """A client's neighbours' keys, for its share task."""
    return {node: keys_to_proto(keys) for node, keys in roster.items()}
