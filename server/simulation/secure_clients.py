"""Secure aggregation on the virtual clock: each virtual client's SecAgg+ side, in process.

A virtual client answers the key-exchange and unmasking tasks (advertise, share, unmask)
with the very :class:`~geofl.client.secure_rounds.SecureRounds` a networked client runs,
one per node, and masks its fit's update with it before the update "travels": the round
engine and the SecAgg+ server see exactly what a gRPC client would send (a masked ring
vector), only without the sockets. The simulated time of a stage task is one round trip
of the client's link carrying the stage's message.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from geofl.client.secure_rounds import SecureRounds
from geofl.protocols.errors import GeoflError
from geofl.protocols.tensors import Difference, ModelSpec
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.nodes.outcomes import MaskedVector, Outcome, StageResult
from geofl.server.nodes.registry import TaskRecord

__all__ = ["SECURE_STAGES", "VirtualSecureClients"]

#: The task kinds of SecAgg+'s stages other than the masked fit.
SECURE_STAGES = ("advertise", "share", "unmask")

_KIND = {
    "fit": pb.TASK_KIND_FIT,
    "advertise": pb.TASK_KIND_SECAGG_ADVERTISE,
    "share": pb.TASK_KIND_SECAGG_SHARE,
    "unmask": pb.TASK_KIND_SECAGG_UNMASK,
}


class VirtualSecureClients:
    """The SecAgg+ state of every virtual client of one run."""

    def __init__(self, run_id: int, spec: ModelSpec) -> None:
        self._run_id = run_id
        self._spec = spec
        self._rounds: dict[int, SecureRounds] = {}

    def _of(self, node_id: int) -> SecureRounds:
        return self._rounds.setdefault(node_id, SecureRounds())

    def message(self, task: TaskRecord) -> pb.Task:
        """The task as the servicer would send it (the parts SecureRounds reads)."""
        message = pb.Task(
            kind=_KIND[task.kind], task_id=task.task_id, run_id=self._run_id, round=task.round
        )
        if task.secagg is not None:
            message.secagg.CopyFrom(task.secagg)
        return message

    def answer(self, node_id: int, task: TaskRecord) -> Outcome:
        """The client's answer to a stage task (``failed`` if its protocol refuses)."""
        message = self.message(task)
        rounds = self._of(node_id)
        try:
            if task.kind == "advertise":
                result = rounds.advertise(message, node_id)
            elif task.kind == "share":
                result = rounds.share(message)
            else:
                result = rounds.unmask(message)
        except GeoflError as exc:
            return Outcome("failed", f"secure aggregation: {exc}")
        return Outcome("ok", payload=StageResult(result), bytes_up=result.ByteSize())

    def mask(
        self,
        node_id: int,
        task: TaskRecord,
        delta: Mapping[str, npt.NDArray[np.generic]],
        num_examples: int,
    ) -> MaskedVector:
        """The fit's update masked as the client would upload it."""
        differences = {
            t.name: Difference(delta[t.name], np.zeros(t.shape, dtype=t.dtype)) for t in self._spec
        }
        vector = self._of(node_id).mask(self.message(task), differences, num_examples)
        return MaskedVector(vector)
