"""The client's side of SecAgg+ secure aggregation: four stages over one state object.

A :class:`SecAggClient` lives for one round.  Its stages run once each, in order:

1. :meth:`~SecAggClient.advertise`: fresh X25519 pairs (share encryption, pairwise
   masks) and a fresh 32-byte self-mask seed ``b``.
2. :meth:`~SecAggClient.share_keys`: Shamir-share the mask private key and ``b`` among
   itself and the neighbours that advertised; one AES-GCM ciphertext per neighbour.
3. :meth:`~SecAggClient.receive_shares`: decrypt the shares addressed to it; their
   senders are the neighbours it masks with.
4. :meth:`~SecAggClient.mask`: quantize, add ``PRG(b)`` and the pairwise masks.
5. :meth:`~SecAggClient.reveal`: for each neighbour (and itself), the seed share if it
   survived or the mask-key share if it dropped, never both.

Step 1's secrets may also be made ahead (:meth:`RoundSecrets.fresh`), their public keys
sent in the previous round's unmask answer; the round then starts at step 2
(``SecAggClient(..., secrets=...)``). Either way each set of secrets serves one round.

Pure and transport-free: the runtime moves the returned bytes and arrays.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from geofl.protocols.secagg import (
    MASK_PURPOSE,
    SHARE_PURPOSE,
    PublicKeys,
    RingArray,
    SecAggAbortError,
    SecAggError,
    SecAggParams,
    SecAggStage,
    agree,
    agreement_info,
    apply_pairwise_masks,
    apply_self_mask,
    check_ring_vector,
    generate_private_key,
    mask_buffer,
    open_sealed,
    pack_shares,
    private_bytes,
    public_bytes,
    seal,
    split,
    unpack_shares,
)
from geofl.protocols.secagg.prg import MASK_KEY_BYTES

__all__ = ["RoundSecrets", "SecAggClient"]

_STEPS = ("advertise", "share_keys", "receive_shares", "mask", "reveal")


@dataclass(frozen=True, eq=False)
class RoundSecrets:
    """One round's fresh secrets: two X25519 key pairs and the self-mask seed.

    Made by :meth:`fresh` from the operating system's randomness; a set serves one round
    only (a :class:`SecAggClient` takes it and is used once).
    """

    encrypt_key: X25519PrivateKey
    mask_key: X25519PrivateKey
    seed: bytes

    @classmethod
    def fresh(cls) -> RoundSecrets:
        """New key pairs and a new seed."""
        return cls(generate_private_key(), generate_private_key(), os.urandom(MASK_KEY_BYTES))

    def public(self) -> PublicKeys:
        """The public halves, as advertised."""
        return PublicKeys(public_bytes(self.encrypt_key), public_bytes(self.mask_key))


class SecAggClient:
    """One client's SecAgg+ state for one round (see the module docstring).

    ``secrets``: made ahead, their public keys already with the server; the round then
    begins with :meth:`share_keys` (there is no :meth:`advertise` step).
    """

    def __init__(
        self,
        node_id: int,
        params: SecAggParams,
        *,
        rng: np.random.Generator | None = None,
        secrets: RoundSecrets | None = None,
    ) -> None:
        if node_id not in params.cohort:
            raise SecAggError(f"node {node_id} is not in the round's cohort")
        self.node_id = node_id
        self.params = params
        #: Randomness for stochastic rounding only; every secret comes from the OS.
        self._rng = rng if rng is not None else np.random.default_rng()
        self._neighbours = params.neighbourhoods()[node_id]
        # Fresh for every round: a SecAggClient serves one round only.
        self._next_step = 0 if secrets is None else 1  # keys sent ahead: advertised
        secrets = secrets if secrets is not None else RoundSecrets.fresh()
        self._encrypt_key = secrets.encrypt_key
        self._mask_key = secrets.mask_key
        self._seed = secrets.seed
        self._roster: dict[int, PublicKeys] = {}
        self._transport_keys: dict[int, bytes] = {}
        #: owner -> (share of the owner's mask private key, share of its seed).
        self._held: dict[int, tuple[bytes, bytes]] = {}
        self._partners: frozenset[int] = frozenset()

    @property
    def neighbours(self) -> frozenset[int]:
        """This client's neighbours in the round's graph."""
        return self._neighbours

    def _enter(self, step: str) -> None:
        expected = _STEPS[self._next_step] if self._next_step < len(_STEPS) else None
        if step != expected:
            done = "all stages are done" if expected is None else f"expected {expected}()"
            raise SecAggError(f"node {self.node_id}: {step}() called out of order ({done})")
        self._next_step += 1

    def _where(self, stage: SecAggStage) -> str:
        return f"run {self.params.run_id}, round {self.params.round}, stage {stage}"

    def advertise(self) -> PublicKeys:
        """The round's fresh public keys (encryption, masking), for the server to relay."""
        self._enter("advertise")
        return PublicKeys(public_bytes(self._encrypt_key), public_bytes(self._mask_key))

    def share_keys(self, roster: Mapping[int, PublicKeys]) -> dict[int, bytes]:
        """Encrypted shares of the mask key and seed, keyed by recipient neighbour."""
        self._enter("share_keys")
        self._check_roster(roster)
        self._roster = dict(roster)
        holders = [self.node_id, *sorted(roster)]
        key_shares = split(private_bytes(self._mask_key), self.params.threshold, holders)
        seed_shares = split(self._seed, self.params.threshold, holders)
        self._held[self.node_id] = (key_shares[self.node_id], seed_shares[self.node_id])
        sealed: dict[int, bytes] = {}
        for peer, keys in roster.items():
            info = agreement_info(
                SHARE_PURPOSE, self.params.run_id, self.params.round, self.node_id, peer
            )
            self._transport_keys[peer] = agree(self._encrypt_key, keys.encrypt, info=info)
            message = pack_shares(key_shares[peer], seed_shares[peer])
            address = self._address(self.node_id, peer)
            sealed[peer] = seal(self._transport_keys[peer], message, **address)
        return sealed

    def _check_roster(self, roster: Mapping[int, PublicKeys]) -> None:
        strangers = sorted(set(roster) - self._neighbours)
        if strangers:
            raise SecAggError(f"node {self.node_id}: roster holds non-neighbours {strangers}")
        own = {public_bytes(self._encrypt_key), public_bytes(self._mask_key)}
        for peer, keys in roster.items():
            if not isinstance(keys, PublicKeys):
                raise SecAggError(f"node {self.node_id}: roster entry {peer} is not PublicKeys")
            if {keys.encrypt, keys.mask} & own:
                raise SecAggError(f"node {self.node_id}: roster entry {peer} reuses my keys")
        self._require_holders(len(roster) + 1, SecAggStage.SHARE, "advertised")

    def _require_holders(self, holders: int, stage: SecAggStage, verb: str) -> None:
        if holders < self.params.threshold:
            raise SecAggAbortError(
                stage,
                f"{self._where(stage)}: node {self.node_id} has {holders - 1} {verb} "
                f"neighbours, threshold {self.params.threshold} counts itself too",
            )

    def _address(self, sender: int, recipient: int) -> dict[str, int]:
        return {
            "run_id": self.params.run_id,
            "round": self.params.round,
            "sender": sender,
            "recipient": recipient,
        }

    def receive_shares(self, inbox: Mapping[int, bytes]) -> None:
        """Decrypt the shares neighbours sent; they become this client's mask partners."""
        self._enter("receive_shares")
        strangers = sorted(set(inbox) - set(self._roster))
        if strangers:
            raise SecAggError(f"node {self.node_id}: shares from non-roster nodes {strangers}")
        for sender, ciphertext in inbox.items():
            key = self._transport_keys[sender]
            plaintext = open_sealed(key, ciphertext, **self._address(sender, self.node_id))
            self._held[sender] = unpack_shares(plaintext)
        self._partners = frozenset(inbox)
        self._require_holders(len(inbox) + 1, SecAggStage.SHARE, "sharing")

    def mask(self, vector: npt.NDArray[np.floating[Any]]) -> RingArray:
        """``vector`` quantized into the ring, with the self mask and pairwise masks added."""
        if self._next_step >= len(_STEPS) or _STEPS[self._next_step] != "mask":
            self._enter("mask")  # raises: out of order, before any work
        if not isinstance(vector, np.ndarray) or vector.ndim != 1:
            raise SecAggError(f"node {self.node_id}: mask() needs a 1-D NumPy float vector")
        encoded = self.params.quantizer().encode(vector, self._rng)
        return self.mask_encoded(encoded)

    def mask_encoded(self, encoded: RingArray) -> RingArray:
        """``encoded`` (already in the ring: distributed DP's noised vector) with the self
        mask and pairwise masks added, in place."""
        self._enter("mask")
        bits = self.params.ring_bits
        masked = check_ring_vector(encoded, bits, f"node {self.node_id}'s encoded vector")
        scratch = mask_buffer(masked.size, bits)  # every mask is expanded into this
        apply_self_mask(masked, self._seed, bits, buffer=scratch)
        apply_pairwise_masks(masked, self.node_id, self._pair_keys(), bits, buffer=scratch)
        return masked

    def _pair_keys(self) -> dict[int, bytes]:
        run, round_ = self.params.run_id, self.params.round
        return {
            peer: agree(
                self._mask_key,
                self._roster[peer].mask,
                info=agreement_info(MASK_PURPOSE, run, round_, self.node_id, peer),
            )
            for peer in self._partners
        }

    def reveal(self, survivors: Collection[int], dropped: Collection[int]) -> dict[int, bytes]:
        """Per owner: its seed share if it survived, its mask-key share if it dropped."""
        self._enter("reveal")
        alive, gone = frozenset(survivors), frozenset(dropped)
        both = sorted(alive & gone)
        if both:
            raise SecAggError(f"node {self.node_id}: nodes {both} listed as survivor and dropped")
        if self.node_id not in alive:
            raise SecAggError(f"node {self.node_id} is asked to unmask but not listed as survivor")
        owners = self._partners | {self.node_id}
        unknown = sorted(owners - alive - gone)
        if unknown:
            raise SecAggError(f"node {self.node_id}: the server did not classify nodes {unknown}")
        self._require_holders(len(owners & alive), SecAggStage.UNMASK, "surviving")
        key_share, seed_share = 0, 1
        return {
            owner: self._held[owner][seed_share if owner in alive else key_share]
            for owner in sorted(owners)
        }
