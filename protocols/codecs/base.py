"""The codec interface, parameter validation, the registry and chain steps.

A codec transforms a *payload* (an ordered mapping of named NumPy arrays) into
another payload; steps compose into a chain because each step only touches the
floating-point arrays it is given and names its outputs after its input plus a
step tag (``"x.s0.idx"``), so decoding runs the steps backwards unambiguously.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from geofl.protocols.errors import ProtocolError
from geofl.protocols.types import Scalar

Array = npt.NDArray[Any]
#: Named arrays in a fixed order; encoding starts from ``{"x": tensor}``.
Payload = dict[str, Array]
#: What :meth:`Codec.estimate` works on: name -> (dtype name, shape).
PayloadSpec = dict[str, tuple[str, tuple[int, ...]]]
Params = Mapping[str, Scalar]
#: Per-tensor codec state owned by the caller (e.g. PowerSGD's warm-start factor).
CodecState = dict[str, Array]

#: Wire id 0 means "unspecified" and is never registered.
UNSPECIFIED_WIRE_ID = 0
MAX_CHAIN_STEPS = 8


class CodecError(ProtocolError, ValueError):
    """A compressed payload, a codec id or codec parameters are malformed."""


@dataclass(frozen=True)
class Param:
    """Declaration of one codec parameter: type, default and allowed values."""

    kind: type[int] | type[float] | type[bool]
    default: Scalar | None = None  # None: optional without a default
    choices: tuple[Scalar, ...] | None = None
    low: float | None = None  # inclusive lower bound
    high: float | None = None  # inclusive upper bound

    def allowed(self) -> str:
        """Human description of the allowed values, for error messages."""
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        low = "-inf" if self.low is None else self.low
        high = "inf" if self.high is None else self.high
        bounds = f"{low}..{high}"
        return f"a {self.kind.__name__} in {bounds}"

    def check(self, codec: str, name: str, value: Scalar) -> Scalar:
        """Return ``value`` converted to this parameter's type, or raise."""
        ok_type = isinstance(value, self.kind) and not (
            self.kind is not bool and isinstance(value, bool)
        )
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok_type = float(value), True
        if not ok_type:
            raise CodecError(
                f"codec {codec!r}: parameter {name!r} must be {self.allowed()}, got {value!r}"
            )
        in_range = (self.choices is None or value in self.choices) and not (
            isinstance(value, float) and not math.isfinite(value)
        )
        if isinstance(value, int | float) and not isinstance(value, bool):
            too_low = self.low is not None and value < self.low
            too_high = self.high is not None and value > self.high
            in_range = in_range and not (too_low or too_high)
        if not in_range:
            raise CodecError(
                f"codec {codec!r}: parameter {name!r} must be {self.allowed()}, got {value!r}"
            )
        return value


@dataclass(frozen=True)
class EncodeContext:
    """What one encoding step may use besides the payload: randomness, state, tag."""

    rng: np.random.Generator
    state: CodecState | None
    tag: str


class Codec(ABC):
    """One compression algorithm, registered by ``name`` and by ``wire_id``.

    ``linear`` says whether decoding is linear in the transmitted numbers once the
    side information (scales, index seed) is shared by every client, so that a
    masked sum decodes to the sum of the updates (see ``docs/compression.md``).
    ``reshapes`` marks sparsifiers and factorizations, which must come before the
    value codecs (casts, quantizers) in a chain.
    """

    name: ClassVar[str]
    wire_id: ClassVar[int]
    linear: ClassVar[bool]
    reshapes: ClassVar[bool] = False
    params_spec: ClassVar[Mapping[str, Param]] = MappingProxyType({})

    def validate(self, params: Params) -> dict[str, Scalar]:
        """Normalized parameters (defaults filled in); :class:`CodecError` otherwise."""
        unknown = sorted(set(params) - set(self.params_spec))
        if unknown:
            raise CodecError(
                f"codec {self.name!r}: unknown parameter {unknown[0]!r}; "
                f"allowed: {sorted(self.params_spec)}"
            )
        normalized: dict[str, Scalar] = {}
        for key, spec in self.params_spec.items():
            if key in params:
                normalized[key] = spec.check(self.name, key, params[key])
            elif spec.default is not None:
                normalized[key] = spec.default
        self.check_combination(normalized)
        return normalized

    def check_combination(self, params: dict[str, Scalar]) -> None:
        """Hook for rules that involve several parameters (default: none)."""
        del params

    @abstractmethod
    def encode(self, data: Payload, params: Params, ctx: EncodeContext) -> Payload:
        """Transform ``data``; arrays that are not this codec's input pass through."""

    @abstractmethod
    def decode(self, data: Payload, params: Params, tag: str) -> Payload:
        """Invert :meth:`encode` for the arrays tagged ``tag``; reject what is malformed."""

    @abstractmethod
    def estimate(self, spec: PayloadSpec, params: Params, tag: str) -> PayloadSpec:
        """The payload layout after this step (sizes exact, or an upper bound)."""


