"""Which chain compresses which tensor: a size threshold and name globs."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from geofl.protocols.codecs.base import Chain, CodecError, check_chain, parse_chain

#: Below this many bytes a tensor (bias, norm scale) travels uncompressed by default.
DEFAULT_MIN_BYTES = 4096


@dataclass(frozen=True)
class CompressionRules:
    """Per-tensor choice of chain.

    Attributes
    ----------
    default
        Chain for tensors no override matches.
    min_bytes
        Tensors smaller than this stay uncompressed whatever else matches: the
        per-tensor overhead (scales, shape, header) would eat the saving, and
        biases and norms are sensitive to noise.
    overrides
        ``(glob, chain)`` pairs, first match wins (``fnmatch`` syntax, case-sensitive).
    """

    default: Chain = ()
    min_bytes: int = DEFAULT_MIN_BYTES
    overrides: tuple[tuple[str, Chain], ...] = ()

    def __post_init__(self) -> None:
        if self.min_bytes < 0:
            raise CodecError(f"min_bytes must be >= 0, got {self.min_bytes}")
        check_chain(self.default)
        for _, chain in self.overrides:
            check_chain(chain)

    @classmethod
    def from_config(
        cls,
        default: object = None,
        *,
        min_bytes: int = DEFAULT_MIN_BYTES,
        overrides: Mapping[str, object] | None = None,
    ) -> CompressionRules:
        """Rules from configuration values (chains in :func:`parse_chain` form)."""
        pairs = tuple((glob, parse_chain(chain)) for glob, chain in (overrides or {}).items())
        return cls(parse_chain(default), min_bytes, pairs)


def chain_for(
    name: str, array_size_bytes: int, rules: CompressionRules, *, dtype: str | None = None
) -> Chain:
    """The chain for tensor ``name`` of ``array_size_bytes`` bytes.

    Non-float tensors (when ``dtype`` is given) and tensors below ``rules.min_bytes``
    get the empty chain (sent as they are); otherwise the first matching override,
    else ``rules.default``.
    """
    if dtype is not None and np.dtype(dtype).kind != "f":
        return ()
    if array_size_bytes < rules.min_bytes:
        return ()
    for glob, chain in rules.overrides:
        if fnmatch.fnmatchcase(name, glob):
            return chain
    return rules.default
