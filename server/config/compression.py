"""The ``compression`` section: codec chains per direction, error feedback, per region."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainValidator, WithJsonSchema

from geofl.protocols.codecs import Chain, CodecError, chain_to_config, parse_chain
from geofl.protocols.compression import UploadPlan
from geofl.server.config.fields import Section

__all__ = ["ChainConfig", "CompressionConfig", "RegionCompression"]


def _check_chain(value: Any) -> list[dict[str, dict[str, Any]]]:
    """Normalize a chain (``fp16``, ``{qsgd: {bits: 8}}`` or a list of those)."""
    try:
        return chain_to_config(parse_chain(value))
    except CodecError as exc:
        raise ValueError(str(exc)) from None


#: A codec chain in its configuration form, normalized to ``[{name: {params}}, ...]``.
ChainConfig = Annotated[
    list[dict[str, dict[str, Any]]],
    PlainValidator(_check_chain),
    WithJsonSchema({"type": "array", "format": "codec chain"}),
]


class RegionCompression(Section):
    """Chains for the clients of one region (``null`` = the section's default)."""

    up: ChainConfig | None = Field(default=None, description="Upload chain for this region.")
    down: ChainConfig | None = Field(default=None, description="Broadcast chain for this region.")


class CompressionConfig(Section):
    """Compression of updates (up) and broadcasts (down); see docs/compression.md."""

    up: ChainConfig = Field(
        default_factory=list,
        description="Codec chain for client updates, e.g. [{topk: {ratio: 0.01}}, {qsgd: "
        "{bits: 8}}]; [] = uncompressed.",
    )
    down: ChainConfig = Field(
        default_factory=list,
        description="Codec chain for the difference between broadcasts; [] = uncompressed.",
    )
    error_feedback: bool = Field(
        default=False, description="Clients keep what upload compression dropped and resend it."
    )
    min_bytes: int = Field(
        default=4096, ge=0, description="Tensors smaller than this travel uncompressed (bytes)."
    )
    max_staleness: int = Field(
        default=10,
        ge=1,
        description="A client's error-feedback residual is reset when its previous fit is "
        "more than this many rounds old.",
    )
    regions: dict[str, RegionCompression] = Field(
        default_factory=dict, description="Per-region overrides of up and down."
    )
    adaptive: bool = Field(
        default=False,
        description="Choose each client's upload chain from its measured uplink: the least "
        "lossy of raw, fp16, qsgd 8-bit, topk 10% + fp16, topk 1% + fp16 that arrives within "
        "schedule.deadline_s after its predicted download and compute (unmeasured clients "
        "use up).",
    )

    def up_chain(self, region: str | None) -> Chain:
        """The upload chain for a client in ``region``."""
        override = self.regions.get(region or "")
        return parse_chain(override.up if override and override.up is not None else self.up)

    def upload_plan(self, region: str | None) -> UploadPlan | None:
        """How a client in ``region`` compresses its update (None: uncompressed)."""
        chain = self.up_chain(region)
        if not chain:
            return None
        return UploadPlan(chain, self.min_bytes, self.error_feedback, self.max_staleness)

    def down_chain(self, region: str | None) -> Chain:
        """The broadcast chain for a client in ``region``."""
        override = self.regions.get(region or "")
        return parse_chain(override.down if override and override.down is not None else self.down)

    def down_chains(self) -> tuple[Chain, ...]:
        """Every broadcast chain in use (one model track each)."""
        chains = [self.down_chain(None)] + [self.down_chain(r) for r in self.regions]
        return tuple(dict.fromkeys(chains))
