"""Compression codecs for updates and broadcasts (pure NumPy, no I/O).

A :data:`Chain` of :class:`CodecStep` compresses one tensor into self-describing,
pickle-free bytes (:func:`encode_tensor`) and back (:func:`decode_tensor`); every codec
is registered by name and by a stable wire id.  See ``docs/compression.md``.
"""

from geofl.protocols.codecs import casts, lowrank, quantize, sparse
from geofl.protocols.codecs.api import decode_tensor, encode_tensor, estimate_bytes
from geofl.protocols.codecs.base import (
    UNSPECIFIED_WIRE_ID,
    Chain,
    Codec,
    CodecError,
    CodecState,
    CodecStep,
    EncodeContext,
    Param,
    Payload,
    PayloadSpec,
    chain_to_config,
    check_chain,
    codec_by_id,
    codec_by_name,
    parse_chain,
    registered_codecs,
)
from geofl.protocols.codecs.feedback import ErrorFeedback, encode_with_feedback
from geofl.protocols.codecs.rules import DEFAULT_MIN_BYTES, CompressionRules, chain_for

del casts, lowrank, quantize, sparse  # imported to register the codecs

__all__ = [
    "DEFAULT_MIN_BYTES",
    "UNSPECIFIED_WIRE_ID",
    "Chain",
    "Codec",
    "CodecError",
    "CodecState",
    "CodecStep",
    "CompressionRules",
    "EncodeContext",
    "ErrorFeedback",
    "Param",
    "Payload",
    "PayloadSpec",
    "chain_for",
    "chain_to_config",
    "check_chain",
    "codec_by_id",
    "codec_by_name",
    "decode_tensor",
    "encode_tensor",
    "encode_with_feedback",
    "estimate_bytes",
    "parse_chain",
    "registered_codecs",
]
