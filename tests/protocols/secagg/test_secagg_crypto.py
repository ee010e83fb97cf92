"""Key agreement, authenticated share transport and the mask PRG."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.secagg import (
    MASK_PURPOSE,
    SHARE_PURPOSE,
    PublicKeys,
    SecAggError,
    agree,
    agreement_info,
    expand,
    generate_private_key,
    load_private_key,
    open_sealed,
    pack_shares,
    private_bytes,
    public_bytes,
    seal,
    unpack_shares,
)

ADDRESS = {"run_id": 7, "round": 4, "sender": 3, "recipient": 5}
KEY = bytes(range(32))


def test_both_ends_agree_on_the_same_key_bound_to_pair_round_and_purpose() -> None:
    a, b, c = generate_private_key(), generate_private_key(), generate_private_key()
    info = agreement_info(MASK_PURPOSE, 1, 2, 10, 20)
    assert info == agreement_info(MASK_PURPOSE, 1, 2, 20, 10)
    shared = agree(a, public_bytes(b), info=info)
    assert shared == agree(b, public_bytes(a), info=info)
    assert len(shared) == 32
    others = {
        agree(a, public_bytes(b), info=agreement_info(MASK_PURPOSE, 1, 3, 10, 20)),
        agree(a, public_bytes(b), info=agreement_info(MASK_PURPOSE, 2, 2, 10, 20)),
        agree(a, public_bytes(b), info=agreement_info(SHARE_PURPOSE, 1, 2, 10, 20)),
        agree(a, public_bytes(b), info=agreement_info(MASK_PURPOSE, 1, 2, 10, 21)),
        agree(a, public_bytes(c), info=info),
    }
    assert shared not in others and len(others) == 5


def test_agreement_rejects_bad_keys_and_ids() -> None:
    private = generate_private_key()
    with pytest.raises(SecAggError, match="32 raw bytes"):
        agree(private, b"short", info=b"")
    with pytest.raises(SecAggError, match="key agreement failed"):
        agree(private, bytes(32), info=b"")  # a low-order point
    with pytest.raises(SecAggError, match="itself"):
        agreement_info(MASK_PURPOSE, 1, 1, 4, 4)
    with pytest.raises(SecAggError, match="round"):
        agreement_info(MASK_PURPOSE, 1, -1, 4, 5)


def test_private_keys_round_trip_through_raw_bytes() -> None:
    private = generate_private_key()
    assert public_bytes(load_private_key(private_bytes(private))) == public_bytes(private)
    with pytest.raises(SecAggError, match="32 raw bytes"):
        load_private_key(b"\x00" * 31)


def test_public_keys_must_be_raw_32_bytes() -> None:
    with pytest.raises(SecAggError, match=r"PublicKeys.mask"):
        PublicKeys(encrypt=bytes(32), mask=bytes(31))
    with pytest.raises(SecAggError, match=r"PublicKeys.encrypt"):
        PublicKeys(encrypt="x" * 32, mask=bytes(32))  # type: ignore[arg-type]


def test_sealed_shares_open_only_for_the_right_address() -> None:
    message = pack_shares(b"a" * 66, b"b" * 66)
    sealed = seal(KEY, message, **ADDRESS)
    assert unpack_shares(open_sealed(KEY, sealed, **ADDRESS)) == (b"a" * 66, b"b" * 66)
    assert seal(KEY, message, **ADDRESS) != sealed  # random nonce
    for field, value in [("recipient", 6), ("sender", 4), ("round", 5), ("run_id", 8)]:
        with pytest.raises(SecAggError, match=r"from node 3 to node 5|from node 4|to node 6"):
            open_sealed(KEY, sealed, **{**ADDRESS, field: value})
    with pytest.raises(SecAggError, match="failed authentication"):
        open_sealed(bytes(32), sealed, **ADDRESS)


@pytest.mark.parametrize("position", [0, 11, 12, 100, -1])
def test_any_flipped_bit_is_detected(position: int) -> None:
    sealed = bytearray(seal(KEY, pack_shares(b"a" * 66, b"b" * 66), **ADDRESS))
    sealed[position] ^= 0x01
    with pytest.raises(SecAggError, match=r"from node 3 to node 5 .*tampered"):
        open_sealed(KEY, bytes(sealed), **ADDRESS)


def test_transport_rejects_malformed_input() -> None:
    with pytest.raises(SecAggError, match="too short"):
        open_sealed(KEY, b"x" * 27, **ADDRESS)
    with pytest.raises(SecAggError, match="32 bytes"):
        seal(b"k" * 16, b"x", **ADDRESS)
    with pytest.raises(SecAggError, match="64 bits"):
        seal(KEY, b"x", **{**ADDRESS, "sender": -1})
    with pytest.raises(SecAggError, match="132 bytes"):
        unpack_shares(b"x" * 131)


def _keystream_by_ecb(key: bytes, blocks: int) -> bytes:
    """AES-CTR's keystream built independently: AES-ECB of counters 0, 1, 2, ..."""
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    counters = b"".join(i.to_bytes(16, "big") for i in range(blocks))
    return encryptor.update(counters) + encryptor.finalize()


def test_expand_is_the_aes256_ctr_keystream_under_the_full_key() -> None:
    key = bytes(range(100, 132))
    words = expand(key, 40, 32)
    assert words.dtype == np.uint32
    assert words.tolist() == np.frombuffer(_keystream_by_ecb(key, 10), "<u4").tolist()
    other = bytearray(key)
    other[-1] ^= 1  # every key byte matters (no truncated seed)
    assert not np.array_equal(expand(bytes(other), 40, 32), words)


@settings(max_examples=25, deadline=None)
@given(bits=st.integers(8, 32), count=st.integers(0, 3000))
def test_expand_stays_in_the_ring_and_is_deterministic(bits: int, count: int) -> None:
    words = expand(KEY, count, bits)
    assert words.shape == (count,)
    assert words.dtype.itemsize == (1 if bits <= 8 else 2 if bits <= 16 else 4)
    assert count == 0 or int(words.max()) < 2**bits
    assert np.array_equal(words, expand(KEY, count, bits))


def test_expand_is_consistent_across_chunk_boundaries() -> None:
    long = expand(KEY, 700_001, 16)  # > 1 MiB of keystream: several chunks
    assert np.array_equal(long[:1000], expand(KEY, 1000, 16))
    assert long.flags.writeable


@pytest.mark.parametrize(("key", "count", "bits"), [(b"k" * 16, 3, 16), (KEY, -1, 16), (KEY, 3, 7)])
def test_expand_rejects_bad_input(key: bytes, count: int, bits: int) -> None:
    with pytest.raises(SecAggError):
        expand(key, count, bits)
