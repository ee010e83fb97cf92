"""The server's side of SecAgg+ secure aggregation: a pure stage machine, no I/O.

One :class:`SecAggServer` per round collects each stage's messages with ``add_*`` and
closes the stage with ``close_*`` (or :meth:`~SecAggServer.finish`), which returns
what the transport must deliver next.  The client sets shrink stage by stage::

    U1 advertised keys  ->  U2 shared keys  ->  U3 uploaded masked vectors
                                                 (U2 \\ U3 dropped: their masks are removed)

A client whose neighbourhood within the current set falls below ``threshold - 1``
is pruned (repeatedly, until every member has enough): its secrets could never be
reconstructed.  Whenever fewer than ``threshold`` clients, or too few share holders of
a needed secret, remain, the stage raises :class:`SecAggAbortError` with a reason a
human can read, and the round is over.  The masked vectors are folded into one running
ring sum as they arrive, so memory is O(vector length), not O(clients x length).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from geofl.protocols.secagg import (
    MASK_PURPOSE,
    SHARE_BYTES,
    SHARE_CIPHERTEXT_BYTES,
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
    load_private_key,
    mask_buffer,
    public_bytes,
    reconstruct,
    ring_reduce,
)
from geofl.protocols.secagg.prg import MASK_KEY_BYTES


class SecAggServer:
    """One round of SecAgg+ on the server (see the module docstring)."""

    def __init__(self, params: SecAggParams, *, length: int | None = None) -> None:
        if length is not None and (isinstance(length, bool) or not isinstance(length, int)):
            raise SecAggError(f"length must be an int or None, got {length!r}")
        self.params = params
        self._length = length
        self._graph = params.neighbourhoods()
        self._stage: SecAggStage | None = SecAggStage.ADVERTISE
        self._outcome = ""
        self._keys: dict[int, PublicKeys] = {}
        self._advertised: frozenset[int] = frozenset()
        self._ciphertexts: dict[int, dict[int, bytes]] = {}
        self._sharers: frozenset[int] = frozenset()
        self._total: RingArray | None = None
        self._uploaded: set[int] = set()
        self._survivors: frozenset[int] = frozenset()
        self._reveals: dict[int, dict[int, bytes]] = {}

    # -- state, for the round engine ------------------------------------------------

    @property
    def stage(self) -> SecAggStage | None:
        """The stage accepting messages now; ``None`` once finished or aborted."""
        return self._stage

    @property
    def advertised(self) -> frozenset[int]:
        """U1: clients whose keys were accepted (after pruning)."""
        return self._advertised

    @property
    def sharers(self) -> frozenset[int]:
        """U2: clients whose encrypted shares were forwarded (after pruning)."""
        return self._sharers

    @property
    def survivors(self) -> frozenset[int]:
        """U3: clients whose masked vector is in the sum."""
        return self._survivors

    # -- helpers ---------------------------------------------------------------------

    def _require(self, stage: SecAggStage, action: str) -> None:
        if self._stage is None:
            raise SecAggError(f"{action}: the secure-aggregation round is over ({self._outcome})")
        if self._stage != stage:
            raise SecAggError(f"{action} belongs to stage {stage}, but the stage is {self._stage}")

    def _where(self, stage: SecAggStage) -> str:
        return f"run {self.params.run_id}, round {self.params.round}, stage {stage}"

    def _abort(self, stage: SecAggStage, detail: str) -> NoReturn:
        self._stage = None
        self._outcome = f"aborted at stage {stage}"
        raise SecAggAbortError(stage, f"{self._where(stage)}: {detail}")

    def _require_clients(self, stage: SecAggStage, left: int) -> None:
        if left < self.params.threshold:
            cohort, threshold = len(self.params.cohort), self.params.threshold
            self._abort(stage, f"{left} of {cohort} clients left, threshold {threshold}")

    def _prune(self, stage: SecAggStage, members: set[int]) -> frozenset[int]:
        """Members left after repeatedly removing those with too few member neighbours.

        Aborts when fewer than ``threshold`` clients arrived, or are left after pruning.
        """
        self._require_clients(stage, len(members))
        kept = set(members)
        while weak := {u for u in kept if len(self._graph[u] & kept) + 1 < self.params.threshold}:
            kept -= weak
        if len(kept) < self.params.threshold:
            self._abort(
                stage,
                f"{len(kept)} of {len(self.params.cohort)} clients left after removing "
                f"{len(members) - len(kept)} with fewer than {self.params.threshold - 1} "
                f"neighbours left, threshold {self.params.threshold}",
            )
        return frozenset(kept)

    def _check_sender(
        self, node: int, allowed: frozenset[int], seen: Collection[int], who: str
    ) -> None:
        if node not in allowed:
            raise SecAggError(f"node {node} may not send in stage {self._stage}: not {who}")
        if node in seen:
            raise SecAggError(f"node {node} already sent its stage-{self._stage} message")

    # -- stage 1: advertise keys -----------------------------------------------------

    def add_keys(self, node: int, keys: PublicKeys) -> None:
        """Record ``node``'s advertised public keys."""
        self._require(SecAggStage.ADVERTISE, "add_keys")
        self._check_sender(node, frozenset(self.params.cohort), self._keys, "in the cohort")
        if not isinstance(keys, PublicKeys):
            raise SecAggError(f"node {node}: keys must be PublicKeys, got {type(keys).__name__}")
        self._keys[node] = keys

    def close_advertise(self) -> dict[int, dict[int, PublicKeys]]:
        """U1, and for each member its advertised neighbours' keys (its roster)."""
        self._require(SecAggStage.ADVERTISE, "close_advertise")
        self._advertised = self._prune(SecAggStage.ADVERTISE, set(self._keys))
        self._stage = SecAggStage.SHARE
        return {
            u: {v: self._keys[v] for v in sorted(self._graph[u] & self._advertised)}
            for u in sorted(self._advertised)
        }

    # -- stage 2: share keys ---------------------------------------------------------

    def add_shares(self, node: int, ciphertexts: Mapping[int, bytes]) -> None:
        """Record ``node``'s encrypted shares, one per neighbour in its roster."""
        self._require(SecAggStage.SHARE, "add_shares")
        self._check_sender(node, self._advertised, self._ciphertexts, "an advertised client (U1)")
        expected = self._graph[node] & self._advertised
        if set(ciphertexts) != expected:
            missing, extra = (
                sorted(expected - set(ciphertexts)),
                sorted(set(ciphertexts) - expected),
            )
            raise SecAggError(f"node {node}: shares missing for {missing}, unexpected for {extra}")
        for recipient, blob in ciphertexts.items():
            if not isinstance(blob, bytes) or len(blob) != SHARE_CIPHERTEXT_BYTES:
                raise SecAggError(
                    f"node {node}: the share for node {recipient} must be "
                    f"{SHARE_CIPHERTEXT_BYTES} bytes"
                )
        self._ciphertexts[node] = dict(ciphertexts)

    def close_sharing(self) -> dict[int, dict[int, bytes]]:
        """U2, and for each member the ciphertexts addressed to it, keyed by sender."""
        self._require(SecAggStage.SHARE, "close_sharing")
        self._sharers = self._prune(SecAggStage.SHARE, set(self._ciphertexts))
        self._stage = SecAggStage.MASK
        inboxes = {
            v: {u: self._ciphertexts[u][v] for u in sorted(self._graph[v] & self._sharers)}
            for v in sorted(self._sharers)
        }
        self._ciphertexts.clear()
        return inboxes

    # -- stage 3: masked input -------------------------------------------------------

    def add_masked(self, node: int, vector: RingArray) -> None:
        """Fold ``node``'s masked ring vector into the running sum."""
        self._require(SecAggStage.MASK, "add_masked")
        self._check_sender(node, self._sharers, self._uploaded, "a key sharer (U2)")
        bits = self.params.ring_bits
        check_ring_vector(vector, bits, f"node {node}'s masked vector")
        if self._length is not None and vector.size != self._length:
            raise SecAggError(
                f"node {node}'s masked vector has {vector.size} values, expected {self._length}"
            )
        if self._total is None:
            self._length = vector.size
            self._total = vector.copy()
        else:
            np.add(self._total, vector, out=self._total)  # wraps mod 2**width; reduced at the end
        self._uploaded.add(node)

    def close_masking(self) -> tuple[frozenset[int], frozenset[int]]:
        """``(survivors U3, dropped U2 \\ U3)``: who must reveal, and for whom."""
        self._require(SecAggStage.MASK, "close_masking")
        self._survivors = frozenset(self._uploaded)
        self._require_clients(SecAggStage.MASK, len(self._survivors))
        self._require_holders(SecAggStage.MASK, self._survivors)
        self._stage = SecAggStage.UNMASK
        return self._survivors, self._sharers - self._survivors

    def _needed_secrets(self) -> dict[int, frozenset[int]]:
        """Owner -> the U2 clients holding its shares, for every secret the sum needs.

        A survivor's seed is always needed; a dropped client's mask key only when one of
        its neighbours survived (otherwise no mask of it is in the sum).
        """
        dropped = self._sharers - self._survivors
        needed = {u: (self._graph[u] & self._sharers) | {u} for u in self._survivors}
        needed |= {
            j: self._graph[j] & self._sharers for j in dropped if self._graph[j] & self._survivors
        }
        return needed

    def _require_holders(self, stage: SecAggStage, available: frozenset[int]) -> None:
        for owner, holders in sorted(self._needed_secrets().items()):
            left = len(holders & available)
            if left < self.params.threshold:
                secret = "self-mask seed" if owner in self._survivors else "mask key"
                self._abort(
                    stage,
                    f"node {owner}'s {secret} has {left} share holders left, "
                    f"threshold {self.params.threshold}",
                )

    # -- stage 4: unmask -------------------------------------------------------------

    def add_reveal(self, node: int, shares: Mapping[int, bytes]) -> None:
        """Record the shares ``node`` revealed: seeds of survivors, keys of the dropped."""
        self._require(SecAggStage.UNMASK, "add_reveal")
        self._check_sender(node, self._survivors, self._reveals, "a survivor (U3)")
        expected = (self._graph[node] & self._sharers) | {node}
        if set(shares) != expected:
            missing, extra = sorted(expected - set(shares)), sorted(set(shares) - expected)
            raise SecAggError(f"node {node}: reveal misses owners {missing}, has extra {extra}")
        for owner, share in shares.items():
            if not isinstance(share, bytes) or len(share) != SHARE_BYTES:
                raise SecAggError(
                    f"node {node}: the share of node {owner} must be {SHARE_BYTES} bytes"
                )
        self._reveals[node] = dict(shares)

    def finish(self) -> npt.NDArray[np.float64]:
        """The float64 sum of the survivors' clipped vectors, masks removed and decoded."""
        total = self.finish_ring()
        return self.params.quantizer().decode_sum(total, len(self._survivors))

    def finish_ring(self) -> RingArray:
        """The survivors' sum in the ring, masks removed (for an encoding of the caller's,
        such as distributed DP's)."""
        self._require(SecAggStage.UNMASK, "finish")
        revealers = frozenset(self._reveals)
        self._require_clients(SecAggStage.UNMASK, len(revealers))
        self._require_holders(SecAggStage.UNMASK, revealers)
        secrets = {
            owner: self._reconstruct(owner, holders & revealers)
            for owner, holders in self._needed_secrets().items()
        }
        total = self._total
        if total is None:  # unreachable: close_masking needs >= threshold uploads
            raise SecAggError("no masked vector was received")
        bits = self.params.ring_bits
        scratch = mask_buffer(total.size, bits)  # every mask removed is expanded into this
        for owner, secret in secrets.items():
            if owner in self._survivors:
                apply_self_mask(total, secret, bits, remove=True, buffer=scratch)
            else:
                pair_keys = self._dropped_pair_keys(owner, secret)
                apply_pairwise_masks(total, owner, pair_keys, bits, buffer=scratch)
        ring_reduce(total, bits)
        self._stage = None
        self._outcome = "finished"
        return total

    def _reconstruct(self, owner: int, holders: frozenset[int]) -> bytes:
        """``owner``'s seed or mask private key from the revealed shares (32 bytes)."""
        shares = {h: self._reveals[h][owner] for h in holders}
        try:
            secret = reconstruct(shares, self.params.threshold)
        except SecAggError as error:
            raise SecAggError(f"node {owner}'s secret: {error}") from error
        if len(secret) != MASK_KEY_BYTES:
            raise SecAggError(f"node {owner}'s secret: the revealed shares are corrupt")
        return secret

    def _dropped_pair_keys(self, owner: int, raw_key: bytes) -> dict[int, bytes]:
        """The pairwise keys of dropped ``owner`` with its surviving neighbours."""
        private = load_private_key(raw_key)
        if public_bytes(private) != self._keys[owner].mask:
            raise SecAggError(
                f"node {owner}'s reconstructed mask key does not match its public key"
            )
        run, round_ = self.params.run_id, self.params.round
        return {
            v: agree(
                private,
                self._keys[v].mask,
                info=agreement_info(MASK_PURPOSE, run, round_, owner, v),
            )
            for v in sorted(self._graph[owner] & self._survivors)
        }
