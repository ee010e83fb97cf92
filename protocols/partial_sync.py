"""Layer-wise partial synchronization: what client and server agree on (DreamDDP-style).

In a partial-sync round the client's H local steps are cut into ``N`` segments, one per
layer group. After segment ``k`` the tensors of group ``k`` are frozen into the upload
and sent while segments ``k+1 ... N`` train, so only the last group's transfer waits
for the computation to end. The group order travels in the fit task's config under
:data:`CONFIG_KEY` as a JSON list of lists of tensor names; every tensor is in exactly
one group, and the upload streams the tensors in that order.

This module holds the pure parts both sides need: the config encoding and its checks,
how H steps split into segments, the wire order of the tensors, and the time a
pipelined upload ends (which the simulator charges).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from geofl.protocols.errors import ProtocolError
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Scalar

__all__ = [
    "CONFIG_KEY",
    "KEEP_LOCAL_KEY",
    "SEGMENT_KEY",
    "STEPS_KEY",
    "Groups",
    "check_cover",
    "decode_groups",
    "encode_groups",
    "groups_of",
    "keeps_local",
    "pipelined_upload_end",
    "segment_steps",
    "segments_of",
    "tail_segments",
    "upload_order",
]

#: Round config key holding the group order (JSON).
CONFIG_KEY = "partial_sync"
#: Round config key telling a segmented fit which segment it is (0 = a new round).
SEGMENT_KEY = "sync_segment"
#: Round config key: whether clients keep what a layer learns after it was sent.
KEEP_LOCAL_KEY = "sync_keep_local"
#: Round config key: local steps of each segment (JSON list); absent = an even split.
STEPS_KEY = "sync_steps"

#: Tensor names per group, in the order they are synchronized.
Groups = tuple[tuple[str, ...], ...]


def encode_groups(groups: Sequence[Sequence[str]]) -> str:
    """The config value for ``groups`` (compact JSON)."""
    return json.dumps([list(group) for group in groups], separators=(",", ":"))


def decode_groups(value: Scalar, names: Sequence[str]) -> Groups:
    """Parse and check a config value against the model's tensor ``names``.

    Raises
    ------
    ProtocolError
        If the value is not a JSON list of non-empty lists of names, names a tensor the
        model does not have or twice, or leaves a tensor out (it would never be synced).
    """
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"config {CONFIG_KEY!r} is not JSON: {exc}") from exc
    if not isinstance(parsed, list) or not all(
        isinstance(group, list) and group and all(isinstance(n, str) for n in group)
        for group in parsed
    ):
        raise ProtocolError(f"config {CONFIG_KEY!r} must be a list of non-empty name lists")
    groups: Groups = tuple(tuple(group) for group in parsed)
    check_cover(groups, names)
    return groups


def check_cover(groups: Groups, names: Sequence[str]) -> None:
    """Every tensor of the model in exactly one group, and nothing else."""
    seen: dict[str, int] = {}
    for index, group in enumerate(groups):
        for name in group:
            if name in seen:
                raise ProtocolError(f"tensor {name!r} is in sync groups {seen[name]} and {index}")
            seen[name] = index
    unknown = sorted(set(seen) - set(names))
    if unknown:
        raise ProtocolError(f"sync groups name tensors the model does not have: {unknown}")
    never = [name for name in names if name not in seen]
    if never:
        raise ProtocolError(f"the sync groups never synchronize tensors {never}")


def groups_of(config: Mapping[str, Scalar], names: Sequence[str]) -> Groups | None:
    """The checked groups of a round config, or None for a whole-model round."""
    value = config.get(CONFIG_KEY)
    return None if value is None else decode_groups(value, names)


def keeps_local(config: Mapping[str, Scalar]) -> bool:
    """Whether the round asks clients to keep their unsent progress (default yes)."""
    return config.get(KEEP_LOCAL_KEY, True) is not False


def segment_steps(local_steps: int, segments: int) -> list[int]:
    """Split ``local_steps`` into ``segments`` near-equal positive counts (earlier ones larger).

    Raises
    ------
    ValueError
        If there are fewer steps than segments (a segment would train nothing).
    """
    if segments < 1 or local_steps < segments:
        raise ValueError(
            f"{local_steps} local steps cannot be split into {segments} sync segments "
            "(each needs at least one step)"
        )
    base, extra = divmod(local_steps, segments)
    return [base + (1 if k < extra else 0) for k in range(segments)]


def tail_segments(local_steps: int, segments: int, tail_steps: int) -> list[int]:
    """One long first segment, then ``tail_steps`` per segment: sync points near the end.

    A group sent after step ``p`` carries only the first ``p`` steps' progress of its
    layers (the rest waits for the client's next upload), so sync points are put as
    late as the transfers allow: each later segment gives the previous group
    ``tail_steps`` steps of computation to hide behind.

    Raises
    ------
    ValueError
        If the tail leaves the first segment without a step.
    """
    first = local_steps - (segments - 1) * tail_steps
    if segments < 1 or tail_steps < 1 or first < 1:
        raise ValueError(
            f"{segments} sync segments with {tail_steps} tail steps each do not fit in "
            f"{local_steps} local steps"
        )
    return [first] + [tail_steps] * (segments - 1)


def segments_of(config: Mapping[str, Scalar], local_steps: int, segments: int) -> list[int]:
    """The round's steps per segment: the config's ``sync_steps``, else an even split.

    Raises
    ------
    ProtocolError
        If ``sync_steps`` is not a list of ``segments`` positive integers summing to
        ``local_steps``.
    """
    value = config.get(STEPS_KEY)
    if value is None:
        return segment_steps(local_steps, segments)
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"config {STEPS_KEY!r} is not JSON: {exc}") from exc
    steps = [n for n in parsed if _positive_int(n)] if isinstance(parsed, list) else []
    if not isinstance(parsed, list) or len(steps) != len(parsed) or len(steps) != segments:
        steps = []
    if not steps or sum(steps) != local_steps:
        raise ProtocolError(
            f"config {STEPS_KEY!r} must list {segments} positive step counts summing to "
            f"local_steps {local_steps}, got {value!r}"
        )
    return steps


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def upload_order(spec: ModelSpec, groups: Groups) -> ModelSpec:
    """The model's tensors in the order a partial-sync upload streams them."""
    by_name = {tensor.name: tensor for tensor in spec}
    check_cover(groups, list(by_name))
    return tuple(by_name[name] for group in groups for name in group)


def pipelined_upload_end(ready_at: Sequence[float], transfer_s: Sequence[float]) -> float:
    """When the last group has arrived, with one sender sending groups in order.

    Group ``k`` is ready at ``ready_at[k]`` (its segment ended) and occupies the uplink
    for ``transfer_s[k]``; it starts when both it is ready and the previous group is
    through.
    """
    if len(ready_at) != len(transfer_s):
        raise ValueError("one ready time per transfer")
    end = 0.0
    for ready, transfer in zip(ready_at, transfer_s, strict=True):
        end = max(end, ready) + transfer
    return end
