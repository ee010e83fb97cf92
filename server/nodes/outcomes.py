"""What became of a task: a status, the figures reported, and one typed payload.

The payload says what the node sent back, one class per kind, so a reader matches on it
instead of testing attributes::

    match outcome.payload:
        case DeltaUpdate(tensors=update): ...   # a plain fit: the update to fold
        case MaskedVector(vector=masked): ...   # a fit under secure aggregation
        case StageResult(result=result): ...    # advertise, share or unmask
        case MessageReply(): ...                # a Flower message task's reply
        case None: ...                          # evaluation, or no result at all
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from geofl.protocols.secagg import RingArray
from geofl.protocols.types import Scalar, Weights
from geofl.protocols.v1 import geofl_pb2 as pb

OutcomeStatus = Literal["ok", "failed", "rejected", "late", "dropped"]


def _nothing_to_free() -> None:
    return None


@dataclass(frozen=True)
class DeltaUpdate:
    """A fit's update (new - global), decoded lazily; ``close`` frees its staging."""

    tensors: Mapping[str, npt.NDArray[np.generic]]
    close: Callable[[], None] = _nothing_to_free


@dataclass(frozen=True)
class MaskedVector:
    """A fit's masked ring vector under secure aggregation (its weighted update, masked)."""

    vector: RingArray


@dataclass(frozen=True)
class StageResult:
    """What a secure-aggregation stage task (advertise, share, unmask) returned."""

    result: pb.SecAggResult


@dataclass(frozen=True)
class MessageReply:
    """What a client sent back for a message task: its wire content and arrays."""

    content: pb.FlowerContent
    tensors: Weights


Payload = DeltaUpdate | MaskedVector | StageResult | MessageReply


@dataclass
class Outcome:
    """What became of one task: a result, or the reason there is none."""

    status: OutcomeStatus
    reason: str | None = None
    num_examples: int = 0
    loss: float | None = None
    metrics: dict[str, Scalar] = field(default_factory=dict)
    payload: Payload | None = None
    compute_s: float | None = None
    bytes_up: int = 0
    #: What the upload would have cost uncompressed.
    bytes_up_raw: int = 0

    def refuse(self, status: OutcomeStatus, reason: str) -> None:
        """The result is not used: say why, and free what it holds."""
        self.status, self.reason = status, reason
        self.release()

    def release(self) -> None:
        """Free the payload (a staged update's memory or file); the figures stay."""
        if isinstance(self.payload, DeltaUpdate):
            self.payload.close()
        self.payload = None


__all__ = [
    "DeltaUpdate",
    "MaskedVector",
    "MessageReply",
    "Outcome",
    "OutcomeStatus",
    "Payload",
    "StageResult",
]
