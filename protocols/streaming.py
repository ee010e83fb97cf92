"""Streaming DiLoCo (Douillard et al., 2025): what client and server agree on.

The model is cut into ``P`` fragments, each synchronized every ``H`` inner steps, the
fragments staggered by ``H / P`` steps: a geofl round is one fragment's outer step, and
its fit task trains the round's stride of ``H / P`` steps. The round config carries

* :data:`FRAGMENT_KEY`: the tensor names of the fragment this round synchronizes (JSON);
  the client sends that fragment's outer pseudo-gradient (``local - global``) after
  ``stride - overlap`` steps and trains the last :data:`OVERLAP_KEY` steps while it
  travels; the upload holds only the fragment's tensors;
* :data:`MERGE_KEY`: the fragment the previous round synchronized (JSON, ``[]`` in the
  first round): at the start of its next fit the client mixes the arriving global values
  of those tensors into its own, ``local = alpha x local + (1 - alpha) x global``
  (:data:`ALPHA_KEY`), ``overlap`` steps after it sent them; every other tensor keeps its
  local value, since it is synchronized in its own round.

With one fragment, no overlap and ``alpha`` 0 this is plain DiLoCo: the whole model is
sent after the H steps and replaced by the global model before the next round.

This module holds the pure parts both sides need: the config keys and their checks and
the upload's tensors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from geofl.protocols import partial_sync
from geofl.protocols.errors import ProtocolError
from geofl.protocols.tensors import ModelSpec
from geofl.protocols.types import Scalar

__all__ = [
    "ALPHA_KEY",
    "FRAGMENT_KEY",
    "MERGE_KEY",
    "OVERLAP_KEY",
    "StreamingRound",
    "encode_names",
    "expected_upload",
    "fragment_spec",
    "is_streaming",
    "streaming_round",
]

#: Round config key: the tensors this round synchronizes (JSON list of names).
FRAGMENT_KEY = "streaming_fragment"
#: Round config key: the tensors the previous round synchronized, merged first (JSON list).
MERGE_KEY = "streaming_merge"
#: Round config key: inner steps trained while the fragment's upload is in flight.
OVERLAP_KEY = "streaming_overlap"
#: Round config key: weight of the local values when the global fragment is merged.
ALPHA_KEY = "streaming_alpha"


@dataclass(frozen=True)
class StreamingRound:
    """One streaming round's instructions, checked against the model."""

    fragment: tuple[str, ...]
    merge: tuple[str, ...]
    local_steps: int
    overlap: int
    alpha: float

    @property
    def steps_before_send(self) -> int:
        """Inner steps trained before the fragment's pseudo-gradient is taken."""
        return self.local_steps - self.overlap


def encode_names(names: Sequence[str]) -> str:
    """The config value for a fragment's tensor names (compact JSON)."""
    return json.dumps(list(names), separators=(",", ":"))


def is_streaming(config: Mapping[str, Scalar]) -> bool:
    """Whether a fit config is a Streaming DiLoCo round."""
    return FRAGMENT_KEY in config


def streaming_round(config: Mapping[str, Scalar], names: Sequence[str]) -> StreamingRound:
    """Parse and check a streaming round's config against the model's tensor ``names``.

    Raises
    ------
    ProtocolError
        If a key is missing or malformed, a fragment names an unknown tensor or is empty,
        or the overlap leaves no step before the fragment is sent.
    """
    fragment = _names(config, FRAGMENT_KEY, names)
    if not fragment:
        raise ProtocolError(f"config {FRAGMENT_KEY!r} names no tensor")
    merge = _names(config, MERGE_KEY, names)
    steps = _integer(config, "local_steps")
    overlap = _integer(config, OVERLAP_KEY)
    if steps < 1 or not 0 <= overlap < steps:
        raise ProtocolError(
            f"a streaming round needs local_steps >= 1 and 0 <= {OVERLAP_KEY} < local_steps, "
            f"got local_steps {steps} and {OVERLAP_KEY} {overlap}"
        )
    alpha = config.get(ALPHA_KEY)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
        raise ProtocolError(f"config {ALPHA_KEY!r} must be a number in [0, 1], got {alpha!r}")
    return StreamingRound(fragment, merge, steps, overlap, float(alpha))


def fragment_spec(spec: ModelSpec, fragment: Sequence[str]) -> ModelSpec:
    """The tensors a streaming upload carries: the fragment's, in model order."""
    wanted = set(fragment)
    return tuple(tensor for tensor in spec if tensor.name in wanted)


def expected_upload(spec: ModelSpec, config: Mapping[str, Scalar]) -> ModelSpec:
    """The tensors a fit's upload must carry, in order, for a round of ``config``.

    A streaming round's fragment; a partial-sync round's groups in turn; else the model.

    Raises
    ------
    ProtocolError
        If the config's fragment or groups do not fit the model.
    """
    names = [tensor.name for tensor in spec]
    if is_streaming(config):
        return fragment_spec(spec, _names(config, FRAGMENT_KEY, names))
    groups = partial_sync.groups_of(config, names)
    return spec if groups is None else partial_sync.upload_order(spec, groups)


def _names(config: Mapping[str, Scalar], key: str, names: Sequence[str]) -> tuple[str, ...]:
    value = config.get(key)
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"config {key!r} is not JSON: {exc}") from exc
    if not isinstance(parsed, list) or not all(isinstance(name, str) for name in parsed):
        raise ProtocolError(f"config {key!r} must be a JSON list of tensor names, got {value!r}")
    known = set(names)
    unknown = sorted(set(parsed) - known)
    if unknown:
        raise ProtocolError(f"config {key!r} names tensors the model does not have: {unknown}")
    if len(set(parsed)) != len(parsed):
        raise ProtocolError(f"config {key!r} names a tensor twice")
    return tuple(parsed)


def _integer(config: Mapping[str, Scalar], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"a streaming round needs an integer {key!r}, got {value!r}")
    return value
