"""What server and client agree on about compressing an upload."""

from __future__ import annotations

from dataclasses import dataclass

from geofl.protocols.codecs import DEFAULT_MIN_BYTES, Chain, CompressionRules


@dataclass(frozen=True)
class UploadPlan:
    """How a client compresses one fit upload (chosen per client by the server).

    Attributes
    ----------
    chain
        Codec steps for every float tensor of at least ``min_bytes`` bytes.
    min_bytes
        Smaller tensors (biases, norms) travel uncompressed.
    error_feedback
        Keep what compression dropped and add it to the next update.
    max_staleness
        Reset the error-feedback residual when the client's previous fit is more
        than this many rounds old (the residual belongs to a model long gone).
    """

    chain: Chain
    min_bytes: int = DEFAULT_MIN_BYTES
    error_feedback: bool = False
    max_staleness: int = 10

    @property
    def rules(self) -> CompressionRules:
        """Per-tensor chain selection for this plan."""
        return CompressionRules(self.chain, self.min_bytes)


__all__ = ["UploadPlan"]