_BY_NAME: dict[str, Codec] = {}
_BY_ID: dict[int, Codec] = {}


def register(cls: type[Codec]) -> type[Codec]:
    """Class decorator adding a codec to the registry; names and ids must be unique."""
    if cls.wire_id <= UNSPECIFIED_WIRE_ID or cls.wire_id > 255:
        raise ValueError(f"codec {cls.name!r}: wire id must be in 1..255, got {cls.wire_id}")
    if cls.name in _BY_NAME or cls.wire_id in _BY_ID:
        raise ValueError(f"codec {cls.name!r} (id {cls.wire_id}) clashes with a registered one")
    instance = cls()
    _BY_NAME[cls.name] = instance
    _BY_ID[cls.wire_id] = instance
    return cls


def registered_codecs() -> tuple[Codec, ...]:
    """Every registered codec, by wire id."""
    return tuple(_BY_ID[key] for key in sorted(_BY_ID))


def codec_by_name(name: str) -> Codec:
    """The codec registered as ``name``; :class:`CodecError` naming the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise CodecError(f"unknown codec {name!r}; known codecs: {sorted(_BY_NAME)}") from None


def codec_by_id(wire_id: int) -> Codec:
    """The codec with wire id ``wire_id``; :class:`CodecError` if none is registered."""
    try:
        return _BY_ID[wire_id]
    except KeyError:
        raise CodecError(f"unknown codec id {wire_id}; known ids: {sorted(_BY_ID)}") from None


@dataclass(frozen=True)
class CodecStep:
    """One configured step of a chain; ``params`` are validated and normalized."""

    name: str
    params: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        normalized = codec_by_name(self.name).validate(self.params)
        object.__setattr__(self, "params", MappingProxyType(normalized))

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params.items()))))

    def __reduce__(self) -> tuple[type[CodecStep], tuple[str, dict[str, Scalar]]]:
        """Rebuild from name and plain params: a read-only mapping cannot be pickled, and
        the virtual clock's worker processes receive chains over their local pipes."""
        return (type(self), (self.name, dict(self.params)))

    @property
    def codec(self) -> Codec:
        """The registered codec of this step."""
        return codec_by_name(self.name)

    @classmethod
    def from_wire(cls, wire_id: int, params: Params) -> CodecStep:
        """The step a peer announced by wire id; :class:`CodecError` if unknown or invalid."""
        return cls(codec_by_id(wire_id).name, params)


#: A chain of steps applied in order on encode and in reverse on decode.
Chain = tuple[CodecStep, ...]


def check_chain(chain: Chain) -> None:
    """Reject chains that cannot be decoded unambiguously or are too long."""
    if len(chain) > MAX_CHAIN_STEPS:
        raise CodecError(f"a chain has at most {MAX_CHAIN_STEPS} steps, got {len(chain)}")
    seen_value_codec = None
    for step in chain:
        codec = step.codec
        if codec.reshapes and seen_value_codec is not None:
            raise CodecError(
                f"codec {codec.name!r} must come before value codec {seen_value_codec!r}: "
                "sparsify or factorize first, then cast or quantize"
            )
        if not codec.reshapes and codec.name != "none":
            seen_value_codec = codec.name


def parse_chain(config: object) -> Chain:
    """A chain from its configuration form.

    Accepts ``None`` (no compression), a codec name, a ``{name: {params}}`` mapping,
    or a list of those, e.g. ``[{"topk": {"ratio": 0.01}}, {"qsgd": {"bits": 8}}]``.
    """
    if config is None:
        return ()
    items = config if isinstance(config, list | tuple) else [config]
    steps: list[CodecStep] = []
    for item in items:
        if isinstance(item, str):
            steps.append(CodecStep(item))
        elif isinstance(item, Mapping) and len(item) == 1:
            ((name, params),) = item.items()
            if not isinstance(name, str) or not isinstance(params, Mapping | None):
                raise CodecError(f"a chain step must be {{name: {{params}}}}, got {item!r}")
            steps.append(CodecStep(name, dict(params or {})))
        else:
            raise CodecError(f"a chain step must be a name or {{name: {{params}}}}, got {item!r}")
    chain = tuple(steps)
    check_chain(chain)
    return chain


def chain_to_config(chain: Chain) -> list[dict[str, dict[str, Scalar]]]:
    """The configuration form of ``chain`` (inverse of :func:`parse_chain`)."""
    return [{step.name: dict(step.params)} for step in chain]
