"""What a fit's update must be for the server to keep it: the rules, stated once.

An update reaches the server two ways: streamed by a node over gRPC
(:mod:`geofl.server.transport.servicer`, which checks every tensor as its chunks arrive)
or handed over whole by a simulated client (:mod:`geofl.server.simulation.fleet`). Both
apply the rules here, so a rule, and the reason a refusal gives, cannot drift apart:

* the fit reports ``0 < num_examples <= MAX_NUM_EXAMPLES`` (:func:`check_num_examples`;
  E104; the header's other figures are bounded in :mod:`geofl.server.nodes.bounds`);
* the upload announces at most twice the model's size plus codec slack
  (:func:`announced_size`; E105);
* each tensor is the model's next one, by name, dtype and shape, its payload within twice
  its size plus slack, all of them within the announced size (:func:`delta_check`; E105);
* raw floating-point values are finite (E106);
* no tensor of the model is missing (E104: the sender stopped early).

A streamed tensor's codec chain is parsed against the codec registry by the assembler, with
the stream's other wire checks (E104); a simulated client's chain is the server's own plan.

Compressed tensors are decoded, and their values checked, by the codec when they are read
(:func:`geofl.protocols.codecs.decode_tensor`); checking them here would cost a decode
pass on every upload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from geofl.protocols.codecs import Chain
from geofl.protocols.errors import ProtocolError, TensorError
from geofl.protocols.tensor_checks import TensorCheck, payload_limit
from geofl.protocols.tensors import ModelSpec, TensorSpec, model_bytes
from geofl.server.nodes.bounds import MAX_NUM_EXAMPLES

__all__ = [
    "HeldTensor",
    "announced_size",
    "check_fit",
    "check_held",
    "check_num_examples",
    "delta_check",
]


class HeldTensor(Protocol):
    """One tensor of an update held in memory: raw little-endian bytes or a codec payload."""

    @property
    def payload(self) -> bytes:
        """The bytes as uploaded."""

    @property
    def dtype(self) -> str:
        """The decoded tensor's dtype (numpy name)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The decoded tensor's shape."""

    @property
    def chain(self) -> Chain:
        """The codec chain of the payload; empty for raw bytes."""


def check_num_examples(num_examples: int) -> None:
    """Refuse a fit that trained on nothing (no weight, or a negative one) or on more
    examples than the database can record (a weight that would swamp the aggregate).

    Raises
    ------
    ProtocolError
        If ``num_examples`` is not in ``1..MAX_NUM_EXAMPLES``.
    """
    if not 0 < num_examples <= MAX_NUM_EXAMPLES:
        raise ProtocolError(
            f"a fit result must report 1 <= num_examples <= {MAX_NUM_EXAMPLES}, got {num_examples}"
        )


def announced_size(announced: int, spec: ModelSpec) -> int:
    """The payload bytes an update may take: as announced (0: the model's raw size).

    The receiver stages this many bytes before the first arrives, so an announcement over
    :func:`~geofl.protocols.tensor_checks.payload_limit` of the model is refused outright.

    Raises
    ------
    TensorError
        If ``announced`` is over the limit for ``spec``.
    """
    size = model_bytes(spec)
    allowed = announced or size
    if allowed > payload_limit(size):
        raise TensorError(f"an upload of {allowed} bytes for a {size}-byte model")
    return allowed


def delta_check(expected: ModelSpec, size: int) -> TensorCheck:
    """The per-tensor rules of a DELTA update: ``expected`` in order, ``size`` bytes, finite.

    ``expected`` is the model in the order the client sends it (a partial-sync upload
    streams its layer groups in turn); ``size`` comes from :func:`announced_size`.
    """
    return TensorCheck(expected, max_total_bytes=size, check_finite=True)


def check_held(tensors: Mapping[str, HeldTensor], check: TensorCheck) -> None:
    """Pass an update held in memory through ``check``, as a stream of it would be.

    Raises
    ------
    ProtocolError
        The subclass and message a stream of the same tensors would get; also when a raw
        tensor's bytes are not its dtype and shape's size.
    """
    for name, item in tensors.items():
        spec = TensorSpec(name, item.dtype, item.shape)
        payload = TensorSpec(name, "uint8", (len(item.payload),)) if item.chain else spec
        if payload is spec and len(item.payload) != spec.nbytes:
            raise ProtocolError(f"tensor {name!r}: {len(item.payload)} of {spec.nbytes} bytes sent")
        check.begin(spec, payload)
        check.values(payload, item.payload)
    check.finish()


def check_fit(
    num_examples: int, payload_bytes: int, tensors: Mapping[str, HeldTensor], expected: ModelSpec
) -> None:
    """Every rule, for a fit result held in memory (a simulated client's).

    Parameters
    ----------
    num_examples
        What the client reports it trained on.
    payload_bytes
        The update's size as uploaded (what a node announces in its upload header).
    tensors
        The update, in the order it was sent.
    expected
        The model's tensors in the order they must be sent.

    Raises
    ------
    ProtocolError
        The subclass (:class:`TensorError`, :class:`NonFiniteError`, ...) and message the
        servicer gives a node that uploads the same result.
    """
    check_num_examples(num_examples)
    check_held(tensors, delta_check(expected, announced_size(payload_bytes, expected)))
