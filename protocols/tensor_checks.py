"""What each received tensor must be: the rules written once, for streams and for updates in memory.

A tensor stream (:class:`geofl.protocols.streams.Assembler`) and an update already held in
memory (a simulated client's) are checked by the same :class:`TensorCheck`, so each rule,
and the reason given when it is broken, exists in one place. The check sees what a tensor
announces (its decoded specification and that of the bytes carrying it) and those bytes, a
piece at a time; the faults only a stream can have (chunk order, offsets, CRC-32) are the
assembler's.
"""

from __future__ import annotations

import numpy as np

from geofl.protocols.errors import NonFiniteError, TensorError, TruncatedStreamError
from geofl.protocols.tensors import ModelSpec, TensorSpec

#: Slack allowed for a compressed payload over twice its decoded size (codec headers,
#: top-k indices).
PAYLOAD_SLACK = 64 << 10


def payload_limit(nbytes: int) -> int:
    """The most bytes a payload carrying ``nbytes`` of decoded tensor data may take.

    Codecs shrink tensors, but their headers and index sets can make a small one larger
    than raw; twice the raw size plus :data:`PAYLOAD_SLACK` bounds every honest payload,
    so a peer cannot make the receiver stage arbitrary amounts for a small model.
    """
    return 2 * nbytes + PAYLOAD_SLACK


class TensorCheck:
    """The rules every tensor of one stream or update passes, in the order they arrive.

    Parameters
    ----------
    expected
        The tensors, in the order they must arrive (``None``: any tensors).
    max_total_bytes
        The most payload bytes all the tensors together may take.
    check_finite
        Whether raw floating-point values must be finite. Encoded values are checked where
        they are decoded (:func:`geofl.protocols.codecs.decode_tensor`), because a check
        here would need a decode pass of its own.
    """

    def __init__(
        self,
        expected: ModelSpec | None = None,
        *,
        max_total_bytes: int = 1 << 40,
        check_finite: bool = False,
    ) -> None:
        self._expected = expected
        self._max_total = max_total_bytes
        self._check_finite = check_finite
        self._received: list[TensorSpec] = []
        #: Decoded bytes of the tensors announced so far.
        self.total_bytes = 0
        #: Payload bytes of the tensors announced so far (what travels).
        self.payload_bytes = 0

    def begin(self, spec: TensorSpec, payload: TensorSpec) -> None:
        """A tensor announces itself: ``spec`` once decoded, carried as ``payload``.

        Raises
        ------
        TensorError
            If the payload is too large for the tensor, the tensor is not the next one
            expected, or the tensors so far exceed ``max_total_bytes``.
        """
        size = spec.nbytes
        carried = size if payload is spec else payload.nbytes
        if carried > payload_limit(size):
            raise TensorError(
                f"tensor {spec.name!r}: {carried}-byte payload for a {size}-byte tensor"
            )
        self._check_next(spec)
        self.total_bytes += size
        self.payload_bytes += carried
        if self.payload_bytes > self._max_total:
            raise TensorError(f"tensors exceed the limit of {self._max_total} bytes")
        self._received.append(spec)

    def _check_next(self, spec: TensorSpec) -> None:
        if self._expected is None:
            return
        index = len(self._received)
        if index >= len(self._expected):
            raise TensorError(f"unexpected extra tensor {spec.name!r}")
        if self._expected[index] != spec:
            raise TensorError(f"expected {self._expected[index].describe()}, got {spec.describe()}")

    def values(self, payload: TensorSpec, data: bytes | memoryview) -> None:
        """The next piece of the current tensor's payload, whole elements of ``payload.dtype``.

        Raises
        ------
        NonFiniteError
            If the values are checked, raw floating point, and one is NaN or infinite.
        """
        if not self._check_finite or np.dtype(payload.dtype).kind != "f":
            return
        if not np.isfinite(np.frombuffer(data, dtype=payload.dtype)).all():
            raise NonFiniteError(f"tensor {payload.name!r} holds NaN or Inf values")

    def finish(self) -> ModelSpec:
        """The tensors received, once every expected one has been.

        Raises
        ------
        TruncatedStreamError
            If expected tensors never came (the sender stopped early).
        """
        if self._expected is not None and len(self._received) != len(self._expected):
            missing = [t.name for t in self._expected[len(self._received) :]]
            raise TruncatedStreamError(f"stream ended before tensors {missing}")
        return tuple(self._received)


__all__ = ["PAYLOAD_SLACK", "TensorCheck", "payload_limit"]
