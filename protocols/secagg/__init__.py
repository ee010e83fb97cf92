"""Secure aggregation (SecAgg+): primitives and the parameters both sides agree on.

Pure and transport-free: Shamir sharing over GF(2**521 - 1) (:mod:`.shamir`), X25519
agreement with HKDF-SHA256 (:mod:`.keys`), AES-GCM share transport (:mod:`.transport`),
AES-CTR masks (:mod:`.prg`), the ring and its fixed-point quantizer (:mod:`.ring`) and
the seeded Harary neighbour graph (:mod:`.graph`).  The stage machines are
``geofl.client.secagg.SecAggClient`` and ``geofl.server.rounds.secagg.SecAggServer``.
"""

from geofl.protocols.secagg.errors import SecAggAbortError, SecAggError, SecAggStage
from geofl.protocols.secagg.graph import (
    graph_degree,
    neighbours,
    recommended_degree,
    recommended_threshold,
)
from geofl.protocols.secagg.keys import (
    MASK_PURPOSE,
    SHARE_PURPOSE,
    PublicKeys,
    agree,
    agreement_info,
    generate_private_key,
    load_private_key,
    private_bytes,
    public_bytes,
)
from geofl.protocols.secagg.params import SecAggParams
from geofl.protocols.secagg.prg import (
    apply_pairwise_masks,
    apply_self_mask,
    expand,
    mask_buffer,
)
from geofl.protocols.secagg.ring import (
    RingArray,
    RingQuantizer,
    check_ring_vector,
    ring_dtype,
    ring_reduce,
)
from geofl.protocols.secagg.shamir import SHARE_BYTES, reconstruct, split
from geofl.protocols.secagg.transport import (
    SHARE_CIPHERTEXT_BYTES,
    open_sealed,
    pack_shares,
    seal,
    unpack_shares,
)

__all__ = [
    "MASK_PURPOSE",
    "SHARE_BYTES",
    "SHARE_CIPHERTEXT_BYTES",
    "SHARE_PURPOSE",
    "PublicKeys",
    "RingArray",
    "RingQuantizer",
    "SecAggAbortError",
    "SecAggError",
    "SecAggParams",
    "SecAggStage",
    "agree",
    "agreement_info",
    "apply_pairwise_masks",
    "apply_self_mask",
    "check_ring_vector",
    "expand",
    "generate_private_key",
    "graph_degree",
    "load_private_key",
    "mask_buffer",
    "neighbours",
    "open_sealed",
    "pack_shares",
    "private_bytes",
    "public_bytes",
    "recommended_degree",
    "recommended_threshold",
    "reconstruct",
    "ring_dtype",
    "ring_reduce",
    "seal",
    "split",
    "unpack_shares",
]
