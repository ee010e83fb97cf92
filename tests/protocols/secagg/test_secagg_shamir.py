"""Shamir sharing: every big-enough subset reconstructs, every smaller one fails."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.secagg import SHARE_BYTES, SecAggError, reconstruct, split
from geofl.protocols.secagg.shamir import MAX_SECRET_BYTES, PRIME

SECRET = bytes(range(32))


def _wrong_or_refused(shares: dict[int, bytes], threshold: int, secret: bytes = SECRET) -> bool:
    """True when ``shares`` do not give ``secret`` back (a wrong value or an error)."""
    try:
        return reconstruct(shares, threshold) != secret
    except SecAggError:
        return True


@pytest.mark.parametrize("n", range(1, 8))
def test_every_subset_at_or_above_threshold_reconstructs_and_below_does_not(n: int) -> None:
    ids = list(range(1, n + 1))
    for threshold in range(1, n + 1):
        shares = split(SECRET, threshold, ids)
        for size in range(1, n + 1):
            for subset in itertools.combinations(ids, size):
                chosen = {i: shares[i] for i in subset}
                if size >= threshold:
                    assert reconstruct(chosen, threshold) == SECRET
                    continue
                with pytest.raises(SecAggError, match=f"need {threshold} shares"):
                    reconstruct(chosen, threshold)
                # Pretending the threshold were lower interpolates the wrong polynomial.
                assert _wrong_or_refused(chosen, size)


@settings(max_examples=60, deadline=None)
@given(
    secret=st.binary(max_size=MAX_SECRET_BYTES),
    ids=st.lists(st.integers(1, 2**64 - 1), min_size=1, max_size=12, unique=True),
    data=st.data(),
)
def test_any_threshold_sized_subset_reconstructs(
    secret: bytes, ids: list[int], data: st.DataObject
) -> None:
    threshold = data.draw(st.integers(1, len(ids)), label="threshold")
    shares = split(secret, threshold, ids)
    assert set(shares) == set(ids)
    assert all(len(share) == SHARE_BYTES for share in shares.values())
    subset = data.draw(st.permutations(ids), label="order")[:threshold]
    assert reconstruct({i: shares[i] for i in subset}, threshold) == secret


def test_leading_zero_bytes_and_empty_secrets_survive() -> None:
    for secret in (b"", b"\x00", bytes(32), b"\x00\x01", b"\xff" * MAX_SECRET_BYTES):
        assert reconstruct(split(secret, 2, [5, 9, 11]), 2) == secret


def test_splitting_is_randomised() -> None:
    assert split(SECRET, 3, [1, 2, 3]) != split(SECRET, 3, [1, 2, 3])


def test_shares_of_different_secrets_do_not_mix() -> None:
    first, second = split(SECRET, 2, [1, 2]), split(bytes(32), 2, [1, 2])
    assert _wrong_or_refused({1: first[1], 2: second[2]}, 2)
    assert _wrong_or_refused({1: first[1], 2: second[2]}, 2, bytes(32))


@pytest.mark.parametrize(
    ("secret", "threshold", "ids", "message"),
    [
        (SECRET, 2, [0, 1], "share id 0"),
        (SECRET, 2, [1, 1, 2], "distinct"),
        (SECRET, 2, [-3, 1], "share id -3"),
        (SECRET, 2, [True, 2], "not an int"),
        (SECRET, 4, [1, 2, 3], "exceeds"),
        (SECRET, 0, [1, 2, 3], "threshold"),
        (b"x" * (MAX_SECRET_BYTES + 1), 2, [1, 2], "at most"),
    ],
)
def test_split_rejects_bad_input(
    secret: bytes, threshold: int, ids: list[int], message: str
) -> None:
    with pytest.raises(SecAggError, match=message):
        split(secret, threshold, ids)


def test_reconstruct_rejects_malformed_shares() -> None:
    shares = split(SECRET, 2, [1, 2])
    with pytest.raises(SecAggError, match="66 bytes"):
        reconstruct({1: shares[1], 2: shares[2][:-1]}, 2)
    too_big = (PRIME + 1).to_bytes(SHARE_BYTES, "big")
    with pytest.raises(SecAggError, match="not a field element"):
        reconstruct({1: shares[1], 2: too_big}, 2)
    with pytest.raises(SecAggError, match="share id 0"):
        reconstruct({0: shares[1], 2: shares[2]}, 2)
